"""The operator and collective vocabulary shared by the store, the regressors,
the decomposition and the samplers.

Shape columns (all integers, NULL where an op does not use them):
  tp          tensor-parallel degree the shape is already divided by (paper: mp)
  batch       micro-batch size b
  seq         sequence length l (per TP rank when sequence parallelism splits it)
  hidden      model hidden size (paper: dim)
  heads       attention heads of the whole model (paper: h); per rank = heads / tp
  kv_heads    key/value heads of the whole model (NULL = heads)
  ffn_hidden  MLP inner width of the whole model (NULL = 4 * hidden); for SwiGLU the
              width of each of gate and up
  vocab       vocabulary before padding (NULL = 50257)
  layers      transformer layers (optimizer samples: layers held by the stage)
  params      parameters the op touches on one GPU (optimizer; the MoE router's hidden * experts), else NULL

Decomposition-only column (OP_SHAPE_COLUMNS; not stored, samples never carry it):
  head_dim    attention head dimension where it is decoupled from hidden / heads (Qwen3); absent or
              NULL = hidden / heads. A decomposition shape tuple carries it as an 11th value only then,
              so every shape of a model without a decoupled head_dim is exactly as before.

Passes: "fwd", "bwd", and "step" for the optimizer.
"""
from __future__ import annotations

from dataclasses import dataclass

SHAPE_COLUMNS = ("tp", "batch", "seq", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "layers", "params")
OP_SHAPE_COLUMNS = (*SHAPE_COLUMNS, "head_dim")
PASSES = ("fwd", "bwd", "step")


@dataclass(frozen=True)
class OpInfo:
    name: str
    paper_name: str | None  # file stem in ../shared/datasets/paper-samples, if the paper sampled it
    shape_columns: tuple[str, ...]
    passes: tuple[str, ...]
    description: str
    tp_sharded: bool = True  # whether the paper divided the shape by tp (mp)


OPS: dict[str, OpInfo] = {o.name: o for o in [
    OpInfo("qkv_proj", "linear1", ("tp", "batch", "seq", "hidden", "heads", "kv_heads"), ("fwd", "bwd"),
           "QKV projection GEMM [b*l, hidden] x [hidden, (heads+2*kv_heads)*head_dim/tp]"),
    OpInfo("attn_out_proj", "linear2", ("tp", "batch", "seq", "hidden"), ("fwd", "bwd"),
           "attention output projection [b*l, hidden/tp] x [hidden/tp, hidden]"),
    OpInfo("mlp_up", "linear3", ("tp", "batch", "seq", "hidden", "ffn_hidden"), ("fwd", "bwd"),
           "MLP up projection [b*l, hidden] x [hidden, ffn/tp] (SwiGLU: gate+up fused, 2*ffn/tp)"),
    OpInfo("mlp_down", "linear4", ("tp", "batch", "seq", "hidden", "ffn_hidden"), ("fwd", "bwd"),
           "MLP down projection [b*l, ffn/tp] x [ffn/tp, hidden]"),
    OpInfo("lm_head", "linear_final", ("tp", "batch", "seq", "hidden", "vocab"), ("fwd", "bwd"),
           "LM head [b*l, hidden] x [hidden, Vp/tp], Vp padded to a multiple of 128*tp"),
    # A generic dense GEMM [m, k] x [k, n] (published kernel grids, e.g. NVIDIA's aiconfigurator collector): stored
    # as tp = batch = 1, seq = m, hidden = k, ffn_hidden = n (the shape of an unsharded mlp_up). The decomposition
    # never emits it; a platform with a trained gemm regressor times its linear layers' GEMMs (forward, and the
    # backward's data- and weight-gradient GEMMs) through it (predictor.plan.predict).
    OpInfo("gemm", None, ("tp", "batch", "seq", "hidden", "ffn_hidden"), ("fwd",),
           "generic dense GEMM [m, k] x [k, n]: seq = m, hidden = k, ffn_hidden = n (tp = batch = 1)"),
    # The same grid in a scaled low-precision format (FORMAT_GEMMS): the kernel tables' fp8 / fp8_block / nvfp4 rows,
    # stored as op gemm with that dtype and trained as one regressor per format
    OpInfo("gemm_fp8", None, ("tp", "batch", "seq", "hidden", "ffn_hidden"), ("fwd",),
           "generic GEMM in per-tensor scaled FP8 (E4M3): seq = m, hidden = k, ffn_hidden = n"),
    OpInfo("gemm_fp8_block", None, ("tp", "batch", "seq", "hidden", "ffn_hidden"), ("fwd",),
           "generic GEMM in blockwise scaled FP8 (1x128 activation / 128x128 weight scales)"),
    OpInfo("gemm_nvfp4", None, ("tp", "batch", "seq", "hidden", "ffn_hidden"), ("fwd",),
           "generic GEMM in NVFP4 (E2M1, one E4M3 scale per 16 elements)"),
    OpInfo("embedding", "embedding", ("tp", "batch", "seq", "hidden", "vocab"), ("fwd", "bwd"),
           "vocab-parallel embedding lookup"),
    OpInfo("flash_attn", "flash_atten", ("tp", "batch", "seq", "hidden", "heads", "kv_heads"), ("fwd", "bwd"),
           "flash attention on [b, l, heads/tp, head_dim]"),
    OpInfo("attn_scores", "baddbmm", ("tp", "batch", "seq", "hidden", "heads"), ("fwd", "bwd"),
           "unfused attention: Q K^T batched GEMM"),
    OpInfo("attn_context", "bmm", ("tp", "batch", "seq", "hidden", "heads"), ("fwd", "bwd"),
           "unfused attention: softmax(QK^T) V batched GEMM"),
    OpInfo("attn_mask_fill", "fillmask", ("tp", "batch", "seq", "hidden", "heads"), ("fwd", "bwd"),
           "unfused attention: causal mask fill"),
    OpInfo("softmax", "softmax", ("tp", "batch", "seq", "heads"), ("fwd", "bwd"),
           "unfused attention: softmax over [b, heads/tp, l, l]"),
    OpInfo("fused_masked_softmax", "ScaledUpperTriangMaskedSoftmax", ("tp", "batch", "seq", "heads"), ("fwd", "bwd"),
           "Megatron fused scale + causal mask + softmax"),
    OpInfo("rope", "RoPE", ("tp", "batch", "seq", "hidden", "heads"), ("fwd", "bwd"),
           "rotary position embedding on q and k"),
    OpInfo("layernorm", "layernorm", ("batch", "seq", "hidden"), ("fwd", "bwd"),
           "LayerNorm over [b*l, hidden]", tp_sharded=False),
    OpInfo("rmsnorm", "RMSlayernorm", ("batch", "seq", "hidden"), ("fwd", "bwd"),
           "RMSNorm over [b*l, hidden]", tp_sharded=False),
    OpInfo("res_add", "res_add", ("batch", "seq", "hidden"), ("fwd", "bwd"),
           "residual add over [b*l, hidden]", tp_sharded=False),
    OpInfo("gelu", "gelu", ("tp", "batch", "seq", "hidden", "ffn_hidden"), ("fwd", "bwd"),
           "GeLU on [b*l, ffn/tp]"),
    OpInfo("swiglu", None, ("tp", "batch", "seq", "hidden", "ffn_hidden"), ("fwd", "bwd"),
           "SwiGLU silu(gate)*up on [b*l, ffn/tp]"),
    OpInfo("cross_entropy", "parallel_cross_entropy_128", ("tp", "batch", "seq", "vocab"), ("fwd", "bwd"),
           "vocab-parallel cross-entropy over [b*l, Vp/tp]"),
    OpInfo("optimizer", "optimizer", ("tp", "hidden", "layers", "params"), ("step",),
           "Adam/AdamW step over the parameters one GPU holds"),
    # Mixture-of-Experts (never sampled by the paper; `bench` samples them where they run). The expert GEMMs
    # themselves are mlp_up / swiglu / mlp_down calls on each local expert's tokens (tp = 1, batch = 1,
    # seq = tokens routed to that expert, ffn_hidden = the expert width), as a sequential or grouped GEMM runs them.
    OpInfo("moe_router", None, ("batch", "seq", "hidden", "params"), ("fwd", "bwd"),
           "MoE router: [b*l, hidden] x [hidden, experts] logits, softmax and top-k (params = hidden * experts)",
           tp_sharded=False),
    OpInfo("moe_permute", None, ("batch", "seq", "hidden"), ("fwd", "bwd"),
           "MoE token permutation: gather of the b*l*top_k routed rows of [hidden] into expert order "
           "(seq = tokens * top_k)", tp_sharded=False),
    OpInfo("moe_unpermute", None, ("batch", "seq", "hidden"), ("fwd", "bwd"),
           "MoE un-permutation: scatter of the expert outputs back, weighted by the router probabilities and "
           "summed over the top_k choices (seq = tokens * top_k)", tp_sharded=False),
]}

PAPER_OP_NAMES = {o.paper_name: o.name for o in OPS.values() if o.paper_name}
# The paper's per-stage optimizer files pool into "optimizer" with a variant.
PAPER_OPTIMIZER_FILES = {"firstStage_optimizer": "first", "middleStage_optimizer": "middle",
                         "lastStage_optimizer": "last", "optimizer": "whole"}

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "p2p", "alltoall")
# paper NCCL file stems -> canonical collective
PAPER_COLLECTIVES = {"allreduce": "allreduce", "allreduce_large": "allreduce",
                     "allgather_large": "allgather", "p2p": "p2p"}

# paper folder -> (platform id, device name in file names)
PAPER_PLATFORMS = {"Perlmutter": ("perlmutter-a100", "NVIDIAA100-SXM4-80GB"),
                   "Vista": ("vista-gh200", "NVIDIAGH200120GB")}

# Ops that were never sampled by the paper get a stand-in: (stand-in op, how its shape maps).
STAND_INS = {"swiglu": "gelu"}


@dataclass(frozen=True)
class FormatGemm:
    """A low-precision GEMM grid: the table dtype its rows carry (stored as op `gemm`), the op its regressor is
    saved as, and the precision whose dense peak its roofline uses."""
    table_dtype: str
    op: str
    roofline_precision: str


FORMAT_GEMMS: dict[str, FormatGemm] = {f.table_dtype: f for f in (
    FormatGemm("fp8", "gemm_fp8", "fp8"),
    FormatGemm("fp8_block", "gemm_fp8_block", "fp8"),
    FormatGemm("nvfp4", "gemm_nvfp4", "fp4"),
)}

"""One training step of a decoder-only transformer as operator and collective calls.

The step is built from a few *units*, each a list of calls for ONE micro-batch on ONE GPU:

  layer_unit   one transformer layer: forward, backward and recomputation calls, and its
               tensor-parallel exchanges
  first_unit   what the first pipeline chunk adds: the embedding (+ GPT's position add)
  last_unit    what the last chunk adds: final norm, LM head, cross-entropy
  step_work    once per step for one chunk: the optimizer and the data-parallel traffic (per
               micro-batch for ZeRO-2/3, where parameters are gathered unit by unit)

`decompose(model, layout, platform)` assembles them into one `StagePlan` per pipeline chunk
(pp * vpp of them, in pipeline order); the step-time engine (`predictor.step.engine`) uses the units
directly and scales them by the layers of each chunk, so both see the same calls.

Conventions follow Megatron-LM: column-parallel QKV / MLP-up, row-parallel attention-out /
MLP-down (two all-reduces per layer in forward and two in backward, or all-gather +
reduce-scatter with sequence parallelism), vocab-parallel embedding, LM head and cross-entropy,
vocabulary padded to a multiple of 128*tp.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from predictor.hardware.platforms import Platform
from predictor.model import moe as moe_
from predictor.model import params
from predictor.model.frameworks import fused_kernels_on, get_framework, separate_grad_accumulation
from predictor.model.ops import OP_SHAPE_COLUMNS, SHAPE_COLUMNS
from predictor.model.specs import (
    BYTES_PER_ELEMENT,
    DEFAULT_RECOMPUTE_MODULES,
    FLASH_IMPLS,
    Layout,
    ModelSpec,
    grad_comm_bytes,
)
from predictor.model.stages import V_SCHEDULES, chunk_layer_counts, chunk_rank
from predictor.step import fp8 as fp8_
from predictor.step.terms import TRITON_ATTENTION_FACTOR

Shape = tuple  # values in ops.SHAPE_COLUMNS order, None where unused (+ head_dim where decoupled)
Topology = tuple[int, int, int]  # (ranks, nodes, gpus_per_node) of a communication group


_OP_SHAPE_COLUMN_SET = frozenset(OP_SHAPE_COLUMNS)


def make_shape(**kw: int | None) -> Shape:
    """Values in SHAPE_COLUMNS order; a `head_dim` (decoupled from hidden / heads) adds an 11th value."""
    if not kw.keys() <= _OP_SHAPE_COLUMN_SET:
        raise KeyError(f"unknown shape columns {sorted(set(kw) - _OP_SHAPE_COLUMN_SET)}")
    shp = tuple(kw.get(c) for c in SHAPE_COLUMNS)
    return shp + (kw["head_dim"],) if kw.get("head_dim") is not None else shp


def _hd(model: ModelSpec) -> dict[str, int]:
    """The head_dim shape column where it is decoupled from hidden / heads (else none: shapes as before)."""
    return {"head_dim": model.head_size} if model.head_dim_decoupled else {}


@dataclass(frozen=True)
class OpCall:
    op: str
    pass_: str          # regressor pass: fwd | bwd | step
    shape: Shape
    count: float        # calls per micro-batch (per step for the optimizer)
    phase: str          # fwd | bwd | recompute | step
    part: str           # layer | embedding | head | loss | optimizer
    scale: float = 1.0  # multiplier on the predicted time (e.g. a stand-in's work ratio)
    variant: str | None = None  # optimizer: which pipeline stage it updates (first | middle | last)

    @property
    def key(self) -> tuple:
        """What the predicted time depends on (the predictor caches by it, with the precision)."""
        return (self.op, self.pass_, self.shape, self.variant)


@dataclass(frozen=True)
class CommCall:
    collective: str     # allreduce | allgather | reducescatter | p2p
    message_bytes: int  # the full buffer: all-gather output, reduce-scatter input, all-reduce buffer
    group: str          # tp | pp | dp | embedding | cp | ep (MoE all-to-all) | edp (expert gradients)
    phase: str          # fwd | bwd | recompute | step
    count: float        # calls per micro-batch (per step for dp / embedding)
    ranks: int
    nodes: int
    gpus_per_node: int

    @property
    def key(self) -> tuple:
        """What the predicted time depends on."""
        return (self.collective, self.message_bytes, self.nodes, self.gpus_per_node)


@dataclass(frozen=True)
class Unit:
    """The calls of one unit for one micro-batch (counts are per micro-batch)."""
    ops: tuple[OpCall, ...] = ()
    comms: tuple[CommCall, ...] = ()
    cp: int = 1   # context-parallel degree (the ring's "cp" comms overlap the attention blocks)
    tp_overlap: bool = False   # the layer's tensor-parallel exchanges overlap its GEMMs (Layout.overlap_tp_comm)


@dataclass(frozen=True)
class StepWork:
    """Once-per-step work of one chunk, and its per-micro-batch ZeRO-2/3 traffic."""
    step_ops: tuple[OpCall, ...] = ()
    step_comms: tuple[CommCall, ...] = ()
    mb_comms: tuple[CommCall, ...] = ()   # per micro-batch (ZeRO-2/3 gathers and reduce-scatters)
    accum_ops: tuple[OpCall, ...] = ()    # per micro-batch after the first: the gradient accumulation pass


@dataclass
class StagePlan:
    stage: int            # physical pipeline rank
    chunk: int            # virtual chunk index on that rank (0 unless interleaved)
    layers: int
    is_first: bool
    is_last: bool
    params_per_gpu: int
    ops: list[OpCall] = field(default_factory=list)
    comms: list[CommCall] = field(default_factory=list)       # per micro-batch, on the critical path
    step_ops: list[OpCall] = field(default_factory=list)      # once per step (optimizer)
    step_comms: list[CommCall] = field(default_factory=list)  # once per step (dp grads, zero gathers)
    accum_ops: list[OpCall] = field(default_factory=list)     # per micro-batch after the first (gradient accumulation)


def group_topology(platform: Platform, layout: Layout, group: str) -> Topology:
    """(ranks, nodes, gpus_per_node) of a communication group under Megatron's rank order
    (tp fastest, then dp, then pp), with ranks packed onto nodes of `platform.gpus_per_node`."""
    if group == "cp":
        return topology(platform.gpus_per_node, layout.tp, layout.cp, layout.pp, "cp")
    return topology(platform.gpus_per_node, layout.tp, layout.dp * layout.cp, layout.pp, group)


def ep_topology(gpus_per_node: int, ep: int, etp: int = 1) -> Topology:
    """The expert-parallel group: ep ranks of a stage's tp x cp x dp ranks (MoE parallel folding, expert rank order
    etp fastest, then ep: ep consecutive ranks with etp 1, one every etp ranks otherwise)."""
    if etp <= 1:
        return topology(gpus_per_node, 1, ep, 1, "ep")
    return topology(gpus_per_node, etp, ep, 1, "dp")


def tp_ep_topology(gpus_per_node: int, ep: int, etp: int = 1) -> Topology:
    """The allgather dispatcher's group (Megatron-Core `tp_ep_group`, expert tensor x expert model parallel): the
    etp x ep consecutive ranks of the expert rank order (etp fastest, then ep)."""
    return topology(gpus_per_node, 1, max(etp, 1) * max(ep, 1), 1, "ep")


def etp_topology(gpus_per_node: int, etp: int) -> Topology:
    """The expert-tensor-parallel group: etp consecutive ranks (expert rank order etp fastest)."""
    return topology(gpus_per_node, etp, 1, 1, "tp")


def edp_topology(gpus_per_node: int, tp: int, dp: int, ep: int, etp: int = 1) -> Topology:
    """The expert-data-parallel group (expert gradients): the tp * dp / (ep * etp) ranks holding the same expert
    shards, one every ep * etp ranks (`dp` is the data-parallel-with-CP degree)."""
    return topology(gpus_per_node, ep * etp, tp * dp // (ep * etp), 1, "dp")


def topology(gpus_per_node: int, tp: int, dp: int, pp: int, group: str) -> Topology:
    """`group_topology` from the degrees (what the engine calls for many layouts).

    Context parallelism (Megatron-Core rank order tp, cp, dp, pp): the engine passes dp * cp as `dp` for the
    data-parallel-with-CP group (gradients) and for the pipeline group's stride; the CP ring itself is group
    "cp" with `dp` = cp (size cp, stride tp: within a node while tp * cp <= gpus_per_node)."""
    g = gpus_per_node
    if group == "tp":
        size, stride = tp, 1
    elif group == "ep":   # expert parallel (MoE folding): `dp` = ep consecutive ranks of the tp x cp x dp ranks
        size, stride = dp, 1
    elif group in ("dp", "cp"):
        size, stride = dp, tp
    elif group in ("pp", "embedding"):
        size, stride = (pp if group == "pp" else 2), tp * dp
    else:
        raise ValueError(group)
    if size <= 1:
        return 1, 1, 1
    per_node = max(1, min(size, g // stride)) if stride < g else 1
    nodes = -(-size // per_node)
    return size, nodes, per_node


# --------------------------------------------------------------------------------------- units
def _norm(model: ModelSpec) -> str:
    return "rmsnorm" if model.arch == "llama" else "layernorm"


def _tp_comms(kind: str, phase: str, count: float, act_bytes: int, tp_topo: Topology) -> list[CommCall]:
    """A tensor-parallel exchange of one [b, s, h] activation."""
    if tp_topo[0] <= 1:
        return []
    return [CommCall(kind, act_bytes, "tp", phase, count, *tp_topo)]


ATTENTION_CORE_OPS = ("flash_attn", "attn_scores", "fused_masked_softmax", "attn_context")
# The tensor-parallel GEMMs whose sequence-parallel exchanges Transformer Engine's userbuffers overlap
TP_OVERLAP_GEMMS = ("qkv_proj", "attn_out_proj", "mlp_up", "mlp_down")


def _attention_core(model: ModelSpec, tp: int, b: int, s: int, phase: str, cp: int = 1) -> list[OpCall]:
    """The attention kernel(s) of one layer on `s` tokens per rank.

    Context parallelism (cp > 1, `s` = seq_len / cp): each rank holds seq_len / cp queries and sees all
    seq_len keys / values over the ring, in cp steps. Megatron's load balancing gives each rank two chunks
    (i and 2cp-1-i), so every step is half a full (s x s) block's work: the diagonal step is a causal s x s
    block, the others a non-masked half block; per rank 1/cp of the full causal attention. The sampled
    attention features have one sequence length (queries = keys), so the step is timed as `cp` calls of the
    causal kernel at s tokens (the same FLOPs as a half block), not at the per-rank query / full KV length."""
    h = model.hidden_size
    if model.attention_impl in FLASH_IMPLS:
        # a decoder's attention is causal (Predictor.op_times discounts non-causal samples); the Triton kernel
        # runs TRITON_ATTENTION_FACTOR times longer than FlashAttention-2
        k = TRITON_ATTENTION_FACTOR if model.attention_impl == "triton" else 1.0
        variant = FA2_BASE if model.attention_impl == "triton" else None
        w = model.sliding_window
        if w is not None and s > w:   # sliding-window layers (sliding_window_calls)
            return [OpCall("flash_attn", "fwd", make_shape(tp=tp, batch=b, seq=seq, hidden=h, heads=model.num_heads,
                                                            kv_heads=model.kv_heads, **_flash_hd(model)), n, phase,
                           "layer", scale=k, variant=variant)
                    for seq, n in sliding_window_calls(model, s) if n > 0]
        return [OpCall("flash_attn", "fwd", make_shape(tp=tp, batch=b, seq=s, hidden=h, heads=model.num_heads,
                                                        kv_heads=model.kv_heads, **_flash_hd(model)), cp, phase,
                       "layer", scale=k, variant=variant)]
    # MLA: the scores at the query / key head dimension, the context at the value head dimension
    shp = make_shape(tp=tp, batch=b, seq=s, hidden=h, heads=model.num_heads,
                     **({"head_dim": model.qk_head_size} if model.is_mla else _hd(model)))
    shp_ctx = (make_shape(tp=tp, batch=b, seq=s, hidden=h, heads=model.num_heads, head_dim=model.v_head_size)
               if model.is_mla else shp)
    # the fused softmax kernel was sampled per rank (tp = 1, heads already divided)
    shp_sm = make_shape(tp=1, batch=b, seq=s, heads=model.num_heads // tp)
    return [OpCall("attn_scores", "fwd", shp, 1, phase, "layer"),
            OpCall("fused_masked_softmax", "fwd", shp_sm, 1, phase, "layer"),
            OpCall("attn_context", "fwd", shp_ctx, 1, phase, "layer")]


def sliding_window_calls(model: ModelSpec, s: int) -> list[tuple[int, float]]:
    """(sequence length, calls per layer) of flash attention for a model with a sliding window W < s: the full-
    attention share of the layers (ModelSpec.full_attention_share) runs causal attention at s; the windowed share
    runs the same score work as causal attention at 2W tokens, (s*W - W^2/2) / (2W^2) = s / (2W) - 1/4 calls per
    layer (a query i attends keys i-W+1..i: the first W queries a causal W x W block, each later one W keys; a
    causal call at 2W does 2W^2). The calls see b x 2W tokens each, s/(2W) of them the layer's b x s tokens, so the
    kernel is timed at the block shape a windowed kernel tiles (Q, K, V read once), not as a long causal pass scaled
    down. A chunk's layers get the model-wide share (exact over the model; within a chunk at most one layer's
    attention off where its layers do not split evenly between the two kinds)."""
    w = model.sliding_window or s
    f = model.full_attention_share
    return [(s, f), (2 * w, (1.0 - f) * (s / (2 * w) - 0.25))]


def mla_flash_head_dim(model: ModelSpec) -> int:
    """The head dimension MLA's flash attention is timed at: (qk_nope + qk_rope + v_head_dim) / 2.

    The attention regressor's work model (predictor.regress.features) has one head dimension d: 4*b*H*l^2*d FLOPs
    (Q K^T and P V, 2*l^2*d each) and Q, K, V, O of d each. MLA's Q K^T runs at d_qk = qk_nope + qk_rope and P V at
    d_v: 2*l^2*(d_qk + d_v) FLOPs and Q, K of d_qk, V, O of d_v; d = (d_qk + d_v) / 2 gives the same FLOPs and the
    same bytes (DeepSeek-V3: (192 + 128) / 2 = 160). What it cannot carry is a kernel's speed at unequal head
    dimensions (FlashAttention-3 / cuDNN tile Q K^T at 192 and P V at 128): that rests on the regressor at d."""
    return (model.qk_head_size + model.v_head_size) // 2


def _flash_hd(model: ModelSpec) -> dict[str, int]:
    """The head_dim shape column of a flash-attention call: MLA's `mla_flash_head_dim`, else `_hd`."""
    return {"head_dim": mla_flash_head_dim(model)} if model.is_mla else _hd(model)


def mla_projection_ops(model: ModelSpec, tp: int, b: int, s: int, sp: bool, phase: str) -> list[OpCall]:
    """MLA's projections, latent norms and RoPE for one layer (docs/mla.md; DeepSeek-V2 arXiv 2405.04434 sec. 2.1,
    Megatron-Core MLASelfAttention).

    Each projection is a GEMM of its own shape, timed through the sampled `mlp_up` GEMM regressor, whose shape
    columns mean M = batch * seq, K = hidden, N = ffn_hidden / tp (predictor.regress.features.gemm_mnk): `hidden`
    carries the projection's input width and `ffn_hidden` its whole output width. The down projections W_DQ
    (hidden -> q_lora_rank) and W_DKV (hidden -> kv_lora_rank + qk_rope_head_dim) are replicated over tp
    (TELinear "duplicated"): tp = 1, on the sequence-parallel shard (seq / tp tokens) with sequence parallelism,
    on the whole sequence on every rank without it. Their RMSNorms run on the same tokens. The up projections W_UQ
    (q_lora_rank, or hidden without query compression, -> heads * (qk_nope + qk_rope)) and W_UKV (kv_lora_rank ->
    heads * (qk_nope + v_head_dim)) are column-parallel (split over tp) on the whole sequence. RoPE rotates the
    qk_rope_head_dim part only: of the query's heads / tp heads and of the one shared key head; timed as the
    sampled `rope` operator (which rotates q and k of heads / tp heads each) at head_dim qk_rope_head_dim, scaled by
    (heads / tp + 1) / (2 * heads / tp) for the single key head."""
    h, heads = model.hidden_size, model.num_heads
    s_down = s // tp if sp else s
    q_lora, kv_lora = model.q_lora_rank, model.kv_lora_rank or 0
    rope_d, nope_d = model.qk_rope_head_dim or 0, model.qk_nope_head_dim or 0
    ops: list[OpCall] = []
    if q_lora:
        ops += [OpCall("mlp_up", "fwd", make_shape(tp=1, batch=b, seq=s_down, hidden=h, ffn_hidden=q_lora), 1,
                       phase, "layer"),
                OpCall("rmsnorm", "fwd", make_shape(batch=b, seq=s_down, hidden=q_lora), 1, phase, "layer")]
    ops += [OpCall("mlp_up", "fwd", make_shape(tp=1, batch=b, seq=s_down, hidden=h, ffn_hidden=kv_lora + rope_d), 1,
                   phase, "layer"),
            OpCall("rmsnorm", "fwd", make_shape(batch=b, seq=s_down, hidden=kv_lora), 1, phase, "layer"),
            OpCall("mlp_up", "fwd", make_shape(tp=tp, batch=b, seq=s, hidden=q_lora or h,
                                               ffn_hidden=heads * model.qk_head_size), 1, phase, "layer"),
            OpCall("mlp_up", "fwd", make_shape(tp=tp, batch=b, seq=s, hidden=kv_lora,
                                               ffn_hidden=heads * (nope_d + model.v_head_size)), 1, phase, "layer")]
    hr = heads / tp
    ops.append(OpCall("rope", "fwd", make_shape(tp=tp, batch=b, seq=s, hidden=h, heads=heads, head_dim=rope_d), 1,
                      phase, "layer", scale=(hr + 1) / (2 * hr)))
    return ops


def mla_tp_comms(model: ModelSpec, b: int, s: int, e: int, sp: bool, tp_topo: Topology, phase: str
                 ) -> list[CommCall]:
    """The tensor-parallel exchanges of one MLA attention block (Megatron-Core MLASelfAttention; `e` bytes per
    element, `s` tokens per CP rank).

    Sequence parallelism: the replicated down projections run on the local seq / tp tokens, so what is gathered
    is not the [b, s, hidden] input but the latents the column-parallel up projections read, [b, s, q_lora_rank]
    (hidden without query compression) and [b, s, kv_lora_rank], and the shared RoPE key [b, s, qk_rope_head_dim];
    the output projection reduce-scatters [b, s, hidden]. The backward reduce-scatters the latents' gradients and
    all-gathers the output's. Without sequence parallelism: the forward all-reduces the output projection's
    [b, s, hidden]; the backward all-reduces the gradients of the up projections' inputs (column-parallel layers),
    [b, s, q_lora_rank or hidden] and [b, s, kv_lora_rank]."""
    if tp_topo[0] <= 1:
        return []
    h = model.hidden_size
    q_w, kv_w, rope_d = model.q_lora_rank or h, model.kv_lora_rank or 0, model.qk_rope_head_dim or 0
    out = b * s * h * e
    latents = [b * s * w * e for w in (q_w, kv_w, rope_d) if w]
    bwd = phase == "bwd"
    if sp:
        gather, scatter = ("reducescatter", "allgather") if bwd else ("allgather", "reducescatter")
        return [CommCall(gather, n, "tp", phase, 1, *tp_topo) for n in latents] + \
            [CommCall(scatter, out, "tp", phase, 1, *tp_topo)]
    if bwd:
        return [CommCall("allreduce", n, "tp", phase, 1, *tp_topo) for n in latents[:2]]
    return [CommCall("allreduce", out, "tp", phase, 1, *tp_topo)]


def _layer_forward(model: ModelSpec, tp: int, b: int, s: int, sp: bool, act_bytes: int, tp_topo: Topology,
                   phase: str, cp: int = 1, moe: tuple[moe_.Routing, Topology] | None = None,
                   etp_topo: Topology = (1, 1, 1), dispatch_topo: Topology = (1, 1, 1)
                   ) -> tuple[list[OpCall], list[CommCall]]:
    """The forward calls of one layer: attention, then the dense MLP or (`moe` = its routing and the
    expert-parallel group's topology) the MoE block (predictor.model.moe; `dispatch_topo`: the allgather
    dispatcher's etp x ep group)."""
    h = model.hidden_size
    s_sp = s // tp if sp else s
    shp_norm = make_shape(batch=b, seq=s_sp, hidden=h)
    if model.is_mla:   # multi-head latent attention: its own projections (mla_projection_ops)
        ops = [OpCall(_norm(model), "fwd", shp_norm, 2, phase, "layer")] + mla_projection_ops(model, tp, b, s, sp,
                                                                                              phase)
    else:
        ops = [OpCall(_norm(model), "fwd", shp_norm, 2, phase, "layer"),
               OpCall("qkv_proj", "fwd", make_shape(tp=tp, batch=b, seq=s, hidden=h, heads=model.num_heads,
                                                     kv_heads=model.kv_heads, **_hd(model)), 1, phase, "layer")]
    if model.arch == "llama" and not model.is_mla:
        ops.append(OpCall("rope", "fwd", make_shape(tp=tp, batch=b, seq=s, hidden=h, heads=model.num_heads,
                                                    **_hd(model)), 1, phase, "layer"))
    ops += _attention_core(model, tp, b, s, phase, cp)
    # the output projection's input is heads * head_dim wide (= hidden unless head_dim is decoupled; MLA: heads *
    # v_head_dim)
    out_shp = (make_shape(tp=tp, batch=b, seq=s, hidden=h, heads=model.num_heads, head_dim=model.v_head_size)
               if model.is_mla else
               make_shape(tp=tp, batch=b, seq=s, hidden=h, heads=model.num_heads, **_hd(model))
               if model.head_dim_decoupled else make_shape(tp=tp, batch=b, seq=s, hidden=h))
    ops.append(OpCall("attn_out_proj", "fwd", out_shp, 1, phase, "layer"))
    ops.append(OpCall("res_add", "fwd", shp_norm, 2, phase, "layer"))
    if moe is None:
        ops += _mlp_ops(model, tp, b, s, model.ffn, phase, "layer")
        exchanges = 2   # around attention and around the MLP
        comms: list[CommCall] = []
    else:
        m_ops, comms = _moe_calls(model, tp, b, s, act_bytes, tp_topo, phase, *moe, etp_topo=etp_topo,
                                  dispatch_topo=dispatch_topo)
        ops += m_ops
        exchanges = 1   # around attention; the routed experts run on the sequence-parallel shard
    attn: list[CommCall] = []
    if model.is_mla:   # MLA's attention exchanges are its own (mla_tp_comms), first in the list
        exchanges -= 1
        attn = mla_tp_comms(model, b, s, act_bytes // max(b * s * h, 1), sp, tp_topo, phase)
    if sp:
        comms = (attn + _tp_comms("allgather", phase, exchanges, act_bytes, tp_topo)
                 + _tp_comms("reducescatter", phase, exchanges, act_bytes, tp_topo) + comms)
    else:
        comms = attn + _tp_comms("allreduce", phase, exchanges, act_bytes, tp_topo) + comms
    return ops, comms


def _mlp_ops(model: ModelSpec, tp: int, b: int, s: int, width: int, phase: str, part: str,
             count: float = 1) -> list[OpCall]:
    """An MLP of inner width `width` split over tp: up (gate + up for SwiGLU), activation, down."""
    h = model.hidden_size
    mlp = make_shape(tp=tp, batch=b, seq=s, hidden=h, ffn_hidden=width)
    if model.arch == "llama":
        return [OpCall("mlp_up", "fwd", make_shape(tp=tp, batch=b, seq=s, hidden=h, ffn_hidden=2 * width), count,
                       phase, part),
                OpCall("swiglu", "fwd", mlp, count, phase, part),
                OpCall("mlp_down", "fwd", mlp, count, phase, part)]
    return [OpCall("mlp_up", "fwd", mlp, count, phase, part), OpCall("gelu", "fwd", mlp, count, phase, part),
            OpCall("mlp_down", "fwd", mlp, count, phase, part)]


def _moe_calls(model: ModelSpec, tp: int, b: int, s: int, act_bytes: int, tp_topo: Topology, phase: str,
               r: moe_.Routing, ep_topo: Topology, etp_topo: Topology = (1, 1, 1),
               dispatch_topo: Topology = (1, 1, 1)) -> tuple[list[OpCall], list[CommCall]]:
    """The MoE block of one layer (predictor.model.moe): router, permutation, all-to-all dispatch and combine over the
    expert-parallel group, each local expert's MLP on its rows, shared experts. Expert tensor parallelism
    (r.etp > 1, Megatron-Core's alltoall dispatcher): the received rows are all-gathered over the etp group before
    the experts and the expert output reduce-scattered back after them (group "ep": part of dispatch / combine,
    category ep_comm), each expert's GEMMs on 1/etp of its width (column-parallel fc1, row-parallel fc2).
    The allgather dispatcher (r.gathered_rows > 0): `allgather_dispatch_calls` in place of the permutations and the
    all-to-alls, over the etp x ep ranks of `dispatch_topo`."""
    h = model.hidden_size
    e = act_bytes // max(b * s * h, 1)   # bytes per element of the activations
    rows = make_shape(batch=1, seq=r.routed_rows, hidden=h)
    ops = [OpCall("moe_router", "fwd", make_shape(batch=1, seq=r.tokens, hidden=h, params=h * model.num_experts),
                  1, phase, "moe")]
    comms: list[CommCall] = []
    if r.gathered_rows:   # the dispatcher's calls around the experts: its permutation before, the rest after
        d_ops, comms = allgather_dispatch_calls(model, r, e, dispatch_topo, phase)
        before, after = d_ops[:1], d_ops[1:]
    else:   # hybridep (r.permutes 0): the permutations happen inside its dispatch and combine kernels
        before = [OpCall("moe_permute", "fwd", rows, r.permutes, phase, "moe")] if r.permutes else []
        after = [OpCall("moe_unpermute", "fwd", rows, r.permutes, phase, "moe")] if r.permutes else []
        if ep_topo[0] > 1:   # dispatch and combine: the busiest rank receives imbalance x its mean rows
            a2a = int(math.ceil(r.sent_rows * r.imbalance)) * h * e
            comms.append(CommCall("alltoall", a2a, "ep", phase, 2, *ep_topo))
        if r.etp > 1 and etp_topo[0] > 1:   # the received rows gathered over etp ranks, the output reduce-scattered
            gathered = r.etp * r.received_rows * h * e
            comms += [CommCall("allgather", gathered, "ep", phase, 1, *etp_topo),
                      CommCall("reducescatter", gathered, "ep", phase, 1, *etp_topo)]
    ops += before
    ops += _mlp_ops(model, r.etp, 1, r.rows_per_expert, model.expert_ffn, phase, "experts", r.local_experts)
    ops += after
    if model.shared_experts:
        ops += _mlp_ops(model, tp, b, s, model.shared_experts * model.shared_ffn, phase, "shared_experts")
        if tp_topo[0] > 1:   # the shared experts gather the sequence-parallel shards and reduce-scatter back
            comms += (_tp_comms("allgather", phase, 1, act_bytes, tp_topo)
                      + _tp_comms("reducescatter", phase, 1, act_bytes, tp_topo))
    return ops, comms


def allgather_dispatch_calls(model: ModelSpec, r: moe_.Routing, e: int, topo: Topology, phase: str
                             ) -> tuple[list[OpCall], list[CommCall]]:
    """The allgather token dispatcher of one MoE layer's forward (Megatron-Core MoEAllGatherTokenDispatcher,
    megatron/core/transformer/moe/token_dispatcher.py), G = etp x ep ranks of the `tp_ep_group` (`topo`), T tokens
    per rank, E experts, `e` bytes per activation element, R = r.local_rows:
      token_permutation    all-gather (gather_from_sequence_parallel_region over tp_ep_group) of the routing map
                           [T, E] bool (G T E bytes), the routing probabilities [T, E] (G T E e: the router's dtype,
                           the activations' unless moe_router_dtype fp32) and the hidden states [T, h] (G T h e);
                           permute (moe_utils.permute: index_select) of the R rows routed to the local experts
                           (`moe_permute` on R rows, once);
      token_unpermutation  unpermute (scatter-add of the R expert-output rows into a zeroed [G T, h] tensor:
                           `moe_unpermute` on R rows and the zero fill, one write of G T h elements, timed as half a
                           `moe_permute` pass over G T rows, moe_permute streaming two elements per element), then
                           reduce_scatter_to_sequence_parallel_region over tp_ep_group (G T h e).
    Calls are (ops: the permutation first, the rest after the experts; comms); the backward mirrors them
    (layer_unit): the hidden states' and probabilities' all-gathers become reduce-scatters of their gradients and the
    output's reduce-scatter an all-gather of the same sizes, the map's gather (no gradient) is not repeated
    (`routing_map_gather`), and the permutation's backward fills a zeroed [G T, h] gradient likewise."""
    h, T, E = model.hidden_size, r.tokens, model.num_experts
    G = r.gathered_rows // max(T, 1)
    local = make_shape(batch=1, seq=r.local_rows, hidden=h)
    ops = [OpCall("moe_permute", "fwd", local, 1, phase, "moe"),
           OpCall("moe_unpermute", "fwd", local, 1, phase, "moe"),
           OpCall("moe_permute", "fwd", make_shape(batch=1, seq=r.gathered_rows, hidden=h), 0.5, phase, "moe")]
    comms = [routing_map_gather(model, r, topo, phase),
             CommCall("allgather", G * T * E * e, "ep", phase, 1, *topo),
             CommCall("allgather", G * T * h * e, "ep", phase, 1, *topo),
             CommCall("reducescatter", G * T * h * e, "ep", phase, 1, *topo)]
    return ops, comms


def routing_map_gather(model: ModelSpec, r: moe_.Routing, topo: Topology, phase: str) -> CommCall:
    """The allgather dispatcher's all-gather of the boolean routing map, [etp x ep x T, E] (under torch.no_grad:
    forward only)."""
    return CommCall("allgather", r.gathered_rows * model.num_experts, "ep", phase, 1, *topo)


# Memory-bound operators a framework with fused kernels (predictor.model.frameworks) runs as one fused pass
FUSABLE_OPS = frozenset({"rmsnorm", "layernorm", "rope", "swiglu", "gelu", "res_add"})
FUSED = "fused"   # OpCall.variant of such an operator under fused kernels
# OpCall.variant of a Triton flash-attention call: its TRITON_ATTENTION_FACTOR is relative to FlashAttention-2, so the
# predictor times it on an FA2 base (never on a platform's published inference-engine attention kernel)
FA2_BASE = "fa2-base"


def fuse(ops: list[OpCall], fused: bool) -> list[OpCall]:
    """`ops` with the fusable memory-bound operators marked as fused kernels (variant FUSED) when `fused`."""
    if not fused:
        return ops
    return [replace(c, variant=FUSED) if c.op in FUSABLE_OPS else c for c in ops]


def _as_phase(calls: list, phase: str, pass_: str | None = None) -> list:
    out: list = []
    for c in calls:
        if isinstance(c, CommCall):
            out.append(CommCall(c.collective, c.message_bytes, c.group, phase, c.count, c.ranks, c.nodes,
                                c.gpus_per_node))
        else:
            out.append(OpCall(c.op, pass_ or c.pass_, c.shape, c.count, phase, c.part, c.scale, c.variant))
    return out


def cp_kv_bytes(model: ModelSpec, tp: int, micro_batch: int, seq_len: int, precision: str, cp: int) -> int:
    """Bytes of one context-parallel ring step: this rank's K and V block, 2 x [b, seq_len/cp, kv heads per
    tp rank x head_dim] (kv heads replicated where tp > kv_heads)."""
    kv_r = max(model.kv_heads // tp, 1)
    if model.is_mla:   # MLA: the up-projected K (qk_nope + qk_rope) and V (v_head_dim) of heads / tp heads
        return (micro_batch * (seq_len // cp) * kv_r * (model.qk_head_size + model.v_head_size)
                * BYTES_PER_ELEMENT[precision])
    return 2 * micro_batch * (seq_len // cp) * kv_r * model.head_size * BYTES_PER_ELEMENT[precision]


def cp_comms(model: ModelSpec, tp: int, micro_batch: int, seq_len: int, precision: str, cp: int,
             cp_topo: Topology, recompute: str) -> list[CommCall]:
    """The context-parallel ring of one layer (Megatron-Core's p2p ring attention): cp - 1 KV sends in the
    forward, twice that in the backward (KV and dKV), and the forward's again under full recomputation.
    Each overlaps one attention block; the engine counts what the block does not cover (`cp_comm`)."""
    if cp <= 1:
        return []
    n = cp_kv_bytes(model, tp, micro_batch, seq_len, precision, cp)
    out = [CommCall("p2p", n, "cp", "fwd", cp - 1, *cp_topo), CommCall("p2p", n, "cp", "bwd", 2 * (cp - 1), *cp_topo)]
    if recompute == "full":
        out.append(CommCall("p2p", n, "cp", "recompute", cp - 1, *cp_topo))
    return out


def cp_a2a_ranks(model: ModelSpec, tp: int, cp: int, cp_comm: str, cp_a2a_size: int | None,
                 gpus_per_node: int) -> int:
    """Ranks of each all-to-all group of context parallelism (1: the p2p ring alone; cp: DeepSpeed-Ulysses).
    a2a+p2p without a size: the largest divisor of cp that fits the node's GPUs / tp (the cp group is ranked
    after tp, so these ranks share a node) and divides the query and key/value heads of a tensor-parallel rank."""
    if cp <= 1 or cp_comm == "p2p":
        return 1
    if cp_comm == "a2a":
        return cp
    if cp_a2a_size:
        return int(cp_a2a_size)
    per_node = max(1, gpus_per_node // tp)
    q_r, kv_r = model.num_heads // tp, max(model.kv_heads // tp, 1)
    return max(d for d in range(1, cp + 1) if cp % d == 0 and d <= per_node and q_r % d == 0 and kv_r % d == 0)


def cp_topologies(gpus_per_node: int, tp: int, cp: int, a2a: int) -> tuple[Topology, Topology]:
    """(the ring's, each all-to-all group's) topology: the all-to-all over `a2a` consecutive cp ranks (stride tp),
    the ring over the cp / a2a groups (stride tp x a2a; Megatron-Core's hierarchical_context_parallel_sizes order
    the inner a2a group first). a2a = 1: the ring over all cp ranks, as without all-to-all."""
    return (topology(gpus_per_node, tp * a2a, cp // a2a, 1, "cp"),
            topology(gpus_per_node, tp, a2a, 1, "cp") if a2a > 1 else (1, 1, 1))


def cp_a2a_bytes(model: ModelSpec, tp: int, micro_batch: int, seq_len: int, precision: str, cp: int
                 ) -> tuple[int, int]:
    """(Q and output, K and V) bytes one rank holds before an all-to-all of DeepSpeed-Ulysses: the rank's
    seq_len / cp tokens of every head of its tensor-parallel share; Q [b, s/cp, heads/tp x hd], K and V each
    [b, s/cp, kv heads/tp x hd] (the output as Q). Jacobs et al. 2023 (arXiv 2309.14509) section 3.2."""
    e = BYTES_PER_ELEMENT[precision]
    tok = micro_batch * (seq_len // cp)
    q = tok * (model.num_heads // tp) * model.head_size * e
    kv = tok * max(model.kv_heads // tp, 1) * model.head_size * e
    return q, kv


def cp_a2a_comms(model: ModelSpec, tp: int, micro_batch: int, seq_len: int, precision: str, cp: int,
                 a2a: int, a2a_topo: Topology, recompute: str) -> list[CommCall]:
    """The all-to-alls of one layer's attention over groups of `a2a` consecutive cp ranks (Megatron-Core
    cp_comm_type a2a / a2a+p2p; DeepSpeed-Ulysses): forward Q, K, V before the attention and the output after
    (message = the rank's whole buffer, seq_len / cp tokens); backward the same four with the gradients (dO in,
    dQ, dK, dV out); again the forward's under full recomputation. Not overlapped with the attention: each
    all-to-all's output is the next kernel's input, so they are on the critical path (`cp_comm`)."""
    if a2a <= 1:
        return []
    q, kv = cp_a2a_bytes(model, tp, micro_batch, seq_len, precision, cp)
    out = []
    for phase in ("fwd", "bwd") + (("recompute",) if recompute == "full" else ()):
        out += [CommCall("alltoall", q, "cp", phase, 2, *a2a_topo), CommCall("alltoall", kv, "cp", phase, 2, *a2a_topo)]
    return out


def layer_unit(model: ModelSpec, tp: int, micro_batch: int, seq_len: int, sequence_parallel: bool,
               recompute: str, precision: str, tp_topo: Topology, cp: int = 1,
               cp_topo: Topology = (1, 1, 1), ep: int = 1, ep_topo: Topology = (1, 1, 1), moe: bool = True,
               fused: bool = False, tp_overlap: bool = False, cp_a2a: int = 1,
               a2a_topo: Topology = (1, 1, 1), etp: int = 1, etp_topo: Topology = (1, 1, 1),
               recompute_modules: tuple[str, ...] | None = None, dispatcher: str = "alltoall",
               dispatch_topo: Topology = (1, 1, 1)) -> Unit:
    """One transformer layer, one micro-batch: forward, backward (mirroring the forward's calls and
    tensor-parallel exchanges) and what recomputation re-runs. With context parallelism every operator
    sees seq_len / cp tokens, attention runs cp blocks (`_attention_core`) and the CP ring is added.
    A MoE model's layer is a MoE layer (`moe` False: one of its leading dense layers), its experts spread over
    the `ep` ranks of `ep_topo`, each split over the `etp` ranks of `etp_topo`, its tokens dispatched by
    `dispatcher` (alltoall; allgather over the etp x ep ranks of `dispatch_topo`: `allgather_dispatch_calls`).
    `fused`: the framework's fused kernels (`fuse`).
    All-to-all context parallelism (`cp_a2a` > 1 ranks per all-to-all group of `a2a_topo`, `cp_topo` then the ring
    across the cp / cp_a2a groups): the attention of a rank runs on seq_len / (cp / cp_a2a) tokens with the heads
    of tp x cp_a2a ranks' share (the ring's blocks over the rest), with `cp_a2a_comms` around it.
    Selective recomputation (`recompute` 'selective'): the forward of `recompute_modules` (None: Megatron-Core's
    default, core_attn) runs again in the backward (`recompute_module_calls`)."""
    s = seq_len // cp
    act_bytes = micro_batch * s * model.hidden_size * BYTES_PER_ELEMENT[precision]
    routed = None
    if moe and model.is_moe:
        routed = (moe_.routing(model, micro_batch, seq_len, tp, cp, ep, sequence_parallel, etp, dispatcher), ep_topo)
    f_ops, f_comms = _layer_forward(model, tp, micro_batch, s, sequence_parallel, act_bytes, tp_topo, "fwd", cp,
                                    routed, etp_topo, dispatch_topo)
    f_ops = fuse(f_ops, fused)
    b_ops = _as_phase(f_ops, "bwd", "bwd")
    b_comms = _as_phase(f_comms, "bwd")
    if routed is not None and routed[0].gathered_rows:   # the routing map's all-gather has no backward
        b_comms.remove(routing_map_gather(model, routed[0], dispatch_topo, "bwd"))
    if model.is_mla:   # MLA's attention exchanges differ between forward and backward (mla_tp_comms)
        e = BYTES_PER_ELEMENT[precision]
        n_attn = len(mla_tp_comms(model, micro_batch, s, e, sequence_parallel, tp_topo, "fwd"))
        b_comms = mla_tp_comms(model, micro_batch, s, e, sequence_parallel, tp_topo, "bwd") + b_comms[n_attn:]
    mods: tuple[str, ...] = ()
    if recompute == "full":
        r_ops, r_comms = _as_phase(f_ops, "recompute"), _as_phase(f_comms, "recompute")
    elif recompute == "selective":
        mods = DEFAULT_RECOMPUTE_MODULES if recompute_modules is None else tuple(recompute_modules)
        r_ops, r_comms = recompute_module_calls(model, tp, micro_batch, s, sequence_parallel, act_bytes, tp_topo,
                                                mods, cp, routed, etp_topo, dispatch_topo)
        r_ops = fuse(r_ops, fused)
    else:
        r_ops, r_comms = [], []
    ring_n = cp // cp_a2a
    if cp_a2a > 1:   # the attention on the all-to-all group's sequence, the heads split over tp x cp_a2a
        f_ops = _with_attention(f_ops, model, tp * cp_a2a, micro_batch, seq_len // ring_n, ring_n)
        b_ops = _with_attention(b_ops, model, tp * cp_a2a, micro_batch, seq_len // ring_n, ring_n)
        r_ops = _with_attention(r_ops, model, tp * cp_a2a, micro_batch, seq_len // ring_n, ring_n)
    # the attention re-run (full, or selective core_attn) repeats its CP exchanges
    attn_rc = "full" if recompute == "full" or "core_attn" in mods else "none"
    ring = cp_comms(model, tp * cp_a2a, micro_batch, seq_len, precision, ring_n, cp_topo, attn_rc)
    ring += cp_a2a_comms(model, tp, micro_batch, seq_len, precision, cp, cp_a2a, a2a_topo, attn_rc)
    return Unit(tuple(f_ops + b_ops + r_ops), tuple(f_comms + b_comms + r_comms + ring), ring_n, tp_overlap)


def recompute_module_calls(model: ModelSpec, tp: int, b: int, s: int, sp: bool, act_bytes: int, tp_topo: Topology,
                           modules: tuple[str, ...], cp: int = 1,
                           moe: tuple[moe_.Routing, Topology] | None = None, etp_topo: Topology = (1, 1, 1),
                           dispatch_topo: Topology = (1, 1, 1)) -> tuple[list[OpCall], list[CommCall]]:
    """The forward calls selective recomputation of `modules` re-runs in one layer's backward (phase 'recompute';
    Megatron-Core TransformerConfig.recompute_modules; `moe` set for a MoE layer, as in `_layer_forward`):
      core_attn       the attention core (flash attention's forward, or the unfused scores / softmax / context;
                      Megatron-Core's checkpointed core attention re-runs the kernel, flash or not);
      layernorm       input_layernorm and pre_mlp_layernorm where they are modules of their own (MLA's input norm,
                      a MoE layer's pre-MLP norm: ModelSpec.separate_norms; the others are fused into the next linear);
      mla_up_proj     MLA's latent norms, the two up projections and RoPE (`mla_projection_ops` less the down
                      projections; the norms are fused into the up projections in Transformer Engine's MLA spec);
      mlp             a dense layer's MLP with its tensor-parallel exchange (fc1 all-gathers, fc2 reduces);
      moe             a MoE layer's whole block: router, permutation, dispatch / combine all-to-alls, experts,
                      shared experts (`_moe_calls`);
      moe_act         the routed experts' activation on their rows;
      shared_experts  the shared experts' MLP with its tensor-parallel exchange.
    A module not in the layer re-runs nothing there; moe contains moe_act and shared_experts."""
    h = model.hidden_size
    ph = "recompute"
    ops: list[OpCall] = []
    comms: list[CommCall] = []

    def tp_exchange() -> list[CommCall]:
        if sp:
            return _tp_comms("allgather", ph, 1, act_bytes, tp_topo) + _tp_comms("reducescatter", ph, 1, act_bytes,
                                                                                  tp_topo)
        return _tp_comms("allreduce", ph, 1, act_bytes, tp_topo)
    norms = model.separate_norms(moe_layer=moe is not None)   # the norms that are modules of their own
    if "layernorm" in modules and norms:
        ops.append(OpCall(_norm(model), "fwd", make_shape(batch=b, seq=s // tp if sp else s, hidden=h), norms, ph,
                          "layer"))
    if "mla_up_proj" in modules and model.is_mla:
        proj = mla_projection_ops(model, tp, b, s, sp, ph)
        gemms = [c for c in proj if c.op == "mlp_up"]
        ops += [c for c in proj if c.op != "mlp_up"] + gemms[-2:]   # latent norms, RoPE; W_UQ and W_UKV (the last two)
    if "core_attn" in modules:
        ops += _attention_core(model, tp, b, s, ph, cp)
    if moe is None:
        if "mlp" in modules:
            ops += _mlp_ops(model, tp, b, s, model.ffn, ph, "layer")
            comms += tp_exchange()
        return ops, comms
    r, ep_topo = moe
    if "moe" in modules:
        m_ops, m_comms = _moe_calls(model, tp, b, s, act_bytes, tp_topo, ph, r, ep_topo, etp_topo=etp_topo,
                                    dispatch_topo=dispatch_topo)
        return ops + m_ops, comms + m_comms
    if "moe_act" in modules:
        act = "swiglu" if model.arch == "llama" else "gelu"
        ops.append(OpCall(act, "fwd", make_shape(tp=r.etp, batch=1, seq=r.rows_per_expert, hidden=h,
                                                 ffn_hidden=model.expert_ffn), r.local_experts, ph, "experts"))
    if "shared_experts" in modules and model.shared_experts:
        ops += _mlp_ops(model, tp, b, s, model.shared_experts * model.shared_ffn, ph, "shared_experts")
        if tp_topo[0] > 1:
            comms += tp_exchange()
    return ops, comms


def _with_attention(ops: list[OpCall], model: ModelSpec, tp: int, b: int, s: int, cp: int) -> list[OpCall]:
    """`ops` with their attention-core calls re-made by `_attention_core` on (tp, s, cp), phase and pass kept."""
    out: list[OpCall] = []
    for c in ops:
        if c.op not in ATTENTION_CORE_OPS:
            out.append(c)
            continue
        if c.op != ATTENTION_CORE_OPS[0] and c.op != "attn_scores":
            continue   # an unfused core is re-made whole from its first call
        for n in _attention_core(model, tp, b, s, c.phase, cp):
            out.append(OpCall(n.op, c.pass_, n.shape, n.count, c.phase, n.part, n.scale, n.variant))
    return out


def first_unit(model: ModelSpec, tp: int, micro_batch: int, seq_len: int, sequence_parallel: bool,
               precision: str, tp_topo: Topology, cp: int = 1, fused: bool = False) -> Unit:
    """What the first chunk adds: the vocab-parallel embedding (and GPT's position add) and its reduction
    (on seq_len / cp tokens per rank)."""
    b, s, h = micro_batch, seq_len // cp, model.hidden_size
    act_bytes = b * s * h * BYTES_PER_ELEMENT[precision]
    shp = make_shape(tp=tp, batch=b, seq=s, hidden=h, vocab=model.vocab_size)
    ops = [OpCall("embedding", "fwd", shp, 1, "fwd", "embedding"),
           OpCall("embedding", "bwd", shp, 1, "bwd", "embedding")]
    if model.arch == "gpt":  # learned position embedding added to the token embedding
        shp_add = make_shape(batch=b, seq=s // tp if sequence_parallel else s, hidden=h)
        ops += [OpCall("res_add", "fwd", shp_add, 1, "fwd", "embedding"),
                OpCall("res_add", "bwd", shp_add, 1, "bwd", "embedding")]
    comms = _tp_comms("reducescatter" if sequence_parallel else "allreduce", "fwd", 1, act_bytes, tp_topo)
    return Unit(tuple(fuse(ops, fused)), tuple(comms))


def last_unit(model: ModelSpec, tp: int, micro_batch: int, seq_len: int, sequence_parallel: bool,
              precision: str, tp_topo: Topology, cp: int = 1, fused: bool = False) -> Unit:
    """What the last chunk adds: final norm, vocab-parallel LM head and cross-entropy (seq_len / cp tokens)."""
    b, s, h = micro_batch, seq_len // cp, model.hidden_size
    act_bytes = b * s * h * BYTES_PER_ELEMENT[precision]
    shp_norm = make_shape(batch=b, seq=s // tp if sequence_parallel else s, hidden=h)
    shp_head = make_shape(tp=tp, batch=b, seq=s, hidden=h, vocab=model.vocab_size)
    shp_ce = make_shape(tp=tp, batch=b, seq=s, vocab=model.vocab_size)
    ops: list[OpCall] = []
    for p in ("fwd", "bwd"):
        ops += [OpCall(_norm(model), p, shp_norm, 1, p, "head"),
                OpCall("lm_head", p, shp_head, 1, p, "head"),
                OpCall("cross_entropy", p, shp_ce, 1, p, "loss")]
    if sequence_parallel:
        comms = (_tp_comms("allgather", "fwd", 1, act_bytes, tp_topo)
                 + _tp_comms("reducescatter", "bwd", 1, act_bytes, tp_topo))
    else:
        comms = _tp_comms("allreduce", "bwd", 1, act_bytes, tp_topo)
    if tp_topo[0] > 1:  # vocab-parallel cross-entropy: max, sum-exp and target-logit all-reduces of [b, s] fp32
        comms.append(CommCall("allreduce", b * s * 4, "tp", "fwd", 3, *tp_topo))
    return Unit(tuple(fuse(ops, fused)), tuple(comms))


def p2p_message_bytes(model: ModelSpec, tp: int, micro_batch: int, seq_len: int, sequence_parallel: bool,
                      precision: str, cp: int = 1) -> int:
    """Bytes of one pipeline send/recv: one [b, s, h] activation, s = seq_len / cp (the scatter-gather
    optimisation splits it over tp with sequence parallelism)."""
    act = micro_batch * (seq_len // cp) * model.hidden_size * BYTES_PER_ELEMENT[precision]
    return act // tp if sequence_parallel else act


def p2p_calls_per_pass(chunk_index: int, chunks: int, pp: int, schedule: str = "1f1b") -> int:
    """Sends + receives of one chunk per micro-batch and pass (the first chunk receives nothing, the
    last sends nothing; zb-v / dualpipe-v: chunk pp-1 hands its output to chunk pp on the same rank, the V's turn)."""
    if pp <= 1:
        return 0
    if schedule in V_SCHEDULES:
        return int(chunk_index not in (0, pp)) + int(chunk_index not in (chunks - 1, pp - 1))
    return int(chunk_index != 0) + int(chunk_index != chunks - 1)


def gather_bytes(model: ModelSpec, n_params: float, precision: str, *, tp: int, layers: int, dense: int = 0,
                 ep: int = 1, fp8_param: bool = False, etp: int = 1) -> int:
    """Bytes of `n_params` parameters of a chunk of `layers` transformer layers (`dense` of them dense in a MoE
    model) as the data-parallel all-gathers move them: the compute precision, except the GEMM weights under FP8
    primary weights (`fp8_param`: Megatron's --fp8-param-gather), which travel in FP8 (1 byte; MXFP8 1 + 1/32 with its
    scales)."""
    elem = BYTES_PER_ELEMENT[precision]
    if not fp8_param:
        return int(n_params * elem)
    moe_layers = layers - dense if model.is_moe else 0
    gemm = ((layers - moe_layers) * fp8_.layer_gemm_params_per_gpu(model, tp)
            + moe_layers * fp8_.layer_gemm_params_per_gpu(model, tp, True, ep, etp))
    return int(n_params * elem - min(gemm, n_params) * (elem - fp8_.weight_copy_bytes(precision)))


def grad_accumulation_calls(model: ModelSpec, n_params: int, layers: int, shard: int, grad_bytes: int,
                            precision: str) -> tuple[OpCall, ...]:
    """The gradient accumulation pass of one chunk after a micro-batch (frameworks without a fused accumulation,
    predictor.model.frameworks): the `n_params` / `shard` gradients this rank accumulates (ZeRO-2/3 and FSDP: its
    shard),
    read twice and written once in `grad_bytes` per element. Timed as the sampled elementwise add (res_add, two
    tensors in, one out) over rows of `hidden` elements, one call per layer (the per-tensor adds of a layer
    together; the edge chunks' embedding / head ride on their layers' calls), its time scaled by the ratio of
    gradient bytes to the add's element bytes."""
    n = n_params // max(shard, 1)
    if n <= 0:
        return ()
    calls = max(layers, 1)
    h = model.hidden_size
    rows = max(1, math.ceil(n / calls / h))
    scale = grad_bytes / BYTES_PER_ELEMENT[precision]
    return (OpCall("res_add", "fwd", make_shape(batch=1, seq=rows, hidden=h), calls, "accum", "grad_accum",
                   scale=scale),)


def step_work(model: ModelSpec, *, tp: int, pp: int, dp: int, zero_stage: int, precision: str, seq_len: int,
              layers: int, first: bool, last: bool, dp_topo: Topology, zero2_gather: str = "per_micro_batch",
              dense: int | None = None, ep: int = 1, edp_topo: Topology | None = None,
              grad_bytes: int | None = None, fp8_param: bool = False, etp: int = 1) -> StepWork:
    """The optimizer of one chunk and its data-parallel traffic, by ZeRO stage:

    zero_stage  as frameworks name it                         data-parallel traffic of this chunk
    0           DDP; Megatron without distributed optimizer   gradient all-reduce once per step
    1           Megatron distributed optimizer; ZeRO-1         gradient reduce-scatter once per step, then
                                                               parameter all-gather after the optimizer
    2           FSDP SHARD_GRAD_OP; ZeRO-2                     per micro-batch: parameter all-gather before
                                                               forward, gradient reduce-scatter in backward
    3           FSDP FULL_SHARD; ZeRO-3                        per micro-batch: parameter all-gather in forward
                                                               and again in backward, gradient reduce-scatter
    DeepSpeed ZeRO-2 (`zero2_gather="per_step"`) gathers the updated parameters once per step after the
    optimizer instead of before every micro-batch's forward (predictor.model.frameworks). Stages 2-3 move one unit
    at a time (each transformer layer; the
    embedding / head parameters of the edge chunks), one call per unit, prefetched under compute;
    stages 0-1 are bucketed and overlapped with the last backward by `compose`.
    Gradients travel in `grad_bytes` per element (default `specs.grad_comm_bytes(precision)`: fp32 for bf16, as
    Megatron-LM and torchtitan / llm-foundry FSDP reduce them; 2 with Layout.grad_reduce_in_fp32 False),
    parameters in the compute precision (the GEMM weights in FP8 under `fp8_param`: `gather_bytes`).
    FSDP x TP: the dp group holds the tp-sharded parameters of this GPU (`dp_topo` strides over tp).
    MoE (`dense` of the `layers` have a dense MLP, the rest are MoE layers with num_experts / ep experts here): the
    routed experts' gradients are reduced (ZeRO-1: reduce-scattered and gathered) over the expert-data-parallel
    group `edp_topo` (tp * dp / ep ranks; `dp` is the data-parallel-with-CP degree), the rest over `dp_topo`.
    """
    if model.is_moe:
        return _moe_step_work(model, tp=tp, pp=pp, dp=dp, zero_stage=zero_stage, precision=precision,
                              seq_len=seq_len, layers=layers, first=first, last=last, dp_topo=dp_topo,
                              dense=dense or 0, ep=ep, edp_topo=edp_topo or (1, 1, 1), grad_bytes=grad_bytes,
                              etp=etp,
                              fp8_param=fp8_param)
    gelem = grad_bytes or grad_comm_bytes(precision)
    n_params = params.chunk_params(model, tp, pp, layers, first, last, seq_len)
    # the parameters' all-gathers: FP8 GEMM weights under fp8_param (a share of the chunk's bytes)
    pelem = gather_bytes(model, n_params, precision, tp=tp, layers=layers, fp8_param=fp8_param) / max(n_params, 1)
    shard = dp if zero_stage >= 1 else 1
    # the paper samples the optimizer per pipeline-stage kind; a single stage (pp = 1) holds the
    # embedding like a first stage
    variant = "first" if first else "last" if last else "middle"
    opt = OpCall("optimizer", "step", make_shape(tp=tp, hidden=model.hidden_size, layers=layers,
                                                 params=max(1, n_params // shard)), 1, "step", "optimizer",
                 variant=variant)
    acc = grad_accumulation_calls(model, n_params, layers, dp if zero_stage >= 2 else 1, gelem, precision)
    if dp == 1:
        return StepWork(step_ops=(opt,), accum_ops=acc)
    if zero_stage == 0:
        return StepWork((opt,), (CommCall("allreduce", n_params * gelem, "dp", "step", 1, *dp_topo),), accum_ops=acc)
    if zero_stage == 1:
        return StepWork((opt,), (CommCall("reducescatter", n_params * gelem, "dp", "step", 1, *dp_topo),
                                 CommCall("allgather", int(n_params * pelem), "dp", "step", 1, *dp_topo)),
                        accum_ops=acc)
    # ZeRO-2/3 (FSDP): per micro-batch, unit by unit
    layer_unit_params = params.layer_params_per_gpu(model, tp)
    units = [(layer_unit_params, layers)] if layers else []
    edge = n_params - layers * layer_unit_params
    if edge > 0:
        units.append((edge, 1))
    per_step_gather = zero_stage == 2 and zero2_gather == "per_step"
    mb: list[CommCall] = []
    for n, count in units:
        if not per_step_gather:
            mb.append(CommCall("allgather", int(n * pelem), "dp", "fwd", count, *dp_topo))
        if zero_stage == 3:
            mb.append(CommCall("allgather", int(n * pelem), "dp", "bwd", count, *dp_topo))
        mb.append(CommCall("reducescatter", n * gelem, "dp", "bwd", count, *dp_topo))
    steps = (CommCall("allgather", int(n_params * pelem), "dp", "step", 1, *dp_topo),) if per_step_gather else ()
    return StepWork(step_ops=(opt,), step_comms=steps, mb_comms=tuple(mb), accum_ops=acc)


def _moe_step_work(model: ModelSpec, *, tp: int, pp: int, dp: int, zero_stage: int, precision: str, seq_len: int,
                   layers: int, first: bool, last: bool, dp_topo: Topology, dense: int, ep: int,
                   edp_topo: Topology, grad_bytes: int | None = None, fp8_param: bool = False,
                   etp: int = 1) -> StepWork:
    """`step_work` of a MoE model's chunk: the optimizer over both parameter groups, each group's data-parallel
    traffic over its own group (ZeRO stages 0 and 1; `Layout.validate` refuses ZeRO-2/3 with ep > 1, and with
    ep = 1 the expert-data-parallel group is the data-parallel group and stages 2-3 move whole layers as
    for a dense model)."""
    gelem = grad_bytes or grad_comm_bytes(precision)
    n_all = params.chunk_params(model, tp, pp, layers, first, last, seq_len, dense=dense, ep=ep, etp=etp)
    n_exp = (layers - dense) * params.layer_expert_params_per_gpu(model, ep, etp=etp)
    n_dense = n_all - n_exp
    pelem = gather_bytes(model, n_all, precision, tp=tp, layers=layers, dense=dense, ep=ep,
                         fp8_param=fp8_param, etp=etp) / max(n_all, 1)
    edp = edp_topo[0]
    shard_d, shard_e = (dp, edp) if zero_stage >= 1 else (1, 1)
    variant = "first" if first else "last" if last else "middle"
    opt = OpCall("optimizer", "step", make_shape(tp=tp, hidden=model.hidden_size, layers=layers,
                                                 params=max(1, n_dense // max(shard_d, 1) + n_exp // max(shard_e, 1))),
                 1, "step", "optimizer", variant=variant)
    if zero_stage >= 2:
        base = model.as_dense()
        w = step_work(base, tp=tp, pp=pp, dp=dp, zero_stage=zero_stage, precision=precision, seq_len=seq_len,
                      layers=layers, first=first, last=last, dp_topo=dp_topo, grad_bytes=grad_bytes,
                      fp8_param=fp8_param)
        k = n_all / max(params.chunk_params(base, tp, pp, layers, first, last, seq_len), 1)
        return StepWork((opt,), tuple(replace(c, message_bytes=int(c.message_bytes * k)) for c in w.step_comms),
                        tuple(replace(c, message_bytes=int(c.message_bytes * k)) for c in w.mb_comms),
                        grad_accumulation_calls(model, n_all, layers, dp, gelem, precision))
    comms: list[CommCall] = []
    for n, topo, group in ((n_dense, dp_topo, "dp"), (n_exp, edp_topo, "edp")):
        if n <= 0 or topo[0] <= 1:
            continue
        if zero_stage == 0:
            comms.append(CommCall("allreduce", n * gelem, group, "step", 1, *topo))
        else:
            comms += [CommCall("reducescatter", n * gelem, group, "step", 1, *topo),
                      CommCall("allgather", int(n * pelem), group, "step", 1, *topo)]
    acc = grad_accumulation_calls(model, n_dense, layers, 1, gelem, precision) + \
        grad_accumulation_calls(model, n_exp, layers, 1, gelem, precision)
    return StepWork((opt,), tuple(comms), accum_ops=acc)


def embedding_sync(model: ModelSpec, tp: int, pp: int, precision: str, emb_topo: Topology) -> CommCall | None:
    """Tied embeddings over pp > 1: the first and last stage all-reduce the embedding gradient once per step."""
    if not (model.tied_embeddings and pp > 1):
        return None
    n = params.embedding_params_per_gpu(model, tp)
    return CommCall("allreduce", n * BYTES_PER_ELEMENT[precision], "embedding", "step", 1, *emb_topo)


# ---------------------------------------------------------------------------------- assembly
def _times(c: OpCall, k: float) -> OpCall:
    return replace(c, count=c.count * k)


def _ctimes(c: CommCall, k: float) -> CommCall:
    return replace(c, count=c.count * k)


def decompose(model: ModelSpec, layout: Layout, platform: Platform) -> list[StagePlan]:
    """Every call of one step, one `StagePlan` per pipeline chunk in pipeline order."""
    layout.validate(model)
    chunks = layout.pp * layout.vpp
    counts = chunk_layer_counts(model, layout)
    dense_counts = params.chunk_dense_layers(model, counts)
    tp, b, s, sp, prec = layout.tp, layout.micro_batch, layout.seq_len, layout.sequence_parallel, layout.precision
    cp, ep, etp = layout.cp, layout.ep, (layout.expert_tp if model.is_moe else 1)
    dpc = layout.dp * cp   # the data-parallel-with-CP group: gradients and ZeRO shards
    g = platform.gpus_per_node
    tp_topo = topology(g, tp, dpc, layout.pp, "tp")
    pp_topo = topology(g, tp, dpc, layout.pp, "pp")
    dp_topo = topology(g, tp, dpc, layout.pp, "dp")
    a2a = cp_a2a_ranks(model, tp, cp, layout.cp_comm, layout.cp_a2a_size, g)
    cp_topo, a2a_topo = cp_topologies(g, tp, cp, a2a)
    ep_topo = ep_topology(g, ep, etp)
    edp_topo = edp_topology(g, tp, dpc, ep, etp)
    fused = fused_kernels_on(layout.framework, platform)
    otp = layout.overlap_tp_comm
    rmods = layout.recomputed_modules(model)
    lay = layer_unit(model, tp, b, s, sp, layout.recompute, prec, tp_topo, cp, cp_topo, ep, ep_topo, fused=fused,
                     tp_overlap=otp, cp_a2a=a2a, a2a_topo=a2a_topo, etp=etp, etp_topo=etp_topology(g, etp),
                     recompute_modules=rmods, dispatcher=layout.moe_dispatcher,
                     dispatch_topo=tp_ep_topology(g, ep, etp))
    dense_lay = (layer_unit(model, tp, b, s, sp, layout.recompute, prec, tp_topo, cp, cp_topo, moe=False,
                            fused=fused, tp_overlap=otp, cp_a2a=a2a, a2a_topo=a2a_topo, recompute_modules=rmods)
                 if model.is_moe else lay)
    fst = first_unit(model, tp, b, s, sp, prec, tp_topo, cp, fused)
    lst = last_unit(model, tp, b, s, sp, prec, tp_topo, cp, fused)
    p2p_bytes = p2p_message_bytes(model, tp, b, s, sp, prec, cp)
    emb = embedding_sync(model, tp, layout.pp, prec, topology(g, tp, dpc, layout.pp, "embedding"))
    if layout.schedule in V_SCHEDULES:
        emb = None   # the V puts the first and the last chunk on rank 0: a tied embedding needs no sync
    plans: list[StagePlan] = []
    for idx, n_layers in enumerate(counts):
        first, last = idx == 0, idx == chunks - 1
        n_dense = dense_counts[idx] if model.is_moe else 0
        plan = StagePlan(stage=chunk_rank(layout.schedule, layout.pp, idx), chunk=idx // layout.pp, layers=n_layers,
                         is_first=first, is_last=last,
                         params_per_gpu=params.chunk_params(model, tp, layout.pp, n_layers, first, last, s,
                                                            dense=n_dense, ep=ep, etp=etp))
        plan.ops += [_times(c, n_layers - n_dense) for c in lay.ops] + [_times(c, n_dense) for c in dense_lay.ops
                                                                        if n_dense]
        plan.comms += ([_ctimes(c, n_layers - n_dense) for c in lay.comms]
                       + [_ctimes(c, n_dense) for c in dense_lay.comms if n_dense])
        if first:
            plan.ops += list(fst.ops)
            plan.comms += list(fst.comms)
        if last:
            plan.ops += list(lst.ops)
            plan.comms += list(lst.comms)
        n_p2p = p2p_calls_per_pass(idx, chunks, layout.pp, layout.schedule)
        if n_p2p:
            plan.comms.append(CommCall("p2p", p2p_bytes, "pp", "fwd", n_p2p, *pp_topo))
            plan.comms.append(CommCall("p2p", p2p_bytes, "pp", "bwd", n_p2p, *pp_topo))
        work = step_work(model, tp=tp, pp=layout.pp, dp=dpc, zero_stage=layout.zero_stage, precision=prec,
                         seq_len=s, layers=n_layers, first=first, last=last, dp_topo=dp_topo,
                         zero2_gather=get_framework(layout.framework).zero2_gather, dense=n_dense, ep=ep,
                         edp_topo=edp_topo, grad_bytes=layout.grad_bytes, etp=etp)
        plan.step_ops += list(work.step_ops)
        plan.step_comms += list(work.step_comms)
        plan.comms += list(work.mb_comms)
        if separate_grad_accumulation(layout.framework, platform):
            plan.accum_ops += list(work.accum_ops)
        if emb is not None and (first or last):
            plan.step_comms.append(emb)
        plans.append(plan)
    return plans

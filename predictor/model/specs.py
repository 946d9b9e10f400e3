"""Typed configuration: the model, the parallel layout, and the one domain error.

Every field carries its unit in its name where it has one. Validation raises
`InfeasibleConfig`, which names the offending field and how to fix it; the CLI
and the dashboard show it as a warning, never as a traceback.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from predictor.model import params
from predictor.model.bounds import check_bound, check_tokens_per_micro_batch
from predictor.model.errors import InfeasibleConfig
from predictor.model.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, get_framework
from predictor.model.params import padded_vocab
from predictor.model.stages import V_SCHEDULES, ZB_SCHEDULES, interleaved_split

ARCHS = ("gpt", "llama")
# (+ the zero-bubble and bidirectional pipeline schedules: predictor.model.stages, docs/schedules.md)
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved") + ZB_SCHEDULES
SCHEDULE_HELP = {
    "gpipe": "all forwards, then all backwards",
    "1f1b": "one forward, one backward (PipeDream-flush); bubble (pp-1)(F+B)",
    "interleaved": "1F1B over vpp model chunks per GPU; bubble (pp-1)(F+B)/vpp",
    "zb-h1": "zero-bubble H1: backward split into B (input grad) and W (weight grad), W fills the cool-down; "
             "bubble (pp-1)(F+B-2W), 1F1B's memory",
    "zb-v": "zero-bubble V: 2 chunks per GPU in a V, W fills the bubbles; near-zero bubble at 1F1B's memory",
    "dualpipe": "DeepSeek-V3 DualPipe: micro-batches from both ends, forward and backward chunks overlapped with "
                "their communication; bubble (pp/2-1)(F&B+B-3W), 2x parameters; even pp and micro-batches",
    "dualpipe-v": "DualPipeV: DualPipe cut in half, 2 chunks per GPU in a V; bubble (pp-1)(F&B+B-3W), 1x parameters",
}
RECOMPUTES = ("none", "selective", "full")
# Selective recomputation by module (Layout.recompute_modules; Megatron-Core TransformerConfig.recompute_modules, with
# recompute_granularity "selective"; its default is ["core_attn"]). What each one frees and re-runs:
# predictor.step.memory.recompute_freed_bytes and predictor.step.decompose.recompute_module_calls (docs/memory.md).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
PRECISIONS = ("fp16", "bf16", "fp32", "fp8", "mxfp8", "nvfp4")
# FP8 primary weights (fp8_param_gather): Transformer Engine keeps a GEMM weight as its per-tensor FP8 or MXFP8
# tensor only (Megatron --fp8-param-gather with --fp8-recipe tensorwise / delayed / mxfp8; Megatron-Bridge's fp8_cs
# and fp8_mx mixed-precision presets set fp8_param_gather True)
FP8_PARAM_PRECISIONS = ("fp8", "mxfp8")
# Context-parallel communication kinds (Layout.cp_comm; Megatron-Core cp_comm_type)
CP_COMMS = ("p2p", "a2a", "a2a+p2p")
# MoE token dispatchers (Layout.moe_dispatcher; Megatron-Core moe_token_dispatcher_type): "alltoall" = all-to-all of
# the permuted rows over the ep ranks (the predictor's default); "allgather" = all-gather of every token over the
# etp x ep ranks, each rank keeping the rows routed to its experts, reduce-scatter back (Megatron-Core's own default);
# "hybridep" = Megatron-Core's flex dispatcher with the HybridEP backend (moe_token_dispatcher_type flex,
# moe_flex_dispatcher_backend hybridep; megatron/core/transformer/moe/fused_a2a.py): one kernel permutes, sends and
# permutes again ("permute + dispatch a2a + permute"), each token sent once per destination rank (predictor.model.moe)
MOE_DISPATCHERS = ("alltoall", "allgather", "hybridep")
# CUDA graphs (Layout.cuda_graphs; Megatron-Core cuda_graph_impl / cuda_graph_scope, megatron/core/transformer/
# cuda_graph_config.py, enums.py CudaGraphModule): "none" (eager, the default), "full_iteration" (cuda_graph_impl
# full_iteration: the whole forward-backward of every micro-batch captured, one replay per step), or the per-layer
# parts Transformer Engine's graphs capture (cuda_graph_impl transformer_engine), joined by "+" in this order:
# attn (the attention part), mlp (a dense layer's MLP), moe_router (the MoE router, and the shared experts),
# moe_preprocess (the dispatcher's preprocess; Megatron-Core: "must be used with moe_router").
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe_router", "moe_preprocess")
CUDA_GRAPHS_NONE, CUDA_GRAPHS_FULL = "none", "full_iteration"
CUDA_GRAPHS_FULL_BIT = 1 << len(CUDA_GRAPH_SCOPES)   # the engine column's bit of full_iteration
# Megatron-Core scopes the planner does not model, with why
CUDA_GRAPH_UNMODELLED = {
    "moe": "the whole MoE module is captured only for drop-and-pad MoE or sync-free HybridEP with paged stash "
           "(megatron/core/transformer/cuda_graph_config.py validate_moe_cuda_graph_support); the share of the expert "
           "part is not measured",
    "mamba": "the planner has no Mamba layers",
    "full": "per-layer whole-layer capture (cuda_graph_impl local) is not modelled",
}
# fp8: Transformer-Engine-style FP8 training (predictor.step.fp8): FP8 GEMMs in the transformer layers' linear layers,
# BF16 master weights and BF16 everything else, so a tensor outside those GEMMs is 2 bytes as in bf16.
# mxfp8 (MX FP8 on Blackwell, blockwise FP8 on Hopper) and nvfp4 (Blackwell): the same GEMMs block-scaled, the rest
# BF16 likewise (predictor.step.fp8; which device runs which: `scaled_formats` in devices.json).
ATTENTION_IMPLS = ("flash", "triton", "unfused")
# FlashAttention kernels (no s^2 score matrix kept): FlashAttention-2/3 CUDA ("flash") or the Triton implementation
# ("triton", as MPT / llm-foundry ran it); "unfused" is Megatron's QK^T + fused scale-mask-softmax + AV.
FLASH_IMPLS = ("flash", "triton")
# ModelSpec.attention_kind: "gqa" (MHA / GQA / MQA) or "mla" (multi-head latent attention, docs/mla.md)
ATTENTION_KINDS = ("gqa", "mla")
# The MLA fields of ModelSpec (= CLI flags without dashes = batch columns); None = not given
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
BYTES_PER_ELEMENT = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 2, "mxfp8": 2, "nvfp4": 2}
# Gradient element size held between backward and the optimizer, and reduced over data parallel:
# Megatron-LM forces fp32 gradient accumulation and reduction for bf16, torchtitan / llm-foundry
# FSDP reduce in fp32 by default; fp16 (DeepSpeed, Megatron fp16) keeps fp16 gradients.
GRAD_BYTES = {"bf16": 4, "fp16": 2, "fp32": 4, "fp8": 4, "mxfp8": 4, "nvfp4": 4}


def grad_comm_bytes(precision: str, grad_reduce_in_fp32: bool | None = None) -> int:
    """Bytes per gradient element in the gradient buffers and data-parallel reductions: GRAD_BYTES of the
    precision, or 4 / 2 where Layout.grad_reduce_in_fp32 says fp32 / the 16-bit precision."""
    if grad_reduce_in_fp32 is None:
        return GRAD_BYTES.get(precision, 4)
    return 4 if grad_reduce_in_fp32 else 2


def grad_reduce_in_fp32_of(grad_bytes: int, precision: str) -> bool | None:
    """The Layout.grad_reduce_in_fp32 that gives `grad_bytes` (None where it is the precision's default):
    `grad_comm_bytes` read backwards."""
    return None if grad_bytes == grad_comm_bytes(precision) else grad_bytes == 4


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer.

    `ffn_hidden_size` is the inner MLP width (4*hidden for GPT; for SwiGLU models
    the width of each of the gate and up projections). `num_kv_heads` < `num_heads`
    means grouped-query attention.
    """

    name: str
    arch: str  # "gpt" (LayerNorm, GeLU, MHA, learned pos) | "llama" (RMSNorm, RoPE, SwiGLU, GQA)
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int | None = None
    ffn_hidden_size: int | None = None
    vocab_size: int = 50257
    tied_embeddings: bool = True
    attention_impl: str = "flash"
    # Attention head dimension; None = hidden_size // num_heads. Qwen3 decouples it (heads * head_dim != hidden):
    # the QKV projection is hidden -> (heads + 2*kv_heads) * head_dim, the output projection heads*head_dim -> hidden.
    head_dim: int | None = None
    # Mixture-of-Experts (Megatron-Core style; predictor.model.moe): num_experts 0 = a dense model. A MoE layer replaces
    # the MLP by a router, top_k of num_experts routed experts of width moe_ffn_hidden (None = ffn_hidden) and
    # shared_experts always-on experts of width shared_ffn_hidden (None = moe_ffn_hidden) each; the first
    # dense_layers layers keep the dense MLP (ffn_hidden). capacity_factor None = dropless; moe_imbalance
    # None = the busiest expert-parallel rank's load modelled from routing statistics (predictor.model.moe).
    num_experts: int = 0
    top_k: int | None = None
    moe_ffn_hidden: int | None = None
    shared_experts: int = 0
    shared_ffn_hidden: int | None = None
    dense_layers: int = 0
    capacity_factor: float | None = None
    moe_imbalance: float | None = None
    # --- Multi-head latent attention (MLA; docs/mla.md) ---
    # attention_kind "gqa": MHA / GQA / MQA as above. "mla": multi-head latent attention (DeepSeek-V2,
    # arXiv 2405.04434 sec. 2.1): the query is compressed to q_lora_rank (None = not compressed: DeepSeek-V2-Lite,
    # Moonlight), keys and values to one kv_lora_rank latent plus a shared qk_rope_head_dim RoPE key; each of the
    # num_heads heads has a query / key of qk_nope_head_dim + qk_rope_head_dim and a value of v_head_dim (names as in
    # DeepSeek-V3's config.json). num_kv_heads and head_dim are not used by MLA (leave them empty). The field is
    # named attention_kind because `attention` (CLI / batch column) already names the kernel (attention_impl).
    attention_kind: str = "gqa"
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    # --- Interleaved MoE layers (Llama 4 Maverick; docs/mla.md) ---
    # Of the layers after the leading dense_layers, every moe_layer_interval-th is a MoE layer and the others keep
    # the dense MLP (ffn_hidden): layer i (counted from 0 after the leading dense ones) is MoE when
    # (i + 1) % moe_layer_interval == 0, HF Llama4TextDecoderLayer's rule for interleave_moe_layer_step (Maverick: 2,
    # dense / MoE alternating). 1 = every layer MoE (as before).
    moe_layer_interval: int = 1
    # --- Sliding-window attention (GPT-OSS; docs/mla.md) ---
    # sliding_window: each query attends to itself and the sliding_window - 1 keys before it (None = full causal
    # attention in every layer). full_attention_interval: every n-th layer keeps full attention, layer i (0-based)
    # when (i + 1) % n == 0 (GPT-OSS: 2, sliding / full alternating from layer 0, its config.json layer_types);
    # None = every layer windowed (Mistral-7B v0.1's sliding_window 4096).
    sliding_window: int | None = None
    full_attention_interval: int | None = None

    @property
    def full_attention_share(self) -> float:
        """The share of layers with full (not windowed) attention: 1 without a sliding window; with one, the layers
        i with (i + 1) % full_attention_interval == 0 over all layers (0 when every layer is windowed)."""
        if self.sliding_window is None:
            return 1.0
        if not self.full_attention_interval:
            return 0.0
        return (self.num_layers // self.full_attention_interval) / self.num_layers

    @property
    def has_dense_layers(self) -> bool:
        """Whether a MoE model has dense-MLP layers too (leading ones or interleaved ones)."""
        return self.is_moe and self.moe_layers < self.num_layers

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer `index` (0-based, pipeline order) has a MoE block: past the leading dense_layers, every
        moe_layer_interval-th layer (HF Llama 4's (i + 1) % interleave_moe_layer_step == 0)."""
        if not self.is_moe or index < self.dense_layers:
            return False
        return (index - self.dense_layers + 1) % self.moe_layer_interval == 0

    @property
    def is_mla(self) -> bool:
        return self.attention_kind == "mla"

    def separate_norms(self, moe_layer: bool) -> int:
        """How many of a layer's two norms are modules of their own, which selective 'layernorm' recomputation
        re-runs, in Megatron-Core's Transformer Engine layer specs (gpt_layer_specs.py): the input norm is fused into
        the QKV projection (TELayerNormColumnParallelLinear; input_layernorm IdentityOp) except before MLA's down
        projections (input_layernorm TENorm); the pre-MLP norm is fused into fc1 except before a MoE block
        (pre_mlp_layernorm TENorm when num_experts). transformer_layer.py recomputes a norm only
        `if not isinstance(..., IdentityOp)`."""
        return int(self.is_mla) + int(moe_layer)

    @property
    def qk_head_size(self) -> int:
        """MLA: the query / key head dimension, qk_nope_head_dim + qk_rope_head_dim; else head_size."""
        if self.is_mla:
            return (self.qk_nope_head_dim or 0) + (self.qk_rope_head_dim or 0)
        return self.head_size

    @property
    def v_head_size(self) -> int:
        """MLA: the value head dimension v_head_dim; else head_size."""
        return (self.v_head_dim or 0) if self.is_mla else self.head_size

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def as_dense(self) -> ModelSpec:
        """The same model with every Mixture-of-Experts field at its dense default (MOE_DENSE_DEFAULTS)."""
        return replace(self, **MOE_DENSE_DEFAULTS, moe_layer_interval=1)

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a MoE block (all but the leading dense ones, every moe_layer_interval-th of them; 0
        for a dense model)."""
        if not self.is_moe:
            return 0
        return (self.num_layers - self.dense_layers) // max(self.moe_layer_interval, 1)

    @property
    def expert_ffn(self) -> int:
        """Width of one routed expert (moe_ffn_hidden, else ffn_hidden)."""
        return self.moe_ffn_hidden or self.ffn

    @property
    def shared_ffn(self) -> int:
        """Width of one shared expert (shared_ffn_hidden, else the routed experts' width)."""
        return self.shared_ffn_hidden or self.expert_ffn

    @property
    def kv_heads(self) -> int:
        """Key / value heads (MLA: num_heads, every head has its own up-projected key and value)."""
        return self.num_kv_heads or self.num_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_size(self) -> int:
        """The attention head dimension in use: `head_dim`, or hidden_size // num_heads when it is None."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def attn_width(self) -> int:
        """Width of the attention's query / output projection side: heads * head dimension (= hidden unless
        head_dim is decoupled)."""
        return self.num_heads * self.head_size

    @property
    def head_dim_decoupled(self) -> bool:
        """Whether heads * head_dim differs from hidden (the operator shapes then carry head_dim)."""
        return self.attn_width != self.hidden_size

    def params_per_layer(self) -> int:
        """Parameters of one transformer layer (weights and biases/norm gains); see predictor.model.params."""
        return params.layer_params(self)

    def embedding_params(self, tp: int = 1) -> int:
        return padded_vocab(self.vocab_size, tp) * self.hidden_size

    def total_params(self) -> int:
        return params.total_params(self)

    def active_params(self) -> int:
        """Parameters one token passes through (MoE: top_k routed experts); = total_params for a dense model."""
        return params.active_params(self)

    def validate(self) -> None:
        if self.arch not in ARCHS:
            raise InfeasibleConfig("arch", f"unknown architecture '{self.arch}'.", f"use one of {', '.join(ARCHS)}.")
        for name in ("num_layers", "hidden_size", "num_heads", "vocab_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise InfeasibleConfig(_flag(name), f"must be a positive integer, got {v!r}.")
            check_bound(_flag(name), v)
        for name in ("num_kv_heads", "ffn_hidden_size", "head_dim"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                raise InfeasibleConfig(_flag(name), f"must be a positive integer, got {v!r}.")
            if v is not None:
                check_bound(_flag(name), v)
        if self.head_dim is not None:
            if self.head_dim <= 0:
                raise InfeasibleConfig("head_dim", f"must be a positive integer, got {self.head_dim!r}.",
                                       "leave it empty for hidden / heads, or give the model's head dimension "
                                       "(e.g. 128).")
            if self.head_dim % 8:
                raise InfeasibleConfig("head_dim", f"head_dim {self.head_dim} is not a multiple of 8 (attention "
                                                   "kernels need it).", "use a multiple of 8, e.g. 64 or 128.")
            if self.num_heads * self.head_dim > 4 * self.hidden_size:
                raise InfeasibleConfig(
                    "head_dim", f"heads * head_dim = {self.num_heads} * {self.head_dim} = "
                                f"{self.num_heads * self.head_dim} is over 4 x hidden ({4 * self.hidden_size}).",
                    f"check heads and head_dim; hidden / heads = {self.hidden_size / self.num_heads:g}.")
        elif self.hidden_size % self.num_heads and not self.is_mla:
            raise InfeasibleConfig(
                "hidden", f"hidden size {self.hidden_size} is not divisible by heads {self.num_heads}.",
                "choose hidden and heads so that hidden / heads is an integer head dimension.")
        if self.num_kv_heads is not None and (self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads):
            raise InfeasibleConfig(
                "kv_heads", f"kv_heads {self.num_kv_heads} must divide heads {self.num_heads}.",
                "use a divisor of heads (heads for MHA, 1 for MQA).")
        if self.ffn_hidden_size is not None and self.ffn_hidden_size <= 0:
            raise InfeasibleConfig("ffn_hidden", "must be positive.")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise InfeasibleConfig("attention_impl", f"unknown '{self.attention_impl}'.",
                                   f"use one of {', '.join(ATTENTION_IMPLS)}.")
        self._validate_moe()
        self._validate_mla()
        self._validate_sliding_window()

    def _validate_sliding_window(self) -> None:
        """sliding_window a positive integer within the sequence bound, with flash attention (an unfused kernel
        materialises every score anyway); full_attention_interval only with a window, at least 2."""
        w, k = self.sliding_window, self.full_attention_interval
        for name, v in (("sliding_window", w), ("full_attention_interval", k)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise InfeasibleConfig(name, f"must be a positive integer, got {v!r}.",
                                       "leave it empty for full attention, or give the model's value (GPT-OSS: "
                                       "sliding_window 128, full_attention_interval 2).")
        if w is None:
            if k is not None:
                raise InfeasibleConfig("full_attention_interval", "full_attention_interval needs a sliding_window.",
                                       "give sliding_window (GPT-OSS: 128), or leave full_attention_interval empty.")
            return
        check_bound("seq_len", w)
        if k is not None:
            check_bound("layers", k)
            if k == 1:
                raise InfeasibleConfig("full_attention_interval", "full_attention_interval 1 makes every layer full "
                                                                  "attention: the sliding window would be unused.",
                                       "leave sliding_window empty for full attention, or use an interval >= 2.")
        if self.attention_impl not in FLASH_IMPLS:
            raise InfeasibleConfig("sliding_window", f"sliding-window attention is modelled with flash attention, "
                                                     f"not '{self.attention_impl}' attention.",
                                   "use attention flash, or leave sliding_window empty.")

    def _validate_mla(self) -> None:
        """MLA fields: none given with attention_kind gqa; with mla the ranks and head dimensions given, positive,
        below the hidden size, the RoPE part even (rotary pairs), and no GQA head fields."""
        if self.attention_kind not in ATTENTION_KINDS:
            raise InfeasibleConfig("attention_kind", f"unknown attention kind '{self.attention_kind}'.",
                                   f"use one of {', '.join(ATTENTION_KINDS)} (gqa covers MHA, GQA and MQA).")
        for name in MLA_FIELDS:
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise InfeasibleConfig(name, f"must be a positive integer, got {v!r}.",
                                       "give the model's value (DeepSeek-V3: q_lora_rank 1536, kv_lora_rank 512, "
                                       "qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128).")
        if not self.is_mla:
            given = [n for n in MLA_FIELDS if getattr(self, n) is not None]
            if given:
                raise InfeasibleConfig(given[0], f"{given[0]} is a multi-head latent attention field but "
                                                 "attention_kind is gqa.",
                                       "set attention_kind mla (--attention-kind mla), or leave the MLA fields empty.")
            return
        if self.arch != "llama":
            raise InfeasibleConfig("arch", "multi-head latent attention is modelled in Llama-style layers (RMSNorm, "
                                           "SwiGLU, no biases), as DeepSeek-V2 / V3, Moonlight and Kimi K2 have them.",
                                   "use arch llama with attention_kind mla.")
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, name) is None:
                raise InfeasibleConfig(name, f"attention_kind mla needs {name}.",
                                       f"give --{name.replace('_', '-')} (DeepSeek-V3: kv_lora_rank 512, "
                                       "qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128), or use "
                                       "attention_kind gqa.")
        for name in ("num_kv_heads", "head_dim"):
            if getattr(self, name) is not None and not (name == "num_kv_heads" and self.num_kv_heads == self.num_heads):
                raise InfeasibleConfig(_flag(name), f"{_flag(name)} is a grouped-query attention field; with "
                                                    "attention_kind mla every head has its own key and value of "
                                                    "qk_nope_head_dim + qk_rope_head_dim / v_head_dim.",
                                       f"leave {_flag(name)} empty with attention_kind mla.")
        for name in ("q_lora_rank", "kv_lora_rank"):
            v = getattr(self, name)
            if v is not None and v >= self.hidden_size:
                raise InfeasibleConfig(name, f"{name} {v} is not below the hidden size {self.hidden_size}: a "
                                             "low-rank compression narrower than the model is its point.",
                                       f"use a rank below {self.hidden_size} (DeepSeek-V3: 1536 / 512 of 7168), or "
                                       "leave q_lora_rank empty for an uncompressed query.")
        for name in MLA_FIELDS:
            v = getattr(self, name)
            if v is not None:
                check_bound(name, v)
        if (self.qk_rope_head_dim or 0) % 2:
            raise InfeasibleConfig("qk_rope_head_dim", f"qk_rope_head_dim {self.qk_rope_head_dim} is odd; RoPE "
                                                       "rotates pairs of dimensions.",
                                   "use an even size (DeepSeek-V2 / V3: 64).")
        if self.qk_head_size % 8 or self.v_head_size % 8:
            raise InfeasibleConfig("qk_nope_head_dim" if self.qk_head_size % 8 else "v_head_dim",
                                   f"the query / key head dimension (qk_nope + qk_rope = {self.qk_head_size}) and "
                                   f"the value head dimension ({self.v_head_size}) must be multiples of 8 (attention "
                                   "kernels need it).", "use multiples of 8, e.g. 128 + 64 and 128.")

    def _validate_moe(self) -> None:
        """MoE fields: all zero / empty for a dense model; for a MoE model top_k in 1..num_experts, widths
        positive, dense_layers below num_layers, capacity factor and imbalance sensible."""
        for name in ("num_experts", "shared_experts", "dense_layers"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InfeasibleConfig(name, f"must be a whole number >= 0, got {v!r}.")
            check_bound(name, v)
        for name in ("top_k", "moe_ffn_hidden", "shared_ffn_hidden"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise InfeasibleConfig(name, f"must be a positive integer, got {v!r}.")
            if v is not None:
                check_bound(name, v)
        for name in ("capacity_factor", "moe_imbalance"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not v == v
                                  or v in (float("inf"), float("-inf"))):
                raise InfeasibleConfig(name, f"must be a number, got {v!r}.")
        v = self.moe_layer_interval
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InfeasibleConfig("moe_layer_interval", f"must be a positive integer, got {v!r}.",
                                   "use 1 (every layer MoE) or the model's interval (Llama 4 Maverick: 2).")
        check_bound("moe_layer_interval", v)
        if not self.is_moe:
            given = [n for n in ("top_k", "moe_ffn_hidden", "shared_ffn_hidden", "capacity_factor", "moe_imbalance")
                     if getattr(self, n) is not None] + [n for n in ("shared_experts", "dense_layers")
                                                         if getattr(self, n)] + \
                (["moe_layer_interval"] if self.moe_layer_interval != 1 else [])
            if given:
                raise InfeasibleConfig(given[0], f"{given[0]} is a Mixture-of-Experts field but num_experts is 0 "
                                                 "(a dense model).",
                                       "set num_experts (e.g. 8) for a MoE model, or leave the MoE fields empty.")
            return
        if self.num_experts < 2:
            raise InfeasibleConfig("num_experts", f"a MoE model needs at least 2 experts, got {self.num_experts}.",
                                   "use 0 for a dense model, or the model's expert count (e.g. 8, 64, 128).")
        if self.top_k is None:
            raise InfeasibleConfig("top_k", "a MoE model needs top_k, the experts each token is routed to.",
                                   "set top_k (Mixtral 2, Qwen3-MoE 8, DeepSeek-V3 8).")
        if self.top_k > self.num_experts:
            raise InfeasibleConfig("top_k", f"top_k {self.top_k} is more than num_experts {self.num_experts}: a "
                                            "token cannot go to more experts than there are.",
                                   f"use a top_k between 1 and {self.num_experts}.")
        if self.dense_layers >= self.num_layers:
            raise InfeasibleConfig("dense_layers", f"dense_layers {self.dense_layers} leaves no MoE layer of "
                                                   f"{self.num_layers}.",
                                   f"use fewer than {self.num_layers} leading dense layers, or num_experts 0.")
        if self.moe_layers == 0:
            raise InfeasibleConfig("moe_layer_interval", f"moe_layer_interval {self.moe_layer_interval} leaves no "
                                                         f"MoE layer among the {self.num_layers - self.dense_layers} "
                                                         "layers after the leading dense ones.",
                                   "use a smaller interval (Llama 4 Maverick: 2), or num_experts 0.")
        if self.capacity_factor is not None and not 0 < self.capacity_factor <= self.num_experts / self.top_k:
            raise InfeasibleConfig("capacity_factor", f"capacity_factor {self.capacity_factor:g} is outside "
                                                      f"(0, num_experts / top_k = {self.num_experts / self.top_k:g}].",
                                   "leave it empty for dropless routing, or use e.g. 1.0-1.25.")
        if self.moe_imbalance is not None and not 1.0 <= self.moe_imbalance <= self.num_experts:
            raise InfeasibleConfig("moe_imbalance", f"moe_imbalance {self.moe_imbalance:g} must be between 1 "
                                                    f"(perfect balance) and num_experts ({self.num_experts}).",
                                   "leave it empty to model it from routing statistics, or give the busiest "
                                   "rank's load over the mean (e.g. 1.2).")


def recomputed_modules(model: ModelSpec, framework: str, modules: tuple[str, ...]) -> tuple[str, ...]:
    """What selective recomputation of `modules` re-runs under `framework`: the modules under Megatron-Core
    (framework megatron); nothing under the others with flash attention, which run the legacy Megatron-LM attention
    that checkpoints the core attention only without flash attention (megatron/model/transformer.py: `if not
    self.use_flash_attn: if self.checkpoint_core_attention: ...`; recompute_modules is refused for them)."""
    if framework != "megatron" and model.attention_impl in FLASH_IMPLS:
        return ()
    return modules


def pp_overlap_default(framework: str, schedule: str, pp: int) -> bool:
    """The default of Layout.overlap_p2p_comm: on for Megatron-Core's interleaved schedule with pp > 1 (Megatron-LM
    megatron/training/arguments.py: '--no-overlap-p2p-communication', action='store_false', dest='overlap_p2p_comm';
    Megatron-Bridge's CommOverlapConfig enables it 'when pipeline_model_parallel_size > 1 and
    virtual_pipeline_model_parallel_size > 1'), off for every other schedule and framework."""
    return framework == "megatron" and schedule == "interleaved" and pp > 1


def overlap_p2p_field(on: bool, framework: str, schedule: str, pp: int) -> bool | None:
    """Layout.overlap_p2p_comm for a layout whose overlap is resolved to `on`: None where that is the default
    (`pp_overlap_default`), else `on`."""
    return None if on == pp_overlap_default(framework, schedule, pp) else on


def check_moe_dispatcher(model: ModelSpec | None, dispatcher: str, moe_overlap: bool = False, etp: int = 1) -> None:
    """The MoE token dispatcher is one of MOE_DISPATCHERS and can run with the rest: Megatron-Core refuses the
    dispatch / combine overlap with the allgather dispatcher ('overlap_moe_expert_parallel_comm is supported with
    alltoall/flex token dispatcher') and a capacity factor with it ('moe_expert_capacity_factor only works with alltoall
    token dispatcher'), both in megatron/core/transformer/transformer_config.py __post_init__; hybridep (the flex
    dispatcher) runs with the overlap but not with a capacity factor either, and only with experts whole (etp 1,
    `etp` the resolved expert tensor parallelism); allgather or hybridep on a dense model is a MoE field on a dense
    model."""
    if dispatcher in ("flex", "deepep"):
        raise InfeasibleConfig("moe_dispatcher", f"moe_dispatcher {dispatcher!r}: of Megatron-Core's flex dispatcher "
                                                 "only the HybridEP backend is modelled (the DeepEP backend's "
                                                 "separate permutation and buffer sizes are not).",
                               "use hybridep (flex with moe_flex_dispatcher_backend hybridep), or alltoall for a "
                               "DeepEP run (its all-to-alls move at most the rows DeepEP does).")
    if dispatcher not in MOE_DISPATCHERS:
        raise InfeasibleConfig("moe_dispatcher", f"unknown MoE token dispatcher {dispatcher!r}.",
                               f"use one of {', '.join(MOE_DISPATCHERS)} (alltoall is the default).")
    if model is None or dispatcher == "alltoall":
        return
    if not model.is_moe:
        raise InfeasibleConfig("moe_dispatcher", f"moe_dispatcher {dispatcher} but the model is dense (num_experts 0).",
                               "leave moe_dispatcher at alltoall (the default), or give the model's num_experts and "
                               "top_k.")
    if dispatcher == "hybridep" and etp > 1:
        raise InfeasibleConfig("etp", f"expert tensor parallelism {etp} with the hybridep dispatcher is not "
                                      "modelled (its dispatch replicates each token over the etp ranks of the "
                                      "tp x ep group).",
                               "use etp 1 with hybridep, or moe_dispatcher alltoall.")
    if dispatcher == "allgather" and moe_overlap:
        raise InfeasibleConfig("moe_dispatcher", "the dispatch / combine overlap (moe_overlap) runs with the alltoall "
                                                 "dispatcher only (Megatron-Core: 'overlap_moe_expert_parallel_comm is "
                                                 "supported with alltoall/flex token dispatcher').",
                               "use moe_dispatcher alltoall, or turn moe_overlap off.")
    if model.capacity_factor is not None:   # allgather and hybridep alike
        raise InfeasibleConfig("moe_dispatcher", f"a capacity factor ({model.capacity_factor:g}) drops tokens in the "
                                                 "alltoall dispatcher only (Megatron-Core: 'moe_expert_capacity_factor "
                                                 "only works with alltoall token dispatcher').",
                               "use moe_dispatcher alltoall, or leave capacity_factor empty (dropless).")


def cuda_graphs_mask(value: str) -> int:
    """The engine column of a Layout.cuda_graphs value: a bit per CUDA_GRAPH_SCOPES entry, CUDA_GRAPHS_FULL_BIT for
    full_iteration, 0 for none. InfeasibleConfig naming cuda_graphs on a value that is not one."""
    if not isinstance(value, str):
        raise InfeasibleConfig("cuda_graphs", f"must be a string, got {value!r}.",
                               f"use none, {CUDA_GRAPHS_FULL}, or scopes joined by '+' from "
                               f"{', '.join(CUDA_GRAPH_SCOPES)}.")
    v = value.strip()
    if v in ("", CUDA_GRAPHS_NONE):
        return 0
    if v == CUDA_GRAPHS_FULL:
        return CUDA_GRAPHS_FULL_BIT
    parts = [x.strip() for x in v.replace(",", "+").split("+")]
    mask = 0
    for x in parts:
        if x in (CUDA_GRAPHS_NONE, CUDA_GRAPHS_FULL):
            raise InfeasibleConfig("cuda_graphs", f"{x} cannot be combined with other scopes ({value!r}).",
                                   f"give {x} alone, or scopes joined by '+' from {', '.join(CUDA_GRAPH_SCOPES)}.")
        if x in CUDA_GRAPH_UNMODELLED:
            raise InfeasibleConfig("cuda_graphs", f"the CUDA graph scope {x!r} is not modelled: "
                                                  f"{CUDA_GRAPH_UNMODELLED[x]}.",
                                   "use attn+moe_router+moe_preprocess (what dropless MoE recipes capture), attn+mlp "
                                   f"for a dense model, or {CUDA_GRAPHS_FULL}.")
        if x not in CUDA_GRAPH_SCOPES:
            raise InfeasibleConfig("cuda_graphs", f"unknown CUDA graph scope {x!r} in {value!r}.",
                                   f"use none, {CUDA_GRAPHS_FULL}, or scopes joined by '+' from "
                                   f"{', '.join(CUDA_GRAPH_SCOPES)} (e.g. attn+moe_router+moe_preprocess).")
        mask |= 1 << CUDA_GRAPH_SCOPES.index(x)
    return mask


def cuda_graphs_value(mask: int) -> str:
    """The canonical Layout.cuda_graphs value of an engine column (scopes in CUDA_GRAPH_SCOPES order)."""
    if not mask:
        return CUDA_GRAPHS_NONE
    if mask & CUDA_GRAPHS_FULL_BIT:
        return CUDA_GRAPHS_FULL
    return "+".join(s for i, s in enumerate(CUDA_GRAPH_SCOPES) if mask >> i & 1)


def normalize_cuda_graphs(value: str | None) -> str:
    """A user's value in canonical form (scopes sorted, ',' read as '+'; empty = none); InfeasibleConfig on a bad
    one."""
    return cuda_graphs_value(cuda_graphs_mask(value or CUDA_GRAPHS_NONE))


def check_cuda_graphs(model: ModelSpec | None, value: str, framework: str = "megatron") -> None:
    """Layout.cuda_graphs can run: known scopes (cuda_graphs_mask); Megatron-Core's setting, so the megatron framework
    only; moe_preprocess with moe_router ('must be used with moe_router', Megatron-LM docs/discussions DeepSeek-V3 on
    GB200, Partial CUDA Graphs); MoE scopes only on a MoE model, mlp only on a model with dense-MLP layers;
    full_iteration on a MoE model only with static expert shapes: Megatron-Core captures a whole MoE module only for
    drop-and-pad MoE (moe_expert_capacity_factor with moe_pad_expert_input_to_capacity) or sync-free HybridEP with
    rank capacity and paged stash (megatron/core/transformer/cuda_graph_config.py validate_moe_cuda_graph_support;
    Megatron-Bridge's full-iteration recipes set moe_expert_rank_capacity_factor and moe_paged_stash), neither of
    which a dropless model here has."""
    mask = cuda_graphs_mask(value)
    if not mask:
        return
    if framework != "megatron":
        raise InfeasibleConfig("cuda_graphs", f"CUDA graphs are Megatron-Core's setting (cuda_graph_impl / "
                                              f"cuda_graph_scope); framework {framework} has none modelled.",
                               "use framework megatron, or cuda_graphs none.")
    if model is None:
        return
    bit = {s: 1 << i for i, s in enumerate(CUDA_GRAPH_SCOPES)}
    if mask & bit["moe_preprocess"] and not mask & bit["moe_router"]:
        raise InfeasibleConfig("cuda_graphs", "moe_preprocess is captured with moe_router only (Megatron-Core: "
                                              "'moe_preprocess ... must be used with moe_router').",
                               "add moe_router, e.g. attn+moe_router+moe_preprocess.")
    if mask & (bit["moe_router"] | bit["moe_preprocess"]) and not model.is_moe:
        raise InfeasibleConfig("cuda_graphs", f"{value} captures MoE parts but the model is dense (num_experts 0).",
                               "drop moe_router / moe_preprocess (attn+mlp captures a dense layer), or give the "
                               "model's num_experts and top_k.")
    if mask & bit["mlp"] and model.is_moe and model.moe_layers >= model.num_layers:
        raise InfeasibleConfig("cuda_graphs", "the mlp scope captures dense-MLP layers, and every layer of this MoE "
                                              "model is a MoE layer.",
                               "drop mlp (moe_router+moe_preprocess captures the MoE layer's static part).")
    if mask & CUDA_GRAPHS_FULL_BIT and model.is_moe and model.capacity_factor is None:
        raise InfeasibleConfig("cuda_graphs", "full_iteration captures every MoE layer, which needs static expert "
                                              "shapes: Megatron-Core captures a whole MoE module only for drop-and-pad "
                                              "MoE (moe_expert_capacity_factor with moe_pad_expert_input_to_capacity) "
                                              "or sync-free HybridEP with moe_expert_rank_capacity_factor and "
                                              "moe_paged_stash (not modelled); this model is dropless.",
                               "give the model a capacity_factor (drop and pad), or capture "
                               "attn+moe_router+moe_preprocess.")


@dataclass(frozen=True)
class Layout:
    """How one training step is laid out over the GPUs.

    num_gpus = tp * pp * cp * dp.
    `vpp` is the number of virtual pipeline stages per GPU (interleaved schedule).
    `cp` is the context-parallel degree (Megatron-Core style, `predictor.step.decompose`): the sequence of every
    micro-batch is split over cp ranks (seq_len / cp tokens each, in 2*cp load-balanced chunks of
    seq_len / (2*cp)); the ranks exchange key/value blocks in a ring inside attention. `dp` stays the pure
    data-parallel degree (micro-batches per step = global_batch / (micro_batch * dp)); gradients and ZeRO
    shards spread over the dp * cp ranks of the data-parallel-with-CP group.
    """

    num_gpus: int
    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    seq_len: int = 2048
    vpp: int = 1
    schedule: str = "1f1b"
    recompute: str = "none"
    sequence_parallel: bool = False
    zero_stage: int = 0
    precision: str = "bf16"
    # Layers per pipeline chunk (pp*vpp entries, first stage first); None = as even as possible,
    # the remainder going to the middle stages (the edge stages carry embedding / LM head).
    stage_layers: tuple[int, ...] | None = None
    # The training framework (predictor.model.frameworks): when the data-parallel traffic runs and whether it
    # overlaps compute; None in the overlap switches = the framework's default.
    framework: str = DEFAULT_FRAMEWORK
    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool | None = None
    cp: int = 1   # context-parallel degree (ranks one micro-batch's sequence is split over); 1 = none
    # expert-parallel degree (MoE models): the experts of each MoE layer spread over ep ranks. Megatron-Core's MoE
    # parallel folding with expert tensor parallelism 1: the ep ranks are taken from the tp x cp x dp ranks of a
    # pipeline stage (ep divides tp * cp * dp), the expert weights are replicated over the remaining
    # tp * cp * dp / ep ranks (the expert-data-parallel group, over which expert gradients are reduced).
    ep: int = 1
    # Transformer Engine's tensor-parallel communication overlap (Megatron-Core --tp-comm-overlap, NeMo's
    # tp_comm_overlap; userbuffers): the sequence-parallel all-gathers / reduce-scatters of a layer run in chunks
    # under the GEMMs they feed; needs tp > 1 with sequence parallelism. Off by default (Megatron-Core's default).
    overlap_tp_comm: bool = False
    # Gradient buffers and their data-parallel reduction in fp32 (Megatron-Core DDPConfig.grad_reduce_in_fp32,
    # Megatron-LM's default for bf16) or in the 16-bit compute precision (False: NeMo's and Megatron-Bridge's
    # performance recipes); None = GRAD_BYTES of the precision (fp32 for bf16 / fp8, fp16 for fp16).
    grad_reduce_in_fp32: bool | None = None
    # FP8 primary weights (Megatron --fp8-param-gather, NeMo / Megatron-Bridge fp8_param_gather): the GEMM weights
    # are kept in FP8 only (no BF16 copy beside the FP8 ones) and the distributed optimizer all-gathers them in FP8;
    # precision fp8 or mxfp8 (FP8_PARAM_PRECISIONS).
    fp8_param_gather: bool = False
    # --- all-to-all context parallelism and activation offloading (docs/context_parallelism.md, docs/offload.md) ---
    # How the cp ranks exchange the sequence (Megatron-Core cp_comm_type): "p2p" = the K/V ring (the default, as
    # before); "a2a" = DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509): all-to-alls of Q, K, V before the
    # attention and of its output after turn the sequence split into a head split; "a2a+p2p" = hierarchical: a2a
    # inside groups of `cp_a2a_size` consecutive cp ranks (Megatron's hierarchical_context_parallel_sizes[0]), the
    # p2p ring across the cp / cp_a2a_size groups.
    cp_comm: str = "p2p"
    # a2a+p2p only: ranks of each all-to-all group; None = the cp ranks that share a node (the largest divisor of cp
    # not above GPUs per node / tp), resolved by the step decomposition where the platform is known
    cp_a2a_size: int | None = None
    # Megatron-Core cpu_offloading (cpu_offloading_activations, cpu_offloading_num_layers; NeMo / Megatron-Bridge
    # activation_offload_layers): the saved activations of this many transformer layers per pipeline stage go to
    # host memory after their forward and come back before their backward (Transformer Engine's CPU offload). 0 = off.
    offload_activations: int = 0
    # --- MoE: expert tensor parallelism and dispatch / combine overlap (predictor.model.moe) ---
    # Expert tensor parallelism (Megatron-Core expert_tensor_parallel_size): each routed expert's fc1 split by columns
    # and fc2 by rows over etp ranks, the dispatched rows all-gathered over that group before the experts and
    # reduce-scattered after them. MoE parallel folding (arXiv 2504.14960): etp x ep x expert-dp = tp x cp x dp.
    # None = the framework's default (`expert_tp`: Megatron-Core sets an unset size to tp; the others keep experts
    # whole, 1).
    etp: int | None = None
    # Megatron-Core's overlap_moe_expert_parallel_comm ("1F1B A2A overlap", megatron/core/pipeline_parallel/
    # combined_1f1b.py): one micro-batch's forward runs merged with another's backward, the all-to-all dispatch /
    # combine of each hidden under the other's compute (predictor.step.engine, `moe_overlap_hidden`). Off by default.
    moe_overlap: bool = False
    # Megatron-Core's moe_token_dispatcher_type (MOE_DISPATCHERS; megatron/core/transformer/moe/token_dispatcher.py):
    # "alltoall" (MoEAlltoAllTokenDispatcher, the default here, as before) or "allgather" (MoEAllGatherTokenDispatcher,
    # Megatron-Core's own default when the run does not set it: the hidden states, routing probabilities and routing
    # map all-gathered over the etp x ep ranks, the expert output reduce-scattered back; predictor.model.moe).
    moe_dispatcher: str = "alltoall"
    # CUDA graphs (CUDA_GRAPH_SCOPES, cuda_graphs_mask; Megatron-Core cuda_graph_impl / cuda_graph_scope): "none" (the
    # default, eager), "full_iteration", or per-layer scopes joined by "+" (e.g. "attn+moe_router+moe_preprocess"). A
    # captured part's host time is replaced by a graph replay (predictor.step.engine `_framework_host`); GPU time and
    # memory are not changed (docs/end_to_end_terms.md)
    cuda_graphs: str = "none"
    # --- selective recomputation by module (recompute "selective" only) ---
    # The submodules recomputed in the backward (Megatron-Core recompute_modules, a subset of RECOMPUTE_MODULES);
    # None = Megatron-Core's default ("core_attn",). An empty tuple recomputes nothing (a recipe's
    # recompute_modules=[]).
    recompute_modules: tuple[str, ...] | None = None
    # --- the pipeline's point-to-point overlap (Megatron-Core overlap_p2p_comm) ---
    # The interleaved schedule posts its activation / gradient sends and receives asynchronously and waits for them
    # only when the data is needed, so in the steady 1F1B phase they run under the other chunk's compute; warm-up and
    # cool-down stay exposed (NeMo / Megatron-Bridge "Pipeline-parallel Communication Overlap"). None = the framework's
    # default: on for Megatron-Core's interleaved schedule (Megatron-LM's --no-overlap-p2p-communication turns it off;
    # NeMo / Megatron-Bridge enable it with pp > 1 and vpp > 1), off otherwise (`pp_comm_overlap`).
    overlap_p2p_comm: bool | None = None

    @property
    def pp_comm_overlap(self) -> bool:
        """Whether the pipeline's point-to-point traffic overlaps compute in the steady phase: `overlap_p2p_comm`, or
        its default (Megatron-Core's interleaved schedule with pp > 1)."""
        if self.overlap_p2p_comm is not None:
            return bool(self.overlap_p2p_comm)
        return pp_overlap_default(self.framework, self.schedule, self.pp)

    @property
    def selective_modules(self) -> tuple[str, ...]:
        """The modules recomputed, sorted in RECOMPUTE_MODULES order: () unless recompute is 'selective', where an
        unset recompute_modules is Megatron-Core's default ("core_attn",)."""
        if self.recompute != "selective":
            return ()
        mods = DEFAULT_RECOMPUTE_MODULES if self.recompute_modules is None else self.recompute_modules
        return tuple(m for m in RECOMPUTE_MODULES if m in mods)

    def recomputed_modules(self, model: ModelSpec) -> tuple[str, ...]:
        """The modules this layout's selective recomputation really re-runs on `model` (`recomputed_modules`)."""
        return recomputed_modules(model, self.framework, self.selective_modules)

    def _validate_recompute_modules(self, model: ModelSpec | None) -> None:
        """recompute_modules: known names (Megatron-Core's choices), only with recompute 'selective', and only
        modules the model has (moe_act / moe / shared_experts need MoE layers, shared_experts shared experts,
        mla_up_proj multi-head latent attention, mlp a dense-MLP layer)."""
        mods = self.recompute_modules
        if mods is None:
            return
        if not isinstance(mods, tuple) or not all(isinstance(m, str) for m in mods):
            raise InfeasibleConfig("recompute_modules", f"must be a tuple of module names, got {mods!r}.",
                                   f"give a comma-separated subset of {','.join(RECOMPUTE_MODULES)}.")
        bad = [m for m in mods if m not in RECOMPUTE_MODULES]
        if bad:
            raise InfeasibleConfig("recompute_modules", f"unknown module(s) {', '.join(map(repr, bad))}.",
                                   f"use a subset of {','.join(RECOMPUTE_MODULES)} (Megatron-Core's "
                                   "recompute_modules choices).")
        if len(set(mods)) != len(mods):
            raise InfeasibleConfig("recompute_modules", f"lists a module twice: {','.join(mods)}.",
                                   "give each module once.")
        if self.framework != "megatron":
            raise InfeasibleConfig("recompute_modules", f"recompute_modules is Megatron-Core's; framework "
                                                        f"'{self.framework}' recomputes selectively only the core "
                                                        "attention.",
                                   "leave recompute_modules empty, or use framework megatron.")
        if self.recompute != "selective":
            raise InfeasibleConfig("recompute_modules", f"recompute_modules ({','.join(mods) or 'empty'}) applies "
                                                        f"to selective recomputation only, but recompute is "
                                                        f"'{self.recompute}'.",
                                   "set recompute selective, or leave recompute_modules empty.")
        if model is None:
            return
        why = {}
        if not model.is_moe:
            for m in ("moe_act", "moe", "shared_experts"):
                why[m] = "the model is dense (num_experts 0): it has no MoE layer"
        elif not model.shared_experts:
            why["shared_experts"] = "the model has no shared experts (shared_experts 0)"
        if not model.is_mla:
            why["mla_up_proj"] = "the model has no multi-head latent attention (attention_kind mla)"
        if model.is_moe and not model.has_dense_layers:
            why["mlp"] = ("every layer of the model is a MoE layer (no dense MLP to recompute; Megatron-Core's "
                          "'mlp' is the dense MLP submodule)")
        if model.separate_norms(moe_layer=model.is_moe) == 0:
            why["layernorm"] = ("both of its norms are fused into the next linear layer (Megatron-Core's Transformer "
                                "Engine spec: TELayerNormColumnParallelLinear), which 'layernorm' recomputation "
                                "skips; only MLA's input norm and a MoE layer's pre-MLP norm are modules of their own")
        for m in mods:
            if m in why:
                raise InfeasibleConfig("recompute_modules", f"'{m}' does not apply: {why[m]}.",
                                       f"leave '{m}' out of recompute_modules.")

    @property
    def expert_tp(self) -> int:
        """The expert tensor-parallel degree in use: `etp`, or the framework's default where it is None."""
        if self.etp is not None:
            return self.etp
        return self.tp if get_framework(self.framework).expert_tp_follows_tp else 1

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element in the gradient buffers and the data-parallel reduction."""
        return grad_comm_bytes(self.precision, self.grad_reduce_in_fp32)

    @property
    def num_micro_batches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def seq_per_rank(self) -> int:
        """Tokens of one micro-batch's sequence on one context-parallel rank (seq_len / cp)."""
        return self.seq_len // self.cp

    def _validate_cp(self) -> None:
        """Context parallelism: the degrees multiply to num_gpus, cp divides seq_len, and each rank's
        seq_len / cp tokens split into Megatron's two load-balancing chunks per rank (a multiple of 2*cp)."""
        prod = self.tp * self.pp * self.cp * self.dp
        if prod != self.num_gpus:
            rest = self.tp * self.pp * self.cp
            raise InfeasibleConfig(
                "num_gpus", f"tp*pp*cp*dp = {self.tp}*{self.pp}*{self.cp}*{self.dp} = {prod} "
                            f"but num_gpus = {self.num_gpus}.",
                f"set dp = {self.num_gpus // rest} or change tp/pp/cp so the product is {self.num_gpus}."
                if self.num_gpus % rest == 0 else "choose tp, pp and cp whose product divides num_gpus.")
        if self.seq_len % self.cp:
            raise InfeasibleConfig(
                "seq_len", f"context parallelism cp = {self.cp} does not divide seq_len {self.seq_len}.",
                f"use a seq_len that is a multiple of 2*cp*cp = {2 * self.cp * self.cp}, or a cp dividing it.")
        if (self.seq_len // self.cp) % (2 * self.cp):
            raise InfeasibleConfig(
                "cp", f"the sequence per CP rank, seq_len / cp = {self.seq_len // self.cp}, is not a multiple of "
                      f"2*cp = {2 * self.cp} (Megatron's causal load balancing splits it into 2*cp chunks).",
                f"use a seq_len that is a multiple of 2*cp*cp = {2 * self.cp * self.cp}, or a smaller cp.")

    # --- zero-bubble and bidirectional pipeline schedules ---
    def _validate_zb_schedule(self) -> None:
        """The layout rules of zb-h1 / zb-v / dualpipe / dualpipe-v (the requirements of their reference code:
        DualPipe's step() asserts an even number of ranks and an even number of micro-batches >= 2 x ranks,
        DualPipeV's micro-batches >= 2 x ranks; the V schedules hold exactly 2 chunks per rank)."""
        s, m = self.schedule, self.num_micro_batches
        if self.pp < 2:
            raise InfeasibleConfig("schedule", f"the {s} schedule needs pp >= 2 pipeline stages.",
                                   "raise pp, or use --schedule 1f1b.")
        want_vpp = 2 if s in V_SCHEDULES else 1
        if self.vpp != want_vpp:
            raise InfeasibleConfig(
                "vpp", f"the {s} schedule runs {want_vpp} model chunk{'s' if want_vpp > 1 else ''} per GPU, "
                       f"got vpp = {self.vpp}.", f"set --vpp {want_vpp} (or leave it out).")
        if s == "dualpipe" and self.pp % 2:
            raise InfeasibleConfig("pp", f"DualPipe needs an even number of pipeline stages, got pp = {self.pp}.",
                                   f"use pp = {self.pp + 1} or {self.pp - 1}, or --schedule dualpipe-v.")
        if s in ("dualpipe", "dualpipe-v") and m < 2 * self.pp:
            raise InfeasibleConfig(
                "global_batch", f"{s} needs at least 2 x pp = {2 * self.pp} micro-batches, got {m}.",
                f"raise global_batch to at least {2 * self.pp * self.micro_batch * self.dp} "
                f"(or lower micro_batch).")
        if s == "dualpipe" and m % 2:
            raise InfeasibleConfig(
                "global_batch", f"DualPipe feeds half the micro-batches from each end: it needs an even number, "
                                f"got {m}.", f"use a global batch of {(m + 1) * self.micro_batch * self.dp}.")
        if s == "zb-v" and m < 2 * self.pp - 1:
            # the ZB-V order fills its V with 2pp-1 micro-batches (PyTorch's ScheduleZBVZeroBubble pads to that many)
            raise InfeasibleConfig(
                "global_batch", f"zb-v needs at least 2 x pp - 1 = {2 * self.pp - 1} micro-batches, got {m}.",
                f"raise global_batch to at least {(2 * self.pp - 1) * self.micro_batch * self.dp} (or lower "
                "micro_batch).")

    def _validate_ep(self, model: ModelSpec) -> None:
        """Expert parallelism: only for MoE models, ep divides num_experts and the tp * cp * dp ranks of a stage,
        and (as Megatron-Core requires) sequence parallelism with tp > 1 in a MoE model."""
        if not model.is_moe:
            if self.ep > 1:
                raise InfeasibleConfig("ep", f"ep = {self.ep} but the model is dense (num_experts 0).",
                                       "set ep = 1, or give the model's num_experts and top_k.")
            return
        if model.num_experts % self.ep:
            raise InfeasibleConfig("ep", f"ep {self.ep} does not divide num_experts {model.num_experts}.",
                                   f"use an ep that divides {model.num_experts} (each rank holds num_experts / ep "
                                   "experts).")
        ranks = self.tp * self.cp * self.dp
        if ranks % self.ep:
            raise InfeasibleConfig("ep", f"ep {self.ep} does not divide the tp x cp x dp = {self.tp} x {self.cp} x "
                                         f"{self.dp} = {ranks} ranks of a pipeline stage (Megatron-Core folds the "
                                         "expert-parallel group into them).",
                                   f"use an ep dividing {ranks}, or raise dp so that tp x cp x dp is a multiple of "
                                   f"{self.ep}.")
        if self.ep > 1 and self.zero_stage >= 2:
            raise InfeasibleConfig("zero_stage", f"expert parallelism (ep = {self.ep}) with ZeRO-{self.zero_stage} "
                                                 "is not modelled (Megatron-Core shards MoE optimizer states with its "
                                                 "distributed optimizer, ZeRO-1).",
                                   "use zero_stage 1 (or 0) with ep > 1, or ep = 1.")
        if self.tp > 1 and not self.sequence_parallel:
            raise InfeasibleConfig("sequence_parallel", "a MoE model with tp > 1 needs sequence parallelism "
                                                        "(Megatron-Core requires it: each tensor-parallel rank routes "
                                                        "its own share of the tokens).",
                                   "turn sequence_parallel on, or use tp = 1.")

    def _validate_cp_comm(self, model: ModelSpec | None) -> None:
        """All-to-all context parallelism (Megatron-Core cp_comm_type a2a / a2a+p2p): the kind is known, the
        all-to-all group size divides cp, and (with the model) the heads per tensor-parallel rank split over it.
        Transformer Engine's all-to-all CP (AttnFuncWithCPAndQKVOA2A) asserts that the number of query and of
        key/value heads of a rank are both divisible by the all-to-all size: GQA with fewer kv heads per rank than
        the group is refused there, and here (no KV replication is done)."""
        if self.cp_comm not in CP_COMMS:
            raise InfeasibleConfig("cp_comm", f"unknown context-parallel communication '{self.cp_comm}'.",
                                   f"use one of {', '.join(CP_COMMS)}.")
        if self.cp_a2a_size is not None:
            if self.cp_comm != "a2a+p2p":
                raise InfeasibleConfig("cp_a2a_size", f"cp_a2a_size {self.cp_a2a_size} is only used with cp_comm "
                                                      f"a2a+p2p, not '{self.cp_comm}'.",
                                       "leave cp_a2a_size empty, or set cp_comm a2a+p2p.")
            if not isinstance(self.cp_a2a_size, int) or self.cp_a2a_size <= 0 or self.cp % self.cp_a2a_size:
                raise InfeasibleConfig("cp_a2a_size", f"the all-to-all group size {self.cp_a2a_size!r} does not "
                                                      f"divide cp = {self.cp}.",
                                       f"use a divisor of {self.cp} (e.g. the cp ranks of one node), or leave it "
                                       "empty.")
        if self.cp_comm != "p2p" and self.cp == 1:
            raise InfeasibleConfig("cp_comm", f"cp_comm '{self.cp_comm}' needs context parallelism (cp > 1).",
                                   "set cp > 1, or leave cp_comm at p2p.")
        if model is None or self.cp_comm == "p2p":
            return
        u = self.cp if self.cp_comm == "a2a" else (self.cp_a2a_size or 1)
        q_r, kv_r = model.num_heads // self.tp, max(model.kv_heads // self.tp, 1)
        for name, n in (("heads", q_r), ("kv_heads", kv_r)):
            if n % u:
                raise InfeasibleConfig(
                    "cp_a2a_size" if self.cp_comm == "a2a+p2p" else "cp_comm",
                    f"all-to-all context parallelism splits the {name} of a tensor-parallel rank ({n}) over "
                    f"{u} ranks, which does not divide them (Transformer Engine asserts it; it does not "
                    "replicate key/value heads).",
                    "use cp_comm p2p, a2a+p2p with a smaller cp_a2a_size dividing both head counts per rank, or "
                    "a smaller cp / tp.")

    def _validate_offload(self, model: ModelSpec | None) -> None:
        """Activation offloading: Megatron-Core's TransformerConfig checks (0 <= cpu_offloading_num_layers <
        num_layers; no pipeline parallelism; no activation recomputation)."""
        n = self.offload_activations
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise InfeasibleConfig("offload_activations", f"must be a whole number of layers >= 0, got {n!r}.",
                                   "give the layers per pipeline stage whose activations go to host memory, or 0.")
        check_bound("offload_activations", n)
        if n == 0:
            return
        if self.pp > 1:
            raise InfeasibleConfig("offload_activations", f"activation offloading with pipeline parallelism "
                                                          f"(pp = {self.pp}) is not supported by Megatron-Core "
                                                          "('no support for Pipeline parallelism with CPU "
                                                          "offloading').",
                                   "set pp = 1, or offload_activations 0.")
        if self.recompute != "none":
            raise InfeasibleConfig("offload_activations", f"activation offloading with recompute "
                                                          f"'{self.recompute}' is refused by Megatron-Core ('CPU "
                                                          "offloading does not work when activation recomputation "
                                                          "is enabled').",
                                   "set recompute none, or offload_activations 0.")
        if model is not None and n >= model.num_layers:
            raise InfeasibleConfig("offload_activations", f"{n} offloaded layers of a stage of {model.num_layers}: "
                                                          "Megatron-Core offloads fewer layers than the stage holds "
                                                          "(the last layer's activations are used at once).",
                                   f"use at most {model.num_layers - 1}.")

    @property
    def expert_dp(self) -> int:
        """Ranks each expert's weights are replicated over (tp * cp * dp / (ep * etp)): the expert-data-parallel
        group."""
        return self.tp * self.cp * self.dp // (self.ep * self.expert_tp)

    def _validate_moe_etp_overlap(self, model: ModelSpec) -> None:
        """Expert tensor parallelism and the dispatch / combine overlap: etp divides each expert's width and, with
        ep, the tp x cp x dp ranks (MoE parallel folding); the overlap needs ep > 1 and Megatron-Core's combined
        1F1B schedule (pp = 1, or interleaved), and no full recomputation."""
        etp = self.etp
        if etp is not None:
            if not isinstance(etp, int) or isinstance(etp, bool) or etp <= 0:
                raise InfeasibleConfig("etp", f"must be a positive integer, got {etp!r}.",
                                       "leave etp empty for the framework's default, or give e.g. 1 or the tp.")
            check_bound("etp", etp)
            if not model.is_moe and etp > 1:
                raise InfeasibleConfig("etp", f"etp = {etp} but the model is dense (num_experts 0).",
                                       "leave etp empty (or 1), or give the model's num_experts and top_k.")
        if model.is_moe:
            e = self.expert_tp
            said = "etp" if etp is not None else f"etp (unset: the {self.framework} default, tp = {e})"
            if model.expert_ffn % e:
                raise InfeasibleConfig("etp", f"{said} {e} does not divide the experts' width moe_ffn_hidden "
                                              f"{model.expert_ffn} (fc1 / fc2 are split over the etp ranks).",
                                       f"use an etp dividing {model.expert_ffn}, e.g. 1.")
            ranks = self.tp * self.cp * self.dp
            if ranks % (e * self.ep):
                raise InfeasibleConfig("etp", f"{said} {e} x ep {self.ep} = {e * self.ep} does not divide the tp x "
                                              f"cp x dp = {ranks} ranks of a pipeline stage (MoE parallel folding: "
                                              "etp x ep x expert-dp = tp x cp x dp).",
                                       f"use an etp and ep whose product divides {ranks} (etp 1 keeps experts "
                                       "whole), or raise dp.")
            if e > 1 and self.zero_stage >= 2:
                raise InfeasibleConfig("etp", f"expert tensor parallelism ({said} {e}) with ZeRO-{self.zero_stage} "
                                              "is not modelled (Megatron-Core shards MoE optimizer states with its "
                                              "distributed optimizer, ZeRO-1).",
                                       "set etp 1, or use zero_stage 1 (or 0).")
        check_moe_dispatcher(model, self.moe_dispatcher, self.moe_overlap, self.expert_tp)
        if self.moe_overlap:
            if not model.is_moe or self.ep <= 1:
                raise InfeasibleConfig("moe_overlap", "the dispatch / combine overlap hides the expert-parallel "
                                                      f"all-to-all, which needs a MoE model with ep > 1 (ep = "
                                                      f"{self.ep}).",
                                       "set ep > 1, or turn moe_overlap off.")
            if self.pp > 1 and self.schedule != "interleaved":
                raise InfeasibleConfig("moe_overlap", "with pipeline parallelism Megatron-Core runs the overlap in "
                                                      "its interleaved schedule only (combined 1F1B).",
                                       "use --schedule interleaved with vpp >= 2, or pp = 1, or moe_overlap off.")
            if self.recompute == "full":
                raise InfeasibleConfig("moe_overlap", "the dispatch / combine overlap does not run with full "
                                                      "recomputation (Megatron-Core supports selective only).",
                                       "use recompute none or selective, or turn moe_overlap off.")

    def validate(self, model: ModelSpec | None = None) -> None:
        for name in ("num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch", "seq_len", "vpp", "cp", "ep"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise InfeasibleConfig(name, f"must be a positive integer, got {v!r}.")
            check_bound(name, v)
        check_tokens_per_micro_batch(self.micro_batch, self.seq_len)
        if self.cp == 1 and self.tp * self.pp * self.dp != self.num_gpus:
            raise InfeasibleConfig(
                "num_gpus",
                f"tp*pp*dp = {self.tp}*{self.pp}*{self.dp} = {self.tp * self.pp * self.dp} "
                f"but num_gpus = {self.num_gpus}.",
                f"set dp = {self.num_gpus // (self.tp * self.pp)} or change tp/pp so the product is {self.num_gpus}."
                if self.num_gpus % (self.tp * self.pp) == 0 else
                "choose tp and pp whose product divides num_gpus.")
        if self.cp > 1:
            self._validate_cp()
        self._validate_cp_comm(model)
        self._validate_offload(model)
        self._validate_recompute_modules(model)
        if self.global_batch % (self.micro_batch * self.dp):
            raise InfeasibleConfig(
                "global_batch",
                f"global batch {self.global_batch} is not a multiple of micro_batch*dp = {self.micro_batch * self.dp}.",
                f"use a multiple of {self.micro_batch * self.dp}, "
                f"e.g. {max(1, round(self.global_batch / (self.micro_batch * self.dp))) * self.micro_batch * self.dp}.")
        if self.schedule not in SCHEDULES:
            raise InfeasibleConfig("schedule", f"unknown schedule '{self.schedule}'.",
                                   f"use one of {', '.join(SCHEDULES)}.")
        if self.recompute not in RECOMPUTES:
            raise InfeasibleConfig("recompute", f"unknown recompute '{self.recompute}'.",
                                   f"use one of {', '.join(RECOMPUTES)}.")
        if self.precision not in PRECISIONS:
            raise InfeasibleConfig("precision", f"unknown precision '{self.precision}'.",
                                   f"use one of {', '.join(PRECISIONS)}.")
        if self.zero_stage not in (0, 1, 2, 3):
            raise InfeasibleConfig("zero_stage", f"must be 0, 1, 2 or 3, got {self.zero_stage!r}.")
        if self.schedule == "interleaved":
            if self.pp < 2:
                raise InfeasibleConfig("schedule", "the interleaved schedule needs pp >= 2.", "use 1f1b or raise pp.")
            if self.vpp < 2:
                raise InfeasibleConfig("vpp", "the interleaved schedule needs vpp >= 2 virtual stages per GPU.",
                                       "set --vpp 2 (or more), or use --schedule 1f1b.")
            if self.num_micro_batches % self.pp:
                raise InfeasibleConfig(
                    "global_batch",
                    f"the interleaved schedule needs the number of micro-batches ({self.num_micro_batches}) "
                    f"to be a multiple of pp ({self.pp}).",
                    "change global_batch or micro_batch accordingly.")
        elif self.schedule in ZB_SCHEDULES:
            self._validate_zb_schedule()
        elif self.vpp != 1:
            raise InfeasibleConfig("vpp", f"vpp = {self.vpp} needs --schedule interleaved.",
                                   "set vpp to 1 or use the interleaved schedule.")
        if self.framework not in FRAMEWORKS:
            raise InfeasibleConfig("framework", f"unknown framework '{self.framework}'.",
                                   f"use one of {', '.join(FRAMEWORKS)}.")
        fw = get_framework(self.framework)
        if self.zero_stage not in fw.zero_stages:
            raise InfeasibleConfig("zero_stage", f"{fw.description} has no ZeRO stage {self.zero_stage}.",
                                   f"use one of {', '.join(map(str, fw.zero_stages))}, or another framework.")
        if self.zero_stage >= 2 and self.pp > 1 and fw.zero_needs_no_pp:
            raise InfeasibleConfig("zero_stage", f"{fw.description} cannot combine ZeRO-{self.zero_stage} with "
                                                 f"pipeline parallelism (pp = {self.pp}).",
                                   "use zero_stage 0 or 1 with pipeline parallelism, or pp = 1.")
        if self.overlap_p2p_comm and not pp_overlap_default(fw.name, self.schedule, self.pp):   # where it runs
            raise InfeasibleConfig("overlap_p2p_comm", "the pipeline's point-to-point overlap runs in Megatron-Core's "
                                                       "interleaved schedule only (overlap_p2p_comm), with pp > 1 "
                                                       f"(here framework {fw.name}, schedule {self.schedule}, pp "
                                                       f"{self.pp}).",
                                   "use framework megatron with --schedule interleaved and vpp >= 2, or leave "
                                   "overlap_p2p_comm unset.")
        if self.overlap_tp_comm and (self.tp == 1 or not self.sequence_parallel):
            raise InfeasibleConfig("overlap_tp_comm", "tensor-parallel communication overlap needs tp > 1 with "
                                                      "sequence parallelism (it overlaps the SP all-gathers and "
                                                      "reduce-scatters with the GEMMs).",
                                   "set tp >= 2 and sequence_parallel on, or turn overlap_tp_comm off.")
        if self.sequence_parallel and self.tp == 1:
            raise InfeasibleConfig("sequence_parallel", "sequence parallelism needs tp > 1.",
                                   "set tp >= 2 or turn it off.")
        if self.fp8_param_gather and self.precision not in FP8_PARAM_PRECISIONS:
            raise InfeasibleConfig("fp8_param_gather", f"FP8 primary weights need precision fp8 or mxfp8, not "
                                                       f"{self.precision}.",
                                   "set precision fp8 or mxfp8, or turn fp8_param_gather off.")
        if self.grad_reduce_in_fp32 is False and self.precision == "fp32":
            raise InfeasibleConfig("grad_reduce_in_fp32", "fp32 training has fp32 gradients; they cannot be reduced "
                                                          "in a 16-bit precision.",
                                   "leave grad_reduce_in_fp32 unset (or true) with precision fp32.")
        if model is None:
            check_moe_dispatcher(None, self.moe_dispatcher)
        check_cuda_graphs(model, self.cuda_graphs, self.framework)
        if model is not None:
            model.validate()
            if model.num_heads % self.tp:
                raise InfeasibleConfig("tp", f"heads {model.num_heads} is not divisible by tp {self.tp}.",
                                       f"use a tp that divides {model.num_heads}.")
            if model.kv_heads % self.tp and self.tp % model.kv_heads:
                raise InfeasibleConfig("tp", f"kv_heads {model.kv_heads} and tp {self.tp} do not divide one another.",
                                       "use a tp that divides kv_heads or a multiple of it.")
            if model.ffn % self.tp:
                raise InfeasibleConfig("tp", f"ffn_hidden {model.ffn} is not divisible by tp {self.tp}.",
                                       f"use a tp that divides {model.ffn}.")
            if self.cp > 1 and model.sliding_window is not None:
                raise InfeasibleConfig("cp", "context parallelism with sliding-window attention is not modelled (the "
                                             "ring's blocks outside the window would be skipped).",
                                       "set cp = 1, or leave sliding_window empty.")
            if self.cp > 1 and model.attention_impl not in FLASH_IMPLS:
                raise InfeasibleConfig("cp", f"context parallelism needs a fused attention kernel; this model uses "
                                             f"'{model.attention_impl}' attention.",
                                       "set cp = 1 or use flash attention (Megatron-Core runs CP inside "
                                       "Transformer Engine's fused attention).")
            self._validate_ep(model)
            self._validate_moe_etp_overlap(model)
            if self.sequence_parallel and (self.seq_len // self.cp) % self.tp:
                raise InfeasibleConfig("seq_len", f"sequence parallelism needs seq_len divisible by tp ({self.tp}).")
            chunks = self.pp * self.vpp
            if model.num_layers < chunks:
                raise InfeasibleConfig(
                    "pp", f"{model.num_layers} layers cannot fill pp*vpp = {chunks} pipeline chunks.",
                    "lower pp or vpp.")
            if self.stage_layers is not None:
                if len(self.stage_layers) != chunks or any(int(n) < 1 for n in self.stage_layers):
                    raise InfeasibleConfig("stage_layers",
                                           f"needs {chunks} positive entries (pp*vpp), got {list(self.stage_layers)}.")
                if sum(self.stage_layers) != model.num_layers:
                    raise InfeasibleConfig("stage_layers", f"sums to {sum(self.stage_layers)} but the model has "
                                                           f"{model.num_layers} layers.")
            elif self.schedule in V_SCHEDULES and model.num_layers % chunks:
                raise InfeasibleConfig(
                    "pp", f"{self.schedule} runs 2 model chunks per GPU: {model.num_layers} layers do not split "
                          f"evenly into 2 x pp = {chunks} chunks.",
                    f"choose pp so that {model.num_layers} / (2 x pp) is an integer, or give stage_layers "
                    f"({chunks} entries).")
            elif (self.schedule == "interleaved" and model.num_layers % chunks
                  and interleaved_split(model.num_layers, chunks) is None):
                raise InfeasibleConfig(
                    "vpp", f"{model.num_layers} layers do not split evenly into pp*vpp = {chunks} chunks (nor "
                           f"do layers + 2, Megatron-Core's split that counts the embedding and the loss as "
                           "layers).",
                    "choose vpp so that layers / (pp*vpp) or (layers + 2) / (pp*vpp) is an integer, or give "
                    "stage_layers.")


# The Mixture-of-Experts fields of ModelSpec (= CLI flags without dashes = batch columns), and their defaults:
# a dense model
MOE_FIELDS = ("num_experts", "top_k", "moe_ffn_hidden", "shared_experts", "shared_ffn_hidden", "dense_layers",
              "capacity_factor", "moe_imbalance")
MOE_DENSE_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(ModelSpec) if f.name in MOE_FIELDS}


def _flag(name: str) -> str:
    return {"num_layers": "layers", "hidden_size": "hidden", "num_heads": "heads",
            "num_kv_heads": "kv_heads", "ffn_hidden_size": "ffn_hidden", "vocab_size": "vocab",
            "head_dim": "head_dim"}.get(name, name)


def with_changes(obj: Any, **changes: Any) -> Any:
    """dataclasses.replace, re-exported for callers that build variants."""
    return replace(obj, **changes)


def as_dict(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}

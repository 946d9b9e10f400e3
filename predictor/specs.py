"""Typed configuration: the model, the parallel layout, and the one domain error.

Every field carries its unit in its name where it has one. Validation raises
`InfeasibleConfig`, which names the offending field and how to fix it; the CLI
and the dashboard show it as a warning, never as a traceback.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from . import params
from .bounds import check_bound, check_tokens_per_micro_batch
from .params import padded_vocab

ARCHS = ("gpt", "llama")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTES = ("none", "selective", "full")
PRECISIONS = ("fp16", "bf16", "fp32", "fp8")
# fp8: Transformer-Engine-style FP8 training (predictor.fp8): FP8 GEMMs in the transformer layers' linear layers,
# BF16 master weights and BF16 everything else, so a tensor outside those GEMMs is 2 bytes as in bf16.
ATTENTION_IMPLS = ("flash", "triton", "unfused")
# FlashAttention kernels (no s^2 score matrix kept): FlashAttention-2/3 CUDA ("flash") or the Triton implementation
# ("triton", as MPT / llm-foundry ran it); "unfused" is Megatron's QK^T + fused scale-mask-softmax + AV.
FLASH_IMPLS = ("flash", "triton")
FRAMEWORKS = ("megatron", "megatron-deepspeed", "deepspeed", "fsdp", "ddp")  # see predictor.frameworks
DEFAULT_FRAMEWORK = "megatron"
BYTES_PER_ELEMENT = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 2}
# Gradient element size held between backward and the optimizer, and reduced over data parallel:
# Megatron-LM forces fp32 gradient accumulation and reduction for bf16, torchtitan / llm-foundry
# FSDP reduce in fp32 by default; fp16 (DeepSpeed, Megatron fp16) keeps fp16 gradients.
GRAD_BYTES = {"bf16": 4, "fp16": 2, "fp32": 4, "fp8": 4}


def grad_comm_bytes(precision: str) -> int:
    """Bytes per gradient element in data-parallel reductions (see GRAD_BYTES)."""
    return GRAD_BYTES.get(precision, 4)


class InfeasibleConfig(ValueError):
    """A configuration that cannot run, with the field at fault and the fix.

    `field` names the input (as the CLI flag / batch column spells it without
    dashes), `fix` says what would make it valid.
    """

    def __init__(self, field_name: str, problem: str, fix: str = ""):
        self.field = field_name
        self.problem = problem
        self.fix = fix
        msg = f"{field_name}: {problem}"
        if fix:
            msg += f" Fix: {fix}"
        super().__init__(msg)


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

    @property
    def kv_heads(self) -> int:
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
        """Parameters of one transformer layer (weights and biases/norm gains); see predictor.params."""
        return params.layer_params(self)

    def embedding_params(self, tp: int = 1) -> int:
        return padded_vocab(self.vocab_size, tp) * self.hidden_size

    def total_params(self) -> int:
        return params.total_params(self)

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
        elif self.hidden_size % self.num_heads:
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


@dataclass(frozen=True)
class Layout:
    """How one training step is laid out over the GPUs.

    num_gpus = tp * pp * cp * dp.
    `vpp` is the number of virtual pipeline stages per GPU (interleaved schedule).
    `cp` is the context-parallel degree (Megatron-Core style, `predictor.decompose`): the sequence of every
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
    # The training framework (predictor.frameworks): when the data-parallel traffic runs and whether it
    # overlaps compute; None in the overlap switches = the framework's default.
    framework: str = DEFAULT_FRAMEWORK
    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool | None = None
    cp: int = 1   # context-parallel degree (ranks one micro-batch's sequence is split over); 1 = none

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

    def validate(self, model: ModelSpec | None = None) -> None:
        for name in ("num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch", "seq_len", "vpp", "cp"):
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
        elif self.vpp != 1:
            raise InfeasibleConfig("vpp", f"vpp = {self.vpp} needs --schedule interleaved.",
                                   "set vpp to 1 or use the interleaved schedule.")
        if self.framework not in FRAMEWORKS:
            raise InfeasibleConfig("framework", f"unknown framework '{self.framework}'.",
                                   f"use one of {', '.join(FRAMEWORKS)}.")
        from .frameworks import get_framework
        fw = get_framework(self.framework)
        if self.zero_stage not in fw.zero_stages:
            raise InfeasibleConfig("zero_stage", f"{fw.description} has no ZeRO stage {self.zero_stage}.",
                                   f"use one of {', '.join(map(str, fw.zero_stages))}, or another framework.")
        if self.zero_stage >= 2 and self.pp > 1 and fw.zero_needs_no_pp:
            raise InfeasibleConfig("zero_stage", f"{fw.description} cannot combine ZeRO-{self.zero_stage} with "
                                                 f"pipeline parallelism (pp = {self.pp}).",
                                   "use zero_stage 0 or 1 with pipeline parallelism, or pp = 1.")
        if self.sequence_parallel and self.tp == 1:
            raise InfeasibleConfig("sequence_parallel", "sequence parallelism needs tp > 1.",
                                   "set tp >= 2 or turn it off.")
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
            if self.cp > 1 and model.attention_impl not in FLASH_IMPLS:
                raise InfeasibleConfig("cp", f"context parallelism needs a fused attention kernel; this model uses "
                                             f"'{model.attention_impl}' attention.",
                                       "set cp = 1 or use flash attention (Megatron-Core runs CP inside "
                                       "Transformer Engine's fused attention).")
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
            elif self.schedule == "interleaved" and model.num_layers % chunks:
                raise InfeasibleConfig(
                    "vpp", f"{model.num_layers} layers do not split evenly into pp*vpp = {chunks} chunks.",
                    "choose vpp so that layers / (pp*vpp) is an integer.")


def _flag(name: str) -> str:
    return {"num_layers": "layers", "hidden_size": "hidden", "num_heads": "heads",
            "num_kv_heads": "kv_heads", "ffn_hidden_size": "ffn_hidden", "vocab_size": "vocab",
            "head_dim": "head_dim"}.get(name, name)


def with_changes(obj: Any, **changes: Any) -> Any:
    """dataclasses.replace, re-exported for callers that build variants."""
    return replace(obj, **changes)


def as_dict(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}

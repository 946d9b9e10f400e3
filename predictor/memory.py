"""Per-GPU memory of one training step: does a layout fit, and if not, why.

For every pipeline stage the peak is the sum of

  weights      parameters held in the compute precision
  gradients    gradient buffers (`grad_bytes` per element: fp32 main grads for bf16 as Megatron does)
  optimizer    mixed-precision Adam: fp32 master copy + two fp32 moments (+ an fp32 copy of 16-bit
               gradients where the framework keeps one, Megatron fp16)
  activations  the tensors kept for backward (Korthikanti et al. 2022, "Reducing Activation
               Recomputation in Large Transformer Models", Table 2), times the micro-batches in
               flight on that stage, plus embedding inputs on the first and the output layer /
               fp32 logits on the last stage
  buffers      transient peaks: ZeRO-3 / FSDP gathered units, the bf16 logits before the fp32
               cast, one re-materialised layer under full recomputation, one unsharded gradient
               unit under ZeRO-2/3
  framework    a fixed allowance for the CUDA context, cuBLAS / Transformer-Engine workspaces and
               NCCL communicator buffers (`framework_gib`, default 1.5 GiB)

and a layout fits when the largest stage total stays under the device memory less an allocator
reserve (`allocator_reserve`, default 5 % of HBM for fragmentation and caching slack).

Bytes per parameter (weights + gradients + optimizer) with `d` data-parallel ranks, matching
Megatron-LM's distributed-optimizer table (docs/source/api-guide/dist_optimizer.md) and the
ZeRO paper (Rajbhandari et al. 2020, K = 12):

  precision / grads        zero 0   zero 1 (distributed optimizer)   zero 2          zero 3
  bf16, fp32 main grads    18       6 + 12/d                         2 + 16/d        18/d
  fp16, fp16 grads (+copy) 20       4 + 16/d                         2 + 18/d        20/d
  fp16, ZeRO paper         16       4 + 12/d                         2 + 14/d        16/d
  fp32                     16       8 + 8/d                          4 + 12/d        16/d

ZeRO stages as frameworks name them (the same convention as the step-time model in decompose.py):
  0  DDP / Megatron without the distributed optimizer
  1  Megatron distributed optimizer, DeepSpeed ZeRO-1: optimizer states sharded
  2  FSDP SHARD_GRAD_OP, DeepSpeed ZeRO-2: + gradients sharded (parameters whole during the step)
  3  FSDP FULL_SHARD, DeepSpeed ZeRO-3: + parameters sharded, `zero3_live_units` units gathered at a time

Activation accounting per transformer layer and micro-batch (s sequence, b micro-batch, h hidden,
a heads, t tensor parallel; 16-bit activations, 1-byte dropout masks), GPT with dropout:
  no parallelism                 s*b*h*(34 + 5*a*s/h)
  tensor parallel                s*b*h*(10 + 24/t + 5*a*s/(h*t))
  + sequence parallel            s*b*h/t*(34 + 5*a*s/h)
  selective recompute / flash    the 5*a*s/h term disappears (flash also stores a fp32 logsumexp)
  full recompute                 2*s*b*h (the layer input; /t with SP) + one layer rematerialised
The same terms are derived tensor by tensor for Llama-style layers (RMSNorm, GQA, SwiGLU, no dropout).

Micro-batches in flight on stage s of p (m micro-batches): 1F1B min(p - s, m); GPipe m; interleaved
with v chunks per GPU min(2(p-s-1) + (v-1)p + 1, m v) chunk activations (Narayanan et al. 2021;
stage 0 holds L(1 + (p-1)/(p v)) layers' worth, Korthikanti eq. 5).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .specs import BYTES_PER_ELEMENT, InfeasibleConfig, Layout, ModelSpec, padded_vocab

GIB = float(2 ** 30)

# Gradient element size held between backward and the optimizer, and reduced over data parallel:
# Megatron-LM forces fp32 gradient accumulation and reduction for bf16, torchtitan / llm-foundry
# FSDP reduce in fp32 by default; fp16 (DeepSpeed, Megatron fp16) keeps fp16 gradients.
GRAD_BYTES = {"bf16": 4, "fp16": 2, "fp32": 4}


def grad_comm_bytes(precision: str) -> int:
    """Bytes per gradient element in data-parallel reductions (see GRAD_BYTES)."""
    return GRAD_BYTES.get(precision, 4)


@dataclass(frozen=True)
class MemoryOptions:
    grad_bytes: int | None = None          # None: GRAD_BYTES[precision]
    master_weights: bool | None = None     # fp32 master copy; None: precision != fp32
    fp32_grad_copy: bool | None = None     # fp32 copy of 16-bit grads in the optimizer; None: grad_bytes < 4
    optimizer_bytes_per_param: int = 8     # Adam exp_avg + exp_avg_sq in fp32
    dropout: bool | None = None            # None: GPT layers have dropout (GPT-3 / Megatron), Llama none
    zero3_live_units: int = 2              # FSDP / ZeRO-3: units unsharded at once (current + prefetched)
    framework_gib: float = 1.5             # CUDA context ~0.5, workspaces ~0.25, NCCL buffers ~0.75 GiB
    allocator_reserve: float = 0.05        # share of HBM the caching allocator cannot hand out
    logits_fp32: bool = True               # vocab-parallel cross-entropy keeps fp32 logits (4*s*b*V/t)


@dataclass
class StageMemory:
    stage: int
    layers: int
    params: int                  # parameters on this GPU after TP (before ZeRO sharding)
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float
    framework_bytes: float
    in_flight: float             # micro-batches (interleaved: chunk activations) held at the peak

    @property
    def states_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return self.states_bytes + self.activations_bytes + self.buffers_bytes + self.framework_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["total_bytes"] = self.total_bytes
        d.update({k.replace("_bytes", "_gib"): v / GIB for k, v in list(d.items()) if k.endswith("_bytes")})
        return d


@dataclass
class MemoryReport:
    stages: list[StageMemory]
    capacity_bytes: float
    usable_bytes: float
    options: MemoryOptions = field(default_factory=MemoryOptions)

    @property
    def peak(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.total_bytes)

    @property
    def peak_bytes(self) -> float:
        return self.peak.total_bytes

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.usable_bytes

    @property
    def reason(self) -> str:
        """Why it does not fit ('' when it does): the stage, its total and the largest parts."""
        if self.fits:
            return ""
        return out_of_memory_reason(self.peak, self.usable_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"peak_gib": self.peak_gib, "peak_stage": self.peak.stage, "capacity_gib": self.capacity_bytes / GIB,
                "usable_gib": self.usable_bytes / GIB, "fits": self.fits, "reason": self.reason,
                "stages": [s.to_dict() for s in self.stages]}


def out_of_memory_reason(st: StageMemory, usable_bytes: float) -> str:
    parts = {"weights": st.weights_bytes, "gradients": st.grads_bytes, "optimizer": st.optimizer_bytes,
             "activations": st.activations_bytes, "buffers": st.buffers_bytes, "framework": st.framework_bytes}
    top = ", ".join(f"{k} {v / GIB:.1f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])[:3])
    return (f"out of memory: stage {st.stage} needs {st.total_bytes / GIB:.1f} GiB > "
            f"{usable_bytes / GIB:.1f} GiB usable ({top} GiB)")


# ------------------------------------------------------------------------------------------ states
def resolved(options: MemoryOptions, precision: str) -> tuple[int, bool, bool]:
    """(grad_bytes, master_weights, fp32_grad_copy) with the defaults filled in."""
    g = options.grad_bytes if options.grad_bytes is not None else GRAD_BYTES.get(precision, 4)
    master = options.master_weights if options.master_weights is not None else precision != "fp32"
    copy = options.fp32_grad_copy if options.fp32_grad_copy is not None else g < 4
    return g, master, copy


def bytes_per_param(precision: str, zero_stage: int, dp: int, options: MemoryOptions = MemoryOptions()
                    ) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per parameter on one GPU."""
    e = BYTES_PER_ELEMENT[precision]
    g, master, copy = resolved(options, precision)
    opt = options.optimizer_bytes_per_param + (4 if master else 0) + (4 if copy else 0)
    d = max(1, dp)
    w_b, g_b, o_b = float(e), float(g), float(opt)
    if zero_stage >= 1:
        o_b /= d
    if zero_stage >= 2:
        g_b /= d
    if zero_stage >= 3:
        w_b /= d
    return w_b, g_b, o_b


def layer_params_per_gpu(model: ModelSpec, tp: int) -> int:
    """Parameters of one layer on one GPU: matrices split by tp, norm gains replicated
    (the convention of decompose.py)."""
    h = model.hidden_size
    norm = 2 * h if model.arch == "llama" else 4 * h
    return (model.params_per_layer() - norm) // tp + norm


def edge_params(model: ModelSpec, tp: int, pp: int, first: bool, last: bool) -> int:
    """Embedding parameters on the first chunk, final norm + LM head on the last (decompose.py)."""
    h = model.hidden_size
    emb = padded_vocab(model.vocab_size, tp) * h // tp
    n = 0
    if first:
        n += emb
    if last:
        n += h if model.arch == "llama" else 2 * h
        if not model.tied_embeddings or pp > 1:
            n += emb
    return n


def chunk_params(model: ModelSpec, tp: int, pp: int, layers: int, first: bool, last: bool, seq_len: int) -> int:
    """Parameters of one pipeline chunk on one GPU (equals decompose's `params_per_gpu`)."""
    n = layers * layer_params_per_gpu(model, tp) + edge_params(model, tp, pp, first, last)
    if first and model.arch == "gpt":
        n += seq_len * model.hidden_size  # learned position embedding, as decompose counts it
    return n


# ------------------------------------------------------------------------------------- activations
def _dropout(model: ModelSpec, options: MemoryOptions) -> bool:
    return options.dropout if options.dropout is not None else model.arch == "gpt"


def activation_terms(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, precision: str = "bf16",
                     options: MemoryOptions = MemoryOptions()) -> dict[str, float]:
    """Bytes kept for backward by one layer and micro-batch, per GPU, split by how they shard:
    `replicated` (whole on every TP rank unless SP splits it), `sharded` (split over tp),
    `quadratic` (the s^2 attention probabilities of unfused attention, split over tp),
    `flash` (flash attention's fp32 logsumexp, split over tp), `input` (the layer input)."""
    s, b, h, t = seq_len, micro_batch, model.hidden_size, tp
    e = BYTES_PER_ELEMENT[precision]
    a, hd = model.num_heads, model.head_dim
    kv_r = max(model.kv_heads / t, 1.0)  # kv heads per rank (replicated when tp > kv_heads)
    ffn = model.ffn
    sbh = s * b * h
    drop = _dropout(model, options)
    mask = 1.0 if drop else 0.0
    # replicated: both norm inputs, the QKV input, the MLP input, the two residual dropout masks
    replicated = sbh * (2 * e + e + e) + sbh * 2 * mask
    # sharded: Q, K, V (GQA: kv heads per rank), attention output (out-proj input), MLP intermediates
    q = s * b * (a / t) * hd * e
    kv = 2 * s * b * kv_r * hd * e
    o = s * b * (a / t) * hd * e
    if model.arch == "llama":
        mlp = s * b * (ffn / t) * e * 3   # fc1 output (gate and up, 2*ffn) + SwiGLU output (fc2 input)
    else:
        mlp = s * b * (ffn / t) * e * 2   # GeLU input + GeLU output (fc2 input)
    sharded = q + kv + o + mlp
    if model.attention_impl == "flash":
        quadratic = 0.0
        flash = 4.0 * b * (a / t) * s
    else:
        # softmax output (e) [+ dropout mask (1) + dropout output (e)] per score
        quadratic = b * (a / t) * s * s * (e + (1 + e if drop else 0))
        flash = 0.0
    return {"replicated": replicated, "sharded": sharded, "quadratic": quadratic, "flash": flash,
            "input": sbh * e}


def activation_bytes_per_layer(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, sequence_parallel: bool,
                               recompute: str, precision: str = "bf16",
                               options: MemoryOptions = MemoryOptions()) -> float:
    """Bytes one layer keeps for backward per micro-batch on one GPU."""
    t = tp
    sp_div = t if sequence_parallel else 1
    T = activation_terms(model, seq_len, micro_batch, tp, precision, options)
    if recompute == "full":
        return T["input"] / sp_div
    stored = T["replicated"] / sp_div + T["sharded"] + T["flash"]
    if recompute == "none":
        stored += T["quadratic"]
    return stored


def full_layer_activation_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, sequence_parallel: bool,
                                precision: str = "bf16", options: MemoryOptions = MemoryOptions()) -> float:
    """One layer's activations without any recomputation (what full recomputation rematerialises)."""
    return activation_bytes_per_layer(model, seq_len, micro_batch, tp, sequence_parallel, "none", precision, options)


def korthikanti_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                                recompute: str = "none") -> float:
    """The published formulas (Korthikanti et al. 2022, Table 2), 16-bit activations, GPT layers."""
    if recompute == "full":
        return 2.0 * s * b * h / (t if sp else 1)
    quad = 0.0 if recompute == "selective" else 5.0 * a * s / h
    if t == 1:
        return s * b * h * (34.0 + quad)
    if sp:
        return s * b * h / t * (34.0 + quad)
    return s * b * h * (10.0 + 24.0 / t + quad / t)


def edge_activation_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, sequence_parallel: bool,
                          precision: str = "bf16", options: MemoryOptions = MemoryOptions()
                          ) -> tuple[float, float, float]:
    """(first stage per micro-batch in flight, last stage stored, last stage transient) bytes.
    First: int64 token ids (+ embedding dropout mask). Last: final norm input and output-layer
    input (2sbh each, /t with SP) and fp32 logits 4sbV/t (Korthikanti sec. 4.3); transient: the
    16-bit logits before the fp32 cast."""
    s, b, h, t = seq_len, micro_batch, model.hidden_size, tp
    e = BYTES_PER_ELEMENT[precision]
    sp_div = t if sequence_parallel else 1
    vp = padded_vocab(model.vocab_size, tp)
    first = 8.0 * s * b + (s * b * h / sp_div if _dropout(model, options) else 0.0)
    logits = s * b * vp / t
    last = 2.0 * s * b * h * e / sp_div + (4.0 if options.logits_fp32 else e) * logits
    transient = e * logits if options.logits_fp32 else 0.0
    return first, last, transient


# ------------------------------------------------------------------------------------ pipelines
def in_flight(schedule: str, pp: int, vpp: int, m: int, stage: int) -> int:
    """Micro-batches (interleaved: chunk activations) whose activations stage `stage` holds at its peak."""
    if pp == 1 or schedule == "gpipe":
        return m * (vpp if schedule == "interleaved" else 1) if pp > 1 else 1
    if schedule == "interleaved":
        return min(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, m * vpp)
    return min(pp - stage, m)


def stage_layer_counts(model: ModelSpec, layout: Layout) -> list[list[int]]:
    """Layers of each chunk grouped by physical stage: [[chunk layers on stage 0], ...]."""
    from .decompose import split_layers
    chunks = layout.pp * layout.vpp
    counts = list(layout.stage_layers) if layout.stage_layers else split_layers(model.num_layers, chunks)
    out: list[list[int]] = [[] for _ in range(layout.pp)]
    for i, n in enumerate(counts):
        out[i % layout.pp].append(int(n))
    return out


def estimate_memory(model: ModelSpec, layout: Layout, device: Any = None,
                    options: MemoryOptions = MemoryOptions(), hbm_gib: float | None = None) -> MemoryReport:
    """Per-stage peak memory of `layout`. `device`: a DeviceSpec or Platform (for its HBM size),
    or give `hbm_gib`; without either the capacity is reported as infinite."""
    layout.validate(model)
    if hbm_gib is None and device is not None:
        dev = getattr(device, "device", device)
        hbm_gib = float(dev.hbm_gib)
    capacity = (hbm_gib or float("inf")) * GIB
    usable = capacity * (1.0 - options.allocator_reserve)
    prec = layout.precision
    e = BYTES_PER_ELEMENT[prec]
    tp, pp, vpp = layout.tp, layout.pp, layout.vpp
    m = layout.num_micro_batches
    s_len, b = layout.seq_len, layout.micro_batch
    sp = layout.sequence_parallel
    w_pp, g_pp, o_pp = bytes_per_param(prec, layout.zero_stage, layout.dp, options)
    g_full, _, _ = resolved(options, prec)
    per_layer = activation_bytes_per_layer(model, s_len, b, tp, sp, layout.recompute, prec, options)
    full_layer = full_layer_activation_bytes(model, s_len, b, tp, sp, prec, options)
    first_mb, last_stored, last_transient = edge_activation_bytes(model, s_len, b, tp, sp, prec, options)
    lp = layer_params_per_gpu(model, tp)
    by_stage = stage_layer_counts(model, layout)
    n_chunks = pp * vpp
    stages: list[StageMemory] = []
    for s, chunk_layers in enumerate(by_stage):
        params = 0
        units = [lp] if sum(chunk_layers) else []
        for v, n in enumerate(chunk_layers):
            idx = v * pp + s
            first, last = idx == 0, idx == n_chunks - 1
            params += chunk_params(model, tp, pp, n, first, last, s_len)
            edge = chunk_params(model, tp, pp, 0, first, last, s_len)
            if edge:
                units.append(edge)
        has_first = s == 0
        has_last = s == pp - 1
        k = in_flight(layout.schedule, pp, vpp, m, s)
        mean_layers = sum(chunk_layers) / len(chunk_layers)
        acts = k * mean_layers * per_layer
        if has_first:
            acts += (k if vpp == 1 else -(-k // vpp)) * first_mb
        if has_last:
            acts += last_stored
        buffers = last_transient if has_last else 0.0
        if layout.recompute == "full":
            buffers += max(0.0, full_layer - per_layer)
        if layout.zero_stage >= 2 and layout.dp > 1:
            buffers += max(units) * g_full  # one unit's unsharded gradients before its reduce-scatter
        if layout.zero_stage == 3 and layout.dp > 1:
            buffers += options.zero3_live_units * max(units) * e
        stages.append(StageMemory(
            stage=s, layers=sum(chunk_layers), params=params, weights_bytes=params * w_pp, grads_bytes=params * g_pp,
            optimizer_bytes=params * o_pp, activations_bytes=acts, buffers_bytes=buffers,
            framework_bytes=options.framework_gib * GIB, in_flight=k))
    return MemoryReport(stages=stages, capacity_bytes=capacity, usable_bytes=usable, options=options)


def check_memory(model: ModelSpec, layout: Layout, device: Any,
                 options: MemoryOptions = MemoryOptions()) -> MemoryReport:
    """`estimate_memory`, raising InfeasibleConfig (field 'memory') when the layout does not fit."""
    rep = estimate_memory(model, layout, device, options)
    if not rep.fits:
        raise InfeasibleConfig("memory", rep.reason + ".",
                               "raise tp or pp, use a smaller micro-batch, recomputation, sequence parallelism "
                               "or a higher ZeRO stage.")
    return rep


def model_state_bytes(num_params: float, precision: str, zero_stage: int, dp: int,
                      options: MemoryOptions = MemoryOptions()) -> float:
    """Weights + gradients + optimizer states of `num_params` parameters on one GPU."""
    return float(num_params) * float(np.sum(bytes_per_param(precision, zero_stage, dp, options)))

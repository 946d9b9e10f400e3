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
               unit under ZeRO-2/3; and what torch allocates once and keeps: PyTorch's cuBLAS and
               Transformer Engine's GEMM workspaces (`workspace_bytes`), Megatron's global memory
               buffer under the local transformer implementation (`global_buffer_bytes`)
  framework    outside the caching allocator: the CUDA context with its loaded kernels (`framework_gib`,
               default 0.4 GiB: ~0.3-0.4 GiB of context with lazy module loading, PyTorch's measurements in
               pytorch#86509 / #109888); the cuBLAS / Transformer Engine workspaces are torch tensors, in
               `buffers` (`workspace_bytes`)
  nccl         NCCL communicator buffers outside the allocator, per communicator the layout uses (below)
  allocator    the caching allocator's reserve beyond the allocated peak: `allocator_overhead` x the
               allocated parts (default 0.145, the median max_reserved / max_allocated of 17 published
               Megatron-LM logs, range 1.01-1.39: Megatron-LM transformer/README offloading table, issues
               #756 / #60, PR #5662, NeMo issue #14850 and others, listed in docs/memory_overheads.md)

so that the total is the device memory in use as nvidia-smi reports it. The allocated view
(`StageMemory.allocated_bytes`: torch.cuda.max_memory_allocated) and the reserved view (`reserved_bytes`:
max_memory_reserved) are kept beside it, and `MemoryOptions(device_overheads=False)` gives the allocated
view alone. A layout fits when the largest stage total, taken with the least allocator reserve published runs
show (`allocator_overhead_min`, 1 %: runs tuned to the edge, expandable segments), stays under the device memory
less an optional safety margin (`allocator_reserve`, default 0); it is `tight` when the total with the median
reserve does not (it runs only if the allocator fragments less than it typically does).

NCCL buffers (`nccl_buffer_arrays`), from NCCL's own constants (NVIDIA/nccl src/include/device.h,
src/init.cc, src/transport/nvls.cc; NCCL_BUFFSIZE 4 MiB): one collective communicator connects ring and
tree on 24 channels with a SIMPLE (4 MiB) + LL128 (4.69 MiB) + LL (0.5 MiB) buffer each, 24 x 9.19 MiB x 2
= 441 MiB (`nccl_coll_mib`); on an NVSwitch node with NVLink SHARP (Hopper / Blackwell) a communicator with
two or more GPUs in the node also gets NVLS buffers, 16 channels x 2 x (4 + 2 MiB) x 8 heads = 1.5 GiB
(`nccl_nvls_mib`; NCCL 2.17-2.21 allocate them at init, 2.22+ connects lazily and smaller: set 256);
point-to-point peers (pipeline neighbours, the context-parallel ring, the expert-parallel all-to-all)
take ~447 MiB each when the peer is in the same node or NVLink domain (`nccl_p2p_peer_mib`: NVIDIA/nccl#1685, 8 x H100,
+3.3 GB after the first all-to-all over 7 peers; its allocation log shows what it is made of: per peer and channel a
receive buffer of ncclRecvMem + LL + LL128 + SIMPLE rounded up to CUDA_IPC_MIN, 10 MiB, and a 2 MiB send structure,
src/transport/p2p.cc p2pRecvSetup / p2pSendSetup, on 32 channels per peer: 384 MiB of buffers). The count is linear in
the peers: the channels per peer are the fewest NVLink-derived channels over the communicator's peers, rounded to a
power of 2 and capped by its p2p channels (src/graph/paths.cc ncclTopoComputeP2pChannelsPerPeer /
ncclTopoComputeP2pChannels), and only a communicator spanning more than one node (NVLink domain) halves them to fit
its peers in one round; lazy connection (NCCL_RUNTIME_CONNECT, 2.22+) does not help an all-to-all, which reaches
every peer. Peers on other nodes share one pool per communicator
(`nccl_net_pool_mib`, 512 MiB: NCCL_NET_SHARED_BUFFERS, "constant memory usage instead of increasing linearly with
the number of remote peers", env.rst; nChannels x 16 x p2p chunk = 64 x 16 x 512 KiB in NVIDIA/nccl#2363).
The communicators counted are the distinct rank sets Megatron-Core runs collectives on: tensor parallel, data
parallel (with CP), model parallel (tp x pp: the gradient-norm reduction), the world, the expert-data-parallel group
of a MoE and the embedding group of tied embeddings with pp > 1. Corroboration, not fitted: verl PR #6408 frees ~7
GB of NCCL memory per rank of a Megatron TP2 PP2 DP2 run on 8 x H100 (this model: 8.2 GiB = 8.8 GB); NVIDIA's
Megatron memory estimator (ISEEKYAN/mbridge) adds a default 10 GB "overhead per GPU" for what it does not model.
CPU platforms (gloo) have none of these three parts.

Bytes per parameter (weights + gradients + optimizer) with `d` data-parallel ranks, matching
Megatron-LM's distributed-optimizer table (docs/source/api-guide/dist_optimizer.md) and the
ZeRO paper (Rajbhandari et al. 2020, K = 12):

  precision / grads        zero 0   zero 1 (distributed optimizer)   zero 2          zero 3
  bf16, fp32 main grads    18       6 + 12/d                         2 + 16/d        18/d
  fp16, fp16 grads (+copy) 20       4 + 16/d                         2 + 18/d        20/d
  fp16, ZeRO paper         16       4 + 12/d                         2 + 14/d        16/d
  fp32                     16       8 + 8/d                          4 + 12/d        16/d
  bf16, PyTorch FSDP                                                                 16/d (the fp32 shard is the
                                                                                      master: FSDP_FP32_SHARD)

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
  selective by module            Megatron-Core recompute_modules (core_attn default): each module's tensors are not
                                 stored (`recompute_freed_bytes`), one layer's come back while it rematerialises
  full recompute                 2*s*b*h (the layer input; /t with SP) + one layer rematerialised
The same terms are derived tensor by tensor for Llama-style layers (RMSNorm, GQA, SwiGLU, no dropout).

fp8 (predictor.step.fp8, Transformer Engine FP8 training): weights are BF16 plus two FP8 copies of every
transformer-layer
GEMM weight (+2 bytes per GEMM parameter: TE caches the FP8 weight and its FP8 transpose between micro-batches on
Hopper, where FP8 GEMMs take only the TN layout (Float8Tensor `_transpose`; TE 1.x `weight_fp8` + `weight_t_fp8`),
and rowwise + columnwise copies for MXFP8 on Blackwell (MXFP8TensorStorage)), the GEMM
inputs saved for backward are their FP8 casts (1 byte: the QKV and MLP inputs, the out-proj input and the fc2 input),
everything else as bf16 (Transformer Engine docs, "Using FP8 with Transformer Engine": master weights and
activations outside the FP8 GEMMs keep the higher precision).

Micro-batches in flight on stage s of p (m micro-batches): 1F1B min(p - s, m); GPipe m; interleaved
with v chunks per GPU min(2(p-s-1) + (v-1)p + 1, m v) chunk activations (Narayanan et al. 2021;
stage 0 holds L(1 + (p-1)/(p v)) layers' worth, Korthikanti eq. 5).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np

from predictor.model import params
from predictor.model.errors import InfeasibleConfig
from predictor.model.moe import routing, tokens_per_gpu
from predictor.model.params import chunk_params, edge_params, layer_params_per_gpu  # noqa: F401  (re-exported)
from predictor.model.specs import (  # noqa: F401
    BYTES_PER_ELEMENT,
    DEFAULT_RECOMPUTE_MODULES,
    FLASH_IMPLS,
    GRAD_BYTES,
    MOE_DISPATCHERS,
    RECOMPUTE_MODULES,
    Layout,
    ModelSpec,
    grad_comm_bytes,
    padded_vocab,
)
from predictor.model.stages import ZB_SCHEDULES, chunk_layer_counts
from predictor.step import fp8
from predictor.step.arrayops import unique_rows
from predictor.step.compose import chunk_rank_matrix, zb_orders

GIB = float(2 ** 30)
# what a `tight` layout (MemoryReport.tight) is, in the words every page and table uses
TIGHT_MEANS = ("above the usable memory with the caching allocator's typical reserve; it fits only if the allocator "
               "fragments as little as runs tuned to the edge do (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
               "helps)")
FP8_WEIGHT_COPIES = 2   # FP8 weight + its FP8 transpose (Hopper) / columnwise copy (MXFP8), bytes per GEMM parameter
TRANSFORMER_IMPLS = ("transformer_engine", "local")
# --- library workspaces allocated through torch's caching allocator (counted by torch.cuda.max_memory_allocated) ---
# PyTorch (aten/src/ATen/cuda/CublasHandlePool.cpp, 2.3-2.9): getCurrentCUDABlasHandle keeps one workspace per
# (cuBLAS handle, stream) pair, `getNewWorkspace()` = CUDACachingAllocator allocate(getChosenWorkspaceSize()); handles
# come from a thread-local pool window, so the forward (the Python thread) and the backward (autograd's device
# thread) run their GEMMs on two handles of the same stream: two workspaces
TORCH_CUBLAS_HANDLES = 2
# parseChosenWorkspaceSize: CUBLAS_WORKSPACE_CONFIG unset, ':4096:8' (32 MiB) on sm90, else ':4096:2:16:8' (8.125 MiB);
# ROCm's hipBLAS: 32 MiB, 128 MiB on MI300 (gfx94)
TORCH_CUBLAS_DEFAULT_MIB = {"hopper": 32.0, "cdna2": 32.0, "cdna3": 128.0}
TORCH_CUBLAS_OTHER_MIB = (4096 * 2 + 16 * 8) / 1024
# Transformer Engine (transformer_engine/pytorch/module/base.py): get_workspace() one torch.empty of
# get_cublas_workspace_size_bytes() (32 MiB on compute capability 9 and later, 4 MiB before) for its GEMMs, and
# get_multi_stream_cublas_workspace() one per compute stream (tex.get_num_cublas_streams(): 4) for GroupedLinear,
# the MoE experts' grouped GEMM
TE_WORKSPACE_MIB = {"hopper": 32.0, "blackwell": 32.0, "cdna2": 32.0, "cdna3": 32.0}   # major >= 9 (gfx9 on ROCm)
TE_WORKSPACE_OTHER_MIB = 4.0
TE_GROUPED_GEMM_STREAMS = 4

@dataclass(frozen=True)
class MemoryOptions:
    grad_bytes: int | None = None          # None: GRAD_BYTES[precision]
    master_weights: bool | None = None     # fp32 master copy; None: precision != fp32
    fp32_grad_copy: bool | None = None     # fp32 copy of 16-bit grads in the optimizer; None: grad_bytes < 4
    optimizer_bytes_per_param: int = 8     # Adam exp_avg + exp_avg_sq in fp32
    dropout: bool | None = None            # None: GPT layers have dropout (GPT-3 / Megatron), Llama none
    zero3_live_units: int = 2              # FSDP / ZeRO-3: units unsharded at once (current + prefetched)
    framework_gib: float = 0.4             # outside the allocator: the CUDA context with its loaded kernels
    allocator_overhead: float = 0.145      # caching allocator's reserve beyond the allocated peak (x allocated)
    allocator_overhead_min: float = 0.01   # the least of it seen (a run tuned to the edge, expandable segments)
    allocator_reserve: float = 0.0         # share of HBM kept free as a safety margin
    nccl_coll_mib: float = 441.0           # one collective communicator: ring + tree, 24 channels
    nccl_nvls_mib: float = 1536.0          # + NVLink SHARP buffers on an NVLS node (NCCL 2.17-2.21; 2.22+: 256)
    nccl_p2p_peer_mib: float = 447.0       # one point-to-point peer in the node (pipeline, CP ring, EP all-to-all)
    nccl_net_pool_mib: float = 512.0       # the shared pool of a communicator's peers on other nodes
    device_overheads: bool = True          # False: the allocated view only (no framework / NCCL / allocator)
    logits_fp32: bool = True               # vocab-parallel cross-entropy keeps fp32 logits (4*s*b*V/t)
    # Megatron-Core's native fused cross entropy as compiled before its in-place steps got graphs of their own
    # (`edge_activation_bytes`): one more fp32 logits-sized transient in the loss's forward
    fused_ce_logits_copy: bool = False
    # library workspaces torch allocates (`workspace_bytes`): PyTorch's cuBLAS workspace per handle (None: PyTorch's
    # default for the GPU, or what CUBLAS_WORKSPACE_CONFIG sets: `cublas_workspace_mib_of`)
    cublas_workspace_mib: float | None = None
    # Megatron-Core's transformer implementation: 'transformer_engine' (TE's cuBLAS workspaces) or 'local'
    # (Megatron's own modules: no TE workspace; unfused attention writes its scores through the global memory buffer)
    transformer_impl: str = "transformer_engine"

    def __post_init__(self) -> None:
        # the safety margin is a user input (--allocator-reserve, the API): a share of the device memory in [0, 1)
        r = self.allocator_reserve
        if not (isinstance(r, (int, float)) and r == r and 0.0 <= r < 1.0):
            raise InfeasibleConfig("allocator_reserve", f"is a share of the device memory in [0, 1), got {r!r}.",
                                   "use e.g. 0 (no margin) or 0.05 (keep 5 % free).")
        if self.transformer_impl not in TRANSFORMER_IMPLS:
            raise InfeasibleConfig("transformer_impl", f"unknown '{self.transformer_impl}'.",
                                   f"use one of {', '.join(TRANSFORMER_IMPLS)}.")


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
    nccl_bytes: float = 0.0      # NCCL communicator buffers (outside the caching allocator)
    allocator_bytes: float = 0.0  # the caching allocator's reserve beyond the allocated peak
    allocator_min_bytes: float = 0.0  # the least reserve published runs show (the fit verdict's lower bound)
    # --- activation offloading ---
    offloaded_bytes: float = 0.0  # saved activations held in host memory at the peak (not in any device total)

    @property
    def states_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def allocated_bytes(self) -> float:
        """What torch.cuda.max_memory_allocated counts: states, activations and transient buffers."""
        return self.states_bytes + self.activations_bytes + self.buffers_bytes

    @property
    def reserved_bytes(self) -> float:
        """What torch.cuda.max_memory_reserved counts: the allocated peak and the allocator's reserve."""
        return self.allocated_bytes + self.allocator_bytes

    @property
    def total_bytes(self) -> float:
        """Device memory in use as nvidia-smi reports it: reserved + CUDA context / workspaces + NCCL buffers."""
        return self.reserved_bytes + self.framework_bytes + self.nccl_bytes

    @property
    def low_total_bytes(self) -> float:
        """The total with the least allocator reserve published runs show (`allocator_overhead_min`)."""
        return self.total_bytes - self.allocator_bytes + self.allocator_min_bytes

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
    def low_peak_bytes(self) -> float:
        return max(s.low_total_bytes for s in self.stages)

    @property
    def fits(self) -> bool:
        """Whether it can fit: with the least allocator reserve published runs show, the fullest stage stays
        within the usable memory (`tight` says when the typical reserve would not)."""
        return self.low_peak_bytes <= self.usable_bytes

    @property
    def tight(self) -> bool:
        """Fits only if the caching allocator fragments less than it typically does (the total with the median
        reserve is above the usable memory, the one with the least reserve below it)."""
        return self.fits and self.peak_bytes > self.usable_bytes

    @property
    def reason(self) -> str:
        """Why it does not fit ('' when it does): the stage, its total and the largest parts."""
        if self.fits:
            return ""
        return out_of_memory_reason(self.peak, self.usable_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"peak_gib": self.peak_gib, "peak_stage": self.peak.stage, "capacity_gib": self.capacity_bytes / GIB,
                "usable_gib": self.usable_bytes / GIB, "fits": self.fits, "tight": self.tight,
                "low_peak_gib": self.low_peak_bytes / GIB, "reason": self.reason,
                "stages": [s.to_dict() for s in self.stages]}


def stage_parts_bytes(st: StageMemory) -> dict[str, float]:
    """{label: bytes} of one stage, every MEMORY_PARTS entry in order, named as MEMORY_PART_LABELS names it."""
    return {MEMORY_PART_LABELS[k]: float(getattr(st, f"{k}_bytes")) for k in MEMORY_PARTS}


def out_of_memory_reason(st: StageMemory, usable_bytes: float) -> str:
    parts = stage_parts_bytes(st)
    top = ", ".join(f"{k} {v / GIB:.1f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])[:3])
    return (f"out of memory: stage {st.stage} needs {st.total_bytes / GIB:.1f} GiB > "
            f"{usable_bytes / GIB:.1f} GiB usable ({top} GiB)")


# ------------------------------------------------------------------------------------------ states
def resolved(options: MemoryOptions, precision: str) -> tuple[int, bool, bool]:
    """(grad_bytes, master_weights, fp32_grad_copy) with the defaults filled in."""
    g = options.grad_bytes if options.grad_bytes is not None else GRAD_BYTES.get(precision, 4)
    master = options.master_weights if options.master_weights is not None else precision != "fp32"
    # Megatron's fp16 optimizer keeps an fp32 copy of the fp16 gradients; with bf16 gradient buffers
    # (grad_reduce_in_fp32 False) the distributed optimizer casts its shard at the step, nothing persistent
    copy = options.fp32_grad_copy if options.fp32_grad_copy is not None else (g < 4 and precision == "fp16")
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


# ------------------------------------------------------------------------------------- activations
def _dropout(model: ModelSpec, options: MemoryOptions) -> bool:
    return options.dropout if options.dropout is not None else model.arch == "gpt"


def activation_terms(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, precision: str = "bf16",
                     options: MemoryOptions = MemoryOptions(), moe: bool = False, ep: int = 1,
                     sequence_parallel: bool = False, etp: int = 1, dispatcher: str = "alltoall"
                     ) -> dict[str, float]:
    """`activation_breakdown`'s terms (see there)."""
    return activation_breakdown(model, seq_len, micro_batch, tp, precision, options, moe, ep, sequence_parallel,
                                etp, dispatcher)[0]


def activation_breakdown(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, precision: str = "bf16",
                         options: MemoryOptions = MemoryOptions(), moe: bool = False, ep: int = 1,
                         sequence_parallel: bool = False, etp: int = 1, dispatcher: str = "alltoall"
                         ) -> tuple[dict[str, float], dict[str, float]]:
    """(terms, parts). Terms: Bytes kept for backward by one layer and micro-batch, per GPU, split by how they shard:
    `replicated` (whole on every TP rank unless SP splits it), `sharded` (split over tp),
    `quadratic` (the s^2 attention probabilities of unfused attention, split over tp),
    `flash` (flash attention's fp32 logsumexp, split over tp), `input` (the layer input).

    `moe` (a MoE layer of a MoE model, `seq_len` already per CP rank): instead of the MLP intermediates, the
    rows this GPU's experts compute on the busiest rank (predictor.model.moe.routing: tokens x top_k x imbalance)
    keep the dispatched input, the fc1 output (gate and up), the activation output and the expert output the
    un-permutation weights (2h + 3 ffn_e elements per row for SwiGLU, 2h + 2 ffn_e for GeLU; fc1's and fc2's inputs
    as their FP8 casts under fp8, Transformer Engine's GroupedLinear saving the quantized inputs), plus the fp32
    router probabilities; the shared experts keep what a dense MLP of their width keeps. Expert tensor parallelism
    (`etp` > 1): the rows are the etp-gathered ones (routing), the fc1 output and activation 1/etp of the expert's
    width, the expert output the rank's own rows after the reduce-scatter (h / etp per gathered row).
    The permutation keeps its int64 row indices (index_select's backward), 8 bytes per permuted row: the T x top_k
    rows with the alltoall dispatcher; with the allgather `dispatcher` (etp x ep > 1) the local rows R it permutes
    out of the G = etp x ep x T gathered tokens, plus what the masked_select of the local experts' probabilities
    keeps for its backward, the [local experts, G] probabilities (e) and mask (1 byte) (MoEAllGatherTokenDispatcher
    .token_permutation); the gathered hidden states are not kept (index_select's backward needs the indices only,
    and they live in Megatron's global memory buffer: `global_buffer_bytes`).

    Parts: the pieces of those terms that selective recomputation by module can free (`recompute_freed_bytes`):
    `norm_out` (replicated: the outputs of the norms that are modules of their own, `ModelSpec.separate_norms`),
    `mla_latent_out` (replicated: MLA's normed latents, the up projections' input), `mla_qkv` (sharded: MLA's
    up-projected Q, K and V that flash attention keeps), `mlp` (sharded: the dense MLP's intermediates, or a MoE
    layer's whole block: routed rows, router probabilities and shared experts), `shared` (sharded: the shared experts'
    intermediates), `moe_act` (sharded: the routed experts' activation output, fc2's input)."""
    s, b, h, t = seq_len, micro_batch, model.hidden_size, tp
    e = BYTES_PER_ELEMENT[precision]
    a, hd = model.num_heads, model.head_size
    kv_r = max(model.kv_heads / t, 1.0)  # kv heads per rank (replicated when tp > kv_heads)
    ffn = model.ffn
    sbh = s * b * h
    drop = _dropout(model, options)
    mask = 1.0 if drop else 0.0
    # fp8 (predictor.step.fp8): the inputs of the FP8 GEMMs are kept as their FP8 casts, 1 byte (Transformer Engine's
    # Linear / LayerNormLinear / LayerNormMLP save the FP8 input, `inputmat` / `ln_out` / `fc2` input, for the
    # wgrad GEMM); everything else stays BF16
    g = fp8.saved_input_bytes(precision, e)  # mxfp8 / nvfp4: their values + block scales
    # replicated: both norm inputs, the QKV input, the MLP input, the two residual dropout masks
    replicated = sbh * (2 * e + g + g) + sbh * 2 * mask
    parts = {"norm_out": sbh * g * model.separate_norms(moe and model.is_moe), "mla_latent_out": 0.0,
             "mla_qkv": 0.0, "mlp": 0.0, "shared": 0.0, "moe_act": 0.0}
    # sharded: Q, K, V (GQA: kv heads per rank), attention output (out-proj input), MLP intermediates
    q = s * b * (a / t) * hd * e
    kv = 2 * s * b * kv_r * hd * e
    o = s * b * (a / t) * hd * g
    if model.is_mla:
        # MLA (Megatron-Core MLASelfAttention with Transformer Engine; docs/mla.md): the down projections' input is
        # the one norm output counted above; the latents each keep their RMSNorm input (e) and the up projection's
        # input (g): q_lora_rank where the query is compressed, kv_lora_rank (replicated, split by SP like the layer
        # input). The shared RoPE key keeps nothing (a rotation's backward needs only cos / sin). Flash attention
        # keeps the up-projected Q and K (heads / tp x (qk_nope + qk_rope)) and V (heads / tp x v_head_dim) and
        # its output, the output projection's input (heads / tp x v_head_dim).
        replicated += s * b * ((model.q_lora_rank or 0) + (model.kv_lora_rank or 0)) * (e + g)
        q = s * b * (a / t) * model.qk_head_size * e
        kv = s * b * (a / t) * (model.qk_head_size + model.v_head_size) * e
        parts["mla_qkv"] = q + kv
        parts["mla_latent_out"] = s * b * ((model.q_lora_rank or 0) + (model.kv_lora_rank or 0)) * g
        o = s * b * (a / t) * model.v_head_size * g
    def mlp_terms(width: float) -> float:
        if model.arch == "llama":
            return s * b * (width / t) * (2 * e + g)   # fc1 output (gate and up, 2*ffn) + SwiGLU output (fc2 input)
        return s * b * (width / t) * (e + g)           # GeLU input + GeLU output (fc2 input)
    if moe and model.is_moe:
        r = routing(model, b, s, t, 1, ep, sequence_parallel, etp, dispatcher)
        rows = r.rows_per_expert * r.local_experts
        fe = model.expert_ffn / max(etp, 1)
        # fc1's input is a GEMM input like the dense ones: its FP8 cast under fp8 (Transformer Engine's GroupedLinear
        # saves the quantized `inputmats`, as Linear does); the expert output stays 16-bit (the un-permutation keeps it)
        per_row = h * g + h * e / max(etp, 1) + (2 * fe * e + fe * g if model.arch == "llama" else fe * e + fe * g)
        if r.gathered_rows:   # allgather: the local rows' indices, the local probabilities' masked_select
            routed = 8.0 * rows + r.gathered_rows * r.local_experts * (e + 1.0)
        elif r.dispatcher == "hybridep":   # its handle: the [T, experts] routing map (bool), int32 row maps
            routed = 1.0 * r.tokens * model.num_experts + 4.0 * r.routed_rows
        else:
            routed = 8.0 * r.routed_rows
        mlp = rows * per_row + 4.0 * r.tokens * model.num_experts + routed
        parts["moe_act"] = rows * fe * g
        if model.shared_experts:
            parts["shared"] = mlp_terms(model.shared_experts * model.shared_ffn)
            mlp += parts["shared"]
    else:
        mlp = mlp_terms(ffn)
    parts["mlp"] = mlp
    sharded = q + kv + o + mlp
    if model.attention_impl in FLASH_IMPLS:
        quadratic = 0.0
        flash = 4.0 * b * (a / t) * s
    else:
        # softmax output (e) [+ dropout mask (1) + dropout output (e)] per score
        quadratic = b * (a / t) * s * s * (e + (1 + e if drop else 0))
        flash = 0.0
    return ({"replicated": replicated, "sharded": sharded, "quadratic": quadratic, "flash": flash,
             "input": sbh * e}, parts)


def activation_bytes_per_layer(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, sequence_parallel: bool,
                               recompute: str, precision: str = "bf16",
                               options: MemoryOptions = MemoryOptions(), moe: bool = False, ep: int = 1,
                               etp: int = 1, modules: tuple[str, ...] | None = None, dispatcher: str = "alltoall"
                               ) -> float:
    """Bytes one layer keeps for backward per micro-batch on one GPU (`moe`: a MoE layer, experts over `ep`, each
    split over `etp`). `modules`: what selective recomputation recomputes (None: Megatron-Core's default
    ("core_attn",)); the layer stores everything else, all its activations less `recompute_freed_bytes`."""
    t = tp
    sp_div = t if sequence_parallel else 1
    T, parts = activation_breakdown(model, seq_len, micro_batch, tp, precision, options, moe, ep, sequence_parallel,
                                    etp, dispatcher)
    if recompute == "full":
        return T["input"] / sp_div
    stored = T["replicated"] / sp_div + T["sharded"] + T["flash"] + T["quadratic"]
    if recompute == "selective":
        mods = DEFAULT_RECOMPUTE_MODULES if modules is None else modules
        stored -= _freed(model, T, parts, mods, moe, sp_div)
    return stored


def _freed(model: ModelSpec, T: dict[str, float], parts: dict[str, float], modules: tuple[str, ...], moe: bool,
           sp_div: int) -> float:
    """`recompute_freed_bytes` from one layer's terms and parts."""
    moe_layer = moe and model.is_moe
    out = 0.0
    if "core_attn" in modules:     # the attention core's own saved tensors (its Q, K, V inputs stay saved)
        out += T["quadratic"] + T["flash"]
    if "layernorm" in modules:     # the separate norms' outputs (output-discarding; fused ones are skipped)
        out += parts["norm_out"] / sp_div
    if "mla_up_proj" in modules:   # the normed latents and the up projections' Q, K, V (the latents stay)
        out += parts["mla_latent_out"] / sp_div + parts["mla_qkv"]
    if moe_layer:
        if "moe" in modules:       # the whole MoE block (it contains moe_act and shared_experts)
            out += parts["mlp"]
        else:
            out += parts["moe_act"] if "moe_act" in modules else 0.0
            out += parts["shared"] if "shared_experts" in modules else 0.0
    elif "mlp" in modules:         # a dense layer's MLP intermediates (its input stays saved)
        out += parts["mlp"]
    return out


def recompute_freed_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, sequence_parallel: bool,
                          modules: tuple[str, ...], precision: str = "bf16", options: MemoryOptions = MemoryOptions(),
                          moe: bool = False, ep: int = 1, etp: int = 1, dispatcher: str = "alltoall") -> float:
    """Bytes of one layer's saved activations per micro-batch that selective recomputation of `modules` does not
    store (Megatron-Core TransformerConfig.recompute_modules: "moe_act", "layernorm" and "mla_up_proj" use
    output-discarding checkpointing, "core_attn", "mlp", "moe" and "shared_experts" normal checkpointing, which keeps
    the module's input and nothing inside it):
      core_attn       the attention core's saved tensors beyond its Q, K, V inputs: unfused attention's scores,
                      softmax and dropout (Korthikanti et al. 2022's 5as/h term), flash attention's fp32 logsumexp;
      layernorm       the outputs of input_layernorm and pre_mlp_layernorm where they are modules of their own
                      (`ModelSpec.separate_norms`: Megatron-Core skips a norm fused into the next linear layer);
      mla_up_proj     MLA's normed latents (the up projections' input) and the up-projected Q, K, V: with
                      Transformer Engine's MLA spec the latent norms are fused into the up projections
                      (TELayerNormColumnParallelLinear, q_layernorm / kv_layernorm IdentityOp), inside the
                      checkpointed qkv_up_proj_and_rope_apply, whose input is the un-normed latents;
      mlp             a dense layer's MLP intermediates (fc1 output, activation output);
      moe             a MoE layer's whole block: routed rows, router probabilities, shared experts;
      moe_act         the routed experts' activation output (fc2's input);
      shared_experts  the shared experts' MLP intermediates.
    A module that is not in the layer (moe_act in a dense layer, mlp in a MoE layer) frees nothing there."""
    sp_div = tp if sequence_parallel else 1
    T, parts = activation_breakdown(model, seq_len, micro_batch, tp, precision, options, moe, ep, sequence_parallel,
                                    etp, dispatcher)
    return _freed(model, T, parts, tuple(modules), moe, sp_div)


def full_layer_activation_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, sequence_parallel: bool,
                                precision: str = "bf16", options: MemoryOptions = MemoryOptions(), moe: bool = False,
                                ep: int = 1, etp: int = 1, dispatcher: str = "alltoall") -> float:
    """One layer's activations without any recomputation (what full recomputation rematerialises)."""
    return activation_bytes_per_layer(model, seq_len, micro_batch, tp, sequence_parallel, "none", precision, options,
                                      moe, ep, etp, dispatcher=dispatcher)


def moe_dispatch_buffer_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, sequence_parallel: bool,
                              precision: str, cp: int, ep: int, etp: int = 1, dispatcher: str = "alltoall") -> float:
    """A MoE layer's transient dispatch buffers. alltoall: the permuted rows sent and the rows received on the busiest
    rank (etp > 1: all-gathered over the etp ranks; 0 for a dense model or ep = 1, where the permuted rows are the
    experts' input, counted as activations). allgather (etp x ep > 1; MoEAllGatherTokenDispatcher): the zeroed
    [G = etp x ep x T, hidden] tensor the un-permutation scatters the expert output into before its reduce-scatter,
    in the backward the all-gathered output gradient and the permutation's zeroed input gradient of the same size,
    beside the R local rows' gradient: (G + R) x hidden x e (0 with etp x ep = 1, as alltoall)."""
    if not model.is_moe:
        return 0.0
    r = routing(model, micro_batch, seq_len, tp, cp, ep, sequence_parallel, etp, dispatcher)
    if r.gathered_rows:
        return (r.gathered_rows + r.local_rows) * model.hidden_size * BYTES_PER_ELEMENT[precision]
    if ep <= 1:
        return 0.0
    if dispatcher == "hybridep":   # the rows arrive in its own buffer (hybridep_buffer_bytes); the permuted output
        return float(r.local_rows * model.hidden_size * BYTES_PER_ELEMENT[precision])   # is a fresh tensor
    return (r.routed_rows + r.rows_per_expert * r.local_experts) * model.hidden_size * BYTES_PER_ELEMENT[precision]


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
    16-bit logits before the fp32 cast, and with `options.fused_ce_logits_copy` one more fp32 copy of the logits:
    Megatron-Core's native fused cross entropy (cross_entropy_loss_fusion, cross_entropy_fusion_impl 'native') ran
    calculate_predicted_logits as one torch.compile graph that subtracts the max in place, exponentiates in place and
    sums the rows; megatron/core/fusions/fused_cross_entropy.py at 0cb4a9c notes that Inductor then "materializes the
    new value in a fresh [s, b, v] buffer and copies it back into the input, i.e. a full logits-sized transient
    allocation", and compiles the in-place steps on their own since (so the current code has no such copy)."""
    s, b, h, t = seq_len, micro_batch, model.hidden_size, tp
    e = BYTES_PER_ELEMENT[precision]
    sp_div = t if sequence_parallel else 1
    vp = padded_vocab(model.vocab_size, tp)
    first = 8.0 * s * b + (s * b * h / sp_div if _dropout(model, options) else 0.0)
    logits = s * b * vp / t
    last = 2.0 * s * b * h * e / sp_div + (4.0 if options.logits_fp32 else e) * logits
    transient = (e * logits if options.logits_fp32 else 0.0) + (4.0 * logits if options.fused_ce_logits_copy else 0.0)
    return first, last, transient


# ------------------------------------------------------------------------- context parallelism
def cp_ring_buffer_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, precision: str, cp: int) -> float:
    """The context-parallel ring's transient receive buffer: one K/V block pair, 2 x [b, seq_len/cp, kv heads
    per tp rank x head_dim] x e (0 without context parallelism)."""
    if cp <= 1:
        return 0.0
    kv_r = max(model.kv_heads / tp, 1.0)
    if model.is_mla:   # MLA: the up-projected K (qk_nope + qk_rope) and V (v_head_dim) blocks
        return (micro_batch * (seq_len // cp) * kv_r * (model.qk_head_size + model.v_head_size)
                * BYTES_PER_ELEMENT[precision])
    return 2.0 * micro_batch * (seq_len // cp) * kv_r * model.head_size * BYTES_PER_ELEMENT[precision]


# ------------------------------------------------------------------------------------ pipelines
def in_flight(schedule: str, pp: int, vpp: int, m: int, stage: int) -> int:
    """Micro-batches (interleaved: chunk activations) whose activations stage `stage` holds at its peak."""
    if pp > 1 and schedule in ZB_SCHEDULES:
        return zb_in_flight(schedule, pp, m)[stage]
    if pp == 1 or schedule == "gpipe":
        return m * (vpp if schedule == "interleaved" else 1) if pp > 1 else 1
    if schedule == "interleaved":
        return min(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, m * vpp)
    return min(pp - stage, m)


def in_flight_array(schedule: str, pp: int, vpp: int, m: np.ndarray) -> np.ndarray:
    """`in_flight` for R rows and every stage at once: [R, pp]."""
    m = np.asarray(m, dtype=float)[:, None]
    s = np.arange(pp)[None, :]
    if pp == 1:
        return np.ones((m.shape[0], 1))
    if schedule in ZB_SCHEDULES:
        mu, inv = np.unique(m[:, 0].astype(np.int64), return_inverse=True)
        return np.array([zb_in_flight(schedule, pp, int(k)) for k in mu], dtype=float)[inv]
    if schedule == "interleaved":
        return np.minimum(2 * (pp - s - 1) + (vpp - 1) * pp + 1, m * vpp)
    if schedule == "gpipe":
        return np.broadcast_to(m, (m.shape[0], pp)).astype(float)
    return np.minimum(pp - s, m)


# --- zero-bubble and bidirectional schedules: activations held per rank (docs/schedules.md) ---
def zb_in_flight(schedule: str, pp: int, m: int) -> tuple[int, ...]:
    """`zb_in_flight_counted` in closed form where the layout rules hold (equal to the count on every pp 2-16 and
    valid m, tests/test_schedules.py): zb-h1 min(p, m) on every stage, zb-v 2p, dualpipe p + 1, dualpipe-v 2p + 1."""
    if schedule == "zb-h1":
        return (min(pp, m),) * pp
    if schedule == "zb-v" and m >= 2 * pp - 1:
        return (2 * pp,) * pp
    if schedule == "dualpipe" and m >= 2 * pp and m % 2 == 0 and pp % 2 == 0:
        return (pp + 1,) * pp
    if schedule == "dualpipe-v" and m >= 2 * pp:
        return (2 * pp + 1,) * pp
    return zb_in_flight_counted(schedule, pp, m)


@lru_cache(maxsize=256)
def zb_in_flight_counted(schedule: str, pp: int, m: int) -> tuple[int, ...]:
    """Chunk activations each rank of zb-h1 / zb-v / dualpipe / dualpipe-v holds at its peak, counted on the
    schedule's own order (predictor.step.compose): a chunk's activations live from its forward until its weight
    gradient W has run (the inputs W needs are held until then; a whole backward frees them at once), and an
    overlapped F&B pair holds both while it runs. Published: ZB-H1 p micro-batches, 1F1B's (Qi et al. 2024 Table 1,
    M_B per micro-batch); DualPipe PP + 1 chunks, DualPipeV PP + 1 with PP counting chunks (DeepSeek-V3 Table 2, the
    DualPipe README); tests/test_schedules.py checks them."""
    orders, rank_of = zb_orders(schedule, pp, m)
    peak = [0] * pp
    for h, order in enumerate(orders):
        alive = top = 0
        for act in order:
            kinds = [t[0] for t in act]
            top = max(top, alive + kinds.count("F"))
            alive += kinds.count("F") - kinds.count("W") - kinds.count("BW")
        for r in rank_of(h):
            peak[r] = top
    return tuple(peak)


def stage_layer_counts(model: ModelSpec, layout: Layout) -> list[list[int]]:
    """Layers of each chunk grouped by physical stage: [[chunk layers on stage 0], ...]."""
    out: list[list[int]] = [[] for _ in range(layout.pp)]
    if layout.schedule in ZB_SCHEDULES:   # the V's placement; DualPipe's two copies of every stage
        place = chunk_rank_matrix(layout.schedule, layout.pp, layout.vpp)
        for i, n in enumerate(chunk_layer_counts(model, layout)):
            for r in np.nonzero(place[i])[0]:
                out[int(r)].append(int(n))
        return out
    for i, n in enumerate(chunk_layer_counts(model, layout)):
        out[i % layout.pp].append(int(n))
    return out


# Frameworks whose sharded parameter is the fp32 master itself: PyTorch FSDP's mixed precision keeps the sharded
# parameters in their original (fp32) dtype and casts to `param_dtype` only for the all-gather and the compute
# (torch/distributed/fsdp/_fully_shard/_fsdp_api.py MixedPrecisionPolicy: "FSDP ... keeps the high-precision sharded
# parameters in memory anyway. In other words, FSDP does not require any extra memory to keep a high-precision copy
# of the parameters for the optimizer step"; "The optimizer step uses the sharded parameter in the original dtype";
# FSDP1's MixedPrecision the same). Megatron's distributed optimizer and DeepSpeed keep a 16-bit parameter beside
# the fp32 master, which the bytes-per-parameter table above counts.
FSDP_FP32_SHARD = ("fsdp",)

MEMORY_PARTS = ("weights", "grads", "optimizer", "activations", "buffers", "framework", "nccl", "allocator")
ALLOCATED_PARTS = MEMORY_PARTS[:5]
#: how each part is named to a user (reasons, charts, search columns)
MEMORY_PART_LABELS = {"weights": "weights", "grads": "gradients", "optimizer": "optimizer",
                      "activations": "activations", "buffers": "buffers", "framework": "framework",
                      "nccl": "NCCL buffers", "allocator": "allocator reserve"}


@dataclass(frozen=True)
class DeviceComm:
    """What the memory model needs to know of the machine around a GPU: GPUs per node, whether NCCL sets up
    NVLink SHARP buffers there, and whether it is a GPU with NCCL / RCCL at all (a CPU with gloo has no
    communicator buffers, CUDA context or caching allocator)."""
    gpus_per_node: int = 8
    nvls: bool = False
    gpu: bool = True
    generation: str = ""   # the GPU's architecture (DeviceSpec.generation); '' = unknown: no library workspaces

    @classmethod
    def of(cls, device: Any) -> DeviceComm:
        """From a Platform (its node size and NVLS) or a bare DeviceSpec (a node of 8, no NVLS)."""
        dev = getattr(device, "device", device)
        gpu = getattr(dev, "vendor", "") != "cpu"
        gen = str(getattr(dev, "generation", "") or "") if gpu else ""
        if hasattr(device, "gpus_per_node"):
            return cls(int(device.gpus_per_node), bool(getattr(device, "has_nvls", False)), gpu, gen)
        return cls(8, False, gpu, gen)


def cublas_workspace_mib_of(config: str) -> float:
    """MiB of one PyTorch cuBLAS workspace under CUBLAS_WORKSPACE_CONFIG `config` (':SIZE_KiB:COUNT' pairs, summed
    as PyTorch's parseChosenWorkspaceSize sums them: ':4096:8' = 32 MiB)."""
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    if not pairs:
        raise InfeasibleConfig("CUBLAS_WORKSPACE_CONFIG", f"cannot read {config!r}.",
                               "write ':SIZE_KiB:COUNT', e.g. ':4096:8'.")
    return sum(int(k) * int(c) for k, c in pairs) / 1024


def workspace_bytes(model: ModelSpec, comm: DeviceComm, options: MemoryOptions = MemoryOptions()) -> float:
    """Bytes of the library workspaces torch allocates on a GPU once and keeps (in its allocated figure): PyTorch's
    cuBLAS workspaces, two handles (TORCH_CUBLAS_HANDLES) x `options.cublas_workspace_mib` or PyTorch's default for
    the architecture (32 MiB on Hopper, 8.125 MiB on other NVIDIA GPUs, hipBLAS 32 / 128 MiB on MI250 / MI300), and
    with Transformer Engine its GEMM workspace (32 MiB from Hopper on, 4 MiB before) plus, for a MoE's grouped
    expert GEMM, one per compute stream (4). 0 where the device is not known to be a GPU of a known architecture
    (`comm.generation` '')."""
    if not comm.gpu or not comm.generation:
        return 0.0
    torch_mib = (options.cublas_workspace_mib if options.cublas_workspace_mib is not None
                 else TORCH_CUBLAS_DEFAULT_MIB.get(comm.generation, TORCH_CUBLAS_OTHER_MIB))
    mib = TORCH_CUBLAS_HANDLES * torch_mib
    if options.transformer_impl == "transformer_engine":
        te = TE_WORKSPACE_MIB.get(comm.generation, TE_WORKSPACE_OTHER_MIB)
        mib += te * (1 + (TE_GROUPED_GEMM_STREAMS if model.is_moe else 0))
    return mib * 2.0 ** 20


def global_buffer_bytes(model: ModelSpec, seq_len: int, micro_batch: np.ndarray, tp: np.ndarray,
                        sequence_parallel: np.ndarray, precision: str, options: MemoryOptions = MemoryOptions(),
                        dispatch_gathered: np.ndarray | None = None) -> np.ndarray:
    """Megatron-Core's global memory buffer: `parallel_state.get_global_memory_buffer().get_tensor(shape, dtype,
    "mpu")` keeps the largest tensor asked of it. Under the local transformer implementation unfused attention
    (megatron/core/transformer/dot_product_attention.py) takes its [b * heads / tp, s, s] baddbmm input from it,
    sequence parallelism (tensor_parallel/layers.py) the all-gathered [s, b, h] input; under either implementation
    the allgather MoE dispatcher gathers the hidden states into it (`gather_from_sequence_parallel_region(...,
    use_global_buffer=True)`, token_dispatcher.py): `dispatch_gathered` rows of [h] per layout (0: none)."""
    n = len(tp)
    e = BYTES_PER_ELEMENT[precision]
    moe = (np.zeros(n) if dispatch_gathered is None
           else np.asarray(dispatch_gathered, dtype=float) * model.hidden_size * e)
    if options.transformer_impl != "local":
        return moe
    mb, t = np.asarray(micro_batch, dtype=float), np.asarray(tp, dtype=float)
    scores = (mb * model.num_heads / t * float(seq_len) ** 2 * e if model.attention_impl not in FLASH_IMPLS
              else np.zeros(n))
    gathered = np.where(np.asarray(sequence_parallel) > 0, seq_len * mb * model.hidden_size * e, 0.0)
    return np.maximum(np.maximum(scores, gathered), moe)


def hybridep_buffer_bytes(model: ModelSpec, tokens: int, ep: int) -> float:
    """The HybridEP dispatcher's communication buffer on each GPU of an expert-parallel group of `ep` ranks inside one
    NVLink domain (DeepEP hybrid-ep, NVLCoordinator.allocate_dispatch_buffers; Megatron-Core fused_a2a.py
    init_hybrid_ep_buffer sizes it for the micro-batch's `tokens` per rank, max_num_of_tokens_per_rank): a token
    buffer of max_num_of_tokens = tokens x ranks rows of hidden 16-bit elements (the dispatch output, shared with the
    combine input inside one domain, use_shared_buffer) and a probability buffer of the same rows x num_experts fp32
    (experts per rank x ranks). Allocated by the library (cudaMalloc / cuMem), outside torch's caching allocator,
    like NCCL's buffers. The inter-node RDMA buffers of a group wider than the domain are not counted."""
    if ep <= 1:
        return 0.0
    rows = float(tokens) * ep
    return rows * (2.0 * model.hidden_size + 4.0 * model.num_experts)


def _local_ranks(size: np.ndarray, stride: np.ndarray, gpn: int) -> np.ndarray:
    """Ranks of a group (`size` ranks `stride` apart) that share one node of `gpn` GPUs."""
    return np.where(stride >= gpn, 1, np.minimum(size, np.maximum(1, gpn // np.maximum(stride, 1))))


def nccl_buffer_arrays(comm: DeviceComm, pp: int, vpp: int, *, tp: np.ndarray, dp: np.ndarray, cp: np.ndarray,
                       ep: np.ndarray, moe: bool, tied: bool, options: MemoryOptions = MemoryOptions(),
                       etp: np.ndarray | None = None, hybridep_bytes: np.ndarray | None = None) -> np.ndarray:
    """[R, pp] bytes of NCCL communicator buffers per GPU on each pipeline stage (module docstring: 441 MiB per
    collective communicator, + 1.5 GiB NVLS buffers where the node has NVLS and the group two or more GPUs in
    it, 447 MiB per point-to-point peer). `dp` is dp x cp (the data-parallel-with-CP group), ranks ordered
    tp, cp, dp, pp as Megatron-Core orders them. The distinct collective rank sets: tp, dp x cp, tp x pp (the
    gradient-norm reduction; the tp set again when pp = 1), the world (dp x cp again when tp = pp = 1),
    the expert-data-parallel group of a MoE (tp x dp x cp / ep) and, with tied embeddings and pp > 1, the
    first and last stages' embedding group. Expert tensor parallelism (`etp` > 1): the expert-data-parallel group is
    tp x dp x cp / (ep x etp) ranks, one every ep x etp, and the etp group (etp side by side) one more communicator
    where it is not the tp group. `hybridep_bytes` (> 0 on rows whose MoE dispatcher is hybridep): that dispatcher's
    own buffer (hybridep_buffer_bytes) in place of the all-to-all's point-to-point peers."""
    tp, dp, cp, ep = (np.asarray(x, dtype=np.int64) for x in (tp, dp, cp, ep))
    et = np.ones_like(tp) if etp is None else np.asarray(etp, dtype=np.int64)
    n = len(tp)
    out = np.zeros((n, pp))
    if not comm.gpu or not options.device_overheads:
        return out
    gpn = max(1, int(comm.gpus_per_node))
    coll, nvls, peer, pool = (v * 2.0 ** 20 for v in (options.nccl_coll_mib, options.nccl_nvls_mib,
                                                       options.nccl_p2p_peer_mib, options.nccl_net_pool_mib))

    def p2p(peers: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Buffers of `peers` point-to-point peers of which `local` share the node: each local one its own,
        the remote ones one shared pool."""
        local = np.minimum(local, peers)
        return local * peer + np.where(peers > local, pool, 0.0)

    def collective(size: np.ndarray, stride: np.ndarray) -> np.ndarray:
        local = _local_ranks(size, stride, gpn)
        return np.where(size > 1, coll + (nvls * (local >= 2) if comm.nvls else 0.0), 0.0)

    one = np.ones(n, dtype=np.int64)
    world = tp * dp * pp
    per_gpu = collective(tp, one) + collective(dp, tp)
    if pp > 1:   # the model-parallel set: tp ranks side by side, pp stages tp x dp apart
        per_gpu += collective(tp * pp, np.where(tp > 1, 1, dp))
    per_gpu += np.where((world > dp) & (world > tp * pp), collective(world, one), 0.0)
    if moe:
        edp = np.maximum(tp * dp // np.maximum(ep * et, 1), 1)
        per_gpu += np.where((edp != dp) & (edp > 1), collective(edp, ep * et), 0.0)
        per_gpu += np.where((et > 1) & (et != tp), collective(et, np.ones_like(et)), 0.0)
        # the all-to-all reaches every EP peer (EP ranks side by side: the node holds min(ep, gpn) of them); the
        # hybridep dispatcher sends through its own buffer instead
        hyb = np.zeros(n) if hybridep_bytes is None else np.asarray(hybridep_bytes, dtype=float)
        per_gpu += np.where(hyb > 0, hyb, p2p(np.maximum(ep - 1, 0), np.minimum(ep, gpn) - 1))
    # the context-parallel ring's neighbours (CP ranks tp apart)
    per_gpu += p2p(np.minimum(np.maximum(cp - 1, 0), 2), np.where(tp * cp <= gpn, 2, 0))
    out += per_gpu[:, None]
    if pp > 1:
        if vpp > 1 or pp == 2:
            peers = np.full(pp, min(2, pp - 1), dtype=float)
        else:
            peers = np.full(pp, 2.0)
            peers[0] = peers[-1] = 1.0
        # pipeline neighbours are tp x dp x cp ranks apart: in the node only when that is less than the node
        same_node = (tp * dp < gpn)[:, None]
        out += np.where(same_node, peers[None, :] * peer, pool)
        if tied:
            emb = collective(np.full(n, 2), tp * dp * (pp - 1))
            out[:, 0] += emb
            out[:, -1] += emb
    return out


RECOMPUTE_ORDER = ("none", "selective", "full")


def modules_mask(modules: tuple[str, ...] | list[str]) -> int:
    """The bit mask of recompute modules (bit i = RECOMPUTE_MODULES[i]): how an engine row carries them."""
    return sum(1 << RECOMPUTE_MODULES.index(m) for m in set(modules))


def modules_of_mask(mask: int) -> tuple[str, ...]:
    """`modules_mask` inverted, in RECOMPUTE_MODULES order."""
    return tuple(m for i, m in enumerate(RECOMPUTE_MODULES) if int(mask) >> i & 1)


def recompute_mask(model: ModelSpec, layout: Layout) -> int:
    """The engine's recompute-modules column of a layout of `model`: its selective modules' mask (0 unless
    selective). Frameworks other than Megatron-Core (megatron) run the legacy Megatron-LM attention, which checkpoints
    the core attention only without flash attention (megatron/model/transformer.py: `if not self.use_flash_attn: if
    self.checkpoint_core_attention: ...`): under flash their selective recomputation re-runs nothing (mask 0)."""
    return modules_mask(layout.recomputed_modules(model))


@lru_cache(maxsize=65536)
def _layer_activation_terms(model: ModelSpec, seq_len: int, precision: str, options: MemoryOptions, t: int, b: int,
                            s: bool, r: int, c: int, x: int, y: int = 1, mm: int = 0,
                            md: int = 0) -> tuple[float, ...]:
    """`stage_memory_arrays`' per-layer activation terms of one (tp, micro-batch, SP, recompute, cp, ep, etp, recompute
    modules, dispatcher) key: (dense layer kept, full-recompute layer, edge first / last / last-transient, CP ring
    buffer, MoE layer kept, dispatch buffer, selective transient, gathered rows, hybridep buffer). Pure in its
    arguments (frozen model and options), cached: a search evaluates the same keys for every pipeline structure."""
    is_moe = model.is_moe
    sc = seq_len // c
    mods = modules_of_mask(mm)
    dsp = MOE_DISPATCHERS[md]
    dense_l = activation_bytes_per_layer(model, sc, b, t, s, RECOMPUTE_ORDER[r], precision, options,
                                         modules=mods)
    dense_f = full_layer_activation_bytes(model, sc, b, t, s, precision, options)
    moe_l = (activation_bytes_per_layer(model, sc, b, t, s, RECOMPUTE_ORDER[r], precision, options, True, x, y,
                                        modules=mods, dispatcher=dsp)
             if is_moe else dense_l)
    moe_f = (full_layer_activation_bytes(model, sc, b, t, s, precision, options, True, x, y, dsp) if is_moe
             else dense_f)
    # what full recomputation rematerialises: the larger of the layer kinds the model has
    full_f = (max(dense_f, moe_f) if model.has_dense_layers else moe_f) if is_moe else dense_f
    # selective: what one layer's backward rematerialises at a time (the larger of the layer kinds it has)
    sel_f = (max(dense_f - dense_l, moe_f - moe_l) if model.has_dense_layers else moe_f - moe_l) if is_moe \
        else dense_f - dense_l
    return (dense_l, full_f,
            *edge_activation_bytes(model, sc, b, t, s, precision, options),
            cp_ring_buffer_bytes(model, seq_len, b, t, precision, c),
            moe_l, moe_dispatch_buffer_bytes(model, seq_len, b, t, s, precision, c, x, y, dsp),
            sel_f if r == RECOMPUTE_ORDER.index("selective") else 0.0,
            float(routing(model, b, seq_len, t, c, x, s, y, dsp).gathered_rows) if is_moe else 0.0,
            # the hybridep dispatcher's own buffer, sized for a micro-batch's tokens per rank (0 with another one)
            hybridep_buffer_bytes(model, tokens_per_gpu(b, seq_len, c, t, s), x) if dsp == "hybridep" else 0.0)


def stage_memory_arrays(model: ModelSpec, seq_len: int, precision: str, chunk_layers: list[int] | tuple[int, ...],
                        pp: int, vpp: int, schedule: str, *, tp: np.ndarray, dp: np.ndarray, zero_stage: np.ndarray,
                        micro_batch: np.ndarray, num_micro_batches: np.ndarray, recompute: np.ndarray,
                        sequence_parallel: np.ndarray, options: MemoryOptions = MemoryOptions(),
                        cp: np.ndarray | None = None, ep: np.ndarray | None = None,
                        comm: DeviceComm | None = None, grad_bytes: np.ndarray | None = None,
                        fp8_param: np.ndarray | None = None, offload: np.ndarray | None = None,
                        etp: np.ndarray | None = None, recompute_modules: np.ndarray | None = None,
                        fp32_shard: np.ndarray | None = None, moe_dispatcher: np.ndarray | None = None
                        ) -> dict[str, np.ndarray]:
    """Per-stage memory of R layouts that share one pipeline structure (`chunk_layers` in pipeline
    order, pp, vpp, schedule): {part: [R, pp] bytes for part in MEMORY_PARTS, 'params': [R, pp],
    'in_flight': [R, pp]}. `recompute` holds indices into RECOMPUTE_ORDER, `recompute_modules`
    (default: Megatron-Core's default modules on selective rows) the selective rows' `modules_mask`. The one
    implementation behind `estimate_memory` and the step-time engine.

    Context parallelism (`cp`, default 1; Megatron-Core): every per-layer and edge activation term above is
    taken at seq_len / cp tokens (each CP rank keeps the activations of its own tokens: Korthikanti et al.'s
    sbh terms with s -> s/cp), plus one transient K/V block pair of the ring, 2 x [b, s/cp, kv heads per rank x
    head_dim] x e, in `buffers`. Weights, gradients and optimizer states per rank do not change with cp; the
    caller passes dp * cp as `dp`, since the ZeRO / distributed-optimizer shards spread over the
    data-parallel-with-CP group.

    Mixture-of-Experts (`ep`, default 1; predictor.model.moe): a MoE layer's routed experts (num_experts / ep whole
    experts per GPU) have their gradients and distributed-optimizer shards over the expert-data-parallel group
    (tp * dp / ep ranks, `dp` being dp * cp), everything else over dp; MoE layers keep the routed rows'
    activations (`activation_terms`), the leading dense layers a dense MLP's, and the all-to-all buffers of one
    layer are transient (`buffers`). Expert tensor parallelism (`etp`, default 1): each routed expert's weights,
    gradients and optimizer states split over etp ranks (the expert-data-parallel group tp * dp / (ep * etp)).
    `moe_dispatcher` (indices into MOE_DISPATCHERS, default alltoall): the allgather dispatcher's saved tensors and
    transients (`activation_breakdown`, `moe_dispatch_buffer_bytes`) and its gathered hidden states in Megatron's
    global memory buffer (`global_buffer_bytes`).

    `grad_bytes` (default: `options.grad_bytes` or the precision's) are the bytes per element of each row's
    gradient buffers (Layout.grad_bytes); `fp8_param` (default 0) marks rows with FP8 primary weights, whose GEMM
    weights are the FP8 weight and its transpose only (no BF16 copy).

    `fp32_shard` (default 0) marks rows whose framework keeps the sharded parameter itself in fp32 as the optimizer's
    master (PyTorch FSDP with a mixed-precision policy, `FSDP_FP32_SHARD`): under ZeRO-3 such a row has no 16-bit
    shard beside the fp32 one, its weights are the fp32 shard (4 bytes per parameter over the shard group) and its
    optimizer states the moments alone (the gathered 16-bit units stay in `buffers`).

    `comm` (default: a GPU in a node of 8 without NVLS) sizes the parts outside the allocated peak: the
    framework allowance, the NCCL buffers (`nccl_buffer_arrays`) and the allocator's reserve, all 0 on a CPU
    or with `options.device_overheads` False.

    Activation offloading (`offload`, layers per stage, default 0; Megatron-Core cpu_offloading through Transformer
    Engine's CPU offload context): those layers' saved activations of every micro-batch in flight leave the GPU
    (`offloaded`, [R, pp], host memory), and one offloaded layer's activations stay in `buffers` as the copy in
    flight (TE copies layer i out while layer i + 1 runs, and prefetches it back one layer ahead in the backward).
    `offload_layer_bytes` [R, pp]: one layer's saved activations (the mean over the stage's layer kinds), what one
    offloaded layer moves each way per micro-batch."""
    comm = comm or DeviceComm()
    tp, dp, zero = (np.asarray(x, dtype=np.int64) for x in (tp, dp, zero_stage))
    mb, rc = np.asarray(micro_batch, dtype=np.int64), np.asarray(recompute, dtype=np.int64)
    sp = np.asarray(sequence_parallel, dtype=np.int64)
    n = len(tp)
    cpa = np.ones(n, dtype=np.int64) if cp is None else np.asarray(cp, dtype=np.int64)
    epa = np.ones(n, dtype=np.int64) if ep is None else np.asarray(ep, dtype=np.int64)
    eta = np.ones(n, dtype=np.int64) if etp is None or not model.is_moe else np.asarray(etp, dtype=np.int64)
    nch = pp * vpp
    counts = np.asarray(chunk_layers, dtype=float)
    dense_c = np.asarray(params.chunk_dense_layers(model, [int(c) for c in chunk_layers]), dtype=float)
    moe_c = counts - dense_c   # MoE layers per chunk (0 for a dense model)
    zb = schedule in ZB_SCHEDULES
    cstage = np.arange(nch) % pp
    onehot = (cstage[:, None] == np.arange(pp)[None, :]).astype(float)
    if zb:   # the V's placement; DualPipe's two copies of every chunk
        onehot = chunk_rank_matrix(schedule, pp, vpp)
    per_stage = onehot.sum(axis=0) if zb else np.bincount(cstage, minlength=pp)
    mean_dense = (dense_c @ onehot) / per_stage
    mean_moe = (moe_c @ onehot) / per_stage
    e = BYTES_PER_ELEMENT[precision]
    g_default = resolved(options, precision)[0]
    g_row = (np.full(n, g_default, dtype=np.int64) if grad_bytes is None or options.grad_bytes is not None
             else np.asarray(grad_bytes, dtype=np.int64))
    f8p = np.zeros(n) if fp8_param is None else np.asarray(fp8_param, dtype=float)
    # activations per (tp, micro-batch, SP, recompute, cp, ep), on the seq_len / cp tokens of a CP rank
    sel = rc == RECOMPUTE_ORDER.index("selective")
    rcm = (np.where(sel, modules_mask(DEFAULT_RECOMPUTE_MODULES), 0) if recompute_modules is None
           else np.where(sel, np.asarray(recompute_modules, dtype=np.int64), 0))
    mda = (np.zeros(n, dtype=np.int64) if moe_dispatcher is None or not model.is_moe
           else np.asarray(moe_dispatcher, dtype=np.int64))
    keys, kinv = unique_rows(np.column_stack([tp, mb, sp, rc, cpa, epa, eta, rcm, mda]))
    is_moe = model.is_moe

    acts_k = np.array([_layer_activation_terms(model, seq_len, precision, options, int(k[0]), int(k[1]), bool(k[2]),
                                               int(k[3]), int(k[4]), int(k[5]), int(k[6]), int(k[7]), int(k[8]))
                       for k in keys],
                      dtype=np.float64).reshape(-1, 11)[kinv]
    (act_dense, act_full, act_first, act_last, act_last_tr, ring, act_moe, a2a_buf,
     sel_buf, gathered_rows, hyb) = (acts_k[:, j] for j in range(11))
    # parameters per (tp, ep): every chunk (the routed experts apart), the largest ZeRO unit of the edge stages
    te2, tinv = unique_rows(np.column_stack([tp, epa, eta]))
    tps = te2[:, 0]
    cparams = np.array([[params.chunk_params(model, int(t), pp, int(counts[i]), i == 0, i == nch - 1, seq_len,
                                             dense=int(dense_c[i]), ep=int(x), etp=int(y))
                         for i in range(nch)] for t, x, y in te2], dtype=float)[tinv]
    eparams = np.array([[moe_c[i] * params.layer_expert_params_per_gpu(model, int(x), etp=int(y)) for i in range(nch)]
                        for _, x, y in te2], dtype=float)[tinv]
    lp = np.array([max(params.layer_params_per_gpu(model, int(t)),
                       params.layer_params_per_gpu(model, int(t), is_moe, int(x), int(y))) for t, x, y in te2],
                  dtype=float)[tinv]
    edge_first = np.array([params.chunk_params(model, int(t), pp, 0, True, nch == 1, seq_len) for t in tps],
                          dtype=float)[tinv]
    edge_last = np.array([params.chunk_params(model, int(t), pp, 0, nch == 1, True, seq_len) for t in tps],
                         dtype=float)[tinv]
    stage_params = cparams @ onehot
    stage_experts = eparams @ onehot        # routed-expert parameters of each stage (0 for a dense model)
    stage_rest = stage_params - stage_experts
    def bpp_of(z: int, d: int, g: int) -> tuple[float, float, float]:
        opts = options if g == g_default else replace(options, grad_bytes=g)
        return bytes_per_param(precision, z, d, opts)

    zd, zinv = unique_rows(np.column_stack([zero, dp, g_row]))
    bpp = np.array([bpp_of(int(z), int(d), int(g)) for z, d, g in zd],
                   dtype=float).reshape(-1, 3)[zinv]
    edp = np.maximum(tp * dp // (epa * eta), 1)      # expert-data-parallel group
    ze, zeinv = unique_rows(np.column_stack([zero, edp, g_row]))
    bpp_e = np.array([bpp_of(int(z), int(d), int(g)) for z, d, g in ze],
                     dtype=float).reshape(-1, 3)[zeinv]
    w_share = bpp[:, 0] / BYTES_PER_ELEMENT[precision]   # 1, or 1/d under ZeRO-3
    if fp32_shard is not None and resolved(options, precision)[1]:
        # FSDP_FP32_SHARD: under ZeRO-3 the fp32 shard is the master; the 16-bit weight shard (e / d) is not kept
        fs = (np.asarray(fp32_shard, dtype=float) * (zero == 3))[:, None]
        for b in (bpp, bpp_e):
            master = b[:, 0:1] * (4.0 / BYTES_PER_ELEMENT[precision])   # 4 / d
            b[:, 2:3] -= fs * master
            b[:, 0:1] += fs * (master - b[:, 0:1])
    k_in = in_flight_array(schedule, pp, vpp, num_micro_batches)
    acts = k_in * (mean_dense[None, :] * act_dense[:, None] + mean_moe[None, :] * act_moe[:, None])
    k_first = k_in[:, 0] if vpp == 1 else np.ceil(k_in[:, 0] / vpp)
    buffers = np.zeros((n, pp))
    if zb:
        # the ranks holding the first chunk (the embedding's output per in-flight activation of that chunk) and
        # the last (the LM head's logits): rank 0 for the V, both end ranks for DualPipe's two copies
        on_first, on_last = onehot[0][None, :], onehot[-1][None, :]
        acts += np.ceil(k_in / per_stage[None, :]) * act_first[:, None] * on_first
        acts += act_last[:, None] * on_last
        buffers += act_last_tr[:, None] * on_last
    else:
        acts[:, 0] += k_first * act_first
        acts[:, -1] += act_last
        buffers[:, -1] += act_last_tr
    # activation offloading: one layer's saved activations (mean of the stage's layer kinds), the layers offloaded
    layers_stage = np.maximum(mean_dense + mean_moe, 1e-300)
    per_layer = (mean_dense[None, :] * act_dense[:, None] + mean_moe[None, :] * act_moe[:, None]) / layers_stage
    off_n = (np.zeros(n) if offload is None else np.asarray(offload, dtype=float))[:, None]
    offloaded = k_in * np.minimum(off_n, (mean_dense + mean_moe)[None, :]) * per_layer
    if offload is not None and off_n.any():
        acts = acts - offloaded
        buffers += (off_n > 0) * per_layer
    if cp is not None:
        buffers += ring[:, None]
    full = (rc == RECOMPUTE_ORDER.index("full")).astype(float)[:, None]
    buffers += full * np.maximum(0.0, act_full - act_dense)[:, None]   # (under full recomputation every layer keeps
    #                                                                     its input only, MoE or dense alike)
    # selective recomputation: one layer's recomputed modules rematerialised in its backward
    buffers += np.maximum(0.0, sel_buf)[:, None]
    if is_moe:
        buffers += a2a_buf[:, None]
    # library workspaces and Megatron's global memory buffer: allocated once, held on every stage
    buffers += workspace_bytes(model, comm, options)
    buffers += global_buffer_bytes(model, seq_len, mb, tp, sp, precision, options, gathered_rows)[:, None]
    unit = np.repeat(lp[:, None], pp, axis=1)
    if zb:
        unit = np.maximum(unit, np.where(onehot[0][None, :] > 0, edge_first[:, None], 0.0))
        unit = np.maximum(unit, np.where(onehot[-1][None, :] > 0, edge_last[:, None], 0.0))
    else:
        unit[:, 0] = np.maximum(unit[:, 0], edge_first)
        unit[:, -1] = np.maximum(unit[:, -1], edge_last)
    sharded = ((zero >= 2) & (dp > 1)).astype(float)[:, None]
    z3 = ((zero == 3) & (dp > 1)).astype(float)[:, None]
    buffers += sharded * unit * g_row[:, None] + z3 * options.zero3_live_units * unit * e
    weights = stage_rest * bpp[:, 0:1] + stage_experts * bpp_e[:, 0:1]
    if fp8.is_low_precision(precision):
        # + the FP8 weight and its FP8 transpose / columnwise copy of every transformer-layer GEMM weight (2 bytes
        # per GEMM parameter, sharded like the weights)
        gemm = np.array([fp8.layer_gemm_params_per_gpu(model, int(t)) for t in tps], dtype=float)[tinv]
        gemm_moe = np.array([fp8.layer_gemm_params_per_gpu(model, int(t), True, int(x), int(y)) for t, x, y in te2],
                            dtype=float)[tinv]
        # FP8 primary weights: the GEMM weights are the FP8 weight and its transpose only, no BF16 copy beside
        # them: the two copies in place of the BF16 weight (fp8: 2 bytes per GEMM parameter, as a BF16 weight, nothing
        # added; mxfp8: 2 x (1 + 1/32), 0.0625 added)
        # (mxfp8 / nvfp4: each copy at the format's value + scale bytes per parameter; fp8: 1)
        both = FP8_WEIGHT_COPIES * fp8.weight_copy_bytes(precision)
        copies = (both * (1.0 - f8p) + (both - BYTES_PER_ELEMENT[precision]) * f8p) * w_share
        weights = (weights + (copies * gemm)[:, None] * (dense_c @ onehot)[None, :]
                   + (copies * gemm_moe)[:, None] * (moe_c @ onehot)[None, :])
    out = {"weights": weights, "grads": stage_rest * bpp[:, 1:2] + stage_experts * bpp_e[:, 1:2],
           "optimizer": stage_rest * bpp[:, 2:3] + stage_experts * bpp_e[:, 2:3], "activations": acts,
           "buffers": buffers}
    overheads = comm.gpu and options.device_overheads
    out["framework"] = np.full((n, pp), options.framework_gib * GIB if overheads else 0.0)
    out["nccl"] = nccl_buffer_arrays(comm, pp, vpp, tp=tp, dp=dp, cp=cpa, ep=epa, moe=is_moe,
                                     tied=bool(model.tied_embeddings), options=options, etp=eta, hybridep_bytes=hyb)
    allocated = np.sum([out[k] for k in ALLOCATED_PARTS], axis=0)
    out["allocator"] = allocated * (options.allocator_overhead if overheads else 0.0)
    out["allocator_min"] = allocated * (min(options.allocator_overhead_min, options.allocator_overhead)
                                        if overheads else 0.0)
    return {**out, "allocated": allocated, "params": stage_params, "in_flight": k_in, "offloaded": offloaded,
            "offload_layer_bytes": per_layer}


def estimate_memory(model: ModelSpec, layout: Layout, device: Any = None,
                    options: MemoryOptions = MemoryOptions(), hbm_gib: float | None = None) -> MemoryReport:
    """Per-stage peak memory of `layout`. `device`: a DeviceSpec or Platform (for its HBM size),
    or give `hbm_gib`; without either the capacity is reported as infinite."""
    layout.validate(model)
    if hbm_gib is None and device is not None:
        dev = getattr(device, "device", device)
        hbm_gib = float(dev.hbm_gib)
    capacity = (hbm_gib or float("inf")) * GIB
    one = lambda v: np.array([v])  # noqa: E731
    arr = stage_memory_arrays(model, layout.seq_len, layout.precision, chunk_layer_counts(model, layout),
                              layout.pp, layout.vpp, layout.schedule, tp=one(layout.tp),
                              dp=one(layout.dp * layout.cp), cp=one(layout.cp), ep=one(layout.ep),
                              etp=one(layout.expert_tp),
                              zero_stage=one(layout.zero_stage), micro_batch=one(layout.micro_batch),
                              num_micro_batches=one(layout.num_micro_batches),
                              recompute=one(RECOMPUTE_ORDER.index(layout.recompute)),
                              sequence_parallel=one(int(layout.sequence_parallel)), options=options,
                              comm=DeviceComm.of(device) if device is not None else None,
                              grad_bytes=one(layout.grad_bytes), fp8_param=one(int(layout.fp8_param_gather)),
                              offload=one(layout.offload_activations),
                              recompute_modules=one(recompute_mask(model, layout)),
                              fp32_shard=one(int(layout.framework in FSDP_FP32_SHARD)),
                              moe_dispatcher=one(MOE_DISPATCHERS.index(layout.moe_dispatcher)))
    return report_from_arrays(arr, 0, stage_layer_counts(model, layout), capacity, options)


def report_from_arrays(arr: dict[str, np.ndarray], row: int, layers_by_stage: list[list[int]], capacity_bytes: float,
                       options: MemoryOptions = MemoryOptions()) -> MemoryReport:
    """The MemoryReport of row `row` of `stage_memory_arrays`' answer."""
    stages = [StageMemory(stage=s, layers=sum(layers_by_stage[s]), params=int(arr["params"][row, s]),
                          weights_bytes=float(arr["weights"][row, s]), grads_bytes=float(arr["grads"][row, s]),
                          optimizer_bytes=float(arr["optimizer"][row, s]),
                          activations_bytes=float(arr["activations"][row, s]),
                          buffers_bytes=float(arr["buffers"][row, s]), framework_bytes=float(arr["framework"][row, s]),
                          in_flight=float(arr["in_flight"][row, s]), nccl_bytes=float(arr["nccl"][row, s]),
                          allocator_bytes=float(arr["allocator"][row, s]),
                          allocator_min_bytes=float(arr["allocator_min"][row, s]) if "allocator_min" in arr else 0.0,
                          offloaded_bytes=float(arr["offloaded"][row, s]) if "offloaded" in arr else 0.0)
              for s in range(arr["params"].shape[1])]
    return MemoryReport(stages=stages, capacity_bytes=capacity_bytes,
                        usable_bytes=capacity_bytes * (1.0 - options.allocator_reserve), options=options)


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

"""FP8 training precision, Transformer-Engine style: what runs in FP8, and how its time and memory are derived.

`precision="fp8"` means what NVIDIA Transformer Engine (TE) does under `te.fp8_autocast` with the default
`DelayedScaling(fp8_format=Format.HYBRID)` recipe, as Megatron-LM (`--fp8-format hybrid`) and llm-foundry
(`precision: amp_fp8`) run it:

  FP8 (e4m3 forward, e5m2 gradients), BF16 output:
      the linear layers of every transformer layer: qkv_proj, attn_out_proj, mlp_up (GeLU fc1 / SwiGLU gate+up),
      mlp_down (`FP8_GEMM_OPS`; TE's Linear / LayerNormLinear / LayerNormMLP modules)
  BF16 (as under precision="bf16"):
      the embedding, the LM head (Megatron and llm-foundry keep the output layer out of fp8_autocast), the
      attention core (flash / Triton attention, or QK^T-softmax-AV), norms, residual adds, activations (GeLU,
      SwiGLU), RoPE, cross-entropy, the optimizer (fp32 master weights and moments as for bf16), and every
      collective (tensor-parallel, pipeline and data-parallel traffic in BF16, gradients reduced in fp32 as for
      bf16; TE's FP8 all-gather of sequence-parallel inputs is not modelled)

Operator times (nobody sampled FP8 kernels here; the regressors were sampled in bf16/fp16):

  FP8 GEMM = the BF16 GEMM prediction with its compute-bound share scaled by the device's achievable matmul ratio
             r = MAMF_bf16 / MAMF_fp8 (H100 SXM 794.5 / 1402.6 = 0.566, ml-engineering MAMF tables; the dense
             peak ratio where no FP8 MAMF is published, flagged as such), never below FLOPs / MAMF_fp8:
                 t_gemm = t_bf16 * (1 - f_c * (1 - r)),   f_c = t_c / (t_c + t_m)
             with t_c = FLOPs / MAMF_bf16 and t_m = BF16 bytes / HBM bandwidth (the GEMM's roofline shares),
           + the FP8 cast / amax / transpose kernels of that GEMM as memory-bound elementwise work at the HBM
             bandwidth (a lower bound on their time): per micro-batch
                 forward   the activation input X [M, K]: read BF16 (2 B), write FP8 X and X^T (1 + 1 B)  4 M K
                           the weight W [K, N]: read BF16, write FP8 W and W^T                           4 K N
                 backward  the output gradient dY [M, N]: read BF16, write FP8 dY and dY^T               4 M N
             (Hopper FP8 GEMMs take only the TN layout, hence TE's fused cast-transpose; amax reductions are fused
             into the casts). The weight cast is charged every micro-batch, as FSDP (llm-foundry) re-gathers and
             re-casts; Megatron's `is_first_microbatch` caches it over gradient accumulation, so for Megatron it
             is an overestimate of 4 K N bytes per GEMM and later micro-batch.
  Provenance of those calls: "<bf16 provenance> (FP8 from BF16 samples x MAMF ratio)" (or "x peak ratio").

MFU of an fp8 run is reported against the device's BF16 dense peak (as NVIDIA's Megatron / NeMo performance
tables do), so it can exceed the BF16 MAMF share; the FP8 GEMM floor keeps it at or below MAMF_fp8 / peak_bf16.

Memory (predictor.step.memory): BF16 weights + an FP8 copy of every transformer-layer GEMM weight (+1 byte per GEMM
parameter, sharded like the weights; TE keeps it, and its transpose is transient), the GEMM inputs saved for
backward in FP8 (TE saves the FP8 cast of the input; 1 byte instead of 2), the rest BF16.

Block-scaled recipes (`precision="mxfp8"`, `precision="nvfp4"`): the same GEMMs (`FP8_GEMM_OPS`) under TE's
`MXFP8BlockScaling` / `Float8BlockScaling` / `NVFP4BlockScaling` recipes, everything else BF16 as above. Which
device runs which is `scaled_formats` in devices.json ("blockwise": Hopper; "mx": Blackwell's block-scaled
tensor-core MMA); a device without it is refused (InfeasibleConfig on `precision`, naming the GPUs that have it).

  mxfp8 on Blackwell ("mx"): MXFP8, E4M3 values with one E8M0 scale byte per 32 elements (OCP Microscaling Formats
        v1.0), for the forward and both backward GEMMs. Blackwell's tensor cores apply the block scales in the MMA at
        the FP8 rate (B200 / GB200 datasheets list one dense FP8/FP6 peak), so the compute share takes the FP8
        ratio r as for fp8.
  mxfp8 on Hopper ("blockwise"): DeepSeek-V3-style blockwise FP8 (TE Float8BlockScaling): 1x128 activation tiles and
        128x128 weight blocks with FP32 scales (4 bytes per 128 elements = 1/32 byte per element, as MX), applied by
        CUDA cores between the tensor-core MMAs ("promotion"). Hopper has no block-scaled MMA, so the compute share
        runs at r / HOPPER_BLOCKWISE_EFFICIENCY, the efficiency being DeepGEMM's best dense blockwise FP8 rate on
        H800 (README: "1350+ FP8 TFLOPS"; H800's SXM tensor cores are H100's) over the per-tensor FP8 MAMF of H100
        SXM (1402.6, ml-engineering): 0.963.
  nvfp4 (Blackwell only, "mx"): NVFP4, E2M1 values (half a byte) with one E4M3 scale byte per 16 elements and one FP32
        scale per tensor (NVIDIA, "Pretraining LLMs with NVFP4", 2025; TE NVFP4BlockScaling), for all three GEMMs.
        No FP4 MAMF is published: r_nvfp4 = r_fp8 x peak_fp8 / peak_fp4 (the datasheets' dense peaks, B200 4.5 /
        9 PFLOP/s), i.e. FP4 kernels assumed to reach the share of their peak that FP8 kernels reach of theirs.
        The 16-point random Hadamard transform of the wgrad inputs is fused into the quantize kernel in TE (not
        charged separately); layers a recipe keeps in BF16 (the paper keeps the last few) are not modelled.

  Cast / scale passes (TE's quantize kernels are memory-bound passes over the tensor): read BF16 (2 B), write a
  rowwise and a columnwise quantized copy (block scaling runs along K, which differs for X and X^T), each with its
  scales, per element  2 + 2 x (value bytes + scale bytes):  fp8 4, mxfp8 4.0625, nvfp4 3.125 bytes, on the same
  tensors as fp8 (X and W forward, dY backward).
  Provenance: "<bf16 provenance> (<format> derived: <rule>)"; expected error FP8_ASSUMED_ERROR (mxfp8) and
  NVFP4_ASSUMED_ERROR (nvfp4: a peak ratio, no measured MAMF).
  Memory: the saved GEMM inputs and the extra weight copies at value + scale bytes (mxfp8 1 + 1/32, nvfp4 0.5 + 1/16)
  per element instead of fp8's 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from predictor.model import ops, params
from predictor.regress import features

FP8_GEMM_OPS = frozenset({"qkv_proj", "attn_out_proj", "mlp_up", "mlp_down"})
COMPUTE_PRECISION = "bf16"  # what the non-FP8 operators and the regressors run in under precision="fp8"
FP8_PROVENANCE = "FP8 from BF16 samples x MAMF ratio"
FP8_PEAK_PROVENANCE = "FP8 from BF16 samples x peak ratio (no published FP8 MAMF)"
FP8_ASSUMED_ERROR = 0.25    # expected relative error of an FP8 GEMM time: not measured, so not the BF16 CV MAPE
CAST_BYTES_PER_ELEMENT = 4.0  # read BF16 (2) + write the FP8 copy (1) and its transpose (1)
NVFP4_ASSUMED_ERROR = 0.35  # nvfp4 GEMMs rest on a datasheet peak ratio, no measured FP4 MAMF
# DeepGEMM (github.com/deepseek-ai/DeepGEMM README): "1350+ FP8 TFLOPS" dense blockwise-scaled FP8 on H800, over the
# per-tensor FP8 MAMF of H100 SXM, 1402.6 TFLOP/s (ml-engineering mamf_fp8.csv)
HOPPER_BLOCKWISE_EFFICIENCY = 1350.0 / 1402.6


@dataclass(frozen=True)
class ScaledFormat:
    """A low-precision GEMM recipe: the bytes of one value and of its scales per element."""
    precision: str
    value_bytes: float         # one quantized element
    scale_bytes: float         # scale bytes per element (block scales; 0 for per-tensor scaling)
    label: str
    assumed_error: float       # expected relative error of one of its GEMM times (derived, never measured)

    @property
    def cast_bytes_per_element(self) -> float:
        """Read BF16 + a rowwise and a columnwise quantized copy with their scales."""
        return 2.0 + 2.0 * (self.value_bytes + self.scale_bytes)

    @property
    def stored_bytes_per_element(self) -> float:
        """One quantized copy with its scales (a saved GEMM input, an extra weight copy)."""
        return self.value_bytes + self.scale_bytes


FORMATS: dict[str, ScaledFormat] = {
    "fp8": ScaledFormat("fp8", 1.0, 0.0, "FP8 (per-tensor delayed / current scaling)", FP8_ASSUMED_ERROR),
    "mxfp8": ScaledFormat("mxfp8", 1.0, 1.0 / 32, "MXFP8 / blockwise FP8 (one scale per 32 elements, or FP32 per "
                                                   "1x128 tile on Hopper)", FP8_ASSUMED_ERROR),
    "nvfp4": ScaledFormat("nvfp4", 0.5, 1.0 / 16, "NVFP4 (E2M1, one E4M3 scale per 16 elements)",
                          NVFP4_ASSUMED_ERROR),
}
LOW_PRECISIONS = tuple(FORMATS)


def is_low_precision(precision: str) -> bool:
    """fp8, mxfp8, nvfp4: the transformer layers' GEMMs in a scaled low-precision format, the rest BF16."""
    return precision in FORMATS


def base_precision(precision: str) -> str:
    """The precision the regressors are asked for: bf16 under fp8 / mxfp8 / nvfp4 (everything but their GEMMs is
    BF16)."""
    return COMPUTE_PRECISION if is_low_precision(precision) else precision


def is_fp8_gemm(op: str, precision: str) -> bool:
    """Whether `op` runs in the low-precision format of `precision` (fp8, mxfp8 or nvfp4)."""
    return is_low_precision(precision) and op in FP8_GEMM_OPS


def saved_input_bytes(precision: str, default: float) -> float:
    """Bytes per element of a low-precision GEMM's input saved for backward (fp8 1, mxfp8 1 + 1/32, nvfp4
    0.5 + 1/16); `default` (the precision's element size) otherwise."""
    f = FORMATS.get(precision)
    return f.stored_bytes_per_element if f else default


def weight_copy_bytes(precision: str) -> float:
    """Bytes per GEMM parameter of one quantized weight copy (fp8 1)."""
    return FORMATS[precision].stored_bytes_per_element


def matmul_ratio(device: Any) -> tuple[float, bool]:
    """(MAMF_bf16 / MAMF_fp8, from_mamf): the achievable matmul ratio of `device`, else its dense peak ratio
    (from_mamf False: flagged in the provenance)."""
    ach = device.achievable_matmul_tflops or {}
    b, f = ach.get("bf16") or ach.get("fp16"), ach.get("fp8")
    if b and f:
        return float(b) / float(f), True
    pb, pf = device.peak_tflops.get("bf16") or device.peak_tflops.get("fp16"), device.peak_tflops.get("fp8")
    if not pb or not pf:
        raise ValueError(f"{device.name} has no fp8 peak")
    return float(pb) / float(pf), False


def format_ratio(device: Any, precision: str) -> tuple[float, str]:
    """(t_compute(format) / t_compute(BF16), the rule in words) for the GEMMs of `precision` on `device`
    (see the module docstring)."""
    r, from_mamf = matmul_ratio(device)
    if precision == "fp8":
        return r, FP8_PROVENANCE if from_mamf else FP8_PEAK_PROVENANCE
    basis = "FP8 MAMF ratio" if from_mamf else "FP8 peak ratio (no published FP8 MAMF)"
    kind = scaled_format_kind(device, precision)
    if precision == "mxfp8":
        if kind == "blockwise":
            return r / HOPPER_BLOCKWISE_EFFICIENCY, (
                f"blockwise FP8 derived: BF16 samples x {basis} / {HOPPER_BLOCKWISE_EFFICIENCY:.3f} (Hopper scales "
                "on CUDA cores, DeepGEMM rate) + cast/scale passes")
        return r, f"MXFP8 derived: BF16 samples x {basis} (block-scaled MMA at the FP8 rate) + cast/scale passes"
    if precision == "nvfp4":
        p8, p4 = device.peak_tflops.get("fp8"), device.peak_tflops.get("fp4")
        if not p8 or not p4:
            raise ValueError(f"{device.name} has no fp8 / fp4 peak")
        return r * float(p8) / float(p4), (f"NVFP4 derived: BF16 samples x {basis} x peak fp8/fp4 "
                                           f"{float(p8):g}/{float(p4):g} (datasheet) + cast/scale passes")
    raise ValueError(f"{precision} is not a low-precision GEMM format ({', '.join(LOW_PRECISIONS)})")


def scaled_format_kind(device: Any, precision: str) -> str:
    """How `device` runs `precision` ("" for fp8: per-tensor scaling needs only FP8 tensor cores)."""
    if precision == "fp8":
        return ""
    return str((getattr(device, "scaled_formats", None) or {}).get(precision, ""))


def cast_bytes(op: str, pass_: str, shapes: Any, precision: str = "fp8") -> np.ndarray:
    """HBM bytes of the cast / transpose / scale kernels one call of GEMM `op` adds (see the module docstring)."""
    d = features._dims(features.shape_arrays(shapes))
    M, N, K, _ = features.gemm_mnk(op, d)
    per = CAST_BYTES_PER_ELEMENT if precision == "fp8" else FORMATS[precision].cast_bytes_per_element
    if pass_ == "bwd":
        return per * M * N
    return per * (M * K + K * N)


def gemm_times(op: str, pass_: str, shapes: Any, t_bf16: np.ndarray, device: Any, ach_bf16: float | None,
               precision: str = "fp8") -> tuple[np.ndarray, np.ndarray, str]:
    """(seconds per call, floor seconds, provenance suffix) of the low-precision GEMM `op` (fp8, mxfp8, nvfp4) from
    its BF16 time `t_bf16`."""
    r, how = format_ratio(device, precision)
    flops, byts = features.op_work(op, shapes, COMPUTE_PRECISION, pass_)
    flops, byts = np.asarray(flops, dtype="float64"), np.asarray(byts, dtype="float64")
    ach = ach_bf16 or device.peak_flops(COMPUTE_PRECISION)
    bw = device.hbm_bytes_per_s
    t_c, t_m = flops / ach, byts / bw
    f_c = t_c / np.maximum(t_c + t_m, 1e-30)
    floor = flops / (ach / r)
    t = np.maximum(np.asarray(t_bf16, dtype="float64") * (1.0 - f_c * (1.0 - r)), floor)
    t = t + cast_bytes(op, pass_, shapes, precision) / bw
    return t, floor, how


# The cast passes a measured low-precision grid GEMM leaves out (`grid_cast_bytes`)
CAST_RULE = "cast passes (derived)"


@dataclass(frozen=True)
class FormatGrid:
    """A measured GEMM grid that times `precision`'s GEMMs on a device: the regressor's op and the words for it."""
    op: str
    roofline_precision: str
    label: str


def format_grid(device: Any, precision: str) -> FormatGrid | None:
    """Which published low-precision GEMM grid (ops.FORMAT_GEMMS) times the GEMMs of `precision` on `device`:
    fp8 the per-tensor FP8 grid; mxfp8 on Hopper ("blockwise") the blockwise FP8 grid, the recipe itself (1x128
    activation / 128x128 weight tiles with FP32 scales, TE Float8BlockScaling); mxfp8 on Blackwell ("mx") the same
    blockwise grid, which Blackwell runs on its block-scaled MMA (scales per 128 elements instead of MXFP8's 32: the
    closest format a table measures, said so); nvfp4 the NVFP4 grid. None for other precisions."""
    kind = scaled_format_kind(device, precision) if precision in FORMATS else ""
    if precision == "fp8":
        table, label = "fp8", "per-tensor FP8 GEMM grid"
    elif precision == "mxfp8" and kind == "blockwise":
        table, label = "fp8_block", "blockwise FP8 GEMM grid"
    elif precision == "mxfp8" and kind == "mx":
        table, label = "fp8_block", "blockwise FP8 GEMM grid as MXFP8 (128- not 32-element scale blocks)"
    elif precision == "nvfp4":
        table, label = "nvfp4", "NVFP4 GEMM grid"
    else:
        return None
    f = ops.FORMAT_GEMMS[table]
    return FormatGrid(f.op, f.roofline_precision, label)


def grid_cast_bytes(op: str, pass_: str, shapes: Any, precision: str) -> np.ndarray:
    """HBM bytes of the cast passes a measured grid GEMM leaves out, less those it times that training does not run
    (negative where the second outweighs the first). The grid times a TensorRT-LLM `Linear.forward` of a BF16 input
    with a pre-quantized weight (aiconfigurator `collect_gemm.py`): the input's rowwise quantize, read BF16 and write
    one quantized copy, (2 + q) bytes per element with q = value + scale bytes, is inside each timing. Against
    `cast_bytes` (what Transformer Engine runs, c bytes per element):
        forward   + (c - (2 + q)) M K (X's columnwise copy)  + c K N (the weight's casts, not in the grid)
        backward  + (c - (2 + q)) M N (dY's columnwise copy)  - (2 + q) K M (the weight-gradient GEMM's timed input
                  quantize: its input X^T was saved quantized in the forward)"""
    d = features._dims(features.shape_arrays(shapes))
    M, N, K, _ = features.gemm_mnk(op, d)
    timed = 2.0 + FORMATS[precision].stored_bytes_per_element
    te = cast_bytes(op, pass_, shapes, precision)
    if pass_ == "bwd":
        return te - timed * M * N - timed * K * M
    return te - timed * M * K


def measured_gemm_times(op: str, pass_: str, shapes: Any, t_format: np.ndarray, device: Any, ach_bf16: float | None,
                        precision: str) -> tuple[np.ndarray, np.ndarray]:
    """(seconds per call, floor seconds) of the low-precision GEMM `op` from its measured time in the format's
    grid `t_format` (the GEMMs of the pass, each with its input's quantize, less the grid's fixed per-call quantize
    latency: predict._kernel_format_gemm): plus the cast passes the grid leaves
    out, less the one it times that training does not run (`grid_cast_bytes`), never below the format's achievable
    floor (as `gemm_times`)."""
    r, _ = format_ratio(device, precision)
    flops, _ = features.op_work(op, shapes, COMPUTE_PRECISION, pass_)
    ach = ach_bf16 or device.peak_flops(COMPUTE_PRECISION)
    floor = np.asarray(flops, dtype="float64") / (ach / r)
    t = np.asarray(t_format, dtype="float64") + grid_cast_bytes(op, pass_, shapes, precision) / device.hbm_bytes_per_s
    return np.maximum(t, floor), floor


def mfu_peak_precision(precision: str) -> str:
    """Which dense peak MFU is reported against: BF16 for fp8 / mxfp8 / nvfp4 runs (NVIDIA's convention), else the
    precision's."""
    return COMPUTE_PRECISION if is_low_precision(precision) else precision


def layer_gemm_params_per_gpu(model: Any, tp: int, moe: bool = False, ep: int = 1, etp: int = 1) -> float:
    """Parameters of one layer's FP8 GEMMs on one tensor-parallel rank (what gets an FP8 copy); `moe`: a MoE layer,
    whose attention and shared experts are split over tp and whose num_experts / ep routed experts are whole here
    (the router stays in higher precision)."""
    if moe and model.is_moe:
        shared = model.shared_experts * params.mlp_params(model, model.shared_ffn)
        split = params.attention_matmul_params(model) + shared
        if model.is_mla:   # MLA's down projections are replicated over tp (predictor.model.params)
            split += params.mla_down_params(model) * (tp - 1)
        return split / tp + model.num_experts // max(ep, 1) * params.mlp_params(model, model.expert_ffn) / max(etp, 1)
    if model.is_mla:
        return (params.layer_matmul_params(model) + params.mla_down_params(model) * (tp - 1)) / tp
    return params.layer_matmul_params(model) / tp

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
"""
from __future__ import annotations

from typing import Any

import numpy as np

from predictor.model import params
from predictor.regress import features

FP8_GEMM_OPS = frozenset({"qkv_proj", "attn_out_proj", "mlp_up", "mlp_down"})
COMPUTE_PRECISION = "bf16"  # what the non-FP8 operators and the regressors run in under precision="fp8"
FP8_PROVENANCE = "FP8 from BF16 samples x MAMF ratio"
FP8_PEAK_PROVENANCE = "FP8 from BF16 samples x peak ratio (no published FP8 MAMF)"
FP8_ASSUMED_ERROR = 0.25    # expected relative error of an FP8 GEMM time: not measured, so not the BF16 CV MAPE
CAST_BYTES_PER_ELEMENT = 4.0  # read BF16 (2) + write the FP8 copy (1) and its transpose (1)


def base_precision(precision: str) -> str:
    """The precision the regressors are asked for: bf16 under fp8 (everything but the FP8 GEMMs is BF16)."""
    return COMPUTE_PRECISION if precision == "fp8" else precision


def is_fp8_gemm(op: str, precision: str) -> bool:
    return precision == "fp8" and op in FP8_GEMM_OPS


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


def cast_bytes(op: str, pass_: str, shapes: Any) -> np.ndarray:
    """HBM bytes of the FP8 cast / transpose kernels one call of GEMM `op` adds (see the module docstring)."""
    d = features._dims(features.shape_arrays(shapes))
    M, N, K, _ = features.gemm_mnk(op, d)
    if pass_ == "bwd":
        return CAST_BYTES_PER_ELEMENT * M * N
    return CAST_BYTES_PER_ELEMENT * (M * K + K * N)


def gemm_times(op: str, pass_: str, shapes: Any, t_bf16: np.ndarray, device: Any, ach_bf16: float | None
               ) -> tuple[np.ndarray, np.ndarray, str]:
    """(seconds per call, FP8 floor seconds, provenance suffix) of FP8 GEMM `op` from its BF16 time `t_bf16`."""
    r, from_mamf = matmul_ratio(device)
    flops, byts = features.op_work(op, shapes, COMPUTE_PRECISION, pass_)
    flops, byts = np.asarray(flops, dtype="float64"), np.asarray(byts, dtype="float64")
    ach = ach_bf16 or device.peak_flops(COMPUTE_PRECISION)
    bw = device.hbm_bytes_per_s
    t_c, t_m = flops / ach, byts / bw
    f_c = t_c / np.maximum(t_c + t_m, 1e-30)
    floor = flops / (ach / r)
    t = np.maximum(np.asarray(t_bf16, dtype="float64") * (1.0 - f_c * (1.0 - r)), floor)
    t = t + cast_bytes(op, pass_, shapes) / bw
    return t, floor, FP8_PROVENANCE if from_mamf else FP8_PEAK_PROVENANCE


def mfu_peak_precision(precision: str) -> str:
    """Which dense peak MFU is reported against: BF16 for fp8 runs (NVIDIA's convention), else the precision's."""
    return COMPUTE_PRECISION if precision == "fp8" else precision


def layer_gemm_params_per_gpu(model: Any, tp: int, moe: bool = False, ep: int = 1) -> float:
    """Parameters of one layer's FP8 GEMMs on one tensor-parallel rank (what gets an FP8 copy); `moe`: a MoE layer,
    whose attention and shared experts are split over tp and whose num_experts / ep routed experts are whole here
    (the router stays in higher precision)."""
    if moe and model.is_moe:
        shared = model.shared_experts * params.mlp_params(model, model.shared_ffn)
        split = params.attention_matmul_params(model) + shared
        return split / tp + model.num_experts // max(ep, 1) * params.mlp_params(model, model.expert_ffn)
    return params.layer_matmul_params(model) / tp

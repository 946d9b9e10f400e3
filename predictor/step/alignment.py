"""Shapes that tensor cores run slowly: GEMM dimensions that are not multiples of 8 elements.

Tensor-core GEMMs in fp16/bf16 need their operands' dimensions (and the addresses of strided views into them) in
multiples of 16 bytes, 8 elements; cuBLAS otherwise falls back to kernels that do not use the tensor cores (NVIDIA,
"Matrix Multiplication Background User's Guide", tensor-core requirements). The operator samples behind the
regressors were taken at aligned shapes, so the regressors cannot know; `simt_floor_s` charges such a GEMM at least
its FLOPs at the device's non-tensor-core FP32 peak (the spec sheet's figure, `peak_tflops.fp32`: 19.5 TFLOP/s on an
A100 against 312 with tensor cores). Nothing in it is fitted. Measured BLOOM-176B candidates with head dimension 450
or 150 (hidden 14,400 with 32 or 96 heads; attention scores and context are batched GEMMs over the head dimension)
ran 25 % slower than predicted without it, while their aligned neighbours were within a few per cent; with it the
gap is about halved (README, Accuracy). Predictions of such layouts keep a warning, and their error band is the
measured error of those runs.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from predictor.model.specs import Layout, ModelSpec

ALIGN_ELEMENTS = 8
# the precisions whose GEMMs run on the tensor cores (fp32 GEMMs do not need the alignment)
TENSOR_CORE_PRECISIONS = ("fp16", "bf16", "fp8", "mxfp8", "nvfp4")


def uses_tensor_cores(precision: str) -> bool:
    """Whether GEMMs in this precision run on the tensor cores (and so need aligned shapes)."""
    return precision in TENSOR_CORE_PRECISIONS


def unaligned_dims(model: ModelSpec, layout: Layout) -> dict[str, int]:
    """GEMM dimensions of one rank that are not multiples of 8 elements: name -> size."""
    return unaligned_dims_at(model, layout.tp)


def unaligned_dims_at(model: ModelSpec, tp: int) -> dict[str, int]:
    """`unaligned_dims` for a tensor-parallel degree (a search row has no Layout)."""
    if model.is_mla:   # MLA's head dimensions are its own (ModelSpec validates them as multiples of 8)
        dims = {"query / key head dimension": model.qk_head_size, "value head dimension": model.v_head_size,
                "hidden per TP rank": model.hidden_size // tp if model.hidden_size % tp == 0 else model.hidden_size,
                "FFN width per TP rank": model.ffn // tp if model.ffn % tp == 0 else model.ffn}
        return {k: v for k, v in dims.items() if v % ALIGN_ELEMENTS}
    dims = {"head dimension (hidden / heads)": model.head_size,
            "hidden per TP rank": model.hidden_size // tp if model.hidden_size % tp == 0 else model.hidden_size,
            "FFN width per TP rank": model.ffn // tp if model.ffn % tp == 0 else model.ffn}
    return {k: v for k, v in dims.items() if v % ALIGN_ELEMENTS}


def shape_flagged(model: ModelSpec, tp: int, precision: str) -> bool:
    """Whether a layout's GEMM shapes are outside what the samples cover (tensor-core precisions only)."""
    return uses_tensor_cores(precision) and bool(unaligned_dims_at(model, tp))


def alignment_warning(model: ModelSpec, layout: Layout) -> str | None:
    bad = unaligned_dims(model, layout)
    if not bad or not uses_tensor_cores(layout.precision):
        return None
    what = ", ".join(f"{k} {v}" for k, v in bad.items())
    return (f"Tensor cores need GEMM dimensions in multiples of {ALIGN_ELEMENTS}; here {what} is not. The GEMMs "
            f"with such a dimension are charged at no more than the GPU's FP32 (non-tensor-core) peak, a spec-sheet "
            f"bound, not a measurement (published BLOOM candidates with head dimension 450 or 150 still ran ~14 % "
            f"slower than predicted with it). Prefer sizes that are multiples of 64.")


def simt_floor_s(op: str, pass_: str, arrays: dict[str, Any], device: Any, precision: str) -> np.ndarray | float:
    """Per shape row: the least time of a GEMM (features.TENSOR_CORE_GEMM_OPS) whose N or K (the widths of its
    operands' rows; M, the token count, may be anything) is not a multiple of 8 elements, run without tensor
    cores: its FLOPs at the device's FP32 peak. 0 for aligned rows, other operators, precisions that do not use
    tensor cores (`precision` is the one the regressors run: bf16 under fp8) and devices without a stated FP32
    peak."""
    from predictor.regress import features
    if not uses_tensor_cores(precision) or op not in features.TENSOR_CORE_GEMM_OPS:
        return 0.0
    fp32 = float((getattr(device, "peak_tflops", None) or {}).get("fp32") or 0.0) * 1e12
    if fp32 <= 0:
        return 0.0
    d = features._dims(arrays)
    _m, N, K, _b = features.gemm_mnk(op, d)   # the rows (M: tokens) may be any number; the operands' widths may not
    bad = (np.mod(N, ALIGN_ELEMENTS) != 0) | (np.mod(K, ALIGN_ELEMENTS) != 0)
    if not bad.any():
        return 0.0
    flops, _ = features._work(op, pass_, arrays, precision, d)
    return np.where(bad, np.asarray(flops, dtype="float64") / fp32, 0.0)

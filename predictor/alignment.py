"""Shapes that tensor cores run slowly: GEMM dimensions that are not multiples of 8 elements.

Tensor-core GEMMs in fp16/bf16 need the inner dimensions to be multiples of 8 elements (16 bytes); cuBLAS
otherwise pads or falls back to slower kernels (NVIDIA, "Matrix Multiplication Background User's Guide",
tensor-core requirements). The operator samples behind the regressors were taken at aligned shapes, so a
prediction for an unaligned one is extrapolated: measured BLOOM-176B candidates with head dimensions 450 and 150
(hidden 14,400 with 32 or 96 heads) ran about 35 % slower than predicted, while their aligned neighbours were
within 3-15 %. This module only says so; it does not guess a slowdown.
"""
from __future__ import annotations

from .specs import Layout, ModelSpec

ALIGN_ELEMENTS = 8


def unaligned_dims(model: ModelSpec, layout: Layout) -> dict[str, int]:
    """GEMM dimensions of one rank that are not multiples of 8 elements: name -> size."""
    return unaligned_dims_at(model, layout.tp)


def unaligned_dims_at(model: ModelSpec, tp: int) -> dict[str, int]:
    """`unaligned_dims` for a tensor-parallel degree (a search row has no Layout)."""
    dims = {"head dimension (hidden / heads)": model.head_size,
            "hidden per TP rank": model.hidden_size // tp if model.hidden_size % tp == 0 else model.hidden_size,
            "FFN width per TP rank": model.ffn // tp if model.ffn % tp == 0 else model.ffn}
    return {k: v for k, v in dims.items() if v % ALIGN_ELEMENTS}


def shape_flagged(model: ModelSpec, tp: int, precision: str) -> bool:
    """Whether a layout's GEMM shapes are outside what the samples cover (tensor-core precisions only)."""
    return precision != "fp32" and bool(unaligned_dims_at(model, tp))


def alignment_warning(model: ModelSpec, layout: Layout) -> str | None:
    bad = unaligned_dims(model, layout)
    if not bad or layout.precision == "fp32":
        return None
    what = ", ".join(f"{k} {v}" for k, v in bad.items())
    return (f"Tensor cores need GEMM dimensions in multiples of {ALIGN_ELEMENTS}; here {what} is not. The samples "
            f"were taken at aligned shapes, so this may run much slower than predicted (published BLOOM candidates "
            f"with head dimension 450 or 150 ran ~35 % slower than this model predicts). Prefer sizes that are "
            f"multiples of 64.")

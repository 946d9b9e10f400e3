"""Liger-Kernel benchmark tables (`benchmark/data/all_benchmark_data*.csv`, github.com/linkedin/Liger-Kernel).

One row per (kernel, provider, mode, metric, swept x value, GPU): `y_value_50` the median of
`triton.testing.do_bench` in `metric_unit` (ms for `metric_name` speed), the other shape fields as JSON in
`extra_benchmark_config_str`. Mapped onto the store (op_samples), speed rows only, forward and backward modes
(`full` = forward + backward in one timing is skipped: the store keeps passes apart):

  rms_norm, megatron_rms_norm     rmsnorm: batch 1, seq = M, hidden = H
  layer_norm                      layernorm: batch 1, seq = M, hidden = N
  swiglu, megatron_swiglu         swiglu: tp 1, batch = B, seq = T, hidden = hidden_size, ffn_hidden = intermediate_size
  cross_entropy, megatron_cross_entropy   cross_entropy: tp 1, batch = B, seq = T, vocab = V
  rope                            rope: tp 1, batch = B (1 if unstated), seq = seq_len or T, hidden = hidden_size,
                                  heads = num_q_heads, kv_heads = num_kv_heads

`variant` is the kernel provider (liger, torch, huggingface, megatron, ...): different kernels of one operator.
Rows of other kernels, of a GPU no platform of the catalog is (`GPU_PLATFORMS`), or without a stated dtype are
skipped, counted by reason. A stated dtype the project does not know, a missing column or a bad median rejects
the whole file with the field named.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from predictor.samples.formats.common import (
    FilePlan,
    FormatError,
    ParsedFile,
    _finish,
    _platform_entry,
    _text,
    read_frame,
    require_columns,
    start_checks,
)

SOURCE_REPO = "linkedin/Liger-Kernel"
LICENCE = "BSD-2-Clause"
COLUMNS = ("kernel_name", "kernel_provider", "kernel_operation_mode", "metric_name", "metric_unit", "x_name",
           "x_value", "y_value_50", "extra_benchmark_config_str", "gpu_name")
GPU_PLATFORMS = {"NVIDIA H100 80GB HBM3": "dgx-h100", "NVIDIA B200": "dgx-b200",
                 "NVIDIA A100-SXM4-80GB": "dgx-a100-80gb", "NVIDIA H100 PCIe": "pcie-h100-8"}
DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32", "bfloat16": "bf16",
          "float16": "fp16", "float32": "fp32"}
KERNELS = {"rms_norm": "rmsnorm", "megatron_rms_norm": "rmsnorm", "layer_norm": "layernorm", "swiglu": "swiglu",
           "megatron_swiglu": "swiglu", "cross_entropy": "cross_entropy", "megatron_cross_entropy": "cross_entropy",
           "rope": "rope"}
MODES = {"forward": "fwd", "backward": "bwd"}
UNIT_S = {"ms": 1e-3, "us": 1e-6, "s": 1.0}
# op -> {store column: config keys to try, in order}
SHAPES: dict[str, dict[str, tuple[str, ...]]] = {
    "rmsnorm": {"seq": ("M",), "hidden": ("H", "N", "hidden_size")},
    "layernorm": {"seq": ("M",), "hidden": ("N", "H", "hidden_size")},
    "swiglu": {"batch": ("B",), "seq": ("T", "seq_len"), "hidden": ("hidden_size",),
               "ffn_hidden": ("intermediate_size",)},
    "cross_entropy": {"batch": ("B",), "seq": ("T", "seq_len"), "vocab": ("V",)},
    "rope": {"batch": ("B", "bsz"), "seq": ("seq_len", "T"), "hidden": ("hidden_size", "H"),
             "heads": ("num_q_heads",), "kv_heads": ("num_kv_heads",)},
}
SHAPE_COLS = ("tp", "batch", "seq", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab")


def detect(cols: set[str]) -> bool:
    return {"kernel_name", "kernel_provider", "kernel_operation_mode", "y_value_50"} <= cols


def _config(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, str) or not raw.strip():
        return {}
    try:
        v = json.loads(raw)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


def parse_liger(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    df = read_frame(data, plan.path)
    require_columns(df, COLUMNS, plan.path, COLUMNS)
    checks = start_checks(df, plan)
    n = len(df)
    kern, mode = _text(df["kernel_name"]), _text(df["kernel_operation_mode"])
    metric, unit, gpu = _text(df["metric_name"]), _text(df["metric_unit"]), _text(df["gpu_name"])
    xname, xval = _text(df["x_name"]), pd.to_numeric(df["x_value"], errors="coerce").to_numpy()
    use = (kern.isin(list(KERNELS)) & (metric == "speed") & mode.isin(list(MODES))).to_numpy()
    checks.add(~use, lambda i: f"kernel {kern[i]!r} mode {mode[i]!r} metric {metric[i]!r}",
               "not a forward / backward speed row of a mapped kernel", outcome="skipped")
    shapes: dict[str, list[Any]] = {c: [None] * n for c in SHAPE_COLS}
    dtype: list[str | None] = [None] * n
    problems: list[tuple[int, str, str, str]] = []
    for i in (int(j) for j in np.flatnonzero(use)):
        cfg = _config(df["extra_benchmark_config_str"].iat[i])
        if cfg is None:
            raise FormatError(f"{plan.path.name}: field extra_benchmark_config_str: row {i + 2} is not a JSON "
                              f"object; nothing ingested from this file")
        if unit[i] not in UNIT_S:
            raise FormatError(f"{plan.path.name}: field metric_unit: unknown unit {unit[i]!r} for a speed row "
                              f"(known: {', '.join(UNIT_S)}); nothing ingested from this file")
        dt = cfg.get("dtype")
        if dt is not None and dt not in DTYPES:
            raise FormatError(f"{plan.path.name}: field extra_benchmark_config_str.dtype: unknown dtype {dt!r} "
                              f"(known: {', '.join(DTYPES)}); nothing ingested from this file")
        if dt is None:
            problems.append((i, "skipped", "no dtype stated", "extra_benchmark_config_str states no dtype"))
            continue
        if gpu[i] not in GPU_PLATFORMS and not plan.platform:
            problems.append((i, "skipped", "GPU of no catalog platform", f"gpu_name {gpu[i]!r}"))
            continue
        dtype[i] = DTYPES[dt]
        op = KERNELS[kern[i]]
        vals = {**cfg, str(xname[i]): xval[i]}
        for col, keys in SHAPES[op].items():
            shapes[col][i] = next((vals[k] for k in keys if k in vals), None)
        if op in ("swiglu", "cross_entropy", "rope"):
            shapes["tp"][i] = 1
        if shapes["batch"][i] is None:
            shapes["batch"][i] = 1
        missing = [c for c in SHAPES[op] if c != "batch" and shapes[c][i] is None]
        if missing:
            problems.append((i, "skipped", "shape not stated", f"{', '.join(missing)} not stated"))
    checks.add_rows(problems)
    out = pd.DataFrame({"platform": [plan.platform or GPU_PLATFORMS.get(g) for g in gpu],
                        "op": kern.map(KERNELS), "pass": mode.map(MODES)})
    for c in SHAPE_COLS:
        out[c] = checks.positive_int(c, pd.Series(shapes[c], dtype="object"), nullable=True)
    out["variant"] = _text(df["kernel_provider"])
    out["dtype"] = dtype
    scale = unit.map(UNIT_S).fillna(1.0).to_numpy(dtype=float)
    y = checks.positive_float("y_value_50", df["y_value_50"]).to_numpy() * scale
    out["duration_s"] = y
    bad_rows = checks.bad & ~np.isin(np.arange(n), [p[0] for p in problems]) & use
    if bad_rows.any():
        first = int(np.flatnonzero(bad_rows)[0])
        raise FormatError(f"{plan.path.name}: {int(bad_rows.sum())} row(s) with a bad value, nothing ingested from "
                          f"this file: {checks.describe(first)} (row {first + 2})")
    source = plan.source or f"{SOURCE_REPO} benchmark/data/{plan.path.name}"
    out["source"] = source
    good = _finish(out, checks)
    platforms: dict[str, tuple[str | None, str | None]] = {}
    for p in sorted(good["platform"].dropna().unique()):
        platforms.update(_platform_entry(str(p), manifest=plan.info.get("manifest")))
    notes = "Liger-Kernel benchmark (triton.testing.do_bench median, p50); forward / backward speed rows"
    return ParsedFile(tables={"op_samples": good}, platforms=platforms, source=source,
                      licence=plan.licence or LICENCE, notes=notes, **checks.summary(limit))

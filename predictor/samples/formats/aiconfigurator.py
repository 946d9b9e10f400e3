"""NVIDIA aiconfigurator collector tables (`<gpu>/<table>/<framework>/<version>/*_perf.parquet`).

Layout (github.com/ai-dynamo/aiconfigurator, `systems/data/`): one folder per GPU holding `system.yaml` (the
collector's description of the node) and per table `gemm/`, `attention/`, `moe/`, `comm/`, each
`<framework>/<version>/<table>_perf.parquet` plus `collection_meta.yaml`. Every timing is an inference-engine
kernel, **forward only**, `latency` in milliseconds (CUDA-graph replay, 3 warm-up and 6 timed replays).

Mapping onto the store:
  gemm_perf.parquet              op `gemm`, pass fwd: tp = batch = 1, seq = m, hidden = k, ffn_hidden = n
                                 (activations [m, k] x weights [k, n]); dtype bfloat16 -> bf16, fp8, fp8_block,
                                 nvfp4. Tables with `power` / `power_limit` (the vllm collection) ran each shape
                                 for >= 1 s under NVML power sampling: variant ends in ':power-monitored'.
  context_attention_perf.parquet op `flash_attn`, pass fwd (causal prefill): tp = 1, batch = batch_size,
                                 seq = isl, heads = num_heads, kv_heads = num_key_value_heads,
                                 hidden = num_heads * head_dim; dtype bf16 when both the attention and the KV
                                 cache are bfloat16, else e.g. 'bf16/kv-fp8' (a different kernel). Sliding-window
                                 rows (window_size > 0) and beam / decode rows are skipped, counted.
  nccl_perf.parquet              collective_samples: all_reduce / all_gather / reduce_scatter / alltoall,
                                 ranks = gpus_per_node = num_gpus, nodes = 1 (intra-node only),
                                 message_bytes = message_size x element bytes of nccl_dtype.
  moe_perf.parquet               not ingested (skipped with the reason): a whole MoE layer's forward, which no
                                 operator of the vocabulary times.

The platform is the GPU folder's (`GPU_PLATFORMS`; a folder of another name needs `--platform` or a
manifest.json). A GPU folder without `system.yaml` is not a collector tree: rejected. Any bad cell (a missing
column, a latency that is missing, NaN, zero or negative, an unknown dtype, a shape that is not a positive
integer) rejects the whole file with the file and the field named: these are generated tables, so one bad cell
means the file is not what the collector writes.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
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

SOURCE_REPO = "ai-dynamo/aiconfigurator"
LICENCE = "Apache-2.0"
# GPU folder -> platform id of this project's catalog
GPU_PLATFORMS = {"a100_sxm": "dgx-a100-80gb", "h100_sxm": "dgx-h100", "h200_sxm": "dgx-h200",
                 "b200_sxm": "dgx-b200", "gb200": "gb200-nvl72", "b300_sxm": "dgx-b300", "gb300": "gb300-nvl72"}
GEMM_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}
ATTN_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "fp8": "fp8"}
NCCL_BYTES = {"half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4, "int8": 1, "fp8": 1}
NCCL_COLLECTIVES = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
                    "alltoall": "alltoall"}
POWER_VARIANT = "power-monitored"

GEMM_COLUMNS = ("gemm_dtype", "m", "n", "k", "latency")
ATTN_COLUMNS = ("batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "attn_dtype", "kv_cache_dtype",
                "latency")
NCCL_COLUMNS = ("op_name", "nccl_dtype", "num_gpus", "message_size", "latency")
MOE_COLUMNS = frozenset({"moe_dtype", "num_tokens", "num_experts", "latency"})
TABLE_FILES = {"gemm_perf.parquet": "aiconfigurator_gemm", "context_attention_perf.parquet": "aiconfigurator_attention",
               "nccl_perf.parquet": "aiconfigurator_comm"}
MOE_SKIP = ("aiconfigurator MoE table: a whole MoE layer's routed-expert forward (grouped GEMMs, activation, "
            "routing), which no operator of the vocabulary times; not ingested")


def detect(path: Path, cols: set[str]) -> str | None:
    """The aiconfigurator kind of a file (by its collector file name, else its columns), None when it is not one.
    A collector file name with a column missing is still read as that table, so the missing column is named."""
    if path.name in TABLE_FILES:
        return TABLE_FILES[path.name]
    if {"gemm_dtype", "m", "n", "k"} <= cols:
        return "aiconfigurator_gemm"
    if {"isl", "num_heads", "attn_dtype"} <= cols:
        return "aiconfigurator_attention"
    if {"nccl_dtype", "message_size"} <= cols:
        return "aiconfigurator_comm"
    return None


def is_moe_table(cols: set[str]) -> bool:
    return MOE_COLUMNS <= cols


def _tree(plan: FilePlan) -> tuple[Path, str, str, str]:
    """(GPU folder, table, framework, version) from `<gpu>/<table>/<framework>/<version>/<file>`; the GPU folder
    must hold system.yaml."""
    p = plan.path.resolve()
    parts = p.parents
    if len(parts) < 4:
        raise FormatError(f"{plan.path.name}: expected <gpu>/<table>/<framework>/<version>/{plan.path.name} "
                          f"(the collector's layout)")
    version, framework, table, gpu = parts[0].name, parts[1].name, parts[2].name, parts[3]
    sysf = gpu / "system.yaml"
    if not sysf.is_file() or sysf.stat().st_size == 0:
        raise FormatError(f"{plan.path.name}: GPU folder {gpu.name}/ has no system.yaml (expected {sysf}: the "
                          f"collector's node description; without it this is not a collector output tree)")
    return gpu, table, framework, version


def _platform(plan: FilePlan, gpu: Path) -> str:
    if plan.platform:
        return plan.platform
    if gpu.name in GPU_PLATFORMS:
        return GPU_PLATFORMS[gpu.name]
    raise FormatError(f"{plan.path.name}: GPU folder '{gpu.name}' maps to no platform of this project "
                      f"(known: {', '.join(sorted(GPU_PLATFORMS))}); pass --platform ID or add a manifest.json")


def _reject_on_failure(plan: FilePlan, checks: Any) -> None:
    if checks.bad.any():
        n = int(checks.bad.sum())
        ex = "; ".join(checks.examples(3))
        raise FormatError(f"{plan.path.name}: {n} row(s) with a bad value, nothing ingested from this file: {ex}")


def _dtype(plan: FilePlan, field: str, raw: pd.Series, known: dict[str, str]) -> pd.Series:
    vals = _text(raw)
    bad = sorted({str(v) for v in vals if v not in known})
    if bad:
        raise FormatError(f"{plan.path.name}: field {field}: unknown dtype {', '.join(map(repr, bad[:5]))} "
                          f"(known: {', '.join(known)}); nothing ingested from this file")
    return vals.map(known)


def _provenance(plan: FilePlan, gpu: Path, table: str, framework: str, version: str, power: bool) -> tuple[str, str]:
    source = plan.source or f"{SOURCE_REPO} collector: {gpu.name}/{table}/{framework}/{version}"
    notes = (f"aiconfigurator {table} table, {framework} {version}: inference-engine kernels, forward only, "
             f"latency ms (CUDA-graph replay)" + ("; power-monitored (each shape >= 1 s, NVML power sampled)"
                                                  if power else ""))
    return source, notes


def _result(plan: FilePlan, table: str, out: pd.DataFrame, checks: Any, platform: str, source: str, notes: str,
            limit: int) -> ParsedFile:
    good = _finish(out, checks)
    summary = checks.summary(limit)
    return ParsedFile(tables={table: good}, platforms=_platform_entry(platform, manifest=plan.info.get("manifest")),
                      source=source, licence=plan.licence or LICENCE, notes=notes, **summary)


def _latency_s(checks: Any, df: pd.DataFrame) -> pd.Series:
    return checks.positive_float("latency", df["latency"], scale=1e-3)


def parse_gemm(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    gpu, table, framework, version = _tree(plan)
    df = read_frame(data, plan.path)
    require_columns(df, GEMM_COLUMNS, plan.path, GEMM_COLUMNS)
    platform = _platform(plan, gpu)
    dtype = _dtype(plan, "gemm_dtype", df["gemm_dtype"], GEMM_DTYPES)
    power = "power" in df.columns
    checks = start_checks(df, plan)
    n = len(df)
    out = pd.DataFrame({"platform": [platform] * n, "op": ["gemm"] * n, "pass": ["fwd"] * n})
    out["tp"] = pd.array([1] * n, dtype="Int64")
    out["batch"] = pd.array([1] * n, dtype="Int64")
    out["seq"] = checks.positive_int("m", df["m"])
    out["hidden"] = checks.positive_int("k", df["k"])
    out["ffn_hidden"] = checks.positive_int("n", df["n"])
    out["dtype"] = dtype
    out["variant"] = f"{framework}/{version}" + (f":{POWER_VARIANT}" if power else "")
    out["duration_s"] = _latency_s(checks, df)
    _reject_on_failure(plan, checks)
    source, notes = _provenance(plan, gpu, table, framework, version, power)
    out["source"] = source
    return _result(plan, "op_samples", out, checks, platform, source, notes, limit)


def parse_attention(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    gpu, table, framework, version = _tree(plan)
    df = read_frame(data, plan.path)
    require_columns(df, ATTN_COLUMNS, plan.path, (*ATTN_COLUMNS, "window_size", "beam_width", "step"))
    platform = _platform(plan, gpu)
    attn = _dtype(plan, "attn_dtype", df["attn_dtype"], ATTN_DTYPES)
    kv = _dtype(plan, "kv_cache_dtype", df["kv_cache_dtype"], ATTN_DTYPES)
    checks = start_checks(df, plan)
    n = len(df)
    out = pd.DataFrame({"platform": [platform] * n, "op": ["flash_attn"] * n, "pass": ["fwd"] * n})
    out["tp"] = pd.array([1] * n, dtype="Int64")
    out["batch"] = checks.positive_int("batch_size", df["batch_size"])
    out["seq"] = checks.positive_int("isl", df["isl"])
    heads = checks.positive_int("num_heads", df["num_heads"])
    out["heads"] = heads
    out["kv_heads"] = checks.positive_int("num_key_value_heads", df["num_key_value_heads"])
    head_dim = checks.positive_int("head_dim", df["head_dim"])
    out["hidden"] = heads * head_dim
    out["dtype"] = np.where(attn.to_numpy() == kv.to_numpy(), attn.to_numpy(),
                            (attn + "/kv-" + kv).to_numpy())
    out["variant"] = f"{framework}/{version}:causal"
    out["duration_s"] = _latency_s(checks, df)
    _reject_on_failure(plan, checks)
    # rows of kernels the training step does not run: counted as skipped, not errors
    for col, what in (("window_size", "sliding-window attention (window_size > 0)"),
                      ("beam_width", "beam search (beam_width > 1)"), ("step", "decode step (step > 0)")):
        if col in df.columns:
            v = pd.to_numeric(df[col], errors="coerce").fillna(0).to_numpy()
            lim = 1 if col == "beam_width" else 0
            checks.add(v > lim, _describer(col, v), what, outcome="skipped")
    source, notes = _provenance(plan, gpu, table, framework, version, False)
    notes += "; causal prefill attention"
    out["source"] = source
    return _result(plan, "op_samples", out, checks, platform, source, notes, limit)


def _describer(col: str, v: np.ndarray) -> Callable[[int], str]:
    return lambda i: f"{col}={v[i]:g}"


def parse_comm(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    gpu, table, framework, version = _tree(plan)
    df = read_frame(data, plan.path)
    require_columns(df, NCCL_COLUMNS, plan.path, NCCL_COLUMNS)
    platform = _platform(plan, gpu)
    names = _text(df["op_name"])
    bad = sorted({str(v) for v in names if v not in NCCL_COLLECTIVES})
    if bad:
        raise FormatError(f"{plan.path.name}: field op_name: unknown collective {', '.join(map(repr, bad[:5]))} "
                          f"(known: {', '.join(NCCL_COLLECTIVES)}); nothing ingested from this file")
    elt = _dtype(plan, "nccl_dtype", df["nccl_dtype"], {k: str(v) for k, v in NCCL_BYTES.items()}).astype(int)
    checks = start_checks(df, plan)
    out = pd.DataFrame({"platform": [platform] * len(df), "collective": names.map(NCCL_COLLECTIVES)})
    size = checks.positive_int("message_size", df["message_size"])
    ranks = checks.positive_int("num_gpus", df["num_gpus"])
    out["message_bytes"] = (size * elt.to_numpy()).astype("Int64")
    out["ranks"] = ranks
    out["nodes"] = pd.array([1] * len(df), dtype="Int64")
    out["gpus_per_node"] = ranks
    out["dtype"] = _text(df["nccl_dtype"]).map({"half": "fp16", "float16": "fp16", "bfloat16": "bf16",
                                                 "float": "fp32", "float32": "fp32", "int8": "int8", "fp8": "fp8"})
    out["duration_s"] = _latency_s(checks, df)
    _reject_on_failure(plan, checks)
    source, notes = _provenance(plan, gpu, table, framework, version, False)
    notes += "; intra-node only; message_bytes = message_size x element bytes"
    out["source"] = source
    return _result(plan, "collective_samples", out, checks, platform, source, notes, limit)

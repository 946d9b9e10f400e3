"""Published per-GPU memory of Megatron-Core training runs (MoE, FP8, context parallelism) against
`memory.estimate_memory`: an independent check, never fitted to.

`catalog/published_memory.json` holds each figure with its document, the unit it is printed in and what it counts (a
README's 'mem' column read like nvidia-smi, torch's max reserved, a bound ...; `measures` names the quantity of ours
it is compared with), the model (a preset or fields with their citation), the layout (with the gradient precision
and FP8 primary weights where the document states them) and, where the document says which rank it measured, the
pipeline stage (`stage`: 'first' / 'last'; default: the stage with the largest total), and what the run sets that the
memory model has an option for (`memory_options`: its CUBLAS_WORKSPACE_CONFIG, transformer implementation, fused
cross entropy). Entries whose stored text
lacks the layout, or that give only a bound, are kept as found and reported as not comparable. A model or layout the
predictor refuses (or a MoE field it does not accept yet) is reported with its message, never dropped silently.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from predictor import paths

CATALOG = paths.CATALOG_DIR / "published_memory.json"
TO_GIB = {"GiB": 1.0, "MiB": 1 / 1024, "GB": 1e9 / 2 ** 30, "MB": 1e6 / 2 ** 30, "B": 1 / 2 ** 30}
# which pipeline stage a figure was measured on: the stage with the largest device total (default), or the one the
# document names (Megatron-LM writes its tensorboard memory scalars on the last rank: the last pipeline stage)
STAGES = ("peak", "first", "last")


def load(path: Path = CATALOG) -> dict[str, Any]:
    return dict(json.loads(Path(path).read_text()))


def model_fields(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The predict-batch fields of a catalog model (`preset`, or the fields themselves), named `name`."""
    return {**fields, "model": fields.get("preset"), "name": name}


def model_spec(name: str, fields: dict[str, Any]) -> Any:
    """A ModelSpec from a catalog model (`preset`, or the predict-batch fields), read as predict-batch reads a row
    (`layout_io.model_from_fields`); raises InfeasibleConfig where the predictor refuses it."""
    from predictor.model.layout_io import model_from_fields
    return model_from_fields(model_fields(name, fields))


def layout_fields(raw: dict[str, Any], recompute: str | None = None) -> dict[str, Any]:
    """The Layout fields of a catalog layout, by the catalog's rules: the interleaved schedule where vpp > 1,
    sequence parallelism only with tp > 1, FP8 primary weights, the gradient precision and the MoE token dispatcher
    (alltoall unless stated) where stated."""
    fields = {k: raw[k] for k in ("num_gpus", "tp", "pp", "dp", "cp", "micro_batch", "global_batch", "seq_len",
                                  "precision", "zero_stage", "vpp")}
    fields["recompute"] = recompute or raw["recompute"]
    fields["sequence_parallel"] = bool(raw["sequence_parallel"]) and raw["tp"] > 1
    fields["schedule"] = "interleaved" if raw.get("vpp", 1) > 1 else "1f1b"
    fields.update(ep=raw.get("ep", 1), grad_reduce_in_fp32=raw.get("grad_reduce_in_fp32"),
                  fp8_param_gather=bool(raw.get("fp8_param_gather", False)), etp=raw.get("etp"),
                  moe_dispatcher=raw.get("moe_dispatcher", "alltoall"))
    return fields


def layout_of(raw: dict[str, Any], recompute: str | None = None) -> Any:
    from predictor.model.specs import Layout
    return Layout(**layout_fields(raw, recompute))


MEASURES = ("device", "reserved", "allocated")


def memory_options(entry: dict[str, Any]) -> Any:
    """The MemoryOptions a figure's run sets (the memory model's defaults otherwise): the transformer
    implementation (`transformer_impl`), the cuBLAS workspace of the run's CUBLAS_WORKSPACE_CONFIG (`env`) and
    whether its Megatron-Core compiled the fused cross entropy in one graph (`fused_ce_logits_copy`)."""
    from predictor.step.memory import MemoryOptions, cublas_workspace_mib_of
    config = entry.get("env", {}).get("CUBLAS_WORKSPACE_CONFIG")
    return MemoryOptions(transformer_impl=entry.get("transformer_impl", "transformer_engine"),
                         cublas_workspace_mib=cublas_workspace_mib_of(config) if config else None,
                         fused_ce_logits_copy=bool(entry.get("fused_ce_logits_copy", False)))


def _estimate(model: Any, raw: dict[str, Any], platform: str, measures: str, recompute: str | None = None,
              stage: str = "peak", options: Any = None) -> float:
    """Our figure for what the published one counts, GiB, on the stage with the largest device total (or the
    first / last pipeline stage where the document says which rank it measured): 'device' the total (nvidia-smi:
    reserved + CUDA context + NCCL buffers), 'reserved' allocated + the allocator's reserve, 'allocated' the
    allocated peak."""
    from predictor.hardware.platforms import get_platform
    from predictor.step.memory import GIB, MemoryOptions, estimate_memory
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    report = estimate_memory(model, layout_of(raw, recompute), get_platform(platform),
                             options or MemoryOptions())
    peak = {"peak": report.peak, "first": report.stages[0], "last": report.stages[-1]}[stage]
    value = {"device": peak.total_bytes, "reserved": peak.reserved_bytes, "allocated": peak.allocated_bytes}
    return float(value[measures] / GIB)


def compare(path: Path = CATALOG) -> pd.DataFrame:
    """One row per published figure: the figure in GiB, ours for the quantity it counts (`measures`; the stage
    with the largest device total), the error, or why it cannot be compared."""
    doc = load(path)
    rows = []
    for e in doc["entries"]:
        pub = e["published"] * TO_GIB[e["unit"]]
        row: dict[str, Any] = {"id": e["id"], "model": e.get("model"), "platform": e.get("platform"),
                               "precision": e.get("layout", {}).get("precision"), "published_gib": pub,
                               "counts": e["counts"], "measures": e.get("measures", "unstated"),
                               "ours_gib": None, "error": None, "ours_alt_gib": None,
                               "note": ""}
        if e.get("unpredictable") or row["measures"] not in MEASURES:
            row["note"] = (f"not comparable: {e['unpredictable']}" if e.get("unpredictable") else
                           "not comparable: the document does not say what its figure counts")
            rows.append(row)
            continue
        try:
            model = model_spec(e["model"], doc["models"][e["model"]])
            stage = e.get("stage", "peak")
            opts = memory_options(e)
            row["ours_gib"] = _estimate(model, e["layout"], e["platform"], row["measures"], stage=stage, options=opts)
            row["error"] = row["ours_gib"] / pub - 1
            if e.get("recompute_alt"):
                row["ours_alt_gib"] = _estimate(model, e["layout"], e["platform"], row["measures"],
                                                e["recompute_alt"], stage, opts)
        except Exception as exc:  # noqa: BLE001 - a refused model / layout / MoE field is reported, not raised
            row["note"] = f"not estimated: {type(exc).__name__}: {exc}"
        rows.append(row)
    return pd.DataFrame(rows)

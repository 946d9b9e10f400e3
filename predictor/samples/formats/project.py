"""The project's own sample schema (bench/ output: operator and collective samples) and measured runs (own CSV)."""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from predictor.model import ops
from predictor.model.errors import InfeasibleConfig
from predictor.model.frameworks import FRAMEWORKS
from predictor.samples.formats.common import (
    COLLECTIVE_COLUMNS,
    MEASURED_RUN_COLUMNS,
    MEASURED_RUN_INPUT_COLUMNS,
    MEASURED_RUN_INT_COLUMNS,
    MEASURED_RUN_OPTIONAL_COLUMNS,
    OP_SAMPLE_COLUMNS,
    FilePlan,
    ParsedFile,
    RowChecks,
    _finish,
    _hashable,
    _platform_entry,
    _text,
    read_frame,
    require_columns,
    row_lines,
    show,
    start_checks,
)
from predictor.samples.formats.sources import load_source_definitions, match_source


def _check_layout(checks: RowChecks, out: pd.DataFrame) -> None:
    f = {c: out[c].to_numpy(dtype="float64", na_value=np.nan) for c in ("tp", "pp", "dp", "num_gpus",
                                                                          "global_batch", "micro_batch")}
    prod = f["tp"] * f["pp"] * f["dp"]
    checks.add(prod != f["num_gpus"], lambda i: f"num_gpus: tp*pp*dp = {prod[i]:g} != num_gpus {f['num_gpus'][i]:g}",
               "contradictory layout: num_gpus")
    rem = np.fmod(f["global_batch"], f["micro_batch"] * f["dp"])
    checks.add(rem != 0, lambda i: f"global_batch: {f['global_batch'][i]:g} is not a multiple of micro_batch*dp",
               "contradictory layout: global_batch")


def _run_rejections(df: pd.DataFrame, checks: RowChecks, source_ids: Any) -> list[dict[str, Any]]:
    """The measured-run rows left out, for the store's run_rejections table."""
    lines = row_lines(df)
    sids = list(source_ids) if source_ids is not None else [None] * len(df)
    return [{"line": int(lines[i]), "source_id": sids[i] if i < len(sids) else None, "outcome": outcome,
             "reason": reason, "detail": detail} for i, outcome, reason, detail in checks.failures()]


def _platform_column(df: pd.DataFrame, plan: FilePlan, checks: RowChecks) -> pd.Series:
    if plan.platform:
        return pd.Series([plan.platform] * len(df), dtype="object")
    p = _text(df["platform"])
    checks.add(p.isna() | (p == ""), lambda i: "platform is empty", "platform empty")
    return p


def _own_common(df: pd.DataFrame, plan: FilePlan, checks: RowChecks, out: pd.DataFrame) -> None:
    """dtype, duration_s, source and measured_at of the project's own sample schemas."""
    out["dtype"] = _text(df["dtype"])
    checks.add(out["dtype"].isna(), lambda i: "dtype is empty", "dtype empty")
    out["duration_s"] = checks.positive_float("duration_s", df["duration_s"])
    default_source = plan.source or str(plan.path.resolve())
    out["source"] = _text(df["source"]).fillna(default_source) if "source" in df.columns else default_source
    if "measured_at" in df.columns:
        raw = df["measured_at"]
        ts = pd.to_datetime(raw, errors="coerce", utc=True, format="mixed")
        vals = raw.to_numpy()
        checks.add(ts.isna() & raw.notna(), lambda i: f"measured_at={show(vals[i])} is not a timestamp",
                   "measured_at not a timestamp")
        out["measured_at"] = ts.dt.tz_convert(None)


def parse_op_samples(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    df = read_frame(data, plan.path)
    required = ["op", "pass", "dtype", "duration_s"] + ([] if plan.platform else ["platform"])
    require_columns(df, required, plan.path, list(OP_SAMPLE_COLUMNS))
    checks = start_checks(df, plan)
    out = pd.DataFrame({"platform": _platform_column(df, plan, checks), "op": _text(df["op"]),
                        "pass": _text(df["pass"])})
    pairs = list(zip(out["op"], out["pass"]))
    ops_ok = np.array([_hashable(o) and o in ops.OPS for o, _ in pairs], dtype=bool)
    pass_ok = np.array([_hashable(o) and o in ops.OPS and p in ops.OPS[o].passes for o, p in pairs], dtype=bool)
    checks.add(~ops_ok, lambda i: f"unknown op {show(pairs[i][0])}", "unknown op")
    checks.add(ops_ok & ~pass_ok, lambda i: f"unknown pass {show(pairs[i][1])} for op {show(pairs[i][0])}",
               "unknown pass for op")
    for c in ops.SHAPE_COLUMNS:
        if c in df.columns:
            out[c] = checks.positive_int(c, df[c], nullable=True)
    if "variant" in df.columns:
        out["variant"] = _text(df["variant"])
    _own_common(df, plan, checks, out)
    return _own_result(plan, "op_samples", out, checks, limit, df.columns, OP_SAMPLE_COLUMNS)


def parse_collective_samples(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    df = read_frame(data, plan.path)
    required = ["collective", "message_bytes", "ranks", "dtype", "duration_s"] + ([] if plan.platform else ["platform"])
    require_columns(df, required, plan.path, COLLECTIVE_COLUMNS)
    checks = start_checks(df, plan)
    out = pd.DataFrame({"platform": _platform_column(df, plan, checks), "collective": _text(df["collective"])})
    checks.member("collective", out["collective"], ops.COLLECTIVES)
    out["message_bytes"] = checks.positive_int("message_bytes", df["message_bytes"])
    out["ranks"] = checks.positive_int("ranks", df["ranks"])
    for c in ("nodes", "gpus_per_node"):
        if c in df.columns:
            out[c] = checks.positive_int(c, df[c], nullable=True)
    _own_common(df, plan, checks, out)
    return _own_result(plan, "collective_samples", out, checks, limit, df.columns, COLLECTIVE_COLUMNS)


def parse_measured_runs(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    """Measured runs in the predict-batch columns plus step_time_s. Empty cells take the same
    documented defaults as predict-batch (one rule set: predictor.model.layout_io); a row whose model or
    layout is infeasible is rejected with the field and the fix. `source` (default: the file's stem),
    `framework` (one of FRAMEWORKS), `source_id` and `notes` are optional columns; without them the
    source definitions (published_sources.json, matched on the row's source) fill framework and
    source_id, else source_id is `local:<file stem>`."""
    from predictor.model.layout_io import layout_from_fields, model_from_fields
    df = read_frame(data, plan.path)
    required = ["case_id", "arch", "layers", "hidden", "heads", "step_time_s"] + ([] if plan.platform else ["platform"])
    require_columns(df, required, plan.path, [*MEASURED_RUN_INPUT_COLUMNS,
                                              *(f"{c} (optional)" for c in MEASURED_RUN_OPTIONAL_COLUMNS)])
    defs = load_source_definitions()
    checks = start_checks(df, plan)
    step = checks.positive_float("step_time_s", df["step_time_s"])
    # the source identifies a run (it is part of its row key): without a source column, the manifest's
    # or the file's stem (not its path, so that a copy or re-export elsewhere is the same run)
    default_source = plan.source or plan.path.stem
    sources = _text(df["source"]).fillna(default_source) if "source" in df.columns else \
        pd.Series([default_source] * len(df), dtype="object")
    records: list[dict[str, Any]] = []
    problems: list[tuple[int, str, str, str]] = []
    for i, row in enumerate(df.to_dict(orient="records")):
        platform = plan.platform or (str(row.get("platform") or "").strip() or None)
        try:
            if platform is None:
                raise InfeasibleConfig("platform", "is empty.", "name the platform the run was measured on.")
            m = model_from_fields(row)
            L = layout_from_fields(row)
            L.validate(m)
            fw = (_str_or_none(row.get("framework")) or "").lower() or None
            if fw is not None and fw not in FRAMEWORKS:
                raise InfeasibleConfig("framework", f"unknown framework {fw!r}.",
                                       f"use one of {', '.join(FRAMEWORKS)}.")
        except InfeasibleConfig as e:
            problems.append((i, "rejected", f"contradictory or invalid: {e.field}", str(e)))
            records.append({})
            continue
        defn = match_source(defs, row_source=sources.iloc[i])
        case = row.get("case_id")
        sid = _str_or_none(row.get("source_id")) or (defn["source_id"] if defn else f"local:{plan.path.stem}")
        records.append({"run_id": None if case is None or str(case).strip() == "" else str(case).strip(),
                        "platform": platform, "arch": m.arch, "layers": m.num_layers, "hidden": m.hidden_size,
                        "heads": m.num_heads, "kv_heads": m.kv_heads, "ffn_hidden": m.ffn, "vocab": m.vocab_size,
                        "seq_len": L.seq_len, "num_gpus": L.num_gpus, "tp": L.tp, "pp": L.pp, "dp": L.dp,
                        "micro_batch": L.micro_batch, "global_batch": L.global_batch, "vpp": L.vpp,
                        "schedule": L.schedule, "recompute": L.recompute, "sequence_parallel": L.sequence_parallel,
                        "zero_stage": L.zero_stage, "precision": L.precision, "attention": m.attention_impl,
                        "framework": fw or (defn["framework"] if defn else None), "source_id": sid,
                        "notes": _str_or_none(row.get("notes"))})
    checks.add_rows(problems)
    out = pd.DataFrame(records, columns=[c for c in MEASURED_RUN_COLUMNS if c not in ("step_time_s", "source")])
    failed = np.array([not r for r in records], dtype=bool)
    checks.add(out["run_id"].isna().to_numpy() & ~failed, lambda i: "case_id is empty", "case_id empty")
    for c in MEASURED_RUN_INT_COLUMNS:
        out[c] = out[c].astype("Int64")
    out["sequence_parallel"] = out["sequence_parallel"].astype("boolean")
    out["step_time_s"] = step
    out["source"] = sources
    parsed = _own_result(plan, "measured_runs", out, checks, limit, df.columns,
                         [*MEASURED_RUN_INPUT_COLUMNS, *MEASURED_RUN_OPTIONAL_COLUMNS])
    parsed.run_rejections = _run_rejections(df, checks, out["source_id"])
    return parsed


def _str_or_none(v: Any) -> str | None:
    """A text cell stripped, None when empty or missing (CSV None, Parquet NaN)."""
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    s = str(v).strip()
    return s or None


def _own_result(plan: FilePlan, table: str, out: pd.DataFrame, checks: RowChecks, limit: int,
                have: Iterable[str], known: Iterable[str]) -> ParsedFile:
    good = _finish(out, checks)
    ignored = sorted(set(have) - set(known) - {"batch_id"})
    notes = f"{table}" + (f"; ignored columns: {', '.join(ignored)}" if ignored else "")
    manifest = plan.info.get("manifest")
    platforms: dict[str, tuple[str | None, str | None]] = {}
    for p in sorted(good["platform"].dropna().unique()):
        platforms.update(_platform_entry(str(p), manifest=manifest))
    return ParsedFile(tables={table: good}, platforms=platforms, source=plan.source or str(plan.path.resolve()),
                      licence=plan.licence, notes=notes, **checks.summary(limit))

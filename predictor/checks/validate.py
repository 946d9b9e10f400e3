"""End-to-end validation: predict every measured run in the store, compare, summarise."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from predictor import paths
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import layout_from_fields, model_from_fields


def validate_runs(platform: str | None = None, store_path=None, models_dir=None, progress=None,
                  runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per measured run: its fields, measured and predicted step time, APE, or the error."""
    from predictor.plan.predict import get_predictor
    if runs is None:
        from predictor.samples.store import read_measured_runs
        runs = read_measured_runs(platform=platform, store_path=store_path)
    out = []
    n = len(runs)
    for i, row in enumerate(runs.to_dict(orient="records")):
        res = dict(row)
        try:
            model = model_from_fields(row)
            layout = layout_from_fields(row)
            p = get_predictor(str(row["platform"]), str(models_dir) if models_dir else None).predict(
                model, layout, timeline=False)
            res.update(predicted_s=p.step_time_s, measured_s=float(row["step_time_s"]),
                       provenance=p.provenance, error="",
                       **{f"pred_{k}_s": v for k, v in p.breakdown_s.items()})
            res["ape"] = abs(res["predicted_s"] - res["measured_s"]) / res["measured_s"]
            res["signed_error"] = (res["predicted_s"] - res["measured_s"]) / res["measured_s"]
        except InfeasibleConfig as e:
            res.update(predicted_s=np.nan, measured_s=float(row["step_time_s"]), ape=np.nan, error=str(e))
        out.append(res)
        if progress and (i + 1) % 200 == 0:
            progress(i + 1, n, "runs predicted")
    return pd.DataFrame(out)


def summarize_validation(res: pd.DataFrame, by: tuple[str, ...] = ("platform",)) -> pd.DataFrame:
    """Per group: runs predicted, MAPE, median, p90, worst, mean signed error, share within 10 %, and the
    runs that could not be predicted (`failed`: fields that make no valid layout on that platform).
    Empty when `res` has no results (no `ape` column)."""
    if res.empty or "ape" not in res:
        return pd.DataFrame()
    by = tuple(k for k in by if k in res.columns) or ("platform",)
    rows = []
    for key, g in res.groupby(list(by), dropna=False):
        ok = g[g["ape"].notna()]
        vals = dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True))
        if not len(ok):
            rows.append({**vals, "runs": 0, "failed": int(len(g))})
            continue
        rows.append({**vals, "runs": len(ok), "mape": ok["ape"].mean(), "median_ape": ok["ape"].median(),
                     "p90_ape": ok["ape"].quantile(0.9), "worst_ape": ok["ape"].max(),
                     "mean_signed": ok["signed_error"].mean(), "within_10pct": (ok["ape"] <= 0.10).mean(),
                     "failed": int(len(g) - len(ok))})
    return pd.DataFrame(rows)


def skipped_at_ingest(store_path=None) -> pd.DataFrame:
    """Rows each source lost at ingest, and why (a field the source does not state is skipped, never guessed)."""
    from predictor.samples.store import run_rejection_counts
    return run_rejection_counts(store_path=store_path)


VALIDATION_RUNS_FILE = paths.VALIDATION_RUNS  # kept for callers; the name lives in predictor.paths
# What the per-run file keeps (a subset of validate_runs' columns, plus every pred_<category>_s), to 6
# significant digits.
RUN_COLUMNS = ("run_id", "case_id", "platform", "arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
               "seq_len", "num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch", "vpp", "schedule", "recompute",
               "sequence_parallel", "zero_stage", "precision", "attention", "source", "measured_s", "predicted_s",
               "ape", "signed_error", "provenance", "error")


def save_validation_runs(platform_id: str, res: pd.DataFrame, models_dir=None) -> Path:
    """The per-run results behind validation.json, as a small CSV next to it
    (models_store/<platform>/validation_runs.csv), so a dashboard can show them without predicting
    every run again."""
    cols = [c for c in RUN_COLUMNS if c in res] + [c for c in res.columns
                                                   if c.startswith("pred_") and c.endswith("_s")]
    if "source" in res and res["source"].nunique() <= 1:
        cols.remove("source")  # one source: validation.json names it
    path = paths.artifact(platform_id, paths.VALIDATION_RUNS, models_dir)
    paths.write_text_atomic(path, res[cols].to_csv(index=False, float_format="%.6g"))
    return path


def save_validation(platform_id: str, res: pd.DataFrame, models_dir=None, summary: dict | None = None) -> Path:
    """Record the measured end-to-end error next to the platform's models (validation.json; predictions
    use it for their expected-error band) and the per-run results (validation_runs.csv). `summary`
    overrides the figures computed from `res` (e.g. a MAPE pooled over several measuring runs, of which
    `res` is the latest) and may add `mape_speed_checked` (used when a speed check scales the times)."""
    ok = res[res["ape"].notna()]
    d = {"platform": platform_id, "n_runs": int(len(ok)), "mape": float(ok["ape"].mean()) if len(ok) else None,
         "median_ape": float(ok["ape"].median()) if len(ok) else None,
         "p90_ape": float(ok["ape"].quantile(0.9)) if len(ok) else None,
         "source": ", ".join(sorted(set(map(str, ok.get("source", pd.Series(["store"])).unique()))))[:300],
         "validated_at": datetime.now(UTC).isoformat(timespec="seconds")}
    if summary:
        d |= {"latest_run_mape": d["mape"], "latest_run_n": d["n_runs"]} | dict(summary)
    path = paths.artifact(platform_id, paths.VALIDATION, models_dir)
    paths.write_text_atomic(path, json.dumps(d, indent=2))
    save_validation_runs(platform_id, res, models_dir)
    return path


@dataclass(frozen=True)
class SavedValidation:
    """A platform's saved end-to-end validation (`python -m predictor validate --save`)."""
    runs: pd.DataFrame            # validate_runs' columns, as saved (RUN_COLUMNS + pred_<category>_s)
    meta: dict[str, Any]          # validation.json ({} when it is missing or unusable: see `warning`)
    path: Path                    # the per-run CSV
    warning: str | None = None    # why validation.json was ignored, if it was


def saved_validation_platforms(models_dir=None) -> list[str]:
    """Platforms with a saved per-run end-to-end validation (<models_dir>/<platform>/validation_runs.csv)."""
    d = paths.models_dir(models_dir)
    return sorted(p.parent.name for p in d.glob(f"*/{paths.VALIDATION_RUNS}")) if d.is_dir() else []


def read_saved_validation(models_dir, platform_id: str) -> SavedValidation | None:
    """The saved validation of a platform, or None when it has none. Reading it takes milliseconds;
    predicting every run again takes seconds to minutes. An unreadable CSV raises ArtifactError."""
    path = paths.artifact(platform_id, paths.VALIDATION_RUNS, models_dir)
    if not path.is_file():
        return None
    try:
        runs = pd.read_csv(path, keep_default_na=True)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise paths.ArtifactError(path, None, f"cannot be read ({e}); recompute it") from None
    for c in ("error", "provenance"):  # empty cells read back as NaN (float when all are empty)
        if c in runs:
            runs[c] = runs[c].astype(object).where(runs[c].notna(), "").astype(str)
    meta, warning = paths.load_platform_validation_checked(platform_id, models_dir)
    return SavedValidation(runs=runs, meta=meta or {}, path=path, warning=warning)


def mark_unmodelled_host(res: pd.DataFrame) -> pd.DataFrame:
    """`pred_host_overhead_s` empty (NaN) for platforms whose runs never got a host term (no fitted host
    overhead there), so tables and exports do not show an unmodelled 0 as a measured zero."""
    col = "pred_host_overhead_s"
    if col not in res or "platform" not in res or res.empty:
        return res
    res = res.copy()
    h = pd.to_numeric(res[col], errors="coerce")
    none = h.fillna(0.0).groupby(res["platform"]).transform(lambda s: bool((s == 0).all())).astype(bool)
    res[col] = h.mask(none)
    return res

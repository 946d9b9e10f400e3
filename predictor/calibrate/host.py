"""Fit a platform's host (framework) overhead on its measured end-to-end runs.

    python -m predictor calibrate-host --platform dgx-a100-80gb

The runs are prepared once for the step-time engine (units timed, rows grouped by model); the two
parameters of `predictor.step.overhead.HostOverhead` are then searched on a grid, each candidate
re-composing every run through the engine with that host term (the same composition `predict`
uses). Cross-validation holds out whole models (same architecture and sizes), so the reported CV
MAPE is the error on models the fit never saw. Writes models_store/<platform>/host_overhead.json.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from predictor import paths
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import layout_from_fields, model_from_fields
from predictor.model.specs import Layout, ModelSpec
from predictor.plan.predict import Predictor
from predictor.step.compose import ComposeOptions
from predictor.step.engine import rows_for
from predictor.step.overhead import HostOverhead, fit_host_overhead, save_host_overhead

MODEL_KEY = ("arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len")


def runs_to_items(runs: pd.DataFrame) -> tuple[list[tuple[ModelSpec, Layout]], np.ndarray, np.ndarray, int]:
    """(model, layout) per usable run, measured step times, model groups, runs skipped as infeasible."""
    items, meas, groups, skipped = [], [], [], 0
    for row in runs.to_dict(orient="records"):
        try:
            model, layout = model_from_fields(row), layout_from_fields(row)
            layout.validate(model)
        except InfeasibleConfig:
            skipped += 1
            continue
        items.append((model, layout))
        meas.append(float(row["step_time_s"]))
        groups.append("|".join(str(row.get(k)) for k in MODEL_KEY))
    return items, np.array(meas), np.array(groups), skipped


def make_evaluator(predictor: Predictor, items: Sequence[tuple[ModelSpec, Layout]],
                   options: ComposeOptions | None = None) -> Callable[[float, float], np.ndarray]:
    """`evaluate(h, p)`: the step time of every (model, layout) with that host overhead (h seconds per
    layer pass, blend p; h = 0: none), composed by the engine exactly as `predict` composes it."""
    by: dict[tuple, list[int]] = {}
    for i, (m, L) in enumerate(items):
        by.setdefault((m, L.seq_len, L.precision), []).append(i)
    groups = []
    for (m, seq, prec), idx in by.items():
        rows, structs = rows_for(m, [items[i][1] for i in idx])
        groups.append((m, seq, prec, np.array(idx), rows, structs))
    opts = options or predictor.options
    eng = predictor.engine

    def evaluate(h: float, p: float) -> np.ndarray:
        host = HostOverhead(h, p) if h > 0 else None
        out = np.empty(len(items))
        for m, seq, prec, idx, rows, structs in groups:
            ev = eng.evaluate(m, rows, structs, seq, prec, host=host, options=opts, provenance=False)
            out[idx] = ev.step_time_s
        return out
    return evaluate


def calibrate_host(platform_id: str, store_path=None, models_dir=None, folds: int = 5,
                   progress: Callable[[str], None] | None = None, save: bool = True):
    from predictor.samples.store import read_measured_runs
    if not isinstance(folds, int) or folds < 2:
        raise InfeasibleConfig("folds", f"must be an integer >= 2, got {folds!r}.",
                               "use e.g. --folds 5 (cross-validation holds out whole models).")
    runs = read_measured_runs(platform=platform_id, store_path=store_path)
    if runs.empty:
        raise InfeasibleConfig("platform", f"'{platform_id}' has no measured runs in the store.",
                               "ingest some first (python -m predictor ingest runs.csv), then calibrate.")
    items, meas, groups, _skipped = runs_to_items(runs)
    if len(items) < 2 or len(set(groups)) < 2:
        raise InfeasibleConfig("platform", f"'{platform_id}' has {len(items)} usable measured runs of "
                                           f"{len(set(groups))} models; the fit needs runs of at least 2 models.",
                               "measure more models on this platform.")
    pr = Predictor(platform_id, models_dir, ComposeOptions(simulate=False, host_overhead=False))
    if progress:
        progress(f"{len(items)} runs of {len(set(groups))} models prepared; fitting")
    sources = ", ".join(sorted(map(str, runs["source"].dropna().unique())))[:300] if "source" in runs else "store"
    ho, report = fit_host_overhead(make_evaluator(pr, items), meas, groups, folds=min(folds, len(set(groups))),
                                   source=f"{len(items)} measured runs: {sources}", progress=progress)
    path = save_host_overhead(paths.models_dir(models_dir), platform_id, ho, report) if save else None
    return ho, report, path

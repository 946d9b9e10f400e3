"""Fit a platform's host (framework) overhead on its measured end-to-end runs.

    python -m predictor calibrate-host --platform dgx-a100-80gb

Every run is decomposed and timed once (kernel and collective times from the regressors, no host
term); the two parameters of `predictor.overhead.HostOverhead` are then searched on a grid, each
candidate re-composing all runs with the closed-form schedule. Cross-validation holds out whole
models (same architecture and sizes), so the reported CV MAPE is the error on models the fit never
saw. Writes models_store/<platform>/host_overhead.json.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np
import pandas as pd

from .compose import ChunkTimes, ComposeOptions, compose
from .layout_io import layout_from_fields, model_from_fields
from .overhead import HostOverhead, fit_host_overhead, save_host_overhead
from .platforms import get_platform
from .predict import MODELS_DIR, Predictor, platform_options
from .specs import InfeasibleConfig

MODEL_KEY = ("arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len")


def _prepare(runs: pd.DataFrame, platform_id: str, models_dir) -> tuple[list, np.ndarray, np.ndarray]:
    pr = Predictor(platform_id, models_dir, ComposeOptions(simulate=False, host_overhead=False))
    items, meas, groups = [], [], []
    for row in runs.to_dict(orient="records"):
        try:
            model, layout = model_from_fields(row), layout_from_fields(row)
            plans, _rows, chunks, tails = pr.chunk_times(model, layout)
        except InfeasibleConfig:
            continue
        items.append((layout, [p.layers for p in plans], chunks, tails))
        meas.append(float(row["step_time_s"]))
        groups.append("|".join(str(row.get(k)) for k in MODEL_KEY))
    return items, np.array(meas), np.array(groups)


def make_evaluator(items: list, options: ComposeOptions = ComposeOptions()) -> Callable[[float, float], np.ndarray]:
    """`evaluate(h, p)`: the step time of every item with that host overhead. `options` should be the
    predictor's (platform_options), so the fit sees the same overlap rules as predict."""
    opts = replace(options, simulate=False)

    def evaluate(h: float, p: float) -> np.ndarray:
        host = HostOverhead(h, p)
        out = np.empty(len(items))
        for i, (layout, layers, chunks, tails) in enumerate(items):
            chs = [ChunkTimes(c.stage, c.chunk, dict(c.fwd), dict(c.bwd), c.recompute_s) for c in chunks] if h > 0 else chunks
            if h > 0:
                for n, ch in zip(layers, chs):
                    Predictor._add_host(ch, n, layout.recompute, host)
            out[i] = compose(chs, tails, pp=layout.pp, vpp=layout.vpp, m=layout.num_micro_batches,
                             schedule=layout.schedule, options=opts).step_time_s
        return out
    return evaluate


def calibrate_host(platform_id: str, store_path=None, models_dir=None, folds: int = 5,
                   progress: Callable[[str], None] | None = None, save: bool = True):
    from .store import read_measured_runs
    runs = read_measured_runs(platform=platform_id, store_path=store_path)
    if runs.empty:
        raise InfeasibleConfig(f"platform '{platform_id}' has no measured runs in the store: ingest some first "
                               f"(python -m predictor ingest runs.csv), then calibrate")
    items, meas, groups = _prepare(runs, platform_id, models_dir)
    if progress:
        progress(f"{len(items)} runs of {len(set(groups))} models decomposed; fitting")
    sources = ", ".join(sorted(map(str, runs["source"].dropna().unique())))[:300] if "source" in runs else "store"
    opts = platform_options(get_platform(platform_id), ComposeOptions())
    ho, report = fit_host_overhead(make_evaluator(items, opts), meas, groups, folds=folds,
                                   source=f"{len(items)} measured runs: {sources}", progress=progress)
    path = save_host_overhead(models_dir or MODELS_DIR, platform_id, ho, report) if save else None
    return ho, report, path

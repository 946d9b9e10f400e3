"""Extrapolation check of the operator regressors: train on small shapes, score on larger ones.

    extrapolation_table("perlmutter-a100", only={"mlp_up"})

Per (op, pass) of a platform's samples in the store and per axis: train on hidden <= 6144 / seq <= 4096 /
tp < 16 and test on hidden >= 7168 / seq == 5120 / tp == 16 (each axis alone, then all three together:
train on rows inside all three limits, test on rows beyond any). The score is the MAPE on the test rows
that pass the regressor's physical bound (`<axis>`), with `n_<axis>` test rows. An axis needs at least
20 training and 5 test rows. The benchmark (tests/benchmarks/op_accuracy.py, table (b)) and the
dashboard's Accuracy page both run it; nothing here prints.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from predictor.hardware.platforms import get_platform
from predictor.model import ops
from predictor.regress.features import roofline_s
from predictor.regress.regressors import OpRegressor
from predictor.samples import store

Mask = Callable[[pd.DataFrame], pd.Series]
# axis -> (train mask, test mask) on a samples frame
EXTRAP_AXES: dict[str, tuple[Mask, Mask]] = {
    "hidden": (lambda g: g["hidden"] <= 6144, lambda g: g["hidden"] >= 7168),
    "seq": (lambda g: g["seq"] <= 4096, lambda g: g["seq"] == 5120),
    "tp": (lambda g: g["tp"] < 16, lambda g: g["tp"] == 16),
}
MIN_TRAIN_ROWS = 20
MIN_TEST_ROWS = 5


def extrapolation_table(platform_id: str, store_path: str | Path | None = None, only: set[str] | None = None,
                        progress: Callable[[dict], None] | None = None) -> pd.DataFrame:
    """One row per (op, pass): platform, op, pass, and per axis that has enough rows on both sides the
    extrapolation MAPE (`hidden`, `seq`, `tp`, `all`) and its test rows (`n_hidden`, ...).
    `only`: the ops to check (default every op). `progress(row)` is called after each row."""
    dev = get_platform(platform_id).device
    d = store.read_op_samples(platform_id, store_path=store_path)
    rows = []
    for (op, ps), g in d.groupby(["op", "pass"], sort=True):
        if op not in ops.OPS or (only and op not in only):
            continue
        row: dict = {"platform": platform_id, "op": op, "pass": ps}
        axes = {}
        for ax, (tr_f, te_f) in EXTRAP_AXES.items():
            if g[ax].isna().all():
                continue
            tr, te = tr_f(g).fillna(False).to_numpy(bool), te_f(g).fillna(False).to_numpy(bool)
            if tr.sum() >= MIN_TRAIN_ROWS and te.sum() >= MIN_TEST_ROWS:
                axes[ax] = (tr, te)
        if len(axes) > 1:
            tr_all = np.logical_and.reduce([t for t, _ in axes.values()])
            te_all = np.logical_or.reduce([t for _, t in axes.values()])
            if tr_all.sum() >= MIN_TRAIN_ROWS:
                axes["all"] = (tr_all, te_all)
        for ax, (tr, te) in axes.items():
            gt, ge = g[tr], g[te]
            r = OpRegressor(op, ps).fit(gt, gt["duration_s"].to_numpy(), dev)
            pred = r.predict(ge, dev)
            y = ge["duration_s"].to_numpy()
            ok = y >= r.physical_bound * roofline_s(op, ps, ge, dev)
            ape = np.abs(pred[ok] - y[ok]) / y[ok]
            row[ax] = float(ape.mean()) if len(ape) else None
            row[f"n_{ax}"] = int(ok.sum())
        rows.append(row)
        if progress is not None:
            progress(row)
    return pd.DataFrame(rows)

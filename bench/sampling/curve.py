"""How regressor error falls as samples grow: the evidence that 'lightweight' sampling is enough.

For every (op, pass) of a sample directory: the points are ordered by their index in the op's Sobol
sequence; the last quarter is held out as the test set, and regressors (the same `OpRegressor` as
`predictor train`, target log(duration / roofline)) are fitted on the first n points for growing n
and scored by MAPE on the held-out points. The sampling cost of n points is the measured wall time
of those points (warm-ups and repeats included).

    python -m bench curve --samples bench/samples/cpu-2t [--platform cpu-2t]
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from bench.sampling import store_io
from predictor.hardware.platforms import get_platform
from predictor.model import ops as P

PAPER_SAMPLES_PER_GEMM_OP = 1755  # arXiv 2509.22832, per GEMM operator and pass
N_STEPS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def error_curve(samples_dir: str | Path, platform: str | None = None, steps: tuple[int, ...] = N_STEPS,
                test_fraction: float = 0.25) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per (op, pass, n) rows, summary per n)."""
    from predictor.regress.regressors import OpRegressor
    df = store_io.read_shards(Path(samples_dir), "ops")
    if df.empty:
        raise FileNotFoundError(f"no ops-*.parquet samples under {samples_dir}")
    platform = platform or str(df["platform"].iloc[0])
    device = get_platform(platform).device
    rows = []
    for (op, ps), g in df.groupby(["op", "pass"], sort=True):
        if op not in P.OPS:
            continue
        g = g.sort_values(["design_index", "measured_at"]).drop_duplicates("design_index", keep="last")
        n_test = max(4, int(round(len(g) * test_fraction)))
        if len(g) - n_test < min(steps):
            continue
        train, test = g.iloc[:-n_test], g.iloc[-n_test:]
        dtype = str(g["dtype"].iloc[0])
        ns = [n for n in steps if n < len(train)] + [len(train)]
        for n in ns:
            tr = train.iloc[:n]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    r = OpRegressor(op, ps, {"num_threads": 1}).fit(tr, tr["duration_s"].to_numpy(), device, dtype,
                                                                    cv_folds=0)
                except ValueError:
                    continue
                pred = r.predict(test, device, dtype)
            ape = np.abs(pred - test["duration_s"].to_numpy()) / test["duration_s"].to_numpy()
            rows.append({"op": op, "pass": ps, "n_train": n, "n_test": len(test), "mape": float(np.mean(ape)),
                         "median_ape": float(np.median(ape)),
                         "sampling_s": float(tr["wall_s"].sum()) if "wall_s" in tr else np.nan})
    per = pd.DataFrame(rows)
    if per.empty:
        return per, per
    models = per.groupby(["op", "pass"]).ngroups
    summ = []
    for n in sorted(set(per["n_train"]) & set(steps)):
        # every model at n, or at all its training points when it has fewer than n
        at = per[per["n_train"] <= n].sort_values("n_train").groupby(["op", "pass"]).tail(1)
        worst = at.loc[at["mape"].idxmax()]
        full = at["n_train"] == n
        summ.append({"n_per_model": n, "models": len(at), "models_with_n": int(full.sum()),
                     "samples_total": int(at["n_train"].sum()), "sampling_s": float(at["sampling_s"].sum()),
                     "mape_mean": float(at["mape"].mean()), "mape_median": float(at["mape"].median()),
                     "worst": f"{worst['op']}.{worst['pass']} {worst['mape']:.1%}"})
    out = pd.DataFrame(summ)
    out.attrs["models"] = models
    return per, out


def print_curve(samples_dir: str | Path, platform: str | None = None) -> pd.DataFrame:
    per, summ = error_curve(samples_dir, platform)
    if summ.empty:
        print("not enough samples for a curve")
        return summ
    print(f"\n== Regressor error vs samples ({samples_dir}): train on the first n Sobol points of each "
          "(op, pass), MAPE on the held-out last quarter ==")
    fmt = summ.copy()
    for c in ("mape_mean", "mape_median"):
        fmt[c] = fmt[c].map(lambda v: f"{v:.1%}")
    fmt["sampling_s"] = fmt["sampling_s"].map(lambda v: f"{v:.0f}")
    print(fmt.to_string(index=False))
    last = per.sort_values("n_train").groupby(["op", "pass"]).tail(1)
    print("\n-- per model at its largest n")
    t = last[["op", "pass", "n_train", "n_test", "mape", "median_ape", "sampling_s"]].copy()
    t["mape"] = t["mape"].map(lambda v: f"{v:.1%}")
    t["median_ape"] = t["median_ape"].map(lambda v: f"{v:.1%}")
    t["sampling_s"] = t["sampling_s"].map(lambda v: f"{v:.1f}")
    print(t.to_string(index=False))
    print(f"\n(the paper used about {PAPER_SAMPLES_PER_GEMM_OP:,} samples per GEMM op and pass)")
    return summ

"""Where the end-to-end error of the vTrain runs sits: per step or per micro-batch. Prints tables.

    python -m tests.benchmarks.step_intercepts [--source vtrain] [--in-sample]

vTrain measured each layout (hidden, layers, TP, PP, DP, micro-batch) at 1, 2, 4 and 8 times the global batch, so
the number of micro-batches n varies with everything else fixed. A straight line through step time against n
splits a layout's time into what each micro-batch costs (the slope: forward, backward, recomputation, TP
collectives, host time) and what the step costs once (the intercept: the optimizer, the data-parallel gradient
reduction, the pipeline's fill and drain). Doing the same with the predictions shows which of the two the model
gets wrong, which a per-run error cannot. Predictions are source-held-out by default (the end-to-end terms
refitted without the source, as `calibrate-framework` scores it; ~15 s) or, with `--in-sample`, from terms fitted on
every run. It also prints how far the measured step times lie from their layout's straight line: for vTrain
not at all, to the last digit (its rows are derived from fewer measurements than it has rows).
"""
from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

LAYOUT = ["hidden", "layers", "tp", "pp", "dp", "micro_batch"]


def predictions(source: str, in_sample: bool) -> pd.DataFrame:
    """Every GPU run of the store with its measured and predicted step time (held out from `source` unless
    `in_sample`) and its layout fields."""
    from predictor.calibrate_framework import TermsFitOptions, fit_terms, gpu_runs, load_host_floor, prepare_runs
    raw = gpu_runs()
    runs = prepare_runs(raw)
    floor, _warning = load_host_floor(None)
    options = TermsFitOptions().with_floor(floor)
    own = runs.source_ids == source
    if not own.any():
        raise SystemExit(f"no runs of source {source!r} in the store (sources: {sorted(set(runs.source_ids))})")
    terms = fit_terms(runs, None if in_sample else ~own, options)
    d = pd.DataFrame({"run_id": runs.run_ids, "source": runs.source_ids, "measured_s": runs.measured_s,
                      "predicted_s": runs.predict(terms)})
    fields = raw.assign(run_id=raw["run_id"].astype(str))[["run_id", *LAYOUT, "global_batch"]]
    d = d[d["source"] == source].merge(fields, on="run_id", how="left")
    d["micro_batches"] = d["global_batch"] / (d["micro_batch"] * d["dp"])
    return d


def intercepts(d: pd.DataFrame) -> pd.DataFrame:
    """Per layout measured at three or more micro-batch counts: per-step (intercept) and per-micro-batch (slope)
    seconds, measured and predicted."""
    rows = []
    for key, g in d.groupby(LAYOUT):
        if g["micro_batches"].nunique() < 3:
            continue
        b_m, a_m = np.polyfit(g["micro_batches"], g["measured_s"], 1)
        b_p, a_p = np.polyfit(g["micro_batches"], g["predicted_s"], 1)
        off = g["measured_s"] - (a_m + b_m * g["micro_batches"])
        rows.append({**dict(zip(LAYOUT, key, strict=True)), "line_residual_ms": float(off.abs().max()) * 1e3,
                     "step_ms_measured": a_m * 1e3,
                     "step_ms_predicted": a_p * 1e3, "per_mb_ms_measured": b_m * 1e3, "per_mb_ms_predicted": b_p * 1e3})
    r = pd.DataFrame(rows)
    r["step_ms_over"] = r["step_ms_predicted"] - r["step_ms_measured"]
    r["step_ms_over_per_layer"] = r["step_ms_over"] / (r["layers"] / r["pp"])
    r["per_mb_error"] = r["per_mb_ms_predicted"] / r["per_mb_ms_measured"] - 1
    return r


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default="vtrain")
    ap.add_argument("--in-sample", action="store_true", help="terms fitted on every run, the source included")
    a = ap.parse_args(argv)
    from predictor.calibrate_framework import error_summary
    d = predictions(a.source, a.in_sample)
    r = intercepts(d)
    how = "in-sample" if a.in_sample else "source-held-out"
    e = error_summary(d["predicted_s"].to_numpy(), d["measured_s"].to_numpy())
    print(f"== {a.source}: {len(d)} runs, {how} MAPE {e['mape']:.1%} (mean signed {e['mean_signed']:+.1%}); "
          f"{len(r)} layouts measured at >= 3 micro-batch counts ==\n")
    res = r["line_residual_ms"]
    print(f"how straight the measured lines are: largest distance of a measured step time from its layout's line "
          f"{res.max():.4f} ms (median {res.median():.4f} ms); independently timed runs do not fall on a line "
          f"to the last digit, so an exact one says the source derived its step times from fewer "
          f"measurements than it has rows.\n")
    pd.set_option("display.width", 200)
    f = {"step_ms_measured": "{:.1f}", "step_ms_predicted": "{:.1f}", "step_ms_over": "{:+.1f}",
         "step_ms_over_per_layer": "{:+.2f}", "per_mb_error": "{:+.1%}"}
    cols = ["step_ms_measured", "step_ms_predicted", "step_ms_over", "step_ms_over_per_layer", "per_mb_error"]
    for by in (["pp"], ["hidden", "tp"], ["tp", "micro_batch"]):
        t = r.groupby(by)[cols].mean()
        t.insert(0, "layouts", r.groupby(by).size())
        print(f"per step (intercept) and per micro-batch (slope), mean over layouts, by {', '.join(by)}:")
        print(t.to_string(formatters={k: v.format for k, v in f.items()}))
        print()
    print("step_ms_over: predicted minus measured seconds per step that do not grow with the micro-batches "
          "(optimizer, gradient reduction, pipeline fill); per_mb_error: the signed error of each micro-batch's cost.")


if __name__ == "__main__":
    main()

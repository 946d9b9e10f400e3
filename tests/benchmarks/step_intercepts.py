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

Last, one step further: per (hidden, tp, micro-batch), a straight line of the per-micro-batch cost against layers per
stage gives the cost of one layer per micro-batch, measured and predicted, and flags the cells where a layer costs
less at twice the micro-batch than at the micro-batch before (twice the tokens in less time), with the error of the
runs in those cells and in the others.
"""
from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

LAYOUT = ["hidden", "layers", "tp", "pp", "dp", "micro_batch"]
LINE = ["hidden", "tp", "micro_batch", "pp", "dp"]   # layouts that differ only in layers: one line against layers


def predictions(source: str, in_sample: bool) -> pd.DataFrame:
    """Every GPU run of the store with its measured and predicted step time (held out from `source` unless
    `in_sample`) and its layout fields."""
    from predictor.calibrate.framework import TermsFitOptions, fit_terms, gpu_runs, load_host_floor, prepare_runs
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


def per_layer(r: pd.DataFrame) -> pd.DataFrame:
    """Per (hidden, tp, micro_batch): a straight line of each layout's per-micro-batch cost against its layers per
    stage, across the layouts that differ only in layers, pp and dp: the cost of one layer per micro-batch (forward,
    recomputation, backward, TP collectives, host time), measured and predicted, and how much the measured one varies
    between layouts (pp and dp should not change it)."""
    r = r.assign(layers_per_stage=r["layers"] / r["pp"])
    lines = []
    for key, g in r.groupby(LINE):
        if g["layers_per_stage"].nunique() < 3:
            continue
        b_m, _ = np.polyfit(g["layers_per_stage"], g["per_mb_ms_measured"], 1)
        b_p, _ = np.polyfit(g["layers_per_stage"], g["per_mb_ms_predicted"], 1)
        lines.append({**dict(zip(LINE, key, strict=True)),
                      "measured": b_m, "predicted": b_p})
    d = pd.DataFrame(lines)
    out = d.groupby(["hidden", "tp", "micro_batch"]).agg(
        lines=("measured", "size"), layer_ms_measured=("measured", "mean"),
        layer_ms_predicted=("predicted", "mean"),
        measured_range_ms=("measured", lambda x: float(x.max() - x.min()))).reset_index()
    out["error"] = out["layer_ms_predicted"] / out["layer_ms_measured"] - 1
    # twice the tokens in less time: a micro-batch of 2 cannot cost less per layer than a micro-batch of 1
    one = out.set_index(["hidden", "tp", "micro_batch"])["layer_ms_measured"]
    out["cheaper_than_half_the_batch"] = [
        bool(m > 1 and (h, t, m // 2) in one.index and v < one[(h, t, m // 2)])
        for h, t, m, v in out[["hidden", "tp", "micro_batch", "layer_ms_measured"]].itertuples(index=False)]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default="vtrain")
    ap.add_argument("--in-sample", action="store_true", help="terms fitted on every run, the source included")
    a = ap.parse_args(argv)
    from predictor.calibrate.framework import error_summary
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
    pl = per_layer(r)
    if pl.empty:
        return
    print("\nper layer and micro-batch (slope of the per-micro-batch cost against layers per stage, mean over the "
          "pp x dp layouts of each cell; measured_range_ms: how much the measured slope differs between them):")
    print(pl.to_string(index=False, formatters={"layer_ms_measured": "{:.2f}".format,
                                                "layer_ms_predicted": "{:.2f}".format,
                                                "measured_range_ms": "{:.3f}".format, "error": "{:+.1%}".format}))
    bad = pl[pl["cheaper_than_half_the_batch"]]
    if not bad.empty:
        cells = {(h, t) for h, t in bad[["hidden", "tp"]].itertuples(index=False)}
        inside = np.array([(h, t) in cells for h, t in d[["hidden", "tp"]].itertuples(index=False)])
        e_in = error_summary(d.loc[inside, "predicted_s"].to_numpy(), d.loc[inside, "measured_s"].to_numpy())
        e_out = error_summary(d.loc[~inside, "predicted_s"].to_numpy(), d.loc[~inside, "measured_s"].to_numpy())
        print(f"\n{len(bad)} cells where a layer costs less per micro-batch at twice the micro-batch (twice the "
              f"tokens in less time; not a physical cost, so no model term can follow it): (hidden, tp) "
              f"{', '.join(f'({h}, {t})' for h, t in sorted(cells))}. The {int(inside.sum())} runs of those "
              f"hidden x tp cells: {how} MAPE {e_in['mape']:.1%} ({e_in['mean_signed']:+.1%}); the other "
              f"{int((~inside).sum())}: {e_out['mape']:.1%} ({e_out['mean_signed']:+.1%}).")


if __name__ == "__main__":
    main()

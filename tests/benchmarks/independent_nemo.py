"""Independent check on published NVIDIA NeMo / Megatron-Core training runs (MoE, FP8, context parallelism,
H100 / B200 / GB200), never fitted to. Prints tables.

    python -m tests.benchmarks.independent_nemo [--source ID ...] [--csv OUT]

The runs, the models behind their printed names and the documents they come from are in
predictor/catalog/independent_nemo.json; `predictor.checks.independent_nemo` checks every row (GPU count = tp x pp x
cp x dp,
global batch vs micro-batch x dp and the printed GA, a printed step time against tokens/s, the published TFLOP/s per
token against the same model's other rows), drops and counts the failures, keeps but does not predict rows without a
platform (GB300, B300), without a stated or modelled precision, or of a model the predictor does not model, and
predicts the rest with the product as shipped. Runs whose model is a Mixture-of-Experts are reported with the
predictor's reason while it does not accept the MoE columns. Measured step time = global_batch x seq_len /
(tokens/s/GPU x GPUs) (the documents' tokens/s/GPU), or the cards' printed step time.
Assumed for every prediction (the tables do not say): no recomputation, Megatron distributed optimizer (ZeRO-1;
ZeRO-3 where FSDP > 0), sequence parallelism when tp > 1, expert tensor parallelism 1.
"""
from __future__ import annotations

import argparse
from collections import Counter

import pandas as pd

from predictor.checks.independent_nemo import load, run_check


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", nargs="*", choices=list(load()["sources"]), help="only these sources")
    ap.add_argument("--csv", help="write the per-run table here")
    a = ap.parse_args(argv)
    doc = load()
    c = run_check(a.source)
    d = c.runs
    pd.set_option("display.width", 200)
    fmt = {**dict.fromkeys(("mape", "median_ape", "worst_ape"), "{:.1%}".format), "mean_signed": "{:+.1%}".format}
    print("== Independent check: published NeMo / Megatron-Bridge training runs (never fitted to) ==")
    for sid, src in doc["sources"].items():
        if a.source and sid not in a.source:
            continue
        print(f"- {sid}: {len(src['rows'])} rows; {src['document']}")
    print(f"\n{len(d)} runs checked and kept, {len(c.dropped)} rows dropped or not predictable:")
    for reason, n in c.dropped_counts.items():
        print(f"  {n:3d}  {reason}")
    print("\nkept runs per source / platform / model:")
    print(d.groupby(["source", "platform", "model_key"]).size().rename("runs").to_string())
    for by, title in ((None, "overall"), ("platform", "per GPU kind"), ("kind", "MoE vs dense"),
                      ("pred_precision", "per precision"), ("source", "per source"),
                      ("release", "per software release (the container a table was measured with)")):
        print(f"\n-- {title} --")
        print(c.summary(by).to_string(index=False, formatters=fmt))
    errors = Counter(e for e in d["error"] if e)
    if errors:
        print("\nnot predicted (the predictor's reason, per run):")
        for e, n in errors.most_common():
            print(f"  {n:3d}  {e}")
    ok = d[d["predicted_s"].notna()]
    if len(ok):
        print("\nper run (predicted):")
        print(ok.sort_values("ape", ascending=False)[
            ["source", "release", "system", "model", "gpus", "precision", "tp", "pp", "cp", "vp", "ep",
             "measured_s", "predicted_s", "signed_error", "memory_gib", "fits"]].to_string(
            index=False, float_format=lambda v: f"{v:.3g}"))
    if a.csv:
        d.to_csv(a.csv, index=False)


if __name__ == "__main__":
    main()

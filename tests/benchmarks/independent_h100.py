"""The independent check on a GPU nobody sampled: published H100 runs, never fitted to. Prints tables.

    python -m tests.benchmarks.independent_h100 [--source llm-foundry-h100 | llm-foundry-h100-fp8]
                                                [--platform dgx-h100] [--csv OUT]

The runs and their provenance live in predictor/catalog/independent_runs.json (MosaicML llm-foundry's
'H100 80GB BF16' table: MPT 760M-70B, PyTorch FSDP FULL_SHARD, 8-64 GPUs); `predictor.checks.independent` checks
each row (batch arithmetic; published MFU recomputed from the throughput) and predicts it with the product
as shipped. `--source llm-foundry-h100-fp8` runs the same README's 'H100 80GB FP8' table (MPT 350M-3B,
8 GPUs) with precision fp8: its FP8 GEMM times are BF16 samples x the MAMF ratio (predictor.step.fp8), never
FP8 measurements. No H100 operator was sampled (dgx-h100's operators are transferred from GH200 samples) and no
H100 run is in the store or in any fit, so this is how far the planner holds on a GPU it has not measured.
The section does not state the network between nodes: rows on 16-64 GPUs are shown apart.

Where the source names a reference (the same README's A100 80GB table, in the store and fitted on), each run is also
set beside the A100 run of the same configuration: measured vs predicted speed-up over the A100. A run's error is
the A100 run's error times the speed-up's, so this table says how much of the H100 error is the transfer to the
unsampled GPU and how much the product gets wrong on the sampled one too.
"""
from __future__ import annotations

import argparse

import pandas as pd

from predictor.checks.independent import (
    SPEEDUP_COLUMNS,
    load_sources,
    reference_runs,
    run_check,
    speedup_pairs,
    speedup_summary,
)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default="llm-foundry-h100", choices=list(load_sources()))
    ap.add_argument("--platform", help="predict on this cluster instead of the source's")
    ap.add_argument("--csv", help="write the per-run table here")
    a = ap.parse_args(argv)
    c = run_check(a.source, platform=a.platform)
    d = c.runs
    fmt = {**dict.fromkeys(("mape", "median_ape", "worst_ape", "published_mfu", "predicted_mfu"), "{:.1%}".format),
           "mean_signed": "{:+.1%}".format}
    print(f"== Independent check: {c.source['description']} ==\nsource: {c.source['document']} "
          f"({c.source['licence']}); predicted on {d['platform'].iloc[0]}; {len(d)} runs; dropped: "
          f"{c.dropped or 'none'}")
    for by in (None, "nodes", "model"):
        print(c.summary(by).to_string(index=False, formatters=fmt))
        print()
    # where the error lives: short sequences are GEMM-bound, long ones attention-bound; checkpointing re-runs forwards
    by_seq = c.summary("seq_len")
    by_seq = by_seq.iloc[pd.to_numeric(by_seq["group"]).argsort()]
    print("by sequence length:")
    print(by_seq.to_string(index=False, formatters=fmt))
    print()
    print("by activation checkpointing:")
    print(c.summary("activation_checkpointing").to_string(index=False, formatters=fmt))
    print()
    print("worst runs:")
    print(d.sort_values("ape", ascending=False).head(8)[
        ["model", "seq_len", "gpus", "micro_batch", "activation_checkpointing", "measured_s", "predicted_s",
         "signed_error", "published_mfu", "predicted_mfu", "memory_gib"]].to_string(
        index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"\nrests on (first run): {d['provenance'].iloc[0]}")
    print_speedups(c)
    if a.csv:
        d.to_csv(a.csv, index=False)


def print_speedups(c) -> None:
    """The speed-up over the reference GPU, measured vs predicted, by sequence length and checkpointing."""
    p = speedup_pairs(c, reference_runs(c))
    if p.empty:
        return
    ref = c.source["reference"]
    print(f"\n== the transfer alone: speed-up over {ref['platform']} (store source {ref['source_id']}, fitted on) "
          f"for the {len(p)} runs with an A100 run of the same model, sequence length, GPUs, micro-batch and "
          f"checkpointing ==")
    print("1 + error = (1 + A100 run's error) x measured speed-up / predicted speed-up\n")
    fmt = {"measured_speedup": "{:.2f}".format, "predicted_speedup": "{:.2f}".format,
           **dict.fromkeys(SPEEDUP_COLUMNS[2:], "{:+.1%}".format)}
    for by in ("seq_len", "activation_checkpointing"):
        print(speedup_summary(p, by).rename(columns={"group": by}).to_string(index=False, formatters=fmt))
        print()
    allp = speedup_summary(p).iloc[0]
    print(f"all {len(p)}: measured speed-up {allp['measured_speedup']:.2f}, predicted {allp['predicted_speedup']:.2f} "
          f"({allp['speedup_error']:+.1%}); A100 runs' mean signed error {allp['reference_signed_error']:+.1%}; "
          f"H100 runs' {allp['signed_error']:+.1%}")


if __name__ == "__main__":
    main()

"""Published per-GPU memory of Megatron-Core runs (MoE, FP8, context parallelism) vs predictor.step.memory: prints a
table.

    python -m tests.benchmarks.memory_published [--csv OUT]

The figures, their documents and what each counts are in predictor/catalog/published_memory.json (never fitted to):
FlagPerf's Megatron-Core runs (Llama-3-8B BF16 and FP8 on H100, BF16 on A800; an 8-expert top-2 Qwen1.5 MoE on A800,
BF16 and FP16), whose 'mem' column is device memory in use read like nvidia-smi (the CUDA context and the caching
allocator's reserve included); torch's max allocated of Megatron-Bridge runs (Qwen3-30B-A3B EP16, Llama-3.2-1B DP8 with
its max reserved) and of Megatron-LM's functional tests (golden mem-max-allocated-bytes, last rank = last pipeline
stage: a 7B GPT TP4 / PP4, a 12-layer GPT, an 8-expert MoE, on H100 and A100); and figures kept as found but not
comparable (Megatron-LM issue #2772's Qwen3-30B-A3B
EP8 max reserved, PR #7220's context-parallel peaks on a test model, a Megatron-Bridge card's 65 GiB bound).
Ours: `estimate_memory` for the quantity each figure counts ('measures': device memory in use = allocated + the
caching allocator's reserve + CUDA context + NCCL buffers; reserved; allocated), on the stage with the largest total;
'ours_alt' is the estimate with the alternative recomputation where the source is ambiguous about it. The columns
allocated / nccl / allocator show the parts of our device figure. The allocated figures are summarised apart.
"""
from __future__ import annotations

import argparse

import pandas as pd

from predictor.checks.published_memory import compare


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", help="write the table here")
    a = ap.parse_args(argv)
    d = compare()
    pd.set_option("display.width", 200)
    pd.set_option("display.max_colwidth", 120)
    ok = d[d["ours_gib"].notna()]
    print("== Published per-GPU memory vs predictor.step.memory (never fitted to) ==")
    print(ok[["id", "platform", "precision", "measures", "published_gib", "ours_gib", "error",
              "ours_alt_gib"]].to_string(
        index=False, formatters={"error": "{:+.1%}".format}, float_format=lambda v: f"{v:.1f}"))
    if len(ok):
        e = ok["error"]
        print(f"\n{len(ok)} compared: mean |error| {e.abs().mean():.1%}, mean signed {e.mean():+.1%}, "
              f"worst {e.abs().max():.1%}")
        al = ok.loc[ok["measures"] == "allocated", "error"]
        if len(al):
            print(f"{len(al)} allocated (torch max allocated): mean |error| {al.abs().mean():.1%}, "
                  f"mean signed {al.mean():+.1%}, worst {al.abs().max():.1%}")
    print("\nwhat each published figure counts:")
    for _, r in d.drop_duplicates("counts").iterrows():
        print(f"  {r['id']}: {r['counts']}")
    rest = d[d["ours_gib"].isna()]
    if len(rest):
        print("\nnot compared:")
        for _, r in rest.iterrows():
            print(f"  {r['id']} ({r['published_gib']:.1f} GiB): {r['note']}")
    if a.csv:
        d.to_csv(a.csv, index=False)


if __name__ == "__main__":
    main()

"""Every published run the project knows, as a memory test: prints, per source, how many runs are judged
"fits", "tight", "does not fit" (the target is none: these layouts really trained), and for each run judged
"does not fit" its allocated / reserved / total memory, how far over the usable memory it is and the parts of its
fullest stage, largest first.

    python -m tests.benchmarks.memory_verdicts [--csv OUT]

Sources: the store's measured runs, the independent checks (llm-foundry H100 BF16 / FP8, NeMo / Megatron-Bridge:
never fitted to) and the layouts of predictor/catalog/published_memory.json (predictor.checks.memory_verdicts).
"""
from __future__ import annotations

import argparse
import sys

import pandas as pd

from predictor.checks.memory_verdicts import every_known_run, judge_runs, verdict_counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", help="also write every run's row to this CSV")
    a = ap.parse_args(argv)
    judged = judge_runs(every_known_run(), progress=lambda m: print(m, file=sys.stderr))
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 90,
                           "display.max_rows", 500):
        print("== Memory verdicts of published runs that really trained (target: none 'does not fit') ==")
        print(verdict_counts(judged).to_string(index=False))
        bad = judged[judged["verdict"] == "does not fit"]
        if len(bad):
            print("\n== Judged 'does not fit': GiB allocated (torch) / reserved / total (nvidia-smi), over, parts ==")
            cols = ["source", "run", "platform", "memory_allocated_gib", "memory_reserved_gib", "memory_gib",
                    "over_gib", "parts"]
            print(bad[cols].round(1).to_string(index=False))
        nope = judged[judged["verdict"] == "not predicted"]
        if len(nope):
            print("\n== Not predicted (the reason) ==")
            print(nope.groupby(["source", "error"]).size().rename("runs").reset_index().to_string(index=False))
    if a.csv:
        judged.to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Golden predictions: a fixed, deterministic set of a few hundred predictions written to a CSV at full
precision, and a comparison of two such files. Used to show that a change which must not move predictions
(a restructure, a clean-up) did not move any of them:

    python -m tests.benchmarks.golden_predictions --save /tmp/before.csv      # on the old commit
    python -m tests.benchmarks.golden_predictions --compare /tmp/before.csv   # on the new one

It is a tool, not a unit test: predictions legitimately change with every refit, so no expected value is
kept in the repository.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import sys
from pathlib import Path

from predictor.model.errors import InfeasibleConfig
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.plan.predict import get_predictor
from predictor.plan.search import search

PLATFORMS = ("dgx-a100-80gb", "dgx-h100", "dgx-b200", "perlmutter-a100", "vista-gh200", "gb200-nvl72",
             "mi300x-8", "cpu-2t")
MODELS = ("gpt3-1.3b", "llama3-8b", "llama3-70b", "mixtral-8x7b", "qwen3-30b-a3b")
FIELDS = ("step_time_s", "expected_error", "mfu", "memory_gib", "pipeline_s")


def _layouts(model_name: str, platform_id: str):
    """Layouts of 8-64 GPUs that a user might try (some infeasible on purpose: the error text is compared too)."""
    moe = model_name.startswith(("mixtral", "qwen3-30b"))
    for tp, pp, dp, mb, rc, zero in itertools.product((1, 2, 8), (1, 4), (1, 4), (1, 2), ("none", "full"), (0, 1)):
        n = tp * pp * dp
        kw = dict(num_gpus=n, tp=tp, pp=pp, dp=dp, micro_batch=mb, global_batch=mb * dp * 8, seq_len=4096,
                  recompute=rc, zero_stage=zero, sequence_parallel=tp > 1)
        if moe:
            kw["ep"] = dp
        yield Layout(**kw)


def collect_rows() -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for pid in PLATFORMS:
        P = get_predictor(pid)
        for name in MODELS:
            model = get_preset(name)
            for i, L in enumerate(_layouts(name, pid)):
                if i % 3:  # every third layout: a few hundred in all, all kinds represented
                    continue
                key = f"{pid}|{name}|{L.tp}x{L.pp}x{L.dp}|mb{L.micro_batch}|{L.recompute}|z{L.zero_stage}"
                try:
                    p = P.predict(model, L, timeline=False)
                except InfeasibleConfig as e:
                    rows.append({"key": key, "result": f"infeasible: {e}"})
                    continue
                vals = {f: repr(float(getattr(p, f))) for f in FIELDS}
                vals.update({f"b_{k}": repr(float(v)) for k, v in sorted(p.breakdown_s.items())})
                rows.append({"key": key, "result": "ok", **vals, "warnings": " | ".join(p.warnings)})
        if pid.startswith("cpu-"):
            continue
        rep = search(get_preset("llama3-70b"), P, 64, global_batch=512, seq_len=4096, top_k=5)
        for j, r in enumerate(rep.top):
            rows.append({"key": f"{pid}|search-llama3-70b|{j}", "result": "ok",
                         "step_time_s": repr(float(r.step_time_s)),
                         "layout": repr(r.layout)})
    return rows


def write_rows(rows: list[dict[str, str]], path: Path) -> None:
    cols = sorted({k for r in rows for k in r}, key=lambda c: (c != "key", c != "result", c))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def compare_rows(rows: list[dict[str, str]], path: Path) -> int:
    with path.open(newline="") as f:
        old = {r["key"]: {k: v for k, v in r.items() if v != ""} for r in csv.DictReader(f)}
    new = {r["key"]: {k: v for k, v in r.items() if v != ""} for r in rows}
    def numbers(r: dict[str, str] | None) -> dict[str, str] | None:
        return None if r is None else {k: v for k, v in r.items() if k != "warnings"}
    differ = [k for k in sorted(set(old) | set(new)) if numbers(old.get(k)) != numbers(new.get(k))]
    warned = [k for k in sorted(set(old) & set(new)) if k not in differ and old[k] != new[k]]
    for k in differ[:20]:
        print(f"differs: {k}\n  before: {old.get(k)}\n  after:  {new.get(k)}")
    for k in warned[:3]:
        added = set(new[k].get("warnings", "").split(" | ")) - set(old[k].get("warnings", "").split(" | "))
        gone = set(old[k].get("warnings", "").split(" | ")) - set(new[k].get("warnings", "").split(" | "))
        print(f"warnings only: {k}\n  added: {sorted(added - {''})}\n  gone:  {sorted(gone - {''})}")
    print(f"{len(new)} predictions, {len(old)} in {path}: {len(differ)} differ in a number or an error, "
          f"{len(warned)} more in their warnings only")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--save", type=Path, help="write the golden predictions to this CSV")
    g.add_argument("--compare", type=Path, help="compare today's predictions with this CSV")
    a = ap.parse_args(argv)
    rows = collect_rows()
    if a.save:
        write_rows(rows, a.save)
        print(f"{len(rows)} predictions written to {a.save}")
        return 0
    return compare_rows(rows, a.compare)


if __name__ == "__main__":
    sys.exit(main())

"""How the end-to-end terms' source-held-out errors depend on the fit's fixed choices: prints tables.

    python -m tests.benchmarks.terms_sensitivity [--store PATH]
        [--only alone floor flagged blend contention power spread]

Every table refits the terms (predictor.calibrate.framework) leave-one-source-out on the store's measured GPU
runs, as `calibrate-framework` does, with one choice changed, and prints per source the held-out MAPE, the mean
signed error and the power factor of the fit that predicted it:

- alone: each source fitted by itself (what each would want: power factor, host terms; in-sample error);
- floor: each measured host floor in the repository (models_store/host_floor.json and every
  bench/samples/machine-*/host_floor.json, with its recomputation passes) as the fit's lower bound;
- flagged: runs with GEMM dimensions not in multiples of 8 left out of the fit (shipped) or fitted on;
- blend: the exponent p of the host / GPU blend (shipped 2);
- contention: kappa held at a few values (shipped: the published measurement, 0.159; the fit does not fit it);
- power: the power factor's form, 'linear' (seconds added per second of tensor-core work at MAMF) or 'cap'
  (no tensor-core kernel faster than MAMF / (1 + beta)), each refitted (predictor.step.terms);
- spread: the GPU speed spread sigma (the slowest of a job's n GPUs sets the pace) fitted (shipped) or held at a
  few values.
Runs 1-2 minutes per table on 2 cores (all seven: about 14 minutes). Nothing is saved.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from predictor.calibrate import framework as cf
from predictor.step.host_floor import HostFloor, host_floor_from_dict, load_host_floor
from predictor.step.terms import POWER_FORMS, PUBLISHED_CONTENTION

ROOT = Path(__file__).resolve().parents[2]
TABLES = ("alone", "floor", "flagged", "blend", "contention", "power", "spread")


def held_out(runs: cf.RunSet, options: cf.TermsFitOptions) -> dict[str, str]:
    """source -> 'MAPE (signed) beta sigma' of its runs predicted by terms fitted without it."""
    held, terms = cf.held_out_predictions(runs, options)
    out = {}
    for s, t in terms.items():
        m = runs.source_ids == s
        e = held[m] / runs.measured_s[m] - 1.0
        out[s] = f"{np.abs(e).mean():.1%} ({e.mean():+.1%}) b={t.power_factor:.3f} s={t.speed_spread:.3f}"
    return out


def table(runs: cf.RunSet, variants: Iterable[tuple[str, cf.TermsFitOptions]]) -> pd.DataFrame:
    return pd.DataFrame([{"variant": name, **held_out(runs, opt)} for name, opt in variants])


def floors() -> list[tuple[str, HostFloor]]:
    """(where, floor) of every host floor measured in the repository."""
    paths = [ROOT / "models_store" / "host_floor.json", *sorted(ROOT.glob("bench/samples/machine-*/host_floor.json"))]
    return [(f"{p.relative_to(ROOT)}", host_floor_from_dict(json.loads(p.read_text()), p)) for p in paths]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store")
    ap.add_argument("--only", nargs="*", choices=TABLES, default=list(TABLES))
    a = ap.parse_args()
    runs = cf.prepare_runs(cf.gpu_runs(a.store))
    floor, _warning = load_host_floor()
    base = cf.TermsFitOptions().with_floor(floor)
    print(f"{len(runs)} measured GPU runs; shipped options: {cf.terms_in_words(cf.fit_terms(runs, None, base))}")
    pd.set_option("display.width", 200)
    if "alone" in a.only:
        print("\n== Each source fitted by itself (in-sample) ==")
        rows = []
        for s in sorted(set(runs.source_ids)):
            m = runs.source_ids == s
            t = cf.fit_terms(runs, m, base)
            e = runs.predict(t)[m] / runs.measured_s[m] - 1.0
            rows.append({"source": s, "in_sample": f"{np.abs(e).mean():.1%} ({e.mean():+.1%})",
                         "terms": cf.terms_in_words(t)})
        print(pd.DataFrame(rows).to_string(index=False))
    if "floor" in a.only:
        print("\n== The host floor (lower bound of the host terms), each measurement in the repository ==")
        variants = []
        for where, f in floors():
            opt = cf.TermsFitOptions().with_floor(f)
            variants.append((f"{f.host_s_per_layer_pass * 1e3:.2f} ms, {opt.recompute_host_passes:.2f} passes: "
                             f"{where} ({f.machine or 'machine not recorded'})", opt))
        variants.append(("no floor", cf.TermsFitOptions()))
        print(table(runs, variants).to_string(index=False))
    if "flagged" in a.only:
        print("\n== Runs with unaligned GEMM shapes: left out of the fit (shipped) or fitted on ==")
        print(table(runs, [("left out", base), ("fitted on", replace(base, fit_shape_flagged=True))]).to_string(
            index=False))
    if "blend" in a.only:
        print("\n== The host / GPU blend exponent p (shipped 2) ==")
        print(table(runs, [(f"p = {p:g}", replace(base, blend_p=p)) for p in (1.5, 2.0, 3.0, 4.0, 8.0)]).to_string(
            index=False))
    if "contention" in a.only:
        print(f"\n== Contention kappa held fixed (shipped {base.contention:.3f}, the published measurement) ==")
        print(table(runs, [(f"kappa = {k:.3g}", replace(base, contention=k))
                           for k in (0.0, 0.1, PUBLISHED_CONTENTION, 0.2, 0.4)]).to_string(index=False))
    if "power" in a.only:
        print(f"\n== The power factor's form (shipped {base.power_form}) ==")
        print(table(runs, [(f, replace(base, power_form=f)) for f in POWER_FORMS]).to_string(index=False))
    if "spread" in a.only:
        print("\n== The GPU speed spread sigma: fitted (shipped) or held ==")
        held = [(f"held at {v:g}", replace(base, fit_speed_spread=False, speed_spread=v))
                for v in (0.0, 0.01, 0.02, 0.03, 0.04)]
        print(table(runs, [("fitted", base), *held]).to_string(index=False))


if __name__ == "__main__":
    main()

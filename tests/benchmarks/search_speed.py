"""Search speed and fidelity: prints tables.

    python -m tests.benchmarks.search_speed [--sample 200] [--quick]

1. Speed: every layout of each scenario enumerated, memory-checked and ranked; cold (first search in
   a fresh process, predictor loaded, caches empty) and warm (the same search again), wall and CPU
   seconds, and the amortised cost per layout. Target: llama3-70b on 1,024 dgx-a100-80gb GPUs
   (global batch 1,024, seq 4,096) in <= 2 s on a 2-core machine; <= 1 ms per layout.
2. The naive alternative: Predictor.predict(timeline=False) per layout, timed on a sample and
   extrapolated to the whole space.
3. Fidelity: the search's step time, breakdown and peak memory against Predictor.predict /
   memory.estimate_memory on a random sample (target: within 1 %).
4. The top 5 of the target scenario.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd

SCENARIOS = [  # (model, platform, num_gpus, global batch, seq)
    ("llama3-70b", "dgx-a100-80gb", "1024", 1024, 4096),
    ("gpt3-175b", "dgx-a100-80gb", "1024", 1536, 2048),
    ("llama3-8b", "dgx-a100-80gb", "64,128,256,512", 512, 8192),
    ("llama3-405b", "dgx-a100-80gb", "16384", 2048, 8192),
]

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from predictor.plan.search import search
from predictor.model.presets import get_preset
from predictor.plan.predict import get_predictor
t_import = time.perf_counter() - t0
name, platform, gpus, gb, seq = json.loads(sys.argv[1])
gpus = [int(x) for x in gpus.split(",")]
t1 = time.perf_counter(); P = get_predictor(platform); t_load = time.perf_counter() - t1
out = {"import_s": t_import, "load_s": t_load}
for label in ("cold", "warm"):
    c = time.process_time(); w = time.perf_counter()
    rep = search(get_preset(name), P, gpus if len(gpus) > 1 else gpus[0], gb, seq, top_k=10)
    out[label + "_wall_s"] = time.perf_counter() - w
    out[label + "_cpu_s"] = time.process_time() - c
    out[label + "_parts"] = rep.timings_s
out["enumerated"] = rep.n_enumerated
out["feasible"] = rep.n_feasible
print(json.dumps(out))
"""


def run_child(scn) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(scn)], capture_output=True, text=True, cwd=root,
                       env=env, timeout=900, check=False)
    if r.returncode:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def table_speed(scenarios) -> pd.DataFrame:
    rows = []
    for scn in scenarios:
        d = run_child(scn)
        n = d["enumerated"]
        rows.append({"model": scn[0], "gpus": scn[2], "gb": scn[3], "seq": scn[4], "layouts": n, "fit": d["feasible"],
                     "cold_wall_s": d["cold_wall_s"], "cold_cpu_s": d["cold_cpu_s"],
                     "warm_wall_s": d["warm_wall_s"], "warm_cpu_s": d["warm_cpu_s"],
                     "ms_per_layout_cold": d["cold_wall_s"] / n * 1e3,
                     "rank_only_cold_s": sum(v for k, v in d["cold_parts"].items() if k != "refine"),
                     "refine_top10_s": d["cold_parts"]["refine"], "predictor_load_s": d["load_s"]})
    return pd.DataFrame(rows)


def table_naive_and_fidelity(sample: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    from predictor.model.presets import get_preset
    from predictor.plan.predict import get_predictor
    from predictor.plan.search import layout_of, search
    from predictor.step.compose import CATEGORIES
    from predictor.step.memory import estimate_memory
    rows, fid = [], []
    for name, platform, gpus, gb, seq in SCENARIOS[:2]:
        P = get_predictor(platform)
        m = get_preset(name)
        rep = search(m, P, int(gpus), gb, seq, top_k=5, refine=False)
        t = rep.table
        rng = np.random.default_rng(0)
        idx = rng.choice(len(t), size=min(sample, len(t)), replace=False)
        errs, berr, merr = [], [], []
        times = []
        for i in idx:
            L = layout_of(t.iloc[i])
            c = time.perf_counter()
            p = P.predict(m, L, timeline=False)
            times.append(time.perf_counter() - c)
            errs.append(abs(t.iloc[i]["step_time_s"] / p.step_time_s - 1))
            berr.append(max(abs(t.iloc[i][f"{k}_s"] - p.breakdown_s[k]) for k in CATEGORIES) / p.step_time_s)
            merr.append(abs(t.iloc[i]["peak_mem_gib"] * 2 ** 30 / estimate_memory(m, L, P.platform).peak_bytes - 1))
        per = float(np.mean(times))
        rows.append({"model": name, "gpus": gpus, "layouts": len(t), "predict_ms_each (warm)": per * 1e3,
                     "naive_all_s (extrapolated)": per * len(t), "search_s": rep.elapsed_s,
                     "speedup": per * len(t) / rep.elapsed_s})
        fid.append({"model": name, "sampled": len(idx), "max_step_rel_err": max(errs),
                    "max_breakdown_err (share of step)": max(berr), "max_memory_rel_err": max(merr)})
    return pd.DataFrame(rows), pd.DataFrame(fid)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", type=int, default=200, help="layouts re-predicted one by one")
    ap.add_argument("--quick", action="store_true", help="only the target scenario")
    a = ap.parse_args(argv)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    fmt = {"float_format": lambda v: f"{v:.4g}", "index": False}
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    t = table_speed(SCENARIOS[:1] if a.quick else SCENARIOS)
    print("\n== 1. Search speed (fresh process per scenario; cold = first search, warm = repeated) ==")
    print(t.to_string(**fmt))
    target = t.iloc[0]
    print(f"target llama3-70b / 1,024 GPUs: {target['cold_wall_s']:.2f} s cold wall "
          f"({target['cold_cpu_s']:.2f} s CPU), "
          f"{target['ms_per_layout_cold']:.3f} ms per layout (targets 2 s, 1 ms)")
    naive, fid = table_naive_and_fidelity(a.sample)
    print("\n== 2. Naive: Predictor.predict per layout ==")
    print(naive.to_string(**fmt))
    print("\n== 3. Fidelity of the vectorised path (target <= 1 %) ==")
    print(fid.to_string(**fmt))
    from predictor.model.presets import get_preset
    from predictor.plan.search import search
    rep = search(get_preset("llama3-70b"), "dgx-a100-80gb", 1024, 1024, 4096, top_k=5)
    cols = ["rank", "tp", "pp", "cp", "dp", "micro_batch", "vpp", "schedule", "stage_layers", "recompute",
            "sequence_parallel", "zero_stage", "step_time_s", "mfu", "peak_mem_gib", "compute_s", "tp_comm_s",
            "cp_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s"]
    print("\n== 4. llama3-70b on 1,024 dgx-a100-80gb GPUs, global batch 1,024, seq 4,096: top 5 ==")
    print(rep.feasible[cols].head(5).to_string(**fmt))
    print(rep.rejection_summary().to_string(index=False, max_colwidth=110))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""End-to-end validation on real training runs on this machine's CPU: prints tables.

    python -m tests.benchmarks.cpu_end_to_end [--mode both|single|ddp] [--steps 6] [--save]

Trains real models nobody here wrote (Hugging Face transformers GPT-2 and Llama, random weights, fp32,
torch.optim.AdamW, SDPA attention), measures the step time (zero_grad, forward with the causal-LM
loss, backward, optimizer step; median of `--steps` after 2 warm-ups) and compares it with
`predictor.plan.predict`:

  * single process, 2 threads            -> platform cpu-2t
  * torch DistributedDataParallel, 2 gloo ranks of 1 thread each (dp=2), launched with torchrun
                                         -> platform cpu-1t (the step time is the slowest rank's)

Each config is its own training job in a fresh process (a fresh torchrun job for DDP): running models
one after another in one process left the allocator in states that moved later step times by up to 25 %.

Host allocator: every training job runs with glibc malloc keeping freed memory (bench/allocator.py,
the setting every bench sampler uses, and what PyTorch's caching allocator does on a GPU). With the C
library's defaults, freed activations, gradients and AdamW temporaries go back to the kernel and are
page-faulted in again next step, which on this VM made steps 15-40 % slower and moved them by 25 %
between runs. A table with the system defaults (`BENCH_SYSTEM_MALLOC=1`) shows what that costs; it
is not in the MAPE.

Benchmark settings (disclosed, not special cases in the predictor): dropout 0 (the decomposition has
no dropout; Llama has none anyway) and GPT-2 with `activation_function="gelu_pytorch_tanh"` (HF's
fused-kernel spelling of the same tanh GeLU as its default `gelu_new`). A last table runs two GPT-2
configs with the HF defaults (dropout 0.1, `gelu_new`) to show what those choices are worth.
The predictor is not told anything about HF: HF Llama runs gate and up as two GEMMs (the
decomposition fuses them), HF GPT-2 uses Conv1D (addmm with a transposed weight), HF computes RoPE
tables per step, does not pad the vocabulary, and so on; all of that is part of the error shown.

Measurement rule: the machine is shared, so each phase first waits (up to 20 min) for the 1-minute
load average to drop below 0.5 and the tables print the load seen; besides, a step during which other
processes took CPU time (/proc/stat, `bench.env.Interference`, the same guard the samplers use) is
thrown away and run again once the machine is calm (column `redone`).

Every measuring run writes the measured table with the hardware / software facts and the load seen to
bench/samples/cpu_end_to_end.json; `--rescore` predicts that file again without training anything
(e.g. after retraining the regressors). `--save` also writes the measured runs (predict-batch columns +
step_time_s) to bench/samples/e2e/ and the MAPE to models_store/<platform>/validation.json
(predictions then carry it in their expected error).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# The training jobs, the predictions and the host-term fit are bench/cpu/e2e.py's (the bench loop's end-to-end
# calibration runs the same jobs on its own configs); this benchmark keeps its validation configs and tables.
from bench.cpu.e2e import FIELDS, build_model, cfg_dict, predict_rows, spec_and_layout, time_steps  # noqa: F401
from bench.cpu.e2e import run_single as _run_single

REPO = Path(__file__).resolve().parents[2]

# name, arch, layers, hidden, heads, kv_heads, ffn (llama), seq, batch, vocab
CONFIGS = [
    ("gpt-a", "gpt", 4, 256, 4, None, None, 256, 4, 8192),
    ("gpt-b", "gpt", 6, 512, 8, None, None, 256, 2, 32000),
    ("gpt-c", "gpt", 2, 768, 12, None, None, 256, 1, 50257),
    ("gpt-d", "gpt", 8, 384, 6, None, None, 128, 8, 16384),
    ("gpt-e", "gpt", 4, 1024, 16, None, None, 128, 2, 8192),
    ("gpt-f", "gpt", 12, 256, 8, None, None, 512, 1, 4096),
    ("gpt-g", "gpt", 3, 640, 10, None, None, 384, 2, 24000),
    ("llama-a", "llama", 4, 256, 4, 4, 688, 256, 4, 8192),
    ("llama-b", "llama", 6, 512, 8, 2, 1376, 256, 2, 32000),
    ("llama-c", "llama", 2, 768, 12, 4, 2048, 256, 2, 32000),
    ("llama-d", "llama", 8, 384, 6, 1, 1024, 128, 8, 16384),
    ("llama-e", "llama", 4, 1024, 16, 8, 2816, 128, 2, 8192),
    ("llama-f", "llama", 12, 256, 8, 2, 704, 1024, 1, 4096),
    ("llama-g", "llama", 3, 640, 10, 5, 1728, 384, 2, 24000),
]
DDP_NAMES = ("gpt-a", "gpt-b", "gpt-d", "gpt-f", "llama-a", "llama-b", "llama-d", "llama-f")
QUICK = ("gpt-a", "llama-a")
HF_DEFAULT_ROWS = ("gpt-a", "gpt-b")
RESULTS = REPO / "bench" / "samples" / "cpu_end_to_end.json"
TARGETS = {"cpu-2t": 0.10, "cpu-1t": 0.15}


def run_single(configs: list[dict], steps: int, warmup: int, threads: int = 2, hf_defaults: bool = False,
               system_malloc: bool = False) -> list[dict]:
    """Each config is its own training job in a fresh process, as a real run is: models trained earlier
    in the same process leave the allocator (heap, mmap threshold, page cache of freed blocks) in a
    state that changed later configs' step times by up to 25 % in our first runs."""
    return _run_single(configs, steps, warmup, threads, hf_defaults, system_malloc)


def run_ddp(names: list[str], steps: int, warmup: int) -> list[dict]:
    """One torchrun job (2 gloo ranks) per config, as for run_single."""
    from bench.cpu.e2e import run_ddp as _run_ddp
    by = {c[0]: cfg_dict(c) for c in CONFIGS}
    return _run_ddp([by[n] for n in names], steps, warmup)


def models_machine(platform: str, models_dir: str | None):
    """The machine the platform's models were sampled on (predictor.hardware.machine), None when not recorded."""
    from predictor.hardware.machine import read_sampled_on
    from predictor.paths import models_dir as mdir
    try:
        rec = read_sampled_on(platform, models_dir or mdir())
    except ValueError:
        return None
    return rec["machine"] if rec else None


def table_machine(t: dict):
    """The machine a measured table was taken on (its facts' fingerprint, or one rebuilt from older facts)."""
    from predictor.hardware.machine import from_facts
    return from_facts(t.get("facts") or {})


def same_machine_as_models(t: dict, platform: str, models_dir: str | None) -> bool:
    from predictor.hardware.machine import same_machine
    m = models_machine(platform, models_dir)
    return m is None or same_machine(table_machine(t), m)


def warn_machine(platform: str, models_dir: str | None) -> None:
    """Say so when this machine is not the one the platform's models were sampled on."""
    from predictor.hardware.machine import mismatch_warning
    from predictor.paths import models_dir as mdir
    w = mismatch_warning(platform, models_dir or mdir())
    if w:
        print(f"\nWARNING: {w}\n(the tables measured here are not pooled with the models' own machine's runs)",
              file=sys.stderr, flush=True)


def fit_host(models_dir: str | None = None) -> int:
    """The GPU method (predictor.calibrate.host) on this CPU: fit the host overhead of each platform on
    its measured runs, every run held out once with its model (leave-one-model-out)."""
    from bench.cpu.e2e import fit_host as _fit
    data = json.loads(RESULTS.read_text())
    for kind in ("single", "ddp"):
        t = data["tables"][kind]
        if not same_machine_as_models(t, t["platform"], models_dir):
            print(f"{t['platform']} ({kind}): the saved table was measured on another machine than the models' "
                  f"(sampled_on.json); not fitted", file=sys.stderr)
            continue
        ho, rep, path = _fit(t["runs"], t["platform"], models_dir,
                             source=f"{len(t['runs'])} HF transformers training runs on this CPU "
                                    f"({t['facts'].get('recorded_at')}), bench/samples/cpu_end_to_end.json")
        print(f"{t['platform']} ({kind}): host {ho.host_s_per_layer_pass * 1e3:.2f} ms per layer pass, "
              f"p {ho.blend_p:g}; "
              f"MAPE without host term {rep['no_host_mape']:.1%}, fitted {rep['fit_mape']:.1%}, "
              f"leave-one-model-out CV {rep['cv_mape']:.1%} -> {path}")
    return 0


def print_table(title: str, rows: list[dict]) -> float:
    import pandas as pd
    df = pd.DataFrame(rows)
    cols = ["name", "arch", "layers", "hidden", "heads", "kv_heads", "ffn", "seq", "batch", "vocab", "measured_s",
            "predicted_s", "signed", "load", "discarded_steps"]
    t = df[cols].copy()
    for c in ("kv_heads", "ffn"):
        t[c] = t[c].map(lambda v: "-" if v is None or v != v else str(int(v)))
    t["signed"] = t["signed"].map(lambda v: f"{v:+.1%}")
    t["load"] = t["load"].map(lambda v: f"{v:.2f}")
    t = t.rename(columns={"discarded_steps": "redone"})
    mape = float(df["ape"].mean())
    print(f"\n== {title} ==")
    print(t.rename(columns={"signed": "error"}).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    by = df.groupby("arch")["ape"].mean()
    print(f"MAPE {mape:.1%} over {len(df)} runs ({', '.join(f'{k} {v:.1%}' for k, v in by.items())}); "
          f"max |error| {df['ape'].max():.1%}; mean signed {df['signed'].mean():+.1%}")
    return mape


def save_runs(rows: list[dict], platform: str, dp: int, quiet: dict, models_dir: str | None,
              summary: dict | None = None) -> None:
    """The latest table as the platform's measured runs (bench/samples/e2e/, validation_runs.csv);
    `summary` (print_history's pooled figures) replaces its MAPE in validation.json."""
    import pandas as pd

    from bench.cpu.e2e import measured_run_records, save_validation_record
    out_dir = REPO / "bench" / "samples" / "e2e"
    out_dir.mkdir(parents=True, exist_ok=True)
    src = "tests/benchmarks/cpu_end_to_end.py (HF transformers, AdamW, fp32) on this machine"
    pd.DataFrame(measured_run_records(rows, platform, src)).to_csv(out_dir / f"{platform}-runs.csv", index=False)
    (out_dir / f"{platform}-runs.json").write_text(json.dumps({"platform": platform, "quiet": quiet, "runs": rows},
                                                              indent=1, default=str))
    # the same columns `predictor validate` saves, so the dashboard's Accuracy page reads them alike
    save_validation_record(rows, platform, models_dir, summary, src)


def speed_probe(platform: str, models_dir: str | None = None) -> dict | None:
    """`python -m bench speed-check` for the platform (in its own process(es), as it was sampled):
    how fast this machine is now compared with its operator samples (predictor.hardware.speed). With `models_dir`
    the samples are the set those models were trained on (their sampled_on.json), e.g. a bench loop's."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "speed.json"
        cmd = [sys.executable, "-m", "bench", "speed-check", "--platform", platform, "--json-out", str(out)]
        if platform == "cpu-1t":
            cmd += ["--ranks", "2"]
        if models_dir:
            cmd += ["--models-dir", str(models_dir)]
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
        if r.returncode != 0 or not out.exists():
            print(f"speed check failed ({r.returncode}): {r.stderr[-400:]}", file=sys.stderr)
            return None
        d = json.loads(out.read_text())
    print(f"speed check {platform}: x{d['speed_factor']:.3f} ({d['points']} timings, {d['check_s']:.0f} s)",
          file=sys.stderr, flush=True)
    return d


def combined_speed(cond: dict | None) -> dict | None:
    """The speed checks before and after a table as one SpeedCheck dict (geometric mean of the factors)."""
    checks = [c for c in ((cond or {}).get("speed_check_before"), (cond or {}).get("speed_check_after")) if c]
    if not checks:
        return None
    f = 1.0
    for c in checks:
        f *= c["speed_factor"]
    return {**checks[0], "speed_factor": f ** (1.0 / len(checks)), "points": sum(c["points"] for c in checks)}


def probe() -> dict:
    """Memory bandwidth (STREAM-like copy, 2 threads) and the load now: the host is a VM whose memory
    bandwidth moves with its neighbours (we saw 21-27 GB/s), which moves memory-bound step parts."""
    import torch

    from bench.sampling.device import stream_copy_gbps
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    s = stream_copy_gbps("cpu", 256)
    torch.set_num_threads(n)
    return {"stream_copy_gbps": round(s["gbps"], 2), "loadavg": list(os.getloadavg())}


def _measured_record(kind: str, rows: list[dict], quiet: dict, threads: int, ranks: int,
                     conditions: dict | None = None) -> dict:
    from bench.env import facts
    f = facts("cpu")
    f["torch_threads"] = threads
    f["host_allocator"] = sorted({r.get("allocator", "?") for r in rows})  # what the training jobs ran with
    import transformers
    f["transformers"] = transformers.__version__
    keep = [{k: v for k, v in r.items() if not k.startswith("pred_") and k not in ("predicted_s", "ape", "signed",
                                                                                      "provenance")} for r in rows]
    return {"kind": kind, "platform": "cpu-2t" if ranks == 1 else "cpu-1t", "threads_per_rank": threads,
            "ranks": ranks, "quiet_check": quiet, "conditions": conditions, "facts": f, "runs": keep}


def write_results(record: dict) -> None:
    """Merge one measured table into bench/samples/cpu_end_to_end.json (one entry per kind)."""
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data.setdefault("description", "Step times of Hugging Face transformers GPT-2 / Llama training (random weights, "
                                   "fp32, "
                                   "torch.optim.AdamW) measured on this machine's CPU by "
                                   "tests/benchmarks/cpu_end_to_end.py: median of N steps after warm-up; "
                                   "re-score with `python -m tests.benchmarks.cpu_end_to_end --rescore`.")
    prev = data.setdefault("tables", {}).get(record["kind"])
    if prev is not None:  # keep earlier measurements of the same table, summarised
        data.setdefault("history", []).append({k: prev.get(k) for k in ("kind", "platform", "facts", "conditions")} |
                                              {"runs": [{k: r[k] for k in ("name", "measured_s", "load")}
                                                        for r in prev["runs"]]})
    data["tables"][record["kind"]] = record
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=1, default=str) + "\n")


def score(kind: str, rows: list[dict], models_dir: str | None, title: str | None = None,
          speed: dict | None = None) -> tuple[float, list[dict]]:
    platform, dp = ("cpu-2t", 1) if kind in ("single", "hf_defaults", "system_malloc") else ("cpu-1t", 2)
    pred = predict_rows(rows, platform, dp, models_dir, speed)
    titles = {"single": "HF single process, 2 threads vs predict on cpu-2t",
              "ddp": "HF DDP 2 gloo ranks x 1 thread (dp=2) vs predict on cpu-1t",
              "hf_defaults": "HF GPT-2 defaults (dropout 0.1, gelu_new) vs predict on cpu-2t (not in the MAPE)",
              "system_malloc": "HF single process with the C library's default malloc (BENCH_SYSTEM_MALLOC=1) vs "
                               "predict on cpu-2t (not in the MAPE)"}
    title = title or titles[kind]
    if speed:
        title += f", measured op times x{speed['speed_factor']:.3f} by the speed checks around the runs"
    return print_table(title, pred), pred


def score_checked(kind: str, t: dict, models_dir: str | None, results: dict) -> None:
    """The same table predicted with the speed checks taken before and after it, when it has them."""
    sp = combined_speed(t.get("conditions"))
    if sp is None:
        return
    results[t["platform"] + " (speed-checked)"] = score(kind, t["runs"], models_dir, speed=sp)[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="both", choices=["both", "single", "ddp"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="two configs only (not written to the results file)")
    ap.add_argument("--names", nargs="+", help="configs to run (default all; DDP: the DDP_NAMES subset)")
    ap.add_argument("--no-hf-defaults", action="store_true", help="skip the HF-defaults table")
    ap.add_argument("--no-system-malloc", action="store_true", help="skip the system-malloc table")
    ap.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    ap.add_argument("--rescore", action="store_true",
                    help=f"predict the measured tables in {RESULTS.relative_to(REPO)} again; measure nothing")
    ap.add_argument("--fit-host", action="store_true",
                    help="fit each CPU platform's host overhead on the saved measurements (leave-one-model-out CV) "
                         "and write models_store/<platform>/host_overhead.json; measure nothing")
    ap.add_argument("--save", action="store_true", help="write bench/samples/e2e/*.csv and validation.json")
    ap.add_argument("--models-dir")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    results = {}
    kinds = {"both": ("single", "ddp"), "single": ("single",), "ddp": ("ddp",)}[a.mode]
    if a.fit_host:
        return fit_host(a.models_dir)
    if a.rescore:
        data = json.loads(RESULTS.read_text())
        extra = {"hf_defaults": a.no_hf_defaults, "system_malloc": a.no_system_malloc}
        latest: dict[str, tuple[list[dict], dict]] = {}
        for kind in ("single", "hf_defaults", "system_malloc", "ddp"):
            t = data["tables"].get(kind)
            if t is None or (kind not in extra and kind not in kinds) or extra.get(kind):
                continue
            la = [r["load"] for r in t["runs"]]
            print(f"\n[{kind}: measured {t['facts'].get('recorded_at')} on {t['facts'].get('cpu_model')}, "
                  f"torch {t['facts'].get('torch')}, transformers {t['facts'].get('transformers')}; "
                  f"1-min load during the runs {min(la):.2f}..{max(la):.2f}; memory bandwidth "
                  + json.dumps({k: v.get('stream_copy_gbps') for k, v in (t.get('conditions') or {}).items()
                                if k in ('before', 'after') and v}) + " GB/s]")
            plat = "cpu-1t" if kind == "ddp" else "cpu-2t"
            if not same_machine_as_models(t, plat, a.models_dir):
                print(f"[measured on {table_machine(t).short()}, not on the machine {plat}'s models were sampled on "
                      f"({models_machine(plat, a.models_dir).short()}): shown, not pooled]")
            mape, pred = score(kind, t["runs"], a.models_dir)
            if kind not in extra:
                results[t["platform"]] = mape
                score_checked(kind, t, a.models_dir, results)
                latest[kind] = (pred, t)
        for kind in kinds:
            pooled = print_history(data, kind, a.models_dir)
            if a.save and kind in latest:
                pred, t = latest[kind]
                if not same_machine_as_models(t, t["platform"], a.models_dir):
                    print(f"--save: the latest {kind} table was measured on another machine than {t['platform']}'s "
                          f"models; validation.json not written", file=sys.stderr)
                    continue
                save_runs(pred, t["platform"], 1 if kind == "single" else 2, t["quiet_check"], a.models_dir,
                          summary=pooled)
        _print_targets(results)
        return 0
    from bench.env import wait_quiet
    names = list(a.names or ([*QUICK] if a.quick else [c[0] for c in CONFIGS]))
    configs = [cfg_dict(c) for c in CONFIGS if c[0] in names]
    persist = not a.quick and not a.names
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    wait = (lambda: {"quiet": None, "note": "--no-wait", "loadavg_end": list(os.getloadavg())}) if a.no_wait else \
        (lambda: wait_quiet(log=log))
    for kind in kinds:
        warn_machine("cpu-2t" if kind == "single" else "cpu-1t", a.models_dir)
    if "single" in kinds:
        q = wait()
        log(f"single process, 2 threads (load {os.getloadavg()[0]:.2f}, quiet check {q})")
        before, sc0 = probe(), speed_probe("cpu-2t", a.models_dir)
        meas = run_single(configs, a.steps, a.warmup)
        cond = {"before": before, "speed_check_before": sc0, "speed_check_after": speed_probe("cpu-2t", a.models_dir),
                "after": probe()}
        log(f"memory bandwidth before / after: {cond['before']['stream_copy_gbps']} / "
            f"{cond['after']['stream_copy_gbps']} GB/s")
        if persist:
            write_results(_measured_record("single", meas, q, 2, 1, cond))
        results["cpu-2t"], rows = score("single", meas, a.models_dir)
        score_checked("single", {"platform": "cpu-2t", "runs": meas, "conditions": cond}, a.models_dir, results)
        if a.save:
            save_runs(rows, "cpu-2t", 1, q, a.models_dir)
        if not a.no_hf_defaults and not a.quick:
            hf = [c for c in configs if c["name"] in HF_DEFAULT_ROWS]
            if hf:
                meas = run_single(hf, a.steps, a.warmup, hf_defaults=True)
                if persist:
                    write_results(_measured_record("hf_defaults", meas, q, 2, 1, {"after": probe()}))
                score("hf_defaults", meas, a.models_dir)
        if not a.no_system_malloc and not a.quick:
            meas = run_single(configs, a.steps, a.warmup, system_malloc=True)
            if persist:
                write_results(_measured_record("system_malloc", meas, q, 2, 1, {"after": probe()}))
            score("system_malloc", meas, a.models_dir)
    if "ddp" in kinds:
        q = wait()
        ddp_names = [n for n in names if a.names or a.quick or n in DDP_NAMES]
        log(f"DDP 2 ranks x 1 thread (load {os.getloadavg()[0]:.2f}, quiet check {q})")
        before, sc0 = probe(), speed_probe("cpu-1t", a.models_dir)
        meas = run_ddp(ddp_names, a.steps, a.warmup)
        cond = {"before": before, "speed_check_before": sc0, "speed_check_after": speed_probe("cpu-1t", a.models_dir),
                "after": probe()}
        log(f"memory bandwidth before / after: {cond['before']['stream_copy_gbps']} / "
            f"{cond['after']['stream_copy_gbps']} GB/s")
        if persist:
            write_results(_measured_record("ddp", meas, q, 1, 2, cond))
        results["cpu-1t"], rows = score("ddp", meas, a.models_dir)
        score_checked("ddp", {"platform": "cpu-1t", "runs": meas, "conditions": cond}, a.models_dir, results)
        if a.save:
            save_runs(rows, "cpu-1t", 2, q, a.models_dir)
    _print_targets(results)
    return 0


def print_history(data: dict, kind: str, models_dir: str | None) -> dict:
    """Every recorded measuring run of a table kind, predicted again: the run-to-run spread of the same
    jobs on this VM, and the MAPE pooled over all of them, as sampled and (for runs with speed checks
    around them) speed-checked. Only runs made under the allocator setting the platforms were sampled
    with (bench/allocator.py) and on the machine the models were sampled on (sampled_on.json) count;
    the others stay in the file for the record. Returns the pooled figures for validation.json."""
    import pandas as pd
    by_name = {c[0]: cfg_dict(c) for c in CONFIGS}
    entries = [h for h in data.get("history", []) if h.get("kind") == kind] + \
              ([data["tables"][kind]] if kind in data.get("tables", {}) else [])
    platform, dp = ("cpu-2t", 1) if kind == "single" else ("cpu-1t", 2)
    rows, per_run, checked, other = [], [], [], 0
    for h in entries:
        if "keeping freed memory" not in json.dumps((h.get("facts") or {}).get("host_allocator")):
            continue
        if not same_machine_as_models(h, platform, models_dir):
            other += 1
            continue
        runs = [{**by_name[r["name"]], **r} for r in h["runs"] if r["name"] in by_name]
        pred = predict_rows(runs, platform, dp, models_dir)
        ape = [r["ape"] for r in pred]
        signed = [r["signed"] for r in pred]
        row = {"measured_at": (h.get("facts") or {}).get("recorded_at", "?")[:16], "runs": len(pred),
               "mape": f"{statistics.fmean(ape):.1%}", "mean_signed": f"{statistics.fmean(signed):+.1%}",
               "max_abs": f"{max(ape):.1%}", "speed_x": "-", "mape_checked": "-"}
        sp = combined_speed(h.get("conditions"))
        if sp is not None:
            chk = [r["ape"] for r in predict_rows(runs, platform, dp, models_dir, sp)]
            row.update(speed_x=f"{sp['speed_factor']:.3f}", mape_checked=f"{statistics.fmean(chk):.1%}")
            checked += chk
        per_run.append(row)
        rows += ape
    if other:
        print(f"\n({other} recorded {kind} run(s) measured on another machine than {platform}'s models: not pooled)")
    if per_run:
        print(f"\n== every recorded {kind} run (as sampled, no speed check) ==")
        print(pd.DataFrame(per_run).to_string(index=False))
        target = TARGETS[platform]
        met = [float(r["mape"][:-1]) / 100 <= target for r in per_run]
        print(f"pooled MAPE {statistics.fmean(rows):.1%} over {len(rows)} measured steps in {len(per_run)} runs; "
              f"target ({target:.0%}) met in {sum(met)} of {len(met)}")
        if checked:
            met = [float(r["mape_checked"][:-1]) / 100 <= target for r in per_run if r["mape_checked"] != "-"]
            print(f"with the speed checks around the run: MAPE {statistics.fmean(checked):.1%} over "
                  f"{len(checked)} steps in {len(met)} runs; target met in {sum(met)} of {len(met)}")
    if not rows:
        return {}
    out = {"mape": statistics.fmean(rows), "n_runs": len(rows), "measuring_runs": len(per_run),
           "median_ape": statistics.median(rows), "mape_basis": "pooled over every recorded measuring run "
                                                                 "(different hours), as sampled"}
    if checked:
        out |= {"mape_speed_checked": statistics.fmean(checked), "n_runs_speed_checked": len(checked),
                "measuring_runs_speed_checked": sum(r["mape_checked"] != "-" for r in per_run)}
    return out


def _print_targets(results: dict[str, float]) -> None:
    print("\nTargets: cpu-2t MAPE <= 10 %, cpu-1t DDP MAPE <= 15 %: " +
          ", ".join(f"{k} {v:.1%} ({'met' if v <= TARGETS[k.split()[0]] else 'NOT met'})" for k, v in results.items()))


if __name__ == "__main__":
    raise SystemExit(main())

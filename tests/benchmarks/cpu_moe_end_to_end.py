"""Mixture-of-Experts validation on real training runs on this machine's CPU: measures, or re-scores, tables.

    python -m tests.benchmarks.cpu_moe_end_to_end --lock /work/cpu.lock --steps 8 --max-wait 120  # measure
    python -m tests.benchmarks.cpu_moe_end_to_end --rescore        # predict the saved tables again

Measuring took 28 min of wall time on 2026-11-25 (18 + 8 + 4 jobs: about 4 min of steps, warm-up included, plus
each job's start-up; most of the rest waiting for the shared lock). `--rescore` also prints, for context, the
dense HF runs of cpu_end_to_end.py measured on the same CPU and predicted by the same models.

Trains Hugging Face transformers MoE models (MixtralForCausalLM, Qwen3MoeForCausalLM, Qwen2MoeForCausalLM with
its shared expert; bench/cpu/e2e_moe.py builds them from config dicts: random weights, fp32, torch.optim.AdamW,
SDPA attention, dropout 0, router jitter 0, the router's auxiliary load-balancing loss OFF as HF's defaults
have it) with bench/cpu/e2e.py's jobs, exactly as tests/benchmarks/cpu_end_to_end.py does the dense ones:

  * single process, 2 threads                                    -> platform cpu-2t (table `single`)
  * DistributedDataParallel, 2 gloo ranks of 1 thread (dp=2)      -> platform cpu-1t (table `ddp`)
  * a few configs again with HF's Python loop over the experts (`experts_impl="eager"`), to show what it
    costs (table `eager`, cpu-2t, not in the MAPE)

The step is zero_grad, forward with the causal-LM loss, backward, AdamW step; the median of `--steps` after
`--warmup` steps; each config its own fresh process (a fresh torchrun job for DDP), the caching host allocator
(bench/allocator.py), and a step during which other processes took CPU time is redone once the machine is
calm (column `redone`). With `--lock PATH` every training job, memory-bandwidth probe and speed check runs
under `flock PATH` (one heavy job at a time on a shared machine; the lock is held per job, not per table).
Each table first waits (at most `--max-wait` s) for the 1-minute load average to drop below 0.5 and records
what it saw.

HF's experts: transformers 5.x dispatches the routed experts to `grouped_mm` by default (torch's
torch.nn.functional.grouped_mm: tokens sorted by expert, one grouped GEMM for gate+up and one for down, no
Python loop); `eager` is HF's original loop over the experts that received tokens (one_hot mask, torch.where,
two linears, index_add_ per expert). Both are dropless.

Routing: every kept step's tokens per expert in every MoE layer are counted from the router's top-k indices
(a forward hook; counted after the step's timer stopped). Per config the JSON keeps `routing.imbalance`, the
mean over layers and steps of (tokens on the busiest expert / mean tokens per expert), its min / max / per
layer, the coefficient of variation, the idle experts and the last step's counts; for DDP each rank's mean.

Scoring: each config becomes a predict-batch row (bench/e2e_moe.moe_row: arch llama, head_dim where it differs
from hidden / heads, num_experts, top_k, moe_ffn_hidden, shared_experts, shared_ffn_hidden, dense_layers,
ep = 1; capacity_factor and moe_imbalance empty: HF is dropless and the imbalance is the predictor's to model)
predicted by `predictor.plan.batch.predict_records`. A row the predictor refuses prints its error; a row the
predictor reads as a dense model (it does not read the MoE columns yet) is not scored and says so, never a
dense number passed off as a MoE prediction. Not told to the predictor: Qwen3-MoE's QK-norm, Qwen2-MoE's
q/k/v bias and its shared expert's sigmoid gate, HF's separate q/k/v GEMMs, the router's softmax / top-k /
sort work as HF does it; all of that is part of the error shown.

Results: bench/samples/cpu_moe_end_to_end.json (hardware / software facts, load seen, per config the
predict-batch fields, the arch flags, measured median and per-step times, routing statistics, redone steps);
an earlier measurement of a table moves to `history`. `--names` / `--quick` runs are not written.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.cpu.e2e_moe import MOE_COLUMNS, arch_flags, moe_row

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "samples" / "cpu_moe_end_to_end.json"


def _c(name: str, arch: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, seq: int, batch: int,
       vocab: int, experts: int, top_k: int, **kw: Any) -> dict[str, Any]:
    return dict(name=name, arch=arch, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn,
                seq=seq, batch=batch, vocab=vocab, experts=experts, top_k=top_k, **kw)


# ffn: Mixtral's expert width; for the Qwens the dense MLP width of the leading dense layers (moe_ffn the experts')
CONFIGS = [
    _c("mix-a", "mixtral", 4, 256, 4, 2, 512, 256, 4, 8192, 8, 2),
    _c("mix-b", "mixtral", 2, 512, 8, 4, 1024, 256, 2, 16384, 8, 2),
    _c("mix-c", "mixtral", 4, 128, 4, 2, 256, 128, 8, 4096, 4, 1),
    _c("mix-d", "mixtral", 2, 1024, 16, 8, 1024, 128, 2, 8192, 4, 2),
    _c("mix-e", "mixtral", 4, 384, 6, 2, 768, 512, 2, 8192, 16, 1),
    _c("mix-f", "mixtral", 3, 256, 4, 4, 256, 512, 1, 4096, 32, 4),
    _c("mix-g", "mixtral", 2, 768, 12, 4, 2048, 512, 2, 32000, 8, 2),
    _c("q3-a", "qwen3moe", 4, 256, 4, 2, 768, 256, 4, 8192, 64, 8, moe_ffn=128),
    _c("q3-b", "qwen3moe", 4, 512, 8, 2, 1536, 256, 2, 16384, 32, 8, moe_ffn=256, head_dim=128, dense_layers=1),
    _c("q3-c", "qwen3moe", 6, 256, 4, 2, 768, 128, 8, 8192, 16, 4, moe_ffn=256, head_dim=32, dense_layers=2),
    _c("q3-d", "qwen3moe", 2, 768, 12, 4, 2048, 512, 1, 32000, 8, 2, moe_ffn=384, head_dim=128),
    _c("q3-e", "qwen3moe", 4, 128, 2, 1, 512, 512, 2, 4096, 64, 8, moe_ffn=64, head_dim=64),
    _c("q3-f", "qwen3moe", 3, 1024, 16, 4, 2816, 256, 3, 16384, 16, 2, moe_ffn=512, head_dim=128, dense_layers=1),
    _c("q2-a", "qwen2moe", 4, 256, 4, 4, 1024, 256, 4, 8192, 16, 4, moe_ffn=256, shared_ffn=1024),
    _c("q2-b", "qwen2moe", 3, 512, 8, 4, 1536, 256, 2, 16384, 8, 2, moe_ffn=384, shared_ffn=1536),
    _c("q2-c", "qwen2moe", 4, 384, 6, 2, 1024, 128, 8, 8192, 32, 4, moe_ffn=192, shared_ffn=768, dense_layers=1),
    _c("q2-d", "qwen2moe", 2, 1024, 16, 8, 2816, 128, 2, 8192, 4, 1, moe_ffn=512, shared_ffn=2048),
    _c("q2-e", "qwen2moe", 6, 128, 4, 2, 512, 512, 1, 4096, 60, 4, moe_ffn=128, shared_ffn=512),
]
DDP_NAMES = ("mix-a", "mix-c", "mix-f", "q3-a", "q3-c", "q3-e", "q2-a", "q2-c")
EAGER_NAMES = ("mix-a", "mix-f", "q3-e", "q2-a")
QUICK = ("mix-c", "q3-e")
KINDS = {"single": ("cpu-2t", 1, 2), "ddp": ("cpu-1t", 2, 1), "eager": ("cpu-2t", 1, 2)}  # platform, ranks, threads


def by_name() -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in CONFIGS}


def table_configs(kind: str, names: list[str] | None = None) -> list[dict[str, Any]]:
    """The configs of a table (`names` restricts them); the eager table runs HF's Python loop over the experts."""
    pick = {"single": [c["name"] for c in CONFIGS], "ddp": list(DDP_NAMES), "eager": list(EAGER_NAMES)}[kind]
    cs = [dict(by_name()[n]) for n in pick if names is None or n in names]
    if kind == "eager":
        cs = [{**c, "experts_impl": "eager"} for c in cs]
    return cs


# --------------------------------------------------------------------------- measuring
@contextlib.contextmanager
def held(lock: str | None) -> Iterator[None]:
    """`flock lock` for in-process work (the jobs themselves run under `flock lock ...`)."""
    if not lock:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def measure_table(kind: str, configs: list[dict], a: argparse.Namespace, log) -> dict[str, Any]:
    from bench.cpu.e2e import run_ddp, run_single
    from bench.env import wait_quiet

    from .cpu_end_to_end import probe, speed_probe
    platform, _, threads = KINDS[kind]
    q = {"quiet": None, "note": "--no-wait", "loadavg_end": list(os.getloadavg())} if a.no_wait else \
        wait_quiet(max_wait_s=a.max_wait, log=log)
    log(f"{kind} ({platform}): {len(configs)} HF MoE training jobs, each a fresh process "
        f"(load {os.getloadavg()[0]:.2f}, quiet check {q.get('quiet')})")
    t0 = time.monotonic()
    cond: dict[str, Any] = {}
    with held(a.lock):
        cond["before"] = probe()
    if not a.no_speed_check and kind != "eager":
        with held(a.lock):
            cond["speed_check_before"] = speed_probe(platform, a.models_dir)
    if kind == "ddp":
        runs = run_ddp(configs, a.steps, a.warmup, log=log, lock=a.lock)
    else:
        runs = run_single(configs, a.steps, a.warmup, threads, log=log, lock=a.lock)
    if not a.no_speed_check and kind != "eager":
        with held(a.lock):
            cond["speed_check_after"] = speed_probe(platform, a.models_dir)
    with held(a.lock):
        cond["after"] = probe()
    for r in runs:
        log(f"  {r['name']:8s} imbalance {r['routing'].get('imbalance', float('nan')):.2f} "
            f"(max {r['routing'].get('imbalance_max', float('nan')):.2f}), "
            f"experts impl {r['model_check']['experts_implementation']}")
    return _record(kind, runs, q, cond, round(time.monotonic() - t0, 1))


def _record(kind: str, runs: list[dict], quiet: dict, cond: dict, measuring_s: float) -> dict[str, Any]:
    import transformers

    from bench.env import facts
    platform, ranks, threads = KINDS[kind]
    f = facts("cpu")
    f["torch_threads"] = threads
    f["host_allocator"] = sorted({r.get("allocator", "?") for r in runs})
    f["transformers"] = transformers.__version__
    out = []
    for r in runs:
        row = moe_row(r, platform)
        out.append({**r, "predict_batch_row": row, **{k: row[k] for k in MOE_COLUMNS}, "arch_flags": arch_flags(r)})
    return {"kind": kind, "platform": platform, "threads_per_rank": threads, "ranks": ranks, "quiet_check": quiet,
            "conditions": cond, "facts": f, "measuring_s": measuring_s, "runs": out}


def _dumps(data: dict) -> str:
    """indent=1 JSON with lists of numbers on one line (the per-expert counts would take a line per number)."""
    text = json.dumps(data, indent=1, default=str)
    return re.sub(r"\[\s*(-?[0-9.eE+-]+(?:,\s*-?[0-9.eE+-]+)*)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text) + "\n"


def write_results(record: dict, path: Path = RESULTS) -> None:
    """Merge one measured table into the results file (one entry per kind; an earlier one moves to history)."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("description", "Step times of Hugging Face transformers Mixture-of-Experts training (Mixtral, "
                                   "Qwen3-MoE, Qwen2-MoE; random weights, fp32, torch.optim.AdamW) measured on this "
                                   "machine's CPU by tests/benchmarks/cpu_moe_end_to_end.py: median of N steps after "
                                   "warm-up, with the router's tokens per expert; re-score with `python -m "
                                   "tests.benchmarks.cpu_moe_end_to_end --rescore`.")
    prev = data.setdefault("tables", {}).get(record["kind"])
    if prev is not None:
        data.setdefault("history", []).append({k: prev.get(k) for k in ("kind", "platform", "facts", "conditions")} |
                                              {"runs": [{k: r.get(k) for k in ("name", "measured_s", "load")}
                                                        for r in prev["runs"]]})
    data["tables"][record["kind"]] = record
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(_dumps(data))
    os.replace(tmp, path)


# --------------------------------------------------------------------------- scoring
def score_rows(runs: list[dict], platform: str, models_dir: str | None = None) -> list[dict[str, Any]]:
    """Per measured config: the predict-batch row, the prediction (or None) and why not (`note`)."""
    from predictor.model.errors import InfeasibleConfig
    from predictor.model.layout_io import model_from_fields
    from predictor.plan.batch import predict_records
    rows = [moe_row(r, platform) for r in runs]
    try:
        preds = predict_records(rows, models_dir)
    except Exception:  # noqa: BLE001 - a predictor still being written may raise: row by row, each its own error
        preds = []
        for row in rows:
            try:
                preds.append(predict_records([row], models_dir)[0])
            except Exception as e:  # noqa: BLE001
                preds.append({"step_time_s": None, "error": f"the predictor raised {type(e).__name__}: {e}"})
    out = []
    for r, row, p in zip(runs, rows, preds, strict=True):
        pred, note = p.get("step_time_s"), p.get("error") or ""
        if pred is not None and not note:
            try:
                moe = model_from_fields(row).is_moe
            except InfeasibleConfig as e:  # predict_records accepted it: should not happen, say so if it does
                moe, note = False, str(e)
            if not moe:
                pred, note = None, "not scored: the predictor read this row as a dense model (it does not read the " \
                                   "MoE columns yet), so its number is not a MoE prediction"
        m = r["measured_s"]
        out.append({"name": r["name"], "family": r["arch"], "platform": platform, "experts": r["experts"],
                    "top_k": r["top_k"], "measured_s": m, "predicted_s": pred,
                    "signed": None if pred is None else (pred - m) / m,
                    "imbalance": (r.get("routing") or {}).get("imbalance"), "redone": r.get("discarded_steps", 0),
                    "load": r.get("load"), "note": note})
    return out


def _stats(rows: list[dict]) -> str:
    s = [r["signed"] for r in rows if r["signed"] is not None]
    if not s:
        return f"0 of {len(rows)} scored"
    return (f"MAPE {statistics.fmean(abs(x) for x in s):.1%}, mean signed {statistics.fmean(s):+.1%} "
            f"({len(s)} of {len(rows)} scored)")


def print_scored(title: str, rows: list[dict]) -> None:
    print(f"\n== {title} ==")
    print(f"{'config':8s} {'family':9s} {'E':>3s} {'k':>2s} {'measured_s':>10s} {'predicted_s':>11s} {'error':>7s} "
          f"{'imbal':>6s} {'redone':>6s} {'load':>5s}")
    for r in rows:
        pred = "-" if r["predicted_s"] is None else f"{r['predicted_s']:.3f}"
        err = "-" if r["signed"] is None else f"{r['signed']:+.1%}"
        imb = "-" if r["imbalance"] is None else f"{r['imbalance']:.2f}"
        print(f"{r['name']:8s} {r['family']:9s} {r['experts']:3d} {r['top_k']:2d} {r['measured_s']:10.3f} {pred:>11s} "
              f"{err:>7s} {imb:>6s} {r['redone']:6d} {r['load'] or 0:5.2f}")
    notes = [(r["name"], r["note"]) for r in rows if r["note"]]
    if notes:
        same = len({n for _, n in notes}) == 1 and len(notes) > 1
        if same:
            print(f"all {len(notes)} rows: {notes[0][1]}")
        else:
            for name, n in notes:
                print(f"{name}: {n}")
    fam = ", ".join(f"{f} {_stats([r for r in rows if r['family'] == f])}"
                    for f in dict.fromkeys(r["family"] for r in rows))
    print(f"{rows[0]['platform']}: {_stats(rows)}; per family: {fam}")


def machine_note(t: dict, models_dir: str | None) -> None:
    """Say so when a table was measured on another CPU than the one its platform's models were sampled on."""
    from .cpu_end_to_end import models_machine, same_machine_as_models, table_machine
    if not same_machine_as_models(t, t["platform"], models_dir):
        print(f"[measured on {table_machine(t).short()}, not on the machine {t['platform']}'s models were sampled on "
              f"({models_machine(t['platform'], models_dir).short()}): predictions for another CPU]")


def dense_baseline(t: dict, models_dir: str | None) -> None:
    """The dense HF GPT-2 / Llama runs of tests/benchmarks/cpu_end_to_end.py measured on the same CPU (any
    cpu_end_to_end.json under bench/samples), predicted by the same models: how much of the MoE table's error the
    dense model on this CPU has too."""
    from bench.cpu.e2e import predict_rows
    from predictor.hardware.machine import same_machine

    from .cpu_end_to_end import table_machine
    kind, dp = ("ddp", 2) if t["platform"] == "cpu-1t" else ("single", 1)
    for path in sorted((REPO / "bench" / "samples").glob("**/cpu_end_to_end.json")):
        dense = json.loads(path.read_text()).get("tables", {}).get(kind)
        if dense and same_machine(table_machine(dense), table_machine(t)):
            signed = [r["signed"] for r in predict_rows(dense["runs"], t["platform"], dp, models_dir)]
            print(f"dense baseline: the {len(signed)} dense HF runs measured on the same CPU "
                  f"({path.relative_to(REPO)}, {dense['facts'].get('recorded_at')}) with the same models: MAPE "
                  f"{statistics.fmean(abs(x) for x in signed):.1%}, mean signed {statistics.fmean(signed):+.1%}")
            return
    print("dense baseline: no dense HF table measured on this CPU under bench/samples")


def rescore(path: Path = RESULTS, models_dir: str | None = None) -> int:
    data = json.loads(path.read_text())
    titles = {"single": "HF MoE single process, 2 threads vs predict on cpu-2t",
              "ddp": "HF MoE DDP 2 gloo ranks x 1 thread (dp=2) vs predict on cpu-1t",
              "eager": "HF MoE with the Python loop over experts (experts_impl eager) vs predict on cpu-2t "
                       "(not in the MAPE)"}
    for kind in ("single", "ddp", "eager"):
        t = data.get("tables", {}).get(kind)
        if t is None:
            continue
        la = [r["load"] for r in t["runs"]]
        bw = {k: (v or {}).get("stream_copy_gbps") for k, v in (t.get("conditions") or {}).items()
              if k in ("before", "after")}
        red = sum(r.get("discarded_steps", 0) for r in t["runs"])
        kept = sum(len(r["steps_s"]) for r in t["runs"])
        print(f"\n[{kind}: measured {t['facts'].get('recorded_at')} on {t['facts'].get('cpu_model')}, torch "
              f"{t['facts'].get('torch')}, transformers {t['facts'].get('transformers')}; 1-min load during the jobs "
              f"{min(la):.2f}..{max(la):.2f}; steps redone for interference {red} (kept {kept}); memory bandwidth "
              f"{json.dumps(bw)} GB/s; measuring took {t.get('measuring_s')} s]")
        machine_note(t, models_dir)
        print_scored(titles[kind], score_rows(t["runs"], t["platform"], models_dir))
        if kind != "eager":
            dense_baseline(t, models_dir)
    return 0


# --------------------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--mode", default="all", choices=["all", "single", "ddp", "eager"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--names", nargs="+", help="configs to run (not written to the results file)")
    ap.add_argument("--quick", action="store_true", help=f"{' and '.join(QUICK)} only (not written)")
    ap.add_argument("--lock", help="run every training job / probe under `flock LOCK` (e.g. /work/cpu.lock)")
    ap.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    ap.add_argument("--max-wait", type=float, default=300.0, help="seconds to wait for load < 0.5 per table")
    ap.add_argument("--no-speed-check", action="store_true", help="skip `bench speed-check` around the tables")
    ap.add_argument("--rescore", action="store_true",
                    help=f"predict {RESULTS.relative_to(REPO)} again; measure nothing")
    ap.add_argument("--models-dir")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if a.rescore:
        return rescore(RESULTS, a.models_dir)
    names = list(QUICK) if a.quick else a.names
    persist = names is None
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.monotonic()
    kinds = ("single", "ddp", "eager") if a.mode == "all" else (a.mode,)
    for kind in kinds:
        configs = table_configs(kind, names)
        if not configs:
            continue
        rec = measure_table(kind, configs, a, log)
        if persist:
            write_results(rec)
        print_scored(f"{kind} ({rec['platform']}) just measured", score_rows(rec["runs"], rec["platform"],
                                                                              a.models_dir))
    log(f"measuring took {time.monotonic() - t0:.0f} s" + ("" if persist else " (not written: --names / --quick)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

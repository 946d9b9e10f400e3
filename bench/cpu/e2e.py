"""Hugging Face training steps on this CPU: the jobs behind the end-to-end calibration of the bench loop
(`python -m bench cpu-platform`, phase `calibrate`) and the validation benchmark
(`python -m tests.benchmarks.cpu_end_to_end`).

A job trains one Hugging Face model (GPT-2 or Llama from `transformers`, random weights, fp32,
torch.optim.AdamW, SDPA attention, dropout 0, GPT-2 with `gelu_pytorch_tanh`) and times steps
(zero_grad, forward with the causal-LM loss, backward, optimizer step) after warm-up; the result is
the median (a job whose steps change regime half-way is run once more and both jobs' steps pooled:
`pool_if_unsteady`). Each config is its own job in a fresh process (a fresh torchrun job of 2 gloo ranks for
DDP): models trained earlier in one process left the allocator in states that moved later step
times by up to 25 %. Every job runs with the caching host allocator the samplers use
(bench/allocator.py). A step during which other processes took CPU time (/proc/stat,
bench.env.Interference) is thrown away and run again once the machine is calm.

The calibration (`calibrate`) measures a small fixed set of configs (`CALIBRATION`, chosen to span
tiny layers, where per-op host cost dominates, to activations of 8 MiB per [batch, seq, hidden]
tensor, where memory traffic does), then fits each platform's host term with predictor.step.overhead
(leave-one-model-out cross-validation) and writes `host_overhead.json`, `validation.json` and
`validation_runs.csv` next to the platform's models, and the measured runs as predict-batch CSV
that `python -m predictor ingest` reads. Its validation figure is the cross-validated one: every
run predicted by a host term fitted without its model.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIELDS = ("name", "arch", "layers", "hidden", "heads", "kv_heads", "ffn", "seq", "batch", "vocab")
# name, arch, layers, hidden, heads, kv_heads, ffn (llama), seq, batch, vocab; measured in this order, so a
# budget cut short still spans small to large (none of these is in the validation benchmark's CONFIGS)
CALIBRATION = [
    ("cal-tiny-gpt", "gpt", 4, 128, 2, None, None, 128, 4, 4096),
    ("cal-llama-512", "llama", 4, 512, 8, 4, 1376, 256, 2, 16384),
    ("cal-act-gpt", "gpt", 2, 512, 8, None, None, 512, 8, 4096),
    ("cal-gpt-256", "gpt", 6, 256, 4, None, None, 256, 2, 8192),
    ("cal-tiny-llama", "llama", 4, 128, 4, 2, 352, 256, 2, 4096),
    ("cal-gpt-1024", "gpt", 2, 1024, 16, None, None, 128, 2, 8192),
    ("cal-act-llama", "llama", 2, 512, 8, 8, 1376, 512, 8, 4096),
]
CALIBRATION_DDP = ("cal-tiny-gpt", "cal-llama-512", "cal-act-gpt", "cal-gpt-256")
PLATFORM_DP = {"cpu-2t": 1, "cpu-1t": 2}
MIN_RUNS_TO_FIT = 3


def cfg_dict(c) -> dict:
    return dict(zip(FIELDS, c, strict=True)) if not isinstance(c, dict) else dict(c)


def calibration_configs(platform: str) -> list[dict]:
    cs = [cfg_dict(c) for c in CALIBRATION]
    return cs if PLATFORM_DP[platform] == 1 else [c for c in cs if c["name"] in CALIBRATION_DDP]


# --------------------------------------------------------------------------- the training job
def build_model(c: dict, hf_defaults: bool = False):
    from bench.cpu.e2e_moe import build_moe_model, is_moe
    if is_moe(c):  # Mixtral / Qwen3-MoE / Qwen2-MoE (bench/cpu/e2e_moe.py)
        return build_moe_model(c)
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    if c["arch"] == "gpt":
        kw = {} if hf_defaults else {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                                     "activation_function": "gelu_pytorch_tanh"}
        cfg = GPT2Config(vocab_size=c["vocab"], n_positions=max(1024, c["seq"]), n_embd=c["hidden"],
                         n_layer=c["layers"], n_head=c["heads"], **kw)
        cfg._attn_implementation = "sdpa"
        model = GPT2LMHeadModel(cfg)
    else:
        cfg = LlamaConfig(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["ffn"],
                          num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                          num_key_value_heads=c["kv_heads"], max_position_embeddings=max(2048, c["seq"]),
                          tie_word_embeddings=False)
        cfg._attn_implementation = "sdpa"
        model = LlamaForCausalLM(cfg)
    return model.float().train()


def time_steps(model, c: dict, steps: int, warmup: int, seed: int = 0, ddp_group=None,
               target_s: float | None = None, max_steps: int = 12,
               on_step: Callable[[bool], None] | None = None) -> tuple[list[float], dict]:
    """Step times (s) and what was thrown away. Under DDP every step starts after a barrier and counts
    the slowest rank. A step during which other processes took CPU time (bench.env.Interference) is
    discarded and, after waiting for calm, run again (at most 3 * steps extra steps). With `target_s`,
    the first kept step sets the count: enough steps for about `target_s` seconds, between `steps`
    and `max_steps` (every rank agrees: the step time is already the slowest rank's). `on_step(kept)` is
    called after every step, outside its timer (kept: the step is one of the returned times)."""
    import torch

    from bench.env import Interference, wait_calm
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), generator=g)
    meter = Interference()
    dist = None
    if ddp_group is not None:
        import torch.distributed as dist

    def allmax(x: float) -> float:
        if dist is None:
            return x
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0])
    out, info = [], {"discarded_steps": 0, "waited_for_calm_s": 0.0, "others_cores": []}
    i = 0
    while len(out) < steps:
        if dist is not None:
            dist.barrier()
        s0 = meter.snap()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        wall, tot_j, own_j = meter.delta(s0)
        if dist is not None:
            t = torch.tensor([own_j], dtype=torch.int64)
            dist.all_reduce(t)
            own_j = int(t[0])
        others, disturbed = Interference.others(wall, tot_j, own_j)
        dt, others, disturbed = allmax(dt), allmax(others), bool(allmax(float(disturbed)))
        i += 1
        redo = i > warmup and disturbed and meter.available and info["discarded_steps"] < 3 * steps
        if on_step is not None:
            on_step(i > warmup and not redo)
        if i <= warmup:
            continue
        if redo:
            info["discarded_steps"] += 1
            info["waited_for_calm_s"] += wait_calm(600, allreduce_max=allmax if dist is not None else None)
            continue
        out.append(dt)
        info["others_cores"].append(round(others, 3))
        if target_s and len(out) == 1:
            steps = max(steps, min(max_steps, math.ceil(target_s / max(dt, 1e-3))))
    return out, info


def _now() -> str:
    from datetime import UTC, datetime
    return datetime.now(UTC).isoformat(timespec="seconds")


def _env(extra: dict | None = None) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "PYTHONWARNINGS": "ignore", **(extra or {})}


def single_worker(a) -> None:
    """One training job (launched by run_single, one process per config)."""
    import torch

    from bench.allocator import use_caching_malloc
    alloc = use_caching_malloc()["allocator"]
    torch.set_num_threads(a.threads)
    c = json.loads(a.config)
    model = build_model(c, a.hf_defaults)
    rec, extra = _moe_recorder(model, c)
    ts, info = time_steps(model, c, a.steps, a.warmup, target_s=a.target_s, on_step=rec.step_done if rec else None)
    extra |= {"routing": rec.summary()} if rec else {}
    Path(a.worker_out).write_text(json.dumps([{**c, "measured_s": statistics.median(ts), "steps_s": ts,
                                               "load": os.getloadavg()[0], "allocator": alloc,
                                               "measured_at": _now(), **info, **extra}]))


def _moe_recorder(model, c: dict):
    """A MoE model's routing recorder and what the built model is (bench/cpu/e2e_moe.py); (None, {}) for a dense one."""
    from bench.cpu.e2e_moe import RoutingRecorder, describe_model, is_moe
    if not is_moe(c):
        return None, {}
    return RoutingRecorder(model), {"model_check": describe_model(model)}


def ddp_worker(a) -> None:
    """One rank of a DDP training job (launched by torchrun)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from bench.allocator import use_caching_malloc
    alloc = use_caching_malloc()["allocator"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    c = json.loads(a.config)
    inner = build_model(c)
    rec, extra = _moe_recorder(inner, c)
    model = DDP(inner)
    ts, info = time_steps(model, c, a.steps, a.warmup, seed=rank, ddp_group=True, target_s=a.target_s,
                          on_step=rec.step_done if rec else None)
    if rec is not None:  # every rank routes its own tokens: rank 0's statistics, and each rank's imbalance
        per_rank: list = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, rec.summary())
        extra |= {"routing": per_rank[0], "imbalance_by_rank": [r.get("imbalance") for r in per_rank]}
    if rank == 0:
        Path(a.worker_out).write_text(json.dumps([{**c, "measured_s": statistics.median(ts), "steps_s": ts,
                                                   "load": os.getloadavg()[0], "allocator": alloc,
                                                   "measured_at": _now(), **info, **extra}]))
    dist.destroy_process_group()


def _worker_cmd(kind: str, c: dict, out: Path, steps: int, warmup: int, target_s: float | None,
                threads: int = 2, hf_defaults: bool = False, lock: str | None = None) -> list[str]:
    """The job's command line; with `lock`, run under `flock lock` (one heavy job at a time on a shared machine)."""
    pre = ["flock", lock] if lock else []
    args = ["-m", "bench.cpu.e2e", f"--worker-{kind}", "--worker-out", str(out), "--config", json.dumps(c),
            "--threads", str(threads), "--steps", str(steps), "--warmup", str(warmup)]
    args += (["--target-s", str(target_s)] if target_s else []) + (["--hf-defaults"] if hf_defaults else [])
    if kind == "single":
        return [*pre, sys.executable, *args]
    return [*pre, sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# A job whose kept steps change regime half-way (the median of the second half more than 30 % away from the first's:
# the machine slowed or sped up for a while, e.g. a neighbour on the host that /proc/stat cannot see) is run once more
# in a fresh process and the steps of both jobs are pooled. On 2026-11-28 one job (gpt-d) went 1.15, 1.11, then
# 1.77 s for the rest; re-timed twice in fresh processes it took 1.35 and 1.24 s.
UNSTEADY_RATIO = 1.3


def unsteady(steps_s: list[float]) -> bool:
    """Whether the first and second halves of a job's step times differ by more than UNSTEADY_RATIO (median)."""
    if len(steps_s) < 4:
        return False
    h = len(steps_s) // 2
    a, b = statistics.median(steps_s[:h]), statistics.median(steps_s[h:])
    return max(a, b) > UNSTEADY_RATIO * min(a, b)


def pool_if_unsteady(first: dict, rerun: Callable[[], dict], log: Callable[[str], None]) -> dict:
    """`first` when its steps are steady; else `rerun()` once more and the median of both jobs' steps (whatever
    the second job's steps look like: the choice depends on the first job only, never on which is faster)."""
    if not unsteady(first["steps_s"]):
        return {**first, "jobs": 1}
    log(f"  {first['name']}: its step times changed regime half-way ({first['measured_s']:.3f} s median); "
        "measured again in a fresh process, the two jobs' steps pooled")
    second = rerun()
    steps = list(first["steps_s"]) + list(second["steps_s"])
    return {**second, "measured_s": statistics.median(steps), "steps_s": steps, "jobs": 2,
            "job_measured_s": [first["measured_s"], second["measured_s"]],
            "discarded_steps": first.get("discarded_steps", 0) + second.get("discarded_steps", 0)}


def run_single(configs: list[dict], steps: int, warmup: int, threads: int = 2, hf_defaults: bool = False,
               system_malloc: bool = False, target_s: float | None = None,
               log: Callable[[str], None] = _stderr, deadline: float | None = None,
               lock: str | None = None) -> list[dict]:
    """Each config in a fresh process, one after another; with `deadline` (time.monotonic), configs not
    started by then are left out (the caller records which); with `lock`, each job runs under `flock lock`."""
    res = []
    with tempfile.TemporaryDirectory() as td:
        for c in configs:
            if deadline is not None and time.monotonic() >= deadline:
                break
            out = Path(td) / f"{c['name']}.json"
            cmd = _worker_cmd("single", c, out, steps, warmup, target_s, threads, hf_defaults, lock)

            def job(cmd: list[str] = cmd, out: Path = out) -> dict:
                subprocess.run(cmd, cwd=REPO, env=_env({"BENCH_SYSTEM_MALLOC": "1" if system_malloc else "0"}),
                               check=True)
                return dict(json.loads(out.read_text())[0])
            r = pool_if_unsteady(job(), job, log)
            res.append(r)
            log(f"  {c['name']:14s} {r['measured_s']:.3f} s  (load {r['load']:.2f}, redone {r['discarded_steps']})")
    return res


def run_ddp(configs: list[dict], steps: int, warmup: int, target_s: float | None = None,
            log: Callable[[str], None] = _stderr, deadline: float | None = None,
            lock: str | None = None) -> list[dict]:
    """One torchrun job (2 gloo ranks, 1 thread each) per config, as run_single."""
    res = []
    with tempfile.TemporaryDirectory() as td:
        for c in configs:
            if deadline is not None and time.monotonic() >= deadline:
                break
            out = Path(td) / f"{c['name']}.json"
            cmd = _worker_cmd("ddp", c, out, steps, warmup, target_s, lock=lock)

            def job(c: dict = c, cmd: list[str] = cmd, out: Path = out) -> dict:
                for attempt in range(1, 4):  # gloo on loopback now and then aborts both ranks at start-up
                    try:                      # ("terminate called without an active exception"): a fresh job
                        subprocess.run(cmd, cwd=REPO, env=_env(), check=True)  # after a pause; the record says so
                        break
                    except subprocess.CalledProcessError as exc:
                        if attempt == 3:
                            raise
                        log(f"  {c['name']}: the torchrun job failed (exit {exc.returncode}); again in 10 s")
                        time.sleep(10)
                return {**json.loads(out.read_text())[0], "job_attempts": attempt}
            r = pool_if_unsteady(job(), job, log)
            res.append(r)
            log(f"  {c['name']:14s} {r['measured_s']:.3f} s  (load {r['load']:.2f}, redone {r['discarded_steps']})")
    return res


# --------------------------------------------------------------------------- predicting and fitting
def spec_and_layout(c: dict, dp: int):
    from predictor.model.specs import Layout, ModelSpec
    m = ModelSpec(name=c["name"], arch=c["arch"], num_layers=c["layers"], hidden_size=c["hidden"],
                  num_heads=c["heads"], num_kv_heads=c["kv_heads"], ffn_hidden_size=c["ffn"],
                  vocab_size=c["vocab"], tied_embeddings=c["arch"] == "gpt", attention_impl="flash")
    L = Layout(num_gpus=dp, dp=dp, micro_batch=c["batch"], global_batch=c["batch"] * dp, seq_len=c["seq"],
               schedule="1f1b", recompute="none", precision="fp32")
    return m, L


def forget_loaded_models() -> None:
    """Regressors just retrained in this process must be read again (predictor caches loaded banks)."""
    from predictor.plan import predict
    clear = getattr(getattr(predict, "_load_bank", None), "cache_clear", None)
    if clear:
        clear()


def predict_rows(rows: list[dict], platform: str, dp: int, models_dir: str | None = None,
                 speed: dict | None = None, host: bool = True) -> list[dict]:
    """Predictions as sampled (a speed_check.json in the models folder is ignored), or with `speed`
    (a predictor.hardware.speed.SpeedCheck as a dict) scaling the measured operator times."""
    from predictor.hardware.speed import speed_check_from_dict
    from predictor.plan.predict import Predictor
    from predictor.step.compose import ComposeOptions
    pr = Predictor(platform, models_dir, ComposeOptions(speed_check=False, host_overhead=host),
                   speed_check=speed_check_from_dict(speed) if speed else None)
    out = []
    for r in rows:
        m, L = spec_and_layout(r, dp)
        p = pr.predict(m, L, timeline=False)
        out.append({**r, "predicted_s": p.step_time_s, "ape": abs(p.step_time_s - r["measured_s"]) / r["measured_s"],
                    "signed": (p.step_time_s - r["measured_s"]) / r["measured_s"], "provenance": p.provenance,
                    **{f"pred_{k}": v for k, v in p.breakdown_s.items() if v > 0}})
    return out


def fit_host(runs: list[dict], platform: str, models_dir: str | Path | None, source: str,
             save: bool = True) -> tuple[Any, dict, Path | None]:
    """The host overhead of `platform` fitted on measured HF runs (predictor.step.overhead), every run held out
    once with its model (leave-one-model-out); written to <models>/<platform>/host_overhead.json."""
    import numpy as np

    from predictor.calibrate.host import make_evaluator
    from predictor.plan.predict import Predictor, default_models_dir
    from predictor.step.compose import ComposeOptions
    from predictor.step.overhead import fit_host_overhead, save_host_overhead
    dp = PLATFORM_DP[platform]
    pr = Predictor(platform, models_dir, ComposeOptions(simulate=False, host_overhead=False, speed_check=False))
    items = [spec_and_layout(r, dp) for r in runs]
    meas = [r["measured_s"] for r in runs]
    groups = np.array([r["name"] for r in runs])
    ho, rep = fit_host_overhead(make_evaluator(pr, items), np.array(meas), groups, folds=len(groups),
                                source=source, grid_h=np.linspace(0.0, 0.05, 51), grid_p=(1.0, 2.0, 4.0))
    path = save_host_overhead(models_dir or default_models_dir(), platform, ho, rep) if save else None
    return ho, rep, path


def measured_run_records(rows: list[dict], platform: str, source: str) -> list[dict]:
    """predict-batch columns + step_time_s: what `python -m predictor ingest` takes as measured runs."""
    dp = PLATFORM_DP[platform]
    return [{"case_id": f"{platform}:{r['name']}", "platform": platform, "arch": r["arch"], "layers": r["layers"],
             "hidden": r["hidden"], "heads": r["heads"], "kv_heads": r["kv_heads"] or r["heads"],
             "ffn_hidden": r["ffn"] or 4 * r["hidden"], "vocab": r["vocab"], "seq_len": r["seq"], "num_gpus": dp,
             "tp": 1, "pp": 1, "dp": dp, "micro_batch": r["batch"], "global_batch": r["batch"] * dp, "vpp": 1,
             "schedule": "1f1b", "recompute": "none", "sequence_parallel": False, "zero_stage": 0,
             "precision": "fp32", "step_time_s": r["measured_s"], "source": source} for r in rows]


def save_validation_record(rows: list[dict], platform: str, models_dir: str | Path | None,
                           summary: dict | None, source: str) -> Path:
    """validation.json + validation_runs.csv of the platform (predictor.checks.validate's format) from predicted
    rows."""
    import pandas as pd

    from predictor.checks.validate import save_validation
    recs = measured_run_records(rows, platform, source)
    res = pd.DataFrame([{**rec, "measured_s": r["measured_s"], "predicted_s": r["predicted_s"], "ape": r["ape"],
                         "signed_error": r["signed"], "provenance": r.get("provenance", ""), "error": "",
                         **{f"{k}_s": v for k, v in r.items() if k.startswith("pred_")}}
                        for rec, r in zip(recs, rows, strict=True)])
    return save_validation(platform, res, str(models_dir) if models_dir else None, summary=summary)


def replace_measured_runs(platform: str, csv: Path, store: str | None) -> int:
    """Make the store's measured runs of `platform` exactly those in `csv` (earlier ones, e.g. another
    machine's, removed first). Returns the rows removed."""
    from bench.sampling.store_io import drop_platform_rows
    from predictor.samples.store import ingest_path
    n = drop_platform_rows(platform, store, ("measured_runs",))
    ingest_path(csv, store_path=store)
    return n


# --------------------------------------------------------------------------- the calibration phase
def calibrate(out_dir: Path, *, models_dir: str | None = None, store: str | None = None,
              budget_s: float | None = 240.0, platforms: tuple[str, ...] = ("cpu-2t", "cpu-1t"),
              loop_id: str | None = None, machine: dict | None = None, log: Callable[[str], None] = _stderr,
              measure: dict[str, Callable[..., list[dict]]] | None = None, update_store: bool = True,
              min_steps: int = 4, warmup: int = 2, target_s: float = 2.0) -> dict:
    """Measure the calibration configs (fresh process each; configs already measured by the same loop
    `loop_id` are kept, not measured again), then per platform: fit the host term, write
    host_overhead.json and the validation record, and the measured runs as CSV (and into the store).
    `budget_s` bounds the measuring (configs not started in time are left out and named); `measure`
    replaces the runners (tests). Writes out_dir/cpu_calibration.json and out_dir/<platform>-runs.csv."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rec_path = out_dir / "cpu_calibration.json"
    rec = json.loads(rec_path.read_text()) if rec_path.exists() else {}
    if rec.get("loop_id") != loop_id or loop_id is None:
        rec = {"loop_id": loop_id, "machine": machine, "tables": {}}
    rec["description"] = ("Hugging Face training steps measured by bench/cpu/e2e.py for the end-to-end calibration of "
                          "the CPU platforms (python -m bench cpu-platform); each config a fresh process")
    runners = measure or {"cpu-2t": lambda cs, deadline: run_single(cs, min_steps, warmup, 2, target_s=target_s,
                                                                    log=log, deadline=deadline),
                          "cpu-1t": lambda cs, deadline: run_ddp(cs, min_steps, warmup, target_s=target_s, log=log,
                                                                 deadline=deadline)}

    def save() -> None:
        tmp = rec_path.with_name(f".{rec_path.name}.tmp")
        tmp.write_text(json.dumps(rec, indent=1, default=str) + "\n")
        os.replace(tmp, rec_path)

    t0 = time.monotonic()
    share = {"cpu-2t": 0.45, "cpu-1t": 0.55}
    spent_before = 0.0
    for i, p in enumerate(platforms):
        t = rec["tables"].setdefault(p, {"platform": p, "runs": [], "left_out": []})
        have = {r["name"] for r in t["runs"]}
        todo = [c for c in calibration_configs(p) if c["name"] not in have]
        if todo:
            # this platform's share of the budget, plus what earlier platforms left unused
            last = i == len(platforms) - 1
            my = None if budget_s is None else (budget_s - spent_before if last else
                                                budget_s * share.get(p, 1 / len(platforms)))
            start = time.monotonic()
            deadline = None if my is None else start + max(0.0, my)
            log(f"calibration {p}: {len(todo)} HF training jobs, each in a fresh process"
                + (f" (budget {max(0.0, my):.0f} s)" if my is not None else ""))
            for r in runners[p](todo, deadline):
                t["runs"].append(r)
                save()
            t["measured_s"] = round(time.monotonic() - start, 1)
        t["left_out"] = [c["name"] for c in calibration_configs(p) if c["name"] not in {r["name"] for r in t["runs"]}]
        spent_before = time.monotonic() - t0
        save()
    rec["measuring_s"] = round(time.monotonic() - t0, 1)
    # fit and record per platform
    forget_loaded_models()
    from predictor.plan.predict import default_models_dir
    mdir = models_dir or str(default_models_dir())
    for p in platforms:
        t = rec["tables"][p]
        runs = t["runs"]
        if len(runs) < MIN_RUNS_TO_FIT:
            t["fit"] = {"skipped": f"{len(runs)} measured configs; the host term needs at least {MIN_RUNS_TO_FIT}"}
            log(f"calibration {p}: {t['fit']['skipped']}: host_overhead.json not written")
            continue
        when = str(t['runs'][0].get('measured_at', ''))[:16] or 'bench cpu-platform'
        source = (f"{len(runs)} HF transformers training runs on this machine ({when}), "
                  f"bench cpu-platform calibration ({out_dir.name}/cpu_calibration.json)")
        ho, rep, path = fit_host(runs, p, mdir, source)
        rows = predict_rows(runs, p, PLATFORM_DP[p], mdir)
        summary = {"mape": rep["cv_mape"], "n_runs": len(runs), "measuring_runs": 1,
                   "mape_basis": "leave-one-model-out cross-validation of the host term over the calibration "
                                 "configs of python -m bench cpu-platform (each run predicted by a host term fitted "
                                 "without its model)", "mape_fitted": rep["fit_mape"],
                   "mape_without_host_term": rep["no_host_mape"]}
        csv = out_dir / f"{p}-runs.csv"
        import pandas as pd
        src = f"bench/cpu/e2e.py calibration (HF transformers, AdamW, fp32) on machine {(machine or {}).get('id', '?')}"
        pd.DataFrame(measured_run_records(runs, p, src)).to_csv(csv, index=False)
        save_validation_record(rows, p, mdir, summary, src)
        removed = None
        if update_store:
            try:
                removed = replace_measured_runs(p, csv, store)
            except Exception as exc:  # noqa: BLE001 - the models are written; the store is a convenience
                log(f"calibration {p}: store not updated ({type(exc).__name__}: {exc})")
        t["fit"] = {"host_s_per_layer_pass": ho.host_s_per_layer_pass, "blend_p": ho.blend_p,
                    "cv_mape": rep["cv_mape"], "fit_mape": rep["fit_mape"], "no_host_mape": rep["no_host_mape"],
                    "host_overhead_json": str(path), "runs_csv": str(csv), "store_rows_replaced": removed,
                    "predicted": [{"name": r["name"], "measured_s": r["measured_s"], "predicted_s": r["predicted_s"],
                                   "signed": r["signed"]} for r in rows]}
        log(f"calibration {p}: host {ho.host_s_per_layer_pass * 1e3:.2f} ms per layer pass (p {ho.blend_p:g}); "
            f"MAPE without host term {rep['no_host_mape']:.1%}, fitted {rep['fit_mape']:.1%}, "
            f"leave-one-model-out {rep['cv_mape']:.1%} over {len(runs)} configs")
        save()
    return rec


# --------------------------------------------------------------------------- worker entry point
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cpu.e2e", description="one HF training job (internal)")
    ap.add_argument("--worker-single", action="store_true")
    ap.add_argument("--worker-ddp", action="store_true")
    ap.add_argument("--worker-out", required=True)
    ap.add_argument("--config", required=True, help="the config as JSON (FIELDS)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--target-s", type=float)
    ap.add_argument("--hf-defaults", action="store_true")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if a.worker_ddp:
        ddp_worker(a)
    else:
        single_worker(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

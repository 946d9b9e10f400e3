"""The operator sampler: a space-filling plan, timed op by op, written as resumable Parquet shards.

    python -m bench ops --platform cpu-2t --out bench/samples/cpu-2t --threads 2 --budget-s 600
    torchrun --standalone --nproc_per_node 2 -m bench ops --platform cpu-1t --out bench/samples/cpu-1t --threads 1

Under torchrun (WORLD_SIZE > 1) every rank times the same shape at the same time (a gloo barrier
before each pass), so the samples see the contention of data-parallel ranks sharing a machine
(memory bandwidth, caches, turbo); the row records the mean of the ranks' medians (and the max in
`rank_max_s`). Rank 0 alone writes and decides when the budget is spent.
"""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import env
from bench.kernels import opbench
from bench.sampling import design as D
from bench.sampling import store_io
from bench.sampling.timing import time_call
from predictor.model import ops as P


def _dist():
    ws = int(os.environ.get("WORLD_SIZE", "1"))
    if ws <= 1:
        return None
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist


def machine_from(facts: dict[str, Any]):
    from predictor.hardware.machine import from_dict
    return from_dict(facts["machine"])


def rank_device(device: str) -> str:
    """This rank's device: plain "cuda" becomes the GPU of its LOCAL_RANK, and a GPU is made current."""
    if device.startswith("cuda"):
        import torch
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = f"cuda:{local}" if device == "cuda" else device
        torch.cuda.set_device(torch.device(device))
    return device


def time_on_every_rank(fn, setup, *, device: str, target_s: float) -> tuple[float, float, Any]:
    """Time `fn` on every rank at once (a barrier first, under torchrun): (mean of the ranks' medians,
    the slowest rank's median, this rank's Timing). Without torchrun: (median, median, Timing)."""
    dist = _dist()
    if dist:
        dist.barrier()
    tm = time_call(fn, setup, device=device, target_s=target_s)
    med = rank_max = tm.median_s
    if dist:
        import torch
        t = torch.tensor([med], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        mx = torch.tensor([med], dtype=torch.float64)
        dist.all_reduce(mx, op=dist.ReduceOp.MAX)
        med, rank_max = float(t[0]) / dist.get_world_size(), float(mx[0])
    return med, rank_max, tm


def run_ops(platform: str, out_dir: str | Path, *, ops: list[str] | tuple[str, ...] = D.DEFAULT_OPS,
            device: str = "cpu", dtype: str = "fp32", threads: int | None = None, budget_s: float | None = None,
            n_per_op: int = 64, profile: str | D.Profile = "cpu", tps: tuple[int, ...] = (1,), seed: int = 0,
            flush_every_s: float = 15.0, quiet_info: dict[str, Any] | None = None, show_progress: bool = True,
            target_s: float = 0.12, guard_interference: bool = True, max_retries: int = 3,
            calm_wait_s: float = 600.0, log: Callable[[str], None] = print, machine=None,
            clock: Callable[[], float] = time.monotonic, points: list[D.DesignPoint] | None = None,
            build: Callable[[D.DesignPoint, str, str], dict] | None = None, kind: str = "ops",
            design_note: str | None = None) -> dict[str, Any]:
    """Measure the plan (skipping shapes already in `out_dir`) until done or `budget_s` is spent
    (time spent waiting for other processes to finish does not count). With `guard_interference`, a
    shape during which other processes took CPU time is measured again once the machine is calm.
    Returns a summary (also stored as this run's entry in manifest.json).

    `out_dir` must be free or hold samples of this machine (`machine`, default the one it runs on,
    predictor.hardware.machine): another machine's samples raise store_io.ForeignSamples before anything is
    measured or written. `clock` measures the budget (tests inject a deterministic one).

    `points` replaces the plan of `ops` (e.g. the grouped expert GEMMs of bench/sampling/gpu_ops.py), `build(point,
    dtype, device)` the kernel builder (default opbench.build); `kind` and `design_note` name such a run in
    the manifest. A set keeps one variant per op (e.g. a MoE op's top-k; the resume key does not hold it):
    a plan whose variant differs from the set's is refused (ValueError) before anything is measured."""
    import torch
    dist = _dist()
    rank = dist.get_rank() if dist else 0
    world = dist.get_world_size() if dist else 1
    if threads:
        torch.set_num_threads(int(threads))
    device = rank_device(device)
    out = Path(out_dir)
    lead = rank == 0
    if lead:
        out.mkdir(parents=True, exist_ok=True)
    facts = env.facts(device)
    if machine is not None:  # a given fingerprint (tests, or a caller that already resolved it)
        machine.threads = torch.get_num_threads()
        facts["machine"], facts["machine_id"] = machine.to_dict(), machine.id
    here = machine_from(facts)
    if dist:
        dist.barrier()
    store_io.check_same_machine(out, here)  # every rank raises alike: nothing is written on a foreign set
    done = store_io.done_op_keys(out)
    if dist:
        dist.barrier()  # every rank has read the same done-set before rank 0 writes anything
    if points is None:
        points = D.plan(list(ops), n_per_op, profile, tps, seed)
    else:
        ops = sorted({p.op for p in points})
    store_io.check_variants(out, points)
    todo = [p for p in points if any(p.key(ps, dtype) not in done for ps in P.OPS[p.op].passes)]
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:4]
    facts["ranks_concurrent"] = world
    run = {"run_id": run_id, "kind": kind, "started_at": store_io.now_iso(), "platform": platform,
           "device": device, "dtype": dtype, "threads": torch.get_num_threads(), "ranks_concurrent": world,
           "profile": profile if isinstance(profile, str) else profile.name, "tp": list(tps), "seed": seed,
           "n_per_op": n_per_op, "budget_s": budget_s,
           "ops": list(ops), "planned_points": len(points), "already_done_points": len(points) - len(todo),
           "loadavg_start": list(env.loadavg()), "quiet": quiet_info, "facts": facts, "machine_id": here.id,
           "timing": f"warm-up 2, median of 3..30 repeats (target {target_s} s per shape and pass)",
           **({"design": design_note} if design_note else {})}
    if lead:
        store_io.update_manifest(out, platform, facts, run,
                                 description=f"{platform}: {facts.get('device_name')}, "
                                             f"{torch.get_num_threads()} thread(s) per process, "
                                             f"{world} concurrent process(es), {dtype}")
    source = f"bench/ops {platform} run {run_id} on {facts.get('host')}"
    rows: list[dict[str, Any]] = []
    shard_seq, written, measured, skipped = 0, 0, 0, []
    last_flush = time.monotonic()
    t_start = clock()
    progress = None
    if lead and show_progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[op]:>14}"), TimeElapsedColumn(),
                            TextColumn("{task.fields[budget]}"))
        progress.start()
        task = progress.add_task(f"ops {platform}", total=len(todo), op="", budget="")

    def flush(force: bool = False) -> None:
        nonlocal rows, shard_seq, written, last_flush
        if lead and rows and (force or time.monotonic() - last_flush >= flush_every_s):
            store_io.write_shard(out, "ops", run_id, shard_seq, rows)
            written += len(rows)
            shard_seq += 1
            rows = []
            last_flush = time.monotonic()

    stopped = "plan complete"
    meter = env.Interference()
    guard = guard_interference and meter.available and not device.startswith("cuda")
    waited_calm, remeasured, accepted_disturbed = 0.0, 0, 0

    def allreduce_max(x: float) -> float:
        if not dist:
            return x
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0])

    def measure_point(p):
        """{pass: (median, rank max, Timing)} or None when the shape cannot be built."""
        ok, err = 1, "another rank failed"
        try:
            kernels = build(p, dtype, device) if build else opbench.build(p.op, {**p.shape, **p.extra}, dtype,
                                                                          device)
        except (RuntimeError, MemoryError) as exc:  # e.g. out of memory: skip the shape
            ok, kernels, err = 0, None, str(exc)[:200]
        if dist:
            t = torch.tensor([ok])
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            ok = int(t.item())
        if not ok:
            skipped.append({"op": p.op, "shape": p.shape, "error": err})
            return None
        results = {}
        for ps in P.OPS[p.op].passes:
            if p.key(ps, dtype) in done:
                continue
            setup, fn = kernels[ps]
            results[ps] = time_on_every_rank(fn, setup, device=device, target_s=target_s)
        del kernels
        return results

    try:
        for p in todo:
            go = 1
            if lead and budget_s is not None and clock() - t_start - waited_calm >= budget_s:
                go = 0
            if dist:
                t = torch.tensor([go])
                dist.broadcast(t, 0)
                go = int(t.item())
            if not go:
                stopped = f"time budget {budget_s:g} s spent"
                break
            for attempt in range(max_retries + 1):
                t_point = time.monotonic()
                s0 = meter.snap()
                results = measure_point(p)
                wall, tot_j, own_j = meter.delta(s0)
                if dist:  # sibling ranks are not interference
                    t = torch.tensor([own_j], dtype=torch.int64)
                    dist.all_reduce(t)
                    own_j = int(t[0])
                others, disturbed = env.Interference.others(wall, tot_j, own_j)
                others = allreduce_max(others)
                disturbed = bool(allreduce_max(float(disturbed)))
                if results is None or not guard or not disturbed:
                    break
                if attempt < max_retries:  # other processes took CPU time meanwhile: measure again when calm
                    remeasured += 1
                    waited_calm += env.wait_calm(calm_wait_s, allreduce_max=allreduce_max if dist else None,
                                                 log=log if lead else None)
                else:
                    accepted_disturbed += 1
            if results is None:
                if progress:
                    progress.advance(task)
                continue
            wall = time.monotonic() - t_point
            for ps, (med, rank_max, tm) in results.items():
                per = float(p.extra.get("calls_per_sample", 1))  # a grouped call of E experts: its 1/E share
                rows.append({"platform": platform, "op": p.op, "pass": ps, **p.shape, "variant": p.variant,
                             "dtype": dtype, "duration_s": med / per, "source": source, **p.extra.get("columns", {}),
                             "measured_at": store_io.now_iso(), "design_index": p.index, "reps": tm.reps,
                             "iqr_s": tm.iqr_s / per, "min_s": tm.min_s / per, "rank_max_s": rank_max / per,
                             **({"call_s": med} if per != 1 else {}),
                             "wall_s": wall / max(1, len(results)), "threads": torch.get_num_threads(),
                             "ranks_concurrent": world, "device": device, "others_cores": round(others, 3),
                             "disturbed": bool(disturbed and guard), "attempts": attempt + 1})
                measured += 1
            if progress:
                el = clock() - t_start - waited_calm
                progress.update(task, advance=1, op=p.op,
                                budget=f"{el:.0f}/{budget_s:.0f} s" if budget_s else f"{el:.0f} s")
            flush()
    except KeyboardInterrupt:
        stopped = "interrupted"
        raise
    finally:
        flush(force=True)
        if progress:
            progress.stop()
        elapsed = clock() - t_start
        run.update({"finished_at": store_io.now_iso(), "elapsed_s": round(elapsed, 1),
                    "sampling_s": round(elapsed - waited_calm, 1), "rows_written": written,
                    "stopped": stopped, "loadavg_end": list(env.loadavg()), "skipped_shapes": skipped[:20],
                    "n_skipped": len(skipped), "interference_guard": guard,
                    "interference_rule": f"a shape is measured again (up to {max_retries} times, after waiting for "
                                         f"calm) when other processes used more than {env.OTHERS_MAX_SHARE} of a "
                                         f"core + {env.OTHERS_SLACK_S} s during it (/proc/stat)",
                    "remeasured_points": remeasured, "accepted_disturbed_points": accepted_disturbed,
                    "waited_for_calm_s": round(waited_calm, 1)})
        if lead:
            store_io.update_manifest(out, platform, run=run)
    if lead:
        log(f"ops {platform}: {written} rows in {run['elapsed_s']} s ({stopped}); -> {out}")
    return run

"""The collective sampler: all-reduce, all-gather, reduce-scatter, send/recv and all-to-all over message sizes,
with torch.distributed (NCCL on GPUs, gloo on CPU), launched by torchrun on one node or many.

    torchrun --standalone --nproc_per_node 2 -m bench collectives --platform cpu-1t --out bench/samples/cpu-1t
    srun --nodes 2 --ntasks-per-node 1 torchrun --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d \
         --rdzv_endpoint $MASTER_ADDR:29500 -m bench collectives --device cuda --dtype bf16 \
         --platform my-cluster --out bench/samples/my-cluster

Topologies: the whole job (nodes x ranks per node) and, on many nodes, one rank per node and one
whole node, each as its own process group. `message_bytes` follows the store's convention:
all-reduce and reduce-scatter the full buffer, all-gather the per-rank input, p2p the tensor sent,
all-to-all one rank's whole send buffer (`all_to_all_single`, equal chunks of message / ranks to every rank,
its own included: the token exchange of expert parallelism; gloo and NCCL both run it).

Timing: per repeat a barrier, then the collective (CUDA: synchronize before and after), timed on
every rank; the repeat's time is the slowest rank's; the sample is the median over repeats
(2 warm-ups, 3..20 repeats, adaptive to the message size).
"""
from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench import env
from bench.sampling import store_io

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "p2p", "alltoall")
BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def message_sizes(n: int, min_bytes: int, max_bytes: int, quantum: int, seed: int = 0) -> list[int]:
    """`n` sizes log-spaced between min and max with a scrambled Sobol jitter (every prefix spreads over
    the whole range), rounded to a multiple of `quantum` bytes (element size x ranks)."""
    from scipy.stats import qmc
    m = max(1, math.ceil(math.log2(max(n, 2))))
    u = qmc.Sobol(d=1, scramble=True, seed=seed).random_base2(m)[:, 0][:n]
    lo, hi = math.log(min_bytes), math.log(max_bytes)
    out, seen = [], set()
    for x in u:
        b = int(round(math.exp(lo + x * (hi - lo)) / quantum)) * quantum
        b = max(quantum, b)
        if b not in seen:
            seen.add(b)
            out.append(b)
    return out


def _topologies(world: int, local: int) -> list[tuple[int, int, list[int]]]:
    """(nodes, ranks per node, member ranks) of the groups to sample."""
    nodes = max(1, world // max(local, 1))
    topo = [(nodes, local, list(range(world)))]
    if nodes > 1:
        topo.append((nodes, 1, [n * local for n in range(nodes)]))
        if local > 1:
            topo.append((1, local, list(range(local))))
    return topo


def run_collectives(platform: str, out_dir: str | Path, *, device: str = "cpu", dtype: str = "fp32",
                    collectives: tuple[str, ...] = COLLECTIVES, n_sizes: int = 24, min_bytes: int = 1024,
                    max_bytes: int = 256 * 2**20, budget_s: float | None = None, threads: int | None = 1,
                    quiet_info: dict[str, Any] | None = None, flush_every_s: float = 15.0, seed: int = 0,
                    target_s: float = 0.2, show_progress: bool = True, guard_interference: bool = True,
                    log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """Run on every rank of a torchrun job; rank 0 writes `coll-*.parquet` and the manifest."""
    import torch
    import torch.distributed as dist
    if threads:
        torch.set_num_threads(int(threads))
    cuda = device.startswith("cuda")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    lead = rank == 0
    out = Path(out_dir)
    if lead:
        out.mkdir(parents=True, exist_ok=True)
    facts = env.facts(device)
    dist.barrier()
    from predictor.hardware.machine import from_dict
    store_io.check_same_machine(out, from_dict(facts["machine"]))  # never add to another machine's set
    done = store_io.done_coll_keys(out)
    dist.barrier()
    tdt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    elem = BYTES[dtype]
    sizes = message_sizes(n_sizes, min_bytes, max_bytes, elem * world, seed)
    topos = _topologies(world, local)
    groups = []
    for nodes, per_node, members in topos:
        g = None if len(members) == world else dist.new_group(members)
        groups.append((nodes, per_node, members, g))
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:4]
    facts.update({"world_size": world, "local_world_size": local, "backend": dist.get_backend()})
    run = {"run_id": run_id, "kind": "collectives", "started_at": store_io.now_iso(), "platform": platform,
           "device": device, "dtype": dtype, "threads": torch.get_num_threads(), "world_size": world,
           "topologies": [f"{n}x{k}" for n, k, _, _ in groups], "sizes": sizes, "collectives": list(collectives),
           "budget_s": budget_s, "loadavg_start": list(env.loadavg()), "quiet": quiet_info, "facts": facts,
           "timing": "barrier, collective, slowest rank per repeat; median of 3..20 repeats after 2 warm-ups"}
    if lead:
        store_io.update_manifest(out, platform, facts, run)
    source = f"bench/collectives {platform} run {run_id} on {facts.get('host')}"
    work = [(s, c, topo) for s in sizes for topo in groups for c in collectives
            if store_io.coll_key(c, s, topo[0], topo[1], dtype) not in done]
    rows: list[dict[str, Any]] = []
    shard, written = 0, 0
    last_flush = t_start = time.monotonic()
    progress = None
    if lead and show_progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[what]:>24}"), TimeElapsedColumn())
        progress.start()
        task = progress.add_task(f"collectives {platform}", total=len(work), what="")

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    stopped = "plan complete"
    meter = env.Interference()
    # other processes' CPU time is only visible on this machine: guard single-node CPU jobs
    guard = guard_interference and meter.available and not cuda and world == local
    remeasured, waited = 0, 0.0
    try:
        for size, coll, (nodes, per_node, members, group) in work:
            go = torch.tensor([1 if budget_s is None or time.monotonic() - t_start - waited < budget_s else 0])
            dist.broadcast(go, 0)
            if not int(go.item()):
                stopped = f"time budget {budget_s:g} s spent"
                break
            n = len(members)
            member = rank in members
            numel = size // elem
            fn = None
            if member:
                if coll == "allreduce":
                    buf = torch.ones(numel, dtype=tdt, device=dev)
                    fn = lambda buf=buf, group=group: dist.all_reduce(buf, group=group)  # noqa: E731
                elif coll == "allgather":  # message = per-rank input
                    inp = torch.ones(numel, dtype=tdt, device=dev)
                    outp = torch.empty(numel * n, dtype=tdt, device=dev)
                    fn = lambda outp=outp, inp=inp, group=group: dist.all_gather_into_tensor(outp, inp, group=group)  # noqa: E731
                elif coll == "reducescatter":  # message = full input buffer
                    inp = torch.ones(numel - numel % n, dtype=tdt, device=dev)
                    outp = torch.empty(inp.numel() // n, dtype=tdt, device=dev)
                    fn = lambda outp=outp, inp=inp, group=group: dist.reduce_scatter_tensor(outp, inp, group=group)  # noqa: E731
                elif coll == "alltoall":  # message = one rank's send buffer, message / n to each rank
                    inp = torch.ones(numel - numel % n, dtype=tdt, device=dev)
                    outp = torch.empty_like(inp)
                    fn = lambda outp=outp, inp=inp, group=group: dist.all_to_all_single(outp, inp, group=group)  # noqa: E731
                elif coll == "p2p":  # first member -> last member (another node when the group spans nodes)
                    buf = torch.ones(numel, dtype=tdt, device=dev)
                    src, dst = members[0], members[-1]
                    if rank == src:
                        fn = lambda buf=buf, dst=dst: dist.send(buf, dst)  # noqa: E731
                    elif rank == dst:
                        fn = lambda buf=buf, src=src: dist.recv(buf, src)  # noqa: E731
                    else:
                        fn = lambda: None  # noqa: E731
            for attempt in range(4):
                s0 = meter.snap()
                times = []
                # warm-up and the adaptive repeat count are decided by rank 0's first timing
                reps = torch.tensor([3])

                def timed(fn=fn) -> float:
                    dist.barrier()
                    sync()
                    t0 = time.perf_counter()
                    if fn:
                        fn()
                    sync()
                    return time.perf_counter() - t0
                for i in range(2 + 1):
                    dt = timed()
                    if i == 2:
                        t = torch.tensor([dt], dtype=torch.float64)
                        dist.all_reduce(t, op=dist.ReduceOp.MAX)
                        reps = torch.tensor([int(min(20, max(3, math.ceil(target_s / max(float(t[0]), 1e-6)))))])
                dist.broadcast(reps, 0)
                for _ in range(int(reps.item())):
                    times.append(timed())
                t = torch.tensor(times, dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                wall, tot_j, own_j = meter.delta(s0)
                o = torch.tensor([own_j], dtype=torch.int64)
                dist.all_reduce(o)
                others, disturbed = env.Interference.others(wall, tot_j, int(o[0]))
                d = torch.tensor([float(disturbed), others], dtype=torch.float64)
                dist.all_reduce(d, op=dist.ReduceOp.MAX)
                disturbed, others = bool(d[0]) and guard, float(d[1])
                if not disturbed or attempt == 3:
                    break
                remeasured += 1

                def _max(x: float) -> float:
                    q = torch.tensor([x], dtype=torch.float64)
                    dist.all_reduce(q, op=dist.ReduceOp.MAX)
                    return float(q[0])
                waited += env.wait_calm(600, allreduce_max=_max)
            if lead:
                ts = t.numpy()
                rows.append({"platform": platform, "collective": coll, "message_bytes": size, "ranks": n,
                             "nodes": nodes, "gpus_per_node": per_node, "dtype": dtype,
                             "duration_s": float(np.median(ts)), "source": source,
                             "measured_at": store_io.now_iso(), "reps": len(ts),
                             "iqr_s": float(np.subtract(*np.percentile(ts, [75, 25]))), "min_s": float(ts.min()),
                             "backend": dist.get_backend(), "threads": torch.get_num_threads(),
                             "others_cores": round(others, 3), "disturbed": disturbed, "attempts": attempt + 1})
                if progress:
                    progress.update(task, advance=1, what=f"{coll} {size / 2**20:.2f} MiB {nodes}x{per_node}")
                if time.monotonic() - last_flush >= flush_every_s:
                    store_io.write_shard(out, "coll", run_id, shard, rows)
                    written += len(rows)
                    shard, rows, last_flush = shard + 1, [], time.monotonic()
    finally:
        if lead:
            if rows:
                store_io.write_shard(out, "coll", run_id, shard, rows)
                written += len(rows)
            if progress:
                progress.stop()
            run.update({"finished_at": store_io.now_iso(), "elapsed_s": round(time.monotonic() - t_start, 1),
                        "rows_written": written, "stopped": stopped, "loadavg_end": list(env.loadavg()),
                        "interference_guard": guard, "remeasured": remeasured, "waited_for_calm_s": round(waited, 1)})
            store_io.update_manifest(out, platform, run=run)
    if lead:
        log(f"collectives {platform}: {written} rows in {run['elapsed_s']} s ({stopped}); -> {out}")
    return run if lead else None

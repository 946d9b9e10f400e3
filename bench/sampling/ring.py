"""One step of ring attention (context parallelism, Megatron-Core's P2P ring), timed on every rank of a torchrun job.

    torchrun --standalone --nproc_per_node 8 -m bench ring --platform dgx-h100 --device cuda --dtype bf16
    python -m bench ring --platform cpu-1t --launch-local 2 --profile cpu     # gloo, the CPU path (tests)

cp = the job's ranks. Per design point (bench.sampling.design flash_attn shapes; `seq` is one rank's block,
seq_len / cp,
q [b, seq, heads, head_dim] and k, v [b, seq, kv_heads, head_dim]):

  attention block, causal     SDPA causal, q against its own K/V block (the diagonal step of the ring)
  attention block, full       SDPA without a mask, q against another rank's K/V block of the same length
                              (an off-diagonal step; Megatron's load balancing makes it half of such a block)
  K/V exchange                every rank sends its K and V block to the next rank and receives the previous
                              rank's (batch_isend_irecv), alone
  step                        the exchange started, the full block computed meanwhile, both waited for: what
                              one ring step costs when the send overlaps the block

forward and backward: the backward block is SDPA's backward, its exchange K/V plus dK/dV (twice the bytes).
Rows (store I/O as every sampler; a set of its own, bench/samples/<platform>-ring by default): op flash_attn with
variant "ring-causal-block" / "ring-full-block" and duration_s the block alone, the full block's rows carrying
`exchange_s`, `step_s`, `kv_block_bytes` and `cp`; and collective p2p rows (message_bytes = one rank's K/V
block(s) sent, `pattern` "ring-exchange") for the exchange. Repeats are the same count on every rank (the
exchange pairs ranks), the time of a repeat the slowest rank's median.
"""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import env
from bench.kernels import opbench, passes
from bench.sampling import design as D
from bench.sampling import store_io

VARIANTS = ("ring-causal-block", "ring-full-block")


def kv_block_bytes(shape: dict[str, int | None], elem: int) -> int:
    """Bytes of one rank's K and V block: 2 x b x seq x kv_heads x head_dim elements."""
    d = opbench.dims(shape)
    return 2 * d["b"] * d["l"] * d["KVr"] * d["hd"] * elem


def ring_points(n: int, profile: str | D.Profile = "gpu", seed: int = 0) -> list[D.DesignPoint]:
    """The flash_attn design (tp = 1) as per-rank blocks."""
    return D.op_design("flash_attn", n, profile, (1,), seed)


def _tensors(shape: dict[str, int | None], dt, dev):
    import torch
    d = opbench.dims(shape)
    b, l, Hr, KVr, hd = d["b"], d["l"], d["Hr"], d["KVr"], d["hd"]
    q = torch.randn(b, l, Hr, hd, dtype=dt, device=dev, requires_grad=True)
    k = torch.randn(b, l, KVr, hd, dtype=dt, device=dev, requires_grad=True)
    v = torch.randn(b, l, KVr, hd, dtype=dt, device=dev, requires_grad=True)
    return q, k, v, KVr != Hr


def attention_passes(shape: dict[str, int | None], causal: bool, dt, dev) -> dict[str, passes.Pass]:
    """{fwd, bwd}: SDPA of q against one K/V block of the same length, causal (diagonal) or not."""
    import torch.nn.functional as F
    q, k, v, gqa = _tensors(shape, dt, dev)

    def attn():
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=causal, enable_gqa=gqa)
    return passes.autograd_passes([q, k, v], attn)


def run_ring(platform: str, out_dir: str | Path, *, device: str = "cuda", dtype: str = "bf16", n_points: int = 32,
             profile: str | D.Profile = "gpu", seed: int = 0, budget_s: float | None = None, reps: int = 10,
             threads: int | None = None, log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """Run on every rank of a torchrun job; rank 0 writes the shards and the manifest."""
    import torch
    import torch.distributed as dist

    from bench.sampling.sampler import rank_device
    if threads:
        torch.set_num_threads(int(threads))
    device = rank_device(device)
    cuda = device.startswith("cuda")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise ValueError("a ring needs at least 2 ranks (run under torchrun)")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    lead = rank == 0
    out = Path(out_dir)
    dev = torch.device(device)
    dt = opbench.DTYPES[dtype]
    elem = torch.empty((), dtype=dt).element_size()
    facts = env.facts(device)
    if lead:
        out.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    from predictor.hardware.machine import from_dict
    store_io.check_same_machine(out, from_dict(facts["machine"]))
    plan = ring_points(n_points, profile, seed)
    done = {int(i) for i in store_io.read_shards(out, "ops").get("design_index", [])} if lead else set()
    skip = torch.tensor([int(p.index in done) for p in plan])
    dist.broadcast(skip, 0)  # every rank skips the same points (rank 0 read the set): resumable
    points = [p for p, k in zip(plan, skip.tolist(), strict=True) if not k]
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:4]
    facts.update({"world_size": world, "local_world_size": local, "backend": dist.get_backend()})
    run = {"run_id": run_id, "kind": "ring-attention", "started_at": store_io.now_iso(), "platform": platform,
           "device": device, "dtype": dtype, "cp": world, "profile": profile if isinstance(profile, str) else
           profile.name, "seed": seed, "n_points": n_points, "budget_s": budget_s, "facts": facts,
           "timing": f"barrier, then {reps} repeats after 1 warm-up, the same on every rank; per repeat the "
                     "slowest rank's time; the median over repeats"}
    if lead:
        store_io.update_manifest(out, platform, facts, run,
                                 description=f"{platform}: ring-attention steps over {world} ranks, {dtype}")
    source = f"bench/ring {platform} run {run_id} on {facts.get('host')}"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    def timed(fn: Callable[[Any], Any], setup: Callable[[], Any]) -> tuple[float, float]:
        """(median over repeats of the slowest rank's time, its min) with the same repeat count everywhere."""
        times = []
        for i in range(reps + 1):
            a = setup()
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            fn(a)
            sync()
            if i:
                times.append(time.perf_counter() - t0)
            del a
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.median()), float(t.min())

    def exchange(send: list, recv: list) -> list:
        ops = [dist.P2POp(dist.isend, s, nxt) for s in send] + [dist.P2POp(dist.irecv, r, prv) for r in recv]
        return dist.batch_isend_irecv(ops)

    ops_rows: list[dict[str, Any]] = []
    coll_rows: list[dict[str, Any]] = []
    shard = 0

    def flush() -> None:
        nonlocal shard
        for prefix, rows in (("ops", ops_rows), ("coll", coll_rows)):
            if rows:
                store_io.write_shard(out, prefix, run_id, shard, rows)
                rows.clear()
        shard += 1
    t_start = time.monotonic()
    stopped = "plan complete"
    for p in points:
        go = torch.tensor([1 if budget_s is None or time.monotonic() - t_start < budget_s else 0])
        dist.broadcast(go, 0)
        if not int(go.item()):
            stopped = f"time budget {budget_s:g} s spent"
            break
        shape = p.shape
        kvb = kv_block_bytes(shape, elem)
        row_base = {"platform": platform, "op": "flash_attn", **shape, "dtype": dtype, "source": source,
                    "design_index": p.index, "reps": reps, "cp": world, "kv_block_bytes": kvb, "device": device}
        res: dict[tuple[str, str], tuple[float, float]] = {}
        blocks = {v: attention_passes(shape, v == "ring-causal-block", dt, dev) for v in VARIANTS}
        for v in VARIANTS:
            for ps, (setup, fn) in blocks[v].items():
                res[(v, ps)] = timed(fn, setup)
        _q, k, vv, _ = _tensors(shape, dt, dev)
        kv = [k.detach(), vv.detach()]
        kv_in = [torch.empty_like(t) for t in kv]
        dkv, dkv_in = [torch.randn_like(t) for t in kv], [torch.empty_like(t) for t in kv]
        traffic = {"fwd": (kv, kv_in), "bwd": (kv + dkv, kv_in + dkv_in)}
        full = blocks["ring-full-block"]
        for ps in ("fwd", "bwd"):
            send, recv = traffic[ps]

            def alone(_a, send=send, recv=recv):
                for r in exchange(send, recv):
                    r.wait()

            def step(a, send=send, recv=recv, fn=full[ps][1]):
                reqs = exchange(send, recv)
                fn(a)
                for r in reqs:
                    r.wait()
            ex, ex_min = timed(alone, lambda: None)
            st, _ = timed(step, full[ps][0])
            now = store_io.now_iso()
            for v in VARIANTS:
                med, mn = res[(v, ps)]
                extra = {"exchange_s": ex, "step_s": st} if v == "ring-full-block" else {}
                ops_rows.append({**row_base, "pass": ps, "variant": v, "duration_s": med, "min_s": mn,
                                 "measured_at": now, **extra})
            sent = kvb * (2 if ps == "bwd" else 1)
            coll_rows.append({"platform": platform, "collective": "p2p", "message_bytes": sent,
                              "ranks": world, "nodes": max(1, world // max(local, 1)),
                              "gpus_per_node": min(local, world), "dtype": dtype, "duration_s": ex, "min_s": ex_min,
                              "source": source, "measured_at": now, "reps": reps, "pattern": "ring-exchange",
                              "ring_pass": ps, "design_index": p.index, "backend": dist.get_backend()})
        del blocks, kv, kv_in, dkv, dkv_in
        if not lead:
            ops_rows.clear()
            coll_rows.clear()
        elif len(ops_rows) >= 64:
            flush()
    if lead:
        flush()
        written = sum(len(store_io.read_shards(out, x)) for x in ("ops", "coll"))
        run.update({"finished_at": store_io.now_iso(), "elapsed_s": round(time.monotonic() - t_start, 1),
                    "stopped": stopped, "rows_in_set": written})
        store_io.update_manifest(out, platform, run=run)
        log(f"ring {platform}: cp {world}, {run['elapsed_s']} s ({stopped}); -> {out}")
    return run if lead else None


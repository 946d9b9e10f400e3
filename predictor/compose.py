"""Compose per-chunk micro-batch times into the time of one training step.

Pure computation: input is, for every pipeline chunk, the forward and backward time
of one micro-batch split by category, and the once-per-step tail (gradient sync,
optimizer); output is the step time, a breakdown whose categories add up to it, and
optionally a timeline of the pipeline schedule.

Schedules: gpipe (all forward, then all backward), 1f1b (PipeDream-flush) and
interleaved 1F1B with `vpp` virtual chunks per GPU (Narayanan et al. 2021).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

CATEGORIES = ("compute", "host_overhead", "tp_comm", "pp_comm", "dp_comm", "bubble", "optimizer")


@dataclass
class ChunkTimes:
    """One micro-batch through one pipeline chunk, in seconds, per category."""
    stage: int
    chunk: int
    fwd: dict[str, float]   # keys: compute, tp_comm, pp_comm, dp_comm (exposed zero-3 gathers)
    bwd: dict[str, float]   # same keys; recompute is counted in bwd 'compute' and in 'recompute'
    recompute_s: float = 0.0

    @property
    def fwd_s(self) -> float:
        return float(sum(self.fwd.values()))

    @property
    def bwd_s(self) -> float:
        return float(sum(self.bwd.values()))


@dataclass
class StageTail:
    """Once-per-step work of one physical stage after its last backward."""
    stage: int
    dp_comm_s: float          # gradient sync (all-reduce or reduce-scatter), full duration
    param_gather_s: float     # ZeRO-1/2 parameter all-gather after the optimizer
    embedding_sync_s: float   # tied-embedding all-reduce between first and last stage
    optimizer_s: float
    last_bwd_compute_s: float  # overlap window for bucketed gradient reduction


@dataclass(frozen=True)
class ComposeOptions:
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False
    grad_buckets: int = 8  # buckets per stage's gradients; the last one cannot overlap
    simulate: bool = True  # event simulation of the schedule (timeline); else closed form only
    max_simulated_tasks: int = 50_000
    host_overhead: bool = True  # add the fitted host (framework) overhead where the platform has one
    speed_check: bool = True  # scale measured op times by the platform's saved speed check (predictor.speed)


@dataclass
class Composition:
    step_time_s: float
    pipeline_s: float
    breakdown_s: dict[str, float]
    detail_s: dict[str, float]
    critical_stage: int
    timeline: list[dict] = field(default_factory=list)


def stage_totals(chunks: list[ChunkTimes], pp: int) -> tuple[np.ndarray, np.ndarray]:
    F = np.zeros(pp)
    B = np.zeros(pp)
    for c in chunks:
        F[c.stage] += c.fwd_s
        B[c.stage] += c.bwd_s
    return F, B


def pipeline_time_closed_form(F: np.ndarray, B: np.ndarray, m: int, schedule: str, vpp: int) -> float:
    """Closed form: the slowest stage works m times; fill and drain cost the other stages once
    (divided by vpp for the interleaved schedule)."""
    t = F + B
    if len(t) == 1:
        return float(m * t[0])
    if schedule == "gpipe":
        return float((m - 1) * F.max() + F.sum() + (m - 1) * B.max() + B.sum())
    if schedule == "interleaved":
        return float(m * t.max() + (t.sum() - t.max()) / vpp)
    return float((m - 1) * t.max() + t.sum())


def _stage_order(schedule: str, s: int, p: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """The (kind, micro_batch, virtual chunk) order one pipeline rank executes."""
    if schedule == "gpipe" or p == 1:
        fw = [("F", j, c) for j in range(m) for c in range(v)]
        bw = [("B", j, c) for j in range(m) for c in reversed(range(v))]
        return fw + bw
    if schedule == "1f1b":
        warm = min(p - s - 1, m)
        order = [("F", j, 0) for j in range(warm)]
        f, b = warm, 0
        while b < m:
            if f < m:
                order.append(("F", f, 0))
                f += 1
            order.append(("B", b, 0))
            b += 1
        return order
    # interleaved (Megatron): virtual micro-batch k -> (micro-batch, chunk)
    total = m * v

    def fwd_id(k: int) -> tuple[int, int]:
        group, pos = divmod(k, p * v)
        return group * p + pos % p, (pos // p)

    def bwd_id(k: int) -> tuple[int, int]:
        mb, c = fwd_id(k)
        return mb, v - 1 - c

    warm = min((p - s - 1) * 2 + (v - 1) * p, total)
    order = [("F", *fwd_id(k)) for k in range(warm)]
    f, b = warm, 0
    while b < total:
        if f < total:
            order.append(("F", *fwd_id(f)))
            f += 1
        order.append(("B", *bwd_id(b)))
        b += 1
    return order


def simulate_pipeline(chunks: list[ChunkTimes], pp: int, vpp: int, m: int, schedule: str) -> tuple[float, list[dict]]:
    """Event simulation: each rank runs its order; a forward of chunk c waits for chunk c-1's
    forward of the same micro-batch, a backward waits for chunk c+1's backward (or, on the
    last chunk, its own forward)."""
    n_chunks = pp * vpp
    dur = {}
    for c in chunks:
        g = c.chunk * pp + c.stage  # global chunk index in pipeline order
        dur[("F", g)] = c.fwd_s
        dur[("B", g)] = c.bwd_s
    orders = [_stage_order(schedule, s, pp, m, vpp) for s in range(pp)]
    ptr = [0] * pp
    free = [0.0] * pp
    done: dict[tuple[str, int, int], float] = {}
    timeline: list[dict] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(pp):
            while ptr[s] < len(orders[s]):
                kind, j, vc = orders[s][ptr[s]]
                g = vc * pp + s
                if kind == "F":
                    dep = ("F", j, g - 1) if g > 0 else None
                else:
                    dep = ("B", j, g + 1) if g < n_chunks - 1 else ("F", j, g)
                if dep is not None and dep not in done:
                    break
                start = max(free[s], done[dep] if dep is not None else 0.0)
                end = start + dur[(kind, g)]
                done[(kind, j, g)] = end
                free[s] = end
                timeline.append({"stage": s, "chunk": vc, "micro_batch": j, "kind": "forward" if kind == "F" else "backward",
                                 "start_s": start, "end_s": end})
                ptr[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked (a bug in the schedule order)")
    return max(free), timeline


def compose(chunks: list[ChunkTimes], tails: list[StageTail], *, pp: int, vpp: int, m: int, schedule: str,
            options: ComposeOptions = ComposeOptions()) -> Composition:
    F, B = stage_totals(chunks, pp)
    t = F + B
    timeline: list[dict] = []
    n_tasks = 2 * m * pp * vpp
    if options.simulate and n_tasks <= options.max_simulated_tasks:
        pipe, timeline = simulate_pipeline(chunks, pp, vpp, m, schedule)
        # stage s finishes its last backward when its own timeline ends
        finish = np.zeros(pp)
        for ev in timeline:
            finish[ev["stage"]] = max(finish[ev["stage"]], ev["end_s"])
    else:
        pipe = pipeline_time_closed_form(F, B, m, schedule, vpp)
        # the last backward leaves stage s before it reaches stage 0
        finish = np.array([pipe - B[:s].sum() / vpp for s in range(pp)])

    crit = int(np.argmax(t))
    # per-stage exposed tail
    ends, tail_parts = [], []
    for tail in tails:
        dp = tail.dp_comm_s
        if options.overlap_grad_reduce and dp > 0:
            last_bucket = dp / max(1, options.grad_buckets)
            dp_exposed = max(last_bucket, dp - tail.last_bwd_compute_s)
        else:
            dp_exposed = dp
        gather = 0.0 if options.overlap_param_gather else tail.param_gather_s
        parts = {"dp_comm": dp_exposed + gather + tail.embedding_sync_s, "optimizer": tail.optimizer_s}
        ends.append(finish[tail.stage] + sum(parts.values()))
        tail_parts.append(parts)
    step = float(max([pipe] + ends))
    crit_tail = int(np.argmax(ends)) if ends else 0

    # breakdown along the critical path: the busiest stage's m micro-batches, its idle time,
    # then the exposed tail of the stage that finishes last
    cat = {k: 0.0 for k in CATEGORIES}
    detail = {"compute_fwd": 0.0, "compute_bwd": 0.0, "recompute": 0.0}
    for c in chunks:
        if c.stage != crit:
            continue
        for d in (c.fwd, c.bwd):
            for k, v in d.items():
                cat[k] += m * v
        detail["compute_fwd"] += m * c.fwd.get("compute", 0.0)
        detail["compute_bwd"] += m * (c.bwd.get("compute", 0.0) - c.recompute_s)
        detail["recompute"] += m * c.recompute_s
    busy = m * t[crit]
    cat["bubble"] = max(0.0, pipe - busy)
    extra = step - pipe
    if extra > 0 and tails:
        parts = tail_parts[crit_tail]
        total = sum(parts.values())
        for k, v in parts.items():
            cat[k] += extra * (v / total if total > 0 else 0.0)
    # exact closure: any rounding goes to the bubble, and a bubble that is only rounding is none
    cat["bubble"] += step - sum(cat.values())
    if abs(cat["bubble"]) <= 1e-9 * step:
        cat["bubble"] = 0.0
    return Composition(step_time_s=step, pipeline_s=pipe, breakdown_s=cat, detail_s=detail,
                       critical_stage=crit, timeline=timeline)

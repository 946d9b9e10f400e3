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

# cp_comm: the context-parallel ring's exposed KV exchange (what the attention blocks do not hide)
# ep_comm: the MoE all-to-all dispatch and combine over the expert-parallel group (on the critical path)
# offload_comm: activation offloading's host-link copies that the neighbouring layers' compute does not hide
CATEGORIES = ("compute", "host_overhead", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble",
              "optimizer", "offload_comm")


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
    # Whether the platform lets collectives overlap compute at all (False where they share the cores);
    # whether a layout does is its framework's (predictor.model.frameworks, Layout.overlap_*).
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    grad_buckets: int = 8  # buckets per stage's gradients; the last one cannot overlap
    simulate: bool = True  # event simulation of the schedule (timeline); else closed form only
    max_simulated_tasks: int = 50_000
    host_overhead: bool = True  # add the fitted host (framework) overhead where the platform has one
    speed_check: bool = True  # scale measured op times by the platform's saved speed check (predictor.hardware.speed)


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
                timeline.append({"stage": s, "chunk": vc, "micro_batch": j,
                                 "kind": "forward" if kind == "F" else "backward", "start_s": start, "end_s": end})
                ptr[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked (a bug in the schedule order)")
    return max(free), timeline


@dataclass
class ArrayComposition:
    """`compose_arrays`' answer for R layouts of one pipeline structure (arrays of length R)."""
    step_time_s: np.ndarray
    pipeline_s: np.ndarray
    breakdown_s: dict[str, np.ndarray]
    detail_s: dict[str, np.ndarray]
    critical_stage: np.ndarray
    stage_finish_s: np.ndarray   # [R, pp]: when each stage finishes its last backward
    contention_s: np.ndarray | float = 0.0   # compute lost to the overlapped gradient reduction (critical stage)


def closed_form_pipeline(F: np.ndarray, B: np.ndarray, m: np.ndarray, schedule: str, vpp: int) -> np.ndarray:
    """`pipeline_time_closed_form` for R rows at once: F, B [R, pp] per-stage micro-batch times."""
    t = F + B
    pp = t.shape[1]
    if pp == 1:
        return m * t[:, 0]
    if schedule == "gpipe":
        return (m - 1) * F.max(axis=1) + F.sum(axis=1) + (m - 1) * B.max(axis=1) + B.sum(axis=1)
    tmax = t.max(axis=1)
    if schedule == "interleaved":
        return m * tmax + (t.sum(axis=1) - tmax) / vpp
    return (m - 1) * tmax + t.sum(axis=1)


def compose_arrays(fwd: dict[str, np.ndarray], bwd: dict[str, np.ndarray], recompute: np.ndarray,
                   chunk_stage: np.ndarray, *, pp: int, vpp: int, schedule: str, m: np.ndarray,
                   dp_sync_s: np.ndarray, param_gather_s: np.ndarray, embedding_sync_s: np.ndarray,
                   optimizer_s: np.ndarray, overlap_grad_reduce: np.ndarray, overlap_param_gather: np.ndarray,
                   grad_buckets: int = 8, contention: float = 0.0) -> ArrayComposition:
    """The step time of R layouts that share one pipeline structure (pp, vpp, schedule, chunks).

    fwd / bwd: category -> [R, C] seconds of one micro-batch through each of the C = pp * vpp chunks
    (categories of CATEGORIES but bubble / optimizer; bwd 'compute' includes recomputation, `recompute`
    [R, C] says how much). chunk_stage [C]: the physical stage of each chunk. The once-per-step tail of
    each stage [R, pp]: gradient sync (`dp_sync_s`, hidden behind the last backward in `grad_buckets`
    buckets where `overlap_grad_reduce`, the hidden part slowing the last backward by `contention` seconds per
    second), ZeRO-1 parameter gather after the optimizer (hidden where `overlap_param_gather`), tied-embedding
    sync, optimizer.

    The pipeline is the closed form (`pipeline_time_closed_form`; the event simulation of
    `simulate_pipeline` agrees within 0.3 % and draws the timeline). The breakdown follows the critical
    path: the busiest stage's m micro-batches, its idle time (bubble), then the exposed tail of the stage
    that finishes last; it adds up to the step time exactly."""
    onehot = (np.asarray(chunk_stage)[:, None] == np.arange(pp)[None, :]).astype(float)  # [C, pp]
    f_tot = sum(fwd.values())
    b_tot = sum(bwd.values())
    F = f_tot @ onehot
    B = b_tot @ onehot
    T = F + B
    m = np.asarray(m, dtype=float)
    n = len(m)
    pipe = closed_form_pipeline(F, B, m, schedule, vpp)
    finish = pipe[:, None] - (np.cumsum(B, axis=1) - B) / vpp
    last_bwd = (bwd["compute"] - recompute) @ onehot
    dp = dp_sync_s
    hidden = np.maximum(dp / max(1, grad_buckets), dp - last_bwd)
    dp_exposed = np.where(np.asarray(overlap_grad_reduce, bool)[:, None] & (dp > 0), hidden, dp)
    slowed = contention * (dp - dp_exposed)   # the last backward shares the GPU with the hidden reduction
    gather = np.where(np.asarray(overlap_param_gather, bool)[:, None], 0.0, param_gather_s)
    part_dp = dp_exposed + gather + embedding_sync_s
    ends = finish + slowed + part_dp + optimizer_s
    step = np.maximum(pipe, ends.max(axis=1))
    crit = T.argmax(axis=1)
    rr = np.arange(n)
    zeros = np.zeros_like(f_tot)
    on_crit = onehot[:, crit].T   # per row: which chunks run on its critical stage

    def crit_sum(a: np.ndarray) -> np.ndarray:
        return m * np.einsum("ij,ij->i", a, on_crit)
    cat = {k: crit_sum(fwd.get(k, zeros) + bwd.get(k, zeros)) for k in CATEGORIES}
    detail = {"compute_fwd": crit_sum(fwd["compute"]), "compute_bwd": crit_sum(bwd["compute"] - recompute),
              "recompute": crit_sum(recompute)}
    cat["bubble"] = np.maximum(0.0, pipe - m * T[rr, crit])
    extra = step - pipe
    ct = ends.argmax(axis=1)
    pd_, po, sl = part_dp[rr, ct], optimizer_s[rr, ct], slowed[rr, ct]
    tot = pd_ + po + sl
    safe = np.where(tot > 0, tot, 1.0)
    pos = (extra > 0) & (tot > 0)
    cat["dp_comm"] = cat["dp_comm"] + np.where(pos, extra * pd_ / safe, 0.0)
    cat["optimizer"] = cat["optimizer"] + np.where(pos, extra * po / safe, 0.0)
    cat["compute"] = cat["compute"] + np.where(pos, extra * sl / safe, 0.0)
    # exact closure: any rounding goes to the bubble, and a bubble that is only rounding is none
    cat["bubble"] = cat["bubble"] + step - sum(cat.values())
    cat["bubble"] = np.where(np.abs(cat["bubble"]) <= 1e-9 * step, 0.0, cat["bubble"])
    return ArrayComposition(step_time_s=step, pipeline_s=pipe, breakdown_s=cat, detail_s=detail,
                            critical_stage=crit, stage_finish_s=finish, contention_s=slowed.sum(axis=1))


def compose(chunks: list[ChunkTimes], tails: list[StageTail], *, pp: int, vpp: int, m: int, schedule: str,
            options: ComposeOptions = ComposeOptions()) -> Composition:
    """One layout: `compose_arrays` on per-chunk `ChunkTimes` (in pipeline order) and per-stage tails, plus
    the event-simulated timeline when `options.simulate` (the step time is the closed form either way)."""
    order = sorted(chunks, key=lambda c: (c.chunk, c.stage))
    keys = sorted({k for c in order for k in (*c.fwd, *c.bwd)})
    fwd = {k: np.array([[c.fwd.get(k, 0.0) for c in order]]) for k in keys}
    bwd = {k: np.array([[c.bwd.get(k, 0.0) for c in order]]) for k in keys}
    fwd.setdefault("compute", np.zeros((1, len(order))))
    bwd.setdefault("compute", np.zeros((1, len(order))))
    rec = np.array([[c.recompute_s for c in order]])
    by_stage = {t.stage: t for t in tails}

    def tail(attr: str) -> np.ndarray:
        return np.array([[getattr(by_stage[s], attr) if s in by_stage else 0.0 for s in range(pp)]])
    comp = compose_arrays(fwd, bwd, rec, np.array([c.stage for c in order]), pp=pp, vpp=vpp, schedule=schedule,
                          m=np.array([float(m)]), dp_sync_s=tail("dp_comm_s"), param_gather_s=tail("param_gather_s"),
                          embedding_sync_s=tail("embedding_sync_s"), optimizer_s=tail("optimizer_s"),
                          overlap_grad_reduce=np.array([options.overlap_grad_reduce]),
                          overlap_param_gather=np.array([options.overlap_param_gather]),
                          grad_buckets=options.grad_buckets)
    timeline: list[dict] = []
    if options.simulate and 2 * m * pp * vpp <= options.max_simulated_tasks:
        _, timeline = simulate_pipeline(chunks, pp, vpp, m, schedule)
    return Composition(step_time_s=float(comp.step_time_s[0]), pipeline_s=float(comp.pipeline_s[0]),
                       breakdown_s={k: float(v[0]) for k, v in comp.breakdown_s.items()},
                       detail_s={k: float(v[0]) for k, v in comp.detail_s.items()},
                       critical_stage=int(comp.critical_stage[0]), timeline=timeline)

"""Compose per-chunk micro-batch times into the time of one training step.

Pure computation: input is, for every pipeline chunk, the forward and backward time
of one micro-batch split by category, and the once-per-step tail (gradient sync,
optimizer); output is the step time, a breakdown whose categories add up to it, and
optionally a timeline of the pipeline schedule.

Schedules: gpipe (all forward, then all backward), 1f1b (PipeDream-flush) and
interleaved 1F1B with `vpp` virtual chunks per GPU (Narayanan et al. 2021); zb-h1, zb-v, dualpipe and dualpipe-v
(the backward split into input and weight gradient; the second half of this module, docs/schedules.md).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from predictor.model.stages import V_SCHEDULES, ZB_SCHEDULES, chunk_rank

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
    # --- zero-bubble schedules: the weight-gradient part W of bwd (the rest is B); docs/schedules.md ---
    wgrad_s: float = 0.0

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
    (divided by vpp for the interleaved schedule). The zero-bubble / DualPipe schedules need each chunk's W:
    `closed_form_zb`."""
    if schedule in ZB_SCHEDULES:
        raise ValueError(f"{schedule} needs the weight-gradient split: use closed_form_zb (or compose_arrays)")
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
    last chunk, its own forward). zb-h1 / zb-v / dualpipe / dualpipe-v: `simulate_zb`."""
    if schedule in ZB_SCHEDULES:
        return simulate_zb(chunks, pp, vpp, m, schedule)
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
    if schedule in ZB_SCHEDULES:
        raise ValueError(f"{schedule} needs the weight-gradient split: use closed_form_zb (or compose_arrays)")
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
                   grad_buckets: int = 8, contention: float = 0.0,
                   wgrad: np.ndarray | None = None) -> ArrayComposition:
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
    that finishes last; it adds up to the step time exactly.

    zb-h1 / zb-v / dualpipe / dualpipe-v (`closed_form_zb`; `wgrad` [R, C] the weight-gradient part of each
    chunk's backward): chunk_stage is replaced by the schedule's chunk placement (`chunk_rank_matrix`), every rank
    ends with its last W passes at the pipeline's end (the gradient reduction starts after the last W), and the
    communication DualPipe's overlapped pairs hide leaves the critical path."""
    zb = schedule in ZB_SCHEDULES
    if zb:
        onehot = chunk_rank_matrix(schedule, pp, vpp)
    else:
        onehot = (np.asarray(chunk_stage)[:, None] == np.arange(pp)[None, :]).astype(float)  # [C, pp]
    f_tot = sum(fwd.values())
    b_tot = sum(bwd.values())
    F = f_tot @ onehot
    B = b_tot @ onehot
    T = F + B
    m = np.asarray(m, dtype=float)
    n = len(m)
    zcf = None
    if zb:
        zcf = closed_form_zb(fwd, bwd, np.zeros_like(f_tot) if wgrad is None else wgrad, m, schedule, pp)
        pipe = zcf.pipeline_s
        finish = np.repeat(pipe[:, None], pp, axis=1)
    else:
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
    crit = T.argmax(axis=1) if zcf is None else zcf.critical
    reps = m if zcf is None else zcf.reps   # micro-batch passes of the critical rank (DualPipe: m / 2 per copy)
    rr = np.arange(n)
    zeros = np.zeros_like(f_tot)
    on_crit = onehot[:, crit].T   # per row: which chunks run on its critical stage

    def crit_sum(a: np.ndarray) -> np.ndarray:
        return reps * np.einsum("ij,ij->i", a, on_crit)
    cat = {k: crit_sum(fwd.get(k, zeros) + bwd.get(k, zeros)) for k in CATEGORIES}
    detail = {"compute_fwd": crit_sum(fwd["compute"]), "compute_bwd": crit_sum(bwd["compute"] - recompute),
              "recompute": crit_sum(recompute)}
    if zcf is not None and np.any(zcf.hidden_s > 0):
        # the communication DualPipe's F&B pairs run under compute leaves the critical path, pro rata
        hid = {k: cat[k] for k in OVERLAPPED_COMM}
        tot = sum(hid.values())
        safe_t = np.where(tot > 0, tot, 1.0)
        for k in OVERLAPPED_COMM:
            cat[k] = cat[k] - np.where(tot > 0, zcf.hidden_s * hid[k] / safe_t, 0.0)
    busy = reps * T[rr, crit] - (0.0 if zcf is None else zcf.hidden_s)
    cat["bubble"] = np.maximum(0.0, pipe - busy)
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
    if schedule in V_SCHEDULES:   # model order down the ranks and back up (chunk_rank)
        order = sorted(chunks, key=lambda c: (c.chunk, c.stage if c.chunk == 0 else -c.stage))
    else:
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
                          grad_buckets=options.grad_buckets,
                          wgrad=np.array([[c.wgrad_s for c in order]]) if schedule in ZB_SCHEDULES else None)
    timeline: list[dict] = []
    if options.simulate and 2 * m * pp * vpp <= options.max_simulated_tasks:
        _, timeline = simulate_pipeline(chunks, pp, vpp, m, schedule)
    return Composition(step_time_s=float(comp.step_time_s[0]), pipeline_s=float(comp.pipeline_s[0]),
                       breakdown_s={k: float(v[0]) for k, v in comp.breakdown_s.items()},
                       detail_s={k: float(v[0]) for k, v in comp.detail_s.items()},
                       critical_stage=int(comp.critical_stage[0]), timeline=timeline)


# ================================================================ zero-bubble and bidirectional schedules
# zb-h1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv 2401.10241, section 3.1), zb-v (Qi et al.,
# "Pipeline Parallelism with Controllable Memory", arXiv 2405.15362; the order of PyTorch's ScheduleZBVZeroBubble),
# dualpipe (DeepSeek-V3 technical report, arXiv 2412.19437, section 3.2.1 and Table 2; the order of
# deepseek-ai/DualPipe's DualPipe.step) and dualpipe-v (DualPipeV.step of the same repository). docs/schedules.md.
# A chunk's backward is split into B (input gradient) and W (weight gradient): W is half the backward time of its
# linear-layer GEMMs (a GEMM's backward is a data-gradient and a weight-gradient GEMM of the same FLOPs), everything
# else (attention backward, norms, activations, recomputation, communication) is B.
# DualPipe overlaps a forward chunk of one micro-batch with a backward chunk of another: the communication of each
# (the MoE all-to-all, the pipeline sends) runs under the other's compute (DeepSeek-V3 section 3.2.1, Figure 4)
OVERLAPPED_COMM = ("pp_comm", "ep_comm")


def chunk_rank_matrix(schedule: str, pp: int, vpp: int) -> np.ndarray:
    """[C, pp]: 1 where a rank holds chunk g's parameters and runs it (DualPipe: chunk g on ranks g and pp-1-g,
    the two directions' copies; the other schedules one rank per chunk)."""
    nch = pp * vpp
    out = np.zeros((nch, pp))
    for g in range(nch):
        out[g, chunk_rank(schedule, pp, g)] = 1.0
        if schedule == "dualpipe":
            out[g, pp - 1 - g] = 1.0
    return out


def _v_orders(n: int, m: int, zero_bubble_v: bool) -> list[list[tuple]]:
    """Per rank r of n: actions over its two chunks, phase 0 (chunk r) and phase 1 (chunk 2n-1-r). An action is a
    tuple of tasks (kind, phase, micro-batch); kind F (forward), B (input gradient), W (weight gradient), BW (the
    whole backward); two tasks = an overlapped forward-backward pair (DualPipe's F&B)."""
    return [(_zbv_rank_order if zero_bubble_v else _dualpipe_v_rank_order)(r, n, m) for r in range(n)]


def _zbv_rank_order(r: int, n: int, m: int) -> list[tuple]:
    """ZB-V's order on rank r (PyTorch torch.distributed.pipelining ScheduleZBVZeroBubble
    ._calculate_single_rank_operations: warm-up, steady F-B-W on both chunks, cool-down; padded to 2n-1
    micro-batches, the padding dropped)."""
    nm = max(2 * n - 1, m)
    c = {"f0": 0, "f1": 0, "b0": 0, "b1": 0}
    seq: list[tuple[str, int, int]] = []

    def put(kind: str, ph: int, key: str) -> None:
        seq.append((kind, ph, c[key]))
        c[key] += 1
    for _ in range(2 * (n - r) - 1):
        put("F", 0, "f0")
    for _ in range(r):
        put("F", 1, "f1")
        put("F", 0, "f0")
    for _ in range(n - r):
        put("F", 1, "f1")
        seq.append(("B", 1, c["b1"]))
        put("W", 1, "b1")
    while c["f1"] < c["f0"] or c["f0"] < nm:
        if c["f0"] < nm:
            put("F", 0, "f0")
        seq.append(("B", 0, c["b0"]))
        put("W", 0, "b0")
        put("F", 1, "f1")
        seq.append(("B", 1, c["b1"]))
        put("W", 1, "b1")
    w0, w1 = c["b0"], c["b1"]
    for _ in range(r):
        put("B", 0, "b0")
        put("B", 1, "b1")
    for _ in range(n - r):
        put("B", 0, "b0")
        seq.append(("W", 0, w0))
        w0 += 1
    seq += [("W", 1, j) for j in range(w1, c["b1"])] + [("W", 0, j) for j in range(w0, c["b0"])]
    return [((k, ph, j),) for k, ph, j in seq if j < m]


def _dualpipe_v_rank_order(r: int, n: int, m: int) -> list[tuple]:
    """DualPipeV's order on rank r (deepseek-ai/DualPipe DualPipeV.step, steps 1-8; DualPipe.step is the same per
    half rank and direction). W passes run FIFO from the backwards that split off their weight gradient."""
    o: list[tuple] = []
    cnt: dict[tuple, int] = {}
    wq: list[tuple[int, int]] = []

    def nxt(k: tuple) -> int:
        v = cnt.get(k, 0)
        cnt[k] = v + 1
        return v

    def F(ph: int) -> None:
        o.append((("F", ph, nxt(("F", ph))),))

    def B(ph: int, zb: bool) -> None:
        j = nxt(("B", ph))
        if zb:
            o.append((("B", ph, j),))
            wq.append((ph, j))
        else:
            o.append((("BW", ph, j),))

    def W() -> None:
        if wq:
            ph, j = wq.pop(0)
            o.append((("W", ph, j),))

    def FB(a: int, b: int) -> None:
        o.append((("F", a, nxt(("F", a))), ("BW", b, nxt(("B", b)))))
    for _ in range((n - r - 1) * 2):   # 1: nF0
        F(0)
    for _ in range(r + 1):             # 2: nF0F1
        F(0)
        F(1)
    for _ in range(n - r - 1):         # 3: nB1W1F1 (zero bubble)
        B(1, True)
        W()
        F(1)
    for i in range(m - 2 * n + r + 1):   # 4: nF0B1F1B0, the overlapped pairs
        if i == 0 and r == n - 1:   # "we don't overlap these two chunks to further reduce bubble size"
            F(0)
            B(1, False)
        else:
            FB(0, 1)
        FB(1, 0)
    for _ in range(n - r - 1):         # 5: nB1F1B0
        B(1, False)
        FB(1, 0)
    zb = False
    for i in range(r + 1):             # 6: nB1B0, the second half with zero bubble
        if i == (r + 1) // 2 and r % 2 == 1:
            zb = True
        B(1, zb)
        if i == (r + 1) // 2 and r % 2 == 0:
            zb = True
        B(0, zb)
    for _ in range(n - r - 1):         # 7: nWB0
        W()
        B(0, True)
    for _ in range(r + 1):             # 8: nW
        W()
    return o


@dataclass(frozen=True)
class _ChunkPasses:
    """One micro-batch through each pipeline chunk (model order): forward, input-gradient backward B, weight
    gradient W (B + W = the whole backward), and the parts of forward / backward an overlapped pair can hide."""
    f: tuple[float, ...]
    bi: tuple[float, ...]
    w: tuple[float, ...]
    hide_f: tuple[float, ...]
    hide_b: tuple[float, ...]

    def overlapped_s(self, a: int, b: int) -> float:
        """DualPipe's F&B: chunk a's forward beside chunk b's whole backward, each one's communication under the
        other's compute (the compute summed): max(compute of both, communication of both)."""
        rest = self.f[a] - self.hide_f[a] + self.bi[b] + self.w[b] - self.hide_b[b]
        return max(rest, self.hide_f[a] + self.hide_b[b])


def _passes(chunks: list[ChunkTimes], schedule: str, pp: int) -> _ChunkPasses:
    nch = len(chunks)
    f, bi, w, hf, hb = ([0.0] * nch for _ in range(5))
    for c in chunks:
        g = (c.stage if c.chunk == 0 else 2 * pp - 1 - c.stage) if schedule in V_SCHEDULES else c.chunk * pp + c.stage
        f[g] = c.fwd_s
        w[g] = min(max(c.wgrad_s, 0.0), c.bwd_s)
        bi[g] = c.bwd_s - w[g]
        hf[g] = sum(c.fwd.get(k, 0.0) for k in OVERLAPPED_COMM)
        hb[g] = sum(c.bwd.get(k, 0.0) for k in OVERLAPPED_COMM)
    return _ChunkPasses(tuple(f), tuple(bi), tuple(w), tuple(hf), tuple(hb))


_KIND = {"F": "forward", "B": "backward", "BW": "backward", "W": "weight"}


def _run_orders(orders: list[list[tuple]], chunk_of, last: int, P: _ChunkPasses) -> tuple[float, list[tuple]]:
    """Event simulation of fixed per-rank orders (`_v_orders`); `chunk_of(rank, phase)` the chunk a task runs.
    A forward waits for the previous chunk's forward of its micro-batch, a backward (B or BW) for the next chunk's
    backward (the last chunk: its own forward); W follows its B on the same rank. Returns the end and the events
    (rank, tasks, start, end)."""
    n = len(orders)
    ptr, free = [0] * n, [0.0] * n
    done: dict[tuple, float] = {}
    events: list[tuple] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(n):
            while ptr[r] < len(orders[r]):
                act = orders[r][ptr[r]]
                deps = []
                for kind, ph, j in act:
                    g = chunk_of(r, ph)
                    if kind == "F":
                        deps.append(("F", j, g - 1) if g > 0 else None)
                    elif kind == "W":
                        deps.append(("bwd", j, g))
                    else:
                        deps.append(("bwd", j, g + 1) if g < last else ("F", j, g))
                need = [d for d in deps if d is not None]
                if any(d not in done for d in need):
                    break
                start = max([free[r]] + [done[d] for d in need])
                if len(act) == 2:
                    dur = P.overlapped_s(chunk_of(r, act[0][1]), chunk_of(r, act[1][1]))
                else:
                    kind, ph, _ = act[0]
                    g = chunk_of(r, ph)
                    dur = {"F": P.f[g], "B": P.bi[g], "W": P.w[g], "BW": P.bi[g] + P.w[g]}[kind]
                end = start + dur
                for kind, ph, j in act:
                    done[("F" if kind == "F" else "W" if kind == "W" else "bwd", j, chunk_of(r, ph))] = end
                free[r] = end
                events.append((r, act, start, end))
                ptr[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked (a bug in the schedule order)")
    return max(free), events


def _zb_h1_orders(p: int, m: int) -> list[list[tuple]]:
    """ZB-H1 (Qi et al. 2024, section 3.1, Figure 3): every stage runs 1F1B's order of forwards and input-gradient
    backwards B; stage s postpones its weight-gradient passes W by s micro-batches (W of micro-batch j right after
    B of j + s, the last s at the end), so the later stages' W passes fill the cool-down and every stage holds at most
    p micro-batches' activations, 1F1B's first-stage peak. On uniform stages this order's bubble is
    (p-1) max(F + B - W, B, F) (B the input gradient): the paper's (p-1)(F + B - W) where W <= F, B."""
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        o: list[tuple] = [(("F", 0, j),) for j in range(warm)]
        f, b = warm, 0
        wq: list[int] = []
        while b < m:
            if f < m:
                o.append((("F", 0, f),))
                f += 1
            o.append((("B", 0, b),))
            wq.append(b)
            b += 1
            if len(wq) > s:
                o.append((("W", 0, wq.pop(0)),))
        o += [(("W", 0, j),) for j in wq]
        orders.append(o)
    return orders


def simulate_zb(chunks: list[ChunkTimes], pp: int, vpp: int, m: int, schedule: str) -> tuple[float, list[dict]]:
    """`simulate_pipeline` for zb-h1 / zb-v / dualpipe / dualpipe-v: (pipeline end, timeline). Timeline events
    carry kind 'forward', 'backward' (B, or the whole backward where it is not split) or 'weight' (W), and
    'overlapped' True for the two halves of a DualPipe F&B pair."""
    P = _passes(chunks, schedule, pp)
    timeline: list[dict] = []
    if schedule == "zb-h1":
        end, events = _run_orders(_zb_h1_orders(pp, m), lambda r, ph: r, pp - 1, P)
        for s, ((kind, _, j),), a, b in events:
            timeline.append({"stage": s, "chunk": 0, "micro_batch": j, "kind": _KIND[kind], "start_s": a, "end_s": b})
        return end, timeline
    if schedule == "dualpipe":
        n, mm = pp // 2, m // 2   # DualPipe on pp ranks = DualPipeV on pp/2 half ranks, per direction (m/2 each)
    else:
        n, mm = pp, m
    orders = _v_orders(n, mm, schedule == "zb-v")

    def chunk_of(r: int, ph: int) -> int:
        return r if ph == 0 else 2 * n - 1 - r
    end, events = _run_orders(orders, chunk_of, 2 * n - 1, P)
    ranks = (lambda h: [(h, 0), (pp - 1 - h, 1)]) if schedule == "dualpipe" else (lambda h: [(h, 0)])
    for h, act, a, b in events:
        if len(act) == 2:
            share = (P.f[chunk_of(h, act[0][1])], P.bi[chunk_of(h, act[1][1])] + P.w[chunk_of(h, act[1][1])])
            cut = a + (b - a) * share[0] / max(sum(share), 1e-300)
            spans = [(act[0], a, cut), (act[1], cut, b)]
        else:
            spans = [(act[0], a, b)]
        for (kind, ph, j), a0, b0 in spans:
            for rank, mirrored in ranks(h):
                # DualPipe: the mirrored rank runs the same order with the two directions swapped
                direction = ph if not mirrored else 1 - ph
                mb = j + (direction * mm if schedule == "dualpipe" else 0)
                timeline.append({"stage": rank, "chunk": ph, "micro_batch": mb, "kind": _KIND[kind],
                                 "start_s": a0, "end_s": b0, **({"overlapped": True} if len(spans) == 2 else {})})
    return end, timeline


@dataclass
class ZBClosedForm:
    """`closed_form_zb`'s answer for R rows: the pipeline time, the critical rank, the micro-batch passes each
    rank runs per step (DualPipe: m / 2 per direction), the seconds of communication its overlapped
    forward-backward pairs hide on the critical rank, and the bubble term added to its work."""
    pipeline_s: np.ndarray
    critical: np.ndarray
    reps: np.ndarray
    hidden_s: np.ndarray
    bubble_s: np.ndarray


def _pair_ranks(schedule: str, pp: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(ranks n of the V, chunk a and chunk c of each V rank): zb-v / dualpipe-v run chunks r and 2pp-1-r on rank r;
    DualPipe is DualPipeV on pp/2 half ranks (rank r and its mirror pp-1-r run chunks r and pp-1-r)."""
    n = pp // 2 if schedule == "dualpipe" else pp
    r = np.arange(n)
    return n, r, 2 * n - 1 - r


def closed_form_zb(fwd: dict[str, np.ndarray], bwd: dict[str, np.ndarray], wgrad: np.ndarray, m: np.ndarray,
                   schedule: str, pp: int) -> ZBClosedForm:
    """The pipeline time of zb-h1 / zb-v / dualpipe / dualpipe-v for R rows; fwd / bwd: category -> [R, C] seconds
    per chunk (model order), wgrad [R, C] the W part of bwd. With per-rank forward F, input-gradient backward B,
    weight gradient W, whole backward B + W (for the V schedules and DualPipe the mean over a rank's two chunks):
      zb-h1      the longest path through a stage s: the fill to s, m T_s, the input-gradient chain back to the
                 stages before s (with their postponed W) beyond the s W passes s postpones, and the sum over the
                 stages after s of max(F + B - W, B, F); on uniform stages m T + (p-1) max(F + B - W, B, F),
                 Qi et al. 2024 section 3.1:
                 (p-1)(F + B - W) where W <= F, B (Table 2 of DeepSeek-V3 writes it (PP-1)(F + B - 2W) with B the
                 whole backward); the max is what `_zb_h1_orders` gives when W exceeds F or B
      zb-v       m T_crit + sum over the other ranks of max(B, 2(B - W), F)   (PyTorch's ZBV order on uniform
                 chunks with m >= 2p - 1: exact where F <= B and W <= B, which the B / W split always gives since B
                 holds the data-gradient GEMMs, as long as W; a lower bound where F > B. At F = B = W it is (p-1) F,
                 the warm-up the ZB papers hide behind the previous step's optimizer, which this model does not)
      dualpipe-v max over ranks of (m T - hidden) + sum over the other ranks of (F&B + (B + W) - 3W)
      dualpipe   the same on pp/2 half ranks with m/2 micro-batches per direction: (PP/2-1)(F&B + B - 3W), B the
                 whole backward (DeepSeek-V3 Table 2; the DualPipe README gives DualPipeV the same row on PP/2
                 devices, PP counting chunks)
    T = the rank's forward + backward work per micro-batch; F&B = `_ChunkPasses.overlapped_s` (max of the two
    chunks' compute and of their communication), hidden = what the F&B pairs of the rank's steady state hide."""
    f: np.ndarray = np.asarray(sum(fwd.values()), dtype=float)
    bf: np.ndarray = np.asarray(sum(bwd.values()), dtype=float)
    w = np.minimum(np.maximum(wgrad, 0.0), bf)
    bi = bf - w
    m = np.asarray(m, dtype=float)
    rr = np.arange(len(m))
    if schedule == "zb-h1":
        T = f + bf
        x = np.maximum(np.maximum(f + bi - w, bi), f)
        # per stage s, the path through it: the fill to it, its m micro-batches, the input-gradient chain back to the
        # stages before it and their postponed W passes beyond its own s postponed ones, the other stages' bubble
        # after it; the pipeline is the longest (on uniform stages every s gives m T + (p-1) x)
        s_ = np.arange(T.shape[1])[None, :]
        lead = np.cumsum(f, axis=1) - f
        cb = np.cumsum(bi, axis=1) - bi
        run = np.maximum.accumulate(s_ * w - cb, axis=1)
        up = np.concatenate([np.full((len(m), 1), -np.inf), cb[:, 1:] + run[:, :-1]], axis=1)
        tail = x.sum(axis=1, keepdims=True) - np.cumsum(x, axis=1)
        E = lead + m[:, None] * T + np.maximum(0.0, up - s_ * w) + tail
        crit = E.argmax(axis=1)
        pipe = E[rr, crit]
        return ZBClosedForm(pipe, crit, m, np.zeros_like(m), pipe - m * T[rr, crit])
    n, a, c = _pair_ranks(schedule, pp)
    T = f[:, a] + bf[:, a] + f[:, c] + bf[:, c]
    if schedule == "zb-v":
        b_r, w_r, f_r = (bi[:, a] + bi[:, c]) / 2, (w[:, a] + w[:, c]) / 2, (f[:, a] + f[:, c]) / 2
        x = np.maximum(np.maximum(b_r, 2 * (b_r - w_r)), f_r)
        crit = T.argmax(axis=1)
        bub = x.sum(axis=1) - x[rr, crit]
        return ZBClosedForm(m * T[rr, crit] + bub, crit, m, np.zeros_like(m), bub)
    hf: np.ndarray = sum((fwd[k] for k in OVERLAPPED_COMM if k in fwd), np.zeros_like(f))
    hb: np.ndarray = sum((bwd[k] for k in OVERLAPPED_COMM if k in bwd), np.zeros_like(f))

    def fb(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        return np.maximum(f[:, i] - hf[:, i] + bf[:, j] - hb[:, j], hf[:, i] + hb[:, j])
    fb_ac, fb_ca = fb(a, c), fb(c, a)
    save = (f[:, a] + bf[:, c] - fb_ac + f[:, c] + bf[:, a] - fb_ca) / 2
    mm = m / 2 if schedule == "dualpipe" else m
    r = np.arange(n)[None, :]
    # F&B pairs per rank in DualPipeV.step: steps 4 and 5 (the last rank's first step-4 pair is not overlapped)
    n_fb = np.maximum(0.0, 2 * (mm[:, None] - 2 * n + r + 1) - (r == n - 1) + (n - r - 1))
    work = mm[:, None] * T - n_fb * save
    x = np.maximum(0.0, (fb_ac + fb_ca) / 2 + (bf[:, a] + bf[:, c]) / 2 - 3 * (w[:, a] + w[:, c]) / 2)
    crit = work.argmax(axis=1)
    bub = x.sum(axis=1) - x[rr, crit]
    return ZBClosedForm(work[rr, crit] + bub, crit, mm, (n_fb * save)[rr, crit], bub)


def zb_orders(schedule: str, pp: int, m: int) -> tuple[list[list[tuple]], Callable[[int], list[int]]]:
    """The per-rank orders the simulation runs (actions of (kind, phase, micro-batch) tasks) and, per order, the
    ranks that run it (DualPipe: half rank h and its mirror pp-1-h, m/2 micro-batches per direction)."""
    if schedule == "zb-h1":
        return _zb_h1_orders(pp, m), lambda h: [h]
    if schedule == "dualpipe":
        return _v_orders(pp // 2, m // 2, False), lambda h: [h, pp - 1 - h]
    return _v_orders(pp, m, schedule == "zb-v"), lambda h: [h]

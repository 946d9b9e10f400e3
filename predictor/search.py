"""Configuration search: every layout of a model on a cluster, the ones that do not fit dropped
(with the reason kept), the rest ranked by step time, tokens/s, MFU or cost.

    from predictor.search import search
    rep = search(get_preset("llama3-70b"), "dgx-a100-80gb", num_gpus=1024, global_batch=1024, seq_len=4096)
    rep.table          # every enumerated layout, feasible ones ranked first, with reason when rejected
    rep.top            # the best `top_k` with exact predictions, memory reports and training cost
    rep.why_absent(tp=1, pp=1)   # why no layout with these values is in the ranking

Dimensions searched (`SearchSpace`): tensor parallel (divisors of the GPUs that the model's heads,
kv heads and MLP width allow; within a node unless `tp_within_node=False`), pipeline parallel
(divisors, at most one layer per stage), the even layer split and an "edge-light" split (first and
last stage one layer lighter, for the embedding and the LM head), data parallel (what remains),
micro-batch (divisors of the per-replica batch up to `max_micro_batch`), interleaved schedules with
`vpp` virtual stages, recomputation (none / selective / full; selective is skipped with flash
attention, where it equals none), sequence parallelism, ZeRO stage 0-3 (stage 2 = FSDP
SHARD_GRAD_OP, 3 = FULL_SHARD; see decompose._add_step_work).

Speed: the step time of a candidate is not obtained by calling `Predictor.predict` per layout.
Per (tp, micro-batch, sequence parallel, recompute) the decomposition of a 4-layer, 3-stage model
gives the forward / backward / recompute time and tensor-parallel traffic of one layer and of the
two edge chunks; per (tp, dp, ZeRO stage, chunk) `_add_step_work` gives the optimizer and the
data-parallel traffic; all operator and collective times are then predicted in one batch per
(operator, pass) / collective, and stages, pipeline (closed form, as `predict(timeline=False)`),
tails and breakdowns are assembled with numpy across all candidates of one pipeline structure.
The `top_k` results are re-predicted with `Predictor.predict` (`refine=True`);
tests/test_search.py checks that the fast path agrees with it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from . import memory as mem
from .compose import CATEGORIES, ComposeOptions
from .costing import TrainingEstimate, training_estimate
from .decompose import CommCall, StagePlan, _add_step_work, decompose, group_topology, split_layers
from .network import analytic_time_s
from .platforms import Platform
from .predict import Predictor, StepPrediction, get_predictor, model_flops_per_step
from .specs import BYTES_PER_ELEMENT, InfeasibleConfig, Layout, ModelSpec, padded_vocab

OBJECTIVES = {"time": ("step_time_s", True), "tokens": ("tokens_per_s", False), "mfu": ("mfu", False),
              "cost": ("gpu_hours_per_mtok", True)}
RC = ("none", "selective", "full")
SCHED = ("1f1b", "interleaved", "gpipe")


@dataclass(frozen=True)
class SearchSpace:
    """What to enumerate; None = everything valid."""
    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    max_micro_batch: int = 16
    vpp: tuple[int, ...] | None = None
    max_vpp: int = 8
    recompute: tuple[str, ...] = RC
    sequence_parallel: tuple[bool, ...] = (False, True)
    zero_stage: tuple[int, ...] = (0, 1, 2, 3)
    schedules: tuple[str, ...] = ("1f1b", "interleaved")
    uneven_splits: bool = True
    tp_within_node: bool = True
    precision: str = "bf16"


@dataclass
class SearchResult:
    rank: int
    layout: Layout
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    breakdown_s: dict[str, float]
    memory: mem.MemoryReport
    training: TrainingEstimate
    prediction: StepPrediction | None = None   # the exact prediction (refine=True)
    fast_step_time_s: float | None = None      # the search's own (vectorised) value
    table_index: int = -1                      # row of SearchReport.table

    def to_dict(self) -> dict[str, Any]:
        L = self.layout
        d = {"rank": self.rank, "layout": _layout_dict(L), "step_time_s": self.step_time_s,
             "tokens_per_s": self.tokens_per_s, "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu,
             "breakdown_s": self.breakdown_s, "memory": self.memory.to_dict(), "training": self.training.to_dict()}
        if self.prediction is not None:
            d["expected_error"] = self.prediction.expected_error
            d["provenance"] = self.prediction.provenance
        return d


@dataclass
class SearchReport:
    model: ModelSpec
    platform_id: str
    objective: str
    table: pd.DataFrame                 # every enumerated layout (feasible ranked first)
    top: list[SearchResult]
    exclusions: list[dict[str, str]]    # options never enumerated, with the reason
    elapsed_s: float
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def n_enumerated(self) -> int:
        return len(self.table)

    @property
    def n_feasible(self) -> int:
        return int(self.table["fits"].sum()) if len(self.table) else 0

    @property
    def feasible(self) -> pd.DataFrame:
        return self.table[self.table["fits"]]

    @property
    def rejected(self) -> pd.DataFrame:
        return self.table[~self.table["fits"]]

    def rejection_summary(self) -> pd.DataFrame:
        """Rejected layouts counted by the part of memory that dominates, plus option-level exclusions."""
        rows = []
        rej = self.rejected
        if len(rej):
            for kind, g in rej.groupby("reject_kind"):
                rows.append({"reason": kind, "layouts": len(g), "example": g.iloc[0]["reason"]})
        for e in self.exclusions:
            rows.append({"reason": "not enumerated: " + e["option"], "layouts": 0, "example": e["reason"]})
        return pd.DataFrame(rows, columns=["reason", "layouts", "example"])

    def why_absent(self, **filters: Any) -> pd.DataFrame:
        """Why layouts with these values (e.g. tp=1, zero_stage=0) are not ranked: the rejected ones
        that match, with their reasons, and the option-level exclusions that name a filtered value."""
        t = self.table
        mask = np.ones(len(t), bool)
        for k, v in filters.items():
            if k not in t.columns:
                raise KeyError(f"unknown field '{k}' (one of {', '.join(t.columns)})")
            mask &= (t[k] == v).to_numpy()
        hits = t[mask & ~t["fits"].to_numpy()][["num_gpus", "tp", "pp", "dp", "micro_batch", "vpp", "schedule",
                                                   "recompute", "sequence_parallel", "zero_stage", "peak_mem_gib",
                                                   "reason"]]
        ex = []
        for e in self.exclusions:
            vals = e.get("values", {})
            common = [k for k in filters if k in vals]
            if common and all(vals[k] == filters[k] for k in common):
                ex.append(e)
        if ex:
            hits = pd.concat([hits, pd.DataFrame([{"reason": f"{e['option']}: {e['reason']}"} for e in ex])],
                             ignore_index=True)
        return hits

    def to_dict(self, all_rows: bool = False) -> dict[str, Any]:
        d = {"model": self.model.name, "platform": self.platform_id, "objective": self.objective,
             "enumerated": self.n_enumerated, "feasible": self.n_feasible, "elapsed_s": self.elapsed_s,
             "timings_s": self.timings_s, "top": [r.to_dict() for r in self.top],
             "rejections": self.rejection_summary().to_dict(orient="records"), "exclusions": self.exclusions}
        if all_rows:
            d["layouts"] = self.table.to_dict(orient="records")
        return d


def _layout_dict(L: Layout) -> dict[str, Any]:
    d = {k: getattr(L, k) for k in ("num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch", "seq_len", "vpp",
                                    "schedule", "recompute", "sequence_parallel", "zero_stage", "precision")}
    d["stage_layers"] = list(L.stage_layers) if L.stage_layers else None
    d["num_micro_batches"] = L.num_micro_batches
    return d


def _divisors(n: int) -> list[int]:
    out = set()
    for i in range(1, int(math.isqrt(n)) + 1):
        if n % i == 0:
            out.update((i, n // i))
    return sorted(out)


# ------------------------------------------------------------------------------ enumeration
@dataclass(frozen=True)
class _Structure:
    pp: int
    vpp: int
    schedule: str
    counts: tuple[int, ...]                 # layers per chunk, pipeline order
    stage_layers: tuple[int, ...] | None    # what Layout carries (None = default split)


def enumerate_layouts(model: ModelSpec, platform: Platform, num_gpus: int, global_batch: int, seq_len: int,
                      space: SearchSpace = SearchSpace()):
    """(rows, structures, exclusions): candidate rows as tuples
    (num_gpus, tp, pp, dp, mb, m, struct_id, rc_id, sp, zero), the pipeline structures they use,
    and the options never enumerated with the reason."""
    L = model.num_layers
    gpn = platform.gpus_per_node
    excl: list[dict[str, str]] = []
    structs: list[_Structure] = []
    struct_ids: dict[_Structure, int] = {}

    def sid(s: _Structure) -> int:
        if s not in struct_ids:
            struct_ids[s] = len(structs)
            structs.append(s)
        return struct_ids[s]

    rcs = [r for r in space.recompute if r in RC]
    if model.attention_impl == "flash" and "selective" in rcs and "none" in rcs:
        rcs.remove("selective")
        excl.append({"option": "recompute=selective", "values": {"recompute": "selective"},
                     "reason": "with flash attention selective recomputation equals none (the kernel recomputes "
                               "the attention scores itself); ranked as recompute=none."})
    rows: list[tuple] = []
    tps = space.tp or tuple(_divisors(num_gpus))
    for tp in tps:
        why = None
        if num_gpus % tp:
            why = f"does not divide {num_gpus} GPUs."
        elif model.num_heads % tp:
            why = f"heads {model.num_heads} not divisible by {tp}."
        elif model.kv_heads % tp and tp % model.kv_heads:
            why = f"kv_heads {model.kv_heads} and {tp} do not divide one another."
        elif model.ffn % tp:
            why = f"ffn_hidden {model.ffn} not divisible by {tp}."
        elif space.tp_within_node and (tp > gpn or gpn % tp):
            why = (f"tensor parallelism would cross node boundaries ({gpn} GPUs per node); "
                   f"allow it with tp_within_node=False (--tp-across-nodes).")
        if why:
            if space.tp is not None or tp <= max(gpn, 8) * 2:
                excl.append({"option": f"tp={tp}", "values": {"tp": tp}, "reason": why})
            continue
        sps = [s for s in space.sequence_parallel if not s or (tp > 1 and seq_len % tp == 0)]
        pps = space.pp or tuple(_divisors(num_gpus // tp))
        for pp in pps:
            if (num_gpus // tp) % pp:
                continue
            if pp > L:
                if (space.pp is not None or pp <= 2 * L) and not any(e["option"] == f"pp={pp}" for e in excl):
                    excl.append({"option": f"pp={pp}", "values": {"pp": pp},
                                 "reason": f"pp={pp} exceeds the {L} layers (one layer per stage at least)."})
                continue
            dp = num_gpus // (tp * pp)
            if global_batch % dp:
                excl.append({"option": f"tp={tp}, pp={pp} (dp={dp})", "values": {"tp": tp, "pp": pp, "dp": dp},
                             "reason": f"global batch {global_batch} is not a multiple of dp={dp}."})
                continue
            per_replica = global_batch // dp
            mbs = [b for b in (space.micro_batch or _divisors(per_replica))
                   if per_replica % b == 0 and b <= (space.max_micro_batch if space.micro_batch is None else b)]
            zs = [z for z in space.zero_stage if z == 0 or dp > 1]
            structures_pp: list[tuple[int, int]] = []  # (struct id, vpp)
            if "1f1b" in space.schedules or pp == 1:
                even = _Structure(pp, 1, "1f1b", tuple(split_layers(L, pp)), None)
                structures_pp.append((sid(even), 1))
                if space.uneven_splits and pp >= 3:
                    c = split_layers(L + 2, pp)
                    c[0] -= 1
                    c[-1] -= 1
                    if min(c) >= 1 and tuple(c) != even.counts:
                        structures_pp.append((sid(_Structure(pp, 1, "1f1b", tuple(c), tuple(c))), 1))
            if "gpipe" in space.schedules and pp > 1:
                structures_pp.append((sid(_Structure(pp, 1, "gpipe", tuple(split_layers(L, pp)), None)), 1))
            inter: list[int] = []
            if "interleaved" in space.schedules and pp >= 2:
                cand_v = space.vpp or tuple(range(2, space.max_vpp + 1))
                for v in cand_v:
                    if v >= 2 and L % (pp * v) == 0:
                        inter.append(v)
            for mb in mbs:
                m = per_replica // mb
                plist = list(structures_pp) if pp > 1 else [structures_pp[0]]
                for v in inter:
                    if m % pp == 0:
                        st = _Structure(pp, v, "interleaved", tuple([L // (pp * v)] * (pp * v)), None)
                        plist.append((sid(st), v))
                for st_id, _v in plist:
                    for rc in rcs:
                        rci = RC.index(rc)
                        for sp in sps:
                            for z in zs:
                                rows.append((num_gpus, tp, pp, dp, mb, m, st_id, rci, int(sp), z))
    return rows, structs, excl


# ------------------------------------------------------------------------------ fast evaluator
class _Parts:
    """Per (tp, mb, sp, rc): per-micro-batch seconds of one layer and of the edge chunks, bytes of
    a pipeline send, and activation bytes."""
    __slots__ = ("layer", "first", "last", "p2p_bytes", "act_layer", "act_full", "act_first", "act_last",
                 "act_last_transient")


_PART_FIELDS = ("fc", "bc", "rc", "ft", "bt")  # fwd compute, bwd compute (+recompute), recompute, tp fwd, tp bwd


class FastEvaluator:
    """Vectorised step time and memory for many layouts of one model on one platform."""

    def __init__(self, model: ModelSpec, predictor: Predictor, memory_options: mem.MemoryOptions = mem.MemoryOptions()):
        self.model = model
        self.P = predictor
        self.platform = predictor.platform
        self.mopt = memory_options
        self._parts: dict[tuple, _Parts] = {}
        self._plans: dict[tuple, tuple] = {}     # K -> (plan decomposition, seq, precision)
        self._class: dict[tuple, tuple] = {}
        self._emb: dict[tuple, float] = {}
        self._p2p: dict[tuple, float] = {}

    # ---- building blocks ------------------------------------------------------------------
    def prepare(self, keys: Iterable[tuple], seq_len: int, precision: str) -> None:
        """Decompose and time the per-layer / edge work of every (tp, mb, sp, rc) in `keys`."""
        todo = [k for k in set(keys) if (k, seq_len, precision) not in self._parts]
        if not todo:
            return
        model4 = replace(self.model, num_layers=4)
        decomp = {}
        calls = []
        for (tp, mb, sp, rc) in todo:
            L = Layout(num_gpus=3 * tp, tp=tp, pp=3, dp=1, micro_batch=mb, global_batch=mb * 3, seq_len=seq_len,
                       recompute=RC[rc], sequence_parallel=bool(sp), precision=precision, stage_layers=(1, 2, 1))
            plans = decompose(model4, L, self.platform)
            decomp[(tp, mb, sp, rc)] = plans
            for p in plans:
                calls.extend(p.ops)
        self.P.time_ops(calls, precision)
        prime_comm_cache(self.P, [c for ps in decomp.values() for p in ps for c in p.comms])
        cache = self.P._op_cache
        for key, plans in decomp.items():
            aggs = []
            for p in plans:
                a = dict.fromkeys(_PART_FIELDS, 0.0)
                for c in p.ops:
                    t = cache[(*c.key, precision)][0] * c.count * c.scale
                    if c.phase == "fwd":
                        a["fc"] += t
                    else:
                        a["bc"] += t
                        if c.phase == "recompute":
                            a["rc"] += t
                for c in p.comms:
                    if c.group != "tp":
                        continue
                    t = self.P.time_comm(c)[0] * c.count
                    a["ft" if c.phase == "fwd" else "bt"] += t
                aggs.append(a)
            layer = {k: aggs[1][k] / 2.0 for k in _PART_FIELDS}
            parts = _Parts()
            parts.layer = layer
            parts.first = {k: aggs[0][k] - layer[k] for k in _PART_FIELDS}
            parts.last = {k: aggs[2][k] - layer[k] for k in _PART_FIELDS}
            p2p = [c.message_bytes for c in plans[1].comms if c.group == "pp"]
            parts.p2p_bytes = p2p[0] if p2p else 0
            tp, mb, sp, rc = key
            o = self.mopt
            parts.act_layer = mem.activation_bytes_per_layer(self.model, seq_len, mb, tp, bool(sp), RC[rc],
                                                             precision, o)
            parts.act_full = mem.full_layer_activation_bytes(self.model, seq_len, mb, tp, bool(sp), precision, o)
            parts.act_first, parts.act_last, parts.act_last_transient = mem.edge_activation_bytes(
                self.model, seq_len, mb, tp, bool(sp), precision, o)
            self._parts[(key, seq_len, precision)] = parts

    def _prepare_classes(self, keys: set[tuple], seq_len: int, precision: str) -> None:
        """Optimizer + data-parallel work of a chunk, per (tp, pp, dp, zero, layers, first, last)."""
        todo = [k for k in keys if (k, seq_len, precision) not in self._class]
        if not todo:
            return
        plans = {}
        ops, comms = [], []
        for (tp, pp, dp, z, n, first, last) in todo:
            L = Layout(num_gpus=tp * pp * dp, tp=tp, pp=pp, dp=dp, micro_batch=1, global_batch=dp, seq_len=seq_len,
                       zero_stage=z, precision=precision)
            dp_topo = group_topology(self.platform, L, "dp")
            plan = StagePlan(stage=0, chunk=0, layers=n, is_first=bool(first), is_last=bool(last),
                             params_per_gpu=mem.chunk_params(self.model, tp, pp, n, bool(first), bool(last), seq_len))
            _add_step_work(plan, self.model, L, dp_topo, self.platform)
            plans[(tp, pp, dp, z, n, first, last)] = plan
            ops += plan.step_ops
            comms += plan.step_comms + plan.comms
        self.P.time_ops(ops, precision)
        prime_comm_cache(self.P, comms)
        cache = self.P._op_cache
        for key, plan in plans.items():
            opt = sum(cache[(*c.key, precision)][0] * c.count for c in plan.step_ops)
            dp_s = gather_s = 0.0
            for c in plan.step_comms:
                t = self.P.time_comm(c)[0]
                if c.collective == "allgather":
                    gather_s += t
                else:
                    dp_s += t
            z = {"fwd": [0.0, 0.0], "bwd": [0.0, 0.0]}
            for c in plan.comms:
                t = self.P.time_comm(c)[0]
                zz = z["fwd" if c.phase == "fwd" else "bwd"]
                zz[0] += t * c.count
                zz[1] = max(zz[1], t)
            self._class[(key, seq_len, precision)] = (opt, dp_s, gather_s, z["fwd"][0], z["fwd"][1],
                                                       z["bwd"][0], z["bwd"][1])

    def _emb_sync(self, tp: int, pp: int, dp: int, precision: str) -> float:
        """Tied-embedding all-reduce between the first and last stage (decompose's convention)."""
        key = (tp, pp, dp, precision)
        if key not in self._emb:
            m = self.model
            if not (m.tied_embeddings and pp > 1):
                self._emb[key] = 0.0
            else:
                L = Layout(num_gpus=tp * pp * dp, tp=tp, pp=pp, dp=dp)
                emb_params = padded_vocab(m.vocab_size, tp) * m.hidden_size // tp
                c = CommCall("allreduce", emb_params * BYTES_PER_ELEMENT[precision], "embedding", "step", 1,
                             *group_topology(self.platform, L, "embedding"))
                self._emb[key] = self.P.time_comm(c)[0]
        return self._emb[key]

    def _p2p_time(self, nbytes: int, tp: int, pp: int, dp: int) -> float:
        key = (nbytes, tp, pp, dp)
        if key not in self._p2p:
            if pp == 1:
                self._p2p[key] = 0.0
            else:
                L = Layout(num_gpus=tp * pp * dp, tp=tp, pp=pp, dp=dp)
                self._p2p[key] = self.P.time_comm(CommCall("p2p", nbytes, "pp", "fwd", 1,
                                                           *group_topology(self.platform, L, "pp")))[0]
        return self._p2p[key]

    # ---- evaluation ---------------------------------------------------------------------------
    def evaluate(self, rows: np.ndarray, structs: Sequence[_Structure], seq_len: int, precision: str,
                 capacity_gib: float, options: ComposeOptions | None = None) -> dict[str, np.ndarray]:
        """Columns for every row of `rows` (num_gpus, tp, pp, dp, mb, m, struct, rc, sp, zero)."""
        opts = options or self.P.options
        n = len(rows)
        out = {k: np.full(n, np.nan) for k in ("step_time_s", "pipeline_s", "peak_bytes", "mem_weights",
                                                "mem_grads", "mem_optimizer", "mem_activations", "mem_buffers",
                                                "mem_framework", *(f"{c}_s" for c in CATEGORIES))}
        out["peak_stage"] = np.zeros(n, int)
        out["critical_stage"] = np.zeros(n, int)
        if n == 0:
            return out
        tp_a, pp_a, dp_a, mb_a, m_a, st_a, rc_a, sp_a, z_a = (rows[:, i] for i in range(1, 10))
        kkeys = {(int(a), int(b), int(c), int(d)) for a, b, c, d in zip(tp_a, mb_a, sp_a, rc_a)}
        self.prepare(kkeys, seq_len, precision)
        # per-row building blocks
        kid = {k: i for i, k in enumerate(sorted(kkeys))}
        klist = sorted(kkeys)
        kidx = np.fromiter((kid[(int(a), int(b), int(c), int(d))] for a, b, c, d in zip(tp_a, mb_a, sp_a, rc_a)),
                           int, n)
        parts = [self._parts[(k, seq_len, precision)] for k in klist]

        def kvec(get) -> np.ndarray:
            return np.array([get(p) for p in parts], float)[kidx]
        layer = {f: kvec(lambda p, f=f: p.layer[f]) for f in _PART_FIELDS}
        first = {f: kvec(lambda p, f=f: p.first[f]) for f in _PART_FIELDS}
        last = {f: kvec(lambda p, f=f: p.last[f]) for f in _PART_FIELDS}
        act_layer = kvec(lambda p: p.act_layer)
        act_full = kvec(lambda p: p.act_full)
        act_first = kvec(lambda p: p.act_first)
        act_last = kvec(lambda p: p.act_last)
        act_last_tr = kvec(lambda p: p.act_last_transient)
        p2p_bytes = kvec(lambda p: p.p2p_bytes).astype(np.int64)
        u, inv = _unique_rows(np.column_stack([p2p_bytes, tp_a, pp_a, dp_a]))
        p2p_t = np.array([self._p2p_time(int(b), int(t), int(p), int(d)) for b, t, p, d in u])[inv]
        u, inv = _unique_rows(np.column_stack([tp_a, pp_a, dp_a]))
        emb_t = np.array([self._emb_sync(int(t), int(p), int(d), precision) for t, p, d in u])[inv]
        # class work (optimizer, dp traffic) for every (row, chunk class)
        class_keys: set[tuple] = set()
        struct_classes = []
        for s in structs:
            nch = s.pp * s.vpp
            cls = sorted({(s.counts[i], int(i == 0), int(i == nch - 1)) for i in range(nch)})
            struct_classes.append(cls)
        uniq_rows = _unique_rows(np.column_stack([tp_a, pp_a, dp_a, z_a, st_a]))[0]
        for tp, pp, dp, z, st in uniq_rows:
            for (cn, cf, cl) in struct_classes[st]:
                class_keys.add((int(tp), int(pp), int(dp), int(z), cn, cf, cl))
        self._prepare_classes(class_keys, seq_len, precision)
        e = BYTES_PER_ELEMENT[precision]
        g_full = mem.resolved(self.mopt, precision)[0]
        usable = capacity_gib * mem.GIB * (1.0 - self.mopt.allocator_reserve)
        framework = self.mopt.framework_gib * mem.GIB
        bpp = {}
        for z in range(4):
            for dp in np.unique(dp_a):
                bpp[(z, int(dp))] = mem.bytes_per_param(precision, z, int(dp), self.mopt)

        for st_id in np.unique(st_a):
            S = structs[st_id]
            idx = np.nonzero(st_a == st_id)[0]
            pp, vpp = S.pp, S.vpp
            nch = pp * vpp
            cn = np.array(S.counts, float)
            cf = np.zeros(nch)
            cf[0] = 1
            cl = np.zeros(nch)
            cl[-1] = 1
            cstage = np.arange(nch) % pp
            cp2p = np.zeros(nch)
            if pp > 1:
                cp2p = (np.arange(nch) != 0).astype(float) + (np.arange(nch) != nch - 1).astype(float)
            classes = struct_classes[st_id]
            cls_of = np.array([classes.index((S.counts[i], int(i == 0), int(i == nch - 1))) for i in range(nch)])
            # per (row, class) work
            sub = rows[idx]
            combo, inv = _unique_rows(sub[:, [1, 3, 9]])  # tp, dp, zero
            cw = np.zeros((len(combo), len(classes), 7))
            cparams = np.zeros((len(combo), len(classes)))
            for ci, (tp, dp, z) in enumerate(combo):
                for j, (n_l, f, l_) in enumerate(classes):
                    cw[ci, j] = self._class[((int(tp), pp, int(dp), int(z), n_l, f, l_), seq_len, precision)]
                    cparams[ci, j] = mem.chunk_params(self.model, int(tp), pp, n_l, bool(f), bool(l_), seq_len)
            W = cw[inv][:, cls_of, :]          # [rows, chunks, 7]
            CP = cparams[inv][:, cls_of]       # [rows, chunks]
            r = lambda d, f: d[f][idx][:, None]  # noqa: E731
            fc = cn * r(layer, "fc") + cf * r(first, "fc") + cl * r(last, "fc")
            bc = cn * r(layer, "bc") + cf * r(first, "bc") + cl * r(last, "bc")
            rcp = cn * r(layer, "rc") + cf * r(first, "rc") + cl * r(last, "rc")
            ft = cn * r(layer, "ft") + cf * r(first, "ft") + cl * r(last, "ft")
            bt = cn * r(layer, "bt") + cf * r(first, "bt") + cl * r(last, "bt")
            ppc = cp2p * p2p_t[idx][:, None]
            zf_tot, zf_unit, zb_tot, zb_unit = W[..., 3], W[..., 4], W[..., 5], W[..., 6]
            fdp = np.where(zf_tot > 0, np.maximum(zf_unit, zf_tot - fc), 0.0)
            bdp = np.where(zb_tot > 0, np.maximum(zb_unit, zb_tot - bc), 0.0)
            host = self.P.host if opts.host_overhead else None
            if host is not None:  # as Predictor._add_host: blend the host time of each chunk's layers
                bpasses = np.array([host.passes("bwd", RC[int(v)]) for v in rc_a[idx]])[:, None]
                fh = host.extra_s(fc + ft, cn[None, :], "fwd", "none")
                bh = host.extra_for_passes_s(bc + bt, cn[None, :], bpasses)
            else:
                fh = bh = np.zeros_like(fc)
            f_tot = fc + ft + ppc + fdp + fh
            b_tot = bc + bt + ppc + bdp + bh
            # to stages
            onehot = (cstage[:, None] == np.arange(pp)[None, :]).astype(float)  # [chunks, pp]
            F = f_tot @ onehot
            B = b_tot @ onehot
            T = F + B
            m = m_a[idx].astype(float)
            tmax = T.max(axis=1)
            if pp == 1:
                pipe = m * T[:, 0]
            elif S.schedule == "gpipe":
                pipe = (m - 1) * F.max(axis=1) + F.sum(axis=1) + (m - 1) * B.max(axis=1) + B.sum(axis=1)
            elif S.schedule == "interleaved":
                pipe = m * tmax + (T.sum(axis=1) - tmax) / vpp
            else:
                pipe = (m - 1) * tmax + T.sum(axis=1)
            Bcum = np.cumsum(B, axis=1) - B
            finish = pipe[:, None] - Bcum / vpp
            dp_s = W[..., 1] @ onehot
            gather_s = W[..., 2] @ onehot
            opt_s = W[..., 0] @ onehot
            emb_s = ((cf + cl) > 0).astype(float) @ onehot * emb_t[idx][:, None]
            last_bwd = (bc - rcp) @ onehot
            if opts.overlap_grad_reduce:
                dp_exp = np.where(dp_s > 0, np.maximum(dp_s / max(1, opts.grad_buckets), dp_s - last_bwd), dp_s)
            else:
                dp_exp = dp_s
            g_exp = 0.0 * gather_s if opts.overlap_param_gather else gather_s
            part_dp = dp_exp + g_exp + emb_s
            ends = finish + part_dp + opt_s
            step = np.maximum(pipe, ends.max(axis=1))
            # breakdown along the critical path, as compose does it
            crit = T.argmax(axis=1)
            rr = np.arange(len(idx))
            cat = {
                "compute": m * ((fc + bc) @ onehot)[rr, crit],
                "host_overhead": m * ((fh + bh) @ onehot)[rr, crit],
                "tp_comm": m * ((ft + bt) @ onehot)[rr, crit],
                "pp_comm": m * ((2 * ppc) @ onehot)[rr, crit],
                "dp_comm": m * ((fdp + bdp) @ onehot)[rr, crit],
            }
            cat["bubble"] = np.maximum(0.0, pipe - m * T[rr, crit])
            cat["optimizer"] = np.zeros(len(idx))
            extra = step - pipe
            ct = ends.argmax(axis=1)
            pd_ = part_dp[rr, ct]
            po = opt_s[rr, ct]
            tot = pd_ + po
            share_dp = np.where(tot > 0, pd_ / np.where(tot > 0, tot, 1.0), 0.0)
            share_opt = np.where(tot > 0, po / np.where(tot > 0, tot, 1.0), 0.0)
            pos = extra > 0
            cat["dp_comm"] = cat["dp_comm"] + np.where(pos, extra * share_dp, 0.0)
            cat["optimizer"] = cat["optimizer"] + np.where(pos, extra * share_opt, 0.0)
            cat["bubble"] = cat["bubble"] + step - sum(cat.values())
            out["step_time_s"][idx] = step
            out["pipeline_s"][idx] = pipe
            out["critical_stage"][idx] = crit
            for k, v in cat.items():
                out[f"{k}_s"][idx] = v
            # ---- memory per stage
            zr = sub[:, 9]
            dpr = sub[:, 3]
            tp_r = sub[:, 1]
            w = np.array([bpp[(int(z), int(d))] for z, d in combo[:, [2, 1]]])[inv]  # [rows, 3]
            params_s = CP @ onehot                                            # [rows, pp]
            stage_layers = cn @ onehot                                        # [pp]
            n_per_stage = np.bincount(cstage, minlength=pp).astype(float)
            mean_layers = stage_layers / n_per_stage
            srange = np.arange(pp)[None, :]
            mm = m[:, None]
            if pp == 1:
                k_in = np.ones((len(idx), 1))
            elif S.schedule == "interleaved":
                k_in = np.minimum(2 * (pp - srange - 1) + (vpp - 1) * pp + 1, mm * vpp)
            elif S.schedule == "gpipe":
                k_in = np.broadcast_to(mm, (len(idx), pp)).astype(float)
            else:
                k_in = np.minimum(pp - srange, mm)
            acts = k_in * mean_layers[None, :] * act_layer[idx][:, None]
            k_first = k_in[:, 0] if vpp == 1 else np.ceil(k_in[:, 0] / vpp)
            acts[:, 0] += k_first * act_first[idx]
            acts[:, -1] += act_last[idx]
            buffers = np.zeros_like(acts)
            buffers[:, -1] += act_last_tr[idx]
            rc_full = (sub[:, 7] == RC.index("full")).astype(float)[:, None]
            buffers += rc_full * np.maximum(0.0, act_full[idx] - act_layer[idx])[:, None]
            # largest ZeRO unit per stage: a layer, or the edge parameters held by an edge chunk
            ut, tinv = np.unique(tp_r, return_inverse=True)
            tinv = tinv.reshape(-1)
            lp = np.array([mem.layer_params_per_gpu(self.model, int(t)) for t in ut], float)[tinv]
            edge_first = np.array([mem.chunk_params(self.model, int(t), pp, 0, True, nch == 1, seq_len)
                                   for t in ut], float)[tinv]
            edge_last = np.array([mem.chunk_params(self.model, int(t), pp, 0, nch == 1, True, seq_len)
                                  for t in ut], float)[tinv]
            unit = np.repeat(lp[:, None], pp, axis=1)
            unit[:, 0] = np.maximum(unit[:, 0], edge_first)
            unit[:, -1] = np.maximum(unit[:, -1], edge_last)
            zsharded = ((zr >= 2) & (dpr > 1)).astype(float)[:, None]
            z3 = ((zr == 3) & (dpr > 1)).astype(float)[:, None]
            buffers += zsharded * unit * g_full + z3 * self.mopt.zero3_live_units * unit * e
            weights = params_s * w[:, 0:1]
            grads = params_s * w[:, 1:2]
            optim = params_s * w[:, 2:3]
            total = weights + grads + optim + acts + buffers + framework
            ps = total.argmax(axis=1)
            out["peak_bytes"][idx] = total[rr, ps]
            out["peak_stage"][idx] = ps
            out["mem_weights"][idx] = weights[rr, ps]
            out["mem_grads"][idx] = grads[rr, ps]
            out["mem_optimizer"][idx] = optim[rr, ps]
            out["mem_activations"][idx] = acts[rr, ps]
            out["mem_buffers"][idx] = buffers[rr, ps]
            out["mem_framework"][idx] = framework
        out["fits"] = out["peak_bytes"] <= usable
        out["usable_bytes"] = np.full(n, usable)
        return out


def _unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(a, axis=0, return_inverse=True) for small non-negative integer rows, without the
    slow structured sort: rows are packed into one int64 key (falls back when they do not fit)."""
    a = np.asarray(a, dtype=np.int64)
    if a.size == 0:
        return a.reshape(0, a.shape[1] if a.ndim == 2 else 0), np.zeros(0, int)
    hi = a.max(axis=0) + 1
    if a.min() < 0 or float(np.prod(hi.astype(float))) >= 2 ** 62:
        u, inv = np.unique(a, axis=0, return_inverse=True)
        return u, inv.reshape(-1)
    key = np.zeros(len(a), np.int64)
    for j in range(a.shape[1]):
        key = key * hi[j] + a[:, j]
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    return a[first], inv.reshape(-1)


_EVALUATORS: dict[tuple, FastEvaluator] = {}


def _evaluator(model: ModelSpec, P: Predictor, mopt: mem.MemoryOptions) -> FastEvaluator:
    """One evaluator (and its caches) per model, predictor and memory options."""
    key = (model, id(P), mopt)
    ev = _EVALUATORS.get(key)
    if ev is None or ev.P is not P:
        if len(_EVALUATORS) > 16:
            _EVALUATORS.clear()
        ev = _EVALUATORS[key] = FastEvaluator(model, P, mopt)
    return ev


def prime_comm_cache(P: Predictor, calls: Iterable[CommCall]) -> None:
    """Fill `P`'s collective-time cache for all `calls` with one vectorised call per collective
    (the same values `Predictor.time_comm` would compute one by one)."""
    todo: dict[str, set] = {}
    for c in calls:
        if c.ranks <= 1 or c.message_bytes <= 0:
            continue
        key = (c.collective, c.message_bytes, c.nodes, c.gpus_per_node)
        if key not in P._comm_cache:
            todo.setdefault(c.collective, set()).add(key)
    calibrated = P.network.intra.source != "link spec" or P.network.inter.source != "link spec"
    label = "analytical" + (" (calibrated)" if calibrated else "")
    for coll, keys in todo.items():
        keys = sorted(keys)
        S = np.array([k[1] for k in keys], float)
        N = np.array([k[2] for k in keys])
        G = np.array([k[3] for k in keys])
        t = np.asarray(analytic_time_s(P.network, coll, S, N, G), float)
        prov = [label] * len(keys)
        cb = P.coll_bank
        if cb is not None and cb.has_collective(coll):
            # regressors keep the store's convention: all-gather message = per-rank input (as time_comm)
            Sr = np.maximum(1, (S // (N * G))) if coll == "allgather" else S
            cov = np.asarray(cb.covers_collective(coll, Sr, N, G), bool)
            if cov.any():
                tb = np.asarray(cb.predict_collective(coll, Sr[cov], N[cov], G[cov], P.platform), float)
                t = t.copy()
                t[cov] = tb
                for i in np.nonzero(cov)[0]:
                    prov[i] = "measured"
        for k, v, pv in zip(keys, t, prov):
            P._comm_cache[k] = (float(v), pv)


# ------------------------------------------------------------------------------ the search
def _parse_gpus(num_gpus: int | Sequence[int] | range) -> list[int]:
    if isinstance(num_gpus, (int, np.integer)):
        return [int(num_gpus)]
    return sorted({int(x) for x in num_gpus})


def search(model: ModelSpec, platform: str | Platform | Predictor, num_gpus: int | Sequence[int],
           global_batch: int, seq_len: int, *, top_k: int = 10, objective: str = "time",
           space: SearchSpace = SearchSpace(), memory_options: mem.MemoryOptions = mem.MemoryOptions(),
           tokens_to_train: float | None = None, price_per_gpu_hour: float | None = None,
           refine: bool = True, models_dir: str | None = None) -> SearchReport:
    """Rank every layout of `model` on `num_gpus` GPUs (an int or several) of `platform` that fits in memory.

    objective: time (step time), tokens (tokens/s), mfu, cost (GPU-hours per token, times the price).
    refine: re-predict the top `top_k` with `Predictor.predict` (exact breakdown, provenance, error band).
    top_k <= 0 returns every feasible layout in `table` and no `top` list beyond the first 10."""
    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise InfeasibleConfig("objective", f"unknown objective '{objective}'.", f"use one of {', '.join(OBJECTIVES)}.")
    model.validate()
    for name, v in (("global_batch", global_batch), ("seq_len", seq_len)):
        if not isinstance(v, (int, np.integer)) or v <= 0:
            raise InfeasibleConfig(name, f"must be a positive integer, got {v!r}.")
    if isinstance(platform, Predictor):
        P = platform
    elif isinstance(platform, Platform):
        P = Predictor(platform, models_dir)
    else:
        P = get_predictor(platform, models_dir)
    gpus = _parse_gpus(num_gpus)
    if not gpus or min(gpus) <= 0:
        raise InfeasibleConfig("num_gpus", f"must be positive, got {num_gpus!r}.")
    precision = space.precision
    timings: dict[str, float] = {}
    rows, excl = [], []
    structs: list[_Structure] = []
    for N in gpus:
        r, s, e = enumerate_layouts(model, P.platform, N, global_batch, seq_len, space)
        # re-map structure ids into one list
        remap = []
        for st in s:
            if st in structs:
                remap.append(structs.index(st))
            else:
                remap.append(len(structs))
                structs.append(st)
        rows += [(*x[:6], remap[x[6]], *x[7:]) for x in r]
        excl += [{**d, "option": (f"num_gpus={N}, " if len(gpus) > 1 else "") + d["option"],
                  "values": {**d.get("values", {}), **({"num_gpus": N} if len(gpus) > 1 else {})}} for d in e]
    timings["enumerate"] = time.perf_counter() - t0
    arr = np.array(rows, dtype=np.int64).reshape(-1, 10)
    ev = _evaluator(model, P, memory_options)
    t1 = time.perf_counter()
    cols = ev.evaluate(arr, structs, seq_len, precision, P.platform.device.hbm_gib)
    timings["evaluate"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    table = _table(model, P, arr, structs, cols, global_batch, seq_len, precision, tokens_to_train,
                   price_per_gpu_hour, objective)
    timings["table"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    top = _top_results(model, P, table, top_k, objective, refine, memory_options, tokens_to_train, price_per_gpu_hour)
    timings["refine"] = time.perf_counter() - t3
    return SearchReport(model=model, platform_id=P.platform.platform_id, objective=objective, table=table,
                        top=top, exclusions=excl, elapsed_s=time.perf_counter() - t0, timings_s=timings)


def _table(model, P, arr, structs, cols, global_batch, seq_len, precision, tokens_to_train, price, objective):
    n = len(arr)
    sid = arr[:, 6]
    s_vpp = np.array([s.vpp for s in structs] or [1], dtype=np.int64)
    s_sched = np.array([s.schedule for s in structs] or [""], dtype=object)
    s_split = np.array([",".join(map(str, s.stage_layers)) if s.stage_layers else "" for s in structs] or [""],
                       dtype=object)
    df = pd.DataFrame({
        "num_gpus": arr[:, 0], "tp": arr[:, 1], "pp": arr[:, 2], "dp": arr[:, 3], "micro_batch": arr[:, 4],
        "num_micro_batches": arr[:, 5], "vpp": s_vpp[sid], "schedule": pd.Series(s_sched[sid], dtype=object),
        "stage_layers": pd.Series(s_split[sid], dtype=object),
        "recompute": pd.Series(np.array(RC, dtype=object)[arr[:, 7]], dtype=object),
        "sequence_parallel": arr[:, 8].astype(bool), "zero_stage": arr[:, 9],
    })
    df["global_batch"] = global_batch
    df["seq_len"] = seq_len
    df["precision"] = pd.Series(np.full(n, precision, dtype=object), dtype=object)
    step = cols["step_time_s"]
    tokens = float(global_batch) * seq_len
    flops = model_flops_per_step(model, Layout(num_gpus=1, global_batch=global_batch, seq_len=seq_len))
    peak = P.platform.device.peak_flops(precision)
    with np.errstate(divide="ignore", invalid="ignore"):
        df["step_time_s"] = step
        df["tokens_per_s"] = tokens / step
        df["tflops_per_gpu"] = flops / step / df["num_gpus"].to_numpy() / 1e12
        df["mfu"] = df["tflops_per_gpu"] * 1e12 / peak
        df["gpu_hours_per_mtok"] = step * df["num_gpus"].to_numpy() / 3600.0 / tokens * 1e6
    for c in CATEGORIES:
        v = cols[f"{c}_s"]
        df[f"{c}_s"] = np.where(np.abs(v) < 1e-12 * np.nan_to_num(step, nan=1.0), 0.0, v)  # closure rounding
    df["peak_mem_gib"] = cols["peak_bytes"] / mem.GIB
    df["mem_stage"] = cols["peak_stage"]
    for k in ("weights", "grads", "optimizer", "activations", "buffers"):
        df[f"mem_{k}_gib"] = cols[f"mem_{k}"] / mem.GIB
    df["fits"] = cols["fits"].astype(bool)
    if tokens_to_train:
        te = training_estimate(step, df["num_gpus"].to_numpy(), tokens, tokens_to_train, price)
        df["steps"] = te.steps
        df["days"] = te.days
        df["gpu_hours"] = te.gpu_hours
        if price is not None:
            df["cost"] = te.cost
    elif price is not None:
        df["cost_per_mtok"] = df["gpu_hours_per_mtok"] * price
    usable = cols["usable_bytes"][0] if n else 0.0
    parts = np.stack([cols["mem_weights"], cols["mem_grads"], cols["mem_optimizer"], cols["mem_activations"],
                      cols["mem_buffers"], cols["mem_framework"]], axis=1) if n else np.zeros((0, 6))
    names = np.array(["weights", "gradients", "optimizer", "activations", "buffers", "framework"])
    dom = names[parts.argmax(axis=1)] if n else np.array([], dtype=str)
    reason = np.full(n, "", dtype=object)
    kind = np.full(n, "", dtype=object)
    fits = cols["fits"].astype(bool)
    order3 = np.argsort(-parts, axis=1)[:, :3]
    gib = parts / mem.GIB
    peak_gib = cols["peak_bytes"] / mem.GIB
    u_txt = f"{usable / mem.GIB:.1f}"
    stage = cols["peak_stage"]
    for i in np.nonzero(~fits)[0]:
        a, b, c = order3[i]
        reason[i] = (f"out of memory: stage {stage[i]} needs {peak_gib[i]:.1f} GiB > {u_txt} GiB usable "
                     f"({names[a]} {gib[i, a]:.1f}, {names[b]} {gib[i, b]:.1f}, {names[c]} {gib[i, c]:.1f} GiB)")
        kind[i] = "out of memory, mostly " + dom[i]
    df["reason"] = pd.Series(reason, dtype=object)
    df["reject_kind"] = pd.Series(kind, dtype=object)
    key, asc = OBJECTIVES[objective]
    vals = df[key].to_numpy()
    order = np.lexsort(((vals if asc else -vals), ~df["fits"].to_numpy()))
    df = df.iloc[order].reset_index(drop=True)
    df.insert(0, "rank", np.where(df["fits"], np.cumsum(df["fits"].to_numpy()), 0))
    return df


def layout_of(row: pd.Series | dict) -> Layout:
    """The Layout of one table row."""
    sl = row["stage_layers"]
    return Layout(num_gpus=int(row["num_gpus"]), tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]),
                  micro_batch=int(row["micro_batch"]), global_batch=int(row["global_batch"]),
                  seq_len=int(row["seq_len"]), vpp=int(row["vpp"]), schedule=str(row["schedule"]),
                  recompute=str(row["recompute"]), sequence_parallel=bool(row["sequence_parallel"]),
                  zero_stage=int(row["zero_stage"]), precision=str(row["precision"]),
                  stage_layers=tuple(int(x) for x in sl.split(",")) if sl else None)


def _top_results(model, P, table, top_k, objective, refine, mopt, tokens_to_train, price) -> list[SearchResult]:
    feas = table[table["fits"]]
    k = top_k if top_k > 0 else 10
    # refine a few more than asked, so that small fast/exact differences cannot drop a better layout
    cand = feas.head(k)
    res = []
    for i, row in cand.iterrows():
        L = layout_of(row)
        pred = P.predict(model, L, timeline=False) if refine else None
        step = pred.step_time_s if pred else float(row["step_time_s"])
        bd = dict(pred.breakdown_s) if pred else {c: float(row[f"{c}_s"]) for c in CATEGORIES}
        flops = model_flops_per_step(model, L)
        tfl = flops / step / L.num_gpus / 1e12
        te = training_estimate(step, L.num_gpus, L.tokens_per_step, tokens_to_train, price)
        r = SearchResult(rank=0, layout=L, step_time_s=step, tokens_per_s=L.tokens_per_step / step,
                         tflops_per_gpu=tfl, mfu=tfl * 1e12 / P.platform.device.peak_flops(L.precision),
                         breakdown_s={k_: float(v) for k_, v in bd.items()},
                         memory=mem.estimate_memory(model, L, P.platform, mopt), training=te.scalar(),
                         prediction=pred, fast_step_time_s=float(row["step_time_s"]), table_index=int(i))
        res.append(r)
    key, asc = OBJECTIVES[objective]
    getter = {"step_time_s": lambda r: r.step_time_s, "tokens_per_s": lambda r: -r.tokens_per_s,
              "mfu": lambda r: -r.mfu, "gpu_hours_per_mtok": lambda r: r.step_time_s * r.layout.num_gpus
              / r.layout.tokens_per_step}[key]
    res.sort(key=getter)
    res = res[:k]
    for j, r in enumerate(res, 1):
        r.rank = j
    return res

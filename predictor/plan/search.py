"""Configuration search: every layout of a model on a cluster, the ones that do not fit dropped
(with the reason kept), the rest ranked by step time, tokens/s, MFU or cost.

    from predictor.plan.search import search
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
SHARD_GRAD_OP, 3 = FULL_SHARD; see decompose.step_work).

Speed and agreement: candidates are evaluated by the one step-time engine (`predictor.step.engine`) as
arrays, the same code that `Predictor.predict` runs for one layout, so a layout's step time, breakdown
and memory in the search table equal its prediction (tests/test_search.py checks it on random layouts).
The expected-error band is computed for the best `band_rows` feasible layouts (and every `top` result).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from predictor.hardware.platforms import Platform
from predictor.model.bounds import check_bound
from predictor.model.errors import InfeasibleConfig
from predictor.model.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, get_framework
from predictor.model.specs import (
    CP_COMMS,
    DEFAULT_RECOMPUTE_MODULES,
    FLASH_IMPLS,
    MOE_DISPATCHERS,
    RECOMPUTES,
    SCHEDULES,
    Layout,
    ModelSpec,
    check_cuda_graphs,
    check_moe_dispatcher,
    cuda_graphs_mask,
    cuda_graphs_value,
    grad_comm_bytes,
    grad_reduce_in_fp32_of,
    overlap_p2p_field,
    pp_overlap_default,
    recomputed_modules,
)
from predictor.model.stages import V_SCHEDULES, ZB_SCHEDULES, interleaved_split, split_layers
from predictor.plan.costing import TrainingEstimate, training_estimate
from predictor.plan.predict import Predictor, StepPrediction, get_predictor, model_flops_per_step
from predictor.step import memory as mem
from predictor.step.compose import CATEGORIES
from predictor.step.decompose import cp_a2a_ranks
from predictor.step.engine import COLUMNS, RECOMPUTE, Structure, _unique_rows, layout_of_row  # noqa: F401  (_unique_rows re-exported)
from predictor.step.fp8 import mfu_peak_precision

OBJECTIVES = {"time": ("step_time_s", True), "tokens": ("tokens_per_s", False), "mfu": ("mfu", False),
              "cost": ("gpu_hours_per_mtok", True)}
RC = RECOMPUTES
SCHED = SCHEDULES


@dataclass(frozen=True)
class SearchSpace:
    """What to enumerate; None = everything valid."""
    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    # context-parallel degrees; None = every power of two (1, 2, 4, ...) that divides the GPUs left by tp,
    # divides seq_len with seq_len / cp a multiple of 2*cp (Megatron's causal load balancing), on GPUs with
    # flash attention
    cp: tuple[int, ...] | None = None
    # expert-parallel degrees (MoE models; dense models always 1); None = every divisor of num_experts that divides
    # the tp * cp * dp ranks of a stage (Megatron-Core's MoE parallel folding)
    ep: tuple[int, ...] | None = None
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
    framework: str = DEFAULT_FRAMEWORK        # predictor.model.frameworks: its ZeRO stages and overlap defaults
    overlap_grad_reduce: bool | None = None   # None: the framework's default
    overlap_param_gather: bool | None = None
    overlap_tp_comm: bool = False             # Transformer Engine's TP overlap on every layout with tp > 1 and SP
    # the pipeline's point-to-point overlap (Layout.overlap_p2p_comm) on the interleaved layouts where it runs
    # (Megatron-Core, pp > 1); None: the framework's default (on for Megatron-Core's interleaved schedule)
    overlap_p2p_comm: bool | None = None
    grad_reduce_in_fp32: bool | None = None   # Layout.grad_reduce_in_fp32 on every layout (None: the precision's)
    fp8_param_gather: bool = False            # FP8 primary weights on every layout (precision fp8 only)
    # leave out of the ranking the layouts that fit only if the caching allocator fragments less than it typically
    # does (memory_tight); they stay in the table, unranked, with the reason
    leave_out_tight: bool = False
    # --- all-to-all context parallelism and activation offloading (off by default: the p2p ring, no offload) ---
    # context-parallel communication kinds tried where cp > 1 (Layout.cp_comm; a kind a layout cannot run, e.g.
    # a2a with heads per rank not divisible by cp, is skipped for it)
    cp_comm: tuple[str, ...] = ("p2p",)
    # offloaded layers per stage tried (Layout.offload_activations; only on layouts that allow it: pp = 1,
    # recompute none, fewer layers than the model has); a layout that fits only with offload shows it in its
    # offload_activations column
    offload_activations: tuple[int, ...] = (0,)
    # --- MoE: expert tensor parallelism and the dispatch / combine overlap ---
    # expert tensor-parallel degrees (MoE models); None = 1 and tp (whole experts, and Megatron-Core's default of
    # experts split like the attention), those that divide moe_ffn_hidden and, with ep, tp * cp * dp
    etp: tuple[int, ...] | None = None
    # the dispatch / combine overlap (Layout.moe_overlap) values to try; True only where it runs (ep > 1; pp = 1 or
    # interleaved; no full recomputation)
    moe_overlap: tuple[bool, ...] = (False,)
    # the MoE token dispatcher of every layout (Layout.moe_dispatcher): a fixed input, not enumerated (a run's
    # framework setting, not a layout choice); a dense model ignores it. allgather never runs with moe_overlap (those
    # layouts are skipped) nor with a capacity factor (refused, naming the field)
    moe_dispatcher: str = "alltoall"
    # CUDA graphs of every layout (Layout.cuda_graphs): a fixed input, not enumerated (a run's framework setting that
    # only removes host time, so a search would always pick the most captured); checked against the model once
    cuda_graphs: str = "none"
    # --- selective recomputation by module ---
    # the modules every selective layout recomputes (Layout.recompute_modules); None = Megatron-Core's default
    # ("core_attn",)
    recompute_modules: tuple[str, ...] | None = None


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
    exclusions: list[dict[str, Any]]    # options never enumerated, with the reason
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
    d = {k: getattr(L, k) for k in ("num_gpus", "tp", "pp", "cp", "ep", "dp", "micro_batch", "global_batch", "seq_len",
                                    "vpp",
                                    "schedule", "recompute", "sequence_parallel", "zero_stage", "precision",
                                    "framework", "overlap_grad_reduce", "overlap_param_gather", "overlap_tp_comm",
                                    "grad_reduce_in_fp32", "fp8_param_gather", "etp", "moe_overlap",
                                    "moe_dispatcher", "cuda_graphs")}
    d["recompute_modules"] = list(L.selective_modules) if L.recompute == "selective" else None
    d["stage_layers"] = list(L.stage_layers) if L.stage_layers else None
    d["num_micro_batches"] = L.num_micro_batches
    return d


def _divisors(n: int) -> list[int]:
    out: set[int] = set()
    for i in range(1, int(math.isqrt(n)) + 1):
        if n % i == 0:
            out.update((i, n // i))
    return sorted(out)


# ------------------------------------------------------------------------------ enumeration
def enumerate_layouts(model: ModelSpec, platform: Platform, num_gpus: int, global_batch: int, seq_len: int,
                      space: SearchSpace = SearchSpace()):
    """(rows, structures, exclusions): candidate rows as tuples
    in engine.COLUMNS order, the pipeline structures they use,
    and the options never enumerated with the reason."""
    L = model.num_layers
    gpn = platform.gpus_per_node
    excl: list[dict[str, Any]] = []
    structs: list[Structure] = []
    struct_ids: dict[Structure, int] = {}

    def sid(s: Structure) -> int:
        if s not in struct_ids:
            struct_ids[s] = len(structs)
            structs.append(s)
        return struct_ids[s]

    fw = get_framework(space.framework)
    fw_i = FRAMEWORKS.index(fw.name)
    ogr = int(fw.overlap_grad_reduce if space.overlap_grad_reduce is None else space.overlap_grad_reduce)
    opg = int(fw.overlap_param_gather if space.overlap_param_gather is None else space.overlap_param_gather)
    probe = Layout(num_gpus=1, precision=space.precision, grad_reduce_in_fp32=space.grad_reduce_in_fp32,
                   fp8_param_gather=space.fp8_param_gather)
    probe.validate()   # fp8_param_gather without fp8, grad_reduce_in_fp32 False with fp32: named, not searched
    check_moe_dispatcher(model if model.is_moe else None, space.moe_dispatcher)
    check_cuda_graphs(model, space.cuda_graphs, space.framework)
    for z in space.zero_stage:
        if z not in fw.zero_stages:
            excl.append({"option": f"zero_stage={z}", "values": {"zero_stage": z},
                         "reason": f"{fw.description} has no ZeRO stage {z}."})
    rcs = [r for r in space.recompute if r in RC]
    # selective recomputation's modules: checked once on a probe, the same mask on every selective row
    if space.recompute_modules is not None and "selective" in rcs:
        Layout(num_gpus=1, recompute="selective", recompute_modules=tuple(space.recompute_modules),
               framework=space.framework).validate(model)
    sel_mods = (Layout(num_gpus=1, recompute="selective", recompute_modules=space.recompute_modules)
                .selective_modules if space.recompute_modules is not None else DEFAULT_RECOMPUTE_MODULES)
    if (model.attention_impl in FLASH_IMPLS and "selective" in rcs and "none" in rcs
            and sel_mods == ("core_attn",)):
        rcs.remove("selective")
        sel_why = ("with flash attention, selective recomputation of core_attn (Megatron-Core's default) re-runs "
                   "the attention forward in the backward and frees only its fp32 logsumexp: slower than recompute "
                   "none at the same memory but that; predict it with --recompute selective, or search other "
                   "--recompute-modules." if fw.name == "megatron" else
                   f"with flash attention selective recomputation equals none under {fw.name} (the legacy "
                   "Megatron-LM attention checkpoints the core attention only without flash attention); ranked as "
                   "recompute=none.")
        excl.append({"option": "recompute=selective", "values": {"recompute": "selective"}, "reason": sel_why})
    # activation offloading: a device without a stated host link cannot time the copies (never a guessed speed)
    if any(n for n in space.offload_activations) and not getattr(platform.device, "host_link_gbps", 0.0):
        n_off = max(space.offload_activations)
        excl.append({"option": f"offload_activations={n_off}", "values": {"offload_activations": n_off},
                     "reason": f"{platform.device.name} has no stated host-link bandwidth (host_link_gbps), so "
                               "offloaded activations cannot be timed."})
        space = replace(space, offload_activations=(0,))
    rows: list[tuple] = []
    cps = _cp_choices(model, platform, num_gpus, seq_len, space, excl)
    if not model.is_moe and space.ep is not None and any(e != 1 for e in space.ep):
        excl.append({"option": "ep>1", "values": {"ep": max(space.ep)},
                     "reason": "expert parallelism needs a Mixture-of-Experts model (num_experts > 0)."})
    elif model.is_moe and space.ep is not None:
        for e in space.ep:
            if e < 1 or model.num_experts % e:
                excl.append({"option": f"ep={e}", "values": {"ep": e},
                             "reason": f"ep {e} does not divide num_experts {model.num_experts}."})
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
        for cp in cps:
            if (num_gpus // tp) % cp:
                continue
            _enumerate_tp_cp(model, num_gpus, global_batch, seq_len, space, tp, cp, L, excl, sid, fw, fw_i, ogr, opg,
                             rcs, rows, platform.gpus_per_node)
    return rows, structs, excl


def _cp_choices(model: ModelSpec, platform: Platform, num_gpus: int, seq_len: int, space: SearchSpace,
                excl: list[dict[str, Any]]) -> list[int]:
    """The context-parallel degrees to enumerate (see SearchSpace.cp), excluded ones with the reason."""
    if space.cp is not None:
        cand = list(space.cp)
    else:
        cand = [1]
        while cand[-1] * 2 <= num_gpus:
            cand.append(cand[-1] * 2)
    out = []
    for cp in cand:
        why = None
        if cp == 1:
            out.append(cp)
            continue
        if num_gpus % cp:
            why = f"does not divide {num_gpus} GPUs."
        elif seq_len % cp or (seq_len // cp) % (2 * cp):
            why = (f"seq_len {seq_len} / cp is not a multiple of 2*cp = {2 * cp} (Megatron's causal load "
                   f"balancing).")
        elif model.attention_impl not in FLASH_IMPLS:
            why = "context parallelism needs flash attention."
        elif model.sliding_window is not None:   # Layout.validate's refusal (docs/mla.md)
            why = "context parallelism with sliding-window attention is not modelled."
        elif platform.device.vendor == "cpu":
            why = "context parallelism needs GPU peer-to-peer collectives."
        if why:
            excl.append({"option": f"cp={cp}" if space.cp is not None else f"cp>={cp}", "values": {"cp": cp},
                         "reason": why})
            if space.cp is None:
                break   # every larger power of two fails the same rule
            continue
        out.append(cp)
    return out


def _enumerate_tp_cp(model, num_gpus, global_batch, seq_len, space, tp, cp, L, excl, sid, fw, fw_i, ogr, opg, rcs,
                     rows, gpus_per_node: int = 8) -> None:
    """The rows of one (tp, cp): every pp, micro-batch, pipeline structure, recompute, SP and ZeRO stage."""
    gbytes = grad_comm_bytes(space.precision, space.grad_reduce_in_fp32)
    f8p = int(space.fp8_param_gather)
    md = space.moe_dispatcher if model.is_moe else "alltoall"   # (a dense model has no dispatcher)
    md_i = MOE_DISPATCHERS.index(md)
    cg_i = cuda_graphs_mask(space.cuda_graphs)
    sel_mask = mem.modules_mask(recomputed_modules(model, fw.name, DEFAULT_RECOMPUTE_MODULES
                                                   if space.recompute_modules is None
                                                   else tuple(space.recompute_modules)))
    sps = [s for s in space.sequence_parallel if not s or (tp > 1 and (seq_len // cp) % tp == 0)]
    if model.is_moe and tp > 1:   # Megatron-Core runs MoE with tp > 1 only with sequence parallelism
        sps = [s for s in sps if s]
    rest = num_gpus // (tp * cp)
    pps = space.pp or tuple(_divisors(rest))
    for pp in pps:
        if rest % pp:
            continue
        if pp > L:
            if (space.pp is not None or pp <= 2 * L) and not any(e["option"] == f"pp={pp}" for e in excl):
                excl.append({"option": f"pp={pp}", "values": {"pp": pp},
                             "reason": f"pp={pp} exceeds the {L} layers (one layer per stage at least)."})
            continue
        dp = rest // pp
        if global_batch % dp:
            cps_ = f", cp={cp}" if cp > 1 else ""
            vals = {"tp": tp, "pp": pp, "dp": dp, **({"cp": cp} if cp > 1 else {})}
            excl.append({"option": f"tp={tp}, pp={pp}{cps_} (dp={dp})", "values": vals,
                         "reason": f"global batch {global_batch} is not a multiple of dp={dp}."})
            continue
        per_replica = global_batch // dp
        mbs = [b for b in (space.micro_batch or _divisors(per_replica))
               if per_replica % b == 0 and b <= (space.max_micro_batch if space.micro_batch is None else b)]
        zs = [z for z in space.zero_stage if (z == 0 or dp * cp > 1) and z in fw.zero_stages
              and not (z >= 2 and pp > 1 and fw.zero_needs_no_pp)]
        eps = _ep_choices(model, space, tp * cp * dp)
        cpcs = _cp_comm_choices(model, space, tp, cp, gpus_per_node)
        offs = [n for n in space.offload_activations if 0 <= n < L]
        structures_pp: list[tuple[int, int]] = []  # (struct id, vpp)
        if "1f1b" in space.schedules or pp == 1:
            even = Structure(pp, 1, "1f1b", tuple(split_layers(L, pp)), None)
            structures_pp.append((sid(even), 1))
            if space.uneven_splits and pp >= 3:
                c = split_layers(L + 2, pp)
                c[0] -= 1
                c[-1] -= 1
                if min(c) >= 1 and tuple(c) != even.counts:
                    structures_pp.append((sid(Structure(pp, 1, "1f1b", tuple(c), tuple(c))), 1))
        if "gpipe" in space.schedules and pp > 1:
            structures_pp.append((sid(Structure(pp, 1, "gpipe", tuple(split_layers(L, pp)), None)), 1))
        inter: list[int] = []
        if "interleaved" in space.schedules and pp >= 2:
            cand_v = space.vpp or tuple(range(2, space.max_vpp + 1))
            for v in cand_v:
                if v >= 2 and interleaved_split(L, pp * v) is not None:
                    inter.append(v)
        # --- zero-bubble and bidirectional schedules (only where asked: SearchSpace.schedules) ---
        zb_structs = [(s_, Structure(pp, 2 if s_ in V_SCHEDULES else 1, s_,
                                     tuple(split_layers(L, pp * (2 if s_ in V_SCHEDULES else 1))), None))
                      for s_ in ZB_SCHEDULES if s_ in space.schedules and pp >= 2
                      and not (s_ == "dualpipe" and pp % 2) and not (s_ in V_SCHEDULES and L % (2 * pp))]
        for s_, why in (("dualpipe", pp % 2 and f"DualPipe needs an even pp, got pp={pp}."),
                        *((v_, L % (2 * pp) and f"{v_} runs 2 chunks per GPU: {L} layers do not split into 2 x pp = "
                                                f"{2 * pp} chunks.") for v_ in V_SCHEDULES)):
            if s_ in space.schedules and pp >= 2 and why and not any(e["option"] == f"{s_} pp={pp}" for e in excl):
                excl.append({"option": f"{s_} pp={pp}", "values": {"schedule": s_, "pp": pp}, "reason": why})
        if "zb-h1" in space.schedules and space.uneven_splits and pp >= 3:   # 1f1b's edge-light split
            c = split_layers(L + 2, pp)
            c[0] -= 1
            c[-1] -= 1
            if min(c) >= 1 and tuple(c) != tuple(split_layers(L, pp)):
                zb_structs.append(("zb-h1", Structure(pp, 1, "zb-h1", tuple(c), tuple(c))))
        inter_ids: set[int] = set()
        for mb in mbs:
            m = per_replica // mb
            plist = list(structures_pp) if pp > 1 else [structures_pp[0]]
            for v in inter:
                if m % pp == 0:
                    st = Structure(pp, v, "interleaved", tuple(interleaved_split(L, pp * v) or ()), None)
                    plist.append((sid(st), v))
                    inter_ids.add(sid(st))
            for s_, st in zb_structs:
                if zb_micro_batches_ok(s_, pp, m):
                    plist.append((sid(st), st.vpp))
            for st_id, _v in plist:
                # the pipeline's point-to-point overlap where it runs (Layout.pp_comm_overlap's default), unless
                # the space turns it off
                opp = int(pp_overlap_default(fw.name, "interleaved" if st_id in inter_ids else "1f1b", pp)
                          and space.overlap_p2p_comm is not False)
                for rc in rcs:
                    rci = RC.index(rc)
                    rcm = sel_mask if rc == "selective" else 0
                    for sp in sps:
                        for z in zs:
                            for ep in eps:
                                if ep > 1 and z >= 2:   # MoE states shard with the distributed optimizer (ZeRO-1)
                                    continue
                                for cpc in cpcs:
                                    for off in offs:
                                        if off and (rc != "none" or pp > 1):
                                            continue
                                        for etp in _etp_choices(model, space, fw, tp, ep, tp * cp * dp):
                                            if model.is_moe and etp > 1 and z >= 2:
                                                continue
                                            for mo in space.moe_overlap:
                                                if mo and not (model.is_moe and ep > 1 and (pp == 1 or _v >= 2)
                                                               and rc != "full" and md != "allgather"):
                                                    continue
                                                rows.append((num_gpus, tp, pp, dp, mb, m, st_id, rci, int(sp), z,
                                                             fw_i, ogr, opg, cp, ep,
                                                             int(space.overlap_tp_comm and tp > 1 and bool(sp)),
                                                             gbytes, f8p, cpc, 0, off, etp, int(mo), rcm,
                                                             md_i, cg_i, opp))


def _cp_comm_choices(model: ModelSpec, space: SearchSpace, tp: int, cp: int, gpus_per_node: int) -> list[int]:
    """Indices into CP_COMMS of the context-parallel kinds tried for (tp, cp): p2p alone where cp = 1; else those of
    `space.cp_comm` whose all-to-all group (decompose.cp_a2a_ranks, a2a+p2p at its default size) divides the query
    and key/value heads of a tensor-parallel rank."""
    if cp == 1:
        return [0]
    out = []
    q_r, kv_r = model.num_heads // tp, max(model.kv_heads // tp, 1)
    for kind in space.cp_comm:
        if kind not in CP_COMMS:
            raise InfeasibleConfig("cp_comm", f"unknown context-parallel communication '{kind}'.",
                                   f"use one of {', '.join(CP_COMMS)}.")
        if kind == "a2a" and (q_r % cp or kv_r % cp):
            continue
        if kind == "a2a+p2p" and cp_a2a_ranks(model, tp, cp, kind, None, gpus_per_node) in (1, cp):
            continue
        out.append(CP_COMMS.index(kind))
    return out or [0]


def _etp_choices(model: ModelSpec, space: SearchSpace, fw: Any, tp: int, ep: int, ranks: int) -> list[int]:
    """Expert tensor-parallel degrees for a stage of `ranks` = tp * cp * dp GPUs with expert parallelism `ep`: the
    framework's default (tp for Megatron-Core, else 1) for a dense model, where it changes nothing; for a MoE model
    1 and tp (or `space.etp`), those dividing moe_ffn_hidden whose product with ep divides `ranks`."""
    default = tp if fw.expert_tp_follows_tp else 1
    if not model.is_moe:
        return [default]
    cand = space.etp or tuple(sorted({default, 1, tp}))
    if space.moe_dispatcher == "hybridep":   # experts whole with it (check_moe_dispatcher)
        cand = tuple(e for e in cand if e == 1)
    return [e for e in cand if e >= 1 and model.expert_ffn % e == 0 and ranks % (e * ep) == 0]


def zb_micro_batches_ok(schedule: str, pp: int, m: int) -> bool:
    """Layout.validate's micro-batch rules of the zero-bubble / DualPipe schedules (specs: _validate_zb_schedule)."""
    if schedule == "dualpipe":
        return m % 2 == 0 and m >= 2 * pp
    if schedule == "dualpipe-v":
        return m >= 2 * pp
    if schedule == "zb-v":
        return m >= 2 * pp - 1
    return True


def _ep_choices(model: ModelSpec, space: SearchSpace, ranks: int) -> list[int]:
    """Expert-parallel degrees for a stage of `ranks` = tp * cp * dp GPUs: 1 for a dense model; for a MoE model
    the divisors of num_experts that divide `ranks` (those of `space.ep` when given)."""
    if not model.is_moe:
        return [1]
    cand = space.ep or tuple(_divisors(model.num_experts))
    return [e for e in cand if e >= 1 and model.num_experts % e == 0 and ranks % e == 0]


# ------------------------------------------------------------------------------ the search
def _parse_gpus(num_gpus: int | Sequence[int] | range) -> list[int]:
    if isinstance(num_gpus, (int, np.integer)):
        return [int(num_gpus)]
    return sorted({int(x) for x in num_gpus})


_ENGINES: dict[tuple, Any] = {}


def engine_for(P: Predictor, memory_options: mem.MemoryOptions):
    """The predictor's engine, or one with other memory options (cached per predictor and options)."""
    if memory_options == P.engine.mopt:
        return P.engine
    from predictor.step.engine import Engine
    key = (id(P), memory_options)
    hit = _ENGINES.get(key)
    if hit is None or hit.P is not P:
        if len(_ENGINES) > 16:
            _ENGINES.clear()
        hit = _ENGINES[key] = Engine(P, memory_options)
    return hit


def search(model: ModelSpec, platform: str | Platform | Predictor, num_gpus: int | Sequence[int],
           global_batch: int, seq_len: int, *, top_k: int = 10, objective: str = "time",
           space: SearchSpace = SearchSpace(), memory_options: mem.MemoryOptions = mem.MemoryOptions(),
           tokens_to_train: float | None = None, price_per_gpu_hour: float | None = None,
           refine: bool = True, models_dir: str | None = None, band_rows: int = 100) -> SearchReport:
    """Rank every layout of `model` on `num_gpus` GPUs (an int or several) of `platform` that fits in memory.

    objective: time (step time), tokens (tokens/s), mfu, cost (GPU-hours per token, times the price).
    refine: attach the full prediction (operator table, memory report, provenance) to the top `top_k`.
    band_rows: the expected-error band is computed for this many of the best feasible layouts.
    top_k <= 0 returns every feasible layout in `table` and no `top` list beyond the first 10."""
    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise InfeasibleConfig("objective", f"unknown objective '{objective}'.", f"use one of {', '.join(OBJECTIVES)}.")
    model.validate()
    for name, v in (("global_batch", global_batch), ("seq_len", seq_len)):
        if not isinstance(v, (int, np.integer)) or v <= 0:
            raise InfeasibleConfig(name, f"must be a positive integer, got {v!r}.")
        check_bound(name, int(v))
    if isinstance(platform, Predictor):
        P = platform
    elif isinstance(platform, Platform):
        P = Predictor(platform, models_dir)
    else:
        P = get_predictor(platform, models_dir)
    gpus = _parse_gpus(num_gpus)
    if not gpus or min(gpus) <= 0:
        raise InfeasibleConfig("num_gpus", f"must be positive, got {num_gpus!r}.")
    for N in gpus:
        check_bound("num_gpus", N)
        P.check_ranks(N)
    precision = space.precision
    P.platform.device.check_precision(precision)
    timings: dict[str, float] = {}
    rows, excl = [], []
    structs: list[Structure] = []
    for N in gpus:
        r, s, e = enumerate_layouts(model, P.platform, N, global_batch, seq_len, space)
        remap = []  # structure ids into one list
        for st in s:
            if st in structs:
                remap.append(structs.index(st))
            else:
                remap.append(len(structs))
                structs.append(st)
        if remap == list(range(len(s))):   # the structures' ids unchanged (one GPU count: always)
            rows += r
        else:
            rows += [(*x[:6], remap[x[6]], *x[7:]) for x in r]
        excl += [{**d, "option": (f"num_gpus={N}, " if len(gpus) > 1 else "") + d["option"],
                  "values": {**d.get("values", {}), **({"num_gpus": N} if len(gpus) > 1 else {})}} for d in e]
    timings["enumerate"] = time.perf_counter() - t0
    arr = np.array(rows, dtype=np.int64).reshape(-1, len(COLUMNS))
    eng = engine_for(P, memory_options)
    t1 = time.perf_counter()
    ev = eng.evaluate(model, arr, structs, seq_len, precision, provenance=False)
    timings["evaluate"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    table = _table(model, P, arr, structs, ev, global_batch, seq_len, precision, tokens_to_train,
                   price_per_gpu_hour, objective, space.leave_out_tight)
    _add_error_band(table, model, P, eng, arr, structs, seq_len, precision, band_rows)
    timings["table"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    top = _top_results(model, P, table, top_k, objective, refine, memory_options, tokens_to_train, price_per_gpu_hour)
    timings["refine"] = time.perf_counter() - t3
    if not len(table) or not table["fits"].any():
        pass  # an empty ranking is a valid answer: the report's rejections say why
    return SearchReport(model=model, platform_id=P.platform.platform_id, objective=objective, table=table,
                        top=top, exclusions=excl, elapsed_s=time.perf_counter() - t0, timings_s=timings)


def _per_value(codes: np.ndarray, name_of: Callable[[int], str]) -> np.ndarray:
    """name_of(code) for every entry of an integer column, computed once per distinct code (a search table has tens
    of thousands of rows and a handful of codes)."""
    u, inv = np.unique(np.asarray(codes, dtype=np.int64), return_inverse=True)
    return np.array([name_of(int(v)) for v in u], dtype=object)[inv.reshape(-1)]


def _table(model, P, arr, structs, ev, global_batch, seq_len, precision, tokens_to_train, price, objective,
           leave_out_tight=False):
    n = len(arr)
    col = {name: arr[:, i] for i, name in enumerate(COLUMNS)}   # the engine's columns by name
    sid = col["structure"]
    s_vpp = np.array([s.vpp for s in structs] or [1], dtype=np.int64)
    s_sched = np.array([s.schedule for s in structs] or [""], dtype=object)
    s_split = np.array([",".join(map(str, s.stage_layers)) if s.stage_layers else "" for s in structs] or [""],
                       dtype=object)
    df = pd.DataFrame({
        "num_gpus": col["num_gpus"], "tp": col["tp"], "pp": col["pp"], "dp": col["dp"],
        "micro_batch": col["micro_batch"], "num_micro_batches": col["num_micro_batches"], "vpp": s_vpp[sid],
        "schedule": pd.Series(s_sched[sid], dtype=object),
        "stage_layers": pd.Series(s_split[sid], dtype=object),
        "recompute": pd.Series(np.array(RECOMPUTE, dtype=object)[col["recompute"]], dtype=object),
        "sequence_parallel": col["sequence_parallel"].astype(bool), "zero_stage": col["zero_stage"],
        "framework": pd.Series(np.array(FRAMEWORKS, dtype=object)[col["framework"]], dtype=object),
        "overlap_grad_reduce": col["overlap_grad_reduce"].astype(bool),
        "overlap_param_gather": col["overlap_param_gather"].astype(bool),
        "cp": col["cp"], "ep": col["ep"], "overlap_tp_comm": col["overlap_tp_comm"].astype(bool),
        "grad_bytes": col["grad_bytes"], "fp8_param_gather": col["fp8_param_gather"].astype(bool),
        # all-to-all context parallelism and activation offloading
        "cp_comm": pd.Series(np.array(CP_COMMS, dtype=object)[col["cp_comm"]], dtype=object),
        "offload_activations": col["offload_activations"],
        "etp": col["etp"], "moe_overlap": col["moe_overlap"].astype(bool),
        # selective recomputation's modules (empty unless recompute is selective)
        "recompute_modules": pd.Series(_per_value(col["recompute_modules"],
                                                  lambda v: ",".join(mem.modules_of_mask(v))), dtype=object),
        "moe_dispatcher": pd.Series(np.array(MOE_DISPATCHERS, dtype=object)[col["moe_dispatcher"]], dtype=object),
        "cuda_graphs": pd.Series(_per_value(col["cuda_graphs"], cuda_graphs_value), dtype=object),
        "overlap_p2p_comm": col["overlap_p2p_comm"].astype(bool),
        "_row": np.arange(n),
    })
    df["global_batch"] = global_batch
    df["seq_len"] = seq_len
    df["precision"] = pd.Series(np.full(n, precision, dtype=object), dtype=object)
    step = ev.step_time_s
    tokens = float(global_batch) * seq_len
    flops = model_flops_per_step(model, Layout(num_gpus=1, global_batch=global_batch, seq_len=seq_len))
    peak = P.platform.device.peak_flops(mfu_peak_precision(precision))  # fp8 runs: against the BF16 peak
    with np.errstate(divide="ignore", invalid="ignore"):
        df["step_time_s"] = step
        df["tokens_per_s"] = tokens / step
        df["tflops_per_gpu"] = flops / step / df["num_gpus"].to_numpy() / 1e12
        df["mfu"] = df["tflops_per_gpu"] * 1e12 / peak
        df["gpu_hours_per_mtok"] = step * df["num_gpus"].to_numpy() / 3600.0 / tokens * 1e6
    for c in CATEGORIES:
        df[f"{c}_s"] = ev.breakdown_s[c]
    df["peak_mem_gib"] = ev.peak_bytes / mem.GIB
    df["mem_allocated_gib"] = ev.peak_allocated_bytes / mem.GIB   # torch.cuda.max_memory_allocated
    df["mem_reserved_gib"] = ev.peak_reserved_bytes / mem.GIB     # torch.cuda.max_memory_reserved
    df["mem_stage"] = ev.peak_stage
    for k, name in (("weights", "weights"), ("grads", "grads"), ("optimizer", "optimizer"),
                    ("activations", "activations"), ("buffers", "buffers"), ("nccl", "nccl"),
                    ("allocator", "allocator")):
        df[f"mem_{name}_gib"] = ev.memory_parts[k] / mem.GIB
    fits = ev.fits
    df["fits"] = fits
    df["memory_tight"] = ev.tight
    df["needs_offload"] = _needs_offload(arr, fits)
    if tokens_to_train:
        te = training_estimate(step, df["num_gpus"].to_numpy(), tokens, tokens_to_train, price)
        df["steps"] = te.steps
        df["days"] = te.days
        df["gpu_hours"] = te.gpu_hours
        if price is not None:
            df["cost"] = te.cost
    elif price is not None:
        df["cost_per_mtok"] = df["gpu_hours_per_mtok"] * price
    parts = (np.stack([ev.memory_parts[k] for k in mem.MEMORY_PARTS], axis=1) if n
             else np.zeros((0, len(mem.MEMORY_PARTS))))
    names = np.array([mem.MEMORY_PART_LABELS[k] for k in mem.MEMORY_PARTS])
    dom = names[parts.argmax(axis=1)] if n else np.array([], dtype=str)
    reason = np.full(n, "", dtype=object)
    kind = np.full(n, "", dtype=object)
    order3 = np.argsort(-parts, axis=1)[:, :3]
    gib = parts / mem.GIB
    peak_gib = ev.peak_bytes / mem.GIB
    u_txt = f"{ev.usable_bytes / mem.GIB:.1f}"
    out_ = np.nonzero(~fits)[0]
    if len(out_):   # Python lists: element access on numpy arrays costs more than the formatting
        top3 = order3[out_]
        top_gib = np.take_along_axis(gib[out_], top3, axis=1).tolist()
        labels = names.tolist()
        reason[out_] = [f"out of memory: stage {st} needs {pk:.1f} GiB > {u_txt} GiB usable "
                        f"({labels[a]} {ga:.1f}, {labels[b]} {gb:.1f}, {labels[c]} {gc:.1f} GiB)"
                        for st, pk, (a, b, c), (ga, gb, gc) in zip(ev.peak_stage[out_].tolist(),
                                                                   peak_gib[out_].tolist(), top3.tolist(), top_gib)]
        kind[out_] = ["out of memory, mostly " + x for x in dom[out_].tolist()]
    ranked = fits & ~ev.tight if leave_out_tight else fits
    for i in np.nonzero(fits & ~ranked)[0]:
        reason[i] = (f"tight, left out: {peak_gib[i]:.1f} GiB > {u_txt} GiB usable with the allocator's typical "
                     f"reserve; fits only with the least ({ev.low_peak_bytes[i] / mem.GIB:.1f} GiB)")
        kind[i] = "tight (left out)"
    df["ranked"] = ranked
    df["reason"] = pd.Series(reason, dtype=object)
    df["reject_kind"] = pd.Series(kind, dtype=object)
    df["capacity_gib"] = ev.capacity_bytes / mem.GIB
    df["usable_gib"] = ev.usable_bytes / mem.GIB
    key, asc = OBJECTIVES[objective]
    vals = df[key].to_numpy()
    order = np.lexsort(((vals if asc else -vals), ~df["fits"].to_numpy(), ~df["ranked"].to_numpy()))
    df = df.iloc[order].reset_index(drop=True)
    df.insert(0, "rank", np.where(df["ranked"], np.cumsum(df["ranked"].to_numpy()), 0))
    return df


def _add_error_band(table: pd.DataFrame, model, P: Predictor, eng, arr, structs, seq_len, precision, n: int) -> None:
    """`expected_error` (and `provenance`) for the best `n` feasible rows; NaN / '' for the rest."""
    table["expected_error"] = np.nan
    table["provenance"] = ""
    best = table.index[table["ranked"].to_numpy()][:max(0, n)]
    if not len(best):
        return
    src = table.loc[best, "_row"].to_numpy()
    ev = eng.evaluate(model, arr[src], structs, seq_len, precision, provenance=True)
    errs, provs = [], []
    tps = table.loc[best, "tp"].to_numpy()
    fws = table.loc[best, "framework"].to_numpy() if "framework" in table else [None] * len(src)
    for r in range(len(src)):
        share, err, _basis = P.confidence(ev.provenance_s[r], fws[r], (model, int(tps[r]), precision))
        errs.append(err)
        provs.append("; ".join(f"{k} {v:.0%}" for k, v in sorted(share.items(), key=lambda kv: -kv[1]) if v > 0.0005))
    table.loc[best, "expected_error"] = errs
    table.loc[best, "provenance"] = provs


def layout_of(row: pd.Series | dict) -> Layout:
    """The Layout of one table row."""
    sl = row["stage_layers"]
    return Layout(num_gpus=int(row["num_gpus"]), tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]),
                  micro_batch=int(row["micro_batch"]), global_batch=int(row["global_batch"]),
                  seq_len=int(row["seq_len"]), vpp=int(row["vpp"]), schedule=str(row["schedule"]),
                  recompute=str(row["recompute"]), sequence_parallel=bool(row["sequence_parallel"]),
                  zero_stage=int(row["zero_stage"]), precision=str(row["precision"]),
                  stage_layers=tuple(int(x) for x in sl.split(",")) if sl else None, **_framework_fields(row),
                  cp=int(row["cp"]) if "cp" in row and row["cp"] == row["cp"] else 1,
                  ep=int(row["ep"]) if "ep" in row and row["ep"] == row["ep"] else 1,
                  overlap_tp_comm=bool(row["overlap_tp_comm"]) if "overlap_tp_comm" in row else False,
                  **_precision_fields(row), **_cp_offload_fields(row), **_moe_fields(row))


def _needs_offload(arr: np.ndarray, fits: np.ndarray) -> np.ndarray:
    """Per row: it offloads activations, fits, and the same layout without offload (enumerated beside it) does not."""
    off = arr[:, COLUMNS.index("offload_activations")]
    out = np.zeros(len(arr), dtype=bool)
    if not (off > 0).any():
        return out
    rest = np.delete(arr, COLUMNS.index("offload_activations"), axis=1)
    base = {tuple(r): bool(f) for r, f, o in zip(rest.tolist(), fits, off) if o == 0}
    for i in np.nonzero((off > 0) & fits)[0]:
        out[i] = base.get(tuple(rest[i].tolist())) is False
    return out


def _cp_offload_fields(row: pd.Series | dict) -> dict[str, Any]:
    """cp_comm and offload_activations of a table row (the defaults where the table has no such column)."""
    out: dict[str, Any] = {}
    if "cp_comm" in row and isinstance(row["cp_comm"], str):
        out["cp_comm"] = row["cp_comm"]
    if "offload_activations" in row and row["offload_activations"] == row["offload_activations"]:
        out["offload_activations"] = int(row["offload_activations"])
    return out


def _moe_fields(row: pd.Series | dict) -> dict[str, Any]:
    """etp (None where it is the framework's default) and moe_overlap of a table row."""
    out: dict[str, Any] = {}
    if "etp" in row and row["etp"] == row["etp"]:
        fw = get_framework(str(row.get("framework") or DEFAULT_FRAMEWORK))
        default = int(row["tp"]) if fw.expert_tp_follows_tp else 1
        out["etp"] = None if int(row["etp"]) == default else int(row["etp"])
    if "moe_overlap" in row and row["moe_overlap"] == row["moe_overlap"]:
        out["moe_overlap"] = bool(row["moe_overlap"])
    if isinstance(row.get("moe_dispatcher"), str) and row["moe_dispatcher"]:
        out["moe_dispatcher"] = str(row["moe_dispatcher"])
    if isinstance(row.get("cuda_graphs"), str) and row["cuda_graphs"]:
        out["cuda_graphs"] = str(row["cuda_graphs"])
    if (str(row.get("recompute", "")) == "selective" and isinstance(row.get("recompute_modules"), str)
            and str(row.get("framework") or DEFAULT_FRAMEWORK) == "megatron"):
        mods = tuple(m for m in str(row["recompute_modules"]).split(",") if m)
        out["recompute_modules"] = None if mods == DEFAULT_RECOMPUTE_MODULES else mods
    return out


def _precision_fields(row: pd.Series | dict) -> dict[str, Any]:
    """grad_reduce_in_fp32 (None where the row's gradient bytes are the precision's default) and
    fp8_param_gather of a table row."""
    out: dict[str, Any] = {}
    if "grad_bytes" in row and row["grad_bytes"] == row["grad_bytes"]:
        out["grad_reduce_in_fp32"] = grad_reduce_in_fp32_of(int(row["grad_bytes"]), str(row["precision"]))
    if "fp8_param_gather" in row and row["fp8_param_gather"] == row["fp8_param_gather"]:
        out["fp8_param_gather"] = bool(row["fp8_param_gather"])
    return out


def _framework_fields(row: pd.Series | dict) -> dict[str, Any]:
    """framework and the overlap switches of a table row (None where they equal the framework default)."""
    name = str(row.get("framework") or DEFAULT_FRAMEWORK)
    fw = get_framework(name)
    out: dict[str, Any] = {"framework": fw.name}
    for k in ("overlap_grad_reduce", "overlap_param_gather"):
        if k in row and row[k] == row[k]:
            v = bool(row[k])
            out[k] = None if v == getattr(fw, k) else v
    if "overlap_p2p_comm" in row and row["overlap_p2p_comm"] == row["overlap_p2p_comm"]:
        out["overlap_p2p_comm"] = overlap_p2p_field(bool(row["overlap_p2p_comm"]), fw.name,
                                                    str(row.get("schedule") or "1f1b"), int(row.get("pp") or 1))
    return out


def _top_results(model, P, table, top_k, objective, refine, mopt, tokens_to_train, price) -> list[SearchResult]:
    feas = table[table["ranked"]]
    k = top_k if top_k > 0 else 10
    res = []
    for i, row in feas.head(k).iterrows():
        L = layout_of(row)
        pred = P.predict(model, L, timeline=False) if refine and mopt == P.engine.mopt else None
        step = float(row["step_time_s"])
        flops = model_flops_per_step(model, L)
        tfl = flops / step / L.num_gpus / 1e12
        te = training_estimate(step, L.num_gpus, L.tokens_per_step, tokens_to_train, price)
        memory = pred.memory if pred is not None and pred.memory is not None else \
            mem.estimate_memory(model, L, P.platform, mopt)
        mfu_peak_flops = P.platform.device.peak_flops(mfu_peak_precision(L.precision))
        res.append(SearchResult(rank=int(row["rank"]), layout=L, step_time_s=step,
                                tokens_per_s=L.tokens_per_step / step,
                                tflops_per_gpu=tfl, mfu=tfl * 1e12 / mfu_peak_flops,
                                breakdown_s={c: float(row[f"{c}_s"]) for c in CATEGORIES}, memory=memory,
                                training=te.scalar(), prediction=pred, fast_step_time_s=step, table_index=int(i)))
    return res

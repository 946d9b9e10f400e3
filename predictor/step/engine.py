"""The one step-time engine: step time, breakdown, provenance and memory of many layouts at once.

`Predictor.predict` (one layout), `Predictor.predict_many` (predict-batch), the layout search and the
end-to-end calibrations all go through `Engine.evaluate`, so a layout gets the same numbers wherever a
user asks for it.

How a layout is evaluated:
  1. units: per (model, seq, precision, tp, micro-batch, SP, recompute) the calls of one layer, of
     what the first and the last chunk add (`decompose.layer_unit / first_unit / last_unit`), timed
     once (one regressor call per operator and pass for every shape in the batch) -> `UnitTimes`;
  2. chunk classes: per (tp, pp, dp, ZeRO stage, layers, first, last) the optimizer and data-parallel
     work of a chunk (`decompose.step_work`) -> `ChunkClass`;
  3. per pipeline structure (pp, vpp, schedule, layers per chunk), with numpy over all its layouts:
     chunk times = layers x layer unit + edge units + pipeline sends + exposed ZeRO-2/3 traffic +
     host (framework) overhead, then `compose.compose_arrays` (closed-form pipeline, exposed tails,
     critical-path breakdown) and `memory.stage_memory_arrays` (per-stage memory, fit verdict).

A layout is a row of int64 columns `COLUMNS`; its pipeline structure is an index into a list of
`Structure`s. `rows_for(model, layouts)` builds both from `Layout` objects.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeGuard

import numpy as np

from predictor.model.frameworks import (
    FRAMEWORK_SPECS,
    FRAMEWORKS,
    fused_kernels_on,
    get_framework,
    separate_grad_accumulation,
)
from predictor.model.specs import (
    CP_COMMS,
    CUDA_GRAPH_SCOPES,
    CUDA_GRAPHS_FULL_BIT,
    MOE_DISPATCHERS,
    Layout,
    ModelSpec,
    cuda_graphs_mask,
    cuda_graphs_value,
    grad_reduce_in_fp32_of,
    overlap_p2p_field,
)
from predictor.model.stages import V_SCHEDULES, ZB_SCHEDULES, chunk_rank
from predictor.regress.features import GEMM_OPS, TENSOR_CORE_GEMM_OPS
from predictor.step import decompose as D
from predictor.step import memory as mem
from predictor.step.arrayops import unique_rows as _unique_rows
from predictor.step.compose import CATEGORIES, ArrayComposition, ComposeOptions, chunk_rank_matrix, compose_arrays
from predictor.step.overhead import RECOMPUTE_PASSES, HostOverhead
from predictor.step.terms import TERMS_PROVENANCE, CapCurve, EndToEndTerms, blend, slowest_of

if TYPE_CHECKING:
    from predictor.hardware.platforms import Platform

COLUMNS = ("num_gpus", "tp", "pp", "dp", "micro_batch", "num_micro_batches", "structure", "recompute",
           "sequence_parallel", "zero_stage", "framework", "overlap_grad_reduce",
           "overlap_param_gather", "cp", "ep", "overlap_tp_comm", "grad_bytes", "fp8_param_gather",
           # all-to-all context parallelism and activation offloading: cp_comm = index into CP_COMMS, cp_a2a =
           # Layout.cp_a2a_size (0 = the default), offload_activations = offloaded layers per stage
           "cp_comm", "cp_a2a", "offload_activations",
           # --- MoE expert tensor parallelism (resolved, Layout.expert_tp) and the dispatch / combine overlap ---
           "etp", "moe_overlap",
           # --- selective recomputation by module: memory.modules_mask of Layout.selective_modules (0 unless
           # recompute is selective) ---
           "recompute_modules",
           # --- the MoE token dispatcher: index into MOE_DISPATCHERS (Layout.moe_dispatcher) ---
           "moe_dispatcher",
           # --- CUDA graphs: specs.cuda_graphs_mask of Layout.cuda_graphs (0 = none) ---
           "cuda_graphs",
           # --- the pipeline's point-to-point overlap (resolved, Layout.pp_comm_overlap) ---
           "overlap_p2p_comm")
(I_GPUS, I_TP, I_PP, I_DP, I_MB, I_M, I_STRUCT, I_RC, I_SP, I_ZERO, I_FW, I_OGR, I_OPG, I_CP,
 I_EP, I_OTP, I_GB, I_F8P, I_CPC, I_CPA, I_OFF, I_ETP, I_MO, I_RCM, I_MD, I_CG, I_OPP) = range(len(COLUMNS))
RECOMPUTE = mem.RECOMPUTE_ORDER            # recompute column: index into ("none", "selective", "full")
# per micro-batch categories
PHASE_CATS = ("compute", "host_overhead", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "offload_comm")
MEMORY_PARTS = mem.MEMORY_PARTS
# Expected error of parts without a measured error of their own
ASSUMED_ERROR = {"measured": 0.10, "derived": 0.12, "transferred": 0.15, "host": 0.15, "stand-in": 0.20,
                 "analytical": 0.30}


@dataclass(frozen=True)
class Structure:
    """A pipeline structure: what the closed form and the memory model need besides the degrees."""
    pp: int
    vpp: int
    schedule: str
    counts: tuple[int, ...]                # layers per chunk, pipeline order
    stage_layers: tuple[int, ...] | None   # what Layout carries (None = the default split)


def structure_of(model: ModelSpec, layout: Layout) -> Structure:
    return Structure(layout.pp, layout.vpp, layout.schedule, tuple(D.chunk_layer_counts(model, layout)),
                     tuple(layout.stage_layers) if layout.stage_layers else None)


def rows_for(model: ModelSpec, layouts: Sequence[Layout], structures: list[Structure] | None = None
             ) -> tuple[np.ndarray, list[Structure]]:
    """Engine rows for `layouts` (validated by the caller) and the structures they index."""
    structures = [] if structures is None else structures
    index = {s: i for i, s in enumerate(structures)}
    rows = []
    for L in layouts:
        st = structure_of(model, L)
        if st not in index:
            index[st] = len(structures)
            structures.append(st)
        fw = get_framework(L.framework)
        ogr = fw.overlap_grad_reduce if L.overlap_grad_reduce is None else L.overlap_grad_reduce
        opg = fw.overlap_param_gather if L.overlap_param_gather is None else L.overlap_param_gather
        rows.append((L.num_gpus, L.tp, L.pp, L.dp, L.micro_batch, L.num_micro_batches, index[st],
                     RECOMPUTE.index(L.recompute), int(L.sequence_parallel), L.zero_stage,
                     FRAMEWORKS.index(fw.name), int(ogr), int(opg), L.cp, L.ep, int(L.overlap_tp_comm),
                     L.grad_bytes, int(L.fp8_param_gather), CP_COMMS.index(L.cp_comm), L.cp_a2a_size or 0,
                     L.offload_activations, L.expert_tp, int(L.moe_overlap), mem.recompute_mask(model, L),
                     MOE_DISPATCHERS.index(L.moe_dispatcher), cuda_graphs_mask(L.cuda_graphs),
                     int(L.pp_comm_overlap)))
    return np.array(rows, dtype=np.int64).reshape(-1, len(COLUMNS)), structures


def layout_of_row(row: np.ndarray, structure: Structure, global_batch: int, seq_len: int, precision: str) -> Layout:
    fw = FRAMEWORK_SPECS[FRAMEWORKS[int(row[I_FW])]]
    return Layout(num_gpus=int(row[I_GPUS]), tp=int(row[I_TP]), pp=int(row[I_PP]), dp=int(row[I_DP]),
                  micro_batch=int(row[I_MB]), global_batch=global_batch, seq_len=seq_len, vpp=structure.vpp,
                  schedule=structure.schedule, recompute=RECOMPUTE[int(row[I_RC])],
                  sequence_parallel=bool(row[I_SP]), zero_stage=int(row[I_ZERO]), precision=precision,
                  stage_layers=structure.stage_layers, framework=fw.name,
                  overlap_grad_reduce=None if bool(row[I_OGR]) == fw.overlap_grad_reduce else bool(row[I_OGR]),
                  overlap_param_gather=None if bool(row[I_OPG]) == fw.overlap_param_gather else bool(row[I_OPG]),
                  cp=int(row[I_CP]), ep=int(row[I_EP]), overlap_tp_comm=bool(row[I_OTP]),
                  grad_reduce_in_fp32=grad_reduce_in_fp32_of(int(row[I_GB]), precision),
                  fp8_param_gather=bool(row[I_F8P]), cp_comm=CP_COMMS[int(row[I_CPC])],
                  cp_a2a_size=int(row[I_CPA]) or None, offload_activations=int(row[I_OFF]),
                  etp=(None if int(row[I_ETP]) == (int(row[I_TP]) if fw.expert_tp_follows_tp else 1)
                       else int(row[I_ETP])),
                  moe_overlap=bool(row[I_MO]), recompute_modules=_modules_field(row),
                  moe_dispatcher=MOE_DISPATCHERS[int(row[I_MD])], cuda_graphs=cuda_graphs_value(int(row[I_CG])),
                  overlap_p2p_comm=overlap_p2p_field(bool(row[I_OPP]), fw.name, structure.schedule, int(row[I_PP])))


def _recompute_names(rows: np.ndarray) -> list[str]:
    """Per row, the recomputation its host passes follow: RECOMPUTE's name, 'none' for a selective row that
    recomputes no module (recompute_modules empty: nothing re-runs)."""
    return ["none" if RECOMPUTE[int(r)] == "selective" and int(m) == 0 else RECOMPUTE[int(r)]
            for r, m in zip(rows[:, I_RC], rows[:, I_RCM])]


def _modules_field(row: np.ndarray) -> tuple[str, ...] | None:
    """Layout.recompute_modules of an engine row: None (Megatron-Core's default) where a selective row's mask is the
    default's, else its modules; None unless selective."""
    if RECOMPUTE[int(row[I_RC])] != "selective" or FRAMEWORKS[int(row[I_FW])] != "megatron":
        return None   # (recompute_modules is Megatron-Core's; the others' selective is the default's)
    mods = mem.modules_of_mask(int(row[I_RCM]))
    return None if mods == mem.DEFAULT_RECOMPUTE_MODULES else mods


def dp_cp(rows: np.ndarray) -> np.ndarray:
    """Per row: ranks of the data-parallel-with-CP group (dp * cp), over which Megatron-Core reduces the
    gradients and shards the distributed optimizer."""
    return rows[:, I_DP] * rows[:, I_CP]


# ------------------------------------------------------------------------------------ timed units
class Timed(NamedTuple):
    """One call with its predicted time."""
    call: Any                   # OpCall | CommCall
    seconds: float              # one call (an operator's stand-in scale applied)
    provenance: str
    error: float                # expected relative error used for the confidence band
    raw_error: float | None     # the regressor's own error (CV / transfer), None where there is none
    per_micro_batch: bool = True


@dataclass
class UnitTimes:
    """One unit (a layer, or what an edge chunk adds) for one micro-batch, in seconds."""
    fc: float = 0.0      # forward compute
    bc: float = 0.0      # backward compute, recomputation included
    rc: float = 0.0      # recomputation
    ft: float = 0.0      # tensor-parallel communication in the forward
    bt: float = 0.0      # ... in the backward (and recomputation)
    fcp: float = 0.0     # context-parallel ring communication the attention blocks do not hide, forward
    bcp: float = 0.0     # ... backward and recomputation
    fep: float = 0.0     # MoE all-to-all (dispatch and combine over the expert-parallel group), forward
    bep: float = 0.0     # ... backward and recomputation
    hfep: float = 0.0    # of fep, what the dispatch / combine overlap can hide: min(fep, bc), the other micro-batch's
    #                      backward compute of the same layer (moe_overlap_hidden)
    hbep: float = 0.0    # ... of bep under the other micro-batch's forward compute: min(bep, fc)
    fi: float = 0.0      # forward tensor-core FLOPs at the achievable matmul throughput (seconds)
    bi: float = 0.0      # ... backward and recomputation
    ri: float = 0.0      # ... recomputation
    fa: float = 0.0      # forward attention-kernel seconds (D.ATTENTION_CORE_OPS; part of fc)
    ba: float = 0.0      # ... backward and recomputation (part of bc)
    ra: float = 0.0      # ... recomputation (part of rc)
    fm: float = 0.0      # forward memory-bound operator seconds (neither a tensor-core GEMM nor attention)
    bm: float = 0.0      # ... backward and recomputation
    rm: float = 0.0      # ... recomputation
    caps: dict[str, CapCurve] = field(default_factory=dict)  # "fi" / "bi" / "ri": the 'cap' power form's curves
    prov: dict[str, list[float]] = field(default_factory=dict)  # provenance -> [seconds, seconds x error]
    raw: tuple = ()      # (unit, op times, comm times, errors): what `calls` is built from, on demand
    # --- zero-bubble schedules: the weight-gradient pass W (docs/schedules.md) ---
    bw: float = 0.0      # half the backward (not recomputation) seconds of the linear-layer GEMMs (GEMM_OPS)

    @property
    def calls(self) -> list[Timed]:
        unit, op_t, comm_t, op_e, comm_e = self.raw
        out = [Timed(c, t * c.scale, prov, e, err) for c, (t, prov, err), e in zip(unit.ops, op_t, op_e)]
        out += [Timed(c, t, prov, e, None) for c, (t, prov), e in zip(unit.comms, comm_t, comm_e)]
        return out


@dataclass
class Parts:
    layer: UnitTimes             # a transformer layer (a MoE model's: a MoE layer)
    first: UnitTimes
    last: UnitTimes
    p2p_bytes: int
    dense: UnitTimes | None = None   # a MoE model's leading dense layer (None: every layer is `layer`)


@dataclass
class ChunkClass:
    """Once-per-step work of one chunk and its per-micro-batch ZeRO-2/3 traffic, in seconds."""
    optimizer_s: float
    dp_sync_s: float            # gradient all-reduce / reduce-scatter
    param_gather_s: float       # ZeRO-1 all-gather after the optimizer
    zf_total: float             # ZeRO-2/3 traffic of one micro-batch: forward total, longest call
    zf_unit: float
    zb_total: float             # backward total, longest call
    zb_unit: float
    calls: list[Timed]
    prov_step: dict[str, list[float]]
    prov_mb: dict[str, list[float]]
    accum_s: float = 0.0        # the gradient accumulation pass after a micro-batch (frameworks that run one)
    accum_calls: list[Timed] = field(default_factory=list)
    prov_accum: dict[str, list[float]] = field(default_factory=dict)


def _add_prov(d: dict[str, list[float]], prov: str, seconds: float, err: float) -> None:
    if seconds <= 0:
        return
    v = d.setdefault(prov, [0.0, 0.0])
    v[0] += seconds
    v[1] += seconds * err


@dataclass
class Evaluation:
    """`Engine.evaluate`'s answer: per-row arrays (length R) and, with `detail`, what one prediction
    shows beyond them."""
    step_time_s: np.ndarray
    pipeline_s: np.ndarray
    breakdown_s: dict[str, np.ndarray]
    detail_s: dict[str, np.ndarray]
    critical_stage: np.ndarray
    peak_bytes: np.ndarray
    peak_stage: np.ndarray
    memory_parts: dict[str, np.ndarray]     # bytes of each MEMORY_PARTS at the peak stage
    usable_bytes: float
    capacity_bytes: float
    provenance_s: list[dict[str, list[float]]]   # per row: provenance -> [seconds, seconds x error] (all stages)
    host_all_s: np.ndarray                        # host (framework) seconds over every stage and micro-batch
    terms_all_s: np.ndarray                       # seconds the end-to-end terms add (TERMS_PROVENANCE)
    details: dict[int, dict[str, Any]] = field(default_factory=dict)  # row -> per-chunk detail (detail=True)

    low_peak_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))  # with the least allocator reserve
    # the fullest stage as torch counts it: torch.cuda.max_memory_allocated / max_memory_reserved
    peak_allocated_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    peak_reserved_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def fits(self) -> np.ndarray:
        """Per row: fits with the least allocator reserve published runs show (memory.MemoryReport.fits)."""
        return self.low_peak_bytes <= self.usable_bytes

    @property
    def tight(self) -> np.ndarray:
        """Per row: fits, but not with the typical (median) allocator reserve."""
        return self.fits & (self.peak_bytes > self.usable_bytes)


class StepTimings(Protocol):
    """What the engine needs to time a step's calls: handed in by its caller (the `Predictor` facade satisfies it),
    so the engine never calls back into the layer above it.

    `op_times` / `comm_times` give (seconds of one call, provenance[, expected relative error]) per call,
    `op_ideal_s` the call's FLOPs at the device's measured maximum (after `op_times` on the same calls)."""
    platform: Platform
    options: ComposeOptions
    terms: EndToEndTerms | None
    host: HostOverhead | None
    network_error: float

    def op_times(self, calls: Sequence[D.OpCall], precision: str) -> list[tuple[float, str, float | None]]: ...

    def op_ideal_s(self, calls: Sequence[D.OpCall], precision: str) -> list[float]: ...

    def comm_times(self, calls: Sequence[D.CommCall]) -> list[tuple[float, str]]: ...


class Engine:
    """Vectorised step time and memory for many layouts of one or more models on one platform.

    Caches the timed units and chunk classes, so evaluating many layouts of a model (search) or the
    same model again (the dashboard) only composes."""

    def __init__(self, timings: StepTimings, memory_options: mem.MemoryOptions = mem.MemoryOptions()):
        self.timings = timings
        self.platform = timings.platform
        self.mopt = memory_options
        self.comm = mem.DeviceComm.of(timings.platform)
        self._parts: dict[tuple, Parts] = {}
        self._classes: dict[tuple, ChunkClass] = {}
        self._emb: dict[tuple, tuple[float, str, float]] = {}
        self._p2p: dict[tuple, tuple[float, str, float]] = {}

    # ---- timing the units -----------------------------------------------------------------
    def _err(self, prov: str, err: float | None, comm: bool) -> float:
        base = prov.split(" ")[0]
        if err is not None and err == err:
            return float(err)
        if base == "analytical" and comm:
            return self.timings.network_error
        return ASSUMED_ERROR.get(base, 0.3)

    def prepare(self, model: ModelSpec, seq_len: int, precision: str, keys: Iterable[tuple[int, ...]]
                ) -> None:
        """Time the units of every (tp, micro_batch, sp, recompute, cp, ep, fused kernels) in `keys` not cached yet
        (cp = 1, ep = 1, unfused where a key has fewer entries)."""
        self.prepare_many([(model, seq_len, precision, k) for k in keys])

    def prepare_many(self, requests: Iterable[tuple[ModelSpec, int, str, tuple[int, ...]]]) -> None:
        """`prepare` for several models at once: one regressor call per (operator, pass) for all of them."""
        g = self.platform.gpus_per_node
        todo: dict[tuple, tuple] = {}
        for model, seq, prec, k in requests:
            tp, mb, sp, rc = k[:4]
            cp = k[4] if len(k) > 4 else 1
            ep = k[5] if len(k) > 5 else 1
            fused = bool(k[6]) if len(k) > 6 else False
            otp = bool(k[7]) if len(k) > 7 else False
            a2a = k[8] if len(k) > 8 else 1   # ranks per all-to-all group of context parallelism (1: the ring)
            etp = int(k[9]) if len(k) > 9 else 1   # expert tensor-parallel ranks (1: experts whole)
            # selective recomputation's modules (memory.modules_mask; default: Megatron-Core's core_attn)
            rcm = int(k[10]) if len(k) > 10 else mem.modules_mask(mem.DEFAULT_RECOMPUTE_MODULES)
            rcm = rcm if RECOMPUTE[rc] == "selective" else 0
            mods = mem.modules_of_mask(rcm)
            md = int(k[11]) if len(k) > 11 else 0   # the MoE token dispatcher (index into MOE_DISPATCHERS)
            key = (model, seq, prec, tp, mb, sp, rc, cp, ep, int(fused), int(otp), a2a, etp, rcm, md)
            if key in self._parts or key in todo:
                continue
            topo = D.topology(g, tp, 1, 1, "tp")
            cp_topo, a2a_topo = D.cp_topologies(g, tp, cp, a2a)
            ep_topo = D.ep_topology(g, ep, etp)
            units: tuple[D.Unit, ...] = (
                D.layer_unit(model, tp, mb, seq, bool(sp), RECOMPUTE[rc], prec, topo, cp, cp_topo, ep, ep_topo,
                             fused=fused, tp_overlap=otp, cp_a2a=a2a, a2a_topo=a2a_topo, etp=etp,
                             etp_topo=D.etp_topology(g, etp), recompute_modules=mods,
                             dispatcher=MOE_DISPATCHERS[md], dispatch_topo=D.tp_ep_topology(g, ep, etp)),
                D.first_unit(model, tp, mb, seq, bool(sp), prec, topo, cp, fused),
                D.last_unit(model, tp, mb, seq, bool(sp), prec, topo, cp, fused))
            if model.has_dense_layers:
                units += (D.layer_unit(model, tp, mb, seq, bool(sp), RECOMPUTE[rc], prec, topo, cp, cp_topo,
                                       moe=False, fused=fused, tp_overlap=otp, cp_a2a=a2a, a2a_topo=a2a_topo,
                                       recompute_modules=mods),)
            todo[key] = (units, D.p2p_message_bytes(model, tp, mb, seq, bool(sp), prec, cp))
        if not todo:
            return
        by_prec: dict[str, list] = {}
        comms: list[D.CommCall] = []
        for key, (units, _) in todo.items():
            for u in units:
                by_prec.setdefault(key[2], []).extend(u.ops)
                comms.extend(u.comms)
        for prec, calls in by_prec.items():
            self.timings.op_times(calls, prec)
        self.timings.comm_times(comms)
        for key, (units, p2p_bytes) in todo.items():
            prec = key[2]
            timed = [self._time_unit(u, prec) for u in units]
            self._parts[key] = Parts(timed[0], timed[1], timed[2], p2p_bytes=p2p_bytes,
                                     dense=timed[3] if len(timed) > 3 else None)

    def _time_unit(self, unit: D.Unit, precision: str) -> UnitTimes:
        u = UnitTimes()
        op_t = self.timings.op_times(unit.ops, precision)
        comm_t = self.timings.comm_times(unit.comms)
        prov_d = u.prov
        op_e, comm_e = [], []
        fc = bc = rc = ft = bt = bw = 0.0
        attn = {"fwd": 0.0, "bwd": 0.0, "recompute": 0.0}   # attention kernels per phase (the CP ring's cover)
        ring = {"fwd": 0.0, "bwd": 0.0, "recompute": 0.0}   # CP ring sends per phase
        cpa2a = {"fwd": 0.0, "bwd": 0.0, "recompute": 0.0}  # CP all-to-alls per phase (not overlapped)
        fep = bep = 0.0                                      # MoE all-to-all
        gemm = {"fwd": 0.0, "bwd": 0.0, "recompute": 0.0}   # tensor-parallel GEMMs per phase (the TP overlap's cover)
        tpc = {"fwd": 0.0, "bwd": 0.0, "recompute": 0.0}    # tensor-parallel exchanges per phase
        # (sampled, ideal) seconds of every operator per phase: the tensor-core FLOPs at MAMF (fi / bi / ri) and the
        # 'cap' power form's curves (operators without tensor-core work have ideal 0 and drop out of both)
        kern: dict[str, tuple[list[float], list[float]]] = {"fi": ([], []), "bi": ([], []), "ri": ([], [])}
        kind = {"a": [0.0, 0.0, 0.0], "m": [0.0, 0.0, 0.0]}   # attention / memory-bound seconds: fwd, bwd, recompute
        for c, (t, prov, err), ideal in zip(unit.ops, op_t, self.timings.op_ideal_s(unit.ops, precision)):
            total = t * c.count * c.scale
            itot = ideal * c.count * c.scale
            k_ = "a" if c.op in D.ATTENTION_CORE_OPS else (None if c.op in TENSOR_CORE_GEMM_OPS else "m")
            if k_ is not None:
                kind[k_][0 if c.phase == "fwd" else 1] += total
                if c.phase == "recompute":
                    kind[k_][2] += total
            if c.op in D.ATTENTION_CORE_OPS and c.phase in attn:
                attn[c.phase] += total
            elif c.op in D.TP_OVERLAP_GEMMS and c.phase in gemm and c.part != "experts":
                gemm[c.phase] += total
            if c.op in GEMM_OPS and c.phase == "bwd":
                # a linear layer's backward = a data-gradient and a weight-gradient GEMM of the same FLOPs: the
                # weight-gradient half is the zero-bubble schedules' W pass (Qi et al. 2024, section 2)
                bw += 0.5 * total
            if c.phase == "fwd":
                fc += total
                phases: tuple[str, ...] = ("fi",)
            else:
                bc += total
                phases = ("bi",)
                if c.phase == "recompute":
                    rc += total
                    phases = ("bi", "ri")
            for f in phases:
                kern[f][0].append(total)
                kern[f][1].append(itot)
            e = err if err is not None and err == err else self._err(prov, None, False)
            op_e.append(e)
            if total > 0:
                v = prov_d.get(prov)
                if v is None:
                    v = prov_d[prov] = [0.0, 0.0]
                v[0] += total
                v[1] += total * e
        for cc, (t, prov) in zip(unit.comms, comm_t):
            total = t * cc.count
            if cc.group == "cp" and cc.collective == "alltoall":
                cpa2a[cc.phase] += total
            elif cc.group == "cp":
                ring[cc.phase] += total
            elif cc.group == "ep":
                if cc.phase == "fwd":
                    fep += total
                else:
                    bep += total
            else:
                if cc.group == "tp" and cc.phase in tpc:
                    tpc[cc.phase] += total
                if cc.phase == "fwd":
                    ft += total
                else:
                    bt += total
            e = self._err(prov, None, True)
            comm_e.append(e)
            _add_prov(prov_d, prov, total, e)
        u.fc, u.bc, u.rc, u.ft, u.bt = fc, bc, rc, ft, bt
        u.fi, u.bi, u.ri = (float(sum(kern[f][1])) for f in ("fi", "bi", "ri"))
        u.fep, u.bep = fep, bep
        u.hfep, u.hbep = min(fep, bc), min(bep, fc)
        u.bw = bw
        (u.fa, u.ba, u.ra), (u.fm, u.bm, u.rm) = kind["a"], kind["m"]
        u.caps = {f: CapCurve.of(ts, ids) for f, (ts, ids) in kern.items()}
        if unit.tp_overlap:
            # userbuffers: each exchange runs in chunks under the GEMM it feeds; exposed = what the exchanges of a phase
            # take beyond that phase's tensor-parallel GEMM time
            hidden = {p: min(tpc[p], gemm[p]) for p in tpc}
            u.ft -= hidden["fwd"]
            u.bt -= hidden["bwd"] + hidden["recompute"]
        if unit.cp > 1:
            # Megatron-Core's ring: cp attention blocks, the sends of the next block overlapping the current one
            # (cp - 1 overlapped steps); exposed = what the ring's sends take beyond (cp - 1) / cp of the attention
            # time of the phase (max(0, comm - compute) summed over the steps, the steps being equal)
            k = (unit.cp - 1) / unit.cp
            exposed = {p: max(0.0, ring[p] - k * attn[p]) for p in ring}
            u.fcp, u.bcp = exposed["fwd"], exposed["bwd"] + exposed["recompute"]
        # all-to-all CP (DeepSpeed-Ulysses / a2a+p2p): each all-to-all's output is the next kernel's input, so it is
        # not overlapped: the whole of it is on the critical path
        u.fcp += cpa2a["fwd"]
        u.bcp += cpa2a["bwd"] + cpa2a["recompute"]
        u.raw = (unit, op_t, comm_t, op_e, comm_e)
        return u

    def _prepare_classes(self, model: ModelSpec, seq: int, prec: str, keys: set[tuple]) -> None:
        """Optimizer + data-parallel work per (tp, pp, dp, zero, gather mode, ep, gradient bytes, FP8 primary
        weights, layers, first, last, dense)."""
        self.prepare_classes_many([(model, seq, prec, k) for k in keys])

    def prepare_classes_many(self, requests: Iterable[tuple[ModelSpec, int, str, tuple]]) -> None:
        """`_prepare_classes` for several models at once (one regressor call per optimizer variant)."""
        todo = {}
        g = self.platform.gpus_per_node
        for model, seq, prec, k in requests:
            full = (model, seq, prec, *k)
            if full in self._classes or full in todo:
                continue
            tp, pp, dp, z, gmode, ep, gb, f8p, n, first, last, dense = k[:12]
            etp = int(k[12]) if len(k) > 12 else 1
            todo[full] = D.step_work(model, tp=tp, pp=pp, dp=dp, zero_stage=z, precision=prec, seq_len=seq,
                                     layers=n, first=bool(first), last=bool(last),
                                     dp_topo=D.topology(g, tp, dp, pp, "dp"), zero2_gather=ZERO2_GATHER[gmode],
                                     dense=dense, ep=ep, edp_topo=D.edp_topology(g, tp, dp, ep, etp), grad_bytes=gb,
                                     fp8_param=bool(f8p), etp=etp)
        if not todo:
            return
        by_prec: dict[str, list] = {}
        for full, w in todo.items():
            by_prec.setdefault(full[2], []).extend((*w.step_ops, *w.accum_ops))
        for prec, prec_calls in by_prec.items():
            self.timings.op_times(prec_calls, prec)
        self.timings.comm_times([c for w in todo.values() for c in (*w.step_comms, *w.mb_comms)])
        for full, w in todo.items():
            prec = full[2]
            calls: list[Timed] = []
            ps: dict[str, list[float]] = {}
            pm: dict[str, list[float]] = {}
            opt, op_calls = self._time_ops(w.step_ops, prec, ps, per_micro_batch=False)
            calls += op_calls
            dp_s = gather = 0.0
            for cc, (t, prov) in zip(w.step_comms, self.timings.comm_times(w.step_comms)):
                e = self._err(prov, None, True)
                if cc.collective == "allgather":
                    gather += t
                else:
                    dp_s += t
                calls.append(Timed(cc, t, prov, e, None, False))
                _add_prov(ps, prov, t, e)
            z = {"fwd": [0.0, 0.0], "bwd": [0.0, 0.0]}
            for cc, (t, prov) in zip(w.mb_comms, self.timings.comm_times(w.mb_comms)):
                e = self._err(prov, None, True)
                zz = z["fwd" if cc.phase == "fwd" else "bwd"]
                zz[0] += t * cc.count
                zz[1] = max(zz[1], t)
                calls.append(Timed(cc, t, prov, e, None, True))
                _add_prov(pm, prov, t * cc.count, e)
            pa: dict[str, list[float]] = {}
            acc_s, acc_calls = self._time_ops(w.accum_ops, prec, pa, per_micro_batch=True)
            self._classes[full] = ChunkClass(opt, dp_s, gather, z["fwd"][0], z["fwd"][1], z["bwd"][0], z["bwd"][1],
                                             calls, ps, pm, acc_s, acc_calls, pa)

    def _time_ops(self, ops: Sequence[D.OpCall], precision: str, prov: dict[str, list[float]], *,
                  per_micro_batch: bool) -> tuple[float, list[Timed]]:
        """(seconds of all `ops` x their counts, each timed call) of a chunk class's operator calls (its stand-in
        scale applied), their seconds added to `prov`."""
        total = 0.0
        timed: list[Timed] = []
        for c, (t, pv, err) in zip(ops, self.timings.op_times(ops, precision)):
            e = self._err(pv, err, False)
            total += t * c.scale * c.count
            timed.append(Timed(c, t * c.scale, pv, e, err, per_micro_batch))
            _add_prov(prov, pv, t * c.scale * c.count, e)
        return total, timed

    def chunk_class(self, model: ModelSpec, seq_len: int, precision: str, row: np.ndarray, pp: int,
                    cls: tuple[int, int, int, int]) -> ChunkClass:
        """The prepared optimizer / data-parallel work of engine row `row`'s chunk class `cls` = (layers, first,
        last, dense layers): the one spelling of the class key outside `evaluate`'s vectorised loop."""
        return self._classes[(model, seq_len, precision, int(row[I_TP]), pp, int(row[I_DP] * row[I_CP]),
                              int(row[I_ZERO]), int(gather_mode(row[None, :])[0]), int(row[I_EP]), int(row[I_GB]),
                              int(row[I_F8P]), *cls, int(row[I_ETP]))]

    # --- DualPipe: the two parameter copies of every stage ---
    def _dualpipe_grad_sync(self, model: ModelSpec, seq_len: int, precision: str, tp: int, pp: int, dp: int, z: int,
                            gm: int, ep: int, gb: int, f8p: int, layers: int, first: int, last: int,
                            dense: int) -> float:
        """DualPipe keeps stage r on ranks r and pp-1-r (DeepSeek-V3 Table 2: 2x parameters), so each stage's
        gradients are reduced over its 2 x dp copies: the chunk's data-parallel gradient reduction taken on 2 x dp
        ranks (the same collectives, `step_work`, on a group twice the size, spanning the nodes of both pipeline
        ranks), in place of the dp one. The optimizer and its ZeRO shards stay those of the dp group."""
        key = (tp, pp, 2 * dp, z, gm, ep, gb, f8p, layers, first, last, dense)
        self.prepare_classes_many([(model, seq_len, precision, key)])
        return float(self._classes[(model, seq_len, precision, *key)].dp_sync_s)

    def _emb_sync(self, model: ModelSpec, tp: int, pp: int, dp: int, prec: str) -> tuple[float, str, float]:
        key = (model, tp, pp, dp, prec)
        hit = self._emb.get(key)
        if hit is None:
            c = D.embedding_sync(model, tp, pp, prec, D.topology(self.platform.gpus_per_node, tp, dp, pp, "embedding"))
            if c is None:
                hit = (0.0, "none", 0.0)
            else:
                t, prov = self.timings.comm_times([c])[0]
                hit = (t, prov, self._err(prov, None, True))
            self._emb[key] = hit
        return hit

    def _p2p_time(self, nbytes: int, tp: int, pp: int, dp: int) -> tuple[float, str, float]:
        key = (nbytes, tp, pp, dp)
        hit = self._p2p.get(key)
        if hit is None:
            if pp == 1:
                hit = (0.0, "none", 0.0)
            else:
                topo = D.topology(self.platform.gpus_per_node, tp, dp, pp, "pp")
                c = D.CommCall("p2p", nbytes, "pp", "fwd", 1, *topo)
                t, prov = self.timings.comm_times([c])[0]
                hit = (t, prov, self._err(prov, None, True))
            self._p2p[key] = hit
        return hit

    # ---- evaluation -----------------------------------------------------------------------
    def evaluate(self, model: ModelSpec, rows: np.ndarray, structures: Sequence[Structure], seq_len: int,
                 precision: str, *, host: HostOverhead | bool | None = True, options: ComposeOptions | None = None,
                 detail: bool = False, provenance: bool = True, terms: EndToEndTerms | bool | None = True
                 ) -> Evaluation:
        """Every row of `rows` (columns `COLUMNS`) of `model` at `seq_len` / `precision`.

        host: True = the platform's own fitted host overhead (if any and `options.host_overhead`), None /
        False = none, or a HostOverhead to use instead (calibration). terms: True = the predictor's end-to-end
        terms (predictor.step.terms: compute factor, contention, per-framework host; GPU platforms), None / False =
        none, or EndToEndTerms to use instead (calibration); the platform's own host overhead, where it has
        one, replaces the terms' host part. detail: keep per-chunk times, tails and timed calls of every row
        (one prediction's charts and tables). provenance: sum each row's time per provenance (for the
        confidence band)."""
        opts = options or self.timings.options
        if host is True:
            host_term = self.timings.host if opts.host_overhead else None
        else:
            host_term = host or None
        e2e = (self.timings.terms if terms is True else terms or None)
        if e2e is not None and not opts.host_overhead:
            e2e = replace(e2e, host={})
        n = len(rows)
        out = Evaluation(step_time_s=np.full(n, np.nan), pipeline_s=np.full(n, np.nan),
                         breakdown_s={c: np.full(n, np.nan) for c in CATEGORIES},
                         detail_s={k: np.full(n, np.nan) for k in ("compute_fwd", "compute_bwd", "recompute")},
                         critical_stage=np.zeros(n, int), peak_bytes=np.full(n, np.nan), peak_stage=np.zeros(n, int),
                         memory_parts={k: np.full(n, np.nan) for k in MEMORY_PARTS},
                         usable_bytes=self.platform.device.hbm_gib * mem.GIB * (1.0 - self.mopt.allocator_reserve),
                         capacity_bytes=self.platform.device.hbm_gib * mem.GIB,
                         provenance_s=[{} for _ in range(n)], host_all_s=np.zeros(n), terms_all_s=np.zeros(n),
                         low_peak_bytes=np.full(n, np.nan), peak_allocated_bytes=np.full(n, np.nan),
                         peak_reserved_bytes=np.full(n, np.nan))
        if n == 0:
            return out
        rows = np.asarray(rows, dtype=np.int64)
        tp_a, pp_a, st_a = rows[:, I_TP], rows[:, I_PP], rows[:, I_STRUCT]
        dpc_a = dp_cp(rows)   # the data-parallel(-with-CP) group: gradients, ZeRO, pipeline stride
        ukeys, kinv = _unique_rows(unit_key_columns(rows, self.platform, model))
        klist = [tuple(int(v) for v in k) for k in ukeys]
        self.prepare(model, seq_len, precision, klist)
        parts = [self._parts[(model, seq_len, precision, *k)] for k in klist]

        def kvec(get) -> np.ndarray:
            return np.array([get(p) for p in parts], float)[kinv]
        names = ("layer", "first", "last") + (("dense",) if model.has_dense_layers else ())
        unit = {}
        for name in names:   # one [rows, fields] matrix per unit, its columns the fields
            units_ = [getattr(p, name) or p.layer for p in parts]
            mat = np.array([[getattr(x, f) for f in UNIT_FIELDS] for x in units_], float)[kinv]
            unit[name] = {f: mat[:, j] for j, f in enumerate(UNIT_FIELDS)}
        if _capped(e2e):
            # what the sustained-rate cap adds to each unit's tensor-core kernels, per phase ("fx", "bx", "rx")
            for name in names:
                for f, x in (("fi", "fx"), ("bi", "bx"), ("ri", "rx")):
                    unit[name][x] = kvec(lambda p, name=name, f=f: (getattr(p, name) or p.layer).caps[f].added_s(
                        e2e.power_factor, e2e.compute_factor))
        p2p_bytes = kvec(lambda p: p.p2p_bytes).astype(np.int64)
        u, inv = _unique_rows(np.column_stack([p2p_bytes, tp_a, pp_a, dpc_a]))
        p2p = [self._p2p_time(int(b), int(t), int(p), int(d)) for b, t, p, d in u]
        p2p_t = np.array([x[0] for x in p2p])[inv]
        u2, inv2 = _unique_rows(np.column_stack([tp_a, pp_a, dpc_a]))
        emb = [self._emb_sync(model, int(t), int(p), int(d), precision) for t, p, d in u2]
        emb_t = np.array([x[0] for x in emb])[inv2]
        # chunk classes of every (row, chunk)
        struct_classes = [structure_classes(s, model) for s in structures]
        self._prepare_classes(model, seq_len, precision, class_keys(rows, struct_classes))

        for st_id in np.unique(st_a):
            S = structures[int(st_id)]
            idx = np.nonzero(st_a == st_id)[0]
            self._evaluate_structure(out, model, S, struct_classes[int(st_id)], idx, rows[idx], unit, p2p_t[idx],
                                     emb_t[idx], seq_len, precision, host_term, e2e, opts, detail)
        if provenance or detail:
            self._provenance(out, model, rows, structures, kinv, parts, inv, p2p, inv2, emb, seq_len, precision,
                             host_term, e2e)
        return out

    def _evaluate_structure(self, out: Evaluation, model: ModelSpec, S: Structure, classes: list[tuple],
                            idx: np.ndarray, sub: np.ndarray, unit: dict, p2p_t: np.ndarray, emb_t: np.ndarray,
                            seq_len: int, precision: str, host: HostOverhead | None, e2e: EndToEndTerms | None,
                            opts: ComposeOptions, detail: bool) -> None:
        pp, vpp = S.pp, S.vpp
        nch = pp * vpp
        R = len(idx)
        cn = np.array(S.counts, float)
        cf = np.zeros(nch)
        cf[0] = 1
        cl = np.zeros(nch)
        cl[-1] = 1
        zb = S.schedule in ZB_SCHEDULES
        cstage = np.array([chunk_rank(S.schedule, pp, i) for i in range(nch)]) if zb else np.arange(nch) % pp
        n_p2p = np.array([D.p2p_calls_per_pass(i, nch, pp, S.schedule) for i in range(nch)], float)
        dn = np.array(chunk_dense(S, model), float)   # a MoE model's dense layers per chunk (0 for a dense model)
        cls_of = np.array([classes.index((S.counts[i], int(i == 0), int(i == nch - 1), int(dn[i])))
                           for i in range(nch)])
        combo, cinv = _unique_rows(np.column_stack([sub[:, I_TP], dp_cp(sub), sub[:, I_ZERO], gather_mode(sub),
                                                    sub[:, I_EP], sub[:, I_GB], sub[:, I_F8P], sub[:, I_ETP]]))
        work = np.zeros((len(combo), len(classes), 8))
        for ci, (tp, dp, z, gm, ep, gb, f8p, etp) in enumerate(combo):
            for j, (n_l, f, l_, d_) in enumerate(classes):
                c = self._classes[(model, seq_len, precision, int(tp), pp, int(dp), int(z), int(gm), int(ep), int(gb),
                                   int(f8p), n_l, f, l_, d_, int(etp))]
                work[ci, j] = (c.optimizer_s, c.dp_sync_s, c.param_gather_s, c.zf_total, c.zf_unit, c.zb_total,
                               c.zb_unit, c.accum_s)
                if S.schedule == "dualpipe":
                    work[ci, j, 1] = self._dualpipe_grad_sync(model, seq_len, precision, int(tp), pp, int(dp), int(z),
                                                              int(gm), int(ep), int(gb), int(f8p), n_l, f, l_, d_)
        W = work[cinv][:, cls_of, :]          # [R, chunks, 8]

        def chunks_of(f: str) -> np.ndarray:   # [R, chunks]
            out = (cn * unit["layer"][f][idx][:, None] + cf * unit["first"][f][idx][:, None]
                   + cl * unit["last"][f][idx][:, None])
            if dn.any():   # a MoE model's leading dense layers instead of MoE layers
                out = out + dn * (unit["dense"][f][idx] - unit["layer"][f][idx])[:, None]
            return out
        fc, bc, rcp, ft, bt, fcp, bcp, fep, bep = (chunks_of(f) for f in ("fc", "bc", "rc", "ft", "bt", "fcp", "bcp",
                                                                          "fep", "bep"))
        # zero-bubble schedules: W's share of the sampled backward compute, kept through the end-to-end terms below
        w_share = (np.where(bc > 0, chunks_of("bw") / np.where(bc > 0, bc, 1.0), 0.0) if zb else None)
        m_r = sub[:, I_M].astype(float)
        if model.is_moe and sub[:, I_MO].any():
            # the dispatch / combine overlap (Layout.moe_overlap): what the paired passes hide (moe_overlap_hidden)
            on = sub[:, I_MO].astype(float) * moe_overlap_paired_share(m_r, pp, vpp)
            fep = fep - on[:, None] * chunks_of("hfep")
            bep = bep - on[:, None] * chunks_of("hbep")
        own = _own_rows(e2e, sub)   # the rows the own-runs factors apply to (the runs' frameworks)
        if e2e is not None and e2e.ep_factor != 1.0:
            # a platform calibrated on its own runs: the expert-parallel dispatch / combine's efficiency (what is left
            # of it after the overlap), on the runs' frameworks
            ef = np.where(own, e2e.ep_factor, 1.0)[:, None]
            fep, bep = fep * ef, bep * ef
        # every micro-batch after the first adds its gradients into the earlier ones' (predictor.model.frameworks): the
        # pass ends that micro-batch's backward, so a micro-batch's backward carries (m - 1) / m of it on average
        acc_share = separate_accumulation(sub, self.platform) * (m_r - 1.0) / m_r
        kf = e2e.kind_factors if e2e is not None else (1.0, 1.0, 1.0)
        if kf != (1.0, 1.0, 1.0):
            # a platform calibrated on its own runs: sustained speed per kind of work (GEMM, attention, memory-bound)
            g_, a_, m_ = (np.where(own, f, 1.0)[:, None] for f in kf)
            fa, ba, ra, fm, bm, rm = (chunks_of(f) for f in ("fa", "ba", "ra", "fm", "bm", "rm"))
            sampled_k = fc + bc + W[..., 7] * acc_share[:, None]
            fc = g_ * fc + (a_ - g_) * fa + (m_ - g_) * fm
            bc = g_ * bc + (a_ - g_) * ba + (m_ - g_) * bm
            rcp = g_ * rcp + (a_ - g_) * ra + (m_ - g_) * rm
            bc = bc + m_ * W[..., 7] * acc_share[:, None]   # the accumulation pass: memory-bound
        else:
            bc = bc + W[..., 7] * acc_share[:, None]
            sampled_k = fc + bc
        sampled = sampled_k
        alpha = e2e.compute_factor if e2e is not None else 1.0
        beta = e2e.power_factor if e2e is not None else 0.0
        kappa = e2e.contention if e2e is not None else 0.0
        if alpha != 1.0:  # kernels in a sustained step run slower than sampled in isolation (predictor.step.terms)
            fc, bc, rcp = fc * alpha, bc * alpha, rcp * alpha
        if _capped(e2e):
            # ... no tensor-core kernel faster than MAMF / (1 + beta) over a sustained step (predictor.step.terms)
            fx, bx, rx = (chunks_of(f) for f in ("fx", "bx", "rx"))
            fc, bc, rcp = fc + fx, bc + bx, rcp + rx
        elif beta != 0.0:   # ... in proportion to the tensor-core work they do at full power (predictor.step.terms)
            fi, bi, ri = (chunks_of(f) for f in ("fi", "bi", "ri"))
            fc, bc, rcp = fc + beta * fi, bc + beta * bi, rcp + beta * ri
        if e2e is not None and e2e.speed_spread > 0:
            # the slowest of the job's GPUs sets the pace of every synchronised step (predictor.step.terms)
            slow = (1.0 + e2e.speed_spread * slowest_of(sub[:, I_GPUS]))[:, None]
            fc, bc, rcp = fc * slow, bc * slow, rcp * slow
        ppc = n_p2p[None, :] * p2p_t[:, None]
        if e2e is not None and e2e.network_factor != 1.0:
            # a platform calibrated on its own runs: the network's efficiency where the job spans nodes (the
            # data-parallel and pipeline traffic crossing them)
            span = np.where((sub[:, I_GPUS] > self.platform.gpus_per_node) & own, e2e.network_factor, 1.0)
            ppc = ppc * span[:, None]
            W = W.copy()
            W[..., 1:7] = W[..., 1:7] * span[:, None, None]
        zf_tot, zf_unit, zb_tot, zb_unit = W[..., 3], W[..., 4], W[..., 5], W[..., 6]
        # ZeRO-2/3: prefetched under compute; what compute cannot cover is exposed, and at least one unit
        fdp = np.where(zf_tot > 0, np.maximum(zf_unit, zf_tot - fc), 0.0)
        bdp = np.where(zb_tot > 0, np.maximum(zb_unit, zb_tot - bc), 0.0)
        if kappa > 0:  # the overlapped part slows the compute it shares the GPU with
            fc = fc + kappa * np.maximum(0.0, zf_tot - fdp)
            bc = bc + kappa * np.maximum(0.0, zb_tot - bdp)
        if host is not None:
            bpasses = np.array([host.passes("bwd", rc) for rc in _recompute_names(sub)])[:, None]
            fh = host.extra_s(fc + ft + fep, cn[None, :], "fwd", "none")
            bh = host.extra_for_passes_s(bc + bt + bep, cn[None, :], bpasses)
        elif e2e is not None and e2e.host:
            fh, bh = self._framework_host(e2e, sub, cn, vpp, fc + ft + fep, bc + bt + bep,
                                          (cn - dn) if model.is_moe else None,
                                          model.num_experts / np.maximum(sub[:, I_EP], 1) if model.is_moe else None)
        else:
            fh = bh = np.zeros_like(fc)
        onehot = (chunk_rank_matrix(S.schedule, pp, vpp) if zb
                  else (cstage[:, None] == np.arange(pp)[None, :]).astype(float))
        arr = mem.stage_memory_arrays(model, seq_len, precision, S.counts, pp, vpp, S.schedule,
                                      tp=sub[:, I_TP], dp=dp_cp(sub), zero_stage=sub[:, I_ZERO], cp=sub[:, I_CP],
                                      ep=sub[:, I_EP], etp=sub[:, I_ETP],
                                      micro_batch=sub[:, I_MB], num_micro_batches=sub[:, I_M],
                                      recompute=sub[:, I_RC], sequence_parallel=sub[:, I_SP], options=self.mopt,
                                      recompute_modules=sub[:, I_RCM], moe_dispatcher=sub[:, I_MD],
                                      comm=self.comm, grad_bytes=sub[:, I_GB], fp8_param=sub[:, I_F8P],
                                      offload=sub[:, I_OFF],
                                      fp32_shard=np.isin(sub[:, I_FW], [FRAMEWORKS.index(f)
                                                                        for f in mem.FSDP_FP32_SHARD]))
        fof, bof = self._offload_exposed(sub, arr, onehot, cn, unit, idx)
        fpp = bpp = ppc
        if S.schedule == "interleaved" and sub[:, I_OPP].any():
            # the pipeline's point-to-point overlap (Layout.overlap_p2p_comm): in the steady 1F1B phase a forward
            # chunk's send / receive runs under the backward chunk scheduled beside it and the other way round, never
            # hiding more than that compute; the warm-up / cool-down passes stay exposed (pp_overlap_share)
            share = (sub[:, I_OPP].astype(float) * pp_overlap_share(m_r, pp, vpp))[:, None]
            fpp = ppc - share * np.minimum(ppc, bc)
            bpp = ppc - share * np.minimum(ppc, fc)
        fwd = {"compute": fc, "host_overhead": fh, "tp_comm": ft, "cp_comm": fcp, "ep_comm": fep, "pp_comm": fpp,
               "dp_comm": fdp, "offload_comm": fof}
        bwd = {"compute": bc, "host_overhead": bh, "tp_comm": bt, "cp_comm": bcp, "ep_comm": bep, "pp_comm": bpp,
               "dp_comm": bdp, "offload_comm": bof}
        emb_s = ((cf + cl) > 0).astype(float) @ onehot * emb_t[:, None]
        if zb:
            # zb-v / dualpipe-v: embedding and LM head both on rank 0 (no tied-embedding sync); DualPipe: both on
            # each end rank (one sync per rank)
            emb_s = (0.0 * emb_s if S.schedule in V_SCHEDULES
                     else np.minimum(1.0, ((cf + cl) > 0).astype(float) @ onehot) * emb_t[:, None])
        ov_grad = sub[:, I_OGR].astype(bool) & opts.overlap_grad_reduce        # the platform may forbid it
        ov_gather = sub[:, I_OPG].astype(bool) & opts.overlap_param_gather
        comp: ArrayComposition = compose_arrays(
            fwd, bwd, rcp, cstage, pp=pp, vpp=vpp, schedule=S.schedule, m=m_r,
            dp_sync_s=W[..., 1] @ onehot, param_gather_s=W[..., 2] @ onehot, embedding_sync_s=emb_s,
            optimizer_s=W[..., 0] @ onehot, overlap_grad_reduce=ov_grad, overlap_param_gather=ov_gather,
            grad_buckets=opts.grad_buckets, contention=kappa,
            wgrad=None if w_share is None else w_share * bc)
        out.step_time_s[idx] = comp.step_time_s
        out.host_all_s[idx] = m_r * (fh + bh).sum(axis=1)
        out.terms_all_s[idx] = m_r * (fc + bc - sampled).sum(axis=1) + comp.contention_s
        out.pipeline_s[idx] = comp.pipeline_s
        out.critical_stage[idx] = comp.critical_stage
        for k, v in comp.breakdown_s.items():
            out.breakdown_s[k][idx] = v
        for k, v in comp.detail_s.items():
            out.detail_s[k][idx] = v
        # memory per stage (computed above)
        total = np.sum([arr[k] for k in MEMORY_PARTS], axis=0)
        ps = total.argmax(axis=1)
        rr = np.arange(R)
        out.peak_bytes[idx] = total[rr, ps]
        out.low_peak_bytes[idx] = (total - arr["allocator"] + arr["allocator_min"]).max(axis=1)
        out.peak_allocated_bytes[idx] = arr["allocated"].max(axis=1)
        out.peak_reserved_bytes[idx] = (arr["allocated"] + arr["allocator"]).max(axis=1)
        out.peak_stage[idx] = ps
        for k in MEMORY_PARTS:
            out.memory_parts[k][idx] = arr[k][rr, ps]
        if detail:
            for j, r in enumerate(idx):
                out.details[int(r)] = {
                    "structure": S, "chunk_stage": cstage, "chunk_layers": S.counts,
                    "fwd": {k: v[j] for k, v in fwd.items()}, "bwd": {k: v[j] for k, v in bwd.items()},
                    "recompute": rcp[j], "p2p_per_pass": n_p2p, "p2p_s": float(p2p_t[j]),
                    "tails": {"dp_sync_s": (W[..., 1] @ onehot)[j], "param_gather_s": (W[..., 2] @ onehot)[j],
                              "embedding_sync_s": emb_s[j], "optimizer_s": (W[..., 0] @ onehot)[j]},
                    "memory": {k: v[j] for k, v in arr.items()}, "classes": [classes[c] for c in cls_of],
                    "stage_finish_s": comp.stage_finish_s[j],
                    "wgrad": (w_share * bc)[j] if w_share is not None else np.zeros(nch)}

    def _offload_exposed(self, sub: np.ndarray, arr: dict[str, np.ndarray], onehot: np.ndarray, cn: np.ndarray,
                         unit: dict, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[R, chunks] seconds of activation offloading on the critical path, forward and backward, per micro-batch.

        Each offloaded layer moves its saved activations (`offload_layer_bytes`) to the host after its forward and
        back before its backward over the device's host link (`DeviceSpec.host_link_gbps`, per direction; one link
        per GPU, no contention between the GPUs of a node assumed). Transformer Engine overlaps the copy with the
        next layer's forward (the reload with the previous layer's backward, one layer of prefetch), so per layer
        exposed = max(0, transfer - one layer's forward (backward) compute), summed over the offloaded layers."""
        R, nch = len(sub), onehot.shape[0]
        off = sub[:, I_OFF].astype(float)
        if not off.any():
            return np.zeros((R, nch)), np.zeros((R, nch))
        bw = float(getattr(self.platform.device, "host_link_gbps", 0.0)) * 1e9
        if bw <= 0:
            from predictor.model.errors import InfeasibleConfig
            raise InfeasibleConfig("offload_activations", f"{self.platform.device.name} has no stated host-link "
                                                          "bandwidth, so the offload traffic cannot be timed.",
                                   "set offload_activations 0, or give the device's host_link_gbps (GB/s per "
                                   "direction) in a clusters file.")
        t = arr["offload_layer_bytes"] @ onehot.T / bw                        # [R, chunks]: one layer, one way
        share = cn / np.maximum(cn @ onehot @ onehot.T, 1.0)                   # a chunk's share of its stage's layers
        n = off[:, None] * share[None, :]
        f_l, b_l = unit["layer"]["fc"][idx][:, None], unit["layer"]["bc"][idx][:, None]
        return n * np.maximum(0.0, t - f_l), n * np.maximum(0.0, t - b_l)

    @staticmethod
    def _framework_host(e2e: EndToEndTerms, sub: np.ndarray, cn: np.ndarray, vpp: int, g_fwd: np.ndarray,
                        g_bwd: np.ndarray, moe_layers: np.ndarray | None = None,
                        local_experts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Host seconds each chunk's forward / backward adds per micro-batch, by each row's framework: the
        per-layer host time blended with the GPU time (the backward's passes include what recomputation adds,
        e2e.recompute_host_passes per recomputed layer), plus the per-micro-batch time of its stage split over
        the stage's chunk passes. `moe_layers` (a MoE model's MoE layers per chunk): each issues
        e2e.moe_passes_for(framework, local experts) dense layer passes of host time (measured,
        predictor.step.host_floor), `local_experts` per row (num_experts / ep) adding what their per-expert GEMMs
        issue."""
        R = len(sub)
        h = np.zeros(R)
        p = np.full(R, 2.0)
        u = np.zeros(R)
        moe_r = np.ones(R)
        loc = np.zeros(R) if local_experts is None else np.asarray(local_experts, float)
        for fi in np.unique(sub[:, I_FW]):
            t = e2e.host_for(FRAMEWORKS[int(fi)])
            if t is not None:
                sel = sub[:, I_FW] == fi
                h[sel], p[sel], u[sel] = t.host_s_per_layer_pass, t.blend_p, t.host_s_per_micro_batch
                moe_r[sel] = [e2e.moe_passes_for(FRAMEWORKS[int(fi)], float(n)) for n in loc[sel]]
        rp = e2e.recompute_host_passes
        bpasses = np.array([1.0 + rp * RECOMPUTE_PASSES.get(rc, 0.0) for rc in _recompute_names(sub)])[:, None]
        # layer passes of host time per chunk: a MoE layer counts moe_r dense ones
        ml = np.zeros_like(cn, dtype=float) if moe_layers is None else np.asarray(moe_layers, float)
        lp = cn[None, :] + (moe_r - 1.0)[:, None] * ml[None, :]
        per_pass = (u / (2.0 * vpp))[:, None]
        cg = sub[:, I_CG]
        if cg.any():   # CUDA graphs (Layout.cuda_graphs): captured parts' host time replaced by replays
            dense_cut, moe_cut, full = cuda_graph_cuts(e2e, cg)
            lp = np.maximum(0.0, lp - dense_cut[:, None] * (cn - ml)[None, :] - moe_cut[:, None] * ml[None, :])
            # full_iteration: no per-layer nor per-micro-batch host work; one replay per step, split over the step's
            # m x 2 x vpp chunk passes
            lp = np.where(full[:, None], 0.0, lp)
            one = e2e.cuda_graph_passes.get("replay", 0.0) * h / (sub[:, I_M].astype(float) * 2.0 * vpp)
            per_pass = np.where(full[:, None], one[:, None], per_pass)
        fh = blend(g_fwd, lp * h[:, None], p[:, None]) - g_fwd
        bh = blend(g_bwd, lp * h[:, None] * bpasses, p[:, None]) - g_bwd
        return fh + per_pass, bh + per_pass

    def _provenance(self, out: Evaluation, model: ModelSpec, rows: np.ndarray, structures: Sequence[Structure],
                    kinv: np.ndarray, parts: list[Parts], p2p_inv: np.ndarray, p2p: list, emb_inv: np.ndarray,
                    emb: list, seq_len: int, precision: str, host: HostOverhead | None,
                    e2e: EndToEndTerms | None = None) -> None:
        """Per row: seconds (and seconds x expected error) resting on each provenance, over every stage:
        per-micro-batch work x the micro-batches, plus the once-per-step work."""
        host_err = (host.cv_mape if host is not None and host.cv_mape is not None else ASSUMED_ERROR["host"])
        terms_err = terms_error(e2e)
        separate = separate_accumulation(rows, self.platform)
        for r in range(len(rows)):
            row = rows[r]
            S = structures[int(row[I_STRUCT])]
            pp, nch = S.pp, S.pp * S.vpp
            m = float(row[I_M])
            P = parts[kinv[r]]
            acc: dict[str, list[float]] = {}

            def add(d: dict[str, list[float]], k: float, acc: dict[str, list[float]] = acc) -> None:
                for prov, (s, se) in d.items():
                    v = acc.setdefault(prov, [0.0, 0.0])
                    v[0] += s * k
                    v[1] += se * k
            L = float(sum(S.counts))
            dense = chunk_dense(S, model)
            n_dense = float(sum(dense))
            add(P.layer.prov, m * (L - n_dense))
            if n_dense:
                add((P.dense or P.layer).prov, m * n_dense)
            add(P.first.prov, m)
            add(P.last.prov, m)
            t_p2p, prov_p2p, e_p2p = p2p[p2p_inv[r]]
            n_p2p = sum(D.p2p_calls_per_pass(i, nch, pp, S.schedule) for i in range(nch))
            if t_p2p > 0 and n_p2p:
                add({prov_p2p: [t_p2p, t_p2p * e_p2p]}, 2.0 * m * n_p2p)
            t_emb, prov_emb, e_emb = emb[emb_inv[r]]
            if t_emb > 0 and S.schedule not in V_SCHEDULES:
                add({prov_emb: [t_emb, t_emb * e_emb]}, 2.0 if nch > 1 else 1.0)
            acc_k = float(separate[r]) * (m - 1.0)
            for i in range(nch):
                c = self.chunk_class(model, seq_len, precision, row, pp,
                                     (S.counts[i], int(i == 0), int(i == nch - 1), dense[i]))
                add(c.prov_step, 1.0)
                add(c.prov_mb, m)
                if acc_k:
                    add(c.prov_accum, acc_k)
            h = float(out.host_all_s[r])
            if h > 0:
                add({HOST_PROVENANCE if host is not None else TERMS_HOST_PROVENANCE: [h, h * host_err]}, 1.0)
            x = float(out.terms_all_s[r])
            if x > 0:
                add({TERMS_PROVENANCE: [x, x * terms_err]}, 1.0)
            out.provenance_s[r] = acc


HOST_PROVENANCE = "host overhead (fitted on measured runs)"
TERMS_HOST_PROVENANCE = "framework host overhead (end-to-end terms)"


def cuda_graph_cuts(e2e: EndToEndTerms, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dense layer passes a dense layer pass sheds, those a MoE layer pass sheds, full_iteration) per row of
    Layout.cuda_graphs masks (specs.cuda_graphs_mask). A captured part's host time (e2e.cuda_graph_passes, measured:
    `bench host-floor --cuda-graphs`) is replaced by a replay: each layer whose captured parts apply to it replays one
    graph per pass (Megatron-Core's TransformerLayer replays the layer's captured parts as one Transformer Engine
    graphed callable), so a layer sheds sum(parts) - replay. Dense layers: attn, mlp; MoE layers: attn, moe_router,
    moe_preprocess. InfeasibleConfig on cuda_graphs where a row captures a part and the parts are not measured."""
    masks = np.asarray(masks, dtype=np.int64)
    full = (masks & CUDA_GRAPHS_FULL_BIT) > 0
    part = {s: ((masks >> i) & 1).astype(float) for i, s in enumerate(CUDA_GRAPH_SCOPES)}
    cgp = e2e.cuda_graph_passes
    if ((masks & ~CUDA_GRAPHS_FULL_BIT) > 0).any() and not all(k in cgp for k in (*CUDA_GRAPH_SCOPES, "replay")):
        from predictor.model.errors import InfeasibleConfig
        raise InfeasibleConfig("cuda_graphs", "the host time of the parts CUDA graphs capture is not measured (no "
                                              "'cuda_graphs' record in the saved host floor).",
                               "run `python -m bench host-floor --cuda-graphs --save`, or use cuda_graphs none or "
                               "full_iteration.")
    rep = cgp.get("replay", 0.0)
    d_on = np.maximum(part["attn"], part["mlp"])
    m_on = np.maximum(part["attn"], part["moe_router"])
    dense_cut = (part["attn"] * cgp.get("attn", 0.0) + part["mlp"] * cgp.get("mlp", 0.0)) - d_on * rep
    moe_cut = (part["attn"] * cgp.get("attn", 0.0) + part["moe_router"] * cgp.get("moe_router", 0.0)
               + part["moe_preprocess"] * cgp.get("moe_preprocess", 0.0)) - m_on * rep
    return dense_cut, moe_cut, full


def _capped(e2e: EndToEndTerms | None) -> TypeGuard[EndToEndTerms]:
    """Whether these terms apply the power factor as the sustained matmul-rate cap (the units' "fx" / "bx" / "rx"
    fields, built in `Engine.evaluate`, used in `Engine._evaluate_structure`)."""
    return e2e is not None and e2e.power_form == "cap" and e2e.power_factor != 0.0


def terms_error(e2e: EndToEndTerms | None) -> float:
    """Expected relative error of what the end-to-end terms add: their source-held-out MAPE where fitted."""
    if e2e is None:
        return ASSUMED_ERROR["host"]
    v = (e2e.validation or {}).get("held_out_mape")
    return float(v) if isinstance(v, (int, float)) and v == v else ASSUMED_ERROR["host"]


def chunk_dense(s: Structure, model: ModelSpec) -> list[int]:
    """A MoE model's dense-MLP layers in each chunk of `s` (all zero for a dense model, whose layer unit is the
    dense layer)."""
    if not model.has_dense_layers:
        return [0] * len(s.counts)
    from predictor.model.params import chunk_dense_layers
    return chunk_dense_layers(model, s.counts)


def structure_classes(s: Structure, model: ModelSpec) -> list[tuple[int, int, int, int]]:
    """The distinct (layers, is first, is last, dense layers) chunk kinds of a pipeline structure of `model` (a MoE
    model's leading dense layers counted apart)."""
    nch = s.pp * s.vpp
    dense = chunk_dense(s, model)
    return sorted({(s.counts[i], int(i == 0), int(i == nch - 1), dense[i]) for i in range(nch)})


UNIT_FIELDS = ("fc", "bc", "rc", "ft", "bt", "fi", "bi", "ri", "fcp", "bcp", "fep", "bep", "fa", "ba", "ra", "fm", "bm",
               "rm", "hfep", "hbep", "bw")


def _steady_share(m: np.ndarray, vpp: int, exposed: float) -> np.ndarray:
    """Share of a rank's m x vpp forward (and backward) chunk passes beyond the first `exposed` ones."""
    total = np.maximum(np.asarray(m, float) * vpp, 1.0)
    return np.clip((total - exposed) / total, 0.0, 1.0)


def interleaved_warmup_passes(pp: int, vpp: int) -> float:
    """Megatron-Core's interleaved warm-up on the first stage, 2 (pp - 1) + (vpp - 1) pp passes
    (num_warmup_microbatches on rank 0, the most of any rank)."""
    return 2.0 * (pp - 1) + (vpp - 1) * pp


def pp_overlap_share(m: np.ndarray, pp: int, vpp: int) -> np.ndarray:
    """Share of a rank's chunk passes whose pipeline sends / receives overlap compute under the interleaved
    schedule's overlap_p2p_comm (megatron/core/pipeline_parallel/schedules.py forward_backward_pipelining_with_
    interleaving: asynchronous send / receive in the steady 1F1B phase; the warm-up and cool-down passes wait on them,
    'The PP communications in pipeline fill and flush are still exposed', NeMo / Megatron-Bridge's communication
    overlap guide): of m x vpp forward (and backward) passes, those beyond the first stage's warm-up
    (`interleaved_warmup_passes`)."""
    return _steady_share(m, vpp, interleaved_warmup_passes(pp, vpp))


def moe_overlap_paired_share(m: np.ndarray, pp: int, vpp: int) -> np.ndarray:
    """Share of a rank's forward / backward chunk passes that run paired under Megatron-Core's dispatch / combine
    overlap (overlap_moe_expert_parallel_comm; megatron/core/pipeline_parallel/combined_1f1b.py and schedules.py):
    the combined 1F1B step runs one micro-batch's forward merged with another's backward, so each one's all-to-all
    hides under the other's compute of the same layer (`UnitTimes.hfep` = min(fep, bc), `hbep` = min(bep, fc):
    never more than that compute). The passes without a partner stay exposed: with pp = 1 the first forward and the
    last backward (m - 1 of m paired), interleaved the first stage's warm-up (`interleaved_warmup_passes`) + 1
    passes (one more with the overlap on), of m x vpp."""
    return _steady_share(m, vpp, 1.0 if pp <= 1 else interleaved_warmup_passes(pp, vpp) + 1.0)


def _own_rows(e2e: EndToEndTerms | None, rows: np.ndarray) -> np.ndarray:
    """Per row: whether the own-runs factors of `e2e` (predictor.calibrate.runs) apply to it, i.e. its framework is
    one the runs used (`EndToEndTerms.frameworks`; empty: every framework)."""
    if e2e is None or not e2e.frameworks:
        return np.ones(len(rows), dtype=bool)
    return np.isin(rows[:, I_FW], [FRAMEWORKS.index(f) for f in e2e.frameworks])


def _per_framework(rows: np.ndarray, platform: Platform, rule: Any) -> np.ndarray:
    """Per row: int(rule(its framework, platform))."""
    flags = np.array([int(rule(f, platform)) for f in FRAMEWORKS])
    return flags[rows[:, I_FW].astype(int)]


def separate_accumulation(rows: np.ndarray, platform: Platform) -> np.ndarray:
    """Per row: 1 where its framework adds each micro-batch's gradients in a pass of its own on this platform
    (predictor.model.frameworks.separate_grad_accumulation), else 0."""
    return _per_framework(rows, platform, separate_grad_accumulation)


def fused_kernels(rows: np.ndarray, platform: Platform) -> np.ndarray:
    """Per row: 1 where its framework runs fused memory-bound kernels on this platform (predictor.model.frameworks:
    GPU kernels; a CPU platform runs the sampled PyTorch kernels whatever the framework), else 0."""
    return _per_framework(rows, platform, fused_kernels_on)


def a2a_ranks(model: ModelSpec, rows: np.ndarray, platform: Platform) -> np.ndarray:
    """Per row: ranks of each all-to-all group of its context parallelism (decompose.cp_a2a_ranks; 1 = the p2p
    ring alone, every row of a layout without all-to-all CP)."""
    out = np.ones(len(rows), dtype=np.int64)
    sel = np.nonzero((rows[:, I_CPC] > 0) & (rows[:, I_CP] > 1))[0]
    if len(sel):
        u, inv = _unique_rows(rows[sel][:, [I_TP, I_CP, I_CPC, I_CPA]])
        vals = np.array([D.cp_a2a_ranks(model, int(t), int(c), CP_COMMS[int(k)], int(a) or None,
                                        platform.gpus_per_node) for t, c, k, a in u], dtype=np.int64)
        out[sel] = vals[inv]
    return out


def unit_key(layout: Layout, platform: Platform, model: ModelSpec) -> tuple[int, ...]:
    """The unit key (tp, micro_batch, sp, recompute, cp, ep, fused kernels, TP overlap, CP all-to-all ranks, expert
    TP, recomputed modules, MoE token dispatcher) of one layout of `model` on `platform`."""
    fused = fused_kernels_on(layout.framework, platform)
    a2a = D.cp_a2a_ranks(model, layout.tp, layout.cp, layout.cp_comm, layout.cp_a2a_size, platform.gpus_per_node)
    return (layout.tp, layout.micro_batch, int(layout.sequence_parallel), RECOMPUTE.index(layout.recompute),
            layout.cp, layout.ep, int(fused), int(layout.overlap_tp_comm), a2a, layout.expert_tp,
            mem.recompute_mask(model, layout), MOE_DISPATCHERS.index(layout.moe_dispatcher))


def unit_key_columns(rows: np.ndarray, platform: Platform, model: ModelSpec) -> np.ndarray:
    """Per row, the columns of its unit key (`unit_key`'s order: tp, micro_batch, sp, recompute, cp, ep, fused
    kernels, TP overlap, CP all-to-all ranks, expert TP, recomputed modules, MoE token dispatcher)."""
    return np.column_stack([rows[:, [I_TP, I_MB, I_SP, I_RC, I_CP, I_EP]], fused_kernels(rows, platform),
                            rows[:, I_OTP], a2a_ranks(model, rows, platform), rows[:, I_ETP], rows[:, I_RCM],
                            rows[:, I_MD]])


def unit_keys(rows: np.ndarray, platform: Platform, model: ModelSpec) -> set[tuple[int, ...]]:
    """The units (`unit_key_columns`) `rows` of `model` need on `platform`."""
    u, _ = _unique_rows(unit_key_columns(rows, platform, model))
    return {tuple(int(v) for v in k) for k in u}


ZERO2_GATHER = ("per_micro_batch", "per_step")


def gather_mode(rows: np.ndarray) -> np.ndarray:
    """Per row: index into ZERO2_GATHER of its framework's ZeRO-2 parameter gather."""
    modes = np.array([ZERO2_GATHER.index(FRAMEWORK_SPECS[f].zero2_gather) for f in FRAMEWORKS])
    return modes[rows[:, I_FW]]


def class_keys(rows: np.ndarray, struct_classes: list[list[tuple[int, int, int, int]]]) -> set[tuple]:
    """The (tp, pp, dp, zero, gather mode, ep, gradient bytes, FP8 primary weights, layers, first, last, dense)
    chunk classes `rows` need."""
    out: set[tuple] = set()
    g = gather_mode(rows)
    for tp, pp, dp, z, gm, ep, gb, f8p, st, etp in _unique_rows(np.column_stack(
            [rows[:, I_TP], rows[:, I_PP], dp_cp(rows), rows[:, I_ZERO], g, rows[:, I_EP], rows[:, I_GB],
             rows[:, I_F8P], rows[:, I_STRUCT], rows[:, I_ETP]]))[0]:
        for (cn, cf, cl, dn) in struct_classes[st]:
            out.add((int(tp), int(pp), int(dp), int(z), int(gm), int(ep), int(gb), int(f8p), cn, cf, cl, dn,
                     int(etp)))
    return out

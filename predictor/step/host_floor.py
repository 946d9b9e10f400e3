"""The measured floor of an eager framework's host time per transformer layer pass.

A GPU step's host (framework) time is fitted on end-to-end runs (`predictor.calibrate.framework`), but
only runs whose kernels are short identify it: on large models the GPU hides it and the fit cannot tell
0 ms from 1 ms. Fitted without such runs the term came out at zero, which no eager framework achieves:
before any kernel runs, Python, the PyTorch dispatcher and autograd must issue every operator of the
layer. That part we can measure on a CPU: `python -m bench host-floor` times a Megatron-style eager GPT
layer (unfused: layer norms, QKV, baddbmm, masked softmax, dropouts, bmm, projections, GeLU MLP,
residuals) forward and backward at tiny shapes, where the arithmetic is negligible and what remains is
the issuing cost, as the slope over the number of layers (so the loss and the backward call's fixed
cost drop out). The same stacks under full activation recomputation give the host passes recomputation
adds per layer (its no-grad forward, the checkpoint machinery and the re-run forward: about 1.6 plain
passes, not the 1 a re-run forward alone would be).

The result, `models_store/host_floor.json`, is a lower bound, not an estimate: a GPU host additionally
pays the CUDA launch call per kernel, the caching allocator, TP collectives' calls and the framework's
own wrappers, and the CPU that measured it may be faster than the training node's. Measured on several
CPUs (each no slower than the training nodes' host CPUs: a DGX A100's EPYC 7742 is an older core than
the EPYC VMs here) every measurement is such a bound, so the highest is the tightest: `bench host-floor
--save` keeps the saved floor of another machine when it is higher (`kept_floor_reason`). The fit uses it as
the lower bound (and the prior) of host_s_per_layer_pass of the frameworks it applies to; where end-to-
end runs identify a larger value, they win.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predictor import paths
from predictor.model.frameworks import FRAMEWORKS
from predictor.model.specs import CUDA_GRAPH_SCOPES
from predictor.paths import ArtifactError, check_number

HOST_FLOOR_FILE = "host_floor.json"
MAX_FLOOR_S = 2e-3   # the fit's upper bound of host time per layer pass: a floor above it is a broken file
# full recomputation re-runs a layer's forward (1 pass) plus a no-grad forward and the checkpoint machinery:
# fewer than half a pass or more than 4 is not that
MIN_RECOMPUTE_PASSES, MAX_RECOMPUTE_PASSES = 0.5, 4.0
# a MoE layer issues what a dense layer does and more (router, aux loss, permutations, grouped GEMMs): below 1 or
# above 10 dense layer passes is not that
MIN_MOE_PASSES, MAX_MOE_PASSES = 1.0, 10.0
# what one local expert adds to a MoE layer pass where its grouped GEMMs issue one GEMM per expert (Transformer
# Engine's GroupedLinear): a handful of GEMM calls forward and backward, never a whole dense layer pass
MAX_MOE_PASSES_PER_EXPERT = 1.0
# a part of a layer Megatron-Core's CUDA graphs capture (attn, mlp, moe_router, moe_preprocess) issues at most what a
# MoE layer issues; one graph replay (an autograd function and its static-buffer copies) a fraction of a dense pass
MAX_SCOPE_PASSES = MAX_MOE_PASSES
MAX_REPLAY_PASSES = 0.5
# the parts the "cuda_graphs" record measures: Layout.cuda_graphs' per-layer scopes
CUDA_GRAPH_PARTS = CUDA_GRAPH_SCOPES


@dataclass(frozen=True)
class HostFloor:
    host_s_per_layer_pass: float
    applies_to: tuple[str, ...]
    kernels_per_layer_pass: float | None = None
    recompute_host_passes: float | None = None   # host passes full recomputation adds per layer (None: 1)
    machine: str = ""
    measured_at: str = ""
    source: str = ""
    machine_id: str = ""     # the fingerprint of the measuring CPU (bench.env), "" when not recorded
    # host time of a Megatron-Core MoE layer pass in dense layer passes (`bench host-floor --moe`, kept under "moe"),
    # and the frameworks it applies to; None: not measured
    moe_layer_host_passes: float | None = None
    moe_applies_to: tuple[str, ...] = ()
    # what each local expert adds to a MoE layer pass, in dense layer passes, where the grouped GEMMs issue one GEMM
    # per expert (Transformer Engine's GroupedLinear; `bench host-floor --moe`); None: not measured. The measured
    # layer had moe_reference_experts local experts (the record's layer.experts)
    moe_passes_per_local_expert: float | None = None
    moe_reference_experts: int = 8
    # dense layer passes of host time each part Megatron-Core's per-layer CUDA graphs capture takes (CUDA_GRAPH_PARTS)
    # and one replay takes ("replay"), `bench host-floor --cuda-graphs`, kept under "cuda_graphs"; None: not measured
    cuda_graph_passes: dict[str, float] | None = None
    cuda_graph_applies_to: tuple[str, ...] = ()

    def moe_passes_for(self, framework: str) -> float:
        """Dense layer passes of host time one MoE layer pass of `framework` takes as measured, with
        moe_reference_experts local experts (1 where not measured); `moe_passes_per_expert_for` gives what each further
        local expert adds."""
        if self.moe_layer_host_passes is None or framework not in self.moe_applies_to:
            return 1.0
        return self.moe_layer_host_passes

    def moe_passes_per_expert_for(self, framework: str) -> float:
        """Dense layer passes each local expert adds to a MoE layer pass of `framework` (0 where not measured)."""
        if self.moe_passes_per_local_expert is None or framework not in self.moe_applies_to:
            return 0.0
        return self.moe_passes_per_local_expert

    def moe_passes_without_experts(self, passes: float) -> float:
        """`passes` of the measured MoE layer (moe_layer_host_passes) less what its local experts' GEMMs add (the
        intercept of passes over local experts), never below one dense pass."""
        per = self.moe_passes_per_local_expert or 0.0
        return max(MIN_MOE_PASSES, passes - per * self.moe_reference_experts)

    def for_framework(self, framework: str) -> float:
        """The floor of this framework (0 for one the measurement does not apply to)."""
        return self.host_s_per_layer_pass if framework in self.applies_to else 0.0

    def in_words(self) -> str:
        k = "" if self.kernels_per_layer_pass is None else f", {self.kernels_per_layer_pass:.0f} kernels"
        if self.recompute_host_passes is not None:
            k += f", full recomputation {self.recompute_host_passes:.2f} passes"
        return (f"{self.host_s_per_layer_pass * 1e3:.2f} ms per layer pass{k}, measured on {self.machine or 'a CPU'}"
                f"{' at ' + self.measured_at if self.measured_at else ''}; applies to {', '.join(self.applies_to)}")


def host_floor_from_dict(d: Any, path: str | Path = HOST_FLOOR_FILE) -> HostFloor:
    """Parsed and checked; ArtifactError naming the file and the field on a bad value."""
    if not isinstance(d, dict):
        raise ArtifactError(path, None, f"must be a JSON object, not {type(d).__name__}")
    floor = float(check_number(path, "host_s_per_layer_pass", d.get("host_s_per_layer_pass"), ge=0.0,
                               le=MAX_FLOOR_S))
    applies = d.get("applies_to")
    if not isinstance(applies, list) or not applies:
        raise ArtifactError(path, "applies_to", f"must be a non-empty list of frameworks ({', '.join(FRAMEWORKS)})")
    for f in applies:
        if f not in FRAMEWORKS:
            raise ArtifactError(path, "applies_to", f"unknown framework {f!r} (use {', '.join(FRAMEWORKS)})")
    kernels = check_number(path, "kernels_per_layer_pass", d.get("kernels_per_layer_pass"), ge=0.0, optional=True)
    rp = check_number(path, "recompute_host_passes", d.get("recompute_host_passes"), ge=MIN_RECOMPUTE_PASSES,
                      le=MAX_RECOMPUTE_PASSES, optional=True)
    machine = d.get("machine") or {}
    short = str(machine.get("short", "")) if isinstance(machine, dict) else str(machine)
    mid = str(machine.get("id", "")) if isinstance(machine, dict) else ""
    moe_passes, moe_applies = moe_from_dict(d.get("moe"), path)
    per_expert, ref = moe_per_expert_from_dict(d.get("moe"), path)
    cg, cg_applies = cuda_graphs_from_dict(d.get("cuda_graphs"), path)
    return HostFloor(floor, tuple(str(f) for f in applies), None if kernels is None else float(kernels),
                     None if rp is None else float(rp), short, str(d.get("measured_at", "")), str(d.get("source", "")),
                     mid, moe_passes, moe_applies, per_expert, ref, cg, cg_applies)


def cuda_graphs_from_dict(c: Any, path: str | Path = HOST_FLOOR_FILE) -> tuple[dict[str, float] | None,
                                                                             tuple[str, ...]]:
    """({part: dense layer passes, "replay": passes}, frameworks) of the "cuda_graphs" record (`bench host-floor
    --cuda-graphs`); (None, ()) without one; ArtifactError naming the field on a bad value."""
    if c is None:
        return None, ()
    if not isinstance(c, dict):
        raise ArtifactError(path, "cuda_graphs", f"must be a JSON object, not {type(c).__name__}")
    parts = c.get("scope_host_passes")
    if not isinstance(parts, dict):
        raise ArtifactError(path, "cuda_graphs.scope_host_passes", "must be a mapping of part -> dense layer passes")
    out: dict[str, float] = {}
    for k in CUDA_GRAPH_PARTS:
        out[k] = float(check_number(path, f"cuda_graphs.scope_host_passes.{k}", parts.get(k), ge=0.0,
                                    le=MAX_SCOPE_PASSES))
    out["replay"] = float(check_number(path, "cuda_graphs.replay_host_passes", c.get("replay_host_passes"), ge=0.0,
                                       le=MAX_REPLAY_PASSES))
    applies = c.get("applies_to")
    if not isinstance(applies, list) or not applies or any(f not in FRAMEWORKS for f in applies):
        raise ArtifactError(path, "cuda_graphs.applies_to",
                            f"must be a non-empty list of frameworks ({', '.join(FRAMEWORKS)})")
    return out, tuple(str(f) for f in applies)


def save_cuda_graph_shares(record: dict[str, Any], models_dir: str | Path | None = None) -> Path:
    """Keep a `bench host-floor --cuda-graphs` record under "cuda_graphs" in the saved host floor, the rest untouched
    (ratios to the dense layer measured together, as the "moe" record). Refuses without a saved floor, or a record
    that would not load back."""
    return _save_record("cuda_graphs", record, "the CUDA graph record", models_dir)


def _save_record(key: str, record: dict[str, Any], what: str, models_dir: str | Path | None) -> Path:
    """The saved host floor with `record` under `key`, written atomically after it loads back; refused without a
    saved floor to add it to."""
    p = paths.shared_artifact(HOST_FLOOR_FILE, models_dir)
    d = paths.read_json(p)
    if not isinstance(d, dict):
        raise ArtifactError(p, None, f"no saved host floor to add {what} to: run `bench host-floor --save` first")
    d = {**d, key: record}
    host_floor_from_dict(d, p)
    return paths.write_json_atomic(p, d)


def moe_from_dict(m: Any, path: str | Path = HOST_FLOOR_FILE) -> tuple[float | None, tuple[str, ...]]:
    """(moe_layer_host_passes, frameworks) of the "moe" record (`bench host-floor --moe`); (None, ()) without one;
    ArtifactError naming the field on a bad value."""
    if m is None:
        return None, ()
    if not isinstance(m, dict):
        raise ArtifactError(path, "moe", f"must be a JSON object, not {type(m).__name__}")
    passes = float(check_number(path, "moe.moe_layer_host_passes", m.get("moe_layer_host_passes"),
                                ge=MIN_MOE_PASSES, le=MAX_MOE_PASSES))
    applies = m.get("applies_to")
    if not isinstance(applies, list) or not applies or any(f not in FRAMEWORKS for f in applies):
        raise ArtifactError(path, "moe.applies_to", f"must be a non-empty list of frameworks ({', '.join(FRAMEWORKS)})")
    return passes, tuple(str(f) for f in applies)


def moe_per_expert_from_dict(m: Any, path: str | Path = HOST_FLOOR_FILE) -> tuple[float | None, int]:
    """(moe_host_passes_per_local_expert, the measured layer's local experts) of the "moe" record: (None, 8) without
    it (a record measured before the per-expert GEMMs were); ArtifactError naming the field on a bad value."""
    if not isinstance(m, dict) or m.get("moe_host_passes_per_local_expert") is None:
        return None, 8
    per = float(check_number(path, "moe.moe_host_passes_per_local_expert", m.get("moe_host_passes_per_local_expert"),
                             ge=0.0, le=MAX_MOE_PASSES_PER_EXPERT))
    layer = m.get("layer")
    ref = check_number(path, "moe.layer.experts", layer.get("experts") if isinstance(layer, dict) else None, ge=1,
                       integer=True)
    return per, int(ref)


def save_moe_passes(record: dict[str, Any], models_dir: str | Path | None = None) -> Path:
    """Keep a `bench host-floor --moe` record under "moe" in the saved host floor, the dense floor untouched (the
    record is a ratio of two slopes measured together, so it holds whichever CPU measured the dense floor). Refuses
    without a saved floor to add it to, or a record that would not load back."""
    return _save_record("moe", record, "the MoE record", models_dir)


def kept_floor_reason(existing: HostFloor | None, new: HostFloor) -> str | None:
    """Why a new measurement should not replace the saved floor (None: it should).

    Each measurement is a lower bound of a training host's time (on a CPU no slower than the training nodes'),
    so of two bounds from different machines the higher is the tighter, and the one kept; a machine's new
    measurement replaces its own older one either way."""
    if existing is None or (existing.machine_id and existing.machine_id == new.machine_id):
        return None
    if new.host_s_per_layer_pass >= existing.host_s_per_layer_pass:
        return None
    return (f"the saved floor, {existing.host_s_per_layer_pass * 1e3:.2f} ms per layer pass measured on "
            f"{existing.machine or 'another CPU'}, is the tighter lower bound than this one "
            f"({new.host_s_per_layer_pass * 1e3:.2f} ms on {new.machine or 'this CPU'}); it is kept")


def save_tighter_floor(record: dict[str, Any], models_dir: str | Path | None = None, replace: bool = False
                       ) -> tuple[Path | None, str | None]:
    """(path written, None), or (None, why the saved floor was kept: `kept_floor_reason`); `replace` writes anyway.
    A saved file that does not load is replaced."""
    new = host_floor_from_dict(record)
    existing, _warning = load_host_floor(models_dir)
    why = None if replace else kept_floor_reason(existing, new)
    if why is not None:
        return None, why
    return save_host_floor(record, models_dir), None


def load_host_floor(models_dir: str | Path | None = None) -> tuple[HostFloor | None, str | None]:
    """(floor, None); (None, None) without the file; (None, warning naming the file and field) when broken."""
    p = paths.shared_artifact(HOST_FLOOR_FILE, models_dir)
    return paths.load_checked(p, lambda d: host_floor_from_dict(d, p))


def save_host_floor(record: dict[str, Any], models_dir: str | Path | None = None) -> Path:
    """Write the record atomically, refusing one that would not load back."""
    p = paths.shared_artifact(HOST_FLOOR_FILE, models_dir)
    host_floor_from_dict(record, p)
    return paths.write_json_atomic(p, record)

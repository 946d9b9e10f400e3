"""End-to-end terms: what separately timed GPU kernels and collectives miss inside a real training step.

Operator samples are short, warmed-up, isolated kernels; a training step runs them back to back for
minutes at full power, beside NCCL kernels, issued by an eager framework. Three terms capture that,
fitted on measured end-to-end runs of real frameworks (`predictor.calibrate.framework`) and scored
leave-one-source-out (each source predicted by terms fitted without it):

  compute_factor   alpha: GPU kernel time in a sustained step / time sampled in isolation (cold caches
                   between kernels). Multiplies every GPU operator time.
  power_factor     beta, in one of two forms (power_form):
                   'linear': seconds added per second of tensor-core work at the achievable matmul throughput
                   (FLOPs / MAMF): a GEMM running near the device's maximum draws full power, and over a
                   sustained step the clocks drop; a small, latency-bound kernel barely does.
                   'cap': a sustained step runs no tensor-core kernel faster than MAMF / (1 + beta): each
                   one takes max(its sampled time, (1 + beta) x FLOPs / MAMF). Kernels sampled well below the
                   achievable rate (small, latency- or memory-bound) pay nothing; those sampled at it pay beta.
  contention       kappa: seconds of compute lost per second of communication that overlaps it (NCCL
                   kernels occupy SMs and memory bandwidth); charged on the overlapped part of ZeRO
                   gathers / reduce-scatters and of the bucketed gradient reduction. Not fitted (the A100 runs
                   trade it against the power factor): held at a published measurement, PUBLISHED_CONTENTION.
  speed_spread     sigma: the spread (standard deviation, relative) of the sustained speed of identical GPUs. A
                   step synchronises all its GPUs (the gradient reduction, and TP / pipeline / ZeRO collectives
                   inside it), so the slowest of them sets the pace: every GPU operator time is multiplied by
                   1 + sigma x E[max of n standard normals], n the GPUs of the job (`slowest_of`). Fitted on the
                   end-to-end runs (2 to 384 GPUs); beyond that the normal tail is an extrapolation.
  host[framework]  host (framework) time: seconds per layer pass blended with the GPU time
                   (predictor.step.overhead), plus seconds per micro-batch and pipeline stage (the
                   framework's per-micro-batch loop: schedule, loss scaling, hooks). A framework
                   without runs of its own takes the pooled fit of the others ("default").
  recompute_host_passes  host passes a layer's recomputation adds to its backward (full: this; selective:
                   a quarter of it), measured with the host floor (bench host-floor), 1 without it.
  moe_host_passes[framework]  host time of one MoE layer pass in dense layer passes: measured with the host
                   floor (`bench host-floor --moe`: a Megatron-Core MoE layer against the dense layer on one CPU),
                   never fitted; the terms file's own value where it states one, else the saved floor's (less what
                   the measured layer's local experts add, where the record measured that: the intercept below).
  moe_host_passes_per_expert[framework]  what each local expert (num_experts / ep) adds to a MoE layer pass, in
                   dense layer passes, where the grouped GEMMs issue one GEMM per expert (Transformer Engine's
                   GroupedLinear, Megatron-Core's TEGroupedMLP): measured with the same record, never fitted. A MoE
                   layer pass is moe_host_passes + moe_host_passes_per_expert x local experts.
  cuda_graph_passes  dense layer passes of host time each part Megatron-Core's per-layer CUDA graphs capture takes
                   (attn, mlp, moe_router, moe_preprocess) and one graph replay takes ("replay"): measured with the
                   host floor (`bench host-floor --cuda-graphs`, its "cuda_graphs" record), never fitted; what
                   Layout.cuda_graphs removes from a layer pass (predictor.step.engine `_framework_host`).

The file `models_store/framework_terms.json` holds the terms with their provenance: the runs and
sources they were fitted on, and the in-sample and source-held-out errors per source. GPU platforms
use it; CPU platforms have their own host fit (`<platform>/host_overhead.json`) and no other term.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from functools import cache, lru_cache
from itertools import accumulate
from operator import itemgetter
from pathlib import Path
from typing import Any

from predictor import paths
from predictor.model.frameworks import FRAMEWORKS
from predictor.paths import ArtifactError, check_number
from predictor.step.host_floor import (
    CUDA_GRAPH_PARTS,
    MAX_MOE_PASSES,
    MAX_MOE_PASSES_PER_EXPERT,
    MAX_RECOMPUTE_PASSES,
    MAX_REPLAY_PASSES,
    MAX_SCOPE_PASSES,
    MIN_MOE_PASSES,
    MIN_RECOMPUTE_PASSES,
    load_host_floor,
)

DEFAULT_HOST = "default"
POWER_FORMS = ("linear", "cap")

# Compute that shares the GPU with communication kernels runs 18.9 % slower on average (max 40.0 %), measured on
# GPT and LLaMA training layers on 4 A100s, H100s, MI250s and MI210s against the same kernels with no communication
# beside them (Lee et al., "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
# Learning: Performance and Power Implications", arXiv 2507.03114, 2025). Over a window of overlapped
# communication of length T, compute that would take W alone takes 1.189 W = T, so T x 0.189 / 1.189 seconds of
# compute are lost per second of communication: kappa = 0.159.
PUBLISHED_SLOWDOWN = 0.189
PUBLISHED_CONTENTION = PUBLISHED_SLOWDOWN / (1.0 + PUBLISHED_SLOWDOWN)
CONTENTION_SOURCE = (f"compute overlapped by communication runs {PUBLISHED_SLOWDOWN * 100:.1f} % slower on average "
                     "(arXiv 2507.03114: GPT / LLaMA layers on A100, H100, MI250, MI210), i.e. "
                     f"{PUBLISHED_CONTENTION:.3f} s of compute lost per second of overlapped communication")
MAX_CONTENTION = 2.0   # seconds of compute lost per overlapped second: no more in a terms file or the fit's option
MAX_SPEED_SPREAD = 0.2  # relative spread of identical GPUs' sustained speed: no more in a terms file
# the own-runs factors (EndToEndTerms.gemm_factor ... network_factor): no more than this far from 1 in a file
KIND_FACTORS = ("gemm_factor", "attention_factor", "memory_factor", "network_factor", "ep_factor")
MIN_KIND_FACTOR, MAX_KIND_FACTOR = 0.25, 4.0
TERMS_PROVENANCE = "end-to-end terms (power factor, contention, GPU speed spread)"   # what a prediction rests on


# how a calibration that held the spread at a set value says so in its source text (calibrate_framework.spread_words)
SPREAD_SET_WORDS = "GPU speed spread held at"


def spread_was_fitted(source: str) -> bool:
    """Whether a terms file's spread was fitted, from its source text (a held spread is named there as set)."""
    return SPREAD_SET_WORDS not in source


def spread_in_words(sigma: float, fitted: bool = True) -> str:
    """The GPU speed spread of a terms file in words (the Accuracy page); `fitted`: fitted on the runs, else set."""
    if not sigma:
        return "no GPU speed spread"
    how = "fitted" if fitted else "set, not fitted"
    return (f"GPU speed spread {sigma * 100:.1f} % ({how}): the slowest of a job's n GPUs sets the pace, "
            f"compute x (1 + {sigma:.3f} x E[max of n standard normals]), e.g. +{sigma * _slowest_of(8) * 100:.1f} % "
            f"on 8 GPUs, +{sigma * _slowest_of(1024) * 100:.1f} % on 1,024")


@cache
def _normal_grid() -> tuple[Any, Any, Any]:
    import numpy as np
    x = np.linspace(-9.0, 9.0, 7201)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    log_cdf = np.log(np.maximum(np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x]), 1e-300))
    return x, pdf, log_cdf


@lru_cache(maxsize=4096)
def _slowest_of(n: int) -> float:
    import numpy as np
    if n <= 1:
        return 0.0
    x, pdf, log_cdf = _normal_grid()
    dens = n * pdf * np.exp((n - 1) * log_cdf)   # density of the largest of n standard normals
    return float(np.trapezoid(x * dens, x))


def slowest_of(gpus: Any) -> Any:
    """E[max of n standard normals] for each n of `gpus` (an int or an array; 0 for n <= 1): how many standard
    deviations of per-GPU speed the slowest of n GPUs lies behind their mean (n = 2: 1 / sqrt(pi) = 0.564)."""
    import numpy as np
    a = np.asarray(gpus)
    if a.ndim == 0:
        return _slowest_of(int(a))
    u, inv = np.unique(a.astype("int64"), return_inverse=True)
    return np.array([_slowest_of(int(n)) for n in u])[inv].reshape(a.shape)


def contention_words(kappa: float) -> str:
    """How a contention was set, in words (the fit holds it, never fits it): the calibration's source text and the
    Accuracy page."""
    if not kappa:
        return "no contention"
    if math.isclose(kappa, PUBLISHED_CONTENTION):
        return f"contention held at the published measurement: {CONTENTION_SOURCE}"
    return f"contention held at {kappa:g} (set, not fitted)"


@dataclass(frozen=True)
class HostTerm:
    host_s_per_layer_pass: float = 0.0
    blend_p: float = 2.0
    host_s_per_micro_batch: float = 0.0

    @property
    def active(self) -> bool:
        return self.host_s_per_layer_pass > 0 or self.host_s_per_micro_batch > 0


@dataclass(frozen=True)
class EndToEndTerms:
    compute_factor: float = 1.0
    contention: float = 0.0
    host: dict[str, HostTerm] = field(default_factory=dict)
    power_factor: float = 0.0
    power_form: str = "linear"              # POWER_FORMS: how power_factor acts on tensor-core kernels
    recompute_host_passes: float = 1.0      # host passes a layer's full recomputation adds (predictor.step.host_floor)
    speed_spread: float = 0.0               # sigma: relative spread of identical GPUs' sustained speed (slowest_of)
    # framework -> host time of one MoE layer pass in dense layer passes: measured, never fitted (the host floor's
    # "moe" record, `bench host-floor --moe`, predictor.step.host_floor); a framework not named: 1
    moe_host_passes: dict[str, float] = field(default_factory=dict)
    # framework -> dense layer passes each local expert adds to a MoE layer pass (one GEMM per expert in the grouped
    # GEMMs: the same "moe" record's moe_host_passes_per_local_expert), measured, never fitted; not named: 0
    moe_host_passes_per_expert: dict[str, float] = field(default_factory=dict)
    # part ("attn", "mlp", "moe_router", "moe_preprocess") or "replay" -> dense layer passes of host time, for
    # Megatron-Core's CUDA graphs (Layout.cuda_graphs): the host floor's "cuda_graphs" record, measured, never fitted;
    # empty: not measured
    cuda_graph_passes: dict[str, float] = field(default_factory=dict)
    # a platform calibrated on its own runs (predictor.calibrate.runs): sustained speed per kind of work, GPU time x
    # factor (tensor-core GEMMs, attention kernels, memory-bound operators), and inter-node collectives' time x
    # network_factor (1 / network efficiency) where a job spans nodes, a MoE model's expert-parallel dispatch /
    # combine time x ep_factor; 1.0 = as sampled (every shipped terms file). `frameworks`: the frameworks these
    # factors apply to (the runs' frameworks: another framework's runs keep the sampled speeds); empty = every one
    gemm_factor: float = 1.0
    attention_factor: float = 1.0
    memory_factor: float = 1.0
    network_factor: float = 1.0
    ep_factor: float = 1.0
    frameworks: tuple[str, ...] = ()
    source: str = ""
    fitted_on: dict[str, int] = field(default_factory=dict)     # source id -> runs
    validation: dict[str, Any] = field(default_factory=dict)    # per source: in-sample and held-out errors
    fitted_at: str = ""

    @property
    def kind_factors(self) -> tuple[float, float, float]:
        """(GEMM, attention, memory-bound) time factors of a platform calibrated on its own runs."""
        return self.gemm_factor, self.attention_factor, self.memory_factor

    def moe_passes_for(self, framework: str, local_experts: float = 0.0) -> float:
        """Dense layer passes of host time one MoE layer pass of `framework` takes with `local_experts` experts per
        expert-parallel rank (1 where not measured): the measured MoE layer plus what each local expert's GEMMs
        add."""
        return (float(self.moe_host_passes.get(framework, 1.0))
                + float(self.moe_host_passes_per_expert.get(framework, 0.0)) * local_experts)

    @property
    def own_factors(self) -> bool:
        """Whether any own-runs factor departs from 1 (a platform calibrated on its own runs)."""
        return any(getattr(self, k) != 1.0 for k in KIND_FACTORS)

    def host_for(self, framework: str) -> HostTerm | None:
        """The host term of a framework, else the pooled one, else None."""
        t = self.host.get(framework) or self.host.get(DEFAULT_HOST)
        return t if t is not None and t.active else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["host"] = {k: asdict(v) for k, v in self.host.items()}
        d["frameworks"] = list(self.frameworks)
        return d


NONE = EndToEndTerms()


def terms_from_dict(d: Any, path: str | Path = paths.FRAMEWORK_TERMS) -> EndToEndTerms:
    """Parsed and checked; ArtifactError naming the file and field on a bad value."""
    if not isinstance(d, dict):
        raise ArtifactError(path, None, f"must be a JSON object, not {type(d).__name__}")
    alpha = float(check_number(path, "compute_factor", d.get("compute_factor", 1.0), ge=0.5, le=2.0))
    kappa = float(check_number(path, "contention", d.get("contention", 0.0), ge=0.0, le=MAX_CONTENTION))
    beta = float(check_number(path, "power_factor", d.get("power_factor", 0.0), ge=0.0, le=1.0))
    form = d.get("power_form", "linear")
    if form not in POWER_FORMS:
        raise ArtifactError(path, "power_form", f"must be one of {', '.join(POWER_FORMS)}, not {form!r}")
    spread = float(check_number(path, "speed_spread", d.get("speed_spread", 0.0), ge=0.0, le=MAX_SPEED_SPREAD))
    rpass = float(check_number(path, "recompute_host_passes", d.get("recompute_host_passes", 1.0),
                               ge=MIN_RECOMPUTE_PASSES, le=MAX_RECOMPUTE_PASSES))
    kinds = {k: float(check_number(path, k, d.get(k, 1.0), ge=MIN_KIND_FACTOR, le=MAX_KIND_FACTOR))
             for k in KIND_FACTORS}
    host: dict[str, HostTerm] = {}
    raw = d.get("host") or {}
    if not isinstance(raw, dict):
        raise ArtifactError(path, "host", "must be a mapping of framework -> term")
    for fw, t in raw.items():
        if fw not in FRAMEWORKS and fw != DEFAULT_HOST:
            raise ArtifactError(path, f"host.{fw}", f"unknown framework (use {', '.join(FRAMEWORKS)} or default)")
        if not isinstance(t, dict):
            raise ArtifactError(path, f"host.{fw}", "must be a mapping")
        host[fw] = HostTerm(
            host_s_per_layer_pass=float(check_number(path, f"host.{fw}.host_s_per_layer_pass",
                                                     t.get("host_s_per_layer_pass", 0.0), ge=0.0, lt=1.0)),
            blend_p=float(check_number(path, f"host.{fw}.blend_p", t.get("blend_p", 2.0), ge=1.0, le=64.0)),
            host_s_per_micro_batch=float(check_number(path, f"host.{fw}.host_s_per_micro_batch",
                                                      t.get("host_s_per_micro_batch", 0.0), ge=0.0, lt=10.0)))
    moe_raw = d.get("moe_host_passes") or {}
    if not isinstance(moe_raw, dict):
        raise ArtifactError(path, "moe_host_passes", "must be a mapping of framework -> MoE layer host passes")
    moe_passes: dict[str, float] = {}
    for fw, v in moe_raw.items():
        if fw not in FRAMEWORKS:
            raise ArtifactError(path, f"moe_host_passes.{fw}", f"unknown framework (use {', '.join(FRAMEWORKS)})")
        moe_passes[fw] = float(check_number(path, f"moe_host_passes.{fw}", v, ge=MIN_MOE_PASSES, le=MAX_MOE_PASSES))
    pe_raw = d.get("moe_host_passes_per_expert") or {}
    if not isinstance(pe_raw, dict):
        raise ArtifactError(path, "moe_host_passes_per_expert", "must be a mapping of framework -> dense layer passes "
                                                                "per local expert")
    per_expert: dict[str, float] = {}
    for fw, v in pe_raw.items():
        if fw not in FRAMEWORKS:
            raise ArtifactError(path, f"moe_host_passes_per_expert.{fw}",
                                f"unknown framework (use {', '.join(FRAMEWORKS)})")
        per_expert[fw] = float(check_number(path, f"moe_host_passes_per_expert.{fw}", v, ge=0.0,
                                            le=MAX_MOE_PASSES_PER_EXPERT))
    cg_raw = d.get("cuda_graph_passes") or {}
    if not isinstance(cg_raw, dict):
        raise ArtifactError(path, "cuda_graph_passes", "must be a mapping of part -> dense layer passes")
    cg: dict[str, float] = {}
    for k, v in cg_raw.items():
        if k not in (*CUDA_GRAPH_PARTS, "replay"):
            raise ArtifactError(path, f"cuda_graph_passes.{k}", f"unknown part (use {', '.join(CUDA_GRAPH_PARTS)} "
                                                                "or replay)")
        cg[k] = float(check_number(path, f"cuda_graph_passes.{k}", v, ge=0.0,
                                   le=MAX_REPLAY_PASSES if k == "replay" else MAX_SCOPE_PASSES))
    fws = d.get("frameworks") or []
    if not isinstance(fws, list) or any(f not in FRAMEWORKS for f in fws):
        raise ArtifactError(path, "frameworks", f"must be a list of frameworks ({', '.join(FRAMEWORKS)}), not "
                                                f"{str(fws)[:80]}")
    fitted_on = d.get("fitted_on") or {}
    if not isinstance(fitted_on, dict):
        raise ArtifactError(path, "fitted_on", "must be a mapping of platform -> number of runs")
    fitted_on = {str(k): int(check_number(path, f"fitted_on.{k}", v, ge=0, integer=True)) for k, v in fitted_on.items()}
    validation = d.get("validation") or {}
    if not isinstance(validation, dict):
        raise ArtifactError(path, "validation", "must be a mapping")
    _check_finite(path, "validation", validation)  # errors and signed gaps: any sign, never NaN / inf
    return EndToEndTerms(compute_factor=alpha, contention=kappa, host=host, power_factor=beta,
                         power_form=str(form), recompute_host_passes=rpass, speed_spread=spread,
                         moe_host_passes=moe_passes, moe_host_passes_per_expert=per_expert,
                         cuda_graph_passes=cg, source=str(d.get("source", "")), fitted_on=fitted_on,
                         validation=dict(validation), fitted_at=str(d.get("fitted_at", "")),
                         frameworks=tuple(str(f) for f in fws), **kinds)


def _check_finite(path: str | Path, where: str, o: Any) -> None:
    if isinstance(o, dict):
        for k, v in o.items():
            _check_finite(path, f"{where}.{k}", v)
    elif isinstance(o, list):
        for i, v in enumerate(o):
            _check_finite(path, f"{where}[{i}]", v)
    elif isinstance(o, (int, float)) and not isinstance(o, bool):
        check_number(path, where, o)


def load_terms_checked(models_dir: str | Path | None = None) -> tuple[EndToEndTerms | None, str | None]:
    """(terms, warning): None without a file; a bad file gives no terms and a warning naming it."""
    p = paths.shared_artifact(paths.FRAMEWORK_TERMS, models_dir)
    try:
        d = paths.read_json(p)
        return (None, None) if d is None else (with_floor_records(terms_from_dict(d, p), models_dir), None)
    except (ArtifactError, ValueError, TypeError) as e:
        return None, f"End-to-end terms ignored: {e}"


def with_floor_records(terms: EndToEndTerms, models_dir: str | Path | None = None) -> EndToEndTerms:
    """`terms` with the saved host floor's measured records: the MoE layer's host passes (`with_moe_host_passes`) and
    the CUDA graph parts' (`with_cuda_graph_passes`)."""
    return with_cuda_graph_passes(with_moe_host_passes(terms, models_dir), models_dir)


def with_cuda_graph_passes(terms: EndToEndTerms, models_dir: str | Path | None = None) -> EndToEndTerms:
    """`terms` with the host passes of the parts CUDA graphs capture and of one replay, from the saved host floor's
    "cuda_graphs" record (`bench host-floor --cuda-graphs`), where the terms file states none of its own; unchanged
    without a record (or with a broken floor file, which the fit reports)."""
    if terms.cuda_graph_passes:
        return terms
    floor, _warning = load_host_floor(models_dir)
    if floor is None or floor.cuda_graph_passes is None:
        return terms
    return replace(terms, cuda_graph_passes=dict(floor.cuda_graph_passes))


def with_moe_host_passes(terms: EndToEndTerms, models_dir: str | Path | None = None) -> EndToEndTerms:
    """`terms` with the MoE layer host passes of the saved host floor's "moe" record (`bench host-floor --moe`)
    for the frameworks it applies to, where the terms file states none of its own; unchanged without a record (or
    with a broken floor file, which the fit reports)."""
    if terms.moe_host_passes:
        return terms
    floor, _warning = load_host_floor(models_dir)
    if floor is None or floor.moe_layer_host_passes is None:
        return terms
    passes = floor.moe_layer_host_passes
    if floor.moe_passes_per_local_expert is None:
        return replace(terms, moe_host_passes=dict.fromkeys(floor.moe_applies_to, passes))
    # passes = intercept + per expert x local experts, the intercept the measured layer's passes less its experts'
    return replace(terms, moe_host_passes=dict.fromkeys(floor.moe_applies_to, floor.moe_passes_without_experts(passes)),
                   moe_host_passes_per_expert=dict.fromkeys(floor.moe_applies_to, floor.moe_passes_per_local_expert))


def save_terms(terms: EndToEndTerms, models_dir: str | Path | None = None) -> Path:
    p = paths.shared_artifact(paths.FRAMEWORK_TERMS, models_dir)
    d = terms.to_dict()
    terms_from_dict(d, p)  # refuse to write what would not load back
    power = ("power_factor x FLOPs / MAMF" if terms.power_form == "linear"
             else "tensor-core operators at least (1 + power_factor) x FLOPs / MAMF")
    d["model"] = (f"GPU operator times x compute_factor, {power}; + contention x overlapped "
                  "communication; x (1 + speed_spread x E[max of n GPUs' standard normal speeds]); host per layer "
                  "pass blended (T = (G**p + H**p)**(1/p)) plus host_s_per_micro_batch per micro-batch and stage; "
                  "see predictor/step/terms.py")
    return paths.write_json_atomic(p, d)


# The per-source columns of `validation_by_source`, in the order a table shows them: in-sample beside
# source-held-out for each figure.
SOURCE_VALIDATION_COLUMNS = (
    "source", "framework", "runs", "in_sample_mape", "held_out_mape", "in_sample_median_ape", "held_out_median_ape",
    "in_sample_worst_ape", "held_out_worst_ape", "in_sample_mean_signed", "held_out_mean_signed", "measured_mfu",
    "held_out_mfu_gap_points", "held_out_mfu_signed_points", "runs_shape_flagged", "held_out_mape_unflagged",
    "held_out_mean_signed_unflagged", "skipped_at_fit", "skipped_at_ingest", "skipped_why")


def validation_by_source(terms: EndToEndTerms) -> Any:
    """The leave-one-source-out validation of the terms (framework_terms.json `validation.per_source`,
    written by predictor.calibrate.framework) as a DataFrame, one row per source, `SOURCE_VALIDATION_COLUMNS`:
    runs, in-sample and source-held-out MAPE / median / worst / mean signed error (held-out: predicted by
    terms refitted without that source), the measured MFU and the held-out MFU gap (mean |gap| and signed,
    in points), the runs with GEMM dimensions not in multiples of 8 (`runs_shape_flagged`, predictor.step.alignment)
    and the held-out error of the others (`held_out_mape_unflagged`, `held_out_mean_signed_unflagged`; None
    where no run is flagged), the runs the fit could not compose (`skipped_at_fit`), and the rows the ingest skipped for
    that source (`skipped_at_ingest`) with why
    (`skipped_why`: "reason: rows; ..."). Empty (with those columns) when the terms carry no validation."""
    import pandas as pd
    rows = []
    for source, rec in sorted((terms.validation.get("per_source") or {}).items()):
        rec = rec if isinstance(rec, dict) else {}
        skipped = rec.get("skipped_at_ingest") or 0
        if isinstance(skipped, dict):  # reason -> rows
            why = "; ".join(f"{k.removeprefix('skipped: ')}: {v}" for k, v in skipped.items())
            skipped = int(sum(skipped.values()))
        else:
            why = ""
        row = {c: rec.get(c) for c in SOURCE_VALIDATION_COLUMNS}
        row.update(source=source, skipped_at_fit=int(rec.get("skipped") or 0), skipped_at_ingest=int(skipped),
                   skipped_why=why, runs_shape_flagged=int(rec.get("runs_shape_flagged") or 0))
        rows.append(row)
    return pd.DataFrame(rows, columns=list(SOURCE_VALIDATION_COLUMNS))


_first = itemgetter(0)


@dataclass(frozen=True)
class CapCurve:
    """The seconds the 'cap' power form adds to a set of tensor-core kernels as a function of beta:
    sum_i max(0, (1 + beta) x ideal_i - t_i) = sum over kernels with slack_i < beta of ideal_i x (beta - slack_i),
    slack_i = t_i / ideal_i - 1 (how far below the achievable rate the kernel was sampled). Kept as sorted
    slacks with cumulative sums, so one curve answers any beta in O(log n)."""
    slack: tuple[float, ...] = ()
    cum_ideal_s: tuple[float, ...] = ()          # sum of ideal_i over the i smallest slacks
    cum_ideal_slack_s: tuple[float, ...] = ()    # sum of ideal_i x slack_i over the same

    @staticmethod
    def of(seconds: Any, ideal_s: Any) -> CapCurve:
        """The curve of kernels taking `seconds` (sampled) whose FLOPs at MAMF take `ideal_s` (0: not tensor-core
        work, left out)."""
        # plain Python: a unit has tens of kernels, where numpy's per-call cost is most of the time (search builds
        # thousands of curves); sorted() is stable, so equal slacks keep the kernels' order
        pairs = sorted(((float(t) / float(i) - 1.0, float(i)) for t, i in zip(seconds, ideal_s) if float(i) > 0),
                       key=_first)
        if not pairs:
            return CapCurve()
        sl = tuple(p[0] for p in pairs)
        return CapCurve(sl, tuple(accumulate(p[1] for p in pairs)), tuple(accumulate(p[1] * p[0] for p in pairs)))

    def added_s(self, beta: float, compute_factor: float = 1.0) -> float:
        """Seconds added at this beta, the kernels' times first multiplied by compute_factor (alpha):
        max(0, (1+beta) I - alpha t) = alpha max(0, ((1+beta)/alpha) I - t)."""
        import bisect
        if not self.slack:
            return 0.0
        b = (1.0 + beta) / compute_factor - 1.0
        k = bisect.bisect_left(self.slack, b)
        if k == 0:
            return 0.0
        return compute_factor * (b * self.cum_ideal_s[k - 1] - self.cum_ideal_slack_s[k - 1])


def blend(g: Any, h: Any, p: Any) -> Any:
    """(g**p + h**p)**(1/p) elementwise, p an array or a number (>= 1)."""
    import numpy as np
    g = np.asarray(g, dtype="float64")
    h = np.asarray(h, dtype="float64")
    p = np.asarray(p, dtype="float64")
    m = np.maximum(np.maximum(g, h), 1e-30)
    return m * ((g / m) ** p + (h / m) ** p) ** (1.0 / p)


# FlashAttention in Triton (the attn_impl 'triton' of MPT / llm-foundry) against FlashAttention-2 on A100: "1.3-2.5x
# faster than FlashAttention in Triton" (Dao 2023, FlashAttention-2, section 4.1); the geometric middle of the range,
# which goes into the error band as +/-30 %.
TRITON_ATTENTION_FACTOR = 1.8
TRITON_ATTENTION_ERROR = 0.30


def causal_attention_factors(seq_len: Any, block: int = 128) -> Any:
    """`causal_attention_factor` for an array of sequence lengths."""
    import numpy as np
    nb = np.maximum(1.0, np.ceil(np.asarray(seq_len, dtype="float64") / block))
    return (nb + 1.0) / (2.0 * nb)


def causal_attention_factor(seq_len: int, block: int = 128) -> float:
    """Share of the (query block, key block) tiles a causal FlashAttention kernel computes: nb(nb+1)/2 of nb**2
    with nb = ceil(seq / block) (FlashAttention-2 skips the blocks above the diagonal)."""
    nb = max(1, math.ceil(seq_len / block))
    return (nb + 1) / (2 * nb)


def host_share_bin(bins: Any, share: float) -> dict[str, Any] | None:
    """The bin of `calibrate_framework.host_share_bins` (as framework_terms.json keeps it) holding `share`, if any."""
    if not isinstance(bins, list):
        return None
    for b in bins:   # the writer marks its last bin closed (older files: the bin that ends at 1)
        if not isinstance(b, dict) or not isinstance(b.get("held_out_mape"), (int, float)):
            continue
        if in_share_bin(share, b.get("from", 1.0), b.get("to", 0.0), bool(b.get("closed", b.get("to") == 1.0))):
            return b
    return None


def in_share_bin(share: Any, lo: float, hi: float, closed: bool) -> Any:
    """Whether `share` (a float or an array) lies in the host-share bin [lo, hi), or [lo, hi] where `closed`: the one
    membership rule of the writer (`calibrate_framework.host_share_bins`) and the reader (`host_share_bin`)."""
    return (share >= lo) & ((share < hi) | (closed & (share <= hi)))


def load_own_terms_checked(platform_id: str, user_dir: str | Path | None = None
                           ) -> tuple[EndToEndTerms | None, str | None]:
    """The terms of a user platform calibrated on its own runs (predictor.calibrate.runs, <user models
    dir>/<platform>/own_runs_terms.json): (terms, None), (None, warning) when the file is missing or unusable."""
    p = paths.user_artifact(platform_id, paths.OWN_RUNS_TERMS, user_dir)
    try:
        d = paths.read_json_checked(p)
        if d is None:
            return None, (f"{platform_id} was calibrated on its own runs, but {p} is missing: the terms of the "
                          "platform it started from are used (run calibrate-runs again).")
        t = with_floor_records(terms_from_dict(d, p))
        if not isinstance(t.validation.get("own_runs"), dict):
            raise ArtifactError(p, "validation.own_runs", "is missing: not a calibrate-runs file")
        return t, None
    except (ArtifactError, ValueError, TypeError) as e:
        return None, f"Own-runs terms ignored: {e}"

"""Calibrate a platform on a user's own measured runs, saved as a new user platform.

    python -m predictor calibrate-runs --runs RUNS.csv --platform dgx-a100-80gb --save-as my-a100

RUNS.csv holds the predict-batch columns (predictor.model.layout_io.BATCH_COLUMNS, the optional ones too) plus
`step_time_s` (and optionally `source`). Every row is checked before anything is fitted: a layout that does not
multiply to its GPUs, a step time <= 0, two runs of the same layout whose step times lie more than
`CONTRADICTION_RATIO` apart all stop the calibration with a message naming the line, the field and the fix.

The fit starts from the end-to-end terms of BASE (its prior) and moves, in log space, the terms the runs can say
something about (`TERM_PRIORS`): the sustained speed of each kind of work (tensor-core GEMMs, attention kernels,
memory-bound operators: `EndToEndTerms.gemm_factor` ...), the host time per layer pass and per micro-batch of the
runs' frameworks, and the network's efficiency where a run spans nodes. It is regularised least squares: the
log-ratio residuals of the runs (each worth a `RUN_NOISE` relative error) beside a pull of each term towards its
prior (its `prior_sd`, in log units), inside bounds, so one run cannot push a term to nonsense. A term counts as
identified where the runs halve its prior uncertainty (the posterior standard deviation from the curvature of the
objective at the fit); the others stay near the prior, and the report says which.

Its error band comes from its own runs: leave-one-run-out (each run predicted by terms fitted without it) and,
where the runs hold several models, leave-one-model-out. NEW is saved as a user platform (the user clusters file,
`paths.clusters_file`) with its terms in its own folder under the user models dir (`paths.user_models_dir`); BASE
and everything under the shipped models_store/ are never written.
"""
from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from predictor import paths
from predictor.hardware.platforms import Platform, get_platform, is_shipped, load_platforms, save_cluster
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import BATCH_COLUMNS, OPTIONAL_BATCH_COLUMNS, layout_from_fields, model_from_fields
from predictor.model.specs import Layout, ModelSpec
from predictor.plan.predict import Predictor
from predictor.step.compose import ComposeOptions
from predictor.step.engine import rows_for
from predictor.step.terms import DEFAULT_HOST, EndToEndTerms, HostTerm, terms_from_dict

RUN_COLUMNS = ("step_time_s", "source", "source_id", "run_id", "notes")
CONTRADICTION_RATIO = 1.2    # two runs of one layout further apart than this contradict each other
RUN_NOISE = 0.03             # relative error one run's step time is worth in the fit (run-to-run variation)
MAX_RUNS = 2000
HOST_SHIFT_S = {"host_s_per_layer_pass": 2e-5, "host_s_per_micro_batch": 1e-3}   # log(x + shift): zero allowed
Progress = Callable[[str], None]


COMPUTE_SCALE = "compute_scale"   # one factor on every kind of GPU work: what a few runs identify first
COMPUTE_SCALE_SD = 0.15
KIND_SD = 0.1                      # each kind's departure from the common scale
HOST_SD = 0.7


@dataclass(frozen=True)
class TermPrior:
    name: str
    words: str
    prior_sd: float      # log units: how far from BASE's value the term plausibly lies before any run
    bound: float         # log units: no further than this from BASE's value


TERM_PRIORS = (
    TermPrior(COMPUTE_SCALE, "all operator time x (the kinds below: this x their own)", COMPUTE_SCALE_SD,
              math.log(2.0)),
    TermPrior("gemm_factor", "tensor-core GEMM time x", KIND_SD, math.log(2.0)),
    TermPrior("attention_factor", "attention kernel time x", KIND_SD, math.log(2.0)),
    TermPrior("memory_factor", "memory-bound operator time x", KIND_SD, math.log(2.0)),
    TermPrior("host_s_per_layer_pass", "host seconds per layer pass", HOST_SD, 3.0),
    TermPrior("host_s_per_micro_batch", "host seconds per micro-batch", HOST_SD, 3.0),
    TermPrior("network_factor", "inter-node collective time x (1 / efficiency)", 0.3, math.log(3.0)),
    TermPrior("ep_factor", "MoE expert-parallel dispatch / combine time x (1 / efficiency)", 0.3, math.log(3.0)),
)
IDENTIFIED_SD_RATIO = 0.5    # identified: the posterior sd at most this share of the prior sd


@dataclass(frozen=True)
class OwnRun:
    line: int                # the CSV line (the header is line 1)
    model: ModelSpec
    layout: Layout
    step_time_s: float
    source: str
    fields: tuple[tuple[str, str], ...]   # the row's cells


@dataclass(frozen=True)
class TermFit:
    name: str
    words: str
    prior: float
    value: float
    prior_sd: float
    posterior_sd: float
    identified: bool


@dataclass(frozen=True)
class RunsCalibration:
    base: str
    new: str | None
    terms: EndToEndTerms
    fits: tuple[TermFit, ...]
    table: pd.DataFrame           # per run: line, source, measured_s, before_s, after_s, held_out_s and errors
    record: dict[str, Any]        # what the terms file keeps (validation.own_runs)
    terms_path: Path | None
    clusters_path: Path | None


# ---- reading and checking the runs ------------------------------------------------------------------------
def read_runs_csv(data: str | bytes | Path, platform: str) -> list[OwnRun]:
    """The runs of a CSV (a path, or its text / bytes), every row checked; InfeasibleConfig naming the line and
    field of the first problem."""
    if isinstance(data, Path):
        try:
            raw = data.read_bytes()
        except OSError as e:
            raise InfeasibleConfig("runs", f"cannot read '{data}': {e.strerror or e}.",
                                   "pass an existing CSV file of measured runs.") from None
    else:
        raw = data.encode() if isinstance(data, str) else data
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InfeasibleConfig("runs", "the file is not UTF-8 text.", "save the CSV as UTF-8.") from None
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in (reader.fieldnames or [])]
    if not header:
        raise InfeasibleConfig("runs", "the file is empty.", "give a header (the predict-batch columns plus "
                                                             "step_time_s) and one row per measured run.")
    allowed = set(BATCH_COLUMNS) | set(OPTIONAL_BATCH_COLUMNS) | set(RUN_COLUMNS)
    unknown = [h for h in header if h not in allowed]
    if unknown:
        raise InfeasibleConfig(f"runs: column {unknown[0]}", "is not a predict-batch column or step_time_s.",
                               "rename or remove it (see `python -m predictor predict-batch --help`).")
    for need in ("step_time_s", "layers", "hidden", "heads"):
        if need not in header and not (need != "step_time_s" and "model" in header):
            raise InfeasibleConfig(f"runs: column {need}", "is missing.",
                                   f"add a {need} column (step_time_s: the measured seconds per training step).")
    reader.fieldnames = header
    runs: list[OwnRun] = []
    for i, row in enumerate(reader):
        line = i + 2
        if len(runs) >= MAX_RUNS:
            raise InfeasibleConfig("runs", f"more than {MAX_RUNS} runs.", "calibrate on a representative subset.")
        cells = {k: (v or "").strip() for k, v in row.items() if k is not None}
        if None in row:
            raise InfeasibleConfig(f"runs line {line}", "has more cells than the header.", "fix the row.")
        if not any(cells.values()):
            continue
        plat = cells.get("platform", "")
        if plat and plat != platform:
            raise InfeasibleConfig(f"runs line {line}: platform", f"is '{plat[:60]}', but the runs calibrate "
                                   f"'{platform}'.", "leave the platform column empty or give --platform "
                                   "the platform the runs were measured on.")
        raw_t = cells.get("step_time_s", "")
        try:
            t = float(raw_t)
        except ValueError:
            raise InfeasibleConfig(f"runs line {line}: step_time_s", f"'{raw_t[:40]}' is not a number.",
                                   "give the measured seconds per training step.") from None
        if not math.isfinite(t) or t <= 0:
            raise InfeasibleConfig(f"runs line {line}: step_time_s", f"is {raw_t}; a step time must be > 0 "
                                   "and finite.", "give the measured seconds per training step (e.g. 1.84).")
        try:
            model, layout = model_from_fields(cells), layout_from_fields(cells)
            layout.validate(model)
        except InfeasibleConfig as e:
            raise InfeasibleConfig(f"runs line {line}: {e.field}", e.problem, e.fix) from None
        src = cells.get("source") or cells.get("source_id") or "your runs"
        runs.append(OwnRun(line, model, layout, t, src, tuple(sorted(cells.items()))))
    if not runs:
        raise InfeasibleConfig("runs", "holds no runs.", "add one row per measured run below the header.")
    check_consistent(runs)
    return runs


def check_consistent(runs: Sequence[OwnRun]) -> None:
    """InfeasibleConfig where two runs of the same model and layout lie more than CONTRADICTION_RATIO apart."""
    by: dict[tuple, list[OwnRun]] = {}
    for r in runs:
        by.setdefault((r.model, r.layout), []).append(r)
    for same in by.values():
        lo = min(same, key=lambda r: r.step_time_s)
        hi = max(same, key=lambda r: r.step_time_s)
        if hi.step_time_s > CONTRADICTION_RATIO * lo.step_time_s:
            raise InfeasibleConfig(
                f"runs lines {lo.line} and {hi.line}: step_time_s",
                f"the same model and layout measured {lo.step_time_s:g} s and {hi.step_time_s:g} s, "
                f"{hi.step_time_s / lo.step_time_s - 1:.0%} apart: the runs contradict each other.",
                "check the two runs (a different setting not in the columns, a slow node, warm-up steps counted) "
                f"and keep the right one; runs of one layout may differ by at most {CONTRADICTION_RATIO - 1:.0%}.")


# ---- the fit ----------------------------------------------------------------------------------------------
class RunEvaluator:
    """Every run's step time under given terms, composed by the engine as `predict` composes it."""

    def __init__(self, predictor: Predictor, runs: Sequence[OwnRun]):
        self.pr = predictor
        by: dict[tuple, list[int]] = {}
        for i, r in enumerate(runs):
            by.setdefault((r.model, r.layout.seq_len, r.layout.precision), []).append(i)
        self.groups = []
        for (m, seq, prec), idx in by.items():
            rows, structs = rows_for(m, [runs[i].layout for i in idx])
            self.groups.append((m, seq, prec, np.array(idx), rows, structs))
        self.n = len(runs)

    def __call__(self, terms: EndToEndTerms) -> np.ndarray:
        out = np.empty(self.n)
        for m, seq, prec, idx, rows, structs in self.groups:
            ev = self.pr.engine.evaluate(m, rows, structs, seq, prec, host=None, terms=terms, provenance=False)
            out[idx] = ev.step_time_s
        return out


def prior_terms(pr: Predictor) -> EndToEndTerms:
    """BASE's terms as the fit's starting point: its end-to-end terms (GPU), or its own host fit as a host term."""
    t = pr.terms or EndToEndTerms()
    if pr.host is not None and not t.host:
        t = replace(t, host={DEFAULT_HOST: HostTerm(pr.host.host_s_per_layer_pass, pr.host.blend_p, 0.0)})
    return t


def active_terms(runs: Sequence[OwnRun], platform: Platform) -> list[TermPrior]:
    """The terms the runs can say something about: the network's only where a run spans nodes, the expert-parallel
    traffic's only where a run is a MoE model with ep > 1; the rest always (the prior holds them where the runs
    cannot tell)."""
    spans = any(r.layout.num_gpus > platform.gpus_per_node for r in runs)
    experts = any(r.model.is_moe and r.layout.ep > 1 for r in runs)
    return [p for p in TERM_PRIORS if (p.name != "network_factor" or spans) and (p.name != "ep_factor" or experts)]


def _terms_at(prior: EndToEndTerms, active: Sequence[TermPrior], z: np.ndarray, frameworks: Sequence[str],
              scoped: bool = True) -> EndToEndTerms:
    """The terms at log-offsets z from the prior; `scoped`: the speed factors apply to the runs' frameworks only
    (another framework keeps the prior's speeds, as its host term is the prior's)."""
    kinds: dict[str, Any] = {}
    host_z: dict[str, float] = {}
    zs = dict(zip((p.name for p in active), (float(v) for v in z)))
    common = zs.pop(COMPUTE_SCALE, 0.0)
    for name in ("gemm_factor", "attention_factor", "memory_factor"):
        kinds[name] = float(getattr(prior, name) * math.exp(common + zs.pop(name, 0.0)))
    for name, v in zs.items():
        if name.startswith("host_"):
            host_z[name] = v
        else:
            kinds[name] = float(getattr(prior, name) * math.exp(v))
    host = dict(prior.host)
    for fw in frameworks:
        h = prior.host_for(fw) or HostTerm()
        vals = {}
        for name, shift in HOST_SHIFT_S.items():
            x0 = getattr(h, name)
            vals[name] = max(0.0, (x0 + shift) * math.exp(host_z.get(name, 0.0)) - shift)
        host[fw] = HostTerm(vals["host_s_per_layer_pass"], h.blend_p, vals["host_s_per_micro_batch"])
    return replace(prior, host=host, frameworks=tuple(sorted(frameworks)) if scoped else (), **kinds)


def _host_value(t: EndToEndTerms, fw: str, name: str) -> float:
    h = t.host_for(fw)
    return float(getattr(h, name)) if h is not None else 0.0


def fit_own_terms(evaluate: RunEvaluator, prior: EndToEndTerms, active: Sequence[TermPrior], meas: np.ndarray,
                  frameworks: Sequence[str], mask: np.ndarray | None = None, scoped: bool = True,
                  prior_scale: float = 1.0, x0: np.ndarray | None = None
                  ) -> tuple[EndToEndTerms, np.ndarray, np.ndarray]:
    """(terms, z, posterior sd per active term in log units) fitted on the runs of `mask` (None: all); `scoped`:
    the fitted speed factors apply to the runs' frameworks only (`EndToEndTerms.frameworks`); `prior_scale`: every
    prior sd x this (the prior's strength, `choose_prior_scale`); `x0`: where to start (default: the prior)."""
    f = _fit(evaluate, prior, active, meas, frameworks, mask, scoped, prior_scale, x0)
    return f.terms, f.z, f.posterior_sd


@dataclass(frozen=True)
class ScaledFit:
    scale: float
    terms: EndToEndTerms
    z: np.ndarray
    posterior_sd: np.ndarray
    held_out_log: np.ndarray   # per fitted run: log(held-out prediction / measured), to first order (PRESS)

    @property
    def held_out_mape(self) -> float:
        return float(np.mean(np.abs(np.expm1(self.held_out_log)))) if len(self.held_out_log) else math.nan


def _fit(evaluate: RunEvaluator, prior: EndToEndTerms, active: Sequence[TermPrior], meas: np.ndarray,
         frameworks: Sequence[str], mask: np.ndarray | None = None, scoped: bool = True, prior_scale: float = 1.0,
         x0: np.ndarray | None = None) -> ScaledFit:
    from scipy.optimize import least_squares
    mask = np.ones(len(meas), dtype=bool) if mask is None else mask
    # the strength applies to the speed and network terms; the host terms' sd (already x2 per sd) stays: runs with
    # long layers hide the host, so a weaker pull there lets it run to its bound and ruin short-layer predictions
    sd = np.array([p.prior_sd * (1.0 if p.name.startswith("host_") else prior_scale) for p in active])
    lim = np.array([p.bound for p in active])

    def residuals(z: np.ndarray) -> np.ndarray:
        pred = evaluate(_terms_at(prior, active, z, frameworks, scoped))[mask]
        return np.concatenate([np.log(pred / meas[mask]) / RUN_NOISE, z / sd])

    start = np.zeros(len(active)) if x0 is None else np.clip(x0, -lim, lim)
    res = least_squares(residuals, start, bounds=(-lim, lim), diff_step=1e-3, max_nfev=60, x_scale=sd)
    J = np.asarray(res.jac, dtype=float)
    try:
        cov = np.linalg.inv(J.T @ J)
        post = np.sqrt(np.maximum(np.diag(cov), 0.0))
    except np.linalg.LinAlgError:
        post = sd.copy()
    # each run left out, to first order: the residual / (1 - its leverage) over the terms not held at a bound (the
    # closed form of leave-one-out for regularised linear least squares, here at the fit's linearisation)
    m = int(mask.sum())
    free = np.abs(res.x) < lim - 1e-6
    lev = np.zeros(m)
    if free.any():
        Jf = J[:, free]
        try:
            lev = np.einsum("ij,jk,ik->i", Jf[:m], np.linalg.inv(Jf.T @ Jf), Jf[:m])
        except np.linalg.LinAlgError:
            lev = np.zeros(m)
    loo = np.asarray(res.fun[:m], dtype=float) * RUN_NOISE / np.maximum(1.0 - lev, 1e-3)
    return ScaledFit(prior_scale, _terms_at(prior, active, res.x, frameworks, scoped), res.x, post, loo)


# the prior's strength is chosen on the runs themselves: every prior sd x each of these, the one whose
# leave-one-run-out error over the runs is lowest (ties: the earlier). KEEP (0) is BASE's terms unchanged, nothing
# fitted: its held-out error is BASE's own error on each run; it replaces the best fit only where it predicts the runs
# clearly better, by more than the run-to-run noise the fit assumes (RUN_NOISE): with a few runs a fit of several
# terms can make the other predictions worse than BASE's, and a smaller difference is within the noise
KEEP = 0.0
PRIOR_SCALES = (KEEP, 1.0, 0.5, 2.0, 4.0)
MIN_RUNS_TO_CHOOSE = 3   # fewer runs: the shipped priors (two runs predict each other from one run alone)
TIE = 1e-3               # leave-one-run-out errors closer than this are a tie


def kept_fit(evaluate: RunEvaluator, prior: EndToEndTerms, active: Sequence[TermPrior], meas: np.ndarray,
             frameworks: Sequence[str], scoped: bool = True) -> ScaledFit:
    """The KEEP candidate: BASE's terms, nothing moved (z = 0, each term's posterior its prior), whose held-out
    error on a run is BASE's error on it (nothing was fitted on it)."""
    z = np.zeros(len(active))
    terms = _terms_at(prior, active, z, frameworks, scoped)
    return ScaledFit(KEEP, terms, z, np.array([p.prior_sd for p in active]),
                     np.log(evaluate(terms) / meas))


def choose_prior_scale(evaluate: RunEvaluator, prior: EndToEndTerms, active: Sequence[TermPrior], meas: np.ndarray,
                       frameworks: Sequence[str], scoped: bool = True, scales: Sequence[float] = PRIOR_SCALES,
                       exact: bool = False) -> tuple[ScaledFit, list[ScaledFit]]:
    """(the chosen fit, every scale's fit): the prior's strength chosen by leave-one-run-out on the runs
    themselves, as a user can, never on runs the calibration does not see. Each scale x every prior sd is fitted on
    all runs, and each run's held-out error taken in closed form at the fit (its residual / (1 - its leverage), the
    first-order leave-one-out; `exact`: refitted without it, k more fits per scale, about 4x the time); the lowest
    mean wins, a tie (within TIE) going to the earlier scale (the shipped priors first). KEEP, where among `scales`,
    is BASE's terms unchanged (`kept_fit`, its held-out error BASE's own error on each run) and replaces the best fit
    only where its error is lower by more than RUN_NOISE. With fewer than MIN_RUNS_TO_CHOOSE runs only the first
    scale other than KEEP is fitted."""
    fits: list[ScaledFit] = []
    n = len(meas)
    tried = list(scales) if n >= MIN_RUNS_TO_CHOOSE else [next((s for s in scales if s != KEEP), scales[0])]
    for sc in tried:
        if sc == KEEP:
            fits.append(kept_fit(evaluate, prior, active, meas, frameworks, scoped))
            continue
        start = next((g.z for g in fits if g.scale != KEEP), None)
        f = _fit(evaluate, prior, active, meas, frameworks, None, scoped, sc, x0=start)
        if exact and n >= MIN_RUNS_TO_CHOOSE:
            loo = np.empty(n)
            for i in range(n):
                mask = np.ones(n, dtype=bool)
                mask[i] = False
                t_i, _z, _p = fit_own_terms(evaluate, prior, active, meas, frameworks, mask, scoped, sc, x0=f.z)
                loo[i] = math.log(evaluate(t_i)[i] / meas[i])
            f = replace(f, held_out_log=loo)
        fits.append(f)
    fitted = [f for f in fits if f.scale != KEEP]
    if not fitted:   # only KEEP asked for
        return fits[0], fits
    best = fitted[0]
    for f in fitted[1:]:
        if f.held_out_mape < best.held_out_mape - TIE:
            best = f
    kept = next((f for f in fits if f.scale == KEEP), None)
    if kept is not None and kept.held_out_mape < best.held_out_mape - RUN_NOISE:
        best = kept
    return best, fits


def _mape(pred: np.ndarray, meas: np.ndarray) -> tuple[float, float]:
    e = pred / meas - 1.0
    return float(np.abs(e).mean()), float(e.mean())


def _model_key(r: OwnRun) -> str:
    m = r.model   # a model: its architecture and sizes (any sequence length)
    return f"{m.arch}|{m.num_layers}|{m.hidden_size}|{m.num_heads}|{m.kv_heads}|{m.ffn}|{m.vocab_size}"


def fit_runs(base: str | Platform, runs: Sequence[OwnRun], models_dir: str | Path | None = None,
             clusters: str | None = None, held_out: bool = True, progress: Progress | None = None,
             predictor: Predictor | None = None, all_frameworks: bool = False
             ) -> tuple[EndToEndTerms, tuple[TermFit, ...], pd.DataFrame, dict[str, Any]]:
    """(terms, per-term fit, per-run table, record) of `runs` on BASE; `held_out`: also leave-one-run-out and
    leave-one-model-out (the error band). The fitted speed factors apply to the runs' frameworks only, unless
    `all_frameworks` (a framework's efficiency is in them: calibrated on one framework they made another worse)."""
    scoped = not all_frameworks
    say = progress or (lambda _m: None)
    pr = predictor or Predictor(base if isinstance(base, Platform) else get_platform(base, clusters), models_dir,
                                ComposeOptions(simulate=False))
    plat = pr.platform
    for r in runs:
        pr.check_runs(r.layout)
        plat.device.check_precision(r.layout.precision)
    prior = prior_terms(pr)
    ev = RunEvaluator(pr, runs)
    meas = np.array([r.step_time_s for r in runs])
    frameworks = sorted({r.layout.framework for r in runs})
    active = active_terms(runs, plat)
    say(f"{len(runs)} runs prepared on {plat.platform_id}; fitting {len(active)} terms")
    before = ev(prior)
    if held_out and len(runs) >= MIN_RUNS_TO_CHOOSE:
        say(f"choosing the prior's strength by leave-one-run-out: {len(PRIOR_SCALES)} fits")
    chosen, scaled = choose_prior_scale(ev, prior, active, meas, frameworks, scoped)
    terms, z_fit, post = chosen.terms, chosen.z, chosen.posterior_sd
    after = ev(terms)
    fits = []
    for p, ps in zip(active, post):
        if p.name.startswith("host_"):
            fw = frameworks[0]
            pv, v = _host_value(prior, fw, p.name), _host_value(terms, fw, p.name)
        elif p.name == COMPUTE_SCALE:
            pv, v = 1.0, float(np.exp(z_fit[[q.name for q in active].index(COMPUTE_SCALE)]))
        else:
            pv, v = float(getattr(prior, p.name)), float(getattr(terms, p.name))
        # the prior's sd as the fit used it: the strength applies to the speed and network terms, not the host's
        sd_p = p.prior_sd * (1.0 if p.name.startswith("host_") or chosen.scale == KEEP else chosen.scale)
        fits.append(TermFit(p.name, p.words, pv, v, sd_p, float(ps), bool(ps <= IDENTIFIED_SD_RATIO * sd_p)))
    loro = np.full(len(runs), np.nan)
    lomo = np.full(len(runs), np.nan)
    keys = np.array([_model_key(r) for r in runs])
    if held_out and chosen.scale == KEEP:
        # nothing fitted: every run is held out of it, and every model
        loro, lomo = before.copy(), (before.copy() if len(set(keys)) >= 2 else lomo)
    elif held_out and len(runs) >= 2:
        say(f"leave-one-run-out: {len(runs)} fits")
        for i in range(len(runs)):
            mask = np.ones(len(runs), dtype=bool)
            mask[i] = False
            t_i, _z, _p = fit_own_terms(ev, prior, active, meas, frameworks, mask, scoped, chosen.scale, x0=z_fit)
            loro[i] = ev(t_i)[i]
    if held_out and chosen.scale != KEEP and len(runs) >= 2 and len(set(keys)) >= 2:
        say(f"leave-one-model-out: {len(set(keys))} fits")
        for k in sorted(set(keys)):
            mask = keys != k
            t_k, _z, _p = fit_own_terms(ev, prior, active, meas, frameworks, mask, scoped, chosen.scale, x0=z_fit)
            lomo[~mask] = ev(t_k)[~mask]
    table = pd.DataFrame({
        "line": [r.line for r in runs], "source": [r.source for r in runs],
        "model": [f"{r.model.arch} {r.model.num_layers}L h{r.model.hidden_size}" for r in runs],
        "gpus": [r.layout.num_gpus for r in runs],
        "layout": [f"tp{r.layout.tp} pp{r.layout.pp} dp{r.layout.dp} mb{r.layout.micro_batch} "
                   f"gb{r.layout.global_batch}" for r in runs],
        "measured_s": meas, "before_s": before, "after_s": after, "held_out_s": loro, "held_out_model_s": lomo})
    for c in ("before", "after", "held_out", "held_out_model"):
        table[f"{c}_error"] = table[f"{c}_s"] / table["measured_s"] - 1.0
    b_m, b_s = _mape(before, meas)
    a_m, a_s = _mape(after, meas)
    rec: dict[str, Any] = {
        "base": plat.platform_id, "runs": len(runs), "frameworks": frameworks, "frameworks_scoped": scoped,
        "model_params": sorted({float(r.model.total_params()) for r in runs}),
        "max_nodes": max(plat.nodes_for(r.layout.num_gpus) for r in runs),
        "sources": sorted({r.source for r in runs}),
        "before_mape": b_m, "before_mean_signed": b_s, "in_sample_mape": a_m, "in_sample_mean_signed": a_s,
        "held_out_mape": None, "held_out_mean_signed": None, "held_out_model_mape": None,
        "held_out_model_mean_signed": None, "models": len(set(keys)),
        "prior_scale": chosen.scale, "kept_base": chosen.scale == KEEP,
        "prior_scales_held_out_mape": {scale_label(f.scale): f.held_out_mape for f in scaled if len(scaled) > 1},
        "terms": [{"name": f.name, "prior": f.prior, "value": f.value, "prior_sd_log": f.prior_sd,
                   "posterior_sd_log": f.posterior_sd, "identified": f.identified} for f in fits],
        "per_run": [{"line": int(r.line), "source": r.source, "measured_s": float(m_), "before_s": float(b_),
                     "after_s": float(a_), "held_out_s": None if math.isnan(h_) else float(h_)}
                    for r, m_, b_, a_, h_ in zip(runs, meas, before, after, loro)],
        "fitted_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if not np.isnan(loro).any():
        rec["held_out_mape"], rec["held_out_mean_signed"] = _mape(loro, meas)
    if not np.isnan(lomo).any():
        rec["held_out_model_mape"], rec["held_out_model_mean_signed"] = _mape(lomo, meas)
    ident = [f.name for f in fits if f.identified]
    src = (f"calibrated on {len(runs)} of your runs from {plat.platform_id} (predictor.calibrate.runs): "
           + (f"{plat.platform_id}'s terms kept (no fit predicted the runs left out of it as well)"
              if chosen.scale == KEEP else
              f"identified: {', '.join(ident) or 'none'}; the rest stay at {plat.platform_id}'s"))
    terms = replace(terms, validation={**prior.validation, "own_runs": rec}, fitted_at=rec["fitted_at"], source=src)
    return terms, tuple(fits), table, rec


# ---- saving -----------------------------------------------------------------------------------------------
def check_save_as(new: str, base: Platform, clusters: str | Path) -> str:
    """NEW if it may be saved: a safe id, not shipped, not BASE, not a user cluster calibrate-runs did not make."""
    new = paths.check_id(new, "save_as")
    if is_shipped(new):
        raise InfeasibleConfig("save_as", f"'{new}' is a shipped platform; calibrate-runs never overwrites one.",
                               f"give the calibrated platform a name of its own, e.g. --save-as my-{new}.")
    if new == base.platform_id:
        raise InfeasibleConfig("save_as", f"'{new}' is the platform the runs calibrate.",
                               "give the calibrated platform a name of its own.")
    p = Path(clusters)
    if p.is_file():
        existing = load_platforms(str(p)).get(new)
        if existing is not None and not existing.calibrated_from:
            raise InfeasibleConfig("save_as", f"'{new}' is a cluster you defined in {p}, not one calibrate-runs "
                                   "made.", "choose another name (calibrate-runs replaces only its own platforms).")
    return new


def _user_dir_checked(user_dir: str | Path | None) -> Path:
    d = paths.user_models_dir(user_dir)
    try:
        inside = d.resolve().is_relative_to(paths.PACKAGED_MODELS_DIR.resolve())
    except OSError:
        inside = False
    if inside:
        raise InfeasibleConfig("user_models_dir", f"{d} lies inside the shipped models_store/.",
                               "set $PREDICTOR_USER_MODELS_DIR (or --user-models-dir) to a folder of your own.")
    return d


def new_platform(base: Platform, new: str, models_dir: str | Path | None, n_runs: int) -> Platform:
    """NEW: BASE's device, links, regressors and network calibration, marked as calibrated from BASE."""
    own_net = (paths.models_dir(models_dir) / base.platform_id / "network.json").is_file()
    return replace(base, platform_id=new, user_defined=True, calibrated_from=base.platform_id,
                   description=f"{base.description or base.platform_id}; calibrated on {n_runs} of your runs",
                   op_models=base.op_models or base.platform_id,
                   collective_calibration=base.platform_id if own_net else base.collective_calibration,
                   sources=(*base.sources, f"calibrated on {n_runs} measured runs (python -m predictor "
                                           f"calibrate-runs, from {base.platform_id})"))


def save_calibrated(terms: EndToEndTerms, platform: Platform, clusters: str | Path,
                    user_dir: str | Path | None = None) -> tuple[Path, Path]:
    """Write NEW's terms (atomically, read back and compared) and then its cluster entry; (terms file, clusters)."""
    d = _user_dir_checked(user_dir)
    path = paths.user_artifact(platform.platform_id, paths.OWN_RUNS_TERMS, d)
    data = terms.to_dict()
    terms_from_dict(data, path)   # refuse to write what would not load back
    old = paths.read_bytes_checked(path)
    paths.write_json_atomic(path, data)
    back = terms_from_dict(paths.read_json_checked(path), path)
    if back.to_dict() != terms_from_dict(data, path).to_dict():
        raise paths.ArtifactError(path, None, "does not read back as written")
    try:
        cl = save_cluster(clusters, platform)
    except BaseException:
        if old is None:
            path.unlink(missing_ok=True)
        else:
            paths.write_bytes_atomic(path, old)
        raise
    from predictor.plan.predict import get_predictor
    get_predictor.cache_clear()   # a cached predictor of an earlier NEW must not outlive it
    return path, cl


def calibrate_runs(runs_csv: str | bytes | Path, base: str, save_as: str | None, *,
                   models_dir: str | Path | None = None, clusters: str | Path | None = None,
                   user_dir: str | Path | None = None, save: bool = True,
                   progress: Progress | None = None, all_frameworks: bool = False) -> RunsCalibration:
    """Read and check RUNS.csv, fit BASE's terms on it, score it leave-one-run-out, and (with `save` and
    `save_as`) save it as the user platform NEW. Every check runs before anything is fitted or written."""
    cl_path = paths.clusters_file(clusters)
    base_p = get_platform(paths.check_id(base, "platform"), str(cl_path) if cl_path.is_file() else None)
    if save:
        if not save_as:
            raise InfeasibleConfig("save_as", "is missing.", "name the calibrated platform: --save-as my-cluster.")
        check_save_as(save_as, base_p, cl_path)
        _user_dir_checked(user_dir)
    runs = read_runs_csv(runs_csv, base_p.platform_id)
    terms, fits, table, rec = fit_runs(base_p, runs, models_dir, progress=progress, all_frameworks=all_frameworks)
    tp = cp = None
    if save and save_as:
        plat = new_platform(base_p, save_as, models_dir, len(runs))
        tp, cp = save_calibrated(terms, plat, cl_path, user_dir)
    return RunsCalibration(base_p.platform_id, save_as, terms, fits, table, rec, tp, cp)


KIND_TERMS = ("gemm_factor", "attention_factor", "memory_factor")


def scale_label(scale: float) -> str:
    """A candidate of `choose_prior_scale` in words: 'keep' (BASE's terms unchanged) or 'x<strength>'."""
    return "keep" if scale == KEEP else f"x{scale:g}"


def choice_words(rec: dict[str, Any], base: str) -> str:
    """What the calibration chose and why, from its record: BASE's terms kept, or the prior's strength, with every
    candidate's leave-one-run-out error on the runs ('' with fewer runs than a choice needs)."""
    scales = rec.get("prior_scales_held_out_mape") or {}
    if not scales:
        return ""
    errors = ", ".join(f"{k}: {v:.1%}" for k, v in scales.items())
    if rec.get("kept_base"):
        return (f"kept {base}'s terms: {base} predicts these runs better than any fit predicts them left out of it, "
                f"by more than the {RUN_NOISE:.0%} run-to-run noise (leave-one-run-out: {errors})")
    return f"prior sd x{rec['prior_scale']:g}, chosen by leave-one-run-out on the runs ({errors})"


def identified_words(f: TermFit) -> str:
    """Whether the runs identified a term, in words: a kind of work the runs cannot tell apart still moves with the
    common scale (its fitted value is the scale x its own factor), any other term stays near the prior."""
    if f.identified:
        return "identified"
    if f.name in KIND_TERMS:
        return f"not identified: moves with {COMPUTE_SCALE}"
    return "not identified: stays near the prior"


def terms_table(fits: Sequence[TermFit]) -> pd.DataFrame:
    return pd.DataFrame([{"term": f.name, "what": f.words, "prior": f.prior, "fitted": f.value,
                          "prior_sd": f.prior_sd, "posterior_sd": f.posterior_sd,
                          "identified": identified_words(f)} for f in fits])

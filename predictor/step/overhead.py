"""Host (framework) overhead: the time the CPU side of an eager framework needs to issue the
kernels of one transformer layer, which sampled kernel times do not contain.

Operator samples time kernels alone. A real eager-mode step also spends host time in Python,
the autograd engine, checkpointing wrappers and kernel launches. The host runs ahead of the GPU
while kernels are long; when they are short the GPU waits for the host. Per pipeline chunk and
micro-batch, with G the GPU time (compute + TP communication) of a pass and H the host time to
issue it,

    T = (G**p + H**p) ** (1/p)        (p = 1: no overlap, p -> inf: perfect overlap, max(G, H))

H = layers * host_s_per_layer_pass * passes, where the forward group has one pass and the backward
group has one pass plus one more per layer recomputed in full (selective recomputation re-runs the
attention core only and is counted as a quarter pass).

The two numbers (host_s_per_layer_pass, blend_p) are not guessed: `fit_host_overhead` fits them on
measured end-to-end runs of a platform (`python -m predictor calibrate-host`), with K-fold
cross-validation grouped by model so that every scored run belongs to a model the fit did not
see. The result lives in models_store/<platform>/host_overhead.json with its provenance; a
platform without that file has no host term (its predictions are kernel time only, and say so).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from predictor.paths import ArtifactError, check_number, load_checked, platform_dir, write_json_atomic

HOST_OVERHEAD_FILE = "host_overhead.json"
MAX_HOST_S_PER_LAYER_PASS = 1.0   # a host second per layer pass is no framework's overhead: a corrupt file
log = logging.getLogger(__name__)
RECOMPUTE_PASSES = {"none": 0.0, "selective": 0.25, "full": 1.0}


@dataclass(frozen=True)
class HostOverhead:
    host_s_per_layer_pass: float
    blend_p: float
    source: str = ""
    fitted_on_runs: int = 0
    cv_mape: float | None = None
    fit_mape: float | None = None

    @staticmethod
    def passes(phase: str, recompute: str) -> float:
        """Host passes per layer: 1 for the forward group; 1 + recomputation for the backward group."""
        return 1.0 if phase == "fwd" else 1.0 + RECOMPUTE_PASSES.get(recompute, 0.0)

    def extra_s(self, gpu_s, layers, phase: str, recompute: str):
        """Seconds the host adds to a chunk's pass of `gpu_s` GPU time over `layers` layers
        (works on floats and numpy arrays)."""
        return self.extra_for_passes_s(gpu_s, layers, self.passes(phase, recompute))

    def extra_for_passes_s(self, gpu_s, layers, passes):
        """`extra_s` with the host passes per layer given (a number or an array broadcast against
        `gpu_s`, e.g. one recomputation setting per search row)."""
        g = np.asarray(gpu_s, dtype="float64")
        h = np.asarray(layers, dtype="float64") * self.host_s_per_layer_pass * np.asarray(passes, dtype="float64")
        return blend(g, h, self.blend_p) - g

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def blend(g, h, p: float):
    g = np.asarray(g, dtype="float64")
    h = np.asarray(h, dtype="float64")
    if not np.isfinite(p):
        return np.maximum(g, h)
    # scale for numerical safety with large p
    m = np.maximum(np.maximum(g, h), 1e-30)
    return m * ((g / m) ** p + (h / m) ** p) ** (1.0 / p)


def host_overhead_from_dict(d: Any, path: str | Path = HOST_OVERHEAD_FILE) -> HostOverhead:
    """The HostOverhead of a parsed host_overhead.json, its values checked: host_s_per_layer_pass
    finite, >= 0 and < 1 s; blend_p finite and >= 1 (p < 1 would make the blend exceed G + H) or
    null (= infinity: max(G, H)); fitted_on_runs a count; cv_mape / fit_mape finite >= 0 or null.
    ArtifactError naming `path` and the field otherwise."""
    if not isinstance(d, dict):
        raise ArtifactError(path, None, f"must be a JSON object, not {type(d).__name__}")
    for k in ("host_s_per_layer_pass", "blend_p"):
        if k not in d:
            raise ArtifactError(path, k, "is missing")
    h = check_number(path, "host_s_per_layer_pass", d["host_s_per_layer_pass"], ge=0, lt=MAX_HOST_S_PER_LAYER_PASS)
    p = d["blend_p"]
    p = float("inf") if p is None else check_number(path, "blend_p", p, ge=1)
    runs = check_number(path, "fitted_on_runs", d.get("fitted_on_runs", 0), ge=0, integer=True)
    cv = check_number(path, "cv_mape", d.get("cv_mape"), ge=0, optional=True)
    fit = check_number(path, "fit_mape", d.get("fit_mape"), ge=0, optional=True)
    src = d.get("source", "")
    if not isinstance(src, str):
        raise ArtifactError(path, "source", f"must be a string, not {type(src).__name__}")
    return HostOverhead(host_s_per_layer_pass=float(h), blend_p=float(p), source=src, fitted_on_runs=int(runs),
                        cv_mape=cv, fit_mape=fit)


def load_host_overhead_checked(models_dir: str | Path, platform_id: str) -> tuple[HostOverhead | None, str | None]:
    """(overhead, None) from models_store/<platform>/host_overhead.json; (None, None) without the file;
    (None, warning) when it is unreadable or a value is out of range: the prediction then has no host
    term, and the warning (naming the file and field) says so."""
    path = platform_dir(platform_id, models_dir) / HOST_OVERHEAD_FILE
    ho, warn = load_checked(path, lambda d: host_overhead_from_dict(d, path))
    if warn:
        warn = f"Host overhead not modelled: {warn}"
    return ho, warn


def load_host_overhead(models_dir: str | Path, platform_id: str) -> HostOverhead | None:
    """`load_host_overhead_checked` without the warning (it is logged): None when the file is missing
    or unusable."""
    ho, warn = load_host_overhead_checked(models_dir, platform_id)
    if warn:
        log.warning(warn)
    return ho


# --------------------------------------------------------------------------- fitting
def _mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - meas) / meas))


def _search(evaluate: Callable[[float, float], np.ndarray], meas: np.ndarray, idx: np.ndarray,
            grid_h: np.ndarray, grid_p: tuple[float, ...]) -> tuple[float, float]:
    """Coarse grid over (h, p), then a finer grid of h around the best, minimising MAPE on idx."""
    best = (np.inf, 0.0, 1.0)
    for p in grid_p:
        for h in grid_h:
            e = _mape(evaluate(h, p)[idx], meas[idx])
            if e < best[0]:
                best = (e, h, p)
    _, h0, p0 = best
    step = (grid_h[1] - grid_h[0]) if len(grid_h) > 1 else h0 * 0.1
    for h in np.linspace(max(0.0, h0 - step), h0 + step, 21):
        e = _mape(evaluate(h, p0)[idx], meas[idx])
        if e < best[0]:
            best = (e, h, p0)
    return best[1], best[2]


def fit_host_overhead(evaluate: Callable[[float, float], np.ndarray], measured_s: np.ndarray,
                      groups: np.ndarray, *, folds: int = 5, source: str = "",
                      grid_h: np.ndarray | None = None, grid_p: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0),
                      progress: Callable[[str], None] | None = None) -> tuple[HostOverhead, dict[str, Any]]:
    """Fit (host_s_per_layer_pass, blend_p). `evaluate(h, p)` returns the predicted step time of every
    run with those parameters. Cross-validation holds out whole groups (models), `folds` of them."""
    meas = np.asarray(measured_s, dtype="float64")
    groups = np.asarray(groups)
    grid_h = np.linspace(0.0, 3e-3, 31) if grid_h is None else grid_h
    uniq = np.unique(groups)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(uniq))
    fold_of = {uniq[j]: i % folds for i, j in enumerate(order)}
    f = np.array([fold_of[g] for g in groups])
    held = np.zeros_like(meas)
    for k in range(folds):
        train = np.nonzero(f != k)[0]
        test = np.nonzero(f == k)[0]
        if not len(test) or not len(train):
            continue
        h, p = _search(evaluate, meas, train, grid_h, grid_p)
        held[test] = evaluate(h, p)[test]
        if progress:
            progress(f"fold {k + 1}/{folds}: host {h * 1e3:.3f} ms/layer-pass, p {p:g}, "
                     f"held-out MAPE {_mape(held[test], meas[test]):.1%}")
    h, p = _search(evaluate, meas, np.arange(len(meas)), grid_h, grid_p)
    fit_pred = evaluate(h, p)
    none_pred = evaluate(0.0, 1.0)
    ho = HostOverhead(host_s_per_layer_pass=float(h), blend_p=float(p), source=source,
                      fitted_on_runs=int(len(meas)), cv_mape=_mape(held, meas), fit_mape=_mape(fit_pred, meas))
    report = {"cv_mape": ho.cv_mape, "fit_mape": ho.fit_mape, "no_host_mape": _mape(none_pred, meas),
              "folds": folds, "groups": int(len(uniq)), "fitted_at": datetime.now(UTC).isoformat(timespec="seconds")}
    return ho, report


def save_host_overhead(models_dir: str | Path, platform_id: str, ho: HostOverhead, report: dict[str, Any]) -> Path:
    path = platform_dir(platform_id, models_dir) / HOST_OVERHEAD_FILE
    d = {**asdict(ho), "report": report,
         "model": "per chunk and micro-batch pass: T = (G**p + H**p)**(1/p), H = layers * host_s_per_layer_pass * "
                  "passes (forward 1; backward 1 + 1 per fully recomputed layer, 0.25 selective); "
                  "see predictor/step/overhead.py"}
    if not np.isfinite(ho.blend_p):
        d["blend_p"] = None  # infinity (max(G, H)) as JSON
    host_overhead_from_dict(json.loads(json.dumps(d, default=float)), path)  # never write what would not load
    return write_json_atomic(path, d)

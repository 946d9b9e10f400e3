"""Per-(platform, operator, pass) and per-(platform, collective) regressors, and the bank that serves them.

Target: log(duration_s / roofline_s), where roofline_s is the analytic estimate of `features.py`;
LightGBM then learns only the efficiency, which is bounded and extrapolates in shape.

Robust training (every step counted and written to the metadata):
  1. exact duplicate rows (same inputs, same duration) are dropped;
  2. physical bound: a row faster than PHYSICAL_BOUND x roofline cannot be a measurement of the
     op's full work (0.5 for compute-bound ops and collectives, 0.25 for memory-bound ops, whose
     nominal byte counts caches or in-place kernels can legitimately halve) and is dropped; so is a
     row slower than 100 x roofline and 0.1 s (a gross corruption, e.g. the 3.5-54 s GH200 optimizer
     rows, which form a whole region no residual filter can see);
  3. residual filter: a robust L1 (median) fit, then rows with |log residual - median| >
     max(3 * 1.4826 * MAD, log 1.5) are dropped and the model is refit (L2 on the log target) on the rest.
Cross-validation (`cv_folds` > 1): shuffled K-fold on the rows kept after steps 1-2; each fold runs
step 3 on its own training part and is scored on ALL its held-out rows (residual outliers
included). `cv_mape_clean_` excludes the rows the full-data residual filter flags, and
`mape_all_rows_` adds the physically impossible rows, predicted by the final model.

Files: `<dir>/<op>.<pass>.txt` (LightGBM text) + `<op>.<pass>.json`, `collective.<name>.txt/.json`.
No pickle anywhere. Written atomically, the .txt first (`save`); the sidecar's `model_file` record
(sha256, size and tree count of the .txt) lets `verify_model` refuse a cut, swapped or edited file
before LightGBM reads it (LightGBM crashes the process on a cut file); `ModelBank.problems` lists
what a platform's bank left out.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import platform as _pyplatform
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from predictor.regress.lgb_import import import_lightgbm, single_thread_predictor

if TYPE_CHECKING:
    import lightgbm as lgb
else:
    lgb = import_lightgbm()

# The imports below come after import_lightgbm() on purpose: lightgbm must load before anything else has
# imported pandas or scikit-learn, or it imports their (slow) integrations (see lgb_import.py).
if TYPE_CHECKING:
    import pandas as pd
import numpy as np

from predictor import paths
from predictor.model import ops
from predictor.paths import (
    ArtifactError,
    check_number,
    json_default_strict,
    read_bytes_checked,
    read_json_checked,
    write_bytes_atomic,
)
from predictor.regress import features as F

log = logging.getLogger(__name__)

MODELS_DIR = paths.PACKAGED_MODELS_DIR  # kept for callers; use paths.models_dir() (honours $PREDICTOR_MODELS_DIR)
RESIDUAL_MAD_K = 3.0
RESIDUAL_MIN_LOG = math.log(1.5)
PHYSICAL_BOUND_COMPUTE = 0.5
PHYSICAL_BOUND_MEMORY = 0.25
PHYSICAL_BOUND_COLLECTIVE = 0.5
# implausibly slow: one operator / collective call taking > 0.1 s at < 1% of its roofline (the GH200
# first-stage optimizer rows of 3.5-54 s form a whole corrupt region that no residual filter can see)
SLOW_BOUND_RATIO = 100.0
SLOW_BOUND_MIN_S = 0.1
SYSTEMATIC_WARN_FRACTION = 0.05
UNRELIABLE_FRACTION = 0.2  # above this share of physically impossible rows a model is marked unreliable
# slope of log(duration) on log(roofline) over the rows used: ~1 when the samples scale with the op's work
SCALING_WARN_SLOPE = 0.5
SCALING_UNRELIABLE_SLOPE = 0.2
TARGET_DESCRIPTION = "log(duration_s / roofline_s); prediction = roofline_s * exp(model)"
PAPER_SOURCE = ("arXiv 2509.22832 operator/NCCL samples, github.com/DebarghaG/estimate-train-time "
                "(src/estimate_train_time/data/regressors/)")
PAPER_LICENCE = "MIT"

DEFAULT_PARAMS: dict[str, Any] = {
    # small on purpose: ~3000 leaves per model keeps models_store a few MB; CV-checked against 500 x 31
    "objective": "l1", "learning_rate": 0.1, "num_boost_round": 170, "num_leaves": 15,
    "min_data_in_leaf": 5, "min_data_in_bin": 1, "max_bin": 255, "feature_fraction": 1.0,
    "bagging_fraction": 1.0, "lambda_l2": 0.0, "seed": 0, "deterministic": True, "force_row_wise": True,
    # one thread: OpenMP spin-waits make 2 threads 10-20x slower on a shared, loaded machine
    "num_threads": 1, "verbosity": -1,
}
OBJECTIVE_CANDIDATES = ("regression", "l1")
SMALL_DATA_ROWS, SMALL_DATA_LEAVES = 1000, 7
# collectives: one model spans every topology of a platform, so it gets more room (6 models per platform)
COLLECTIVE_CAPACITY = {"num_leaves": 31, "num_boost_round": 300}
FILTER_PARAMS: dict[str, Any] = {"objective": "l1", "min_data_in_leaf": 10}
FILTER_MAX_ROUNDS = 300


# --------------------------------------------------------------------------- helpers
def _versions() -> dict[str, str]:
    import pandas as pd
    import sklearn
    return {"lightgbm": lgb.__version__, "sklearn": sklearn.__version__, "numpy": np.__version__,
            "pandas": pd.__version__, "python": _pyplatform.python_version()}


def _train_booster(X: np.ndarray, y: np.ndarray, names: list[str], params: Mapping[str, Any]) -> lgb.Booster:
    p = dict(params)
    rounds = int(p.pop("num_boost_round", 500))
    n = len(y)
    # keep tiny data sets trainable
    p["min_data_in_leaf"] = max(1, min(int(p.get("min_data_in_leaf", 5)), n // 4 or 1))
    ds = lgb.Dataset(X, label=y, feature_name=names, free_raw_data=True,
                     params={"min_data_in_bin": p.get("min_data_in_bin", 1), "max_bin": p.get("max_bin", 255),
                             "verbosity": -1})
    return lgb.train(p, ds, num_boost_round=rounds)


def residual_filter(X: np.ndarray, y: np.ndarray, names: list[str], params: Mapping[str, Any]
                    ) -> tuple[np.ndarray, dict[str, Any]]:
    """Robust fit (L1 on the log target: LightGBM sets leaf values to residual medians, so it is robust
    and, unlike Huber with a small delta, converges on targets spanning orders of magnitude), then keep
    rows within max(3*1.4826*MAD, log 1.5) of the median residual.
    Returns (keep mask, info)."""
    n = len(y)
    if n < 20:
        return np.ones(n, bool), {"applied": False, "reason": "fewer than 20 rows"}
    fp = {**params, **FILTER_PARAMS,
          "num_boost_round": min(FILTER_MAX_ROUNDS, int(params.get("num_boost_round", FILTER_MAX_ROUNDS)))}
    booster = _train_booster(X, y, names, fp)
    r = y - booster.predict(X)
    med = float(np.median(r))
    mad = float(np.median(np.abs(r - med)))
    thr = max(RESIDUAL_MAD_K * 1.4826 * mad, RESIDUAL_MIN_LOG)
    keep = np.abs(r - med) <= thr
    return keep, {"applied": True, "threshold_log": thr, "mad_log": mad, "median_log": med,
                  "removed": int((~keep).sum()),
                  "rule": f"|log residual - median| > max({RESIDUAL_MAD_K}*1.4826*MAD, log 1.5) after an L1 fit"}


_DROP_TREE_KEYS = ("split_gain=", "leaf_weight=", "leaf_count=", "internal_value=", "internal_weight=",
                   "internal_count=", "tree_sizes=")


def compact_model_text(text: str) -> str:
    """LightGBM model text without what prediction does not read (split gains, weights and counts,
    the tree byte offsets, parameters and importances after 'end of trees'), leaf values to 7
    significant digits and thresholds to 10. Still a LightGBM text model (`lgb.Booster(model_file=)`)."""
    out = []
    for line in text[:text.index("end of trees")].split("\n"):
        if line.startswith(_DROP_TREE_KEYS):
            continue
        if line.startswith("leaf_value="):
            line = "leaf_value=" + " ".join(f"{float(v):.7g}" for v in line[11:].split())
        elif line.startswith("threshold="):
            line = "threshold=" + " ".join(f"{float(v):.10g}" for v in line[10:].split())
        out.append(line)
    return "\n".join(out) + "end of trees\n"


def _ape(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    return np.abs(pred - true) / true


def _metrics(ape: np.ndarray) -> dict[str, float | None]:
    if len(ape) == 0:
        return {"mape": None, "median_ape": None, "p90_ape": None, "n": 0}
    return {"mape": float(np.mean(ape)), "median_ape": float(np.median(ape)),
            "p90_ape": float(np.percentile(ape, 90)), "n": int(len(ape))}


def _data_hash(X: np.ndarray, y: np.ndarray) -> str:
    h = hashlib.sha256()
    order = np.lexsort(np.column_stack([X, y]).T[::-1])
    h.update(np.ascontiguousarray(X[order]).tobytes())
    h.update(np.ascontiguousarray(y[order]).tobytes())
    return h.hexdigest()[:16]




def _clean_json(o: Any) -> Any:
    """NaN/inf -> None so the JSON stays strict."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _clean_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean_json(v) for v in o]
    return o


def write_model_pair(txt: Path, txt_bytes: bytes, meta: Path, meta_bytes: bytes) -> None:
    """Replace the pair `txt` + `meta` atomically file by file, the .txt first; when the .json cannot
    be written the previous .txt is restored (or the new one removed), and the error propagates."""
    old = read_bytes_checked(txt)
    write_bytes_atomic(txt, txt_bytes)
    try:
        write_bytes_atomic(meta, meta_bytes)
    except BaseException:
        try:
            if old is None:
                txt.unlink(missing_ok=True)
            else:
                write_bytes_atomic(txt, old)
        except OSError as e:  # the pair now mismatches; verify_model reports it by its hash
            log.error("%s could not be restored after a failed save: %s", txt, e)
        raise


# --------------------------------------------------------------------------- base
class _LogEfficiencyRegressor:
    """Shared fit / CV / save / load machinery; subclasses provide the feature matrix."""

    kind = "op"
    physical_bound = PHYSICAL_BOUND_COMPUTE
    slow_bound = True  # drop grossly slow (corrupt) rows; independent of the physical (fast) bound
    # set by fit(), or read back by load() from metadata that may lack them (hence None)
    objective_: str | None
    n_samples_: int | None
    n_used_: int | None
    n_outliers_removed_: int | None
    data_hash_: str | None
    train_ratio_range_: list[float] | None
    trained_at_: str | None

    def __init__(self, params: Mapping[str, Any] | None = None):
        self.params = dict(params or {})

    # subclasses build (X, roofline) from their inputs and call _fit_arrays
    capacity: ClassVar[dict[str, Any]] = {}  # read-only; subclasses replace it

    def _full_params(self) -> dict[str, Any]:
        """DEFAULT_PARAMS, then the class capacity, then size-dependent leaves (7 leaves below 1000
        training rows: the small sample sets are smooth and noisy), then the caller's params."""
        p = {**DEFAULT_PARAMS, **self.capacity}
        n_fit = getattr(self, "_n_fit", None)
        if n_fit is not None and n_fit < SMALL_DATA_ROWS and "num_leaves" not in self.capacity:
            p["num_leaves"] = SMALL_DATA_LEAVES
        return {**p, **self.params}

    def _filter(self, X: np.ndarray, y_log: np.ndarray, names: list[str], filter_outliers: bool
                ) -> tuple[np.ndarray, dict[str, Any]]:
        if filter_outliers:
            return residual_filter(X, y_log, names, self._full_params())
        return np.ones(len(y_log), bool), {"applied": False, "reason": "disabled"}

    def _objectives(self, cv_folds: int) -> list[str]:
        """Candidate objectives: the caller's, else L2 and L1 chosen by CV (L1 = conditional median of
        the log-efficiency, which suits heavy-tailed timing noise; L2 suits low-noise ops)."""
        if "objective" in self.params:
            return [str(self.params["objective"])]
        return list(OBJECTIVE_CANDIDATES) if cv_folds and cv_folds > 1 else [DEFAULT_PARAMS["objective"]]

    def _fit_arrays(self, X: np.ndarray, roof: np.ndarray, durations: np.ndarray, names: list[str], *,
                    dedupe_keys: np.ndarray, groups: np.ndarray | None, cv_folds: int,
                    filter_outliers: bool, progress: Callable[[str], None] | None = None) -> None:
        import pandas as pd
        n_in = len(durations)
        ok = np.isfinite(durations) & (durations > 0) & np.all(np.isfinite(X[:, [names.index("log2_roofline")]]),
                                                                axis=1)
        n_invalid = int((~ok).sum())
        # 1. exact duplicates
        keyframe = pd.DataFrame(np.column_stack([dedupe_keys, durations]))
        dup = keyframe.duplicated().to_numpy() & ok
        # 2. physical bound (too fast to be the op's full work) and gross slowness (corrupt)
        ratio = durations / roof
        impossible = ok & ~dup & (ratio < self.physical_bound)
        too_slow = ok & ~dup & ~impossible & (ratio > SLOW_BOUND_RATIO) & (durations > SLOW_BOUND_MIN_S) \
            if self.slow_bound else np.zeros(n_in, bool)
        use = ok & ~dup & ~impossible & ~too_slow
        self._n_fit = int(use.sum())
        Xu, yu_log, du, ru = X[use], np.log(durations[use] / roof[use]), durations[use], roof[use]
        gu = groups[use] if groups is not None else None
        if len(du) < 5:
            raise ValueError(f"{self._label()}: only {len(du)} usable samples (need 5)")

        # CV (residual filter inside each training fold, shared by the candidate objectives)
        cv: dict[str, Any] = {"folds": 0}
        objectives = self._objectives(cv_folds)
        oofs = {o: np.full(len(du), np.nan) for o in objectives}
        if cv_folds and cv_folds > 1 and len(du) >= 2 * cv_folds:
            from sklearn.model_selection import KFold
            kf = KFold(n_splits=cv_folds, shuffle=True, random_state=0)
            for k, (tr, te) in enumerate(kf.split(Xu)):
                kp, _ = self._filter(Xu[tr], yu_log[tr], names, filter_outliers)
                for o in objectives:
                    b = _train_booster(Xu[tr][kp], yu_log[tr][kp], names, {**self._full_params(), "objective": o})
                    oofs[o][te] = ru[te] * np.exp(b.predict(Xu[te]))
                if progress:
                    progress(f"{self._label()}: fold {k + 1}/{cv_folds}")
            cv = {"folds": cv_folds, "protocol": f"{cv_folds}-fold shuffled KFold (random_state=0) on rows kept "
                  "after dedupe + physical bound; residual filter fit inside each training fold; scored on all "
                  "held-out rows"}
            by_obj = {o: float(np.mean(_ape(oofs[o], du))) for o in objectives}
            chosen = min(objectives, key=lambda o: by_obj[o])
            if len(objectives) > 1:
                cv["objective_selection"] = {"cv_mape": by_obj, "chosen": chosen,
                                             "note": "objective picked by this CV (a choice between two; the "
                                                     "reported CV is that of the chosen one)"}
        else:
            chosen = objectives[0]
        self.objective_ = chosen
        oof = oofs[chosen]
        if progress:
            progress(f"{self._label()}: final fit")
        keep, finfo = self._filter(Xu, yu_log, names, filter_outliers)
        booster = _train_booster(Xu[keep], yu_log[keep], names, {**self._full_params(), "objective": chosen})

        # metrics
        if cv["folds"]:
            ape = _ape(oof, du)
            cv.update(_metrics(ape))
            cv["clean"] = _metrics(ape[keep])
            # all rows including physically impossible ones, predicted by the final model
            imp_idx = np.where(impossible)[0]
            ape_imp = _ape(roof[imp_idx] * np.exp(booster.predict(X[imp_idx])), durations[imp_idx]) \
                if len(imp_idx) else np.array([])
            cv["all_rows"] = _metrics(np.concatenate([ape, ape_imp]))
            if gu is not None and groups is not None:
                by = {}
                gi = groups[impossible] if len(imp_idx) else np.array([], dtype=object)
                for g in pd.unique(gu):
                    m = gu == g
                    entry = {"scored": _metrics(ape[m]), "clean": _metrics(ape[m & keep])}
                    mi = gi == g
                    entry["all_rows"] = _metrics(np.concatenate([ape[m], ape_imp[mi]]))
                    by[str(g)] = entry
                cv["by_group"] = by
        self.booster_ = booster
        used = np.zeros(n_in, bool)
        used[np.where(use)[0][keep]] = True
        self.used_mask_ = used  # rows the final model was trained on (not persisted)
        self.feature_names_ = list(names)
        self.n_samples_ = int(n_in)
        self.n_used_ = int(keep.sum())
        self.n_outliers_removed_ = int(impossible.sum() + too_slow.sum() + (~keep).sum())
        frac_imp = float(impossible.sum() / max(ok.sum() - dup.sum(), 1))
        self.filter_report_ = {
            "input_rows": int(n_in), "invalid_rows": n_invalid, "duplicates_removed": int(dup.sum()),
            "physical_bound": {"factor": self.physical_bound, "removed": int(impossible.sum()),
                               "fraction": frac_imp,
                               "rule": f"duration < {self.physical_bound} x roofline_s (faster than physically "
                                       "possible for the op's nominal work)"},
            "implausibly_slow": {"removed": int(too_slow.sum()),
                                 "rule": f"duration > {SLOW_BOUND_RATIO:g} x roofline_s and > {SLOW_BOUND_MIN_S:g} s"
                                         if self.slow_bound else "disabled"},
            "residual": dict(finfo),
            "trained_on": int(keep.sum()),
        }
        warnings = []
        if frac_imp > SYSTEMATIC_WARN_FRACTION:
            warnings.append(f"{frac_imp:.0%} of the samples are faster than {self.physical_bound} x the roofline: "
                            "they probably do not time the op's full work (a sampling artefact); the model is "
                            "trained on the physically plausible rest")
        slope = None
        base = ok & ~dup  # before the physical bound: impossible rows are the strongest evidence here
        if base.sum() >= 10 and np.ptp(np.log(roof[base])) > 0:
            slope = float(np.polyfit(np.log(roof[base]), np.log(durations[base]), 1)[0])
            if slope < SCALING_WARN_SLOPE:
                warnings.append(f"durations scale with the op's nominal work with slope {slope:.2f} (log-log; ~1 "
                                "expected): outside the sampled range the model is an extrapolation of a pattern "
                                "the roofline does not explain; use with care")
        self.work_scaling_slope_ = slope
        self.warnings_ = warnings
        self.reliable_ = frac_imp <= UNRELIABLE_FRACTION and (slope is None or slope >= SCALING_UNRELIABLE_SLOPE)
        self.cv_ = cv
        self.cv_mape_ = cv.get("mape")
        self.cv_median_ape_ = cv.get("median_ape")
        self.cv_p90_ape_ = cv.get("p90_ape")
        self.cv_mape_clean_ = cv.get("clean", {}).get("mape") if cv["folds"] else None
        self.mape_all_rows_ = cv.get("all_rows", {}).get("mape") if cv["folds"] else None
        self.data_hash_ = _data_hash(np.column_stack([dedupe_keys[use]]), du)
        self.train_ratio_range_ = [float(np.min(du / ru)), float(np.max(du / ru))]
        self.trained_at_ = datetime.now(UTC).isoformat(timespec="seconds")

    def _label(self) -> str:
        return self.kind

    # ------------------------------------------------------------------ persistence
    def _stem(self) -> str:
        raise NotImplementedError

    def _metadata(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "feature_names": self.feature_names_, "target": TARGET_DESCRIPTION,
            "lightgbm_params": {**self._full_params(), "objective": getattr(self, "objective_", None)},
            "n_samples": self.n_samples_, "n_used": self.n_used_,
            "n_outliers_removed": self.n_outliers_removed_, "outlier_filter": self.filter_report_,
            "warnings": self.warnings_, "reliable": self.reliable_,
            "reliable_rule": f"physically impossible rows <= {UNRELIABLE_FRACTION:.0%} and work-scaling slope >= "
                             f"{SCALING_UNRELIABLE_SLOPE}",
            "work_scaling_slope": self.work_scaling_slope_, "data_hash": self.data_hash_,
            "cv_mape": self.cv_mape_, "cv_median_ape": self.cv_median_ape_, "cv_p90_ape": self.cv_p90_ape_,
            "cv_mape_clean": self.cv_mape_clean_, "mape_all_rows": self.mape_all_rows_, "cv": self.cv_,
            "train_ratio_range": self.train_ratio_range_, "versions": _versions(), "trained_at": self.trained_at_,
            **getattr(self, "extra_metadata_", {}),
        }

    def save(self, directory: str | Path, **extra: Any) -> tuple[Path, Path]:
        """Write `<stem>.txt` (LightGBM text) and `<stem>.json` (metadata, with the `model_file` record:
        the .txt's name, sha256, size and tree count) under `directory`, each atomically (temporary
        file + rename), the .txt first. If writing the .json fails, the previous .txt is put back, so
        the pair on disk is the old one or the new one; a process killed between the two renames
        leaves a new .txt beside the old .json, which `verify_model` rejects by its hash."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        stem = self._stem()
        txt, meta = d / f"{stem}.txt", d / f"{stem}.json"
        text = compact_model_text(self.booster_.model_to_string())
        data = text.encode("utf-8")
        num_trees, _ = check_model_text(text)  # never write a model that would not load
        # what is on disk is what predicts from now on (the compaction rounds leaf values to 7 digits)
        booster = lgb.Booster(model_str=text)
        md = {**self._metadata(), **extra, MODEL_FILE_KEY: model_file_record(stem, data, num_trees)}
        sidecar = (json.dumps(_clean_json(md), indent=1, default=json_default_strict, sort_keys=False) + "\n").encode()
        write_model_pair(txt, data, meta, sidecar)
        self.booster_ = booster
        self.extra_metadata_ = {**getattr(self, "extra_metadata_", {}), **extra}
        return txt, meta

    def _restore(self, booster: lgb.Booster, md: dict[str, Any]) -> None:
        self.booster_ = booster
        self.objective_ = (md.get("lightgbm_params") or {}).get("objective")
        self.feature_names_ = list(md["feature_names"])
        self.n_samples_ = md.get("n_samples")
        self.n_used_ = md.get("n_used")
        self.n_outliers_removed_ = md.get("n_outliers_removed")
        self.filter_report_ = md.get("outlier_filter", {})
        self.warnings_ = md.get("warnings", [])
        self.reliable_ = md.get("reliable", True)
        self.work_scaling_slope_ = md.get("work_scaling_slope")
        self.physical_bound = (md.get("outlier_filter") or {}).get("physical_bound", {}).get("factor",
                                                                                            self.physical_bound)
        self.slow_bound = (md.get("outlier_filter") or {}).get("implausibly_slow", {}).get("rule") != "disabled"
        self.data_hash_ = md.get("data_hash")
        self.cv_ = md.get("cv", {})
        self.cv_mape_ = md.get("cv_mape")
        self.cv_median_ape_ = md.get("cv_median_ape")
        self.cv_p90_ape_ = md.get("cv_p90_ape")
        self.cv_mape_clean_ = md.get("cv_mape_clean")
        self.mape_all_rows_ = md.get("mape_all_rows")
        self.train_ratio_range_ = md.get("train_ratio_range")
        self.trained_at_ = md.get("trained_at")
        known = set(self._metadata_keys())
        self.extra_metadata_ = {k: v for k, v in md.items() if k not in known}
        self.metadata_ = md

    def _metadata_keys(self) -> tuple[str, ...]:
        return ("kind", "feature_names", "target", "lightgbm_params", "n_samples", "n_used", "n_outliers_removed",
                "outlier_filter", "warnings", "reliable", "reliable_rule", "work_scaling_slope", "data_hash",
                "cv_mape", "cv_median_ape", "cv_p90_ape",
                "cv_mape_clean", "mape_all_rows", "cv", "train_ratio_range", "versions", "trained_at",
                MODEL_FILE_KEY)


# --------------------------------------------------------------------------- integrity
# Nothing reaches LightGBM before `verify_model` passed: LightGBM's text parser trusts its input, and a
# model file cut short (an interrupted write, a full disk) makes `lgb.Booster` crash the process with a
# segmentation fault instead of raising. The verified bytes are what LightGBM parses (from memory,
# `model_str=`), so the file cannot change between the check and the load.
MODEL_FILE_KEY = "model_file"  # the sidecar's record of its .txt: name, sha256, bytes, num_trees
_TREE_INNER = ("split_feature", "threshold", "decision_type", "left_child", "right_child")
_HEX = frozenset("0123456789abcdef")
_ERROR_FIELDS = ("cv_mape", "cv_median_ape", "cv_p90_ape", "cv_mape_clean", "mape_all_rows", "cv_mape_paper_groups",
                 "paper_best_error")


class ModelProblem(NamedTuple):
    """A model of a platform that failed its check and is not served: the stem ('mlp_up.fwd',
    'collective.allreduce') and the reason (one line naming the file and what is wrong).
    Unpacks as `(stem, reason)`."""
    stem: str
    reason: str


@dataclass(frozen=True)
class VerifiedModel:
    """A model pair that passed `verify_model`: the exact text to give LightGBM and its metadata."""
    stem: str
    text: str
    metadata: dict[str, Any]
    sha256: str          # of the .txt bytes as read
    hashed: bool         # False: the sidecar has no hash (older version): checked structurally only
    num_trees: int


def known_stems() -> frozenset[str]:
    """Every regressor file stem this version can serve: '<op>.<pass>' and 'collective.<name>'."""
    return frozenset({f"{o}.{ps}" for o, i in ops.OPS.items() for ps in i.passes}
                     | {f"collective.{c}" for c in ops.COLLECTIVES})


def model_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def model_file_record(stem: str, data: bytes, num_trees: int) -> dict[str, Any]:
    """The sidecar's `model_file` block for the exact bytes `data` of `<stem>.txt`."""
    return {"name": f"{stem}.txt", "sha256": model_sha256(data), "bytes": len(data), "num_trees": int(num_trees)}


def _tokens(tree: int, key: str, value: str, n: int, into: list[str]) -> None:
    parts = value.split()
    if len(parts) != n:
        raise ValueError(f"tree {tree}: {key} has {len(parts)} values, num_leaves needs {n}")
    into.extend(parts)


def _numbers(key: str, tokens: list[str], dtype) -> np.ndarray:
    try:
        return np.array(tokens, dtype=dtype)
    except (ValueError, OverflowError):
        raise ValueError(f"a {key} value is not a number") from None


def check_model_text(text: str) -> tuple[int, list[str]]:
    """(number of trees, feature names) of a complete, well-formed LightGBM text model of one
    regression output, else ValueError saying what is wrong. Checks the header (feature names and
    infos match max_feature_idx), every tree block in order (Tree=0, 1, ...), the value counts of
    each tree's arrays against its num_leaves, split features in range, child links forming a tree,
    finite leaf values, and the closing 'end of trees' line (absent when the file was cut short).
    Linear and categorical trees, which this project never trains, are refused."""
    if not text.startswith("tree\n"):
        raise ValueError("no 'tree' header: not a LightGBM text model")
    end = text.find("\nend of trees\n")  # LightGBM always ends that line with a newline
    if end < 0:
        raise ValueError("no 'end of trees' line: the file is cut short")
    tail = text[end + len("\nend of trees\n"):]
    if tail.strip() and "parameters:" in tail and "end of parameters" not in tail:
        raise ValueError("its parameters section after 'end of trees' is cut short")
    first = text.find("\nTree=")
    if first < 0 or first > end:
        raise ValueError("no tree before 'end of trees'")
    head: dict[str, str] = {}
    for line in text[5:first].split("\n"):
        if line:
            k, sep, v = line.partition("=")
            if not sep or "=" in v:
                raise ValueError(f"header line {line[:40]!r} is not key=value")
            head[k] = v
    for k in ("version", "num_class", "num_tree_per_iteration", "max_feature_idx", "objective", "feature_names",
              "feature_infos"):
        if k not in head:
            raise ValueError(f"header has no {k}")
    try:
        num_class, per_iter, max_f = (int(head[k]) for k in ("num_class", "num_tree_per_iteration", "max_feature_idx"))
    except ValueError:
        raise ValueError("header num_class / num_tree_per_iteration / max_feature_idx is not an integer") from None
    if num_class != 1 or per_iter != 1:
        raise ValueError(f"num_class={num_class}, num_tree_per_iteration={per_iter}: not a one-output regressor")
    names = head["feature_names"].split()
    if max_f < 0 or len(names) != max_f + 1 or len(head["feature_infos"].split()) != max_f + 1:
        raise ValueError(f"header lists {len(names)} feature names / {len(head['feature_infos'].split())} infos "
                         f"for max_feature_idx={max_f}")
    blocks = text[first + len("\nTree="):end].split("\nTree=")
    leaves_n: list[int] = []
    tok: dict[str, list[str]] = {k: [] for k in ("leaf_value", *_TREE_INNER)}
    for i, block in enumerate(blocks):
        lines = block.split("\n")
        if lines[0] != str(i):
            raise ValueError(f"tree block {i} is labelled Tree={lines[0][:20]} (trees missing or out of order)")
        kv: dict[str, str] = {}
        for j, line in enumerate(lines[1:]):
            if not line:  # LightGBM ends a tree at its first blank line: only blank lines may follow
                if any(lines[1 + j:]):
                    raise ValueError(f"tree {i}: a blank line inside the tree block")
                break
            k, sep, v = line.partition("=")
            if not sep or "=" in v:
                raise ValueError(f"tree {i}: line {line[:40]!r} is not key=value")
            kv[k] = v
        for k in ("num_leaves", "num_cat", "leaf_value", "shrinkage"):
            if k not in kv:
                raise ValueError(f"tree {i} has no {k}")
        try:
            L, ncat, linear = int(kv["num_leaves"]), int(kv["num_cat"]), int(kv.get("is_linear", "0"))
            shrink = float(kv["shrinkage"])
        except ValueError:
            raise ValueError(f"tree {i}: num_leaves / num_cat / is_linear / shrinkage is not a number") from None
        if L < 1 or L > 1 << 17:
            raise ValueError(f"tree {i}: num_leaves={L}")
        if ncat != 0 or linear != 0:
            raise ValueError(f"tree {i}: categorical or linear tree (num_cat={ncat}, is_linear={linear}), "
                             "which this project never trains")
        if not math.isfinite(shrink):
            raise ValueError(f"tree {i}: shrinkage {kv['shrinkage']!r}")
        _tokens(i, "leaf_value", kv["leaf_value"], L, tok["leaf_value"])
        leaves_n.append(L)
        if L > 1:
            for k in _TREE_INNER:
                if k not in kv:
                    raise ValueError(f"tree {i} has no {k}")
                _tokens(i, k, kv[k], L - 1, tok[k])
    if not np.isfinite(_numbers("leaf_value", tok["leaf_value"], np.float64)).all():
        raise ValueError("a leaf value is not finite")
    if tok["split_feature"]:
        sf = _numbers("split_feature", tok["split_feature"], np.int64)
        if sf.min() < 0 or sf.max() > max_f:
            raise ValueError(f"a split uses feature {int(sf.min() if sf.min() < 0 else sf.max())}, "
                             f"outside 0..{max_f}")
        if np.isnan(_numbers("threshold", tok["threshold"], np.float64)).any():
            raise ValueError("a split threshold is NaN")
        dt = _numbers("decision_type", tok["decision_type"], np.int64)
        if dt.min() < 0 or dt.max() > 255 or (dt & 1).any():
            raise ValueError("a decision_type is out of range or categorical")
        # child links: internal node j of tree t -> t's internal nodes 0..L-2 (>= 0) or leaves ~c (< 0);
        # every node but the root is referenced exactly once, every leaf exactly once
        Ls = np.array([n for n in leaves_n if n > 1])
        inner_off = np.concatenate([[0], np.cumsum(Ls - 1)])[:-1]
        leaf_off = np.concatenate([[0], np.cumsum(Ls)])[:-1]
        per = np.repeat(np.arange(len(Ls)), Ls - 1)
        ch = np.concatenate([_numbers("left_child", tok["left_child"], np.int64),
                             _numbers("right_child", tok["right_child"], np.int64)])
        tr = np.concatenate([per, per])
        if (ch < -Ls[tr]).any() or (ch > Ls[tr] - 2).any():
            raise ValueError("a child index is outside its tree")
        inner = ch >= 0
        inner_refs = np.bincount(inner_off[tr[inner]] + ch[inner], minlength=int((Ls - 1).sum()))
        leaf_refs = np.bincount(leaf_off[tr[~inner]] + ~ch[~inner], minlength=int(Ls.sum()))
        want_inner = np.ones(int((Ls - 1).sum()), np.int64)
        want_inner[inner_off] = 0  # roots
        if not (np.array_equal(inner_refs, want_inner) and (leaf_refs == 1).all()):
            raise ValueError("the child links of a tree do not form a tree")
    return len(blocks), names


def _check_range_pairs(path: Path, field: str, value: Any, width: int) -> None:
    if not isinstance(value, dict):
        raise ArtifactError(path, field, f"must be an object, not {type(value).__name__}")
    for k, v in value.items():
        if not isinstance(v, list) or len(v) < width:
            raise ArtifactError(path, f"{field}.{k}", f"must be a list of {width} numbers")
        for j, x in enumerate(v[:width]):
            check_number(path, f"{field}.{k}[{j}]", x)
        if v[0] > v[1]:
            raise ArtifactError(path, f"{field}.{k}", f"minimum {v[0]} > maximum {v[1]}")


def check_model_metadata(path: str | Path, md: Any, stem: str, platform_id: str | None = None) -> dict[str, Any]:
    """The parsed sidecar `md` of `<stem>.txt` if its keys, types, value ranges and identity hold
    (kind, op/pass or collective matching the file name, the platform matching `platform_id`, the
    feature names this version computes), else ArtifactError naming `path` and the field."""
    path = Path(path)
    if not isinstance(md, dict):
        raise ArtifactError(path, None, f"must be a JSON object, not {type(md).__name__}")
    kind = md.get("kind")
    if kind == "op":
        op, ps = md.get("op"), md.get("pass")
        if not isinstance(op, str) or op not in ops.OPS:
            raise ArtifactError(path, "op", f"{op!r} is not a known operator")
        if not isinstance(ps, str) or ps not in ops.OPS[op].passes:
            raise ArtifactError(path, "pass", f"{ps!r} is not a pass of {op}")
        own, expected = f"{op}.{ps}", list(F.feature_names(op))
    elif kind == "collective":
        c = md.get("collective")
        if not isinstance(c, str) or c not in ops.COLLECTIVES:
            raise ArtifactError(path, "collective", f"{c!r} is not a known collective")
        own, expected = f"collective.{c}", list(F.COLLECTIVE_FEATURES)
    else:
        raise ArtifactError(path, "kind", f"{kind!r}: must be 'op' or 'collective'")
    if own != stem:
        raise ArtifactError(path, "op" if kind == "op" else "collective",
                            f"this is the metadata of {own}, not of {stem} (files swapped or copied)")
    plat = md.get("platform")
    if plat is not None and not isinstance(plat, str):
        raise ArtifactError(path, "platform", f"must be a string, not {type(plat).__name__}")
    if platform_id and plat and plat != platform_id:
        raise ArtifactError(path, "platform", f"this model belongs to platform '{plat}', not '{platform_id}' "
                                              "(copied from another platform's folder)")
    names = md.get("feature_names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ArtifactError(path, "feature_names", "must be a list of strings")
    if names != expected:
        raise ArtifactError(path, "feature_names", f"the model was trained on {len(names)} features this version "
                                                   f"does not compute in that order ({len(expected)} expected): "
                                                   "retrain it with `python -m predictor train`")
    for k in _ERROR_FIELDS:
        check_number(path, k, md.get(k), ge=0, optional=True)
    check_number(path, "n_samples", md.get("n_samples"), ge=0, integer=True, optional=True)
    check_number(path, "n_used", md.get("n_used"), ge=0, integer=True, optional=True)
    check_number(path, "grid_fixed_overhead_s", md.get("grid_fixed_overhead_s"), ge=0, le=1e-3, optional=True)
    check_number(path, "grid_best_flops", md.get("grid_best_flops"), gt=0, le=1e17, optional=True)
    bh = md.get("block_heldout")
    if bh is not None:
        if not isinstance(bh, dict):
            raise ArtifactError(path, "block_heldout", "must be an object")
        check_number(path, "block_heldout.mape", bh.get("mape"), ge=0)
        check_number(path, "block_heldout.median_ape", bh.get("median_ape"), ge=0, optional=True)
    if md.get(CAUSAL_KEY) is not None:
        if kind != "op" or md.get("op") != "flash_attn":
            raise ArtifactError(path, CAUSAL_KEY, "only a flash_attn model times a causal kernel")
        check_number(path, CAUSAL_KEY, md.get(CAUSAL_KEY), ge=0, le=max(CAUSAL_OVERHEAD_GRID))
    for k, t in (("reliable", bool), ("warnings", list), ("lightgbm_params", dict), ("outlier_filter", dict),
                 ("cv", dict)):
        if md.get(k) is not None and not isinstance(md[k], t):
            raise ArtifactError(path, k, f"must be {t.__name__}, not {type(md[k]).__name__}")
    pb = (md.get("outlier_filter") or {}).get("physical_bound")
    if pb is not None:
        if not isinstance(pb, dict):
            raise ArtifactError(path, "outlier_filter.physical_bound", "must be an object")
        check_number(path, "outlier_filter.physical_bound.fraction", pb.get("fraction"), ge=0, le=1, optional=True)
    rounds = (md.get("lightgbm_params") or {}).get("num_boost_round")
    check_number(path, "lightgbm_params.num_boost_round", rounds, ge=1, integer=True, optional=True)
    if kind == "op" and md.get("shape_ranges") is not None:
        _check_range_pairs(path, "shape_ranges", md["shape_ranges"], 2)
    if kind == "collective":
        if md.get("topologies") is not None:
            _check_range_pairs(path, "topologies", md["topologies"], 3)
        mbr = md.get("message_bytes_range")
        if mbr is not None:
            if not isinstance(mbr, list) or len(mbr) != 2:
                raise ArtifactError(path, "message_bytes_range", "must be [min, max]")
            lo, hi = (check_number(path, f"message_bytes_range[{j}]", v, ge=0) for j, v in enumerate(mbr))
            if lo > hi:
                raise ArtifactError(path, "message_bytes_range", f"minimum {lo} > maximum {hi}")
    mf = md.get(MODEL_FILE_KEY)
    if mf is not None:
        if not isinstance(mf, dict):
            raise ArtifactError(path, MODEL_FILE_KEY, "must be an object")
        if mf.get("name") != f"{stem}.txt":
            raise ArtifactError(path, f"{MODEL_FILE_KEY}.name", f"{mf.get('name')!r}: this metadata describes "
                                                                f"another file than {stem}.txt")
        sha = mf.get("sha256")
        if not isinstance(sha, str) or len(sha) != 64 or not set(sha) <= _HEX:
            raise ArtifactError(path, f"{MODEL_FILE_KEY}.sha256", "must be 64 lower-case hex digits")
        check_number(path, f"{MODEL_FILE_KEY}.bytes", mf.get("bytes"), ge=1, integer=True)
        check_number(path, f"{MODEL_FILE_KEY}.num_trees", mf.get("num_trees"), ge=1, integer=True)
    return md


def check_model_outline(text: str) -> tuple[int, list[str]]:
    """(number of trees, feature names) from the outline of a model text alone: the 'tree' header and
    its feature_names line, the Tree= labels (the last one Tree=<count - 1>) and the closing 'end of
    trees' line. Enough for a text whose size and sha256 match its sidecar (written by `save`, which
    ran the full `check_model_text` first); ValueError otherwise. ~0.1 ms."""
    if not text.startswith("tree\n"):
        raise ValueError("no 'tree' header: not a LightGBM text model")
    end = text.find("\nend of trees\n")
    if end < 0:
        raise ValueError("no 'end of trees' line: the file is cut short")
    first = text.find("\nTree=")
    n = text.count("\nTree=", 0, end)
    if first < 0 or n == 0 or not text.startswith(f"\nTree={n - 1}\n", text.rfind("\nTree=", 0, end)):
        raise ValueError("its Tree= blocks are missing or out of order")
    i = text.find("\nfeature_names=", 0, first)
    if i < 0:
        raise ValueError("header has no feature_names")
    return n, text[i + len("\nfeature_names="):text.index("\n", i + 1)].split()


def verify_model(directory: str | Path, stem: str, platform_id: str | None = None, *,
                 full: bool = True) -> VerifiedModel:
    """Check the pair `<stem>.txt` + `<stem>.json` in `directory` before anything parses the model:
    the sidecar (`check_model_metadata`), the .txt's size and sha256 against the sidecar's
    `model_file` record (a sidecar without one, from an older version, is checked structurally
    only: `hashed` False), the structure of the text, its tree count and its feature names against
    the sidecar. The structure check is the full `check_model_text` (~2-10 ms a model), except for
    a hashed model with `full=False`, where the hash already vouches for the bytes and the outline
    (`check_model_outline`) is checked. ArtifactError (path, field, problem) otherwise."""
    d = Path(directory)
    txt, meta = d / f"{stem}.txt", d / f"{stem}.json"
    md = read_json_checked(meta)
    if md is None:
        raise ArtifactError(meta, None, f"is missing (the metadata of {txt.name}; retrain the platform)")
    check_model_metadata(meta, md, stem, platform_id)
    data = read_bytes_checked(txt)
    if data is None:
        raise ArtifactError(txt, None, "is missing (the model its metadata describes; retrain the platform)")
    sha = model_sha256(data)
    mf = md.get(MODEL_FILE_KEY)
    if mf is not None:
        if len(data) != mf["bytes"]:
            raise ArtifactError(txt, None, f"has {len(data)} bytes where {meta.name} records {mf['bytes']} "
                                           "(cut short, or replaced by another file)")
        if sha != mf["sha256"]:
            raise ArtifactError(txt, None, f"its sha256 differs from the one {meta.name} records (replaced by "
                                           "another model's file, or edited)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ArtifactError(txt, None, "is not UTF-8 text: not a LightGBM text model") from None
    try:
        n, names = check_model_text(text) if full or mf is None else check_model_outline(text)
    except ValueError as e:
        raise ArtifactError(txt, None, f"is not a complete LightGBM model: {e}") from None
    if mf is not None and n != mf["num_trees"]:
        raise ArtifactError(txt, None, f"has {n} trees where {meta.name} records {mf['num_trees']}")
    rounds = (md.get("lightgbm_params") or {}).get("num_boost_round")
    if mf is None and rounds is not None and n > int(rounds):
        raise ArtifactError(txt, None, f"has {n} trees, more than the {rounds} rounds {meta.name} was trained with")
    if names != md["feature_names"]:
        raise ArtifactError(txt, "feature_names", f"the model's features differ from those {meta.name} lists "
                                                  "(files of different models)")
    return VerifiedModel(stem, text, md, sha, mf is not None, n)


def check_models(directory: str | Path, platform_id: str | None = None, *, full: bool = True
                 ) -> tuple[dict[str, VerifiedModel], list[ModelProblem]]:
    """Verify every regressor in `directory` (one platform's folder): ({stem: VerifiedModel} of those
    that pass, [ModelProblem] of those that fail). A regressor is any `<stem>.txt` or `<stem>.json`
    whose stem this version knows, and any other `.txt` with a `.json` beside it; the platform's
    other files (network.json, host_overhead.json, ...) are not regressors. `full`: see
    `verify_model`."""
    d = Path(directory)
    known = known_stems()
    try:
        names = {p.name for p in d.iterdir() if p.is_file() and not p.name.startswith(".")}
    except OSError as e:
        return {}, [ModelProblem("*", f"{d}: cannot be listed ({type(e).__name__}: {e})")]
    stems = {n[:-4] for n in names if n.endswith(".txt") and (n[:-4] in known or f"{n[:-4]}.json" in names)}
    stems |= {n[:-5] for n in names if n.endswith(".json") and n[:-5] in known}
    good: dict[str, VerifiedModel] = {}
    problems: list[ModelProblem] = []
    for stem in sorted(stems):
        try:
            good[stem] = verify_model(d, stem, platform_id, full=full)
        except ArtifactError as e:
            problems.append(ModelProblem(stem, str(e)))
    return good, problems


def _read_pair(directory: Path, stem: str) -> tuple[lgb.Booster, dict[str, Any]]:
    """The booster and metadata of a verified pair (ArtifactError when the check fails)."""
    v = verify_model(directory, stem, None)
    return _booster_from_text(directory / f"{stem}.txt", v.text), v.metadata


def _booster_from_text(path: Path, text: str) -> lgb.Booster:
    try:
        return lgb.Booster(model_str=text)
    except (lgb.basic.LightGBMError, ValueError) as e:
        raise ArtifactError(path, None, f"LightGBM cannot load it ({type(e).__name__}: {e})") from None


# --------------------------------------------------------------------------- operators
CAUSAL_KEY = "causal_overhead_tiles"  # metadata of a flash_attn regressor trained on a causal kernel
CAUSAL_OVERHEAD_GRID = tuple(0.5 * i for i in range(33))  # 0, 0.5, ..., 16 key-block iterations
CAUSAL_SATURATED_WAVES = 4.0  # rows with >= 4 waves of query-block CTAs: the tail wave is a small share


def fit_causal_overhead_tiles(a: dict[str, np.ndarray], durations_s: np.ndarray, device) -> float:
    """The fixed cost per query block of a causal FlashAttention kernel, in key-block iterations
    (`features.causal_tile_work`), from its own samples: on the rows that fill the GPU (>= 4 waves of
    query-block CTAs, >= 2 query blocks), the c of a 0-16 grid (step 0.5) under which seconds per unit of tile
    work vary least (median absolute deviation of its log) within each (head_dim, query heads per KV head)
    group. A shape-only rule of the kernel's schedule: nothing end-to-end is fitted. 0 when fewer than 20 rows
    fill the GPU."""
    import pandas as pd
    d = F.derived_dims(a)
    dur = np.asarray(durations_s, dtype="float64")
    nb = np.maximum(1.0, np.ceil(d["l"] / F.ATTENTION_TILE))
    ctas = d["b"] * d["Hr"] * nb
    sm = max(float(getattr(device, "sm_count", 0) or 0), 1.0)
    use = np.isfinite(dur) & (dur > 0) & np.isfinite(ctas) & (ctas >= CAUSAL_SATURATED_WAVES * sm) & (nb >= 2)
    if int(use.sum()) < 20:
        return 0.0
    base = (d["b"] * d["Hr"] * d["hd"] * nb * nb)[use]   # the non-causal work in tiles (per head-dim unit)
    group = pd.Series(d["hd"][use]).astype(str) + ":" + pd.Series(d["Hr"][use] / d["KVr"][use]).round(3).astype(str)
    seq, ld = d["l"][use], np.log(dur[use])
    best_c, best = 0.0, np.inf
    for c in CAUSAL_OVERHEAD_GRID:
        y = pd.Series(ld - np.log(base * F.causal_tile_work(seq, c)))
        spread = float(np.median(np.abs(y - y.groupby(group.to_numpy()).transform("median"))))
        if spread < best - 1e-12:
            best_c, best = float(c), spread
    return best_c


class OpRegressor(_LogEfficiencyRegressor):
    """One (operator, pass) on one device: seconds from shape columns.

    >>> r = OpRegressor("mlp_up", "fwd").fit(shapes_df, durations_s, device)
    >>> r.predict(shapes_df, device)           # seconds
    """

    kind = "op"
    precision_: str | None  # None when read from metadata without it

    def __init__(self, op: str, pass_: str, params: Mapping[str, Any] | None = None, *,
                 physical_bound: float | str | None = "auto", causal: bool = False):
        if op not in ops.OPS:
            raise KeyError(f"unknown op '{op}' (known: {', '.join(ops.OPS)})")
        if pass_ not in ops.OPS[op].passes:
            raise KeyError(f"op '{op}' has no pass '{pass_}' (passes: {', '.join(ops.OPS[op].passes)})")
        super().__init__(params)
        self.op = op
        self.pass_ = pass_
        auto = PHYSICAL_BOUND_COMPUTE if op in F.COMPUTE_BOUND_OPS else PHYSICAL_BOUND_MEMORY
        # None / 0 disables the physical bound (e.g. to score exactly as the paper did)
        self.physical_bound = auto if physical_bound == "auto" else float(physical_bound or 0.0)
        if causal and op != "flash_attn":
            raise ValueError(f"causal=True is for flash_attn only, not {op}")
        # a causal attention kernel's samples: normalised by its tile work (features.causal_tile_work)
        self.causal = bool(causal)
        self.causal_overhead_tiles_: float | None = None

    def _label(self) -> str:
        return f"{self.op}.{self.pass_}"

    def _stem(self) -> str:
        return f"{self.op}.{self.pass_}"

    def fit(self, shapes_df: pd.DataFrame, durations_s, device, precision: str = "fp16", *,
            cv_folds: int = 0, groups=None, filter_outliers: bool = True,
            progress: Callable[[str], None] | None = None) -> OpRegressor:
        """Fit on shape columns and measured seconds. `groups` (e.g. the optimizer variant) only
        splits the CV report. `cv_folds` > 1 also runs the K-fold CV."""
        import pandas as pd
        a = F.shape_arrays(shapes_df)
        d = np.asarray(durations_s, dtype="float64")
        self.causal_overhead_tiles_ = fit_causal_overhead_tiles(a, d, device) if self.causal else None
        X, roof = F.op_feature_matrix(self.op, self.pass_, a, device, precision, self.causal_overhead_tiles_)
        names = list(F.feature_names(self.op))
        keys = np.column_stack([a[c] for c in (*ops.SHAPE_COLUMNS, "variant")])
        g = None if groups is None else np.asarray(pd.Series(groups).astype(str))
        self._fit_arrays(X, roof, d, names, dedupe_keys=keys, groups=g, cv_folds=cv_folds,
                         filter_outliers=filter_outliers, progress=progress)
        self.device_id_ = getattr(device, "device_id", None)
        self.precision_ = precision
        ranges = {}
        for c in ops.SHAPE_COLUMNS:  # over the rows the model was trained on
            col = a[c][self.used_mask_]
            v = col[np.isfinite(col)]
            if len(v):
                ranges[c] = [float(v.min()), float(v.max())]
        self.shape_ranges_ = ranges
        return self

    def predict(self, shapes_df, device, precision: str = "fp16") -> np.ndarray:
        X, roof = F.op_feature_matrix(self.op, self.pass_, F.shape_arrays(shapes_df), device, precision,
                                      self.causal_overhead_tiles_)
        return roof * np.exp(self.booster_.predict(X, num_threads=1))

    def _metadata(self) -> dict[str, Any]:
        md = super()._metadata()
        causal = {} if self.causal_overhead_tiles_ is None else {
            CAUSAL_KEY: self.causal_overhead_tiles_,
            "causal_note": "causal kernel: target normalised by its tile work (nb(nb+1)/2 + c nb) / nb^2 of the "
                           f"l^2 score work, nb = ceil(seq / {F.ATTENTION_TILE}), c = {CAUSAL_KEY} fitted on "
                           "the training rows (features.causal_tile_work, regressors.fit_causal_overhead_tiles)"}
        return {"op": self.op, "pass": self.pass_, "device_id": getattr(self, "device_id_", None),
                "precision": getattr(self, "precision_", None), "shape_ranges": getattr(self, "shape_ranges_", {}),
                **causal, **md}

    def _metadata_keys(self) -> tuple[str, ...]:
        return (*super()._metadata_keys(), "op", "pass", "device_id", "precision", "shape_ranges", CAUSAL_KEY,
                "causal_note")

    @classmethod
    def load(cls, directory: str | Path, op: str, pass_: str) -> OpRegressor:
        booster, md = _read_pair(Path(directory), f"{op}.{pass_}")
        c = md.get(CAUSAL_KEY)
        r = cls(op, pass_, md.get("lightgbm_params"), causal=c is not None)
        r._restore(booster, md)
        r.causal_overhead_tiles_ = None if c is None else float(c)
        r.device_id_ = md.get("device_id")
        r.precision_ = md.get("precision")
        r.shape_ranges_ = md.get("shape_ranges", {})
        return r


# --------------------------------------------------------------------------- collectives
class CollectiveRegressor(_LogEfficiencyRegressor):
    """One collective on one platform, across all sampled topologies (nodes x GPUs per node)."""

    kind = "collective"
    physical_bound = PHYSICAL_BOUND_COLLECTIVE
    capacity = COLLECTIVE_CAPACITY
    message_bytes_range_: list[float] | None  # None when read from metadata without it

    def __init__(self, collective: str, params: Mapping[str, Any] | None = None, *,
                 physical_bound: float | str | None = "auto"):
        if collective not in ops.COLLECTIVES:
            raise KeyError(f"unknown collective '{collective}' (known: {', '.join(ops.COLLECTIVES)})")
        super().__init__(params)
        self.collective = collective
        self.physical_bound = PHYSICAL_BOUND_COLLECTIVE if physical_bound == "auto" else float(physical_bound or 0.0)

    def _label(self) -> str:
        return f"collective.{self.collective}"

    def _stem(self) -> str:
        return f"collective.{self.collective}"

    def fit(self, message_bytes, nodes, gpus_per_node, durations_s, platform, *, cv_folds: int = 0,
            groups=None, filter_outliers: bool = True,
            progress: Callable[[str], None] | None = None) -> CollectiveRegressor:
        import pandas as pd
        S = np.asarray(message_bytes, dtype="float64")
        nn_ = np.asarray(nodes, dtype="float64")
        gg = np.asarray(gpus_per_node, dtype="float64")
        X, roof = F.collective_feature_matrix(self.collective, S, nn_, gg, platform)
        names = list(F.COLLECTIVE_FEATURES)
        d = np.asarray(durations_s, dtype="float64")
        g = None if groups is None else np.asarray(pd.Series(groups).astype(str))
        self._fit_arrays(X, roof, d, names, dedupe_keys=np.column_stack([S, nn_, gg]), groups=g,
                         cv_folds=cv_folds, filter_outliers=filter_outliers, progress=progress)
        # sampled ranges from the rows the model was trained on (rows dropped as impossible or
        # corrupt do not count as coverage)
        u = self.used_mask_
        topo: dict[str, list[float]] = {}
        for (a, b), m in pd.DataFrame({"n": nn_[u], "g": gg[u], "s": S[u]}).groupby(["n", "g"])["s"]:
            topo[f"{int(a)}x{int(b)}"] = [float(m.min()), float(m.max()), int(len(m))]
        self.topologies_ = topo
        self.message_bytes_range_ = [float(S[u].min()), float(S[u].max())]
        self.platform_id_ = getattr(platform, "platform_id", None)
        return self

    def predict(self, message_bytes, nodes, gpus_per_node, platform) -> np.ndarray:
        X, roof = F.collective_feature_matrix(self.collective, message_bytes, nodes, gpus_per_node, platform)
        return roof * np.exp(self.booster_.predict(X, num_threads=1))

    def covers(self, message_bytes, nodes, gpus_per_node) -> np.ndarray:
        """True where (nodes, gpus_per_node) was sampled and message_bytes lies in its sampled range."""
        S, n, g = np.broadcast_arrays(np.atleast_1d(np.asarray(message_bytes, dtype="float64")),
                                      np.atleast_1d(np.asarray(nodes)), np.atleast_1d(np.asarray(gpus_per_node)))
        out = np.zeros(S.shape, bool)
        for i in range(len(S)):
            rng = self.topologies_.get(f"{int(n[i])}x{int(g[i])}")
            out[i] = rng is not None and rng[0] <= S[i] <= rng[1]
        return out

    def _metadata(self) -> dict[str, Any]:
        md = super()._metadata()
        return {"collective": self.collective, "platform": getattr(self, "platform_id_", None),
                "topologies": getattr(self, "topologies_", {}),
                "topologies_note": "'<nodes>x<gpus_per_node>': [min message_bytes, max message_bytes, rows] over the "
                                   "rows the model was trained on",
                "message_bytes_range": getattr(self, "message_bytes_range_", None),
                "message_bytes_convention": "allreduce/reducescatter: full buffer; allgather: per-rank input "
                                            "(output is ranks x larger); p2p: the tensor sent",
                **md}

    def _metadata_keys(self) -> tuple[str, ...]:
        return (*super()._metadata_keys(), "collective", "topologies", "topologies_note", "message_bytes_range",
                "message_bytes_convention")

    @classmethod
    def load(cls, directory: str | Path, collective: str) -> CollectiveRegressor:
        booster, md = _read_pair(Path(directory), f"collective.{collective}")
        r = cls(collective, md.get("lightgbm_params"))
        r._restore(booster, md)
        r.topologies_ = md.get("topologies", {})
        r.message_bytes_range_ = md.get("message_bytes_range")
        r.platform_id_ = md.get("platform")
        return r


# --------------------------------------------------------------------------- bank
def _shape_key(shapes: Any) -> tuple | None:
    """A hashable key for a one-row input (DataFrame or mapping of scalars); None if not one row."""
    row = F.scalar_row(shapes)
    return None if row is None else tuple(row.values())


class ModelBank:
    """All trained regressors of one platform, loaded lazily from `<models_dir>/<platform>/`.

    Every model is checked when the bank is built (`check_models`: sidecar keys and ranges, identity,
    the .txt's size, sha256 and outline; the full structure for a model without a hash), and again
    in full when its booster is first built, from the very bytes LightGBM then parses. A model that
    fails is left out and reported; the rest of the platform is served:

        bank.problems    -> list[ModelProblem]: (stem, reason) of each model left out, e.g.
                            ('mlp_down.fwd', '.../mlp_down.fwd.txt: its sha256 differs from ...')
        bank.degraded    -> bool: True when any model was left out
        bank.unhashed    -> list[str]: stems whose sidecar has no hash (older version): structure-checked only
        bank.warnings()  -> list[str]: one line per problem (and one for unhashed models), ready to show
        bank.has_op(op, pass) / has_collective(name) -> False for a model left out, so callers fall back

    The booster of a model is built on first use from the bytes verified again at that moment; if the
    file changed since and the new pair verifies, the new pair is used, else the model joins
    `problems` and `predict_*` raise `ArtifactError` (a ValueError) for it.
    """

    CACHE_SIZE = 4096

    def __init__(self, platform_id: str, directory: Path):
        self.platform_id = platform_id
        self.directory = Path(directory)
        # hash + outline now (fast); the full structural check runs in _booster, before LightGBM parses it
        verified, problems = check_models(self.directory, platform_id, full=False)
        self._meta: dict[str, dict[str, Any]] = {s: v.metadata for s, v in verified.items()}
        self._sha: dict[str, str] = {s: v.sha256 for s, v in verified.items()}
        self.problems: list[ModelProblem] = problems
        self.unhashed: list[str] = sorted(s for s, v in verified.items() if not v.hashed)
        for p in problems:
            log.warning("platform %s: model %s not used: %s", platform_id, p.stem, p.reason)
        self._predictors: dict[str, Callable[[np.ndarray], np.ndarray]] = {}   # stem -> its loaded booster
        self._cache: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def load(cls, platform_id: str, models_dir: str | Path | None = None) -> ModelBank:
        d = paths.models_dir(models_dir)
        path = paths.platform_dir(platform_id, d)
        if not path.is_dir():
            raise FileNotFoundError(f"no trained models for platform '{platform_id}' under {d} "
                                    f"(train with predictor.calibrate.training.train_platform('{platform_id}'))")
        return cls(platform_id, path)

    # ------------------------------------------------------------ integrity
    @property
    def degraded(self) -> bool:
        """True when at least one model of this platform failed its check and is not served."""
        return bool(self.problems)

    def warnings(self) -> list[str]:
        """Lines for a prediction's warnings / the platform listing: one per model left out (its
        operator is then timed by the fallback: stand-in or analytical), and one naming the models
        checked for structure only. Empty when every model passed with its hash."""
        out = [f"Model {p.stem} of platform '{self.platform_id}' is not used (its time is estimated instead): "
               f"{p.reason}" for p in self.problems]
        if self.unhashed:
            out.append(f"{len(self.unhashed)} model(s) of platform '{self.platform_id}' carry no content hash "
                       "(written by an older version): checked for structure only; retrain to add one")
        return out

    def _drop(self, stem: str, reason: str) -> None:
        self._meta.pop(stem, None)
        self._sha.pop(stem, None)
        self.problems = [p for p in self.problems if p.stem != stem] + [ModelProblem(stem, reason)]
        log.warning("platform %s: model %s not used: %s", self.platform_id, stem, reason)

    # ------------------------------------------------------------ introspection
    def ops_available(self) -> list[tuple[str, str]]:
        return sorted((m["op"], m["pass"]) for m in self._meta.values() if m.get("kind") == "op")

    def collectives_available(self) -> list[str]:
        return sorted(m["collective"] for m in self._meta.values() if m.get("kind") == "collective")

    def has_op(self, op: str, pass_: str) -> bool:
        return f"{op}.{pass_}" in self._meta

    def op_info(self, op: str, pass_: str) -> dict[str, Any]:
        try:
            return self._meta[f"{op}.{pass_}"]
        except KeyError:
            raise KeyError(f"platform '{self.platform_id}' has no model for {op}/{pass_}") from None

    def has_collective(self, collective: str) -> bool:
        return f"collective.{collective}" in self._meta

    def collective_info(self, collective: str) -> dict[str, Any]:
        try:
            return self._meta[f"collective.{collective}"]
        except KeyError:
            raise KeyError(f"platform '{self.platform_id}' has no model for collective {collective}") from None

    def _predictor(self, stem: str) -> Callable[[np.ndarray], np.ndarray]:
        """The stem's booster, loaded once from its verified text, as a single-thread predict function
        (`lgb_import.single_thread_predictor`, which keeps the booster alive)."""
        f = self._predictors.get(stem)
        if f is None:
            with self._lock:
                f = self._predictors.get(stem)
                if f is None:
                    try:  # verified again, in full: LightGBM parses exactly the bytes just checked
                        v = verify_model(self.directory, stem, self.platform_id)
                        b = _booster_from_text(self.directory / f"{stem}.txt", v.text)
                    except ArtifactError as e:
                        self._drop(stem, str(e))
                        raise
                    if v.sha256 != self._sha.get(stem):  # replaced by a complete new pair since the bank was built
                        self._meta[stem], self._sha[stem] = v.metadata, v.sha256
                    f = self._predictors[stem] = single_thread_predictor(b)
        return f

    def _cached(self, key, compute):
        if key is not None:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit.copy()
        val = compute()
        if key is not None:
            self._cache[key] = val
            if len(self._cache) > self.CACHE_SIZE:
                self._cache.popitem(last=False)
            return val.copy()
        return val

    # ------------------------------------------------------------ prediction
    def predict_op(self, op: str, pass_: str, shapes_df, device, precision: str = "fp16") -> np.ndarray:
        """Seconds per row. `shapes_df`: a DataFrame of shape columns or a mapping of scalars (one row)."""
        stem = f"{op}.{pass_}"
        if stem not in self._meta:
            raise KeyError(f"platform '{self.platform_id}' has no model for {op}/{pass_}")
        sk = _shape_key(shapes_df)
        key = None if sk is None else ("op", stem, getattr(device, "device_id", id(device)), precision, sk)

        c = self._meta[stem].get(CAUSAL_KEY)

        def compute() -> np.ndarray:
            X, roof = F.op_feature_matrix(op, pass_, F.shape_arrays(shapes_df), device, precision, c)
            return roof * np.exp(self._predictor(stem)(X))
        return self._cached(key, compute)

    def predict_collective(self, collective: str, message_bytes, nodes, gpus_per_node, platform) -> np.ndarray:
        stem = f"collective.{collective}"
        if stem not in self._meta:
            raise KeyError(f"platform '{self.platform_id}' has no model for collective {collective}")
        scalar = all(np.ndim(v) == 0 for v in (message_bytes, nodes, gpus_per_node))
        key = ("coll", stem, getattr(platform, "platform_id", id(platform)), float(message_bytes), float(nodes),
               float(gpus_per_node)) if scalar else None

        def compute() -> np.ndarray:
            X, roof = F.collective_feature_matrix(collective, message_bytes, nodes, gpus_per_node, platform)
            return roof * np.exp(self._predictor(stem)(X))
        return self._cached(key, compute)

    def covers_collective(self, collective: str, message_bytes, nodes, gpus_per_node) -> np.ndarray:
        topo = self.collective_info(collective).get("topologies", {})
        S, n, g = np.broadcast_arrays(np.atleast_1d(np.asarray(message_bytes, dtype="float64")),
                                      np.atleast_1d(np.asarray(nodes)), np.atleast_1d(np.asarray(gpus_per_node)))
        out = np.zeros(S.shape, bool)
        for i in range(len(S)):
            rng = topo.get(f"{int(n[i])}x{int(g[i])}")
            out[i] = rng is not None and rng[0] <= S[i] <= rng[1]
        return out


@lru_cache(maxsize=32)
def _cached_bank(platform_id: str, models_dir: str) -> ModelBank | None:
    path = paths.platform_dir(platform_id, models_dir)
    if not any(path.glob("*.txt")):
        return None
    return ModelBank.load(platform_id, models_dir=Path(models_dir))


def load_bank(platform_id: str, models_dir: str | Path | None = None) -> ModelBank | None:
    """The (cached) ModelBank of a platform, or None when it has no trained models."""
    return _cached_bank(platform_id, str(paths.models_dir(models_dir)))

"""Where the dashboard reads and writes, and cheap version stamps used as cache keys.

Environment:
  PREDICTOR_STORE        the DuckDB sample store (the predictor's own variable; default data/samples.duckdb)
  PREDICTOR_MODELS_DIR   trained regressors (default: the predictor's models_store/)
  PREDICTOR_CLUSTERS     a JSON/YAML file of extra cluster definitions (default: data/clusters.local.json
                         when it exists); the Predict page's custom clusters and Calibrate write here
  PREDICTOR_SHARED_DATASETS  the published datasets folder (default ../shared/datasets next to the
                         checkout); Accuracy's Network tab reads the measured NCCL sweeps there
"""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV_MODELS = "PREDICTOR_MODELS_DIR"
STORE_HINT = ".venv/bin/python -m predictor ingest ../shared/datasets/paper-samples"
TRAIN_HINT = ".venv/bin/python -m predictor train --platform {platform}"


ENV_SHARED = "PREDICTOR_SHARED_DATASETS"


def store_path() -> Path:
    """The store the predictor will open ($PREDICTOR_STORE, else <repo>/data/samples.duckdb): predictor.paths'
    rule, which pages that only need the path (every page: the user clusters file sits next to the store) read
    without importing predictor.samples.store and duckdb. tests/test_charts.py checks it against the store's."""
    from predictor.paths import store_path as path
    return path()


def shared_datasets() -> Path:
    """The published datasets folder: $PREDICTOR_SHARED_DATASETS, else predictor.hardware.network_fit.SHARED's
    rule (<checkout>/../shared/datasets), here so that the path is known without importing the predictor.
    tests/test_charts.py checks that the two rules agree."""
    env = os.environ.get(ENV_SHARED)
    if env:
        return Path(env).expanduser()
    return ROOT.parent / "shared" / "datasets"


def shared_version() -> str:
    """Changes when the datasets folder appears, disappears or changes at its top level."""
    p = shared_datasets()
    return f"{p}:{_stat_stamp(p)}"


def models_dir() -> Path:
    """$PREDICTOR_MODELS_DIR, else the packaged models_store/ (predictor.paths' rule)."""
    from predictor.paths import models_dir as path
    return path()


def models_dir_arg() -> str | None:
    """What to pass as `models_dir` to predictor calls: None keeps the predictor's default."""
    env = os.environ.get(ENV_MODELS)
    return str(Path(env).expanduser()) if env else None


def clusters_file() -> Path:
    """The user cluster file (may not exist yet): predictor.paths.clusters_file, shared with the CLI."""
    from predictor.paths import clusters_file as path
    return path()


def clusters_file_arg() -> str | None:
    from predictor.paths import clusters_file_arg as arg
    return arg()


def _stat_stamp(p: Path) -> str:
    try:
        st = p.stat()
    except OSError:
        return "missing"
    return f"{st.st_mtime_ns}-{st.st_size}"


def store_version() -> str:
    """Changes whenever the store file changes (new ingest), so cached reads refresh."""
    p = store_path()
    return f"{p}:{_stat_stamp(p)}:{_stat_stamp(p.with_name(p.name + '.wal'))}"


# A stamp of the models folder stats every file in it (hundreds), twice per script run: remembered
# for a second, so one run (and a burst of reruns) pays once. A retrain from another process shows
# within that second; the dashboard's own writes call forget_versions() and show at once.
VERSION_TTL_S = 1.0
_MODELS_STAMPS: dict[str, tuple[float, str]] = {}


def forget_versions() -> None:
    """After writing models (retrain, saved validation): the next models_version() looks again."""
    _MODELS_STAMPS.clear()


def models_version() -> str:
    """Changes whenever a model file is (re)written, so cached predictors and predictions refresh."""
    d = models_dir()
    now = time.monotonic()
    hit = _MODELS_STAMPS.get(str(d))
    if hit is not None and now - hit[0] < VERSION_TTL_S:
        return hit[1]
    h = hashlib.sha1(str(d).encode())
    if d.is_dir():
        for p in sorted(d.glob("*/*")):
            h.update(f"{p.relative_to(d)}:{_stat_stamp(p)}".encode())
    stamp = h.hexdigest()[:16]
    _MODELS_STAMPS[str(d)] = (now, stamp)
    return stamp


def clusters_version() -> str:
    p = clusters_file()
    return f"{p}:{_stat_stamp(p)}"

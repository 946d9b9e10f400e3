"""Where every artifact lives, in one place: the models folder (with its override), each platform's
files in it, and the sample store. Everything that reads or writes one of these files asks here, so
a file is written where it is read.

    models_dir()                      $PREDICTOR_MODELS_DIR, else the project's models_store/
    platform_dir("dgx-h100")          <models_dir>/dgx-h100 (the id checked against SAFE_ID)
    artifact("dgx-h100", HOST)        <models_dir>/dgx-h100/host_overhead.json
    store_path()                      $PREDICTOR_STORE, else data/samples.duckdb

Platform ids come from users (the dashboard's custom clusters, a clusters file, the command line),
so a path is only ever built from an id that matches `SAFE_ID` and resolves inside the models
folder: `../../etc/x` is refused with `InfeasibleConfig`, never opened.

`write_text_atomic` writes through a temporary file in the same folder and renames it over the
target, so a reader sees the old file or the new one, never half of one.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from .specs import InfeasibleConfig

ENV_MODELS_DIR = "PREDICTOR_MODELS_DIR"
ENV_STORE = "PREDICTOR_STORE"
REPO_DIR = Path(__file__).resolve().parent.parent
PACKAGED_MODELS_DIR = REPO_DIR / "models_store"
DEFAULT_STORE = REPO_DIR / "data" / "samples.duckdb"

# Per-platform artifacts (in <models_dir>/<platform>/)
HOST_OVERHEAD = "host_overhead.json"        # predictor.overhead: fitted host (framework) overhead
NETWORK = "network.json"                    # predictor.calibrate_network: calibrated collectives
SPEED_CHECK = "speed_check.json"            # predictor.speed: this machine's speed today (git-ignored)
VALIDATION = "validation.json"              # predictor.validate: end-to-end error of the platform
VALIDATION_RUNS = "validation_runs.csv"     # predictor.validate: the per-run results behind it
# Whole-folder artifacts (in <models_dir>/)
TRANSFER_VALIDATION = "transfer_validation.json"  # tests/benchmarks/transfer_accuracy.py
NETWORK_VALIDATION = "network_validation.json"    # tests/benchmarks/collective_accuracy.py
FRAMEWORK_TERMS = "framework_terms.json"          # predictor.calibrate_framework: end-to-end terms

# Letters, digits and . _ : + - ; starts with a letter or digit; no '..'; at most 128 characters.
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}$")


def check_id(platform_id: str, field: str = "platform") -> str:
    """`platform_id` if it is a safe folder name, else InfeasibleConfig naming `field`."""
    s = str(platform_id)
    if not SAFE_ID.match(s) or ".." in s:
        raise InfeasibleConfig(field, f"'{s[:80]}' is not a valid platform / cluster name.",
                               "use letters, digits and . _ : + - only (at most 128 characters, no '..'), "
                               "e.g. my-h100-cluster.")
    return s


def models_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """`override`, else $PREDICTOR_MODELS_DIR, else the project's models_store/."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get(ENV_MODELS_DIR)
    return Path(env).expanduser() if env else PACKAGED_MODELS_DIR


def platform_dir(platform_id: str, models: str | os.PathLike[str] | None = None) -> Path:
    """The folder of one platform's models and artifacts, guaranteed to lie inside the models folder."""
    root = models_dir(models)
    d = root / check_id(platform_id)
    try:
        inside = d.resolve().is_relative_to(root.resolve())
    except OSError:
        inside = False
    if not inside:
        raise InfeasibleConfig("platform", f"'{platform_id}' resolves outside the models folder {root}.",
                               "use a plain name without links or '..'.")
    return d


def artifact(platform_id: str, name: str, models: str | os.PathLike[str] | None = None) -> Path:
    """<models_dir>/<platform>/<name>."""
    return platform_dir(platform_id, models) / name


def shared_artifact(name: str, models: str | os.PathLike[str] | None = None) -> Path:
    """<models_dir>/<name> (files that describe several platforms)."""
    return models_dir(models) / name


def store_path(override: str | os.PathLike[str] | None = None) -> Path:
    """`override`, else $PREDICTOR_STORE, else <repo>/data/samples.duckdb."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get(ENV_STORE)
    return Path(env).expanduser() if env else DEFAULT_STORE


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` via a temporary file in the same folder, fsync, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2, default=json_default) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    """The parsed JSON of `path`, or None when it does not exist. A file that exists but cannot be
    read or parsed raises ValueError naming it (callers decide whether that degrades or fails)."""
    p = Path(path)
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{p} cannot be read as JSON ({type(e).__name__}: {e})") from None


def json_default(o: Any) -> Any:
    """JSON for numpy scalars / arrays, paths and dataclass-like objects (anything else: its str)."""
    import numpy as np
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        v = float(o)
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "to_dict"):
        return o.to_dict()
    return str(o)

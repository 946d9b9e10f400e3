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

Reading is checked: a file that is unreadable, not JSON, or holds a value out of range raises
`ArtifactError(path, field, problem)` (a ValueError); `load_checked(path, parse)` turns that into
`(value, None)`, `(None, None)` without the file, or `(None, warning)` for callers that degrade.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from predictor.model.errors import InfeasibleConfig

ENV_MODELS_DIR = "PREDICTOR_MODELS_DIR"
ENV_STORE = "PREDICTOR_STORE"
ENV_CLUSTERS = "PREDICTOR_CLUSTERS"
ENV_USER_MODELS_DIR = "PREDICTOR_USER_MODELS_DIR"
REPO_DIR = Path(__file__).resolve().parent.parent
PACKAGED_MODELS_DIR = REPO_DIR / "models_store"
DEFAULT_STORE = REPO_DIR / "data" / "samples.duckdb"
CATALOG_DIR = REPO_DIR / "predictor" / "catalog"      # the shipped facts: devices, clusters, published runs
SHARED_DATASETS = REPO_DIR.parent / "shared" / "datasets"

# Per-platform artifacts (in <models_dir>/<platform>/)
HOST_OVERHEAD = "host_overhead.json"        # predictor.step.overhead: fitted host (framework) overhead
NETWORK = "network.json"                    # predictor.hardware.network_fit: calibrated collectives
SPEED_CHECK = "speed_check.json"            # predictor.hardware.speed: this machine's speed today (git-ignored)
VALIDATION = "validation.json"              # predictor.checks.validate: end-to-end error of the platform
VALIDATION_RUNS = "validation_runs.csv"     # predictor.checks.validate: the per-run results behind it
OWN_RUNS_TERMS = "own_runs_terms.json"      # predictor.calibrate.runs: a user platform's terms fitted on its runs
# Whole-folder artifacts (in <models_dir>/)
TRANSFER_VALIDATION = "transfer_validation.json"  # tests/benchmarks/transfer_accuracy.py
NETWORK_VALIDATION = "network_validation.json"    # tests/benchmarks/collective_accuracy.py
FRAMEWORK_TERMS = "framework_terms.json"          # predictor.calibrate.framework: end-to-end terms
INDEPENDENT_CHECKS = "independent_checks.json"    # predictor.plan.accuracy_record: the never-fitted checks' errors

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


def check_platform_ids(platform: Any, field: str = "platform") -> None:
    """Every id a platform reads files under (its own, and the platforms whose regressors, collective models
    and network calibration it uses), checked before any path is built from one: InfeasibleConfig naming
    `field` (for its own id) or the attribute."""
    check_id(platform.platform_id, field)
    for attr in ("op_models", "collective_models", "collective_calibration"):
        other = getattr(platform, attr, None)
        if other:
            check_id(other, attr)


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


def clusters_file(override: str | os.PathLike[str] | None = None) -> Path:
    """The user's cluster definitions: `override`, else $PREDICTOR_CLUSTERS, else clusters.local.json next
    to the store (where the dashboard saves the clusters entered on its pages). May not exist."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get(ENV_CLUSTERS)
    return Path(env).expanduser() if env else store_path().parent / "clusters.local.json"


def user_models_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """Where platforms calibrated on a user's own runs keep their terms (never the shipped models_store/):
    `override`, else $PREDICTOR_USER_MODELS_DIR, else user_models/ beside the clusters file."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get(ENV_USER_MODELS_DIR)
    return Path(env).expanduser() if env else clusters_file().parent / "user_models"


def user_artifact(platform_id: str, name: str, override: str | os.PathLike[str] | None = None) -> Path:
    """<user models dir>/<platform>/<name>, the id checked before the path is built."""
    return platform_dir(platform_id, user_models_dir(override)) / name


def clusters_file_arg(override: str | os.PathLike[str] | None = None) -> str | None:
    """What to pass as a clusters file: an explicit `override` always (a missing one is then an error naming
    it), the default only when it exists."""
    if override:
        return str(Path(override).expanduser())
    p = clusters_file()
    return str(p) if p.is_file() else None


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
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{p} cannot be read as JSON ({type(e).__name__}: {e})") from None
    if data is None:  # a file holding `null` is not a missing file
        raise ArtifactError(p, None, "holds null, not a JSON object")
    return data


def json_default_strict(o: Any) -> Any:
    """JSON for numpy scalars / arrays (non-finite floats as null), paths and objects with `to_dict`;
    TypeError for anything else (artifacts: model sidecars never hold a value's str by accident)."""
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
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def json_default(o: Any) -> Any:
    """`json_default_strict`, and the str of anything else (reports and machine-readable CLI output)."""
    try:
        return json_default_strict(o)
    except TypeError:
        return str(o)


# --------------------------------------------------------------------------- checked reading
class ArtifactError(ValueError):
    """A file under the models folder that cannot be used as it is: which file, which field (None:
    the file as a whole) and what is wrong with it. A ValueError, so callers that already catch
    ValueError keep working; `str()` is one line naming the file, the field and the problem."""

    def __init__(self, path: str | os.PathLike[str], field: str | None, problem: str):
        self.path = Path(path)
        self.field = field
        self.problem = problem
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path}" + (f": field '{self.field}'" if self.field else "")
        return f"{where}: {self.problem}"

    def __reduce__(self):  # picklable across processes despite the custom __init__
        return (type(self), (self.path, self.field, self.problem))


def read_bytes_checked(path: str | os.PathLike[str]) -> bytes | None:
    """The bytes of `path`, None when it does not exist, ArtifactError when it cannot be read."""
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ArtifactError(p, None, f"cannot be read ({type(e).__name__}: {e})") from None


def read_json_checked(path: str | os.PathLike[str]) -> Any:
    """The parsed JSON of `path`, None when it does not exist; ArtifactError (field None) when it
    cannot be read, is not UTF-8 or is not JSON. NaN / Infinity tokens parse (to float) so that the
    value checks can name the field that holds them."""
    p = Path(path)
    data = read_bytes_checked(p)
    if data is None:
        return None
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ArtifactError(p, None, f"is not valid JSON ({type(e).__name__}: {e})") from None
    if parsed is None:  # a file holding `null` is not a missing file
        raise ArtifactError(p, None, "holds null, not a JSON object")
    return parsed


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """`write_text_atomic` for bytes written exactly as given (no newline translation), so a hash of
    `data` is a hash of the file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_number(path: str | os.PathLike[str], field: str, value: Any, *, gt: float | None = None,
                 ge: float | None = None, lt: float | None = None, le: float | None = None,
                 optional: bool = False, integer: bool = False) -> Any:
    """`value` if it is a finite number (an integer when `integer`) within the bounds given
    (`gt` <, `ge` <=, `lt` >, `le` >=); None passes when `optional`. Else ArtifactError naming
    `path` and `field`."""
    if value is None:
        if optional:
            return None
        raise ArtifactError(path, field, "is missing (null)")
    if not _is_number(value):
        raise ArtifactError(path, field, f"must be a number, not {type(value).__name__} {str(value)[:40]!r}")
    if integer and not (isinstance(value, int) or float(value).is_integer()):
        raise ArtifactError(path, field, f"must be a whole number, not {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ArtifactError(path, field, f"must be finite, not {value!r}")
    for bound, ok, words in ((gt, lambda b: v > b, "> {}"), (ge, lambda b: v >= b, ">= {}"),
                             (lt, lambda b: v < b, "< {}"), (le, lambda b: v <= b, "<= {}")):
        if bound is not None and not ok(bound):
            raise ArtifactError(path, field, f"is {value!r}; must be {words.format(bound)}")
    return int(value) if integer else value


# validation.json fields that, when present, must be numbers (or null): a string there is a broken file
VALIDATION_NUMBERS = ("n_runs", "mape", "median_ape", "p90_ape", "latest_run_mape", "latest_run_n", "measuring_runs",
                      "mape_speed_checked", "n_runs_speed_checked", "measuring_runs_speed_checked")


def check_error_record(path: str | os.PathLike[str], data: Any, required: tuple[str, ...] = (),
                       numeric: tuple[str, ...] = ()) -> dict[str, Any]:
    """An error record (validation.json, transfer_validation.json, network_validation.json): a JSON
    object in which every number, at any depth, is finite and >= 0 (errors, counts, parameters);
    the `required` top-level fields are present and a number or null. ArtifactError names the
    first offending field as a dotted path (e.g. 'per_op.mlp_up.fwd.vista-gh200')."""
    if not isinstance(data, dict):
        raise ArtifactError(path, None, f"must be a JSON object, not {type(data).__name__}")
    for k in required:
        if k not in data:
            raise ArtifactError(path, k, "is missing")
        check_number(path, k, data[k], ge=0, optional=True)
    for k in numeric:
        if k in data:
            check_number(path, k, data[k], ge=0, optional=True)

    def walk(o: Any, where: str) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{where}.{k}" if where else str(k))
        elif isinstance(o, list):
            for i, v in enumerate(o):
                walk(v, f"{where}[{i}]")
        elif _is_number(o):
            check_number(path, where, o, ge=0)
    walk(data, "")
    return data


def load_checked(path: str | os.PathLike[str], parse) -> tuple[Any, str | None]:
    """(parse(path's JSON), None); (None, None) when the file does not exist; (None, warning) when it
    cannot be read or `parse` rejects it with ArtifactError / ValueError. The warning is one line
    naming the file, the field and the problem, and says that the file is ignored."""
    try:
        data = read_json_checked(path)
        if data is None:
            return None, None
        return parse(data), None
    except ArtifactError as e:
        return None, f"{e} (file ignored)"
    except (ValueError, TypeError, KeyError) as e:
        return None, f"{Path(path)}: {type(e).__name__}: {e} (file ignored)"


def load_platform_validation_checked(platform_id: str, models: str | os.PathLike[str] | None = None
                                     ) -> tuple[dict[str, Any] | None, str | None]:
    """<models_dir>/<platform>/validation.json (the end-to-end error record of predictor.checks.validate)
    with its values checked (every error / count finite and >= 0): (record, None), (None, None)
    without the file, (None, warning) when it is unusable."""
    path = artifact(platform_id, VALIDATION, models)
    return load_checked(path, lambda d: check_error_record(path, d, numeric=VALIDATION_NUMBERS))

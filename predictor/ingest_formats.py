"""Parsers for every sample format the store ingests.

Each parser turns the bytes of one file into canonical frames (one per store
table) plus a count of rejected rows with a few example reasons. Parsers never
touch the database: `store.py` owns transactions and idempotency.

Formats (the `kind` of a file, recorded in `batches.kind`):
  paper_operator      `<GPU>_<op>_fp16.csv` from DebarghaG/estimate-train-time (one row per pass)
  paper_optimizer     `<GPU>_{first,middle,last}Stage_optimizer_fp16.csv` and `<GPU>_optimizer_fp16.csv`
  paper_nccl          `<GPU>_<collective>_fp16[_<nodes>_<gpus_per_node>].csv`
  paper_summary       `<GPU>.csv`: the paper's chosen regressor and its error (`Best_error%`)
  vtrain              VIA-Research/vTrain `ground_truth_single.csv` (measured iteration times)
  op_samples          the project's own schema: the op_samples columns minus batch_id
  collective_samples  the collective_samples columns minus batch_id
  measured_runs       `case_id,platform,arch,...,step_time_s` (+ optional source)

A whole file is rejected (`FormatError`) when it lacks a required column; a bad
row (NaN/inf/non-positive duration, unknown op/pass/collective, non-integer or
non-positive shape) is dropped and counted. Outliers that are valid numbers (the
paper's 5.4e7 us optimizer rows, bimodal allgather rows) are kept on purpose.
"""
from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from . import ops
from .specs import ARCHS, BYTES_PER_ELEMENT, PRECISIONS, RECOMPUTES, SCHEDULES, ModelSpec, padded_vocab

PAPER_REPO = "DebarghaG/estimate-train-time"
VTRAIN_REPO = "VIA-Research/vTrain"
PUBLISHED_LICENCE = "MIT"
VTRAIN_PLATFORM = "dgx-a100-80gb"
PAPER_VOCAB = 50257

KINDS = ("paper_operator", "paper_optimizer", "paper_nccl", "paper_summary", "vtrain", "vtrain_allreduce_lut",
         "op_samples", "collective_samples", "measured_runs")

OP_SAMPLE_COLUMNS = ("platform", "op", "pass", *ops.SHAPE_COLUMNS, "variant", "dtype", "duration_s",
                     "source", "measured_at")
COLLECTIVE_COLUMNS = ("platform", "collective", "message_bytes", "ranks", "nodes", "gpus_per_node", "dtype",
                      "duration_s", "source", "measured_at")
MEASURED_RUN_INPUT_COLUMNS = ("case_id", "platform", "arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden",
                              "vocab", "seq_len", "num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch", "vpp",
                              "schedule", "recompute", "sequence_parallel", "zero_stage", "precision", "step_time_s")
MEASURED_RUN_INT_COLUMNS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "num_gpus",
                            "tp", "pp", "dp", "micro_batch", "global_batch", "vpp")

# Platforms this module knows how to describe: id -> (device name, description).
KNOWN_PLATFORMS = {
    "perlmutter-a100": ("NVIDIAA100-SXM4-80GB",
                        "NERSC Perlmutter: NVIDIA A100-SXM4-80GB, 4 GPUs/node (NVLink 3), Slingshot-11 (paper samples)"),
    "vista-gh200": ("NVIDIAGH200120GB", "TACC Vista: NVIDIA GH200 120GB, 1 GPU/node, InfiniBand (paper samples)"),
    VTRAIN_PLATFORM: (None, "One node of A100 GPUs running Megatron-DeepSpeed GPT (vTrain measured runs)"),
}
PAPER_DEVICES = {device: platform for platform, device in ops.PAPER_PLATFORMS.values()}

# Paper operator files: the shape columns each file holds (besides F_dur(us), B_dur(us)).
_MLBD, _MBHLD, _MBHL = ("mp", "b", "l", "dim"), ("mp", "b", "h", "l", "dim"), ("mp", "b", "h", "l")
PAPER_OP_COLUMNS: dict[str, tuple[str, ...]] = {
    "linear1": _MLBD, "linear2": _MLBD, "linear3": _MLBD, "linear4": _MLBD, "linear_final": _MLBD,
    "embedding": _MLBD, "gelu": _MLBD, "flash_atten": _MBHLD, "baddbmm": _MBHLD, "bmm": _MBHLD,
    "fillmask": _MBHLD, "RoPE": _MBHLD, "softmax": _MBHL, "ScaledUpperTriangMaskedSoftmax": _MBHL,
    "layernorm": ("b", "l", "dim"), "RMSlayernorm": ("b", "l", "dim"), "res_add": ("b", "l", "dim"),
    "parallel_cross_entropy_128": ("mp", "b", "l"),
}
PAPER_COLUMN_MAP = {"mp": "tp", "b": "batch", "l": "seq", "dim": "hidden", "h": "heads", "encoders": "layers",
                    "num_layers": "layers", "hidden_size": "hidden", "params": "params"}
PAPER_PASS_COLUMNS = (("fwd", "F_dur(us)"), ("bwd", "B_dur(us)"))
PAPER_STAGE_COLUMNS = ("mp", "dim", "encoders", "dur(us)")
PAPER_WHOLE_OPTIMIZER_COLUMNS = ("num_layers", "hidden_size", "params", "dur")
PAPER_NCCL_COLUMNS = ("shape", "nodes", "GPUsPerNode", "dur(us)")
PAPER_SUMMARY_COLUMNS = {"operator": ("GPU", "Function", "Precision", "Propagation", "Best_model", "Best_error%"),
                         "nccl": ("GPU", "Function", "Precision", "Nodes", "GPUsPerNode", "Best_model", "Best_error%")}
VTRAIN_COLUMNS = {"# GPUs": "num_gpus", "global batch": "global_batch", "micro batch": "micro_batch",
                  "hidden size": "hidden", "attention heads": "heads", "# layers": "layers",
                  "sequence length": "seq_len", "tensor parallelism": "tp", "data parallelism": "dp",
                  "pipeline parallelism": "pp", "iteration time (ms)": "step_time_ms"}

_PAPER_FILE = re.compile(r"^(?P<device>[^_]+)_(?P<name>.+?)_(?P<dtype>fp16|bf16|fp32)"
                         r"(?:_(?P<nodes>\d+)_(?P<gpn>\d+))?\.csv$")
DATA_SUFFIXES = (".csv", ".parquet")


class FormatError(ValueError):
    """The whole file cannot be ingested (unknown layout, missing columns, ...)."""


@dataclass
class FilePlan:
    """One candidate file and what the store should do with it."""

    path: Path
    kind: str | None = None  # None: skip (see skip_reason)
    skip_reason: str = ""
    platform: str | None = None  # explicit or manifest override
    licence: str | None = None
    source: str | None = None  # manifest source
    info: dict[str, Any] = field(default_factory=dict)  # paper file-name parts
    root: Path | None = None


@dataclass
class ParsedFile:
    """Canonical rows of one file, by table, and what was rejected."""

    tables: dict[str, pd.DataFrame]
    platforms: dict[str, tuple[str | None, str | None]]  # platform -> (device name, description)
    source: str
    licence: str | None
    rows_rejected: int = 0
    examples: list[str] = field(default_factory=list)
    notes: str = ""


# --------------------------------------------------------------------------- planning

def plan_files(path: Path, *, kind: str | None = None, platform: str | None = None,
               licence: str | None = None) -> list[FilePlan]:
    """List the data files under `path` (a file or a directory, recursively) with their kind.

    A directory holding `manifest.json` gives its files the manifest's platform/source/licence
    (explicit arguments win). Pooled paper NCCL files are skipped when per-topology files exist.
    """
    path = Path(path)
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown kind '{kind}'; use one of {', '.join(KINDS)}")
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {path}")
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.is_file() and (p.suffix.lower() in DATA_SUFFIXES or _VTRAIN_LUT.match(p.name)))
    plans = []
    for f in files:
        plan = FilePlan(path=f, platform=platform, licence=licence, root=path)
        plan.kind, plan.info = detect_kind(f, kind)
        try:
            _apply_manifest(plan, path)
        except (OSError, ValueError) as exc:
            plan.kind, plan.skip_reason = None, f"rejected: unreadable manifest.json: {exc}"
            plans.append(plan)
            continue
        if plan.kind is None:
            plan.skip_reason = plan.info.pop("reason", "unrecognised format")
        elif plan.kind == "paper_nccl" and plan.info.get("nodes") is None:
            siblings = _per_topology_siblings(f, plan.info)
            if siblings:
                plan.kind = None
                plan.skip_reason = (f"pooled NCCL file: its rows duplicate the {len(siblings)} per-topology "
                                    f"files {f.stem}_<nodes>_<gpus_per_node>.csv")
        plans.append(plan)
    return plans


def _apply_manifest(plan: FilePlan, root: Path) -> None:
    """Fill platform/source/licence from the nearest manifest.json between the file and `root`."""
    stop = root if root.is_dir() else root.parent
    for d in [plan.path.parent, *plan.path.parent.parents]:
        m = d / "manifest.json"
        if m.is_file():
            data = json.loads(m.read_text())
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            plan.platform = plan.platform or data.get("platform")
            plan.licence = plan.licence or data.get("licence") or data.get("license")
            plan.source = data.get("source")
            plan.info["manifest"] = {k: data[k] for k in ("device_name", "description") if k in data}
            return
        if d == stop:
            return


def _per_topology_siblings(path: Path, info: dict[str, Any]) -> list[Path]:
    out = []
    for p in sorted(path.parent.glob(f"{info['device']}_{info['name']}_{info['dtype']}_*_*.csv")):
        m = _PAPER_FILE.match(p.name)
        if m and m["name"] == info["name"] and m["nodes"] is not None:
            out.append(p)
    return out


def read_header(path: Path) -> list[str]:
    """Column names of a CSV (BOM stripped) or Parquet file."""
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq
        return [str(c).strip() for c in pq.read_schema(path).names]
    with open(path, encoding="utf-8-sig", errors="replace") as fh:
        line = fh.readline()
    return [c.strip().strip('"') for c in line.rstrip("\r\n").split(",")] if line else []


def detect_kind(path: Path, forced: str | None = None) -> tuple[str | None, dict[str, Any]]:
    """(kind, info) of one file; kind None with info['reason'] when it is not a data file we know."""
    try:
        cols = set(read_header(path))
    except Exception as exc:  # unreadable Parquet footer etc.
        return None, {"reason": f"rejected: cannot read the header: {exc}"}
    m = _PAPER_FILE.match(path.name)
    info: dict[str, Any] = {}
    if m:
        info = {"device": m["device"], "name": m["name"], "dtype": m["dtype"],
                "nodes": int(m["nodes"]) if m["nodes"] else None, "gpn": int(m["gpn"]) if m["gpn"] else None}
    elif path.suffix.lower() == ".csv" and path.stem in PAPER_DEVICES:
        info = {"device": path.stem}
    if forced:
        if forced.startswith("paper_") and forced != "paper_summary" and not m:
            return None, {"reason": f"rejected: kind {forced} needs a file named <GPU>_<name>_fp16[_<n>_<g>].csv"}
        return forced, info
    if "Best_error%" in cols:
        return "paper_summary", info
    if "iteration time (ms)" in cols:
        return "vtrain", info
    if _VTRAIN_LUT.match(path.name) and "size(B)" in cols:
        info = {"gpus": int(_VTRAIN_LUT.match(path.name)["n"]), "gpu_family": path.parent.name}
        return "vtrain_allreduce_lut", info
    if "op" in cols and "pass" in cols:
        return "op_samples", info
    if "collective" in cols:
        return "collective_samples", info
    if "step_time_s" in cols or "case_id" in cols:
        return "measured_runs", info
    if m and (m["device"] in PAPER_DEVICES or cols & {"F_dur(us)", "dur(us)", "dur", "shape"}):
        if m["name"] in ops.PAPER_OPTIMIZER_FILES:
            return "paper_optimizer", info
        if m["name"] in ops.PAPER_COLLECTIVES or path.parent.name == "nccl" or m["nodes"]:
            return "paper_nccl", info
        return "paper_operator", info
    return None, {"reason": "unrecognised format (not a paper, vTrain or project sample file)"}


# --------------------------------------------------------------------------- reading and row checks

def read_frame(data: bytes, path: Path, text: bool = True) -> pd.DataFrame:
    """A CSV (BOM stripped) or Parquet file as a DataFrame with stripped column names.

    `text=True` reads CSV cells as strings (exact values in rejection messages); the
    all-numeric paper files use `text=False`, which is faster.
    """
    if path.suffix.lower() == ".parquet":
        df = pd.read_parquet(io.BytesIO(data))
    else:
        df = pd.read_csv(io.BytesIO(data), dtype=str if text else None, encoding="utf-8-sig",
                         skipinitialspace=True)
    df.columns = [str(c).strip() for c in df.columns]
    return df.reset_index(drop=True)


def require_columns(df: pd.DataFrame, required: Iterable[str], path: Path, expected: Iterable[str]) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise FormatError(f"{path.name}: missing column(s) {', '.join(missing)}; "
                          f"expected columns: {', '.join(expected)}")


def show(v: Any) -> str:
    """A cell value for a rejection message: numbers as %g, text quoted, missing as 'missing'."""
    if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
        return "missing" if v is None or v is pd.NA else "nan"
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
        return f"{float(v):.15g}"
    return repr(v)


def _num(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s, errors="coerce").astype("float64")


class RowChecks:
    """Collects per-row failure masks over one frame and describes the first few failures."""

    def __init__(self, n: int, labels: Callable[[int], str]):
        self.bad = np.zeros(n, dtype=bool)
        self._labels = labels
        self._checks: list[tuple[np.ndarray, Callable[[int], str]]] = []

    def add(self, bad: Any, describe: Callable[[int], str]) -> None:
        bad = np.asarray(bad, dtype=bool)
        self.bad |= bad
        self._checks.append((bad, describe))

    def positive_int(self, name: str, raw: pd.Series, nullable: bool = False, minimum: int = 1) -> pd.Series:
        """Checks `raw` holds integers >= minimum (NULL allowed if nullable); returns them as Int64."""
        v = _num(raw)
        ok = np.isfinite(v) & (v >= minimum) & (v == np.floor(v)) & (v.abs() < 2 ** 62)
        missing = raw.isna().to_numpy()
        if nullable:
            ok = ok | missing
        vals = raw.to_numpy()
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        self.add(~ok, lambda i: f"{name}={show(vals[i])} is not {what}")
        return v.where(ok & ~missing).round().astype("Int64")

    def positive_float(self, name: str, raw: pd.Series, scale: float = 1.0) -> pd.Series:
        v = _num(raw)
        ok = np.isfinite(v) & (v > 0)
        vals = raw.to_numpy()
        self.add(~ok, lambda i: f"{name}={show(vals[i])} is not a positive finite number")
        return v * scale

    def member(self, name: str, values: pd.Series, allowed: Iterable[Any]) -> None:
        allowed = set(allowed)
        vals = values.to_numpy()
        ok = np.array([v in allowed for v in vals], dtype=bool)
        self.add(~ok, lambda i: f"unknown {name} {show(vals[i])}")

    def rejected(self) -> int:
        return int(self.bad.sum())

    def examples(self, limit: int) -> list[str]:
        out = []
        for i in np.flatnonzero(self.bad)[:limit]:
            reasons = [describe(i) for mask, describe in self._checks if mask[i]]
            out.append(f"{self._labels(i)}: {'; '.join(reasons)}")
        return out


def _labeler(path: Path) -> Callable[[int], str]:
    """Row labels: CSV line numbers (the header is line 1) or Parquet row numbers."""
    if path.suffix.lower() == ".parquet":
        return lambda i: f"row {i + 1}"
    return lambda i: f"line {i + 2}"


def _finish(df: pd.DataFrame, checks: RowChecks, limit: int) -> tuple[pd.DataFrame, int, list[str]]:
    good = df.loc[~checks.bad].reset_index(drop=True)
    return good, checks.rejected(), checks.examples(limit)


def _text(raw: pd.Series) -> pd.Series:
    return raw.astype("object").where(raw.notna(), None).map(lambda v: v.strip() if isinstance(v, str) else v)


# --------------------------------------------------------------------------- provenance

def relative_source(path: Path, root: Path | None) -> str:
    """The path relative to the datasets folder (the parent of paper-samples/ or vtrain/)."""
    path = path.resolve()
    for parent in path.parents:
        if parent.name in ("paper-samples", "vtrain"):
            return path.relative_to(parent.parent).as_posix()
    if root is not None and root.resolve().is_dir():
        return path.relative_to(root.resolve().parent).as_posix()
    return path.name


def _paper_platform(plan: FilePlan) -> tuple[str, str | None]:
    """(platform id, device name) of a paper file: override, else its device, else its folder."""
    device = plan.info.get("device")
    if plan.platform:
        return plan.platform, device
    if device in PAPER_DEVICES:
        return PAPER_DEVICES[device], device
    for parent in plan.path.resolve().parents:
        if parent.name in ops.PAPER_PLATFORMS:
            return ops.PAPER_PLATFORMS[parent.name][0], device
    raise FormatError(f"{plan.path.name}: unknown paper device '{device}'; pass a platform id to ingest it")


def _platform_entry(platform: str, device: str | None = None, manifest: dict | None = None
                    ) -> dict[str, tuple[str | None, str | None]]:
    known_device, description = KNOWN_PLATFORMS.get(platform, (None, None))
    manifest = manifest or {}
    return {platform: (manifest.get("device_name") or device or known_device,
                       manifest.get("description") or description)}


# --------------------------------------------------------------------------- paper formats

def paper_stage_params(hidden: int, layers: int, tp: int, variant: str) -> int:
    """Parameters one GPU holds for a GPT-NeoX pipeline stage of `layers` layers.

    Per layer: ModelSpec(arch='gpt').params_per_layer() with the matrix parameters divided
    by tp (12*h^2/tp) and the norm/bias parameters not (13*h). The first stage adds the
    padded vocab embedding / tp, the last stage the LM head / tp and the final LayerNorm.
    """
    full = ModelSpec(name="paper", arch="gpt", num_layers=layers, hidden_size=hidden, num_heads=1).params_per_layer()
    vector = 13 * hidden
    per_layer = (full - vector) // tp + vector
    total = layers * per_layer
    vocab_shard = padded_vocab(PAPER_VOCAB, tp) * hidden // tp
    if variant == "first":
        total += vocab_shard
    elif variant == "last":
        total += vocab_shard + 2 * hidden
    return total


def parse_paper_operator(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    name = plan.info["name"]
    if name not in ops.PAPER_OP_NAMES or name not in PAPER_OP_COLUMNS:
        raise FormatError(f"{plan.path.name}: unknown paper op '{name}'; known: {', '.join(sorted(PAPER_OP_COLUMNS))}")
    op = ops.PAPER_OP_NAMES[name]
    platform, device = _paper_platform(plan)
    df = read_frame(data, plan.path, text=False)
    if name == "res_add" and "B_dur(us)" not in df.columns and "F_dur(us)" in df.columns:
        df["B_dur(us)"] = df["F_dur(us)"]  # one measurement for both passes
    shape_cols = PAPER_OP_COLUMNS[name]
    expected = [*shape_cols, "F_dur(us)", "B_dur(us)"]
    require_columns(df, expected, plan.path, expected)
    n = len(df)
    long = pd.concat([df.assign(**{"pass": p, "_dur": df[c], "_durcol": c}) for p, c in PAPER_PASS_COLUMNS],
                     ignore_index=True)
    passes = long["pass"].to_numpy()
    checks = RowChecks(len(long), lambda i: f"line {i % max(n, 1) + 2} ({passes[i]})")
    out = pd.DataFrame({"platform": platform, "op": op, "pass": long["pass"]})
    for c in shape_cols:
        out[PAPER_COLUMN_MAP[c]] = checks.positive_int(c, long[c])
    durcols = long["_durcol"].to_numpy()
    raw = long["_dur"]
    v = _num(raw)
    ok = np.isfinite(v) & (v > 0)
    vals = raw.to_numpy()
    checks.add(~ok, lambda i: f"{durcols[i]}={show(vals[i])} is not a positive finite duration")
    out["duration_s"] = v * 1e-6
    out["dtype"] = plan.info["dtype"]
    good, bad, ex = _finish(out, checks, limit)
    return _paper_result(plan, {"op_samples": good}, platform, device, bad, ex, f"paper {name} -> {op}")


def parse_paper_optimizer(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    name = plan.info["name"]
    variant = ops.PAPER_OPTIMIZER_FILES[name]
    platform, device = _paper_platform(plan)
    df = read_frame(data, plan.path, text=False)
    checks = RowChecks(len(df), _labeler(plan.path))
    out = pd.DataFrame({"platform": [platform] * len(df)})
    if variant == "whole":
        require_columns(df, PAPER_WHOLE_OPTIMIZER_COLUMNS, plan.path, PAPER_WHOLE_OPTIMIZER_COLUMNS)
        out["tp"] = pd.array([1] * len(df), dtype="Int64")
        for c in ("num_layers", "hidden_size", "params"):
            out[PAPER_COLUMN_MAP[c]] = checks.positive_int(c, df[c])
        dur_col = "dur"
    else:
        require_columns(df, PAPER_STAGE_COLUMNS, plan.path, PAPER_STAGE_COLUMNS)
        for c in ("mp", "dim", "encoders"):
            out[PAPER_COLUMN_MAP[c]] = checks.positive_int(c, df[c])
        dur_col = "dur(us)"
    vals = df[dur_col].to_numpy()
    v = _num(df[dur_col])
    checks.add(~(np.isfinite(v) & (v > 0)), lambda i: f"{dur_col}={show(vals[i])} is not a positive finite duration")
    out["duration_s"] = v * 1e-6
    out = out.assign(op="optimizer", **{"pass": "step"}, variant=variant, dtype=plan.info["dtype"])
    good, bad, ex = _finish(out, checks, limit)
    if variant != "whole" and len(good):
        good["params"] = pd.array([paper_stage_params(int(h), int(l), int(t), variant)
                                   for h, l, t in zip(good["hidden"], good["layers"], good["tp"])], dtype="Int64")
    return _paper_result(plan, {"op_samples": good}, platform, device, bad, ex, f"paper {name} -> optimizer/{variant}")


def parse_paper_nccl(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    name = plan.info["name"]
    if name not in ops.PAPER_COLLECTIVES:
        raise FormatError(f"{plan.path.name}: unknown paper collective '{name}'; "
                          f"known: {', '.join(sorted(ops.PAPER_COLLECTIVES))}")
    platform, device = _paper_platform(plan)
    df = read_frame(data, plan.path, text=False)
    require_columns(df, PAPER_NCCL_COLUMNS, plan.path, PAPER_NCCL_COLUMNS)
    checks = RowChecks(len(df), _labeler(plan.path))
    shape = checks.positive_int("shape", df["shape"])
    nodes = checks.positive_int("nodes", df["nodes"])
    gpn = checks.positive_int("GPUsPerNode", df["GPUsPerNode"])
    if plan.info.get("nodes") is not None:
        want = (plan.info["nodes"], plan.info["gpn"])
        nv, gv = nodes.to_numpy(dtype="float64", na_value=np.nan), gpn.to_numpy(dtype="float64", na_value=np.nan)
        mismatch = ~np.isnan(nv) & ~np.isnan(gv) & ((nv != want[0]) | (gv != want[1]))
        checks.add(mismatch, lambda i: f"topology {nv[i]:g}x{gv[i]:g} does not match the file name {want[0]}x{want[1]}")
    dur = checks.positive_float("dur(us)", df["dur(us)"], 1e-6)
    out = pd.DataFrame({"platform": platform, "collective": ops.PAPER_COLLECTIVES[name],
                        "message_bytes": shape * BYTES_PER_ELEMENT[plan.info["dtype"]], "ranks": nodes * gpn,
                        "nodes": nodes, "gpus_per_node": gpn, "dtype": plan.info["dtype"], "duration_s": dur})
    good, bad, ex = _finish(out, checks, limit)
    return _paper_result(plan, {"collective_samples": good}, platform, device, bad, ex,
                         f"paper {name} -> {ops.PAPER_COLLECTIVES[name]}")


def parse_paper_summary(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    df = read_frame(data, plan.path)
    kind = "nccl" if "Nodes" in df.columns else "operator"
    expected = PAPER_SUMMARY_COLUMNS[kind]
    require_columns(df, expected, plan.path, expected)
    plan.info.setdefault("device", df["GPU"].dropna().iloc[0] if df["GPU"].notna().any() else None)
    platform, device = _paper_platform(plan)
    checks = RowChecks(len(df), _labeler(plan.path))
    func = _text(df["Function"])
    if kind == "operator":
        names = {**ops.PAPER_OP_NAMES, **{k: "optimizer" for k in ops.PAPER_OPTIMIZER_FILES}}
        checks.member("function", func, names)
        prop = _text(df["Propagation"])
        checks.member("propagation", prop, ("fwd", "bwd", "dur"))
        out = pd.DataFrame({"op": func.map(names), "pass": prop.map({"fwd": "fwd", "bwd": "bwd", "dur": "step"}),
                            "nodes": pd.array([None] * len(df), dtype="Int64")})
        out["gpus_per_node"] = out["nodes"]
    else:
        checks.member("function", func, ops.PAPER_COLLECTIVES)
        nodes = checks.positive_int("Nodes", df["Nodes"], minimum=0)
        gpn = checks.positive_int("GPUsPerNode", df["GPUsPerNode"], minimum=0)
        pooled = (nodes == 0) | (gpn == 0)  # 0,0 = the regressor over all topologies pooled
        out = pd.DataFrame({"op": func.map(ops.PAPER_COLLECTIVES), "pass": None,
                            "nodes": nodes.mask(pooled), "gpus_per_node": gpn.mask(pooled)})
    err = _num(df["Best_error%"])
    vals = df["Best_error%"].to_numpy()
    checks.add(~(np.isfinite(err) & (err >= 0)), lambda i: f"Best_error%={show(vals[i])} is not a non-negative number")
    out = out.assign(platform=platform, kind=kind, paper_function=func, best_model=_text(df["Best_model"]),
                     best_error=err)
    good, bad, ex = _finish(out, checks, limit)
    return _paper_result(plan, {"paper_errors": good}, platform, device, bad, ex, f"paper {kind} error summary")


def _paper_result(plan: FilePlan, tables: dict[str, pd.DataFrame], platform: str, device: str | None,
                  bad: int, examples: list[str], notes: str) -> ParsedFile:
    source = f"{PAPER_REPO}:{relative_source(plan.path, plan.root)}"
    for name, df in tables.items():
        if name != "paper_errors":
            df["source"] = source
    return ParsedFile(tables=tables, platforms=_platform_entry(platform, device), source=source,
                      licence=plan.licence or PUBLISHED_LICENCE, rows_rejected=bad, examples=examples,
                      notes=f"{notes} on {platform}")


# --------------------------------------------------------------------------- vTrain and own formats

def parse_vtrain(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    """vTrain ground truth: Megatron-DeepSpeed GPT, full recompute, 1F1B, fp16, ZeRO-0."""
    df = read_frame(data, plan.path, text=False)
    require_columns(df, VTRAIN_COLUMNS, plan.path, VTRAIN_COLUMNS)
    platform = plan.platform or VTRAIN_PLATFORM
    checks = RowChecks(len(df), _labeler(plan.path))
    v = {new: checks.positive_int(old, df[old]) for old, new in VTRAIN_COLUMNS.items() if new != "step_time_ms"}
    step = checks.positive_float("iteration time (ms)", df["iteration time (ms)"], 1e-3)
    out = pd.DataFrame({"run_id": [f"{plan.path.stem}:{i + 2}" for i in range(len(df))], "platform": platform,
                        "arch": "gpt", "layers": v["layers"], "hidden": v["hidden"], "heads": v["heads"],
                        "kv_heads": v["heads"], "ffn_hidden": 4 * v["hidden"], "vocab": PAPER_VOCAB,
                        "seq_len": v["seq_len"], "num_gpus": v["num_gpus"], "tp": v["tp"], "pp": v["pp"],
                        "dp": v["dp"], "micro_batch": v["micro_batch"], "global_batch": v["global_batch"],
                        "vpp": 1, "schedule": "1f1b", "recompute": "full", "sequence_parallel": False,
                        "zero_stage": 0, "precision": "fp16", "step_time_s": step,
                        # Megatron-DeepSpeed without --use-flash-attn: baddbmm + fused masked softmax + bmm
                        "attention": "unfused"})
    _check_layout(checks, out)
    good, bad, ex = _finish(out, checks, limit)
    source = f"{VTRAIN_REPO}:{relative_source(plan.path, plan.root)}"
    good["source"] = source
    return ParsedFile(tables={"measured_runs": good}, platforms=_platform_entry(platform), source=source,
                      licence=plan.licence or PUBLISHED_LICENCE, rows_rejected=bad, examples=ex,
                      notes=f"vTrain measured runs on {platform}")


_VTRAIN_LUT = re.compile(r"^AR_GPU(?P<n>\d+)_.*_LUT$")
VTRAIN_LUT_PLATFORMS = {"a100": VTRAIN_PLATFORM}


def parse_vtrain_allreduce_lut(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    """vTrain's nccl-tests all-reduce table on n GPUs of one node: size(B), count, type, then
    (time(ns), busbw) for two runs; each run becomes one sample."""
    family = plan.info.get("gpu_family", "")
    platform = plan.platform or VTRAIN_LUT_PLATFORMS.get(family)
    if platform is None:
        raise FormatError(f"{plan.path}: no platform is known for '{family}' all-reduce tables; "
                          f"pass --platform to say which cluster they were measured on")
    n = int(plan.info["gpus"])
    text = data.decode("utf-8-sig").splitlines()
    rows = [ln.split(",") for ln in text[1:] if ln.strip()]
    if not rows or len(rows[0]) < 5:
        raise FormatError(f"{plan.path}: expected columns size(B),count,type,time(ns),busbw(GB/s)[,time(ns),busbw(GB/s)]")
    recs = []
    for r in rows:
        for j in (3, 5):
            if j < len(r):
                recs.append({"size": r[0], "time_ns": r[j]})
    df = pd.DataFrame(recs)
    checks = RowChecks(len(df), _labeler(plan.path))
    size = checks.positive_int("size(B)", df["size"])
    dur = checks.positive_float("time(ns)", df["time_ns"], 1e-9)
    out = pd.DataFrame({"platform": platform, "collective": "allreduce", "message_bytes": size, "ranks": n,
                        "nodes": 1, "gpus_per_node": n, "dtype": "fp32", "duration_s": dur})
    good, bad, ex = _finish(out, checks, limit)
    source = f"{VTRAIN_REPO}:{relative_source(plan.path, plan.root)}"
    good["source"] = source
    return ParsedFile(tables={"collective_samples": good}, platforms=_platform_entry(platform), source=source,
                      licence=plan.licence or PUBLISHED_LICENCE, rows_rejected=bad, examples=ex,
                      notes=f"vTrain nccl-tests all-reduce on {n} GPUs of one node ({platform})")


def _check_layout(checks: RowChecks, out: pd.DataFrame) -> None:
    f = {c: out[c].to_numpy(dtype="float64", na_value=np.nan) for c in ("tp", "pp", "dp", "num_gpus",
                                                                          "global_batch", "micro_batch")}
    prod = f["tp"] * f["pp"] * f["dp"]
    checks.add(prod != f["num_gpus"], lambda i: f"tp*pp*dp = {prod[i]:g} != num_gpus {f['num_gpus'][i]:g}")
    rem = np.fmod(f["global_batch"], f["micro_batch"] * f["dp"])
    checks.add(rem != 0, lambda i: f"global_batch {f['global_batch'][i]:g} is not a multiple of micro_batch*dp")


def _platform_column(df: pd.DataFrame, plan: FilePlan, checks: RowChecks) -> pd.Series:
    if plan.platform:
        return pd.Series([plan.platform] * len(df), dtype="object")
    p = _text(df["platform"])
    checks.add(p.isna() | (p == ""), lambda i: "platform is empty")
    return p


def _own_common(df: pd.DataFrame, plan: FilePlan, checks: RowChecks, out: pd.DataFrame) -> None:
    """dtype, duration_s, source and measured_at of the project's own sample schemas."""
    out["dtype"] = _text(df["dtype"])
    checks.add(out["dtype"].isna(), lambda i: "dtype is empty")
    out["duration_s"] = checks.positive_float("duration_s", df["duration_s"])
    default_source = plan.source or str(plan.path.resolve())
    out["source"] = _text(df["source"]).fillna(default_source) if "source" in df.columns else default_source
    if "measured_at" in df.columns:
        raw = df["measured_at"]
        ts = pd.to_datetime(raw, errors="coerce", utc=True)
        vals = raw.to_numpy()
        checks.add(ts.isna() & raw.notna(), lambda i: f"measured_at={show(vals[i])} is not a timestamp")
        out["measured_at"] = ts.dt.tz_convert(None)


def parse_op_samples(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    df = read_frame(data, plan.path)
    required = ["op", "pass", "dtype", "duration_s"] + ([] if plan.platform else ["platform"])
    require_columns(df, required, plan.path, [c for c in OP_SAMPLE_COLUMNS])
    checks = RowChecks(len(df), _labeler(plan.path))
    out = pd.DataFrame({"platform": _platform_column(df, plan, checks), "op": _text(df["op"]),
                        "pass": _text(df["pass"])})
    pairs = list(zip(out["op"], out["pass"]))
    ops_ok = np.array([o in ops.OPS for o, _ in pairs], dtype=bool)
    pass_ok = np.array([o in ops.OPS and p in ops.OPS[o].passes for o, p in pairs], dtype=bool)
    checks.add(~ops_ok, lambda i: f"unknown op {show(pairs[i][0])}")
    checks.add(ops_ok & ~pass_ok, lambda i: f"unknown pass {show(pairs[i][1])} for op {show(pairs[i][0])}")
    for c in ops.SHAPE_COLUMNS:
        if c in df.columns:
            out[c] = checks.positive_int(c, df[c], nullable=True)
    if "variant" in df.columns:
        out["variant"] = _text(df["variant"])
    _own_common(df, plan, checks, out)
    return _own_result(plan, "op_samples", out, checks, limit, df.columns, OP_SAMPLE_COLUMNS)


def parse_collective_samples(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    df = read_frame(data, plan.path)
    required = ["collective", "message_bytes", "ranks", "dtype", "duration_s"] + ([] if plan.platform else ["platform"])
    require_columns(df, required, plan.path, COLLECTIVE_COLUMNS)
    checks = RowChecks(len(df), _labeler(plan.path))
    out = pd.DataFrame({"platform": _platform_column(df, plan, checks), "collective": _text(df["collective"])})
    checks.member("collective", out["collective"], ops.COLLECTIVES)
    out["message_bytes"] = checks.positive_int("message_bytes", df["message_bytes"])
    out["ranks"] = checks.positive_int("ranks", df["ranks"])
    for c in ("nodes", "gpus_per_node"):
        if c in df.columns:
            out[c] = checks.positive_int(c, df[c], nullable=True)
    _own_common(df, plan, checks, out)
    return _own_result(plan, "collective_samples", out, checks, limit, df.columns, COLLECTIVE_COLUMNS)


def _bools(raw: pd.Series, checks: RowChecks, name: str) -> pd.Series:
    table = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    keys = raw.map(lambda v: str(v).strip().lower() if v is not None and not pd.isna(v) else None)
    vals = raw.to_numpy()
    checks.add(~keys.isin(list(table)).to_numpy(), lambda i: f"{name}={show(vals[i])} is not a boolean")
    return keys.map(table).astype("boolean")


def parse_measured_runs(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    """Measured runs in the predict-batch columns plus step_time_s. Empty cells take the same
    documented defaults as predict-batch (one rule set: predictor.layout_io); a row whose model or
    layout is infeasible is rejected with the field and the fix."""
    from .layout_io import layout_from_fields, model_from_fields
    from .specs import InfeasibleConfig
    df = read_frame(data, plan.path)
    required = ["case_id", "arch", "layers", "hidden", "heads", "step_time_s"] + ([] if plan.platform else ["platform"])
    require_columns(df, required, plan.path, [*MEASURED_RUN_INPUT_COLUMNS, "source (optional)", "attention (optional)"])
    checks = RowChecks(len(df), _labeler(plan.path))
    step = checks.positive_float("step_time_s", df["step_time_s"])
    records, problems = [], []
    for i, row in enumerate(df.to_dict(orient="records")):
        platform = plan.platform or (str(row.get("platform") or "").strip() or None)
        try:
            if platform is None:
                raise InfeasibleConfig("platform", "is empty.", "name the platform the run was measured on.")
            m = model_from_fields(row)
            L = layout_from_fields(row)
            L.validate(m)
            problems.append(None)
        except InfeasibleConfig as e:
            problems.append(str(e))
            records.append({})
            continue
        case = row.get("case_id")
        records.append({"run_id": None if case is None or str(case).strip() == "" else str(case).strip(),
                        "platform": platform, "arch": m.arch, "layers": m.num_layers, "hidden": m.hidden_size,
                        "heads": m.num_heads, "kv_heads": m.kv_heads, "ffn_hidden": m.ffn, "vocab": m.vocab_size,
                        "seq_len": L.seq_len, "num_gpus": L.num_gpus, "tp": L.tp, "pp": L.pp, "dp": L.dp,
                        "micro_batch": L.micro_batch, "global_batch": L.global_batch, "vpp": L.vpp,
                        "schedule": L.schedule, "recompute": L.recompute, "sequence_parallel": L.sequence_parallel,
                        "zero_stage": L.zero_stage, "precision": L.precision, "attention": m.attention_impl})
    checks.add(np.array([p is not None for p in problems]), lambda i: problems[i])
    out = pd.DataFrame(records, columns=["run_id", "platform", "arch", "layers", "hidden", "heads", "kv_heads",
                                         "ffn_hidden", "vocab", "seq_len", "num_gpus", "tp", "pp", "dp",
                                         "micro_batch", "global_batch", "vpp", "schedule", "recompute",
                                         "sequence_parallel", "zero_stage", "precision", "attention"])
    checks.add(out["run_id"].isna().to_numpy() & np.array([p is None for p in problems]), lambda i: "case_id is empty")
    for c in MEASURED_RUN_INT_COLUMNS:
        out[c] = out[c].astype("Int64")
    out["sequence_parallel"] = out["sequence_parallel"].astype("boolean")
    out["step_time_s"] = step
    default_source = plan.source or str(plan.path.resolve())
    out["source"] = _text(df["source"]).fillna(default_source) if "source" in df.columns else default_source
    return _own_result(plan, "measured_runs", out, checks, limit, df.columns,
                       [*MEASURED_RUN_INPUT_COLUMNS, "source", "attention"])


def _own_result(plan: FilePlan, table: str, out: pd.DataFrame, checks: RowChecks, limit: int,
                have: Iterable[str], known: Iterable[str]) -> ParsedFile:
    good, bad, ex = _finish(out, checks, limit)
    ignored = sorted(set(have) - set(known) - {"batch_id"})
    notes = f"{table}" + (f"; ignored columns: {', '.join(ignored)}" if ignored else "")
    manifest = plan.info.get("manifest")
    platforms: dict[str, tuple[str | None, str | None]] = {}
    for p in sorted(good["platform"].dropna().unique()):
        platforms.update(_platform_entry(str(p), manifest=manifest))
    return ParsedFile(tables={table: good}, platforms=platforms, source=plan.source or str(plan.path.resolve()),
                      licence=plan.licence, rows_rejected=bad, examples=ex, notes=notes)


PARSERS: dict[str, Callable[[bytes, FilePlan, int], ParsedFile]] = {
    "paper_operator": parse_paper_operator, "paper_optimizer": parse_paper_optimizer,
    "paper_nccl": parse_paper_nccl, "paper_summary": parse_paper_summary, "vtrain": parse_vtrain,
    "vtrain_allreduce_lut": parse_vtrain_allreduce_lut,
    "op_samples": parse_op_samples, "collective_samples": parse_collective_samples,
    "measured_runs": parse_measured_runs,
}


def parse_file(data: bytes, plan: FilePlan, limit: int = 5) -> ParsedFile:
    """Parse one planned file; raises FormatError when the whole file must be rejected."""
    assert plan.kind is not None
    try:
        return PARSERS[plan.kind](data, plan, limit)
    except FormatError:
        raise
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise FormatError(f"{plan.path.name}: cannot parse as {plan.kind}: {exc}") from exc
    except Exception as exc:
        import pyarrow as pa
        if isinstance(exc, pa.ArrowException):
            raise FormatError(f"{plan.path.name}: cannot read Parquet: {exc}") from exc
        raise

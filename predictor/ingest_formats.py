"""Parsers for every sample format the store ingests.

Each parser turns the bytes of one file into canonical frames (one per store
table) plus what was rejected, row by row, with the reason. Parsers never touch
the database: `store.py` owns transactions, idempotency and de-duplication.

Formats (the `kind` of a file, recorded in `batches.kind`):
  paper_operator      `<GPU>_<op>_fp16.csv` from DebarghaG/estimate-train-time (one row per pass)
  paper_optimizer     `<GPU>_{first,middle,last}Stage_optimizer_fp16.csv` and `<GPU>_optimizer_fp16.csv`
  paper_nccl          `<GPU>_<collective>_fp16[_<nodes>_<gpus_per_node>].csv`
  paper_summary       `<GPU>.csv`: the paper's chosen regressor and its error (`Best_error%`)
  vtrain              VIA-Research/vTrain `ground_truth_single.csv` (measured iteration times)
  op_samples          the project's own schema: the op_samples columns minus batch_id
  collective_samples  the collective_samples columns minus batch_id
  measured_runs       `case_id,platform,arch,...,step_time_s` (+ optional source, attention, framework,
                      source_id, notes)
  published_runs      ../shared/datasets/published-runs/*.csv (one row a published multi-node run);
                      how each source's rows become measured runs is defined, with citations, in
                      `predictor/catalog/published_sources.json`

Whole files are rejected (`FormatError`, naming the file and the problem) when they are empty,
hold a header but no rows, are not UTF-8, lack a required column, hold nested values (a Parquet
column of lists), or (named explicitly) match no known layout.

Rows are rejected one by one, with the line number and a reason that is counted:
  * a CSV row with more or fewer fields than the header;
  * values that do not parse or are out of range: a NaN / inf duration ("not finite"), a zero or
    negative one ("not positive"), a non-integer or non-positive shape, an unknown op / pass /
    collective, ...;
  * a truncated last line. What is detectable: a CSV that does not end with a newline has an
    unterminated last line; it is rejected when it has fewer fields than the header, when a value
    does not parse, or when its last field is written unlike that column in every other row
    (shorter than all of them, or in another numeric notation: `4.22835` where the other rows
    read `4.1e-05`). A cut that leaves a value written like its neighbours (`0.00123` cut to
    `0.0012` among 4-5 digit values) cannot be told from a complete line and is kept.
Outliers that are valid numbers (the paper's 5.4e7 us optimizer rows, bimodal allgather rows) are
kept on purpose. Measured runs that lack a field the predictor needs are *skipped* (counted with
the reason, e.g. "precision not stated"), never filled with a guess; rows that contradict themselves
(tp*pp*dp != num_gpus, GradAccum != global_batch / (micro_batch * dp), ...) are *rejected*.
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import ops
from .specs import (
    ARCHS,
    ATTENTION_IMPLS,
    BYTES_PER_ELEMENT,
    PRECISIONS,
    RECOMPUTES,
    SCHEDULES,
    InfeasibleConfig,
    ModelSpec,
    padded_vocab,
)

PAPER_REPO = "DebarghaG/estimate-train-time"
VTRAIN_REPO = "VIA-Research/vTrain"
PUBLISHED_LICENCE = "MIT"
VTRAIN_PLATFORM = "dgx-a100-80gb"
PAPER_VOCAB = 50257

KINDS = ("paper_operator", "paper_optimizer", "paper_nccl", "paper_summary", "vtrain", "vtrain_allreduce_lut",
         "op_samples", "collective_samples", "measured_runs", "published_runs")
# How a measured run was executed (measured_runs.framework).
from .specs import FRAMEWORKS  # noqa: E402  (one list: predictor.frameworks)

PUBLISHED_SOURCES_FILE = Path(__file__).resolve().parent / "catalog" / "published_sources.json"

OP_SAMPLE_COLUMNS = ("platform", "op", "pass", *ops.SHAPE_COLUMNS, "variant", "dtype", "duration_s",
                     "source", "measured_at")
COLLECTIVE_COLUMNS = ("platform", "collective", "message_bytes", "ranks", "nodes", "gpus_per_node", "dtype",
                      "duration_s", "source", "measured_at")
MEASURED_RUN_INPUT_COLUMNS = ("case_id", "platform", "arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden",
                              "vocab", "seq_len", "num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch", "vpp",
                              "schedule", "recompute", "sequence_parallel", "zero_stage", "precision", "step_time_s")
MEASURED_RUN_OPTIONAL_COLUMNS = ("source", "attention", "framework", "source_id", "notes")
MEASURED_RUN_INT_COLUMNS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "num_gpus",
                            "tp", "pp", "dp", "micro_batch", "global_batch", "vpp")
# The measured_runs columns a parser fills (the store adds batch_id and row_key).
MEASURED_RUN_COLUMNS = ("run_id", "platform", "arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
                        "seq_len", "num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch", "vpp", "schedule",
                        "recompute", "sequence_parallel", "zero_stage", "precision", "attention", "step_time_s",
                        "source", "framework", "source_id", "notes")
PUBLISHED_COLUMNS = ("source", "model_name", "layers", "hidden", "heads", "ffn_hidden", "seq_len", "vocab", "gpu",
                     "num_gpus", "gpus_per_node", "tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "global_batch",
                     "recompute", "precision", "measured_metric", "measured_value", "unit", "notes")

# Platforms this module knows how to describe: id -> (device name, description).
KNOWN_PLATFORMS = {
    "perlmutter-a100": ("NVIDIAA100-SXM4-80GB",
                        "NERSC Perlmutter: NVIDIA A100-SXM4-80GB, 4 GPUs/node (NVLink 3), Slingshot-11 "
                        "(paper samples)"),
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
# Integer fields stored as BIGINT (the rest are INTEGER, below 2^31): byte and parameter counts
BIGINT_FIELDS = ("params", "message_bytes", "size(B)", "shape")
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
_VTRAIN_LUT = re.compile(r"^AR_GPU(?P<n>\d+)_.*_LUT$")
DATA_SUFFIXES = (".csv", ".parquet")
KNOWN_LAYOUTS = ("paper <GPU>_<op>_fp16.csv (F_dur(us), B_dur(us) / dur(us))", "vTrain (iteration time (ms))",
                 "op_samples (op, pass, dtype, duration_s)", "collective_samples (collective, message_bytes, ...)",
                 "measured_runs (case_id, ..., step_time_s)", "published runs (measured_metric, measured_value)")


class FormatError(ValueError):
    """The whole file cannot be ingested (empty, not UTF-8, unknown layout, missing columns, ...)."""


class SourceDefinitionError(ValueError):
    """`published_sources.json` (or a measured-runs file's framework column definition) is wrong:
    a configuration error, so the whole ingest stops and nothing is committed."""


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
    """Canonical rows of one file, by table, and what was rejected.

    `rows_rejected` counts rows refused as invalid or contradictory (by reason in `reasons`, each row
    under its first reason), `rows_skipped` measured runs left out because a field the predictor
    needs is not stated (by reason in `skip_reasons`). `run_rejections` lists, for measured-run
    files, every row left out: {line, source_id, outcome ('rejected' | 'skipped'), reason, detail}.
    """

    tables: dict[str, pd.DataFrame]
    platforms: dict[str, tuple[str | None, str | None]]  # platform -> (device name, description)
    source: str
    licence: str | None
    rows_rejected: int = 0
    examples: list[str] = field(default_factory=list)
    notes: str = ""
    rows_skipped: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    skip_reasons: dict[str, int] = field(default_factory=dict)
    run_rejections: list[dict[str, Any]] = field(default_factory=list)


# --------------------------------------------------------------------------- planning

def plan_files(path: Path, *, kind: str | None = None, platform: str | None = None,
               licence: str | None = None) -> list[FilePlan]:
    """List the data files under `path` (a file or a directory, recursively) with their kind.

    A directory holding `manifest.json` gives its files the manifest's platform/source/licence
    (explicit arguments win). Pooled paper NCCL files are skipped when per-topology files exist.
    A file named explicitly whose layout is unknown is rejected; one found in a directory is skipped
    (with the reason), since directories may hold other CSVs.
    """
    path = Path(path)
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown kind '{kind}'; use one of {', '.join(KINDS)}")
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {path}")
    explicit = path.is_file()
    files = [path] if explicit else sorted(
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
            if explicit and not plan.skip_reason.startswith("rejected"):
                plan.skip_reason = f"rejected: {plan.skip_reason}"
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
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as fh:
        for line in fh:
            if line.strip():
                return [c.strip() for c in next(csv.reader([line], skipinitialspace=True))]
    return []


def detect_kind(path: Path, forced: str | None = None) -> tuple[str | None, dict[str, Any]]:
    """(kind, info) of one file; kind None with info['reason'] when it is not a data file we know."""
    try:
        if path.stat().st_size == 0:
            return None, {"reason": "rejected: empty file (0 bytes)"}
        cols = set(read_header(path))
    except Exception as exc:  # noqa: BLE001 - unreadable Parquet footer etc.: the message is the answer
        return None, {"reason": f"rejected: cannot read the header: {exc}"}
    if not cols and path.suffix.lower() != ".parquet":
        return None, {"reason": "rejected: empty file (only blank lines)"}
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
    lut = _VTRAIN_LUT.match(path.name)
    if lut and "size(B)" in cols:
        info = {"gpus": int(lut["n"]), "gpu_family": path.parent.name}
        return "vtrain_allreduce_lut", info
    if {"measured_metric", "measured_value"} <= cols:
        return "published_runs", info
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
    shown = ", ".join(sorted(cols)[:8]) + (", ..." if len(cols) > 8 else "")
    return None, {"reason": f"unrecognised format: columns ({shown}) match no known layout; "
                            f"known: {'; '.join(KNOWN_LAYOUTS)}"}


# --------------------------------------------------------------------------- reading

# Cells read as missing (pandas' defaults minus the spellings of NaN, which are numbers: 'nan' is "not finite").
_NA_STRINGS = frozenset({"", "#N/A", "#N/A N/A", "#NA", "<NA>", "N/A", "NA", "NULL", "None", "n/a", "null"})
_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE](?P<exp>[+-]?\d+))?$")


def read_frame(data: bytes, path: Path, text: bool = True) -> pd.DataFrame:
    """A CSV (BOM stripped, cells as strings) or Parquet file as a DataFrame with stripped column names.

    CSV rows keep their line numbers (`row_labels`); rows that cannot be trusted (wrong number of
    fields, a truncated last line) are kept in the frame but listed in `row_problems`, so that the
    parsers reject them with their line number. Raises FormatError for an empty file, a header
    without rows, bytes that are not UTF-8, or (Parquet) nested values. `text` is accepted for
    compatibility; CSV cells are always read as text and parsed by the row checks.
    """
    del text
    if path.suffix.lower() == ".parquet":
        return _read_parquet(data, path)
    return _read_csv(data, path)


class _ReadInfo:
    """Line numbers and broken rows of a frame read from CSV, kept in `DataFrame.attrs` (shared, not
    copied: pandas deep-copies and compares attrs on every operation)."""

    __slots__ = ("lines", "problems")

    def __init__(self, lines: list[int], problems: list[tuple[int, str, str]]):
        self.lines, self.problems = lines, problems

    def __deepcopy__(self, memo: dict) -> _ReadInfo:
        return self


def row_labels(df: pd.DataFrame) -> list[str]:
    """How a row is named in messages: `line N` (CSV, the header is line 1) or `row N` (Parquet)."""
    info = df.attrs.get("read")
    if info is not None:
        return [f"line {n}" for n in info.lines]
    return [f"row {i + 1}" for i in range(len(df))]


def row_lines(df: pd.DataFrame) -> list[int]:
    """CSV line number (or Parquet row number) of each row."""
    info = df.attrs.get("read")
    return list(info.lines) if info is not None else list(range(1, len(df) + 1))


def row_problems(df: pd.DataFrame) -> list[tuple[int, str, str]]:
    """(row index, reason, message) of the rows the reader found broken."""
    info = df.attrs.get("read")
    return list(info.problems) if info is not None else []


def _read_parquet(data: bytes, path: Path) -> pd.DataFrame:
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowException, OSError, ValueError) as exc:  # bad footer, bad page header, ...
        raise FormatError(f"{path.name}: cannot read Parquet: {exc}") from exc
    for fld in table.schema:
        if pa.types.is_nested(fld.type):
            col = table.column(fld.name)
            first = next((v for v in col.to_pylist() if v is not None), None)
            raise FormatError(f"{path.name}: column '{fld.name}' holds {fld.type} values (e.g. {first!r}); "
                              f"expected one value per cell")
    if table.num_rows == 0:
        raise FormatError(f"{path.name}: no rows (the Parquet file has columns but no data)")
    try:
        df = table.to_pandas()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise FormatError(f"{path.name}: cannot read Parquet: {exc}") from exc
    df.columns = [str(c).strip() for c in df.columns]
    return df.reset_index(drop=True)


def _read_csv(data: bytes, path: Path) -> pd.DataFrame:
    if not data.strip(b" \t\r\n\xef\xbb\xbf"):
        raise FormatError(f"{path.name}: empty file" + (" (0 bytes)" if not data else " (only blank lines)"))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise FormatError(f"{path.name}: not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line} "
                          f"(offset {exc.start}); save the file as UTF-8") from None
    if "\x00" in text:
        line = text[:text.index("\x00")].count("\n") + 1
        raise FormatError(f"{path.name}: NUL byte at line {line}: not a text CSV file")
    terminated = text.endswith(("\n", "\r"))
    reader = csv.reader(io.StringIO(text, newline=""), skipinitialspace=True, strict=True)
    last_content_line = text.rstrip("\r\n").count("\n") + 1
    header: list[str] | None = None
    records: list[list[str] | None] = []
    lines: list[int] = []
    quoting: dict[int, str] = {}  # record index -> what is wrong with its quotes
    prev = 0
    while True:
        try:
            rec: list[str] | None = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            start, prev = prev + 1, reader.line_num
            if "end of data" in str(exc) and start < last_content_line:
                raise FormatError(f"{path.name}: line {start}: a quoted field opened here is never closed "
                                  f"(it would swallow the rest of the file)") from None
            if header is None:
                raise FormatError(f"{path.name}: line {start}: cannot read the header: {exc}") from None
            quoting[len(records)] = ("the last line ends inside a quoted field (file cut?)"
                                     if "end of data" in str(exc) else f"malformed quoting: {exc}")
            records.append(None)
            lines.append(start)
            continue
        start, prev = prev + 1, reader.line_num
        if not rec or all(not c.strip() for c in rec):
            continue
        if header is None:
            header = [c.strip() for c in rec]
            continue
        records.append(rec)
        lines.append(start)
    if header is None:
        raise FormatError(f"{path.name}: empty file (no header)")
    dupes = sorted({c for c in header if header.count(c) > 1})
    if dupes:
        raise FormatError(f"{path.name}: duplicate column name(s) {', '.join(dupes)} in the header")
    if not records:
        raise FormatError(f"{path.name}: has a header ({', '.join(header[:6])}{', ...' if len(header) > 6 else ''}) "
                          f"but no data rows")
    ncol = len(header)
    problems: list[tuple[int, str, str]] = []
    cells: list[list[str | None]] = []
    last = len(records) - 1
    for i, rec in enumerate(records):
        vals = [c.strip() for c in rec] if rec is not None else []
        unterminated = i == last and not terminated
        if rec is None:
            problems.append((i, "truncated last line" if "file cut" in quoting[i] else "malformed quoting",
                             quoting[i]))
        elif len(vals) != ncol:
            if unterminated and len(vals) < ncol:
                problems.append((i, "truncated last line",
                                 f"unterminated last line has {len(vals)} of {ncol} fields (file cut?)"))
            else:
                problems.append((i, "wrong number of fields", f"has {len(vals)} fields, the header has {ncol}"))
        vals = (vals + [""] * ncol)[:ncol]
        cells.append([None if v in _NA_STRINGS else v for v in vals])
    df = pd.DataFrame(cells, columns=header, dtype=object)
    if not terminated and not any(p[0] == last for p in problems) and len(records) > 1:
        msg = _looks_cut(df, header[-1])
        if msg:
            problems.append((last, "truncated last line", msg))
    df.attrs["read"] = _ReadInfo(lines, problems)
    return df


def _number_shape(token: str) -> tuple[bool, bool, int] | None:
    m = _NUMBER.match(token)
    if not m:
        return None
    exp = m["exp"]
    return ("." in token.split("e")[0].split("E")[0], exp is not None, len(exp.lstrip("+-")) if exp else 0)


def _sig_digits(token: str) -> int:
    mant = re.split(r"[eE]", token)[0].lstrip("+-").replace(".", "").lstrip("0")
    return len(mant)


def _looks_cut(df: pd.DataFrame, col: str) -> str:
    """Why the unterminated last value of `col` looks cut compared with the other rows, or ''."""
    token = df[col].iloc[-1]
    others = [v for v in df[col].iloc[:-1] if v is not None]
    if not others:
        return ""
    example = others[-1]
    why = (f"unterminated last line (no newline at the end of the file): {col}={token!r} looks cut; "
           f"the other rows write {col} like {example!r}. If the line is complete, end the file with a newline")
    if token is None:
        return why
    shape = _number_shape(token)
    other_shapes = [_number_shape(v) for v in others]
    if shape is not None and all(s is not None for s in other_shapes):
        if shape not in set(other_shapes) or _sig_digits(token) < min(_sig_digits(v) for v in others):
            return why
        return ""
    return why if len(token) < min(len(v) for v in others) else ""


def require_columns(df: pd.DataFrame, required: Iterable[str], path: Path, expected: Iterable[str]) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise FormatError(f"{path.name}: missing column(s) {', '.join(missing)}; "
                          f"expected columns: {', '.join(expected)}")


def show(v: Any) -> str:
    """A cell value for a rejection message: numbers as %g, text quoted, missing as 'missing'."""
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return "missing" if v is None or v is pd.NA else "nan"
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
        return f"{float(v):.15g}"
    if isinstance(v, str) and (_NUMBER.match(v.strip())
                               or v.strip().lower().lstrip("+-") in ("nan", "inf", "infinity")):
        return v.strip()
    return repr(v)


def _num(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s, errors="coerce").astype("float64")


# --------------------------------------------------------------------------- row checks

class RowChecks:
    """Collects per-row failure masks over one frame, each with a countable reason and a describer.

    A failed row is counted once, under the reason of its first failed check; `outcome` tells a
    measured run left out for a field it does not state ('skipped') from one refused ('rejected').
    """

    def __init__(self, n: int, labels: Callable[[int], str],
                 problems: Iterable[tuple[int, str, str]] = ()):
        self.bad = np.zeros(n, dtype=bool)
        self._labels = labels
        self._checks: list[tuple[np.ndarray, Callable[[int], str], str, str]] = []
        self.add_rows([(i, "rejected", reason, msg) for i, reason, msg in problems])

    def add(self, bad: Any, describe: Callable[[int], str], reason: str = "invalid value",
            outcome: str = "rejected") -> None:
        bad = np.asarray(bad, dtype=bool)
        self.bad |= bad
        self._checks.append((bad, describe, reason, outcome))

    def add_rows(self, rows: Iterable[tuple[int, str, str, str]]) -> None:
        """Row-wise failures: (row index, outcome, reason, message)."""
        by: dict[tuple[str, str], dict[int, str]] = {}
        for i, outcome, reason, msg in rows:
            by.setdefault((outcome, reason), {})[i] = msg
        for (outcome, reason), msgs in by.items():
            mask = np.zeros(len(self.bad), dtype=bool)
            mask[list(msgs)] = True
            self.add(mask, msgs.__getitem__, reason, outcome)

    def positive_int(self, name: str, raw: pd.Series, nullable: bool = False, minimum: int = 1) -> pd.Series:
        """Checks `raw` holds integers >= minimum (NULL allowed if nullable) that fit the store's column
        (INTEGER: below 2^31; the byte and parameter counts in BIGINT: below 2^62); returns them as Int64."""
        v = _num(raw)
        hi = 2 ** 62 if name in BIGINT_FIELDS else 2 ** 31 - 1
        ok = np.isfinite(v) & (v >= minimum) & (v == np.floor(v)) & (v.abs() <= hi)
        missing = raw.isna().to_numpy()
        if nullable:
            ok = ok | missing
        vals = raw.to_numpy()
        what = ("a positive integer" if minimum == 1 else f"an integer >= {minimum}") + f" <= {hi:,}"
        self.add(~ok, lambda i: f"{name}={show(vals[i])} is not {what}", f"{name} not {what}")
        return v.where(ok & ~missing).round().astype("Int64")

    def positive_float(self, name: str, raw: pd.Series, scale: float = 1.0) -> pd.Series:
        v = _num(raw)
        _duration_checks(self, raw, v, lambda i: name)
        return v * scale

    def member(self, name: str, values: pd.Series, allowed: Iterable[Any]) -> None:
        allowed = set(allowed)
        vals = values.to_numpy()
        ok = np.array([_hashable(v) and v in allowed for v in vals], dtype=bool)
        self.add(~ok, lambda i: f"unknown {name} {show(vals[i])}", f"unknown {name}")

    def rejected(self) -> int:
        return int(sum(1 for o in self._first() if o and o[1] == "rejected"))

    def skipped(self) -> int:
        return int(sum(1 for o in self._first() if o and o[1] == "skipped"))

    def _first(self) -> list[tuple[str, str] | None]:
        """(reason, outcome) of each row's first failed check, None for good rows."""
        out: list[tuple[str, str] | None] = [None] * len(self.bad)
        for mask, _describe, reason, outcome in self._checks:
            for i in np.flatnonzero(mask):
                if out[i] is None:
                    out[i] = (reason, outcome)
        return out

    def reason_counts(self, outcome: str | None = "rejected") -> dict[str, int]:
        """Failed rows by reason (each under its first failed check), for one outcome or all."""
        counts: dict[str, int] = {}
        for o in self._first():
            if o and (outcome is None or o[1] == outcome):
                counts[o[0]] = counts.get(o[0], 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def describe(self, i: int) -> str:
        return "; ".join(describe(i) for mask, describe, _r, _o in self._checks if mask[i])

    def examples(self, limit: int) -> list[str]:
        return [f"{self._labels(i)}: {self.describe(i)}" for i in np.flatnonzero(self.bad)[:limit]]

    def failures(self) -> list[tuple[int, str, str, str]]:
        """(row index, outcome, reason, message) of every failed row."""
        first = self._first()
        return [(int(i), f[1], f[0], self.describe(int(i)))
                for i in np.flatnonzero(self.bad) if (f := first[i]) is not None]

    def summary(self, limit: int) -> dict[str, Any]:
        """The ParsedFile fields that describe the failures."""
        return {"rows_rejected": self.rejected(), "rows_skipped": self.skipped(), "examples": self.examples(limit),
                "reasons": self.reason_counts("rejected"), "skip_reasons": self.reason_counts("skipped")}


def _hashable(v: Any) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False


def _duration_checks(checks: RowChecks, raw: pd.Series, v: pd.Series, name: Callable[[int], str]) -> None:
    """Missing, unparseable, non-finite and non-positive durations, each with its own reason."""
    vals = raw.to_numpy()
    missing = np.array([x is None or x is pd.NA or (isinstance(x, str) and not x.strip()) for x in vals], dtype=bool)
    nan = v.isna().to_numpy()
    text = np.array([isinstance(x, str) for x in vals], dtype=bool)
    nan_literal = np.array([isinstance(x, str) and x.strip().lower() in ("nan", "+nan", "-nan") for x in vals],
                           dtype=bool)
    not_number = nan & text & ~missing & ~nan_literal
    non_finite = (~np.isfinite(v.to_numpy()) & ~missing & ~not_number)
    non_positive = np.isfinite(v.to_numpy()) & (v.to_numpy() <= 0)
    checks.add(missing, lambda i: f"{name(i)} is missing", "duration missing")
    checks.add(not_number, lambda i: f"{name(i)}={show(vals[i])} is not a number", "duration not a number")
    checks.add(non_finite, lambda i: f"{name(i)}={show(vals[i])} is not finite", "duration not finite")
    checks.add(non_positive, lambda i: f"{name(i)}={show(vals[i])} is not positive", "duration not positive")


def start_checks(df: pd.DataFrame, plan: FilePlan) -> RowChecks:
    """Row checks over a frame read by `read_frame`, starting with the rows its reader found broken."""
    labels = row_labels(df)
    return RowChecks(len(df), lambda i: labels[i], problems=row_problems(df))


def _finish(df: pd.DataFrame, checks: RowChecks) -> pd.DataFrame:
    return df.loc[~checks.bad].reset_index(drop=True)


def _text(raw: pd.Series) -> pd.Series:
    return raw.astype("object").where(raw.notna(), None).map(lambda v: v.strip() if isinstance(v, str) else v)


# --------------------------------------------------------------------------- provenance

def relative_source(path: Path, root: Path | None) -> str:
    """The path relative to the datasets folder (the parent of paper-samples/, vtrain/ or published-runs/)."""
    path = path.resolve()
    for parent in path.parents:
        if parent.name in ("paper-samples", "vtrain", "published-runs"):
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
    df = read_frame(data, plan.path)
    if name == "res_add" and "B_dur(us)" not in df.columns and "F_dur(us)" in df.columns:
        df["B_dur(us)"] = df["F_dur(us)"]  # one measurement for both passes
    shape_cols = PAPER_OP_COLUMNS[name]
    expected = [*shape_cols, "F_dur(us)", "B_dur(us)"]
    require_columns(df, expected, plan.path, expected)
    n = len(df)
    long = pd.concat([df.assign(**{"pass": p, "_dur": df[c], "_durcol": c}) for p, c in PAPER_PASS_COLUMNS],
                     ignore_index=True)
    passes = long["pass"].to_numpy()
    lines = row_labels(df)
    checks = RowChecks(len(long), lambda i: f"{lines[i % max(n, 1)]} ({passes[i]})",
                       problems=[(i + k * n, reason, msg) for k in range(2) for i, reason, msg in row_problems(df)])
    out = pd.DataFrame({"platform": platform, "op": op, "pass": long["pass"]})
    for c in shape_cols:
        out[PAPER_COLUMN_MAP[c]] = checks.positive_int(c, long[c])
    durcols = long["_durcol"].to_numpy()
    raw = long["_dur"]
    v = _num(raw)
    _duration_checks(checks, raw, v, lambda i: durcols[i])
    out["duration_s"] = v * 1e-6
    out["dtype"] = plan.info["dtype"]
    good = _finish(out, checks)
    return _paper_result(plan, {"op_samples": good}, platform, device, checks, limit, f"paper {name} -> {op}")


def parse_paper_optimizer(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    name = plan.info["name"]
    variant = ops.PAPER_OPTIMIZER_FILES[name]
    platform, device = _paper_platform(plan)
    df = read_frame(data, plan.path)
    checks = start_checks(df, plan)
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
    v = _num(df[dur_col])
    _duration_checks(checks, df[dur_col], v, lambda i: dur_col)
    out["duration_s"] = v * 1e-6
    out = out.assign(op="optimizer", **{"pass": "step"}, variant=variant, dtype=plan.info["dtype"])
    good = _finish(out, checks)
    if variant != "whole" and len(good):
        good["params"] = pd.array([paper_stage_params(int(h), int(l), int(t), variant)
                                   for h, l, t in zip(good["hidden"], good["layers"], good["tp"])], dtype="Int64")
    return _paper_result(plan, {"op_samples": good}, platform, device, checks, limit,
                         f"paper {name} -> optimizer/{variant}")


def parse_paper_nccl(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    name = plan.info["name"]
    if name not in ops.PAPER_COLLECTIVES:
        raise FormatError(f"{plan.path.name}: unknown paper collective '{name}'; "
                          f"known: {', '.join(sorted(ops.PAPER_COLLECTIVES))}")
    platform, device = _paper_platform(plan)
    df = read_frame(data, plan.path)
    require_columns(df, PAPER_NCCL_COLUMNS, plan.path, PAPER_NCCL_COLUMNS)
    checks = start_checks(df, plan)
    shape = checks.positive_int("shape", df["shape"])
    nodes = checks.positive_int("nodes", df["nodes"])
    gpn = checks.positive_int("GPUsPerNode", df["GPUsPerNode"])
    if plan.info.get("nodes") is not None:
        want = (plan.info["nodes"], plan.info["gpn"])
        nv, gv = nodes.to_numpy(dtype="float64", na_value=np.nan), gpn.to_numpy(dtype="float64", na_value=np.nan)
        mismatch = ~np.isnan(nv) & ~np.isnan(gv) & ((nv != want[0]) | (gv != want[1]))
        checks.add(mismatch, lambda i: f"topology {nv[i]:g}x{gv[i]:g} does not match the file name {want[0]}x{want[1]}",
                   "topology does not match the file name")
    dur = checks.positive_float("dur(us)", df["dur(us)"], 1e-6)
    out = pd.DataFrame({"platform": platform, "collective": ops.PAPER_COLLECTIVES[name],
                        "message_bytes": shape * BYTES_PER_ELEMENT[plan.info["dtype"]], "ranks": nodes * gpn,
                        "nodes": nodes, "gpus_per_node": gpn, "dtype": plan.info["dtype"], "duration_s": dur})
    good = _finish(out, checks)
    return _paper_result(plan, {"collective_samples": good}, platform, device, checks, limit,
                         f"paper {name} -> {ops.PAPER_COLLECTIVES[name]}")


def parse_paper_summary(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    df = read_frame(data, plan.path)
    kind = "nccl" if "Nodes" in df.columns else "operator"
    expected = PAPER_SUMMARY_COLUMNS[kind]
    require_columns(df, expected, plan.path, expected)
    plan.info.setdefault("device", df["GPU"].dropna().iloc[0] if df["GPU"].notna().any() else None)
    platform, device = _paper_platform(plan)
    checks = start_checks(df, plan)
    func = _text(df["Function"])
    if kind == "operator":
        names = {**ops.PAPER_OP_NAMES, **dict.fromkeys(ops.PAPER_OPTIMIZER_FILES, "optimizer")}
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
    checks.add(~(np.isfinite(err) & (err >= 0)), lambda i: f"Best_error%={show(vals[i])} is not a non-negative number",
               "Best_error% not a non-negative number")
    out = out.assign(platform=platform, kind=kind, paper_function=func, best_model=_text(df["Best_model"]),
                     best_error=err)
    good = _finish(out, checks)
    return _paper_result(plan, {"paper_errors": good}, platform, device, checks, limit, f"paper {kind} error summary")


def _paper_result(plan: FilePlan, tables: dict[str, pd.DataFrame], platform: str, device: str | None,
                  checks: RowChecks, limit: int, notes: str) -> ParsedFile:
    source = f"{PAPER_REPO}:{relative_source(plan.path, plan.root)}"
    for name, df in tables.items():
        if name != "paper_errors":
            df["source"] = source
    return ParsedFile(tables=tables, platforms=_platform_entry(platform, device), source=source,
                      licence=plan.licence or PUBLISHED_LICENCE, notes=f"{notes} on {platform}",
                      **checks.summary(limit))


# --------------------------------------------------------------------------- source definitions

@lru_cache(maxsize=4)
def _load_source_definitions(path: str, mtime: float) -> dict[str, dict[str, Any]]:
    del mtime
    where = Path(path).name
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SourceDefinitionError(f"{where}: cannot read the source definitions: {exc}") from None
    sources = raw.get("sources") if isinstance(raw, dict) else None
    if not isinstance(sources, dict) or not sources:
        raise SourceDefinitionError(f"{where}: expected a mapping 'sources' of source id -> definition")
    out = {}
    for sid, d in sources.items():
        if str(sid).startswith("_"):
            continue
        if not isinstance(d, dict):
            raise SourceDefinitionError(f"{where}: sources.{sid}: expected a mapping")
        fw = d.get("framework")
        if fw not in FRAMEWORKS:
            raise SourceDefinitionError(f"{where}: sources.{sid}.framework: unknown framework {fw!r}; "
                                        f"valid: {', '.join(FRAMEWORKS)}")
        match = d.get("match")
        if not isinstance(match, dict) or not ({"kind", "row_source_prefix"} & set(match)):
            raise SourceDefinitionError(f"{where}: sources.{sid}.match: give 'kind' and/or 'row_source_prefix'")
        rules = d.get("rules")
        if rules is not None and rules not in PUBLISHED_RULES:
            raise SourceDefinitionError(f"{where}: sources.{sid}.rules: unknown rule set {rules!r}; "
                                        f"known: {', '.join(PUBLISHED_RULES)}")
        allowed: tuple[str, ...]
        for key, allowed in (("precision", PRECISIONS), ("recompute", RECOMPUTES)):
            for k, v in (d.get(key) or {}).items():
                if v not in allowed:
                    raise SourceDefinitionError(f"{where}: sources.{sid}.{key}.{k}: {v!r} is not one of "
                                                f"{', '.join(allowed)}")
        facts = d.get("facts") or {}
        for name, fact in facts.items():
            if not isinstance(fact, dict) or "value" not in fact or not fact.get("cite"):
                raise SourceDefinitionError(f"{where}: sources.{sid}.facts.{name}: give a 'value' and its 'cite'")
        for name, allowed in (("arch", ARCHS), ("attention", ATTENTION_IMPLS), ("schedule", SCHEDULES)):
            if name in facts and facts[name]["value"] not in allowed:
                raise SourceDefinitionError(f"{where}: sources.{sid}.facts.{name}: {facts[name]['value']!r} "
                                            f"is not one of {', '.join(allowed)}")
        out[str(sid)] = {**d, "source_id": str(sid)}
    return out


def load_source_definitions(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """The source definitions (`predictor/catalog/published_sources.json`), validated: source id ->
    definition. A wrong definition (an unknown framework, ...) raises SourceDefinitionError."""
    p = Path(path) if path is not None else PUBLISHED_SOURCES_FILE
    try:
        mtime = p.stat().st_mtime
    except OSError as exc:
        raise SourceDefinitionError(f"{p}: cannot read the source definitions: {exc}") from None
    return _load_source_definitions(str(p), mtime)


def match_source(defs: dict[str, dict[str, Any]], *, kind: str | None = None,
                 row_source: str | None = None) -> dict[str, Any] | None:
    """The definition whose `match` fits a file kind or a row's source text."""
    for d in defs.values():
        m = d["match"]
        if kind is not None and m.get("kind") == kind:
            return d
        prefixes = m.get("row_source_prefix")
        prefixes = [prefixes] if isinstance(prefixes, str) else list(prefixes or [])
        if row_source and any(str(row_source).startswith(p) for p in prefixes):
            return d
    return None


def legacy_source_rules() -> list[tuple[str, str, str]]:
    """(source prefix, source_id, framework) used to fill stores ingested before those columns existed."""
    out = []
    for d in load_source_definitions().values():
        m = d["match"]
        prefixes = m.get("row_source_prefix") or m.get("legacy_source_prefix") or []
        for p in [prefixes] if isinstance(prefixes, str) else prefixes:
            out.append((p, d["source_id"], d["framework"]))
    return out


# --------------------------------------------------------------------------- vTrain and own formats

def parse_vtrain(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    """vTrain ground truth: Megatron-DeepSpeed GPT, full recompute, 1F1B, fp16, ZeRO-0."""
    df = read_frame(data, plan.path)
    require_columns(df, VTRAIN_COLUMNS, plan.path, VTRAIN_COLUMNS)
    defn = match_source(load_source_definitions(), kind="vtrain")
    platform = plan.platform or VTRAIN_PLATFORM
    checks = start_checks(df, plan)
    v = {new: checks.positive_int(old, df[old]) for old, new in VTRAIN_COLUMNS.items() if new != "step_time_ms"}
    step = checks.positive_float("iteration time (ms)", df["iteration time (ms)"], 1e-3)
    out = pd.DataFrame({"run_id": [f"{plan.path.stem}:{n}" for n in row_lines(df)], "platform": platform,
                        "arch": "gpt", "layers": v["layers"], "hidden": v["hidden"], "heads": v["heads"],
                        "kv_heads": v["heads"], "ffn_hidden": 4 * v["hidden"], "vocab": PAPER_VOCAB,
                        "seq_len": v["seq_len"], "num_gpus": v["num_gpus"], "tp": v["tp"], "pp": v["pp"],
                        "dp": v["dp"], "micro_batch": v["micro_batch"], "global_batch": v["global_batch"],
                        "vpp": 1, "schedule": "1f1b", "recompute": "full", "sequence_parallel": False,
                        "zero_stage": 0, "precision": "fp16", "step_time_s": step,
                        # Megatron-DeepSpeed without --use-flash-attn: baddbmm + fused masked softmax + bmm
                        "attention": "unfused",
                        "framework": defn["framework"] if defn else "megatron-deepspeed",
                        "source_id": defn["source_id"] if defn else "vtrain", "notes": None})
    _check_layout(checks, out)
    good = _finish(out, checks)
    source = f"{VTRAIN_REPO}:{relative_source(plan.path, plan.root)}"
    good["source"] = source
    return ParsedFile(tables={"measured_runs": good}, platforms=_platform_entry(platform), source=source,
                      licence=plan.licence or PUBLISHED_LICENCE, notes=f"vTrain measured runs on {platform}",
                      run_rejections=_run_rejections(df, checks, out["source_id"]), **checks.summary(limit))


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
    rows = [(i + 1, ln.split(",")) for i, ln in enumerate(text) if i > 0 and ln.strip()]
    if not rows or len(rows[0][1]) < 5:
        raise FormatError(f"{plan.path}: expected columns "
                          "size(B),count,type,time(ns),busbw(GB/s)[,time(ns),busbw(GB/s)]")
    recs, lines = [], []
    for line, r in rows:
        for j in (3, 5):
            if j < len(r):
                recs.append({"size": r[0], "time_ns": r[j]})
                lines.append(line)
    df = pd.DataFrame(recs)
    df.attrs["read"] = _ReadInfo(lines, [])
    checks = start_checks(df, plan)
    size = checks.positive_int("size(B)", df["size"])
    dur = checks.positive_float("time(ns)", df["time_ns"], 1e-9)
    out = pd.DataFrame({"platform": platform, "collective": "allreduce", "message_bytes": size, "ranks": n,
                        "nodes": 1, "gpus_per_node": n, "dtype": "fp32", "duration_s": dur})
    good = _finish(out, checks)
    source = f"{VTRAIN_REPO}:{relative_source(plan.path, plan.root)}"
    good["source"] = source
    return ParsedFile(tables={"collective_samples": good}, platforms=_platform_entry(platform), source=source,
                      licence=plan.licence or PUBLISHED_LICENCE,
                      notes=f"vTrain nccl-tests all-reduce on {n} GPUs of one node ({platform})",
                      **checks.summary(limit))


def _check_layout(checks: RowChecks, out: pd.DataFrame) -> None:
    f = {c: out[c].to_numpy(dtype="float64", na_value=np.nan) for c in ("tp", "pp", "dp", "num_gpus",
                                                                          "global_batch", "micro_batch")}
    prod = f["tp"] * f["pp"] * f["dp"]
    checks.add(prod != f["num_gpus"], lambda i: f"num_gpus: tp*pp*dp = {prod[i]:g} != num_gpus {f['num_gpus'][i]:g}",
               "contradictory layout: num_gpus")
    rem = np.fmod(f["global_batch"], f["micro_batch"] * f["dp"])
    checks.add(rem != 0, lambda i: f"global_batch: {f['global_batch'][i]:g} is not a multiple of micro_batch*dp",
               "contradictory layout: global_batch")


def _run_rejections(df: pd.DataFrame, checks: RowChecks, source_ids: Any) -> list[dict[str, Any]]:
    """The measured-run rows left out, for the store's run_rejections table."""
    lines = row_lines(df)
    sids = list(source_ids) if source_ids is not None else [None] * len(df)
    return [{"line": int(lines[i]), "source_id": sids[i] if i < len(sids) else None, "outcome": outcome,
             "reason": reason, "detail": detail} for i, outcome, reason, detail in checks.failures()]


def _platform_column(df: pd.DataFrame, plan: FilePlan, checks: RowChecks) -> pd.Series:
    if plan.platform:
        return pd.Series([plan.platform] * len(df), dtype="object")
    p = _text(df["platform"])
    checks.add(p.isna() | (p == ""), lambda i: "platform is empty", "platform empty")
    return p


def _own_common(df: pd.DataFrame, plan: FilePlan, checks: RowChecks, out: pd.DataFrame) -> None:
    """dtype, duration_s, source and measured_at of the project's own sample schemas."""
    out["dtype"] = _text(df["dtype"])
    checks.add(out["dtype"].isna(), lambda i: "dtype is empty", "dtype empty")
    out["duration_s"] = checks.positive_float("duration_s", df["duration_s"])
    default_source = plan.source or str(plan.path.resolve())
    out["source"] = _text(df["source"]).fillna(default_source) if "source" in df.columns else default_source
    if "measured_at" in df.columns:
        raw = df["measured_at"]
        ts = pd.to_datetime(raw, errors="coerce", utc=True, format="mixed")
        vals = raw.to_numpy()
        checks.add(ts.isna() & raw.notna(), lambda i: f"measured_at={show(vals[i])} is not a timestamp",
                   "measured_at not a timestamp")
        out["measured_at"] = ts.dt.tz_convert(None)


def parse_op_samples(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    df = read_frame(data, plan.path)
    required = ["op", "pass", "dtype", "duration_s"] + ([] if plan.platform else ["platform"])
    require_columns(df, required, plan.path, list(OP_SAMPLE_COLUMNS))
    checks = start_checks(df, plan)
    out = pd.DataFrame({"platform": _platform_column(df, plan, checks), "op": _text(df["op"]),
                        "pass": _text(df["pass"])})
    pairs = list(zip(out["op"], out["pass"]))
    ops_ok = np.array([_hashable(o) and o in ops.OPS for o, _ in pairs], dtype=bool)
    pass_ok = np.array([_hashable(o) and o in ops.OPS and p in ops.OPS[o].passes for o, p in pairs], dtype=bool)
    checks.add(~ops_ok, lambda i: f"unknown op {show(pairs[i][0])}", "unknown op")
    checks.add(ops_ok & ~pass_ok, lambda i: f"unknown pass {show(pairs[i][1])} for op {show(pairs[i][0])}",
               "unknown pass for op")
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
    checks = start_checks(df, plan)
    out = pd.DataFrame({"platform": _platform_column(df, plan, checks), "collective": _text(df["collective"])})
    checks.member("collective", out["collective"], ops.COLLECTIVES)
    out["message_bytes"] = checks.positive_int("message_bytes", df["message_bytes"])
    out["ranks"] = checks.positive_int("ranks", df["ranks"])
    for c in ("nodes", "gpus_per_node"):
        if c in df.columns:
            out[c] = checks.positive_int(c, df[c], nullable=True)
    _own_common(df, plan, checks, out)
    return _own_result(plan, "collective_samples", out, checks, limit, df.columns, COLLECTIVE_COLUMNS)


def parse_measured_runs(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    """Measured runs in the predict-batch columns plus step_time_s. Empty cells take the same
    documented defaults as predict-batch (one rule set: predictor.layout_io); a row whose model or
    layout is infeasible is rejected with the field and the fix. `source` (default: the file's stem),
    `framework` (one of FRAMEWORKS), `source_id` and `notes` are optional columns; without them the
    source definitions (published_sources.json, matched on the row's source) fill framework and
    source_id, else source_id is `local:<file stem>`."""
    from .layout_io import layout_from_fields, model_from_fields
    df = read_frame(data, plan.path)
    required = ["case_id", "arch", "layers", "hidden", "heads", "step_time_s"] + ([] if plan.platform else ["platform"])
    require_columns(df, required, plan.path, [*MEASURED_RUN_INPUT_COLUMNS,
                                              *(f"{c} (optional)" for c in MEASURED_RUN_OPTIONAL_COLUMNS)])
    defs = load_source_definitions()
    checks = start_checks(df, plan)
    step = checks.positive_float("step_time_s", df["step_time_s"])
    # the source identifies a run (it is part of its row key): without a source column, the manifest's
    # or the file's stem (not its path, so that a copy or re-export elsewhere is the same run)
    default_source = plan.source or plan.path.stem
    sources = _text(df["source"]).fillna(default_source) if "source" in df.columns else \
        pd.Series([default_source] * len(df), dtype="object")
    records: list[dict[str, Any]] = []
    problems: list[tuple[int, str, str, str]] = []
    for i, row in enumerate(df.to_dict(orient="records")):
        platform = plan.platform or (str(row.get("platform") or "").strip() or None)
        try:
            if platform is None:
                raise InfeasibleConfig("platform", "is empty.", "name the platform the run was measured on.")
            m = model_from_fields(row)
            L = layout_from_fields(row)
            L.validate(m)
            fw = (_str_or_none(row.get("framework")) or "").lower() or None
            if fw is not None and fw not in FRAMEWORKS:
                raise InfeasibleConfig("framework", f"unknown framework {fw!r}.",
                                       f"use one of {', '.join(FRAMEWORKS)}.")
        except InfeasibleConfig as e:
            problems.append((i, "rejected", f"contradictory or invalid: {e.field}", str(e)))
            records.append({})
            continue
        defn = match_source(defs, row_source=sources.iloc[i])
        case = row.get("case_id")
        sid = _str_or_none(row.get("source_id")) or (defn["source_id"] if defn else f"local:{plan.path.stem}")
        records.append({"run_id": None if case is None or str(case).strip() == "" else str(case).strip(),
                        "platform": platform, "arch": m.arch, "layers": m.num_layers, "hidden": m.hidden_size,
                        "heads": m.num_heads, "kv_heads": m.kv_heads, "ffn_hidden": m.ffn, "vocab": m.vocab_size,
                        "seq_len": L.seq_len, "num_gpus": L.num_gpus, "tp": L.tp, "pp": L.pp, "dp": L.dp,
                        "micro_batch": L.micro_batch, "global_batch": L.global_batch, "vpp": L.vpp,
                        "schedule": L.schedule, "recompute": L.recompute, "sequence_parallel": L.sequence_parallel,
                        "zero_stage": L.zero_stage, "precision": L.precision, "attention": m.attention_impl,
                        "framework": fw or (defn["framework"] if defn else None), "source_id": sid,
                        "notes": _str_or_none(row.get("notes"))})
    checks.add_rows(problems)
    out = pd.DataFrame(records, columns=[c for c in MEASURED_RUN_COLUMNS if c not in ("step_time_s", "source")])
    failed = np.array([not r for r in records], dtype=bool)
    checks.add(out["run_id"].isna().to_numpy() & ~failed, lambda i: "case_id is empty", "case_id empty")
    for c in MEASURED_RUN_INT_COLUMNS:
        out[c] = out[c].astype("Int64")
    out["sequence_parallel"] = out["sequence_parallel"].astype("boolean")
    out["step_time_s"] = step
    out["source"] = sources
    parsed = _own_result(plan, "measured_runs", out, checks, limit, df.columns,
                         [*MEASURED_RUN_INPUT_COLUMNS, *MEASURED_RUN_OPTIONAL_COLUMNS])
    parsed.run_rejections = _run_rejections(df, checks, out["source_id"])
    return parsed


def _str_or_none(v: Any) -> str | None:
    """A text cell stripped, None when empty or missing (CSV None, Parquet NaN)."""
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    s = str(v).strip()
    return s or None


def _own_result(plan: FilePlan, table: str, out: pd.DataFrame, checks: RowChecks, limit: int,
                have: Iterable[str], known: Iterable[str]) -> ParsedFile:
    good = _finish(out, checks)
    ignored = sorted(set(have) - set(known) - {"batch_id"})
    notes = f"{table}" + (f"; ignored columns: {', '.join(ignored)}" if ignored else "")
    manifest = plan.info.get("manifest")
    platforms: dict[str, tuple[str | None, str | None]] = {}
    for p in sorted(good["platform"].dropna().unique()):
        platforms.update(_platform_entry(str(p), manifest=manifest))
    return ParsedFile(tables={table: good}, platforms=platforms, source=plan.source or str(plan.path.resolve()),
                      licence=plan.licence, notes=notes, **checks.summary(limit))


# --------------------------------------------------------------------------- published multi-node runs

class _Skip(Exception):
    """A published row that lacks a field the predictor needs (counted, never guessed)."""

    def __init__(self, fields: list[str], reason: str | None = None):
        self.reason = reason or f"{', '.join(fields)} not stated"
        super().__init__(self.reason)


class _Reject(Exception):
    """A published row that contradicts itself or its source definition."""

    def __init__(self, reason: str, detail: str):
        self.reason, self.detail = reason, detail
        super().__init__(detail)


def _cell_num(row: dict[str, Any], name: str) -> float | None:
    v = row.get(name)
    if v is None:
        return None
    try:
        f = float(str(v).replace(",", "")) if not isinstance(v, (int, float)) else float(v)
    except ValueError:
        raise _Reject(f"{name} not a number", f"{name}={v!r} is not a number") from None
    return f if math.isfinite(f) else None


def _cell_int(row: dict[str, Any], name: str) -> int | None:
    f = _cell_num(row, name)
    if f is None:
        return None
    if f != int(f) or f <= 0 or f > 2 ** 31 - 1:  # the store's INTEGER columns
        raise _Reject(f"{name} not a positive integer", f"{name}={row.get(name)!r} is not a positive integer "
                                                        f"<= {2 ** 31 - 1:,}")
    return int(f)


def _note(notes: str, key: str) -> str | None:
    """The value of `key=value` in a row's notes ('; '-separated)."""
    m = re.search(rf"(?:^|;\s*){re.escape(key)}=([^;]*)", notes or "")
    return m.group(1).strip() if m else None


def _fact(defn: dict[str, Any], name: str) -> Any:
    return defn["facts"][name]["value"]


def _section(source: str) -> str | None:
    m = re.search(r"section '([^']+)'", source or "") or re.search(r"(#+ [^#]+)$", source or "")
    return m.group(1).strip() if m else None


def _published_platform(defn: dict[str, Any], gpu: str | None, checked: dict[str, Any]) -> Any:
    from .platforms import get_platform
    pid = (defn.get("platform_by_gpu") or {}).get(gpu or "")
    if pid is None:
        raise _Reject("gpu without a platform", f"gpu {gpu!r} is not mapped to a platform in "
                                                 f"published_sources.json sources.{defn['source_id']}.platform_by_gpu "
                                                 f"(known: {', '.join(defn.get('platform_by_gpu') or {}) or 'none'})")
    if pid not in checked:
        checked[pid] = get_platform(pid)  # a bad cluster entry raises InfeasibleConfig naming the field
    return checked[pid]


def _layout_checks(platform: Any, rec: dict[str, Any], gpn_row: int | None) -> None:
    """A published run must fit the platform it names and be a valid predictor layout."""
    if gpn_row is not None and gpn_row != platform.gpus_per_node:
        raise _Reject("contradictory layout: gpus_per_node",
                      f"gpus_per_node={gpn_row} but platform {platform.platform_id} has {platform.gpus_per_node}")
    if rec["num_gpus"] > platform.gpus_per_node and platform.inter_node.bandwidth_gbps <= 0:
        raise InfeasibleConfig(f"clusters.json:{platform.platform_id}.inter_node.bandwidth_gbps",
                               f"is missing or not positive, but measured runs on {platform.platform_id} span "
                               f"{-(-rec['num_gpus'] // platform.gpus_per_node)} nodes.",
                               "give the per-GPU, one-direction network GB/s of the cluster (400 Gb/s = 50).")
    m = ModelSpec(name="published", arch=rec["arch"], num_layers=rec["layers"], hidden_size=rec["hidden"],
                  num_heads=rec["heads"], num_kv_heads=rec["kv_heads"], ffn_hidden_size=rec["ffn_hidden"],
                  vocab_size=rec["vocab"], attention_impl=rec["attention"])
    from .specs import Layout
    L = Layout(num_gpus=rec["num_gpus"], tp=rec["tp"], pp=rec["pp"], dp=rec["dp"], micro_batch=rec["micro_batch"],
               global_batch=rec["global_batch"], seq_len=rec["seq_len"], vpp=rec["vpp"], schedule=rec["schedule"],
               recompute=rec["recompute"], sequence_parallel=rec["sequence_parallel"], zero_stage=rec["zero_stage"],
               precision=rec["precision"])
    try:
        L.validate(m)
    except InfeasibleConfig as e:
        raise _Reject(f"contradictory layout: {e.field}", str(e)) from None


def _common_fields(row: dict[str, Any], required: dict[str, Any]) -> dict[str, Any]:
    missing = [name for name, v in required.items() if v is None]
    if missing:
        raise _Skip(missing)
    return required


def _step_time(defn: dict[str, Any], row: dict[str, Any], gb: int, seq: int) -> tuple[float, str]:
    metric = str(row.get("measured_metric") or "").strip()
    spec = (defn.get("metrics") or {}).get(metric)
    if spec is None:
        raise _Reject("unknown measured_metric", f"measured_metric={metric!r}; this source defines "
                                                  f"{', '.join(defn.get('metrics') or {}) or 'none'}")
    unit = str(row.get("unit") or "").strip()
    if spec.get("unit") and unit != spec["unit"]:
        raise _Reject("unexpected unit", f"unit={unit!r} for {metric}; expected {spec['unit']!r}")
    value = _cell_num(row, "measured_value")
    if value is None:
        raise _Skip(["measured_value"])
    if value <= 0:
        raise _Reject("measured_value not positive", f"measured_value={value:g} is not positive")
    if metric == "tokens_per_sec":
        return gb * seq / value, f"step time = global_batch*seq_len/tokens_per_sec = {gb}*{seq}/{value:g}"
    if metric == "iteration_time":
        return value, "step time = iteration_time as reported"
    raise _Reject("unknown measured_metric", f"no step-time rule for measured_metric={metric!r}")


def _rules_llm_foundry(row: dict[str, Any], defn: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """MosaicML llm-foundry benchmark rows: PyTorch FSDP FULL_SHARD, MPT (GPT-style) models."""
    notes = str(row.get("notes") or "")
    f = _common_fields(row, {
        "layers": _cell_int(row, "layers"), "hidden": _cell_int(row, "hidden"), "heads": _cell_int(row, "heads"),
        "ffn_hidden": _cell_int(row, "ffn_hidden"), "seq_len": _cell_int(row, "seq_len"),
        "vocab": _cell_int(row, "vocab"), "num_gpus": _cell_int(row, "num_gpus"),
        "micro_batch": _cell_int(row, "micro_batch"), "global_batch": _cell_int(row, "global_batch"),
        "precision": row.get("precision"), "recompute": row.get("recompute"), "gpu": row.get("gpu")})
    out = []
    precision = (defn.get("precision") or {}).get(str(f["precision"]).strip())
    if precision is None:
        raise _Reject("unknown precision", f"precision={f['precision']!r}; this source maps "
                                            f"{', '.join(defn.get('precision') or {})}")
    recompute = (defn.get("recompute") or {}).get(str(f["recompute"]).strip())
    if recompute is None:
        raise _Reject("unknown recompute", f"recompute={f['recompute']!r}; this source maps "
                                            f"{', '.join(defn.get('recompute') or {})}")
    n = f["num_gpus"]
    tp, pp = _cell_int(row, "tp") or 1, _cell_int(row, "pp") or 1
    dp_row = _cell_int(row, "dp")
    if (tp, pp) != (1, 1):
        raise _Reject("contradictory layout: tp/pp", f"tp={tp}, pp={pp}, but FSDP FULL_SHARD runs are pure data "
                                                      f"parallel (tp = pp = 1)")
    dp = n  # FSDP: every rank is a data-parallel replica holding a shard
    if dp_row is not None and dp_row != dp:
        raise _Reject("contradictory layout: dp", f"dp={dp_row} but FSDP FULL_SHARD over {n} GPUs has dp = num_gpus")
    sharding = _note(notes, "FSDP sharding")
    if sharding is not None and sharding != "FULL_SHARD":
        raise _Reject("unexpected FSDP sharding", f"notes say FSDP sharding={sharding}; this source definition "
                                                  f"covers FULL_SHARD (zero_stage 3) only")
    gb, mb = f["global_batch"], f["micro_batch"]
    ga = _note(notes, "GradAccum")
    if ga is not None:
        if not ga.isdigit() or int(ga) * mb * dp != gb:
            raise _Reject("contradictory: GradAccum",
                          f"GradAccum={ga} but global_batch/(micro_batch*dp) = {gb}/({mb}*{dp}) = {gb / (mb * dp):g}")
        out.append(f"GradAccum={ga} = global_batch/(micro_batch*dp) checked")
    mfu, hfu = _note(notes, "MFU"), _note(notes, "HFU")
    chk = defn.get("checks", {}).get("hfu_over_mfu")
    if chk and mfu and hfu:
        ratio = float(hfu) / float(mfu)
        want = chk[recompute]
        if abs(ratio / want - 1) > chk["tolerance"]:
            raise _Reject("contradictory: recompute vs HFU/MFU",
                          f"recompute={recompute} expects HFU/MFU = {want:.4g} but HFU/MFU = {hfu}/{mfu} = {ratio:.4g}")
        out.append(f"HFU/MFU = {ratio:.4f} agrees with recompute={recompute}")
    step, how = _step_time(defn, row, gb, f["seq_len"])
    derived = _note(notes, "derived_step_time_s")
    tol = defn.get("checks", {}).get("derived_step_time", {}).get("tolerance")
    if derived is not None and tol is not None and abs(step / float(derived) - 1) > tol:
        raise _Reject("contradictory: step time", f"{how} = {step:.6g} s but the notes derive {derived} s")
    out.append(how)
    rec = {"arch": _fact(defn, "arch"), "layers": f["layers"], "hidden": f["hidden"], "heads": f["heads"],
           "kv_heads": f["heads"], "ffn_hidden": f["ffn_hidden"], "vocab": f["vocab"], "seq_len": f["seq_len"],
           "num_gpus": n, "tp": 1, "pp": 1, "dp": dp, "micro_batch": mb, "global_batch": gb,
           "vpp": _fact(defn, "vpp"), "schedule": _fact(defn, "schedule"), "recompute": recompute,
           "sequence_parallel": _fact(defn, "sequence_parallel"), "zero_stage": _fact(defn, "zero_stage"),
           "precision": precision, "attention": _fact(defn, "attention"), "step_time_s": step}
    return rec, out


def megatron_tflops(gb: int, seq: int, layers: int, hidden: int, vocab: int, time_s: float, gpus: int,
                    ckpt_factor: int, corrected: bool = True) -> float:
    """Megatron-DeepSpeed's reported TFLOPs per GPU. `corrected`: the formula of
    bigscience-workshop/Megatron-DeepSpeed PR 251 (24*ckpt*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h)));
    False: the estimate used before it (without the attention / logit term), which reproduces the
    TFLOPs the BLOOM chronicles report before its section 'TFLOPs calculation improved'."""
    flops: float = 24 * ckpt_factor * gb * seq * layers * hidden ** 2
    if corrected:
        flops *= 1 + seq / (6 * hidden) + vocab / (16 * layers * hidden)
    return flops / (time_s * gpus * 1e12)


def _rules_megatron_deepspeed(row: dict[str, Any], defn: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """BigScience BLOOM-176B prequel rows: Megatron-DeepSpeed, ZeRO-1, 3D parallelism."""
    notes = str(row.get("notes") or "")
    source = str(row.get("source") or "")
    precision_raw = str(row.get("precision") or "").strip()
    precision, precision_how = None, ""
    if precision_raw:
        precision = (defn.get("precision") or {}).get(precision_raw)
        if precision is None:
            raise _Reject("unknown precision", f"precision={precision_raw!r}; this source maps "
                                                f"{', '.join(defn.get('precision') or {})}")
        precision_how = f"precision={precision} (row: {precision_raw!r})"
    else:
        stated = (defn.get("precision_by_section") or {}).get(_section(source) or "")
        if stated:
            precision = stated["value"]
            precision_how = f"precision={precision} (document: {stated['cite']})"
    vocab = _fact(defn, "vocab")
    padded = re.search(r"\(([\d,]+) padded\)", notes)
    if padded is None:
        raise _Skip(["padded vocab"])
    if int(padded.group(1).replace(",", "")) != vocab:
        raise _Reject("contradictory: vocab", f"notes say the vocab is padded to {padded.group(1)}, the source "
                                               f"definition says {vocab}")
    f = _common_fields(row, {
        "layers": _cell_int(row, "layers"), "hidden": _cell_int(row, "hidden"), "heads": _cell_int(row, "heads"),
        "seq_len": _cell_int(row, "seq_len"), "num_gpus": _cell_int(row, "num_gpus"), "tp": _cell_int(row, "tp"),
        "pp": _cell_int(row, "pp"), "dp": _cell_int(row, "dp"), "micro_batch": _cell_int(row, "micro_batch"),
        "global_batch": _cell_int(row, "global_batch"), "precision": precision})
    out = [precision_how]
    ffn = _cell_int(row, "ffn_hidden")
    if ffn is not None and ffn != 4 * f["hidden"]:
        raise _Reject("contradictory: ffn_hidden", f"ffn_hidden={ffn} but this source's MLP is 4*hidden")
    zero = _fact(defn, "zero_stage")
    zs = _note(notes, "ZeRO_stage")
    if zs is not None:
        if zs not in ("0", "1"):
            raise _Reject("unexpected ZeRO stage", f"notes say ZeRO_stage={zs}")
        zero = int(zs)
        out.append(f"zero_stage={zero} (notes)")
    gb, seq, n = f["global_batch"], f["seq_len"], f["num_gpus"]
    step, how = _step_time(defn, row, gb, seq)
    out.append(how)
    # recompute: the notes say the reported TFLOPs count activation recompute (factor 4); verify it
    tf = _note(notes, "TFLOPs")
    chk = defn["checks"]["tflops"]
    if tf is None:
        raise _Skip([], "recompute not verifiable (TFLOPs not stated)")
    reported = float(tf)
    fits = {}
    for factor, label in ((chk["ckpt_factor_recompute"], "full"), (chk["ckpt_factor_none"], "none")):
        for corrected in (True, False):
            t = megatron_tflops(gb, seq, f["layers"], f["hidden"], vocab, step, n, factor, corrected)
            fits[(label, corrected)] = t
    ok = [(k, t) for k, t in fits.items() if abs(reported / t - 1) <= chk["tolerance"]]
    if not any(k[0] == "full" for k, _ in ok):
        best = min(fits.items(), key=lambda kv: abs(reported / kv[1] - 1))
        if best[0][0] == "none" and abs(reported / best[1] - 1) <= chk["tolerance"]:
            raise _Reject("contradictory: recompute vs TFLOPs",
                          f"reported TFLOPs={reported:g} matches no recompute (factor 3: {best[1]:.2f}), "
                          f"but the notes say the TFLOPs count activation recompute")
        full_pr, full_old = fits[("full", True)], fits[("full", False)]
        raise _Reject("recompute not verified by the reported TFLOPs",
                      f"reported TFLOPs={reported:g}; recomputed with factor 4: {full_pr:.2f} (PR-251 formula), "
                      f"{full_old:.2f} (earlier estimate); factor 3: {fits[('none', True)]:.2f}; "
                      f"tolerance {chk['tolerance']:.0%}")
    (label, corrected), t = next((k, t) for k, t in ok if k[0] == "full")
    out.append(f"recompute=full: reported TFLOPs {reported:g} = {t:.2f} recomputed with ckpt factor "
               f"{chk['ckpt_factor_recompute']} ({'PR-251 formula' if corrected else 'pre-PR-251 estimate'}, "
               f"vocab {vocab})")
    rec = {"arch": _fact(defn, "arch"), "layers": f["layers"], "hidden": f["hidden"], "heads": f["heads"],
           "kv_heads": f["heads"], "ffn_hidden": 4 * f["hidden"], "vocab": vocab, "seq_len": seq,
           "num_gpus": n, "tp": f["tp"], "pp": f["pp"], "dp": f["dp"], "micro_batch": f["micro_batch"],
           "global_batch": gb, "vpp": _fact(defn, "vpp"), "schedule": _fact(defn, "schedule"),
           "recompute": "full", "sequence_parallel": _fact(defn, "sequence_parallel"), "zero_stage": zero,
           "precision": precision, "attention": _fact(defn, "attention"), "step_time_s": step}
    return rec, out


PUBLISHED_RULES: dict[str, Callable[[dict[str, Any], dict[str, Any]], tuple[dict[str, Any], list[str]]]] = {
    "llm-foundry": _rules_llm_foundry, "megatron-deepspeed": _rules_megatron_deepspeed}


def parse_published_runs(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    """Published end-to-end runs (../shared/datasets/published-runs) as measured runs. Each row's
    `source` picks its definition in published_sources.json (framework, platform by gpu, facts
    with citations, the checks that apply). Rows lacking a needed field are skipped with the reason;
    rows that contradict themselves are rejected; a wrong definition or cluster entry stops the
    whole ingest (SourceDefinitionError / InfeasibleConfig)."""
    df = read_frame(data, plan.path)
    require_columns(df, ("source", "gpu", "num_gpus", "measured_metric", "measured_value", "unit", "notes"),
                    plan.path, PUBLISHED_COLUMNS)
    defs = load_source_definitions()
    checks = start_checks(df, plan)
    broken = {i for i, _r, _m in row_problems(df)}
    lines = row_lines(df)
    platforms_checked: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    problems: list[tuple[int, str, str, str]] = []
    sids: list[str | None] = []
    for i, row in enumerate(df.to_dict(orient="records")):
        src = str(row.get("source") or "")
        defn = match_source(defs, row_source=src)
        sids.append(defn["source_id"] if defn else None)
        records.append({})
        if i in broken:
            continue
        if defn is None or not defn.get("rules"):
            problems.append((i, "rejected", "no source definition",
                             f"source {src[:60]!r} matches no entry of published_sources.json"))
            continue
        try:
            rec, how = PUBLISHED_RULES[defn["rules"]](row, defn)
            platform = _published_platform(defn, str(row.get("gpu") or "").strip() or None, platforms_checked)
            _layout_checks(platform, rec, _cell_int(row, "gpus_per_node"))
        except _Skip as s:
            problems.append((i, "skipped", s.reason, s.reason))
            continue
        except _Reject as r:
            problems.append((i, "rejected", r.reason, r.detail))
            continue
        row_notes = str(row.get("notes") or "").strip()
        records[i] = {**rec, "run_id": f"{plan.path.stem}:{lines[i]}", "platform": platform.platform_id,
                      "source": src, "framework": defn["framework"], "source_id": defn["source_id"],
                      "notes": "; ".join([*how, f"row notes: {row_notes}"] if row_notes else how)}
    checks.add_rows(problems)
    out = pd.DataFrame(records, columns=MEASURED_RUN_COLUMNS)
    for c in MEASURED_RUN_INT_COLUMNS + ("zero_stage",):
        out[c] = out[c].astype("Int64")
    out["sequence_parallel"] = out["sequence_parallel"].astype("boolean")
    out["step_time_s"] = out["step_time_s"].astype("float64")
    good = _finish(out, checks)
    platforms: dict[str, tuple[str | None, str | None]] = {}
    for pid, p in platforms_checked.items():
        if pid in set(good["platform"]):
            platforms[pid] = (p.device.name, p.description)
    return ParsedFile(tables={"measured_runs": good}, platforms=platforms,
                      source=f"published-runs:{relative_source(plan.path, plan.root)}",
                      licence=plan.licence or "Apache-2.0 (facts from the repositories each row names)",
                      notes="published end-to-end runs (published_sources.json)",
                      run_rejections=_run_rejections(df, checks, sids), **checks.summary(limit))


# --------------------------------------------------------------------------- entry points

PARSERS: dict[str, Callable[[bytes, FilePlan, int], ParsedFile]] = {
    "paper_operator": parse_paper_operator, "paper_optimizer": parse_paper_optimizer,
    "paper_nccl": parse_paper_nccl, "paper_summary": parse_paper_summary, "vtrain": parse_vtrain,
    "vtrain_allreduce_lut": parse_vtrain_allreduce_lut,
    "op_samples": parse_op_samples, "collective_samples": parse_collective_samples,
    "measured_runs": parse_measured_runs, "published_runs": parse_published_runs,
}


def parse_file(data: bytes, plan: FilePlan, limit: int = 5) -> ParsedFile:
    """Parse one planned file; raises FormatError when the whole file must be rejected, and
    SourceDefinitionError / InfeasibleConfig when the project's own definitions are wrong."""
    assert plan.kind is not None
    try:
        return PARSERS[plan.kind](data, plan, limit)
    except (FormatError, SourceDefinitionError, InfeasibleConfig):
        raise
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise FormatError(f"{plan.path.name}: cannot parse as {plan.kind}: {exc}") from exc
    except Exception as exc:
        import pyarrow as pa
        if isinstance(exc, pa.ArrowException):
            raise FormatError(f"{plan.path.name}: cannot read Parquet: {exc}") from exc
        raise


def preview_path(path: Path, platform: str | None = None) -> pd.DataFrame:
    """A dry run of an ingest of `path` (a file or a folder): one row per file with its kind, platform(s),
    the rows it would add (`rows`, and per table in `tables`), the rows it would reject, and `status`
    (ok | skipped | rejected) with a `message` (the skip reason, the parse error, or example rejections).
    Nothing is written."""
    out = []
    for plan in plan_files(Path(path), platform=platform):
        row: dict[str, Any] = {"file": plan.path.name, "kind": plan.kind or "-", "platform": plan.platform or "",
                               "rows": 0, "rows_rejected": 0, "tables": "", "status": "ok", "message": ""}
        if plan.kind is None:
            row.update(status="rejected" if plan.skip_reason.startswith("rejected") else "skipped",
                       message=plan.skip_reason)
        else:
            try:
                parsed = parse_file(plan.path.read_bytes(), plan, 5)
            except FormatError as e:
                row.update(status="rejected", message=str(e))
            else:
                row.update(rows=int(sum(len(df) for df in parsed.tables.values())),
                           rows_rejected=int(parsed.rows_rejected),
                           platform=", ".join(parsed.platforms) or row["platform"],
                           tables=", ".join(f"{t} {len(df)}" for t, df in parsed.tables.items() if len(df)),
                           message="; ".join(parsed.examples[:3]))
                if not row["rows"]:
                    row["status"] = "rejected"
        out.append(row)
    return pd.DataFrame(out, columns=["file", "kind", "platform", "rows", "rows_rejected", "tables", "status",
                                      "message"])

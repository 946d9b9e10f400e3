"""What every format shares: the column vocabularies, the file plan and parse result, reading CSV / Parquet
strictly, row checks with their rejection reasons, provenance."""
from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from predictor.model import ops

PAPER_REPO = "DebarghaG/estimate-train-time"
VTRAIN_REPO = "VIA-Research/vTrain"
PUBLISHED_LICENCE = "MIT"
VTRAIN_PLATFORM = "dgx-a100-80gb"
PAPER_VOCAB = 50257

KINDS = ("paper_operator", "paper_optimizer", "paper_nccl", "paper_summary", "vtrain", "vtrain_allreduce_lut",
         "op_samples", "collective_samples", "measured_runs", "published_runs",
         "aiconfigurator_gemm", "aiconfigurator_attention", "aiconfigurator_comm", "liger")
# How a measured run was executed (measured_runs.framework).

# the per-source rules of a published table (formats.published.PUBLISHED_RULES), by name
PUBLISHED_RULE_NAMES = ("llm-foundry", "megatron-deepspeed")

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
                 "measured_runs (case_id, ..., step_time_s)", "published runs (measured_metric, measured_value)",
                 "aiconfigurator <gpu>/<table>/<fw>/<ver>/*_perf.parquet (gemm m,n,k / attention isl / nccl)",
                 "Liger-Kernel benchmark CSV (kernel_name, kernel_operation_mode, y_value_50)")


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

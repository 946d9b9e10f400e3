"""predict-batch's files: the input read as UTF-8 CSV in chunks (memory stays flat however many rows),
the output written to a temporary file beside it and renamed at the end (never half-written), and
every cell that a spreadsheet would run as a formula escaped.

Whole-file problems are InfeasibleConfig('input' / 'output', ...) raised before anything is
computed where they can be seen up front (a missing, empty or header-only input, a directory, an
output folder that does not exist or cannot be written, output = input, a header with unknown,
missing or repeated columns), or when met (bytes that are not UTF-8, a NUL byte, an unterminated
quote). A row whose cell count differs from the header's is not predicted: it keeps its line number
in `error` and the batch goes on (it used to shift its cells into the wrong columns).
"""
from __future__ import annotations

import csv
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import BATCH_COLUMNS, OPTIONAL_BATCH_COLUMNS

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
HEADER_FIX = f"the first line must be the header: {','.join(BATCH_COLUMNS)}"


def csv_safe(value: Any) -> Any:
    """A text cell that a spreadsheet would run as a formula (starting with = + - @, a tab or a CR)
    gets a leading single quote; numbers (also negative ones, as text or not) are left as they are."""
    if not isinstance(value, str) or not value.startswith(FORMULA_START):
        return value
    try:
        if math.isfinite(float(value)):
            return value
    except ValueError:
        pass
    return "'" + value


def _format(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return repr(v)
    return csv_safe(v) if isinstance(v, str) else v


@dataclass
class BatchInput:
    path: Path
    header: list[str]
    rows: Iterator[tuple[int, list[str]]] = field(repr=False)  # (line number, cells)


def check_output(output: str | os.PathLike[str], input_path: Path | None = None) -> Path:
    """The output path if a file can be written there: not a directory, its folder exists and is
    writable, not the input itself."""
    out = Path(output)
    if out.is_dir():
        raise InfeasibleConfig("output", f"{out} is a directory.", "give a file path, e.g. out.csv.")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.exists():
        raise InfeasibleConfig("output", f"the folder {parent} does not exist.", "create it first, or write elsewhere.")
    if not parent.is_dir():
        raise InfeasibleConfig("output", f"{parent} is not a folder.", "give a path inside a folder.")
    if input_path is not None and out.exists() and out.resolve() == input_path.resolve():
        raise InfeasibleConfig("output", f"{out} is the input file.", "write the results to another file.")
    if not os.access(parent, os.W_OK):
        raise InfeasibleConfig("output", f"cannot write in {parent} (permission denied).", "write elsewhere.")
    return out


def _decoded_lines(path: Path, handle) -> Iterator[str]:
    line = 1
    try:
        for text in handle:
            if "\x00" in text:
                raise InfeasibleConfig("input", f"{path} line {line} holds a NUL byte: it is not a text CSV file.",
                                       "export the cases as CSV (UTF-8) text.")
            yield text
            line += 1  # newline="": one physical line per item, whatever its line end
    except UnicodeDecodeError as e:
        raise InfeasibleConfig("input", f"{path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} near line {line}).",
                               "save it as CSV with UTF-8 encoding (a spreadsheet's 'CSV UTF-8').") from None


def _records(path: Path, handle: Any) -> Iterator[tuple[int, list[str]]]:
    reader = csv.reader(_decoded_lines(path, handle), strict=True)
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise InfeasibleConfig("input", f"{path} line {reader.line_num + 1}: not readable as CSV ({e}).",
                                   "check the quoting of that line, and that the file is a CSV text file.") from None
        yield reader.line_num, cells


def open_input(input_path: str | os.PathLike[str]) -> tuple[BatchInput, Any]:
    """The header (checked) and an iterator over the data rows; the open handle to close."""
    path = Path(input_path)
    if not path.exists():
        raise InfeasibleConfig("input", f"file {path} does not exist.")
    if path.is_dir():
        raise InfeasibleConfig("input", f"{path} is a directory.", "give the CSV file of cases.")
    try:
        handle = open(path, encoding="utf-8-sig", errors="strict", newline="")  # noqa: SIM115  (closed by the caller)
    except OSError as e:
        raise InfeasibleConfig("input", f"cannot read {path} ({e.strerror}).") from None
    try:
        records = _records(path, handle)
        header: list[str] | None = None
        for _line, cells in records:
            if any(c.strip() for c in cells):
                header = [c.strip() for c in cells]
                break
        if header is None:
            raise InfeasibleConfig("input", f"{path} is empty.", HEADER_FIX + ", then one row per case.")
        check_header(path, header)
        rows = _data_rows(records)
        first = next(rows, None)
        if first is None:
            raise InfeasibleConfig("input", f"{path} has a header but no rows.",
                                   "add one row per case under the header.")
    except BaseException:
        handle.close()
        raise
    return BatchInput(path, header, _chain(first, rows)), handle


def _data_rows(rows: Iterator[tuple[int, list[str]]]) -> Iterator[tuple[int, list[str]]]:
    for line, cells in rows:
        if cells and any(c.strip() for c in cells):
            yield line, cells


def _chain(first, rest):
    yield first
    yield from rest


# The columns a preset (a `model` cell) fills.
PRESET_FILLED_COLUMNS = ("arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab")


def check_header(path: Path, header: list[str]) -> None:
    dup = sorted({c for c in header if header.count(c) > 1})
    if dup:
        raise InfeasibleConfig("input", f"{path} repeats columns {dup}.", "keep one column of each name.")
    # a `model` column names presets: the columns a preset fills may be left out (a row without one gets an error
    # naming the field it lacks)
    preset_filled = PRESET_FILLED_COLUMNS if "model" in header else ()
    missing = [c for c in BATCH_COLUMNS if c not in header and c not in preset_filled]
    if missing:
        raise InfeasibleConfig("input", f"{path} lacks columns {missing}.",
                               f"the header must hold: {','.join(BATCH_COLUMNS)} (optional: "
                               f"{','.join(OPTIONAL_BATCH_COLUMNS)})")
    unknown = [c for c in header if c not in BATCH_COLUMNS and c not in OPTIONAL_BATCH_COLUMNS]
    if unknown:
        raise InfeasibleConfig("input", f"{path} has columns this version does not know: {unknown}; a row would be "
                                        "predicted without them.",
                               f"remove them, or use only {','.join(BATCH_COLUMNS)} and the optional "
                               f"{','.join(OPTIONAL_BATCH_COLUMNS)}.")


def chunks(inp: BatchInput, size: int) -> Iterator[tuple[list[dict[str, str]], dict[int, str]]]:
    """(records, errors by index) per `size` rows. A row with another cell count than the header's is
    a record holding only its case_id (when the header starts with it) and an error naming its line."""
    n = len(inp.header)
    records: list[dict[str, str]] = []
    errors: dict[int, str] = {}
    for line, cells in inp.rows:
        if len(cells) == n:
            records.append(dict(zip(inp.header, cells)))
        else:
            rec = dict.fromkeys(inp.header, "")
            if inp.header[0] == "case_id":
                rec["case_id"] = cells[0]
            errors[len(records)] = (f"row: line {line} has {len(cells)} cells where the header has {n}; the row is "
                                    "not predicted. Fix: quote cells that hold a comma, give exactly one cell per "
                                    "column.")
            records.append(rec)
        if len(records) >= size:
            yield records, errors
            records, errors = [], {}
    if records:
        yield records, errors


class AtomicCsvWriter:
    """Rows to a temporary file beside `path`, renamed onto it by `commit()`; `abort()` (or leaving
    the `with` block by an exception) removes it, so a failed or interrupted batch leaves no output."""

    def __init__(self, path: Path, columns: list[str]):
        self.path = path
        self.columns = columns
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                       dir=path.parent if str(path.parent) else ".")
        except OSError as e:
            raise InfeasibleConfig("output", f"cannot write in {path.parent} ({e.strerror}).",
                                   "write elsewhere.") from None
        self.tmp = Path(tmp)
        self.handle = os.fdopen(fd, "w", encoding="utf-8", newline="")
        # CRLF line ends (RFC 4180): the csv module then quotes every cell holding a CR or an LF, which it
        # does not do for a lone CR with "\n" line ends (the cell would split its row when read back)
        self.writer = csv.writer(self.handle, lineterminator="\r\n")
        self.writer.writerow([csv_safe(c) for c in columns])
        self.rows = 0

    def write(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            self.writer.writerow([_format(r.get(c)) for c in self.columns])
        self.rows += len(rows)

    def commit(self) -> None:
        self.handle.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        if not self.handle.closed:
            self.handle.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> AtomicCsvWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

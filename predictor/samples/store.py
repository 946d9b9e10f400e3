"""The DuckDB sample store: schema, transactional idempotent ingest, short read-only queries.

One writer at a time: write connections hold an exclusive `fcntl.flock` on `<store>.lock`.
An `ingest_path` call (one path or several) is one transaction: every file or nothing, and an
exception anywhere (Ctrl-C included) leaves every table as it was.

Two levels of idempotency:
  * a file: `batch_id = sha256(file bytes, kind, platform override)`; the same bytes again are
    "already ingested" (the `batches` table keeps the provenance of every file);
  * a row: `row_key` = a hash of the measured fields of the row (for samples: platform, op or
    collective, pass, shape columns, variant, dtype, duration; for measured runs: every layout
    and model field, the step time and the source) and of its occurrence count in its file. The
    same samples re-exported in another column order, with other line endings, as Parquet instead
    of CSV or with rows shuffled add no rows: they are reported as duplicates. Rows repeated
    inside one file are kept (the n-th repeat has its own key), so genuine repeats survive.
Measured-run rows that a parser left out (skipped: a needed field not stated; rejected: contradictory)
are kept, with the reason and the line, in `run_rejections`. Parsing lives in `predictor/samples/formats/`.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from predictor import paths
from predictor.model.ops import COLLECTIVES, SHAPE_COLUMNS
from predictor.samples.formats.common import FilePlan, FormatError
from predictor.samples.formats.files import parse_file, plan_files
from predictor.samples.formats.sources import legacy_source_rules

ENV_STORE = "PREDICTOR_STORE"
INGEST_HINT = "python -m predictor ingest ../shared/datasets/paper-samples"
_SHAPE_DDL = ", ".join(f"{c} {'BIGINT' if c == 'params' else 'INTEGER'}" for c in SHAPE_COLUMNS)

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS batches(batch_id TEXT PRIMARY KEY, kind TEXT, source TEXT, file_sha256 TEXT,
        licence TEXT, rows_added INTEGER, rows_rejected INTEGER, ingested_at TIMESTAMP, notes TEXT)""",
    "CREATE TABLE IF NOT EXISTS platforms(platform TEXT PRIMARY KEY, device_name TEXT, description TEXT)",
    f"""CREATE TABLE IF NOT EXISTS op_samples(platform TEXT NOT NULL, op TEXT NOT NULL, pass TEXT NOT NULL,
        {_SHAPE_DDL}, variant TEXT, dtype TEXT, duration_s DOUBLE NOT NULL, source TEXT,
        batch_id TEXT NOT NULL, measured_at TIMESTAMP)""",
    """CREATE TABLE IF NOT EXISTS collective_samples(platform TEXT NOT NULL, collective TEXT NOT NULL,
        message_bytes BIGINT NOT NULL, ranks INTEGER NOT NULL, nodes INTEGER, gpus_per_node INTEGER, dtype TEXT,
        duration_s DOUBLE NOT NULL, source TEXT, batch_id TEXT NOT NULL, measured_at TIMESTAMP)""",
    """CREATE TABLE IF NOT EXISTS measured_runs(run_id TEXT, platform TEXT NOT NULL, arch TEXT, layers INTEGER,
        hidden INTEGER, heads INTEGER, kv_heads INTEGER, ffn_hidden INTEGER, vocab INTEGER, seq_len INTEGER,
        num_gpus INTEGER, tp INTEGER, pp INTEGER, dp INTEGER, micro_batch INTEGER, global_batch INTEGER,
        vpp INTEGER, schedule TEXT, recompute TEXT, sequence_parallel BOOLEAN, zero_stage INTEGER,
        precision TEXT, step_time_s DOUBLE NOT NULL, source TEXT, batch_id TEXT NOT NULL, attention TEXT)""",
    """CREATE TABLE IF NOT EXISTS paper_errors(platform TEXT, kind TEXT, op TEXT, paper_function TEXT, pass TEXT,
        nodes INTEGER, gpus_per_node INTEGER, best_model TEXT, best_error DOUBLE, batch_id TEXT)""",
    # measured-run rows left out at ingest: outcome 'skipped' (a needed field not stated) or 'rejected'
    """CREATE TABLE IF NOT EXISTS run_rejections(batch_id TEXT NOT NULL, source_id TEXT, line INTEGER,
        outcome TEXT, reason TEXT, detail TEXT)""",
    # stores created before these columns existed
    "ALTER TABLE measured_runs ADD COLUMN IF NOT EXISTS attention TEXT",
    "ALTER TABLE measured_runs ADD COLUMN IF NOT EXISTS framework TEXT",
    "ALTER TABLE measured_runs ADD COLUMN IF NOT EXISTS source_id TEXT",
    "ALTER TABLE measured_runs ADD COLUMN IF NOT EXISTS notes TEXT",
    "ALTER TABLE batches ADD COLUMN IF NOT EXISTS rows_duplicate INTEGER",
    "ALTER TABLE batches ADD COLUMN IF NOT EXISTS rows_skipped INTEGER",
    *(f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS row_key TEXT"
      for t in ("op_samples", "collective_samples", "measured_runs", "paper_errors")),
)
SAMPLE_TABLES = ("op_samples", "collective_samples", "measured_runs", "paper_errors")
# The fields that identify a row (its content); see the module docstring.
ROW_KEY_COLUMNS: dict[str, tuple[str, ...]] = {
    "op_samples": ("platform", "op", "pass", *SHAPE_COLUMNS, "variant", "dtype", "duration_s"),
    "collective_samples": ("platform", "collective", "message_bytes", "ranks", "nodes", "gpus_per_node", "dtype",
                           "duration_s"),
    "measured_runs": ("platform", "arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len",
                      "num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch", "vpp", "schedule", "recompute",
                      "sequence_parallel", "zero_stage", "precision", "attention", "step_time_s", "source"),
    "paper_errors": ("platform", "kind", "op", "paper_function", "pass", "nodes", "gpus_per_node", "best_model",
                     "best_error"),
}
RUN_REJECTION_COLUMNS = ("batch_id", "source_id", "line", "outcome", "reason", "detail")


class StoreError(RuntimeError):
    """The store is missing, locked by another writer, or cannot be opened."""


def default_store_path() -> Path:
    """`$PREDICTOR_STORE` if set, else `<repo>/data/samples.duckdb`."""
    env = os.environ.get(ENV_STORE)
    if env:
        return Path(env).expanduser()
    return paths.DEFAULT_STORE


def _resolve(path: str | os.PathLike | None) -> Path:
    return Path(path).expanduser() if path is not None else default_store_path()


@contextmanager
def _writer_lock(store: Path, timeout_s: float) -> Iterator[None]:
    """Exclusive flock on `<store>.lock`; waits up to `timeout_s`, then raises StoreError."""
    lock_path = store.with_name(store.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"another process is writing to the store {store} (lock {lock_path} is held); "
                        f"waited {timeout_s:g} s. Try again when that ingest has finished.") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _open(store: Path, read_only: bool, timeout_s: float) -> duckdb.DuckDBPyConnection:
    """Open DuckDB, retrying while another process holds its file lock."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return duckdb.connect(str(store), read_only=read_only)
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or time.monotonic() >= deadline:
                raise StoreError(f"cannot open the store {store}: {exc}") from exc
            time.sleep(0.1)


@contextmanager
def connect(path: str | os.PathLike | None = None, read_only: bool = False, *,
            timeout_s: float = 30.0) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection to the store, closed on exit.

    Write connections create the file (and its folder) and the schema (migrating older stores:
    new columns are added empty), and hold the writer lock for their whole life. Read-only
    connections on a missing store raise StoreError with the command that fills it. Keep read
    connections short: a writer in another process cannot open the file while one is open.
    """
    store = _resolve(path)
    if read_only:
        if not store.exists():
            raise StoreError(f"no sample store at {store}. Fill it first with `{INGEST_HINT}` "
                             f"(or set {ENV_STORE} to an existing store).")
        con = _open(store, True, timeout_s)
        try:
            yield con
        finally:
            con.close()
        return
    store.parent.mkdir(parents=True, exist_ok=True)
    with _writer_lock(store, timeout_s):
        con = _open(store, False, timeout_s)
        try:
            for ddl in SCHEMA:
                con.execute(ddl)
            yield con
        finally:
            con.close()


# --------------------------------------------------------------------------- ingest report

@dataclass
class FileOutcome:
    """What happened to one file: ingested, duplicate, already ingested, skipped or rejected.

    `rows_duplicate`: rows whose content is already in the store; `reasons` / `skip_reasons`: rows
    rejected / measured runs skipped, by reason; `sources`: for measured-run files, per source_id
    {ingested, duplicates, skipped: {reason: n}, rejected: {reason: n}} (for an already ingested
    file, what its first ingest recorded, with `previously` True).
    """

    path: str
    status: str
    kind: str | None = None
    platform: str | None = None
    batch_id: str | None = None
    rows_added: dict[str, int] = field(default_factory=dict)
    rows_rejected: int = 0
    examples: list[str] = field(default_factory=list)
    reason: str = ""
    rows_duplicate: int = 0
    rows_skipped: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    skip_reasons: dict[str, int] = field(default_factory=dict)
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    previously: bool = False


@dataclass
class IngestReport:
    """Summary of one `ingest_path` call (one transaction over one or several paths)."""

    root: str
    store: str
    files: list[FileOutcome] = field(default_factory=list)
    elapsed_s: float = 0.0
    ignored_files: int = 0  # files under the given folders that are not data files (.csv, .parquet)

    @property
    def files_seen(self) -> int:
        return len(self.files)

    @property
    def files_ingested(self) -> int:
        return sum(f.status == "ingested" for f in self.files)

    @property
    def files_skipped(self) -> list[tuple[str, str]]:
        """(path, reason) of every file that added nothing (already ingested, duplicate, skipped, rejected)."""
        return [(f.path, f.reason or f.status) for f in self.files if f.status != "ingested"]

    @property
    def rows_added(self) -> dict[str, int]:
        out = dict.fromkeys(SAMPLE_TABLES, 0)
        for f in self.files:
            for t, n in f.rows_added.items():
                out[t] = out.get(t, 0) + n
        return out

    @property
    def rows_rejected(self) -> int:
        return sum(f.rows_rejected for f in self.files)

    @property
    def rows_duplicate(self) -> int:
        return sum(f.rows_duplicate for f in self.files)

    @property
    def rows_skipped(self) -> int:
        return sum(f.rows_skipped for f in self.files)

    @property
    def rejected_by_reason(self) -> dict[str, int]:
        """Rows rejected in this call, by reason, over all files."""
        return _merge_counts(f.reasons for f in self.files)

    @property
    def skipped_by_reason(self) -> dict[str, int]:
        return _merge_counts(f.skip_reasons for f in self.files)

    @property
    def sources(self) -> dict[str, dict[str, Any]]:
        """Measured runs per source_id over all files: ingested, duplicates, skipped / rejected by reason."""
        out: dict[str, dict[str, Any]] = {}
        for f in self.files:
            for sid, s in f.sources.items():
                o = out.setdefault(sid, {"ingested": 0, "duplicates": 0, "skipped": {}, "rejected": {},
                                         "previously": f.previously})
                o["ingested"] += s.get("ingested", 0)
                o["duplicates"] += s.get("duplicates", 0)
                o["previously"] = o["previously"] and f.previously
                for k in ("skipped", "rejected"):
                    o[k] = _merge_counts([o[k], s.get(k, {})])
        return out

    @property
    def rejection_examples(self) -> dict[str, list[str]]:
        return {f.path: f.examples for f in self.files if f.examples}

    @property
    def ok(self) -> bool:
        """False when a whole file was rejected (missing columns, unreadable, ...)."""
        return not any(f.status == "rejected" for f in self.files)

    @property
    def nothing_ingestible(self) -> bool:
        """No file of a known format was found (nothing to add, nothing already there)."""
        return not any(f.kind for f in self.files)

    @property
    def clean(self) -> bool:
        """Nothing was rejected (no file, no row) and something ingestible was found."""
        return self.ok and self.rows_rejected == 0 and not self.nothing_ingestible

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "store": self.store, "elapsed_s": round(self.elapsed_s, 3),
                "files_seen": self.files_seen, "files_ingested": self.files_ingested,
                "files_skipped": [{"path": p, "reason": r} for p, r in self.files_skipped],
                "rows_added": self.rows_added, "rows_duplicate": self.rows_duplicate,
                "rows_rejected": self.rows_rejected, "rows_skipped": self.rows_skipped,
                "rejected_by_reason": self.rejected_by_reason, "skipped_by_reason": self.skipped_by_reason,
                "sources": self.sources, "rejection_examples": self.rejection_examples, "ok": self.ok,
                "clean": self.clean, "nothing_ingestible": self.nothing_ingestible,
                "ignored_files": self.ignored_files, "files": [asdict(f) for f in self.files]}

    def to_text(self) -> str:
        added = ", ".join(f"{t} {n:,}" for t, n in self.rows_added.items() if n) or "none"
        skipped = f"; measured runs skipped: {self.rows_skipped:,}" if self.rows_skipped else ""
        lines = [(f"Ingested {self.files_ingested} of {self.files_seen} files from {self.root} "
                  f"into {self.store} in {self.elapsed_s:.1f} s"),
                 (f"rows added: {added}; duplicates (already in the store): {self.rows_duplicate:,}; "
                  f"rows rejected: {self.rows_rejected:,}{skipped}")]
        if self.nothing_ingestible:
            what = f"{self.files_seen} data file(s), none ingestible" if self.files_seen else "no data files"
            extra = f"; {self.ignored_files} other file(s) ignored" if self.ignored_files else ""
            lines.append(f"nothing ingestible under {self.root}: {what} (.csv, .parquet){extra}")
        if self.sources:
            lines.append("measured runs per source:")
            for sid, s in sorted(self.sources.items()):
                head = "earlier ingest: " if s["previously"] else ""
                parts = [f"ingested {s['ingested']:,}"]
                parts += [f"duplicates {s['duplicates']:,}"] if s["duplicates"] else []
                for k in ("skipped", "rejected"):
                    total = sum(s[k].values())
                    detail = ", ".join(f"{r} {n}" for r, n in sorted(s[k].items(), key=lambda kv: (-kv[1], kv[0])))
                    parts.append(f"{k} {total:,}" + (f" ({detail})" if total else ""))
                lines.append(f"  {sid}: {head}{'; '.join(parts)}")
        if self.rejected_by_reason:
            lines.append("rows rejected by reason: "
                         + ", ".join(f"{r} {n:,}" for r, n in self.rejected_by_reason.items()))
        by_status: dict[str, list[FileOutcome]] = {}
        for f in self.files:
            if f.status != "ingested":
                by_status.setdefault(f.status, []).append(f)
        for status, files in by_status.items():
            lines.append(f"{status} ({len(files)}):")
            shown = files if status != "already ingested" else files[:5]
            lines += [f"  {f.path}" + (f": {f.reason}" if f.reason and f.reason != status else "") for f in shown]
            if len(shown) < len(files):
                lines.append(f"  ... and {len(files) - len(shown)} more")
        for f in self.files:
            if f.examples:
                if f.rows_rejected:
                    what = "measured runs" if f.kind in _RUN_KINDS else "rows"
                    skipped = f", and {f.rows_skipped} {what} skipped" if f.rows_skipped else ""
                    lines.append(f"rejected rows in {f.path} ({f.rows_rejected}{skipped}; first {len(f.examples)}):")
                else:
                    what = "measured runs" if f.kind in _RUN_KINDS else "rows"
                    lines.append(f"skipped {what} in {f.path} ({f.rows_skipped}; first {len(f.examples)}):")
                lines += [f"  {e}" for e in f.examples]
        return "\n".join(lines)


_RUN_KINDS = ("measured_runs", "vtrain", "published_runs")


def _merge_counts(dicts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


# --------------------------------------------------------------------------- row keys

def _canon_value(x: Any) -> str:
    if x is None or x is pd.NA or x is pd.NaT:
        return "\x00"
    if isinstance(x, (bool, np.bool_)):
        return "T" if x else "F"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        f = float(x)
        if np.isnan(f):
            return "\x00"
        return str(int(f)) if f.is_integer() and abs(f) < 2 ** 53 else repr(f)
    return str(x).strip()


def _canon_column(s: pd.Series) -> pd.Series:
    """`_canon_value` of every cell, vectorised for the common column types."""
    if pd.api.types.is_bool_dtype(s.dtype):
        return pd.Series([_canon_value(x) for x in s.astype("object")], index=s.index, dtype="object")
    if pd.api.types.is_numeric_dtype(s.dtype):
        arr = s.astype("float64").to_numpy(dtype="float64", na_value=np.nan)
        out = np.empty(len(arr), dtype=object)
        nan = np.isnan(arr)
        integral = ~nan & (np.floor(arr) == arr) & (np.abs(arr) < 2 ** 53)
        rest = ~nan & ~integral
        out[nan] = "\x00"
        out[integral] = arr[integral].astype(np.int64).astype(str)
        out[rest] = [repr(x) for x in arr[rest].tolist()]
        return pd.Series(out, index=s.index, dtype="object")
    vals = s.astype("object").to_numpy()
    if all(isinstance(v, str) or v is None for v in vals):
        out = np.array([v.strip() if v is not None else "\x00" for v in vals], dtype=object)
        return pd.Series(out, index=s.index, dtype="object")
    return pd.Series([_canon_value(x) for x in vals], index=s.index, dtype="object")


def row_keys(df: pd.DataFrame, table: str, group: pd.Series | None = None) -> pd.Series:
    """The content key of every row of a frame bound for `table`: a hash of its ROW_KEY_COLUMNS and of
    how many identical rows came before it in the same file (`group`: the file of each row; None:
    the frame is one file). The same rows in any column order, row order or file format get the
    same keys; a file's own repeats get distinct ones."""
    cols = ROW_KEY_COLUMNS[table]
    if not len(df):
        return pd.Series([], dtype="object")
    parts = [_canon_column(df[c]) if c in df.columns else pd.Series(["\x00"] * len(df), index=df.index)
             for c in cols]
    joined = parts[0].str.cat(parts[1:], sep="\x1f")
    occurrence = joined.groupby([group, joined] if group is not None else joined).cumcount()
    text = joined + "\x1e" + occurrence.astype(str)
    return text.map(lambda t: hashlib.blake2b(t.encode(), digest_size=16).hexdigest())


def _backfill(con: duckdb.DuckDBPyConnection) -> None:
    """Give rows ingested before row keys (or source ids) existed theirs, inside the caller's transaction."""
    for table in SAMPLE_TABLES:
        n = (con.execute(f"SELECT count(*) FROM {table} WHERE row_key IS NULL").fetchone() or (0,))[0]
        if not n:
            continue
        cols = ", ".join(f'"{c}"' for c in ROW_KEY_COLUMNS[table])
        df = con.execute(f"SELECT rowid AS _rid, batch_id, {cols} FROM {table} WHERE row_key IS NULL").df()
        keys = pd.DataFrame({"_rid": df["_rid"], "_key": row_keys(df, table, group=df["batch_id"]).to_numpy()})
        con.register("_row_keys", keys)
        try:
            con.execute(f"UPDATE {table} SET row_key = _row_keys._key FROM _row_keys "
                        f"WHERE {table}.rowid = _row_keys._rid")
        finally:
            con.unregister("_row_keys")
    for prefix, sid, framework in legacy_source_rules():
        con.execute("UPDATE measured_runs SET source_id = ?, framework = COALESCE(framework, ?) "
                    "WHERE source_id IS NULL AND starts_with(source, ?)", [sid, framework, prefix])


class _KnownKeys:
    """Row keys already in the store (loaded once per table per ingest, then kept up to date)."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self._con = con
        self._keys: dict[str, set[str]] = {}

    def get(self, table: str) -> set[str]:
        if table not in self._keys:
            rows = self._con.execute(f"SELECT row_key FROM {table} WHERE row_key IS NOT NULL").fetchall()
            self._keys[table] = {r[0] for r in rows}
        return self._keys[table]


# --------------------------------------------------------------------------- ingest

def batch_id_for(data: bytes, kind: str, platform_override: str | None) -> str:
    h = hashlib.sha256(data)
    h.update(b"\0" + kind.encode() + b"\0" + (platform_override or "").encode())
    return h.hexdigest()


def _insert_frame(con: duckdb.DuckDBPyConnection, table: str, df: pd.DataFrame) -> None:
    """Bulk insert by column name through a registered DataFrame."""
    con.register("_ingest_frame", df)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _ingest_frame")
    finally:
        con.unregister("_ingest_frame")


def _register_platforms(con: duckdb.DuckDBPyConnection, platforms: dict[str, tuple[str | None, str | None]]) -> None:
    for platform, (device, description) in platforms.items():
        con.execute("""INSERT INTO platforms VALUES (?, ?, ?) ON CONFLICT (platform) DO UPDATE SET
                       device_name = COALESCE(platforms.device_name, excluded.device_name),
                       description = COALESCE(platforms.description, excluded.description)""",
                    [platform, device, description])


def _source_summary(added: pd.DataFrame | None, dups: pd.DataFrame | None,
                    rejections: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}

    def entry(sid: Any) -> dict[str, Any]:
        key = "(no source id)" if sid is None or pd.isna(sid) else str(sid)
        return out.setdefault(key, {"ingested": 0, "duplicates": 0, "skipped": {}, "rejected": {}})
    for df, what in ((added, "ingested"), (dups, "duplicates")):
        if df is not None and len(df) and "source_id" in df.columns:
            for sid, n in df["source_id"].value_counts(dropna=False).items():
                entry(sid)[what] += int(n)
    for r in rejections:
        d = entry(r.get("source_id"))[r["outcome"]]
        d[r["reason"]] = d.get(r["reason"], 0) + 1
    return out


def _stored_source_summary(con: duckdb.DuckDBPyConnection, bid: str) -> dict[str, dict[str, Any]]:
    """What an earlier ingest of batch `bid` recorded per source (measured runs, run_rejections)."""
    added = con.execute("SELECT source_id FROM measured_runs WHERE batch_id = ?", [bid]).df()
    rej = con.execute("SELECT source_id, outcome, reason FROM run_rejections WHERE batch_id = ?", [bid]).df()
    return _source_summary(added, None, rej.to_dict(orient="records"))


def _ingest_one(con: duckdb.DuckDBPyConnection, plan: FilePlan, known: set[str], known_keys: _KnownKeys,
                max_examples: int, platforms_done: set[str]) -> FileOutcome:
    """Parse and insert one file inside the caller's transaction."""
    out = FileOutcome(path=str(plan.path), status="skipped", kind=plan.kind, reason=plan.skip_reason)
    if plan.kind is None:
        if plan.skip_reason.startswith("rejected"):
            out.status, out.reason = "rejected", plan.skip_reason[len("rejected: "):] or plan.skip_reason
        return out
    data = plan.path.read_bytes()
    out.batch_id = bid = batch_id_for(data, plan.kind, plan.platform)
    if bid in known:
        out.status, out.reason = "already ingested", f"already ingested (batch {bid[:12]})"
        if plan.kind in ("measured_runs", "vtrain", "published_runs"):
            out.sources, out.previously = _stored_source_summary(con, bid), True
        return out
    try:
        parsed = parse_file(data, plan, max_examples)
    except FormatError as exc:
        out.status, out.reason = "rejected", str(exc)
        return out
    out.rows_rejected, out.rows_skipped, out.examples = parsed.rows_rejected, parsed.rows_skipped, parsed.examples
    out.reasons, out.skip_reasons = dict(parsed.reasons), dict(parsed.skip_reasons)
    out.platform = ", ".join(parsed.platforms) or None
    new_frames: dict[str, pd.DataFrame] = {}
    dup_frames: dict[str, pd.DataFrame] = {}
    for table, df in parsed.tables.items():
        keys = row_keys(df, table)
        seen = known_keys.get(table)
        is_dup = np.fromiter((k in seen for k in keys.tolist()), dtype=bool, count=len(keys))
        new_frames[table] = df.loc[~is_dup].assign(row_key=keys[~is_dup].to_numpy()).reset_index(drop=True)
        dup_frames[table] = df.loc[is_dup]
        out.rows_duplicate += int(is_dup.sum())
    added = {t: len(df) for t, df in new_frames.items()}
    if plan.kind in ("measured_runs", "vtrain", "published_runs"):
        out.sources = _source_summary(new_frames.get("measured_runs"), dup_frames.get("measured_runs"),
                                      parsed.run_rejections)
    if sum(added.values()):
        new_platforms = {p: v for p, v in parsed.platforms.items() if p not in platforms_done}
        _register_platforms(con, new_platforms)
        platforms_done.update(new_platforms)
        for table, df in new_frames.items():
            if len(df):
                _insert_frame(con, table, df.assign(batch_id=bid))
                known_keys.get(table).update(df["row_key"])
    if parsed.run_rejections:
        _insert_frame(con, "run_rejections",
                      pd.DataFrame(parsed.run_rejections).assign(batch_id=bid)[list(RUN_REJECTION_COLUMNS)])
    if sum(added.values()) or out.rows_duplicate or parsed.run_rejections:
        con.execute("""INSERT INTO batches(batch_id, kind, source, file_sha256, licence, rows_added, rows_rejected,
                       ingested_at, notes, rows_duplicate, rows_skipped) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                    [bid, plan.kind, parsed.source, hashlib.sha256(data).hexdigest(), parsed.licence,
                     sum(added.values()), parsed.rows_rejected, datetime.now(UTC).replace(tzinfo=None),
                     parsed.notes, out.rows_duplicate, parsed.rows_skipped])
        known.add(bid)
    out.rows_added = added
    left_out = parsed.rows_rejected + parsed.rows_skipped
    if sum(added.values()):
        out.status, out.reason = "ingested", ""
    elif out.rows_duplicate:
        out.status = "duplicate"
        out.reason = (f"all {out.rows_duplicate} new-looking rows are already in the store (the same samples from "
                      f"another file or format)" + (f"; {left_out} rows left out" if left_out else ""))
    elif parsed.rows_rejected:
        out.status, out.reason = "rejected", f"no valid rows ({parsed.rows_rejected} rejected)"
    elif parsed.rows_skipped:
        out.reason = f"no usable rows ({parsed.rows_skipped} skipped: a needed field not stated)"
    else:
        out.reason = "no rows"
    return out


def _as_paths(path: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    if isinstance(path, (str, os.PathLike)):
        return [Path(path)]
    paths = [Path(p) for p in path]
    if not paths:
        raise ValueError("no path to ingest")
    return paths


def ingest_path(path: str | os.PathLike | Sequence[str | os.PathLike], *,
                store_path: str | os.PathLike | None = None, platform: str | None = None, kind: str | None = None,
                licence: str | None = None, progress: Callable[[int, int, str], None] | None = None,
                max_examples: int = 5, timeout_s: float = 60.0) -> IngestReport:
    """Ingest files or directory trees (one path or a list) into the store, all in one transaction.

    `platform` overrides the platform of every file, `kind` forces the format (see
    `formats.common.KINDS`), `licence` overrides the licence. `progress(done, total, message)`
    is called after each file. Every path is checked before the store is opened (a missing one
    raises FileNotFoundError); when no file of a known format is found the store is not touched.
    Any exception (KeyboardInterrupt included) rolls the whole call back: every table stays as it was.
    """
    t0 = time.perf_counter()
    store = _resolve(store_path)
    paths = _as_paths(path)
    plans: list[FilePlan] = []
    ignored = 0
    for p in paths:
        found = plan_files(p, kind=kind, platform=platform, licence=licence)
        plans += found
        if p.is_dir():
            listed = {pl.path for pl in found}
            ignored += sum(1 for f in p.rglob("*") if f.is_file() and f not in listed and f.name != "manifest.json")
    report = IngestReport(root=", ".join(str(p) for p in paths), store=str(store), ignored_files=ignored)
    if progress:
        progress(0, len(plans), f"{len(plans)} files to ingest")
    if not any(pl.kind for pl in plans):
        report.files = [_ingest_one(None, pl, set(), None, max_examples, set()) for pl in plans]  # type: ignore[arg-type]
        report.elapsed_s = time.perf_counter() - t0
        return report
    with connect(store, read_only=False, timeout_s=timeout_s) as con:
        con.execute("BEGIN TRANSACTION")
        try:
            _backfill(con)
            known = {row[0] for row in con.execute("SELECT batch_id FROM batches").fetchall()}
            known_keys = _KnownKeys(con)
            platforms_done: set[str] = set()
            for i, plan in enumerate(plans, 1):
                outcome = _ingest_one(con, plan, known, known_keys, max_examples, platforms_done)
                report.files.append(outcome)
                if progress:
                    progress(i, len(plans), f"{outcome.status}: {plan.path.name}")
            con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                pass  # DuckDB already aborted the transaction: nothing of it was written
            raise
    report.elapsed_s = time.perf_counter() - t0
    return report


# --------------------------------------------------------------------------- reads

def _query(sql: str, params: list[Any], store_path: str | os.PathLike | None,
           con: duckdb.DuckDBPyConnection | None) -> pd.DataFrame:
    if con is not None:
        return con.execute(sql, params).df()
    with connect(store_path, read_only=True) as c:
        return c.execute(sql, params).df()


def _where(**filters: Any) -> tuple[str, list[Any]]:
    parts = [f'"{col}" = ?' for col, v in filters.items() if v is not None]
    return (" WHERE " + " AND ".join(parts) if parts else ""), [v for v in filters.values() if v is not None]


def _columns(c: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    return [r[0] for r in c.execute(f"DESCRIBE {table}").fetchall()] if _has_table(c, table) else []


def _has_table(c: duckdb.DuckDBPyConnection, table: str) -> bool:
    row = c.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table]).fetchone()
    return bool(row and row[0])


def _select_all(c: duckdb.DuckDBPyConnection, table: str, wanted: tuple[str, ...] = ()) -> str:
    """`*` without the internal row_key, plus NULL for `wanted` columns an older store lacks."""
    have = _columns(c, table)
    parts = ["* EXCLUDE (row_key)" if "row_key" in have else "*"]
    parts += [f"NULL AS {w}" for w in wanted if w not in have]
    return ", ".join(parts)


def _read_table(table: str, where_sql: str, params: list[Any], order: str, store_path: str | os.PathLike | None,
                con: duckdb.DuckDBPyConnection | None, wanted: tuple[str, ...] = ()) -> pd.DataFrame:
    def run(c: duckdb.DuckDBPyConnection) -> pd.DataFrame:
        return c.execute(f"SELECT {_select_all(c, table, wanted)} FROM {table}{where_sql} ORDER BY {order}",
                         params).df()
    if con is not None:
        return run(con)
    with connect(store_path, read_only=True) as c:
        return run(c)


def read_op_samples(platform: str | None = None, op: str | None = None, pass_: str | None = None, *,
                    store_path: str | os.PathLike | None = None,
                    con: duckdb.DuckDBPyConnection | None = None) -> pd.DataFrame:
    """Operator samples, optionally filtered, in a deterministic order."""
    where, params = _where(platform=platform, op=op, **{"pass": pass_})
    return _read_table("op_samples", where, params, "ALL", store_path, con)


def read_collective_samples(platform: str | None = None, collective: str | None = None, *,
                            nodes: int | None = None, gpus_per_node: int | None = None,
                            store_path: str | os.PathLike | None = None,
                            con: duckdb.DuckDBPyConnection | None = None) -> pd.DataFrame:
    where, params = _where(platform=platform, collective=collective, nodes=nodes, gpus_per_node=gpus_per_node)
    return _read_table("collective_samples", where, params, "ALL", store_path, con)


def read_measured_runs(platform: str | None = None, *, source_id: str | None = None,
                       store_path: str | os.PathLike | None = None,
                       con: duckdb.DuckDBPyConnection | None = None) -> pd.DataFrame:
    """Measured end-to-end runs (optionally of one platform / one source_id), in ingest order, with
    `framework`, `source_id` (the group for leave-one-source-out validation) and `notes` (how the
    row's fields were derived; for published runs, the checks it passed and its own notes)."""
    where, params = _where(platform=platform, source_id=source_id)
    return _read_table("measured_runs", where, params, "platform, rowid", store_path, con,
                       wanted=("attention", "framework", "source_id", "notes"))


def read_run_rejections(source_id: str | None = None, *, outcome: str | None = None,
                        store_path: str | os.PathLike | None = None,
                        con: duckdb.DuckDBPyConnection | None = None) -> pd.DataFrame:
    """Measured-run rows left out at ingest: batch_id, file (the batch's source), source_id, line,
    outcome ('skipped': a field the predictor needs is not stated; 'rejected': contradictory or
    invalid), reason (countable) and detail. Empty (with those columns) on a store that has none."""
    cols = ["batch_id", "file", "source_id", "line", "outcome", "reason", "detail"]
    where, params = _where(source_id=source_id, outcome=outcome)
    where = where.replace('"source_id"', "r.source_id").replace('"outcome"', "r.outcome")
    sql = (f"SELECT r.batch_id, b.source AS file, r.source_id, r.line, r.outcome, r.reason, r.detail "
           f"FROM run_rejections r LEFT JOIN batches b USING (batch_id){where} ORDER BY b.source, r.line")

    def run(c: duckdb.DuckDBPyConnection) -> pd.DataFrame:
        return c.execute(sql, params).df() if _has_table(c, "run_rejections") else pd.DataFrame(columns=cols)
    if con is not None:
        return run(con)
    with connect(store_path, read_only=True) as c:
        return run(c)


def run_rejection_counts(*, store_path: str | os.PathLike | None = None,
                         con: duckdb.DuckDBPyConnection | None = None) -> pd.DataFrame:
    """Rows left out per source_id, outcome and reason (what validation reports as "skipped and why")."""
    df = read_run_rejections(store_path=store_path, con=con)
    if not len(df):
        return pd.DataFrame(columns=["source_id", "outcome", "reason", "rows"])
    return (df.groupby(["source_id", "outcome", "reason"], dropna=False).size().rename("rows").reset_index()
            .sort_values(["source_id", "outcome", "rows"], ascending=[True, True, False]).reset_index(drop=True))


def read_paper_errors(platform: str | None = None, *, store_path: str | os.PathLike | None = None,
                      con: duckdb.DuckDBPyConnection | None = None) -> pd.DataFrame:
    where, params = _where(platform=platform)
    return _read_table("paper_errors", where, params, "ALL", store_path, con)


def list_platforms(*, store_path: str | os.PathLike | None = None,
                   con: duckdb.DuckDBPyConnection | None = None) -> list[str]:
    """Platform ids that have anything in the store."""
    return _query("SELECT platform FROM platforms ORDER BY platform", [], store_path, con)["platform"].tolist()


def list_batches(*, store_path: str | os.PathLike | None = None,
                 con: duckdb.DuckDBPyConnection | None = None) -> pd.DataFrame:
    return _query("SELECT * FROM batches ORDER BY ingested_at, batch_id", [], store_path, con)


def summarize(*, store_path: str | os.PathLike | None = None,
              con: duckdb.DuckDBPyConnection | None = None) -> pd.DataFrame:
    """Sample counts and duration range per platform / kind / op (or collective) / pass."""
    sql = """
        SELECT platform, 'op' AS kind, op, pass, count(*) AS samples, min(duration_s) AS min_s,
               median(duration_s) AS median_s, max(duration_s) AS max_s FROM op_samples GROUP BY ALL
        UNION ALL
        SELECT platform, 'collective', collective, NULL, count(*), min(duration_s), median(duration_s),
               max(duration_s) FROM collective_samples GROUP BY ALL
        UNION ALL
        SELECT platform, 'measured_run', arch, NULL, count(*), min(step_time_s), median(step_time_s),
               max(step_time_s) FROM measured_runs GROUP BY ALL
        ORDER BY platform, kind, op, pass"""
    return _query(sql, [], store_path, con)


_FINGERPRINT_OP_COLUMNS = ("op", "pass", *SHAPE_COLUMNS, "variant", "dtype", "duration_s")
_FINGERPRINT_COLLECTIVE_COLUMNS = ("collective", "message_bytes", "ranks", "nodes", "gpus_per_node", "dtype",
                                   "duration_s")


def store_fingerprint(platform: str, op: str | None = None, pass_: str | None = None, *,
                      store_path: str | os.PathLike | None = None,
                      con: duckdb.DuckDBPyConnection | None = None) -> str:
    """sha256 of the sample values of a platform (or of one op / pass, or one collective).

    Only the values a model trains on enter the hash (not sources, batch ids or timestamps),
    so the same data ingested from another path gives the same fingerprint.
    """
    frames = []
    if op is None or op not in COLLECTIVES:
        where, params = _where(platform=platform, op=op, **{"pass": pass_})
        cols = ", ".join(f'"{c}"' for c in _FINGERPRINT_OP_COLUMNS)
        frames.append(("op_samples", f"SELECT {cols} FROM op_samples{where} ORDER BY ALL", params))
    if op is None or op in COLLECTIVES:
        where, params = _where(platform=platform, collective=op)
        cols = ", ".join(_FINGERPRINT_COLLECTIVE_COLUMNS)
        frames.append(("collective_samples", f"SELECT {cols} FROM collective_samples{where} ORDER BY ALL", params))
    h = hashlib.sha256()

    def feed(c: duckdb.DuckDBPyConnection) -> None:
        for table, sql, params in frames:
            h.update(table.encode())
            h.update(c.execute(sql, params).df().to_csv(index=False, float_format="%.17g").encode())
    if con is not None:
        feed(con)
    else:
        with connect(store_path, read_only=True) as c:
            feed(c)
    return h.hexdigest()

"""The DuckDB sample store: schema, transactional idempotent ingest, short read-only queries.

One writer at a time: write connections hold an exclusive `fcntl.flock` on `<store>.lock`.
An `ingest_path` call is one transaction (all files or nothing). A file is identified by
`batch_id = sha256(file bytes, kind, platform override)`; re-ingesting it adds nothing.
Parsing lives in `ingest_formats.py`.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import duckdb
import pandas as pd

from . import ingest_formats as fmt
from .ops import COLLECTIVES, SHAPE_COLUMNS

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
    # stores created before the attention column existed
    "ALTER TABLE measured_runs ADD COLUMN IF NOT EXISTS attention TEXT",
    """CREATE TABLE IF NOT EXISTS paper_errors(platform TEXT, kind TEXT, op TEXT, paper_function TEXT, pass TEXT,
        nodes INTEGER, gpus_per_node INTEGER, best_model TEXT, best_error DOUBLE, batch_id TEXT)""",
)
SAMPLE_TABLES = ("op_samples", "collective_samples", "measured_runs", "paper_errors")


class StoreError(RuntimeError):
    """The store is missing, locked by another writer, or cannot be opened."""


def default_store_path() -> Path:
    """`$PREDICTOR_STORE` if set, else `<repo>/data/samples.duckdb`."""
    env = os.environ.get(ENV_STORE)
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parent.parent / "data" / "samples.duckdb"


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

    Write connections create the file (and its folder) and the schema, and hold the
    writer lock for their whole life. Read-only connections on a missing store raise
    StoreError with the command that fills it. Keep read connections short: a writer
    in another process cannot open the file while one is open.
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
    """What happened to one file: ingested, already ingested, skipped or rejected."""

    path: str
    status: str
    kind: str | None = None
    platform: str | None = None
    batch_id: str | None = None
    rows_added: dict[str, int] = field(default_factory=dict)
    rows_rejected: int = 0
    examples: list[str] = field(default_factory=list)
    reason: str = ""


@dataclass
class IngestReport:
    """Summary of one `ingest_path` call."""

    root: str
    store: str
    files: list[FileOutcome] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def files_seen(self) -> int:
        return len(self.files)

    @property
    def files_ingested(self) -> int:
        return sum(f.status == "ingested" for f in self.files)

    @property
    def files_skipped(self) -> list[tuple[str, str]]:
        """(path, reason) of every file that added nothing (already ingested, skipped, rejected)."""
        return [(f.path, f.reason or f.status) for f in self.files if f.status != "ingested"]

    @property
    def rows_added(self) -> dict[str, int]:
        out = {t: 0 for t in SAMPLE_TABLES}
        for f in self.files:
            for t, n in f.rows_added.items():
                out[t] = out.get(t, 0) + n
        return out

    @property
    def rows_rejected(self) -> int:
        return sum(f.rows_rejected for f in self.files)

    @property
    def rejection_examples(self) -> dict[str, list[str]]:
        return {f.path: f.examples for f in self.files if f.examples}

    @property
    def ok(self) -> bool:
        """False when a whole file was rejected (missing columns, unreadable, ...)."""
        return not any(f.status == "rejected" for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "store": self.store, "elapsed_s": round(self.elapsed_s, 3),
                "files_seen": self.files_seen, "files_ingested": self.files_ingested,
                "files_skipped": [{"path": p, "reason": r} for p, r in self.files_skipped],
                "rows_added": self.rows_added, "rows_rejected": self.rows_rejected,
                "rejection_examples": self.rejection_examples, "ok": self.ok,
                "files": [asdict(f) for f in self.files]}

    def to_text(self) -> str:
        added = ", ".join(f"{t} {n:,}" for t, n in self.rows_added.items() if n) or "none"
        lines = [f"Ingested {self.files_ingested} of {self.files_seen} files from {self.root} "
                 f"into {self.store} in {self.elapsed_s:.1f} s",
                 f"rows added: {added}; rows rejected: {self.rows_rejected:,}"]
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
                lines.append(f"rejected rows in {f.path} ({f.rows_rejected}):")
                lines += [f"  {e}" for e in f.examples]
        return "\n".join(lines)


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


def _ingest_one(con: duckdb.DuckDBPyConnection, plan: fmt.FilePlan, known: set[str],
                max_examples: int, platforms_done: set[str]) -> FileOutcome:
    """Parse and insert one file inside the caller's transaction."""
    out = FileOutcome(path=str(plan.path), status="skipped", kind=plan.kind, reason=plan.skip_reason)
    if plan.kind is None:
        if plan.skip_reason.startswith("rejected"):
            out.status = "rejected"
        return out
    data = plan.path.read_bytes()
    out.batch_id = bid = batch_id_for(data, plan.kind, plan.platform)
    if bid in known:
        out.status, out.reason = "already ingested", f"already ingested (batch {bid[:12]})"
        return out
    try:
        parsed = fmt.parse_file(data, plan, max_examples)
    except fmt.FormatError as exc:
        out.status, out.reason = "rejected", str(exc)
        return out
    out.rows_rejected, out.examples = parsed.rows_rejected, parsed.examples
    out.platform = ", ".join(parsed.platforms) or None
    added = {t: len(df) for t, df in parsed.tables.items()}
    if not sum(added.values()):
        out.status = "rejected" if parsed.rows_rejected else "skipped"
        out.reason = f"no valid rows ({parsed.rows_rejected} rejected)" if parsed.rows_rejected else "no rows"
        return out
    new_platforms = {p: v for p, v in parsed.platforms.items() if p not in platforms_done}
    _register_platforms(con, new_platforms)
    platforms_done.update(new_platforms)
    for table, df in parsed.tables.items():
        if len(df):
            _insert_frame(con, table, df.assign(batch_id=bid))
    con.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [bid, plan.kind, parsed.source, hashlib.sha256(data).hexdigest(), parsed.licence,
                 sum(added.values()), parsed.rows_rejected,
                 datetime.now(timezone.utc).replace(tzinfo=None), parsed.notes])
    known.add(bid)
    out.status, out.rows_added, out.reason = "ingested", added, ""
    return out


def ingest_path(path: str | os.PathLike, *, store_path: str | os.PathLike | None = None,
                platform: str | None = None, kind: str | None = None, licence: str | None = None,
                progress: Callable[[int, int, str], None] | None = None, max_examples: int = 5,
                timeout_s: float = 60.0) -> IngestReport:
    """Ingest a file or a directory tree into the store, all in one transaction.

    `platform` overrides the platform of every file, `kind` forces the format (see
    `ingest_formats.KINDS`), `licence` overrides the licence. `progress(done, total, message)`
    is called after each file. Any exception rolls the whole call back.
    """
    t0 = time.perf_counter()
    store = _resolve(store_path)
    plans = fmt.plan_files(Path(path), kind=kind, platform=platform, licence=licence)
    report = IngestReport(root=str(path), store=str(store))
    if progress:
        progress(0, len(plans), f"{len(plans)} files to ingest")
    with connect(store, read_only=False, timeout_s=timeout_s) as con:
        con.execute("BEGIN TRANSACTION")
        try:
            known = {row[0] for row in con.execute("SELECT batch_id FROM batches").fetchall()}
            platforms_done: set[str] = set()
            for i, plan in enumerate(plans, 1):
                outcome = _ingest_one(con, plan, known, max_examples, platforms_done)
                report.files.append(outcome)
                if progress:
                    progress(i, len(plans), f"{outcome.status}: {plan.path.name}")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
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


def read_op_samples(platform: str | None = None, op: str | None = None, pass_: str | None = None, *,
                    store_path: str | os.PathLike | None = None,
                    con: duckdb.DuckDBPyConnection | None = None) -> pd.DataFrame:
    """Operator samples, optionally filtered, in a deterministic order."""
    where, params = _where(platform=platform, op=op, **{"pass": pass_})
    return _query(f"SELECT * FROM op_samples{where} ORDER BY ALL", params, store_path, con)


def read_collective_samples(platform: str | None = None, collective: str | None = None, *,
                            nodes: int | None = None, gpus_per_node: int | None = None,
                            store_path: str | os.PathLike | None = None,
                            con: duckdb.DuckDBPyConnection | None = None) -> pd.DataFrame:
    where, params = _where(platform=platform, collective=collective, nodes=nodes, gpus_per_node=gpus_per_node)
    return _query(f"SELECT * FROM collective_samples{where} ORDER BY ALL", params, store_path, con)


def read_measured_runs(platform: str | None = None, *, store_path: str | os.PathLike | None = None,
                       con: duckdb.DuckDBPyConnection | None = None) -> pd.DataFrame:
    where, params = _where(platform=platform)
    return _query(f"SELECT * FROM measured_runs{where} ORDER BY platform, rowid", params, store_path, con)


def read_paper_errors(platform: str | None = None, *, store_path: str | os.PathLike | None = None,
                      con: duckdb.DuckDBPyConnection | None = None) -> pd.DataFrame:
    where, params = _where(platform=platform)
    return _query(f"SELECT * FROM paper_errors{where} ORDER BY ALL", params, store_path, con)


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

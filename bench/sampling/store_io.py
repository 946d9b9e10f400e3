"""Parquet shards + manifest.json: the sampler's output directory.

Layout of a sample directory (what `python -m predictor ingest DIR` reads):

    manifest.json                 platform, source, licence, device_name, description, runs[...]
    ops-<run>-<nnnn>.parquet      op_samples rows (docs/architecture.md schema + a few extra columns)
    coll-<run>-<nnnn>.parquet     collective_samples rows

Shards are written atomically (temporary file + rename) every few seconds, so an interrupted run
keeps every finished shard; `done_keys()` lets a rerun skip what is already measured. Extra
columns (design_index, reps, iqr_s, wall_s, ...) are ignored by the store's parser.

A sample set belongs to one machine: its manifest records the machine's fingerprint
(`predictor.hardware.machine`; `"machine"`, set by the first run), and a run on another machine never adds
to it (`check_same_machine` raises `ForeignSamples`). By default a platform's set is
`<root>/<platform>`, or, when that folder holds another machine's samples,
`<root>/machine-<id>/<platform>` (`sample_set_dir`).
"""
from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from bench.sampling.design import sample_key
from predictor.hardware.machine import Machine, differences, from_dict, from_facts, same_machine
from predictor.model import ops as P

LICENCE = "CC0-1.0 (measurements made by this project's bench/ on the machine named in the manifest)"
OP_INT_COLUMNS = list(P.SHAPE_COLUMNS)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_shard(out_dir: Path, prefix: str, run_id: str, seq: int, rows: list[dict[str, Any]]) -> Path | None:
    if not rows:
        return None
    df = pd.DataFrame(rows)
    for c in OP_INT_COLUMNS + ["message_bytes", "ranks", "nodes", "gpus_per_node", "design_index", "reps"]:
        if c in df.columns:
            df[c] = df[c].astype("Int64")
    if "measured_at" in df.columns:
        df["measured_at"] = pd.to_datetime(df["measured_at"], utc=True)
    path = Path(out_dir) / f"{prefix}-{run_id}-{seq:04d}.parquet"
    tmp = path.with_name(f".{path.name}.tmp")
    df.to_parquet(tmp, index=False, compression="zstd")
    os.replace(tmp, path)
    return path


def read_shards(out_dir: Path, prefix: str) -> pd.DataFrame:
    files = sorted(Path(out_dir).glob(f"{prefix}-*.parquet"))
    if not files:
        return pd.DataFrame()
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def done_op_keys(out_dir: Path) -> set[str]:
    df = read_shards(out_dir, "ops")
    keys = set()
    for r in df.to_dict(orient="records"):
        keys.add(sample_key(r["op"], r["pass"], r["dtype"], {c: (None if pd.isna(r.get(c)) else r.get(c))
                                                              for c in P.SHAPE_COLUMNS}))
    return keys


def check_variants(out_dir: Path, points) -> None:
    """Refuse a plan whose `variant` of an op differs from the one the set's samples of that op have (e.g.
    a MoE op's top-k): the resume key does not hold the variant, so such a plan would skip its shapes."""
    df = read_shards(out_dir, "ops")
    if df.empty or "variant" not in df.columns:
        return
    have = {op: set(g["variant"].dropna().astype(str)) for op, g in df.groupby("op")}
    for p in points:
        v = p.variant
        if v is not None and have.get(p.op) and v not in have[p.op]:
            raise ValueError(f"{out_dir} holds {p.op} samples of variant {sorted(have[p.op])}, this plan samples "
                             f"{v!r}: one variant per set (sample it into another folder)")


def coll_key(collective: str, message_bytes: int, nodes: int, gpn: int, dtype: str) -> str:
    return f"{collective}|{int(message_bytes)}|{int(nodes)}x{int(gpn)}|{dtype}"


def done_coll_keys(out_dir: Path) -> set[str]:
    df = read_shards(out_dir, "coll")
    return {coll_key(r["collective"], r["message_bytes"], r["nodes"], r["gpus_per_node"], r["dtype"])
            for r in df.to_dict(orient="records")}


def read_manifest(out_dir: Path) -> dict[str, Any]:
    p = Path(out_dir) / "manifest.json"
    if p.exists():
        return json.loads(p.read_text())
    return {}


def update_manifest(out_dir: Path, platform: str, facts: dict[str, Any] | None = None,
                    run: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """Create or update manifest.json; `run` replaces the entry with the same run_id (or is appended).
    The first facts with a `machine` fingerprint name the set's machine (never replaced)."""
    m = read_manifest(out_dir)
    m.setdefault("platform", platform)
    if facts and isinstance(facts.get("machine"), dict) and "machine" not in m:
        m["machine"] = facts["machine"]
        m["machine_id"] = facts["machine"].get("id")
    m.setdefault("licence", LICENCE)
    m.setdefault("schema", "op_samples / collective_samples columns of docs/architecture.md (extra columns ignored)")
    if facts:
        m.setdefault("device_name", facts.get("device_name"))
        m["source"] = m.get("source") or (f"bench/ samples measured on {facts.get('host')} "
                                          f"({facts.get('device_name')}), torch {facts.get('torch')}")
    m.update({k: v for k, v in fields.items() if v is not None})
    if run is not None:
        runs = [r for r in m.get("runs", []) if r.get("run_id") != run.get("run_id")]
        runs.append(run)
        m["runs"] = runs
    m["updated_at"] = now_iso()
    atomic_write_bytes(Path(out_dir) / "manifest.json", (json.dumps(m, indent=1, default=str) + "\n").encode())
    return m


# --------------------------------------------------------------------------- which machine a set belongs to
MACHINE_DIR_PREFIX = "machine-"


class ForeignSamples(ValueError):
    """A sample directory holds samples of another machine (or of one it cannot identify)."""

    def __init__(self, out_dir: Path, there: Machine | None, here: Machine, hint: str = ""):
        self.out_dir, self.there, self.here = Path(out_dir), there, here
        if there is None:
            what = (f"{out_dir} holds samples but no record of the machine they were measured on; this machine "
                    f"is {here.short()} (machine {here.id})")
        else:
            diff = differences(there, here) or [f"the record does not name its {', '.join(there.unknown)}"]
            what = (f"{out_dir} holds samples of another machine: {there.short()} (machine {there.id}); this "
                    f"machine is {here.short()} (machine {here.id}); they differ in: {'; '.join(diff)}")
        super().__init__(f"{what}. Samples of two machines are never mixed, so nothing there is resumed."
                         + (f" {hint}" if hint else ""))


def has_samples(out_dir: Path) -> bool:
    d = Path(out_dir)
    return d.is_dir() and (any(True for _ in d.glob("ops-*.parquet")) or any(True for _ in d.glob("coll-*.parquet")))


def set_machine(out_dir: Path) -> Machine | None:
    """The machine a sample set was measured on: its manifest's `machine`, or, for sets written before
    fingerprints existed, one rebuilt from the first run's recorded facts; None for a new set."""
    m = read_manifest(out_dir)
    if isinstance(m.get("machine"), dict):
        return from_dict(m["machine"])
    facts = next((r.get("facts") for r in m.get("runs", []) if isinstance(r.get("facts"), dict)), None)
    return from_facts(facts) if facts else None


def belongs_to(out_dir: Path, here: Machine) -> bool:
    """True when `out_dir` is free (no samples yet) or holds samples of `here`."""
    there = set_machine(out_dir)
    if there is None:
        return not has_samples(out_dir)
    return same_machine(there, here)


def check_same_machine(out_dir: Path, here: Machine, hint: str = "") -> None:
    """Raise ForeignSamples unless `out_dir` is free or was sampled on `here`."""
    if not belongs_to(out_dir, here):
        raise ForeignSamples(Path(out_dir), set_machine(out_dir), here, hint)


def machine_dir(root: Path, here: Machine) -> Path:
    return Path(root) / f"{MACHINE_DIR_PREFIX}{here.id}"


def sample_set_dir(root: Path, platform: str, here: Machine) -> Path:
    """`<root>/<platform>` when it is free or this machine's, else `<root>/machine-<id>/<platform>`."""
    d = Path(root) / platform
    return d if belongs_to(d, here) else machine_dir(root, here) / platform


def machine_root(root: Path, platforms: tuple[str, ...] | list[str], here: Machine) -> Path:
    """The folder whose `<platform>` sets are this machine's: `root` when every one is free or ours,
    else `<root>/machine-<id>`."""
    root = Path(root)
    return root if all(belongs_to(root / p, here) for p in platforms) else machine_dir(root, here)


def drop_platform_rows(platform: str, store: str | None,
                       tables: tuple[str, ...] = ("op_samples", "collective_samples")) -> int:
    """Delete a platform's rows from `tables` of the sample store (and the batches left without rows),
    so that re-sampled directories replace, rather than add to, earlier measurements."""
    from predictor.samples.store import SAMPLE_TABLES, connect
    n = 0
    with connect(store, read_only=False) as con:
        con.execute("BEGIN TRANSACTION")
        ids = set()
        for table in tables:
            if table not in SAMPLE_TABLES:
                raise ValueError(f"not a sample table: {table}")
            ids |= {r[0] for r in con.execute(f"SELECT DISTINCT batch_id FROM {table} WHERE platform = ?",
                                              [platform]).fetchall()}
            n += con.execute(f"SELECT count(*) FROM {table} WHERE platform = ?", [platform]).fetchone()[0]
            con.execute(f"DELETE FROM {table} WHERE platform = ?", [platform])
        for bid in ids:
            left = sum(con.execute(f"SELECT count(*) FROM {t} WHERE batch_id = ?", [bid]).fetchone()[0]
                       for t in SAMPLE_TABLES)
            if not left:
                con.execute("DELETE FROM batches WHERE batch_id = ?", [bid])
        con.execute("COMMIT")
    return int(n)

"""Parquet shards + manifest.json: the sampler's output directory.

Layout of a sample directory (what `python -m predictor ingest DIR` reads):

    manifest.json                 platform, source, licence, device_name, description, runs[...]
    ops-<run>-<nnnn>.parquet      op_samples rows (docs/architecture.md schema + a few extra columns)
    coll-<run>-<nnnn>.parquet     collective_samples rows

Shards are written atomically (temporary file + rename) every few seconds, so an interrupted run
keeps every finished shard; `done_keys()` lets a rerun skip what is already measured. Extra
columns (design_index, reps, iqr_s, wall_s, ...) are ignored by the store's parser.
"""
from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from predictor import ops as P

from .design import sample_key

LICENCE = "CC0-1.0 (measurements made by this project's bench/ on the machine named in the manifest)"
OP_INT_COLUMNS = list(P.SHAPE_COLUMNS)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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
    """Create or update manifest.json; `run` replaces the entry with the same run_id (or is appended)."""
    m = read_manifest(out_dir)
    m.setdefault("platform", platform)
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

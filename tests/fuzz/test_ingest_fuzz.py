"""Generated cases (seeded, reproducible) for the ingest: re-exports add nothing, cut files never
store a wrong row, damaged files never crash. No extra dependency: numpy's generator drives them."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictor.samples import store

COLS = ["platform", "op", "pass", "batch", "seq", "hidden", "dtype", "duration_s", "source"]
KEY = ["op", "pass", "batch", "seq", "hidden", "dtype", "duration_s"]


def frame(rng: np.random.Generator, n: int) -> pd.DataFrame:
    """Op samples written the way bench and pandas write them: one notation per column."""
    return pd.DataFrame({
        "platform": "fz-gpu", "op": rng.choice(["layernorm", "res_add"], n), "pass": rng.choice(["fwd", "bwd"], n),
        "batch": rng.integers(1, 10, n), "seq": rng.choice([1024, 2048, 4096, 8192], n),
        "hidden": rng.choice([1024, 2048, 4096, 8192], n), "dtype": "bf16",
        "duration_s": [f"{x:.6e}" for x in rng.uniform(1e-6, 1e-2, n)], "source": "fuzz"})[COLS]


def to_bytes(df: pd.DataFrame, rng: np.random.Generator) -> bytes:
    text = df.to_csv(index=False)
    if rng.random() < 0.5:
        text = text.replace("\n", "\r\n")
    return (b"\xef\xbb\xbf" if rng.random() < 0.3 else b"") + text.encode()


def stored(db: Path, platform: str | None = None) -> set[tuple]:
    df = store.read_op_samples(platform, store_path=db)
    return {(r.op, r._3, int(r.batch), int(r.seq), int(r.hidden), r.dtype, float(r.duration_s))
            for r in df.itertuples()}


def original(df: pd.DataFrame) -> set[tuple]:
    return {(r.op, r._3, int(r.batch), int(r.seq), int(r.hidden), r.dtype, float(r.duration_s))
            for r in df.itertuples()}


@pytest.mark.parametrize("seed", range(3))
def test_any_reexport_adds_nothing(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    df = frame(rng, int(rng.integers(5, 60)))
    df = pd.concat([df, df.iloc[: int(rng.integers(0, 3))]], ignore_index=True)  # a few in-file repeats
    first = tmp_path / "0" / "ops.csv"
    first.parent.mkdir()
    first.write_bytes(to_bytes(df, rng))
    db = tmp_path / "s.duckdb"
    assert store.ingest_path(first, store_path=db).rows_added["op_samples"] == len(df)
    fp = store.store_fingerprint("fz-gpu", store_path=db)
    for k in range(1, 4):
        shuffled = df.sample(frac=1.0, random_state=int(rng.integers(1 << 30)))[list(rng.permutation(COLS))]
        out = tmp_path / str(k)
        out.mkdir()
        if rng.random() < 0.5:
            path = out / "ops.parquet"
            shuffled.astype({"duration_s": "float64"}).to_parquet(path, index=False)
        else:
            path = out / "ops.csv"
            path.write_bytes(to_bytes(shuffled, rng))
        rep = store.ingest_path(path, store_path=db)
        assert sum(rep.rows_added.values()) == 0 and rep.rows_duplicate == len(df), (seed, k, rep.to_text())
    assert store.store_fingerprint("fz-gpu", store_path=db) == fp


@pytest.mark.parametrize("seed", range(2))
def test_a_cut_file_never_stores_a_wrong_row(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    df = frame(rng, 20)
    data = to_bytes(df, rng)
    truth = original(df)
    cuts = sorted(set(rng.integers(len(data) // 2, len(data), 8).tolist()) | {len(data) - 1, len(data) - 2})
    db = tmp_path / "s.duckdb"
    for cut in cuts:  # each cut under its own platform id, so that no row is a duplicate of another cut's
        f = tmp_path / f"cut{cut}.csv"
        f.write_bytes(data[:cut])
        rep = store.ingest_path(f, store_path=db, platform=f"cut{cut}")
        assert rep.ok, (cut, rep.to_text())
        got = stored(db, f"cut{cut}")
        assert got <= truth, (cut, got - truth)
        complete_lines = data[:cut].replace(b"\r\n", b"\n").count(b"\n") - 1  # rows ending with a newline
        assert len(got) >= complete_lines - 1  # at most the cut line is lost (plus its newline-less twin)


@pytest.mark.parametrize("seed", range(2))
def test_damaged_files_never_crash(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(200 + seed)
    df = frame(rng, 15)
    csv_bytes = to_bytes(df, rng)
    pq = tmp_path / "src.parquet"
    df.astype({"duration_s": "float64"}).to_parquet(pq, index=False)
    for k, (name, data) in enumerate([("a.csv", csv_bytes), ("b.parquet", pq.read_bytes())] * 3):
        raw = bytearray(data)
        for _ in range(int(rng.integers(1, 6))):
            raw[int(rng.integers(0, len(raw)))] = int(rng.integers(0, 256))
        f = tmp_path / f"{k}{name}"
        f.write_bytes(bytes(raw))
        rep = store.ingest_path(f, store_path=tmp_path / f"{k}.duckdb")  # must not raise
        (outcome,) = rep.files
        assert outcome.status in ("ingested", "rejected", "skipped", "duplicate"), outcome
        if outcome.status == "rejected":
            assert outcome.reason and f.name in rep.to_text()

"""Behaviour of the DuckDB sample store and the ingest formats, on tiny generated files."""
from __future__ import annotations

import fcntl
import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictor.model.specs import padded_vocab
from predictor.samples import store
from predictor.samples.formats.paper import paper_stage_params

A100 = "NVIDIAA100-SXM4-80GB"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding=encoding)
    return path


@pytest.fixture
def paper_tree(tmp_path: Path) -> Path:
    """A miniature copy of the paper's layout: operator, optimizer, NCCL and summary files."""
    root = tmp_path / "paper-samples" / "Perlmutter"
    op, nccl = root / "operator", root / "nccl"
    write(op / f"{A100}_linear1_fp16.csv",
          "mp,b,l,dim,F_dur(us),B_dur(us)\n1.0,2.0,1024.0,4096.0,100.0,200.0\n2,4,2048,8192,300.5,601\n")
    write(op / f"{A100}_res_add_fp16.csv", "b,l,dim,F_dur(us),B_dur(us)\n2,1024,4096,42.4,42.4\n")
    write(op / f"{A100}_firstStage_optimizer_fp16.csv", "mp,dim,encoders,dur(us)\n2,2048,4,7000\n")
    write(op / f"{A100}_optimizer_fp16.csv",
          "num_layers,hidden_size,param_tensors,params,dur\n2.0,256.0,28.0,27335680.0,9731.2\n")
    write(op / f"{A100}.csv",
          "GPU,Function,Precision,Propagation,Best_model,Best_config,Best_error%\n"
          f"{A100},linear1,fp16,fwd,rforest,\"{{'max_depth': 10}}\",0.04\n"
          f"{A100},firstStage_optimizer,fp16,dur,xgboost,\"{{}}\",0.5\n")
    header = "shape,nodes,GPUsPerNode,dur(us)\n"
    write(nccl / f"{A100}_allreduce_fp16_1_2.csv", header + "1000,1,2,50\n2000,1,2,90\n")
    write(nccl / f"{A100}_allreduce_fp16_2_1.csv", header + "1000,2,1,500\n")
    write(nccl / f"{A100}_allreduce_fp16.csv", header + "1000,1,2,50\n2000,1,2,90\n1000,2,1,500\n")
    write(nccl / f"{A100}.csv",
          "GPU,Function,Precision,Nodes,GPUsPerNode,Best_model,Best_config,Best_error%\n"
          f"{A100},allreduce,fp16,1,2,rforest,\"{{}}\",0.01\n{A100},allreduce,fp16,0,0,rforest,\"{{}}\",0.02\n")
    return tmp_path / "paper-samples"


def counts(db: Path) -> dict[str, int]:
    with store.connect(db, read_only=True) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("batches", "platforms", "op_samples", "collective_samples", "measured_runs",
                          "paper_errors")}


def test_paper_tree_is_mapped_to_canonical_samples(paper_tree: Path, tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    calls: list[tuple[int, int, str]] = []
    report = store.ingest_path(paper_tree, store_path=db, progress=lambda d, t, m: calls.append((d, t, m)))
    assert report.files_seen == 9 and report.files_ingested == 8
    (pooled, reason), = report.files_skipped
    assert pooled.endswith(f"{A100}_allreduce_fp16.csv") and "per-topology" in reason
    assert report.rows_added == {"op_samples": 2 * 2 + 2 + 1 + 1, "collective_samples": 3, "measured_runs": 0,
                                 "paper_errors": 4}
    assert calls[-1][:2] == (9, 9)

    qkv = store.read_op_samples("perlmutter-a100", "qkv_proj", store_path=db)
    assert len(qkv) == 4 and set(qkv["pass"]) == {"fwd", "bwd"}
    row = qkv[(qkv["pass"] == "bwd") & (qkv["tp"] == 2)].iloc[0]
    assert (row["batch"], row["seq"], row["hidden"]) == (4, 2048, 8192)
    assert math.isclose(row["duration_s"], 601e-6)
    assert row["dtype"] == "fp16" and row["source"].startswith("DebarghaG/estimate-train-time:paper-samples/")
    res = store.read_op_samples(op="res_add", store_path=db)
    assert sorted(res["pass"]) == ["bwd", "fwd"] and res["duration_s"].nunique() == 1

    opt = store.read_op_samples(op="optimizer", pass_="step", store_path=db).set_index("variant")
    assert opt.loc["first", "params"] == 4 * (12 * 2048**2 // 2 + 13 * 2048) + padded_vocab(50257, 2) * 2048 // 2
    assert (opt.loc["first", "layers"], opt.loc["first", "tp"]) == (4, 2)
    assert (opt.loc["whole", "params"], opt.loc["whole", "layers"], opt.loc["whole", "tp"]) == (27335680, 2, 1)

    coll = store.read_collective_samples("perlmutter-a100", "allreduce", store_path=db)
    first = coll[(coll["nodes"] == 1) & (coll["message_bytes"] == 4000)].iloc[0]  # 2 bytes per fp16 element
    assert first["ranks"] == 2 and first["gpus_per_node"] == 2 and math.isclose(first["duration_s"], 90e-6)

    err = store.read_paper_errors("perlmutter-a100", store_path=db)
    assert set(err["op"]) == {"qkv_proj", "optimizer", "allreduce"}
    assert err.loc[err["paper_function"] == "firstStage_optimizer", "pass"].item() == "step"
    assert err.loc[err["kind"] == "nccl", "nodes"].isna().sum() == 1  # the pooled 0,0 row
    assert store.list_platforms(store_path=db) == ["perlmutter-a100"]
    summary = store.summarize(store_path=db)
    assert summary.set_index(["op", "pass"]).loc[("qkv_proj", "fwd"), "samples"] == 2


def test_reingest_adds_nothing(paper_tree: Path, tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    store.ingest_path(paper_tree, store_path=db)
    before, fp = counts(db), store.store_fingerprint("perlmutter-a100", store_path=db)
    again = store.ingest_path(paper_tree, store_path=db)
    assert again.files_ingested == 0 and sum(again.rows_added.values()) == 0
    assert sum(f.status == "already ingested" for f in again.files) == 8
    assert counts(db) == before and store.store_fingerprint("perlmutter-a100", store_path=db) == fp
    # the same bytes under a platform override are a different batch
    one = paper_tree / "Perlmutter" / "operator" / f"{A100}_res_add_fp16.csv"
    assert store.ingest_path(one, store_path=db, platform="my-a100").files_ingested == 1
    assert len(store.read_op_samples("my-a100", store_path=db)) == 2


def test_bad_rows_are_rejected_individually_with_reasons(tmp_path: Path) -> None:
    f = write(tmp_path / "Perlmutter" / f"{A100}_linear2_fp16.csv",
              "mp,b,l,dim,F_dur(us),B_dur(us)\n1,2,1024,4096,100,200\n1,2,1024,4096,nan,-5\n"
              "1.5,2,1024,4096,10,20\n1,2,1024,4096,inf,30\n")
    db = tmp_path / "s.duckdb"
    report = store.ingest_path(f, store_path=db)
    assert report.rows_added["op_samples"] == 3  # row 1 both passes, row 4 bwd
    assert report.rows_rejected == 5
    examples = report.rejection_examples[str(f)]
    assert any("line 3 (fwd)" in e and "F_dur(us)" in e for e in examples)
    assert any("line 3 (bwd)" in e and "-5" in e for e in examples)
    assert any("mp=1.5" in e and "integer" in e for e in examples)
    assert "rejected rows" in report.to_text()


def test_file_missing_a_column_is_rejected_whole(tmp_path: Path) -> None:
    f = write(tmp_path / f"{A100}_linear3_fp16.csv", "mp,b,l,F_dur(us),B_dur(us)\n1,2,1024,1,2\n")
    db = tmp_path / "s.duckdb"
    report = store.ingest_path(f, store_path=db)
    (outcome,) = report.files
    assert outcome.status == "rejected" and not report.ok
    assert "missing column(s) dim" in outcome.reason and f.name in outcome.reason
    assert "expected columns: mp, b, l, dim, F_dur(us), B_dur(us)" in outcome.reason
    assert counts(db)["op_samples"] == 0 and counts(db)["batches"] == 0


def test_failure_halfway_leaves_the_store_unchanged(paper_tree: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "s.duckdb"
    store.ingest_path(paper_tree / "Perlmutter" / "operator" / f"{A100}_res_add_fp16.csv", store_path=db)
    before = counts(db)
    real = store._insert_frame
    calls = {"n": 0}

    def flaky(con, table, df):  # the third insert fails after two files went in
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("disk on fire")
        real(con, table, df)

    monkeypatch.setattr(store, "_insert_frame", flaky)
    with pytest.raises(RuntimeError, match="disk on fire"):
        store.ingest_path(paper_tree, store_path=db)
    assert counts(db) == before
    monkeypatch.setattr(store, "_insert_frame", real)
    assert store.ingest_path(paper_tree, store_path=db).files_ingested == 7  # res_add was already in


def test_own_op_samples_csv_and_parquet(tmp_path: Path) -> None:
    rows = pd.DataFrame({"platform": ["h100-sxm"] * 4, "op": ["qkv_proj", "swiglu", "rmsnorm", "bogus"],
                         "pass": ["fwd", "bwd", "step", "fwd"], "tp": [2, 2, None, 1], "batch": [1, 2, 1, 1],
                         "seq": [4096] * 4, "hidden": [8192] * 4, "heads": [64, None, None, None],
                         "kv_heads": [8, None, None, None], "dtype": ["bf16"] * 4,
                         "duration_s": [1e-3, 2e-3, 3e-3, 4e-3], "source": ["bench run 1"] * 4,
                         "measured_at": ["2026-01-02T03:04:05Z"] * 4})
    csv = tmp_path / "own.csv"
    rows.to_csv(csv, index=False)
    parquet = tmp_path / "own.parquet"
    rows.assign(batch=[3, 3, 3, 3]).to_parquet(parquet)
    db = tmp_path / "s.duckdb"
    r1 = store.ingest_path(csv, store_path=db, licence="CC0")
    assert r1.rows_added["op_samples"] == 2 and r1.rows_rejected == 2
    assert any("unknown pass 'step' for op 'rmsnorm'" in e for e in r1.rejection_examples[str(csv)])
    assert any("unknown op 'bogus'" in e for e in r1.rejection_examples[str(csv)])
    r2 = store.ingest_path(parquet, store_path=db)
    assert r2.rows_added["op_samples"] == 2 and r2.files[0].kind == "op_samples"
    df = store.read_op_samples("h100-sxm", "qkv_proj", store_path=db)
    assert sorted(df["batch"]) == [1, 3] and (df["kv_heads"] == 8).all() and df["ffn_hidden"].isna().all()
    assert str(df["measured_at"].iloc[0]) == "2026-01-02 03:04:05"
    batches = store.list_batches(store_path=db)
    assert batches["licence"].iloc[0] == "CC0" and pd.isna(batches["licence"].iloc[1])
    assert set(batches["kind"]) == {"op_samples"}


def test_own_collectives_and_measured_runs(tmp_path: Path) -> None:
    coll = write(tmp_path / "coll.csv",
                 "platform,collective,message_bytes,ranks,nodes,gpus_per_node,dtype,duration_s,source,measured_at\n"
                 "h100-sxm,allreduce,1048576,8,1,8,bf16,0.0001,nccl-tests,\n"
                 "h100-sxm,broadcast,1048576,8,1,8,bf16,0.0001,nccl-tests,\n")
    cols = ("case_id,platform,arch,layers,hidden,heads,kv_heads,ffn_hidden,vocab,seq_len,num_gpus,tp,pp,dp,"
            "micro_batch,global_batch,vpp,schedule,recompute,sequence_parallel,zero_stage,precision,step_time_s\n")
    runs = write(tmp_path / "runs.csv", cols +
                 "a,h100-sxm,llama,32,4096,32,8,14336,128256,4096,8,2,2,2,1,16,1,1f1b,selective,true,1,bf16,1.25\n"
                 "b,h100-sxm,llama,32,4096,32,,,128256,4096,8,2,2,4,1,16,1,1f1b,none,false,0,bf16,1.0\n")
    db = tmp_path / "s.duckdb"
    assert store.ingest_path(coll, store_path=db).rows_rejected == 1
    report = store.ingest_path(runs, store_path=db)
    assert report.rows_added["measured_runs"] == 1
    assert "tp*pp*dp" in report.rejection_examples[str(runs)][0]
    run = store.read_measured_runs("h100-sxm", store_path=db).iloc[0]
    assert (run["run_id"], run["ffn_hidden"], bool(run["sequence_parallel"]), run["step_time_s"]) == \
        ("a", 14336, True, 1.25)
    assert store.read_collective_samples(store_path=db)["message_bytes"].tolist() == [1048576]


def test_vtrain_file_with_bom(tmp_path: Path) -> None:
    text = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
            "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n"
            "2,16,8,1024,16,24,1024,1,1,2,372.160408\n8,32,4,1024,16,24,1024,2,2,2,219.732754\n")
    f = write(tmp_path / "vtrain" / "ground_truth_single.csv", text, encoding="utf-8-sig")
    assert f.read_bytes().startswith(b"\xef\xbb\xbf")
    db = tmp_path / "s.duckdb"
    report = store.ingest_path(f, store_path=db)
    assert report.files[0].kind == "vtrain" and report.rows_added["measured_runs"] == 2
    runs = store.read_measured_runs("dgx-a100-80gb", store_path=db)
    r = runs.iloc[1]
    assert (r["num_gpus"], r["tp"], r["dp"], r["pp"], r["global_batch"], r["micro_batch"]) == (8, 2, 2, 2, 32, 4)
    assert (r["arch"], r["vocab"], r["ffn_hidden"], r["kv_heads"], r["recompute"], r["schedule"]) == \
        ("gpt", 50257, 4096, 16, "full", "1f1b")
    assert (r["precision"], r["zero_stage"], bool(r["sequence_parallel"]), r["vpp"]) == ("fp16", 0, False, 1)
    assert math.isclose(r["step_time_s"], 0.219732754)
    assert r["source"] == "VIA-Research/vTrain:vtrain/ground_truth_single.csv"


def test_manifest_directory_gives_platform_source_and_licence(tmp_path: Path) -> None:
    d = tmp_path / "bench-out"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"platform": "h200-sxm", "source": "bench@abc123",
                                                 "licence": "Apache-2.0"}))
    pd.DataFrame({"op": ["layernorm"], "pass": ["fwd"], "batch": [1], "seq": [2048], "hidden": [4096],
                  "dtype": ["bf16"], "duration_s": [5e-5]}).to_parquet(d / "layernorm.parquet")
    db = tmp_path / "s.duckdb"
    report = store.ingest_path(d, store_path=db)
    assert report.files_ingested == 1
    s = store.read_op_samples("h200-sxm", store_path=db)
    assert s["source"].tolist() == ["bench@abc123"]
    assert store.list_batches(store_path=db)["licence"].tolist() == ["Apache-2.0"]


def test_read_only_connect_on_missing_store_explains(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "s.duckdb"
    with pytest.raises(store.StoreError, match="python -m predictor ingest"), store.connect(missing, read_only=True):
        pass
    with pytest.raises(store.StoreError):
        store.read_op_samples(store_path=missing)
    assert not missing.exists()


def test_second_writer_waits_then_fails_clearly(paper_tree: Path, tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    fd = os.open(str(db) + ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(store.StoreError, match="another process is writing"):
            store.ingest_path(paper_tree, store_path=db, timeout_s=0.3)
    finally:
        os.close(fd)
    assert store.ingest_path(paper_tree, store_path=db).files_ingested == 8


def test_default_store_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(store.ENV_STORE, raising=False)
    assert store.default_store_path() == Path(store.__file__).resolve().parents[2] / "data" / "samples.duckdb"
    monkeypatch.setenv(store.ENV_STORE, str(tmp_path / "x.duckdb"))
    assert store.default_store_path() == tmp_path / "x.duckdb"


def test_stage_params_follow_model_spec() -> None:
    h, layers = 4096, 8
    assert paper_stage_params(h, layers, 1, "middle") == layers * (12 * h * h + 13 * h)
    assert paper_stage_params(h, layers, 4, "last") == \
        layers * (3 * h * h + 13 * h) + padded_vocab(50257, 4) * h // 4 + 2 * h


@pytest.mark.skipif(not (SHARED / "paper-samples").is_dir(), reason="../shared/datasets is not present")
def test_real_paper_samples_ingest(tmp_path: Path) -> None:
    from predictor.model.ops import OPS

    db = tmp_path / "s.duckdb"
    report = store.ingest_path(SHARED / "paper-samples", store_path=db)
    assert report.ok and report.rows_rejected == 0
    assert report.rows_added["op_samples"] > 100_000 and report.rows_added["collective_samples"] > 30_000
    summary = store.summarize(store_path=db)
    paper_ops = {o.name for o in OPS.values() if o.paper_name}
    for platform in ("perlmutter-a100", "vista-gh200"):
        have = set(summary.loc[(summary["platform"] == platform) & (summary["kind"] == "op"), "op"])
        assert have == paper_ops, platform
    # the known outliers are kept, not rejected
    assert store.read_op_samples("vista-gh200", "optimizer", store_path=db)["duration_s"].max() > 50


# --------------------------------------------------------------------------- trustworthy ingest

OP_COLUMNS = ["platform", "op", "pass", "tp", "batch", "seq", "hidden", "heads", "variant", "dtype", "duration_s",
              "source"]


def op_frame(n: int = 12) -> pd.DataFrame:
    """Own-schema op samples with distinct shapes (and one legitimate repeat of a measurement)."""
    rows = []
    for i in range(n):
        rows.append({"platform": "h100-sxm", "op": ["layernorm", "qkv_proj", "res_add"][i % 3],
                     "pass": ["fwd", "bwd"][i % 2], "tp": 1 if i % 3 != 1 else 2, "batch": 1 + i % 4,
                     "seq": 2048, "hidden": 4096 + 512 * (i // 4), "heads": 32 if i % 3 == 1 else None,
                     "variant": None, "dtype": "bf16", "duration_s": 1.25e-05 * (i + 1) + 3.3e-07 * i,
                     "source": "bench run 7"})
    rows.append(dict(rows[0]))  # the same shape measured twice with the same time: kept twice
    return pd.DataFrame(rows, columns=OP_COLUMNS)


def snapshot(db: Path) -> dict[str, pd.DataFrame]:
    """Every table of the store, fully, in a canonical order."""
    with store.connect(db, read_only=True) as con:
        tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()]
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").df() for t in sorted(tables)}


def same_snapshot(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> bool:
    return a.keys() == b.keys() and all(a[t].equals(b[t]) for t in a)


def test_same_samples_in_another_format_or_order_add_nothing(tmp_path: Path) -> None:
    df = op_frame()
    first = tmp_path / "a" / "ops.csv"
    first.parent.mkdir()
    df.to_csv(first, index=False)
    db = tmp_path / "s.duckdb"
    r1 = store.ingest_path(first, store_path=db)
    assert r1.rows_added["op_samples"] == 13 and r1.rows_duplicate == 0  # the in-file repeat is kept
    before = snapshot(db)
    rng = np.random.default_rng(7)
    shuffled = df.sample(frac=1.0, random_state=3)[list(rng.permutation(OP_COLUMNS))]
    pq_path = tmp_path / "b" / "ops.parquet"
    pq_path.parent.mkdir()
    shuffled.to_parquet(pq_path, index=False)
    crlf = tmp_path / "c" / "ops.csv"
    crlf.parent.mkdir()
    crlf.write_bytes(shuffled.iloc[::-1].to_csv(index=False).replace("\n", "\r\n").encode())
    for path in (pq_path, crlf):
        rep = store.ingest_path(path, store_path=db)
        (f,) = rep.files
        assert (f.status, sum(rep.rows_added.values()), rep.rows_duplicate, rep.rows_rejected) == \
            ("duplicate", 0, 13, 0), rep.to_text()
        assert "already in the store" in rep.to_text()
    after = snapshot(db)
    for t in before:
        if t != "batches":  # the batches table keeps the provenance of every file seen
            assert after[t].equals(before[t]), t
    assert len(after["batches"]) == 3 and after["batches"]["rows_duplicate"].fillna(0).tolist().count(13) == 2
    # a fourth export with one genuinely new row adds exactly that row
    extra = pd.concat([df, df.iloc[[1]].assign(duration_s=9.99e-05)], ignore_index=True)
    extra.to_csv(tmp_path / "d.csv", index=False)
    rep = store.ingest_path(tmp_path / "d.csv", store_path=db)
    assert rep.rows_added["op_samples"] == 1 and rep.rows_duplicate == 13


def test_an_old_store_gets_row_keys_before_deduplicating(tmp_path: Path) -> None:
    df = op_frame()
    df.to_csv(tmp_path / "ops.csv", index=False)
    db = tmp_path / "s.duckdb"
    store.ingest_path(tmp_path / "ops.csv", store_path=db)
    with store.connect(db) as con:  # a store written before row keys existed
        con.execute("UPDATE op_samples SET row_key = NULL")
    df.sample(frac=1.0, random_state=1).to_parquet(tmp_path / "ops.parquet", index=False)
    rep = store.ingest_path(tmp_path / "ops.parquet", store_path=db)
    assert sum(rep.rows_added.values()) == 0 and rep.rows_duplicate == 13
    with store.connect(db, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM op_samples WHERE row_key IS NULL").fetchone()[0] == 0


def test_several_paths_are_one_transaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    op_frame().iloc[:6].to_csv(a, index=False)
    op_frame().iloc[6:].to_csv(b, index=False)
    db = tmp_path / "s.duckdb"
    store.ingest_path(tmp_path / "a.csv", store_path=db)  # the store holds a already
    c = tmp_path / "c.csv"
    op_frame().assign(platform="other-gpu").to_csv(c, index=False)
    before = snapshot(db)
    real, calls = store._insert_frame, {"n": 0}

    def flaky(con, table, df):  # c goes in, then b fails
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("disk on fire")
        real(con, table, df)
    monkeypatch.setattr(store, "_insert_frame", flaky)
    with pytest.raises(RuntimeError, match="disk on fire"):
        store.ingest_path([c, a, b], store_path=db)
    assert same_snapshot(snapshot(db), before)
    monkeypatch.setattr(store, "_insert_frame", real)
    rep = store.ingest_path([c, a, b], store_path=db)
    assert [f.status for f in rep.files] == ["ingested", "already ingested", "ingested"]
    assert rep.root == f"{c}, {a}, {b}"


def test_truncated_last_line_is_rejected_with_its_line_number(tmp_path: Path) -> None:
    head = "platform,op,pass,batch,seq,hidden,dtype,duration_s\n"
    ok = "x,layernorm,fwd,1,2048,4096,bf16,4.12e-05\nx,layernorm,fwd,2,2048,4096,bf16,8.31e-05\n"
    db = tmp_path / "s.duckdb"
    cases = {  # the last line was cut: where the file would end
        "exponent_cut.csv": (head + ok + "x,layernorm,fwd,4,2048,4096,bf16,4.22835", "looks cut"),
        "fields_cut.csv": (head + ok + "x,layernorm,fwd,4,2048", "5 of 8 fields"),
        "value_cut.csv": (head + ok + "x,layernorm,fwd,4,2048,4096,bf16,4.2e-", "not a number"),
        "quote_cut.csv": (head + ok + 'x,layernorm,fwd,4,2048,4096,"bf1', "inside a quoted field"),
    }
    for name, (text, why) in cases.items():
        f = write(tmp_path / name, text)
        rep = store.ingest_path(f, store_path=tmp_path / f"{name}.duckdb")
        assert rep.rows_added["op_samples"] == 2 and rep.rows_rejected == 1, (name, rep.to_text())
        (example,) = rep.rejection_examples[str(f)]
        assert example.startswith("line 4:") and why in example, (name, example)
        assert set(rep.rejected_by_reason) == {"truncated last line"}, name
    # the same line ending with a newline is complete: nothing to reject
    f = write(tmp_path / "complete.csv", head + ok + "x,layernorm,fwd,4,2048,4096,bf16,4.22835\n")
    assert store.ingest_path(f, store_path=db).rows_rejected == 0
    # not detectable: a cut that leaves a value written like its neighbours is kept (documented)
    f = write(tmp_path / "undetectable.csv", head + "x,res_add,fwd,1,2048,4096,bf16,4.12e-05\n"
              "x,res_add,fwd,2,2048,4096,bf16,8.31e-05\nx,res_add,fwd,4,2048,4096,bf16,1.23e-05")
    assert store.ingest_path(f, store_path=db).rows_rejected == 0


def test_bad_rows_in_the_middle_are_rejected_alone_with_counted_reasons(tmp_path: Path) -> None:
    f = write(tmp_path / "ops.csv",
              "platform,op,pass,batch,seq,hidden,dtype,duration_s\n"
              "x,layernorm,fwd,1,2048,4096,bf16,4.1e-05\n"
              "x,layernorm,fwd,2,2048,4096,bf16,nan\n"
              "x,layernorm,fwd,3,2048,4096,bf16,inf\n"
              "x,layernorm,fwd,4,2048,4096,bf16,-1e-05\n"
              "x,layernorm,fwd,5,2048,4096,bf16,0\n"
              "x,layernorm,fwd,6,2048,4096,bf16,4.1e-05,extra\n"
              "\n"
              "x,layernorm,fwd,7,2048,4096,bf16,\n"
              "x,layernorm,fwd,8,2048,4096,bf16,fast\n"
              "x,layernorm,fwd,9,2048,4096,bf16,5.5e-05\n")
    db = tmp_path / "s.duckdb"
    rep = store.ingest_path(f, store_path=db, max_examples=10)
    assert rep.rows_added["op_samples"] == 2 and rep.rows_rejected == 7
    assert rep.rejected_by_reason == {"duration not finite": 2, "duration not positive": 2,
                                      "duration missing": 1, "duration not a number": 1,
                                      "wrong number of fields": 1}
    ex = rep.rejection_examples[str(f)]
    assert "line 3: duration_s=nan is not finite" in ex and "line 6: duration_s=0 is not positive" in ex
    assert "line 7: has 9 fields, the header has 8" in ex and "line 9: duration_s is missing" in ex  # line 8 blank
    text = rep.to_text()
    assert "rows rejected by reason: duration not finite 2, duration not positive 2" in text


@pytest.mark.parametrize("name,content,message", [
    ("empty.csv", b"", "empty file (0 bytes)"),
    ("blank.csv", b"\n\n  \n", "empty file"),
    ("header_only.csv", b"platform,op,pass,dtype,duration_s\n",
     "has a header (platform, op, pass, dtype, duration_s) but no data rows"),
    ("latin1.csv", "platform,op,pass,dtype,duration_s\nx,layernorm,fwd,bf16,1e-05\nnaïve,layernorm,fwd,bf16,1e-05\n"
     .encode("latin-1"), "not UTF-8 text: byte 0xef at line 3"),
    ("unknown.csv", b"a,b,c\n1,2,3\n", "unrecognised format: columns (a, b, c) match no known layout"),
    ("lists.parquet", None, "column 'op' holds list<element: string> values"),
    ("no_rows.parquet", None, "no rows"),
])
def test_files_that_used_to_crash_give_a_clear_message(tmp_path: Path, name: str, content: bytes | None,
                                                       message: str) -> None:
    f = tmp_path / name
    if name == "lists.parquet":
        pd.DataFrame({"platform": ["x"], "op": [["layernorm", "res_add"]], "pass": ["fwd"], "dtype": ["bf16"],
                      "duration_s": [1e-5]}).to_parquet(f)
    elif name == "no_rows.parquet":
        pd.DataFrame({"platform": [], "op": [], "pass": [], "dtype": [], "duration_s": []}).to_parquet(f)
    else:
        f.write_bytes(content)
    db = tmp_path / "s.duckdb"
    rep = store.ingest_path(f, store_path=db)
    (outcome,) = rep.files
    assert outcome.status == "rejected" and message in outcome.reason, outcome.reason
    assert not rep.clean and f.name in rep.to_text()


def test_a_folder_with_nothing_ingestible_is_said_so_and_the_store_is_not_touched(tmp_path: Path) -> None:
    d = tmp_path / "notes"
    d.mkdir()
    (d / "readme.txt").write_text("hello")
    write(d / "sub" / "table.csv", "a,b\n1,2\n")
    db = tmp_path / "s.duckdb"
    rep = store.ingest_path(d, store_path=db)
    assert rep.nothing_ingestible and not rep.clean and rep.ignored_files == 1
    assert rep.files[0].status == "skipped" and "unrecognised format" in rep.files[0].reason
    assert "nothing ingestible under" in rep.to_text() and not db.exists()


def test_cli_exit_status_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from predictor.cli import main as cli
    good = tmp_path / "good.csv"
    op_frame().to_csv(good, index=False)
    bad = write(tmp_path / "bad.csv", "platform,op,pass,batch,seq,hidden,dtype,duration_s\n"
                "x,layernorm,fwd,1,2048,4096,bf16,4.1e-05\nx,layernorm,fwd,2,2048,4096,bf16,-3\n")
    db = str(tmp_path / "s.duckdb")
    assert cli.main(["ingest", "--quiet", "--store", db, str(good)]) == 0
    assert cli.main(["ingest", "--quiet", "--store", db, str(good)]) == 0  # already ingested is fine
    assert cli.main(["ingest", "--quiet", "--store", db, str(bad)]) == 2
    out = capsys.readouterr().out
    assert "rows rejected by reason: duration not positive 1" in out and "line 3: duration_s=-3 is not positive" in out
    assert cli.main(["ingest", "--quiet", "--store", db, str(tmp_path / "missing")]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["ingest", "--quiet", "--store", db, str(empty)]) == 2
    assert "nothing ingestible" in capsys.readouterr().out


def test_ctrl_c_inside_the_transaction_commits_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from predictor.cli import main as cli
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    op_frame().iloc[:6].to_csv(a, index=False)
    op_frame().iloc[6:].to_csv(b, index=False)
    db = tmp_path / "s.duckdb"
    store.ingest_path(write(tmp_path / "ops0.csv", "platform,op,pass,dtype,duration_s\ny,layernorm,fwd,bf16,1e-05\n"),
                      store_path=db)
    before = snapshot(db)
    real, calls = store._insert_frame, {"n": 0}

    def interrupted(con, table, df):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        real(con, table, df)
    monkeypatch.setattr(store, "_insert_frame", interrupted)
    assert cli.main(["ingest", "--store", str(db), str(a), str(b)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "interrupted; nothing was committed (the store is as it was)"
    assert not any("Traceback" in line for line in err)
    assert same_snapshot(snapshot(db), before)
    monkeypatch.setattr(store, "_insert_frame", real)
    assert cli.main(["ingest", "--quiet", "--store", str(db), str(a), str(b)]) == 0

"""Published multi-node runs (llm-foundry, BLOOM) as measured runs: definitions, checks, counts."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from predictor.cli import main as cli
from predictor.hardware import platforms as P
from predictor.model.errors import InfeasibleConfig
from predictor.model.frameworks import FRAMEWORKS
from predictor.samples import store
from predictor.samples.formats import sources
from predictor.samples.formats.common import PUBLISHED_COLUMNS, SourceDefinitionError
from predictor.samples.formats.published import megatron_tflops
from predictor.samples.formats.sources import PUBLISHED_SOURCES_FILE, load_source_definitions

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
PUBLISHED = SHARED / "published-runs"
needs_shared = pytest.mark.skipif(not PUBLISHED.is_dir(), reason="../shared/datasets/published-runs is not present")

FOUNDRY_SRC = ("mosaicml/llm-foundry@8c8dd48f72 scripts/train/benchmarking/README.md section "
               "'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'")
BLOOM_SRC = ("bigscience-workshop/bigscience@9e64edec2a train/tr11-176B-ml/chronicles-prequel.md "
             "(table in section 'Rebalancing layers')")
BLOOM_NOTES = ("section='Rebalancing layers'; date=02-28; TFLOPs={tf}; Mem=40GB; Sec/it snapshot at iteration 2 "
               "(not steady-state); JZ cluster: A100 80GB, 8 GPUs/node, NVLink intra-node, Omni-Path (4 links/node) "
               "inter-node; Megatron-DeepSpeed, ZeRO-1; vocab 250k (250,880 padded); seq 2048; TFLOPs reported by "
               "Megatron-DeepSpeed counts activation recompute (4x fwd factor, README 'Throughput')")


def foundry_row(**over) -> dict:
    row = {"source": FOUNDRY_SRC, "model_name": "MPT-7b", "params_b": 6.659, "layers": 32, "hidden": 4096,
           "heads": 32, "ffn_hidden": 16384, "seq_len": 2048, "vocab": 50368, "gpu": "A100 80GB", "num_gpus": 16,
           "gpus_per_node": 8, "tp": 1, "pp": 1, "dp": 16, "cp": None, "ep": None, "vpp": None, "micro_batch": 6,
           "global_batch": 192, "recompute": "none", "precision": "amp_bf16", "measured_metric": "tokens_per_sec",
           "measured_value": 74260.0, "unit": "tokens/s (all GPUs)",
           "notes": "FSDP sharding=FULL_SHARD; GradAccum=2; MFU=64.0; HFU=64.0; derived_step_time_s=5.295"}
    row.update(over)
    return row


def bloom_row(**over) -> dict:
    row = {"source": BLOOM_SRC, "model_name": "BLOOM-prequel 176B candidate", "params_b": 176.0, "layers": 70,
           "hidden": 14336, "heads": 64, "ffn_hidden": None, "seq_len": 2048, "vocab": 250000,
           "gpu": "A100 SXM 80GB", "num_gpus": 384, "gpus_per_node": 8, "tp": 8, "pp": 12, "dp": 4, "cp": None,
           "ep": None, "vpp": None, "micro_batch": 2, "global_batch": 2048,
           "recompute": None, "precision": "bf16 (BF16 optimizer, fp32 grad accumulation)",
           "measured_metric": "iteration_time", "measured_value": 121.63, "unit": "s",
           "notes": BLOOM_NOTES.format(tf="128.92")}
    row.update(over)
    return row


def write_rows(path: Path, rows: list[dict]) -> Path:
    pd.DataFrame(rows, columns=list(PUBLISHED_COLUMNS)).to_csv(path, index=False)
    return path


def left_out(rep: store.IngestReport) -> list[dict]:
    with store.connect(rep.store, read_only=True) as con:
        return store.read_run_rejections(con=con).to_dict(orient="records")


# --------------------------------------------------------------------------- the real files

@needs_shared
def test_both_published_files_ingest_with_counted_skips(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    rep = store.ingest_path(PUBLISHED, store_path=db)
    assert rep.clean and rep.files_ingested == 2, rep.to_text()
    s = rep.sources
    assert (s["llm-foundry"]["ingested"], s["llm-foundry"]["skipped"], s["llm-foundry"]["rejected"]) == (139, {}, {})
    assert s["bigscience-bloom"]["ingested"] == 20 and s["bigscience-bloom"]["rejected"] == {}
    assert s["bigscience-bloom"]["skipped"] == {"precision not stated": 84,
                                               "layers, hidden, heads, precision not stated": 20,
                                               "layers, heads, precision not stated": 5,
                                               "dp, precision not stated": 3}
    counts = store.run_rejection_counts(store_path=db)
    assert counts["rows"].sum() == 112 and set(counts["outcome"]) == {"skipped"}
    runs = store.read_measured_runs(store_path=db)
    assert runs.groupby("platform").size().to_dict() == {"jean-zay-a100-80gb": 20, "mosaicml-a100-40gb": 78,
                                                         "mosaicml-a100-80gb": 61}
    assert set(runs["framework"]) == {"fsdp", "megatron-deepspeed"}
    # MPT-70b on 64 GPUs: global_batch * seq_len / tokens_per_sec = 2048 * 2048 / 26274
    r = runs.set_index("run_id").loc["llm_foundry_a100:2"]
    assert math.isclose(r["step_time_s"], 2048 * 2048 / 26274, rel_tol=1e-12)
    assert math.isclose(r["step_time_s"], 159.637, rel_tol=1e-5)
    assert (r["platform"], r["dp"], r["tp"], r["pp"], r["zero_stage"], r["micro_batch"], r["recompute"],
            r["precision"], r["attention"], r["kv_heads"]) == \
        ("mosaicml-a100-80gb", 64, 1, 1, 3, 8, "full", "bf16", "triton", 64)
    assert "GradAccum=4 = global_batch/(micro_batch*dp) checked" in r["notes"]
    # BLOOM's 20B test model on one node, fp16: the iteration time as reported
    b = runs.set_index("run_id").loc["bigscience_176b_a100:2"]
    assert (b["step_time_s"], b["precision"], b["zero_stage"], b["recompute"], b["vocab"], b["ffn_hidden"],
            b["attention"], b["schedule"]) == (769.99, "fp16", 1, "full", 250880, 4 * 14400, "unfused", "1f1b")
    assert "pre-PR-251 estimate" in b["notes"] and "iteration 2 snapshot" in b["notes"]
    # the rows skipped are kept with their line and reason
    skipped = store.read_run_rejections("bigscience-bloom", store_path=db).set_index("line")
    assert skipped.loc[8, "reason"] == "layers, hidden, heads, precision not stated"
    assert skipped.loc[45, "reason"] == "dp, precision not stated"
    assert skipped.loc[33, "reason"] == "precision not stated"


@needs_shared
def test_published_reingest_and_reexport_add_nothing(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    store.ingest_path(PUBLISHED, store_path=db)
    again = store.ingest_path(PUBLISHED, store_path=db)
    assert sum(again.rows_added.values()) == 0 and {f.status for f in again.files} == {"already ingested"}
    assert again.sources["llm-foundry"]["ingested"] == 139 and again.sources["llm-foundry"]["previously"]
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in PUBLISHED.glob("*.csv"):  # the same rows, shuffled, CRLF line endings
        df = pd.read_csv(f, dtype=str).sample(frac=1.0, random_state=5)
        (copy / f.name).write_bytes(df.to_csv(index=False).replace("\n", "\r\n").encode())
    rep = store.ingest_path(copy, store_path=db)
    assert sum(rep.rows_added.values()) == 0 and rep.rows_duplicate == 159
    assert len(store.read_measured_runs(store_path=db)) == 159


@needs_shared
def test_cli_ingests_published_runs_and_prints_per_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ingest", "--quiet", "--store", str(tmp_path / "s.duckdb"), str(PUBLISHED)]) == 0
    out = capsys.readouterr().out
    assert "  llm-foundry: ingested 139; skipped 0; rejected 0" in out
    assert "  bigscience-bloom: ingested 20; skipped 112 (precision not stated 84," in out


# --------------------------------------------------------------------------- rules on generated rows

def test_foundry_rows_are_checked_against_their_own_numbers(tmp_path: Path) -> None:
    f = write_rows(tmp_path / "foundry.csv", [
        foundry_row(),
        foundry_row(global_batch=240, notes="FSDP sharding=FULL_SHARD; GradAccum=2"),           # 240 != 2*6*16
        foundry_row(dp=8),                                                                     # dp != num_gpus
        foundry_row(recompute="full (activation checkpointing)"),                              # HFU == MFU
        foundry_row(layers=None),
        foundry_row(gpu="A100 96GB"),
        foundry_row(measured_value=7.4e4, notes="FSDP sharding=FULL_SHARD; GradAccum=2; derived_step_time_s=9.9"),
        foundry_row(num_gpus=32, dp=32, global_batch=384, notes="FSDP sharding=FULL_SHARD; GradAccum=2"),  # 4 nodes
    ])
    db = tmp_path / "s.duckdb"
    rep = store.ingest_path(f, store_path=db)
    src = rep.sources["llm-foundry"]
    assert src["ingested"] == 2 and src["skipped"] == {"layers not stated": 1}
    assert src["rejected"] == {"contradictory: GradAccum": 1, "contradictory layout: dp": 1,
                               "contradictory: recompute vs HFU/MFU": 1, "gpu without a platform": 1,
                               "contradictory: step time": 1}
    details = {r["line"]: r["detail"] for r in left_out(rep)}
    assert details[3] == "GradAccum=2 but global_batch/(micro_batch*dp) = 240/(6*16) = 2.5"
    assert "dp=8 but FSDP FULL_SHARD over 16 GPUs has dp = num_gpus" in details[4]
    assert "recompute=full expects HFU/MFU = 1.333" in details[5]
    assert "'A100 96GB' is not mapped" in details[7]
    assert not rep.clean and rep.rows_rejected == 5 and rep.rows_skipped == 1
    run = store.read_measured_runs(store_path=db).iloc[0]
    assert math.isclose(run["step_time_s"], 192 * 2048 / 74260.0) and run["source_id"] == "llm-foundry"


def test_bloom_rows_need_stated_facts_and_matching_tflops(tmp_path: Path) -> None:
    f = write_rows(tmp_path / "bloom.csv", [
        bloom_row(),
        bloom_row(precision=None, source=BLOOM_SRC.replace("Rebalancing layers", "GBS Variations")),
        bloom_row(dp=8),                                               # 8*12*8 = 768 != 384 GPUs
        bloom_row(notes=BLOOM_NOTES.format(tf="96.69")),               # = factor 3: contradicts the notes
        bloom_row(notes=BLOOM_NOTES.format(tf="110.00")),              # matches nothing
        bloom_row(notes=BLOOM_NOTES.format(tf="128.92") + "; ZeRO_stage=0"),
        bloom_row(heads=None, layers=None),
        bloom_row(notes=BLOOM_NOTES.format(tf="128.92").replace(" (250,880 padded)", " (250,368 padded)")),
    ])
    db = tmp_path / "s.duckdb"
    rep = store.ingest_path(f, store_path=db)
    src = rep.sources["bigscience-bloom"]
    assert src["ingested"] == 2
    assert src["skipped"] == {"precision not stated": 1, "layers, heads not stated": 1}
    assert src["rejected"] == {"contradictory layout: num_gpus": 1, "contradictory: recompute vs TFLOPs": 1,
                               "recompute not verified by the reported TFLOPs": 1, "contradictory: vocab": 1}
    details = {r["line"]: r["detail"] for r in left_out(rep)}
    assert details[4].startswith("num_gpus: tp*pp*dp = 8*12*8 = 768 but num_gpus = 384")
    assert "factor 3" in details[5] and "reported TFLOPs=110" in details[6]
    runs = store.read_measured_runs(store_path=db)
    assert runs["zero_stage"].tolist() == [1, 0] and set(runs["precision"]) == {"bf16"}
    assert (runs["vocab"] == 250880).all() and (runs["ffn_hidden"] == 4 * 14336).all()


def test_megatron_tflops_formula_reproduces_a_reported_value() -> None:
    # 48 node contenders, 181B: 72 layers x 14336, 384 GPUs, GBS 2048, 123.69 s/it -> 130.34 TFLOPs reported
    t = megatron_tflops(2048, 2048, 72, 14336, 250880, 123.69, 384, 4)
    assert t == pytest.approx(130.34, rel=2e-4)
    assert megatron_tflops(2048, 2048, 72, 14336, 250880, 123.69, 384, 3) == pytest.approx(0.75 * t)
    # the pre-PR-251 estimate (no attention / logit term) of the 20B test model: 769.99 s -> 108.47
    assert megatron_tflops(2048, 2048, 8, 14400, 250880, 769.99, 8, 4, corrected=False) == \
        pytest.approx(108.47, rel=1e-3)


def test_unknown_framework_is_a_clear_error_and_nothing_is_ingested(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    defs = json.loads(PUBLISHED_SOURCES_FILE.read_text())
    defs["sources"]["llm-foundry"]["framework"] = "jax"
    bad = tmp_path / "published_sources.json"
    bad.write_text(json.dumps(defs))
    monkeypatch.setattr(sources, "PUBLISHED_SOURCES_FILE", bad)
    with pytest.raises(SourceDefinitionError) as e:
        load_source_definitions()
    assert str(e.value) == ("published_sources.json: sources.llm-foundry.framework: unknown framework 'jax'; "
                            "valid: megatron, megatron-deepspeed, deepspeed, fsdp, ddp")
    ops_csv = tmp_path / "ops.csv"
    ops_csv.write_text("platform,op,pass,dtype,duration_s\nx,layernorm,fwd,bf16,1e-05\n")
    f = write_rows(tmp_path / "foundry.csv", [foundry_row()])
    db = tmp_path / "s.duckdb"
    assert cli.main(["ingest", "--quiet", "--store", str(db), str(ops_csv), str(f)]) == 2
    err = capsys.readouterr().err
    assert "unknown framework 'jax'" in err and "nothing was ingested" in err
    with store.connect(db, read_only=True) as con:  # the op samples of the first file were rolled back too
        assert con.execute("SELECT count(*) FROM op_samples").fetchone()[0] == 0


def test_measured_runs_csv_with_an_unknown_framework_rejects_the_row(tmp_path: Path) -> None:
    f = tmp_path / "runs.csv"
    f.write_text("case_id,platform,arch,layers,hidden,heads,num_gpus,dp,micro_batch,global_batch,step_time_s,"
                 "framework,source\n"
                 "a,my-gpu,gpt,2,256,4,2,2,1,2,0.5,ddp,my bench\n"
                 "b,my-gpu,gpt,2,256,4,2,2,1,2,0.6,horovod,my bench\n"
                 "c,cpu-2t,gpt,2,256,4,1,1,1,1,0.7,,tests/benchmarks/cpu_end_to_end.py (HF transformers)\n")
    rep = store.ingest_path(f, store_path=tmp_path / "s.duckdb")
    assert rep.rows_added["measured_runs"] == 2 and rep.rejected_by_reason == {"contradictory or invalid: framework": 1}
    assert "unknown framework 'horovod'. Fix: use one of megatron, megatron-deepspeed, deepspeed, fsdp, ddp." in \
        rep.rejection_examples[str(f)][0]
    runs = store.read_measured_runs(store_path=tmp_path / "s.duckdb")
    assert runs[["platform", "framework", "source_id"]].values.tolist() == [["cpu-2t", "ddp", "cpu-hf"],
                                                                            ["my-gpu", "ddp", "local:runs"]]


def test_vtrain_rows_get_their_source_and_framework(tmp_path: Path) -> None:
    text = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
            "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n"
            "2,16,8,1024,16,24,1024,1,1,2,372.160408\n")
    f = tmp_path / "vtrain" / "ground_truth_single.csv"
    f.parent.mkdir()
    f.write_text(text)
    store.ingest_path(f, store_path=tmp_path / "s.duckdb")
    run = store.read_measured_runs(store_path=tmp_path / "s.duckdb").iloc[0]
    assert (run["source_id"], run["framework"]) == ("vtrain", "megatron-deepspeed")


# --------------------------------------------------------------------------- clusters

def catalog_copy(tmp_path: Path, edit) -> Path:
    d = tmp_path / "catalog"
    shutil.copytree(P.CATALOG_DIR, d)
    raw = json.loads((d / "clusters.json").read_text())
    edit(raw)
    (d / "clusters.json").write_text(json.dumps(raw))
    return d


@pytest.mark.parametrize("edit,field,problem", [
    (lambda raw: raw["jean-zay-a100-80gb"]["inter_node"].update(bandwidth_gbps=-6.25),
     "clusters.json:jean-zay-a100-80gb.inter_node.bandwidth_gbps", "must be >= 0"),
    (lambda raw: raw["jean-zay-a100-80gb"]["inter_node"].pop("bandwidth_gbps"),
     "clusters.json:jean-zay-a100-80gb.inter_node.bandwidth_gbps", "is missing or not positive"),
    (lambda raw: raw["jean-zay-a100-80gb"]["intra_node"].pop("bandwidth_gbps"),
     "clusters.json:jean-zay-a100-80gb.intra_node.bandwidth_gbps", "need an intra-node link bandwidth > 0"),
])
def test_a_bad_cluster_entry_stops_the_ingest_naming_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               edit, field: str, problem: str) -> None:
    monkeypatch.setattr(P, "CATALOG_DIR", catalog_copy(tmp_path, edit))
    P.load_devices.cache_clear()
    P.load_platforms.cache_clear()
    try:
        f = write_rows(tmp_path / "bloom.csv", [bloom_row()])
        g = write_rows(tmp_path / "foundry.csv", [foundry_row()])
        db = tmp_path / "s.duckdb"
        with pytest.raises(InfeasibleConfig) as e:
            store.ingest_path([g, f], store_path=db)
        assert e.value.field == field and problem in str(e.value)
        with store.connect(db, read_only=True) as con:  # the foundry file was rolled back with it
            assert con.execute("SELECT count(*) FROM measured_runs").fetchone()[0] == 0
    finally:
        P.load_devices.cache_clear()
        P.load_platforms.cache_clear()


def test_user_cluster_files_with_a_missing_or_negative_link_name_the_field(tmp_path: Path) -> None:
    for inter, problem in (({}, "is missing or not positive"), ({"bandwidth_gbps": -1}, "must be >= 0")):
        f = tmp_path / "mine.json"
        f.write_text(json.dumps({"c": {"device": "a100-sxm4-80gb", "gpus_per_node": 8,
                                       "intra_node": {"kind": "nvswitch", "bandwidth_gbps": 300},
                                       "inter_node": inter}}))
        with pytest.raises(InfeasibleConfig) as e:
            P.load_platforms(str(f))
        assert e.value.field == "mine.json:c.inter_node.bandwidth_gbps" and problem in str(e.value)


def test_published_clusters_state_their_network_consistently() -> None:
    raw = json.loads((P.CATALOG_DIR / "clusters.json").read_text())
    for pid in ("mosaicml-a100-40gb", "mosaicml-a100-80gb", "jean-zay-a100-80gb"):
        e, p = raw[pid], P.get_platform(pid)
        assert p.op_models == "perlmutter-a100" and p.collective_calibration == "dgx-a100-80gb" and p.sources
        assert e["node_network_gbps"] / 8 / p.gpus_per_node == p.inter_node.bandwidth_gbps  # Gb/s -> GB/s per GPU
        if e["nics_per_node"] is not None:
            assert e["nics_per_node"] * e["nic_gbps"] == e["node_network_gbps"]
    assert P.get_platform("jean-zay-a100-80gb").inter_node.bandwidth_gbps == 6.25
    assert P.get_platform("mosaicml-a100-80gb").inter_node.bandwidth_gbps == 25
    assert (raw["jean-zay-a100-80gb"]["nics_per_node"], raw["jean-zay-a100-80gb"]["nic_gbps"]) == (4, 100)


def test_source_definitions_cite_every_fact() -> None:
    defs = load_source_definitions()
    assert {d["framework"] for d in defs.values()} <= set(FRAMEWORKS)
    assert {sid: d["framework"] for sid, d in defs.items()} == {
        "llm-foundry": "fsdp", "bigscience-bloom": "megatron-deepspeed", "vtrain": "megatron-deepspeed",
        "cpu-hf": "ddp"}
    for sid, d in defs.items():
        for name, fact in (d.get("facts") or {}).items():
            assert fact["cite"].strip(), (sid, name)
        for pid in (d.get("platform_by_gpu") or {}).values():
            assert P.get_platform(pid).gpus_per_node == 8


def test_measured_runs_without_a_source_column_are_the_same_runs_in_any_format(tmp_path: Path) -> None:
    runs = pd.DataFrame({"case_id": ["a", "b"], "platform": ["my-gpu"] * 2, "arch": ["gpt"] * 2, "layers": [2, 4],
                         "hidden": [256, 256], "heads": [4, 4], "num_gpus": [2, 2], "dp": [2, 2],
                         "micro_batch": [1, 1], "global_batch": [2, 2], "step_time_s": [0.5, 0.75]})
    (tmp_path / "x").mkdir()
    runs.to_csv(tmp_path / "runs.csv", index=False)
    runs.iloc[::-1][list(reversed(runs.columns))].to_parquet(tmp_path / "x" / "runs.parquet", index=False)
    db = tmp_path / "s.duckdb"
    assert store.ingest_path(tmp_path / "runs.csv", store_path=db).rows_added["measured_runs"] == 2
    rep = store.ingest_path(tmp_path / "x" / "runs.parquet", store_path=db)
    assert rep.rows_added["measured_runs"] == 0 and rep.rows_duplicate == 2
    assert rep.sources == {"local:runs": {"ingested": 0, "duplicates": 2, "skipped": {}, "rejected": {},
                                          "previously": False}}

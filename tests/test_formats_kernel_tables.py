"""Ingest of published kernel tables: NVIDIA aiconfigurator collector trees and Liger-Kernel benchmark CSVs,
on tiny synthetic files."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from predictor.samples import store


def gemm_frame(**over) -> pd.DataFrame:
    d = {"framework": ["TRTLLM"] * 3, "version": ["1.0"] * 3, "device": ["NVIDIA H100 80GB HBM3"] * 3,
         "op_name": ["gemm"] * 3, "kernel_source": ["torch_flow"] * 3,
         "gemm_dtype": ["bfloat16", "bfloat16", "fp8"], "m": [128, 4096, 4096], "n": [4096, 4096, 8192],
         "k": [4096, 4096, 1024], "latency": [0.02, 0.25, 0.07]}
    d.update(over)
    return pd.DataFrame(d)


def tree(root: Path, gpu: str = "h100_sxm", table: str = "gemm", fw: str = "trtllm", ver: str = "1.0",
         frame: pd.DataFrame | None = None, name: str = "gemm_perf.parquet", system: bool = True) -> Path:
    d = root / gpu / table / fw / ver
    d.mkdir(parents=True, exist_ok=True)
    if system:
        (root / gpu / "system.yaml").write_text("gpu:\n  bfloat16_tc_flops: 989000000000000\n")
    f = d / name
    (gemm_frame() if frame is None else frame).to_parquet(f, index=False)
    return f


def test_gemm_table_maps_to_generic_gemm_rows_with_provenance(tmp_path: Path) -> None:
    f = tree(tmp_path / "aic")
    db = tmp_path / "s.duckdb"
    rep = store.ingest_path(tmp_path / "aic", store_path=db)
    assert rep.files_ingested == 1 and rep.rows_added["op_samples"] == 3
    g = store.read_op_samples("dgx-h100", "gemm", store_path=db).sort_values("duration_s")
    assert set(g["pass"]) == {"fwd"} and set(g["dtype"]) == {"bf16", "fp8"}
    big = g.iloc[-1]
    assert (big["seq"], big["hidden"], big["ffn_hidden"], big["tp"], big["batch"]) == (4096, 4096, 4096, 1, 1)
    assert math.isclose(big["duration_s"], 0.25e-3)
    assert "h100_sxm/gemm/trtllm/1.0" in big["source"] and big["variant"] == "trtllm/1.0"
    with store.connect(db, read_only=True) as con:
        notes, lic = con.execute("SELECT notes, licence FROM batches").fetchone()
    assert "forward only" in notes and lic == "Apache-2.0"
    again = store.ingest_path(f, store_path=db)  # idempotent
    assert sum(again.rows_added.values()) == 0 and again.files[0].status == "already ingested"


def test_power_monitored_gemm_table_says_so(tmp_path: Path) -> None:
    fr = gemm_frame(power=[600.0, 690.0, 695.0], power_limit=[700.0] * 3)
    tree(tmp_path / "aic", gpu="h200_sxm", fw="vllm", ver="0.22.0", frame=fr)
    db = tmp_path / "s.duckdb"
    store.ingest_path(tmp_path / "aic", store_path=db)
    g = store.read_op_samples("dgx-h200", "gemm", store_path=db)
    assert set(g["variant"]) == {"vllm/0.22.0:power-monitored"}
    with store.connect(db, read_only=True) as con:
        assert "power-monitored" in con.execute("SELECT notes FROM batches").fetchone()[0]


@pytest.mark.parametrize("frame, field", [
    (gemm_frame().drop(columns=["k"]), "k"),
    (gemm_frame(latency=[0.02, -0.25, 0.07]), "latency"),
    (gemm_frame(latency=[0.02, float("nan"), 0.07]), "latency"),
    (gemm_frame(gemm_dtype=["bfloat16", "int4_awq", "fp8"]), "gemm_dtype"),
])
def test_bad_gemm_table_is_rejected_whole_naming_file_and_field(tmp_path: Path, frame: pd.DataFrame,
                                                                field: str) -> None:
    f = tree(tmp_path / "aic", frame=frame)
    db = tmp_path / "s.duckdb"
    rep = store.ingest_path(f, store_path=db)
    (out,) = rep.files
    assert out.status == "rejected" and "gemm_perf.parquet" in out.reason and field in out.reason
    assert not sum(rep.rows_added.values())


def test_gpu_folder_without_system_yaml_is_rejected(tmp_path: Path) -> None:
    f = tree(tmp_path / "aic", system=False)
    rep = store.ingest_path(f, store_path=tmp_path / "s.duckdb")
    (out,) = rep.files
    assert out.status == "rejected" and "system.yaml" in out.reason and "h100_sxm" in out.reason


def test_unknown_gpu_folder_needs_a_platform(tmp_path: Path) -> None:
    f = tree(tmp_path / "aic", gpu="my_gpu")
    db = tmp_path / "s.duckdb"
    out = store.ingest_path(f, store_path=db).files[0]
    assert out.status == "rejected" and "--platform" in out.reason
    assert store.ingest_path(f, store_path=db, platform="my-cluster").files_ingested == 1
    assert len(store.read_op_samples("my-cluster", "gemm", store_path=db)) == 3


def test_attention_and_comm_tables(tmp_path: Path) -> None:
    att = pd.DataFrame({"batch_size": [2, 2, 2, 1], "isl": [4096, 4096, 4096, 8192], "num_heads": [32] * 4,
                        "num_key_value_heads": [8] * 4, "head_dim": [128] * 4, "window_size": [0, 0, 128, 0],
                        "beam_width": [1] * 4, "attn_dtype": ["bfloat16", "bfloat16", "bfloat16", "fp8"],
                        "kv_cache_dtype": ["bfloat16", "fp8", "bfloat16", "fp8"], "step": [0] * 4,
                        "latency": [1.0, 0.9, 0.4, 1.5]})
    tree(tmp_path / "aic", table="attention", frame=att, name="context_attention_perf.parquet")
    comm = pd.DataFrame({"op_name": ["all_reduce", "all_gather"], "nccl_dtype": ["half", "half"], "num_gpus": [8, 4],
                         "message_size": [1024, 2048], "latency": [0.01, 0.02]})
    tree(tmp_path / "aic", table="comm", fw="nccl", frame=comm, name="nccl_perf.parquet")
    moe = pd.DataFrame({"moe_dtype": ["fp8"], "num_tokens": [1], "num_experts": [8], "latency": [0.1]})
    tree(tmp_path / "aic", table="moe", frame=moe, name="moe_perf.parquet")
    db = tmp_path / "s.duckdb"
    rep = store.ingest_path(tmp_path / "aic", store_path=db)
    assert rep.rows_added["op_samples"] == 3 and rep.rows_added["collective_samples"] == 2
    assert any("MoE" in why for _f, why in rep.files_skipped)
    assert "skipped rows in" in rep.to_text() and "window_size=128" in rep.to_text()  # the sliding-window row
    a = store.read_op_samples("dgx-h100", "flash_attn", store_path=db).set_index("dtype")
    assert sorted(a.index) == ["bf16", "bf16/kv-fp8", "fp8"]
    assert (a.loc["bf16", "hidden"], a.loc["bf16", "kv_heads"], a.loc["bf16", "seq"]) == (32 * 128, 8, 4096)
    c = store.read_collective_samples("dgx-h100", store_path=db).set_index("collective")
    assert c.loc["allreduce", "message_bytes"] == 2048 and c.loc["allgather", "ranks"] == 4
    assert c.loc["allgather", "nodes"] == 1 and c.loc["allgather", "gpus_per_node"] == 4


LIGER_COLS = ("kernel_name,kernel_provider,kernel_operation_mode,metric_name,metric_unit,x_name,x_label,x_value,"
              "y_value_50,y_value_20,y_value_80,extra_benchmark_config_str,gpu_name,timestamp,liger_version")


def liger_csv(path: Path, rows: list[tuple]) -> Path:
    lines = [LIGER_COLS]
    for kern, prov, mode, y, cfg, gpu in rows:
        c = json.dumps(cfg).replace('"', '""')
        lines.append(f'{kern},{prov},{mode},speed,ms,H,hidden,4096,{y},{y},{y},"{c}",{gpu},2025-01-01,0.5')
    path.write_text("\n".join(lines) + "\n")
    return path


def test_liger_rows_map_to_memory_bound_ops(tmp_path: Path) -> None:
    cfg = {"M": 2048, "dtype": "torch.bfloat16", "eps": 1e-6}
    f = liger_csv(tmp_path / "all_benchmark_data.csv", [
        ("rms_norm", "liger", "forward", 0.05, cfg, "NVIDIA H100 80GB HBM3"),
        ("rms_norm", "liger", "backward", 0.09, cfg, "NVIDIA H100 80GB HBM3"),
        ("rms_norm", "liger", "full", 0.14, cfg, "NVIDIA H100 80GB HBM3"),       # fwd+bwd in one: skipped
        ("rms_norm", "torch", "forward", 0.08, {"M": 2048}, "NVIDIA H100 80GB HBM3"),  # no dtype: skipped
        ("rms_norm", "liger", "forward", 0.05, cfg, "NVIDIA GeForce RTX 4090"),  # no platform: skipped
    ])
    db = tmp_path / "s.duckdb"
    rep = store.ingest_path(f, store_path=db)
    assert rep.rows_added["op_samples"] == 2 and rep.files[0].rows_skipped == 3
    r = store.read_op_samples("dgx-h100", "rmsnorm", store_path=db).set_index("pass")
    assert (r.loc["fwd", "seq"], r.loc["fwd", "hidden"], r.loc["fwd", "dtype"]) == (2048, 4096, "bf16")
    assert math.isclose(r.loc["bwd", "duration_s"], 0.09e-3) and r.loc["bwd", "variant"] == "liger"
    assert sum(store.ingest_path(f, store_path=db).rows_added.values()) == 0


def test_liger_unknown_dtype_or_bad_median_rejects_the_file(tmp_path: Path) -> None:
    bad = liger_csv(tmp_path / "a.csv", [("rms_norm", "liger", "forward", 0.05, {"M": 8, "dtype": "torch.int3"},
                                          "NVIDIA H100 80GB HBM3")])
    out = store.ingest_path(bad, store_path=tmp_path / "s.duckdb").files[0]
    assert out.status == "rejected" and "dtype" in out.reason and "a.csv" in out.reason
    neg = liger_csv(tmp_path / "b.csv", [("rms_norm", "liger", "forward", -1, {"M": 8, "dtype": "torch.float32"},
                                          "NVIDIA H100 80GB HBM3")])
    out = store.ingest_path(neg, store_path=tmp_path / "s.duckdb").files[0]
    assert out.status == "rejected" and "y_value_50" in out.reason

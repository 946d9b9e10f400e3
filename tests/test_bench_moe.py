"""bench/ samplers of Mixture-of-Experts, FP8 and context-parallel training: the MoE kernels compute what
Megatron-Core computes, the designs respect their bounds, the samplers write rows the store ingests and
training fits; the GPU-only samplers run their CPU path (grouped GEMM, ring step over gloo) or refuse clearly
(FP8). Small shapes only (the two torchrun tests take a few seconds each)."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from bench.kernels import moe, opbench
from bench.sampling import design as D
from bench.sampling import gpu_ops, store_io
from bench.sampling.sampler import run_ops
from predictor.model import ops as P
from predictor.samples.store import ingest_path

REPO = Path(__file__).resolve().parents[1]
TINY = dataclasses.replace(D.PROFILES["cpu"], name="tiny", batch=(1, 2), seq=(16, 64), hidden=(32, 128),
                           head_dims=(16, 32), vocab=(256, 1024), layers=(1, 2), max_tokens=128,
                           max_fwd_flops=5e7, max_params=300_000, experts=(4, 32))
TORCHRUN = importlib.util.find_spec("torch.distributed.run") is not None or shutil.which("torchrun") is not None


def _quiet_run(platform: str = "test-cpu", **kw):
    return run_ops(platform, show_progress=False, threads=1, target_s=0.001, guard_interference=False,
                   log=lambda m: None, **kw)


# --------------------------------------------------------------------------- the kernels
def test_permute_then_unpermute_gives_the_tokens_back_and_rows_come_in_expert_order():
    torch.manual_seed(0)
    T, h, k = 37, 8, 2
    x = torch.randn(T, h)
    idx = moe.routing_indices(T, k, "cpu", experts=5)
    assert all(len(set(r)) == k for r in idx.tolist())  # k distinct experts per token
    rows, sorted_indices = moe.permute(x, idx)
    assert rows.shape == (T * k, h)
    experts = idx.reshape(-1)[sorted_indices]
    assert (experts[1:] >= experts[:-1]).all()  # grouped by expert, ascending
    assert torch.equal(rows, x[sorted_indices // k])  # each routed row is its token's
    probs = torch.softmax(torch.randn(T, k), -1)
    back = moe.unpermute(rows, sorted_indices, probs)  # sum_k p_k * x = x when the k probabilities sum to 1
    torch.testing.assert_close(back, x)
    # with expert outputs that differ per choice, the weighting is per (token, choice)
    y = rows * 2.0
    torch.testing.assert_close(moe.unpermute(y, sorted_indices, probs), 2.0 * x)


def test_router_keeps_the_top_k_softmax_probabilities_and_gradients_reach_the_weight():
    torch.manual_seed(0)
    T, h, E, k = 16, 12, 6, 2
    x = torch.randn(T, h, requires_grad=True)
    w = torch.randn(E, h, requires_grad=True)
    probs, routing_map = moe.route(x, w, k)
    full = torch.softmax(x @ w.T, -1)
    top = torch.topk(full, k).indices.sort(-1).values
    assert torch.equal(routing_map.nonzero()[:, 1].reshape(T, k), top) and ((probs > 0) == routing_map).all()
    torch.testing.assert_close(probs[routing_map].reshape(T, k), full.gather(1, top))
    probs.sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0 and x.grad is not None


@pytest.mark.parametrize("impl", ["grouped_mm", "loop"])
def test_grouped_expert_gemm_is_each_experts_gemm(impl):
    torch.manual_seed(0)
    x, w = torch.randn(5 + 16 + 3, 16), torch.randn(3, 16, 24)
    offs = torch.tensor([5, 21, 24], dtype=torch.int32)  # unequal groups
    ref = torch.cat([x[:5] @ w[0], x[5:21] @ w[1], x[21:] @ w[2]])
    torch.testing.assert_close(moe.grouped_forward(x, w, offs, impl), ref, rtol=1e-5, atol=1e-5)
    t, E, h, ffn = 8, 3, 16, 24
    for op in ("mlp_up", "mlp_down"):
        passes = moe.build_grouped(op, t, E, h, ffn, torch.float32, torch.device("cpu"), impl)
        setup, run = passes["fwd"]
        assert run(setup()).shape == (E * t, moe.gemm_kn(op, h, ffn)[1])
        setup, run = passes["bwd"]
        run(setup())  # dgrad + wgrad run


# --------------------------------------------------------------------------- designs
@pytest.mark.parametrize("op", D.MOE_OPS)
def test_moe_designs_respect_bounds_and_record_top_k(op):
    pts = D.op_design(op, 64, "cpu")
    assert len(pts) == 64 and all(D.in_bounds(p, "cpu") for p in pts)
    assert all(p.variant == "top2" and p.extra["top_k"] == 2 for p in pts)
    assert all({c for c, v in p.shape.items() if v is not None} == set(P.OPS[op].shape_columns) for p in pts)
    if op == "moe_router":
        experts = [p.shape["params"] / p.shape["hidden"] for p in pts]
        assert all(e == int(e) and 4 <= e <= 128 for e in experts) and len(set(experts)) > 20
    else:
        assert all(p.shape["batch"] * p.shape["seq"] % 2 == 0 for p in pts)  # routed rows = tokens * top_k
    assert set(D.MOE_OPS) <= set(D.DEFAULT_OPS)  # the default plan (and the CPU loop) samples them


def test_grouped_design_records_one_experts_gemm_and_the_call():
    for op in gpu_ops.GROUPED_OPS:
        pts = gpu_ops.grouped_design(op, 32, "gpu")
        assert len(pts) == 32
        for p in pts:
            s, E = p.shape, p.extra["experts"]
            assert s["tp"] == 1 and s["batch"] == 1 and s["seq"] % 16 == 0 and E in gpu_ops.EXPERTS_IN_CALL
            assert p.extra["calls_per_sample"] == E and p.extra["columns"] == {"experts_in_call": E}
            width = s["ffn_hidden"] // 2 if op == "mlp_up" else s["ffn_hidden"]
            assert 0.2 <= width / s["hidden"] <= 4.5
        assert len({p.extra["experts"] for p in pts}) >= 5 and len({p.shape["seq"] for p in pts}) >= 20
    assert [p.shape for p in gpu_ops.grouped_design("mlp_up", 8)] == \
        [p.shape for p in gpu_ops.grouped_design("mlp_up", 32)[:8]]  # prefixes of one sequence


# --------------------------------------------------------------------------- samplers -> store -> training
def test_moe_samples_are_ingested_and_train_regressors(tmp_path):
    from predictor.calibrate.training import train_platform
    out = tmp_path / "s"
    run = _quiet_run("cpu-2t", out_dir=out, ops=list(D.MOE_OPS), n_per_op=24, profile=TINY)
    assert run["rows_written"] == 3 * 24 * 2
    df = store_io.read_shards(out, "ops")
    assert set(df["variant"]) == {"top2"} and (df["duration_s"] > 0).all()
    db = tmp_path / "st.duckdb"
    rep = ingest_path(out, store_path=db)
    assert rep.ok and rep.rows_added["op_samples"] == 144 and rep.rows_rejected == 0
    res = train_platform("cpu-2t", store_path=db, models_dir=tmp_path / "m", cv_folds=3, ops_only=D.MOE_OPS,
                         write_readme=False)
    assert sorted(f"{r.op}.{r['pass']}" for _, r in res.iterrows()) == sorted(
        f"{o}.{ps}" for o in D.MOE_OPS for ps in ("fwd", "bwd"))
    assert (res["n_samples"] == 24).all() and res["cv_mape"].notna().all()
    assert sorted(p.name for p in (tmp_path / "m" / "cpu-2t").glob("*.txt")) == sorted(
        f"{o}.{ps}.txt" for o in D.MOE_OPS for ps in ("fwd", "bwd"))


def test_a_set_holds_one_top_k(tmp_path):
    out = tmp_path / "s"
    _quiet_run(out_dir=out, ops=["moe_permute"], n_per_op=2, profile=TINY)
    top8 = dataclasses.replace(TINY, moe_top_k=8)
    with pytest.raises(ValueError, match=r"variant \['top2'\].*'top8'"):
        _quiet_run(out_dir=out, ops=["moe_permute"], n_per_op=2, profile=top8)
    _quiet_run(out_dir=tmp_path / "top8", ops=["moe_permute"], n_per_op=2, profile=top8)
    assert set(store_io.read_shards(tmp_path / "top8", "ops")["variant"]) == {"top8"}


def test_grouped_gemm_sampler_writes_per_expert_shares(tmp_path):
    out = tmp_path / "g"
    tiny = dataclasses.replace(TINY, max_tokens=256, max_fwd_flops=2e8, max_elements=2**22)
    run = gpu_ops.run_grouped("test-cpu", out, device="cpu", dtype="fp32", n_per_op=2, profile=tiny, impl="loop",
                              show_progress=False, target_s=0.001, guard_interference=False, log=lambda m: None)
    assert run["kind"] == "grouped-gemm" and "expert_loop" in run["design"]
    df = store_io.read_shards(out, "ops")
    assert len(df) == 8 and set(df["op"]) == {"mlp_up", "mlp_down"} and set(df["variant"]) == {"expert_loop"}
    np.testing.assert_allclose(df["duration_s"] * df["experts_in_call"], df["call_s"])
    assert ingest_path(out, store_path=tmp_path / "st.duckdb").ok


def test_fp8_sampling_is_refused_without_fp8_tensor_cores(tmp_path, capsys):
    import bench.cli as C
    shape = {"tp": 1, "batch": 1, "seq": 128, "hidden": 256, "ffn_hidden": 1024}
    with pytest.raises(opbench.Fp8Unsupported, match="compute capability"):
        opbench.build("mlp_up", shape, "fp8", "cpu")
    assert C.main(["ops", "--platform", "test-cpu", "--dtype", "fp8", "--out", str(tmp_path / "f"), "--no-wait"]) == 2
    assert "nothing sampled" in capsys.readouterr().err and not (tmp_path / "f").exists()


# --------------------------------------------------------------------------- under torchrun (gloo)
def _torchrun(args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "bench", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False)


@pytest.mark.skipif(not TORCHRUN, reason="torchrun is not available")
def test_alltoall_over_gloo_records_one_ranks_send_buffer(tmp_path):
    out = tmp_path / "c"
    r = _torchrun(["collectives", "--platform", "test-cpu", "--out", str(out), "--sizes", "3", "--min-bytes", "256",
                   "--max-bytes", "65536", "--collectives", "alltoall", "--no-wait", "--no-guard", "--no-progress"])
    assert r.returncode == 0, r.stderr[-2000:]
    df = store_io.read_shards(out, "coll")
    assert set(df["collective"]) == {"alltoall"} and len(df) == 3 and (df["ranks"] == 2).all()
    assert (df["message_bytes"] % 8 == 0).all() and (df["duration_s"] > 0).all()
    rep = ingest_path(out, store_path=tmp_path / "st.duckdb")
    assert rep.ok and rep.rows_added["collective_samples"] == 3


@pytest.mark.skipif(not TORCHRUN, reason="torchrun is not available")
def test_ring_attention_step_over_two_gloo_ranks(tmp_path):
    out = tmp_path / "r"
    r = _torchrun(["ring", "--platform", "test-cpu", "--out", str(out), "--device", "cpu", "--dtype", "fp32",
                   "--profile", "cpu", "--n-points", "1", "--reps", "1"])
    assert r.returncode == 0, r.stderr[-2000:]
    ops_df, coll = store_io.read_shards(out, "ops"), store_io.read_shards(out, "coll")
    assert sorted(zip(ops_df["variant"], ops_df["pass"])) == sorted(
        (v, ps) for v in ("ring-causal-block", "ring-full-block") for ps in ("fwd", "bwd"))
    assert (ops_df["op"] == "flash_attn").all() and (ops_df["cp"] == 2).all() and (ops_df["duration_s"] > 0).all()
    full = ops_df[ops_df["variant"] == "ring-full-block"]
    assert (full["exchange_s"] > 0).all() and (full["step_s"] > 0).all()
    p = D.op_design("flash_attn", 1, "cpu")[0]
    kv = 2 * p.shape["batch"] * p.shape["seq"] * p.shape["kv_heads"] * (p.shape["hidden"] // p.shape["heads"]) * 4
    assert sorted(coll["message_bytes"]) == [kv, 2 * kv] and set(coll["pattern"]) == {"ring-exchange"}
    rep = ingest_path(out, store_path=tmp_path / "st.duckdb")
    assert rep.ok and rep.rows_added["op_samples"] == 4 and rep.rows_added["collective_samples"] == 2
    assert pd.Timestamp(store_io.read_manifest(out)["runs"][0]["started_at"]).year >= 2025

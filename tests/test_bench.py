"""bench/: the samplers really time kernels, write Parquet the store accepts, resume, and the plans
respect their bounds and budgets. Small shapes only: the whole file runs in a few seconds (the
torchrun test needs ~10 s and is skipped where torchrun is unavailable)."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.kernels import opbench
from bench.sampling import design as D
from bench.sampling import store_io
from bench.sampling.sampler import run_ops
from predictor.model import ops as P
from predictor.samples.store import connect, ingest_path

REPO = Path(__file__).resolve().parents[1]
TINY = dataclasses.replace(D.PROFILES["cpu"], name="tiny", batch=(1, 2), seq=(16, 64), hidden=(32, 128),
                           head_dims=(16, 32), vocab=(256, 1024), layers=(1, 2), max_tokens=128,
                           max_fwd_flops=5e7, max_params=300_000)


def _rows(store: Path, table: str) -> pd.DataFrame:
    with connect(store, read_only=True) as con:
        return con.execute(f"SELECT * FROM {table}").df()


def test_sampler_times_a_tiny_gemm_and_the_store_accepts_it(tmp_path):
    out = tmp_path / "s"
    run = run_ops("test-cpu", out, ops=["mlp_up"], n_per_op=2, profile=TINY, threads=1, show_progress=False,
                  target_s=0.002, guard_interference=False, log=lambda m: None)
    assert run["rows_written"] == 4 and run["stopped"] == "plan complete"
    df = store_io.read_shards(out, "ops")
    assert set(df["pass"]) == {"fwd", "bwd"} and (df["duration_s"] > 0).all() and (df["duration_s"] < 1).all()
    # a backward GEMM (dgrad + wgrad) does about twice the forward work
    both = df.pivot_table(index="design_index", columns="pass", values="duration_s")
    assert (both["bwd"] > both["fwd"] * 0.8).all()
    m = json.loads((out / "manifest.json").read_text())
    assert m["platform"] == "test-cpu" and m["licence"] and m["source"]
    f = m["runs"][0]["facts"]
    assert f["torch"] and f["torch_threads"] == 1 and f["host"] and len(f["loadavg"]) == 3
    rep = ingest_path(out, store_path=tmp_path / "st.duckdb")
    assert rep.ok and rep.rows_added["op_samples"] == 4 and rep.rows_rejected == 0
    st = _rows(tmp_path / "st.duckdb", "op_samples")
    assert set(st["platform"]) == {"test-cpu"} and set(st["op"]) == {"mlp_up"}
    assert st["tp"].eq(1).all() and st["ffn_hidden"].notna().all() and st["heads"].isna().all()
    # ingesting the same bench output again is idempotent: nothing added, nothing rejected, same rows
    again = ingest_path(out, store_path=tmp_path / "st.duckdb")
    assert again.ok and sum(again.rows_added.values()) == 0 and again.files_ingested == 0
    assert len(_rows(tmp_path / "st.duckdb", "op_samples")) == 4
    assert len(_rows(tmp_path / "st.duckdb", "batches")) == rep.files_ingested


def test_resume_skips_finished_shapes(tmp_path):
    out = tmp_path / "s"
    kw = dict(ops=["res_add", "rmsnorm"], profile=TINY, threads=1, show_progress=False, target_s=0.001,
              guard_interference=False, log=lambda m: None)
    first = run_ops("test-cpu", out, n_per_op=2, **kw)
    assert first["rows_written"] == 8
    again = run_ops("test-cpu", out, n_per_op=2, **kw)
    assert again["already_done_points"] == again["planned_points"] == 4 and again["rows_written"] == 0
    more = run_ops("test-cpu", out, n_per_op=3, **kw)  # one new point per op, fwd + bwd
    assert more["rows_written"] == 4
    df = store_io.read_shards(out, "ops")
    keys = [D.sample_key(r["op"], r["pass"], r["dtype"],
                         {c: (None if pd.isna(r[c]) else r[c]) for c in P.SHAPE_COLUMNS})
            for r in df.to_dict(orient="records")]
    assert len(keys) == len(set(keys)) == 12
    # an interrupted run (budget spent at once) keeps what earlier runs finished and adds nothing broken
    cut = run_ops("test-cpu", out, n_per_op=8, budget_s=0.0, **kw)
    assert cut["rows_written"] == 0 and cut["stopped"].startswith("time budget")
    assert len(store_io.read_shards(out, "ops")) == 12
    assert len(json.loads((out / "manifest.json").read_text())["runs"]) == 4


@pytest.mark.parametrize("op", [*D.DEFAULT_OPS, *D.UNFUSED_ATTENTION_OPS])
def test_space_filling_design_respects_bounds_and_budget(op):
    pts = D.op_design(op, 40, "cpu")
    assert 0 < len(pts) <= 40
    assert all(D.in_bounds(p, "cpu") for p in pts)
    assert all({k for k, v in p.shape.items() if v is not None} <= set(P.OPS[op].shape_columns) for p in pts)
    # deterministic, and every prefix is the start of the longer plan (a cut-short run stays space-filling)
    assert [p.shape for p in D.op_design(op, 10, "cpu")] == [p.shape for p in pts[:10]]
    # not a grid: many distinct values per dimension, spread over the range
    if op not in ("optimizer",):
        seqs = [p.shape["seq"] for p in pts if p.shape["seq"]]
        assert len(set(seqs)) >= 10 and min(seqs) < 128 and max(seqs) > 256


def test_design_spreads_over_the_domain_like_a_low_discrepancy_sequence():
    """The first points of a design cover every part of each (log-scaled) dimension: each quarter of the
    log range of seq and hidden gets points early, and the spread is at least that of random sampling."""
    pts = D.op_design("layernorm", 32, "cpu")
    prof = D.PROFILES["cpu"]
    for dim, (lo, hi) in (("seq", prof.seq), ("hidden", prof.hidden)):
        u = np.array([np.log(p.shape[dim] / lo) / np.log(hi / lo) for p in pts[:16]])
        quarters = np.clip((u * 4).astype(int), 0, 3)
        assert set(quarters) == {0, 1, 2, 3}, (dim, sorted(u))
    # mean nearest-neighbour distance in the unit cube of (seq, hidden): not clustered
    xy = np.array([[np.log(p.shape["seq"] / prof.seq[0]) / np.log(prof.seq[1] / prof.seq[0]),
                    np.log(p.shape["hidden"] / prof.hidden[0]) / np.log(prof.hidden[1] / prof.hidden[0])]
                   for p in pts])
    d = np.sqrt(((xy[:, None] - xy[None]) ** 2).sum(-1)) + np.eye(len(xy)) * 9
    rng = np.random.default_rng(0)
    rand = []
    for _ in range(50):
        r = rng.random((len(xy), 2))
        dr = np.sqrt(((r[:, None] - r[None]) ** 2).sum(-1)) + np.eye(len(r)) * 9
        rand.append(dr.min(1).mean())
    assert d.min(1).mean() >= np.median(rand) * 0.8


def test_time_budget_stops_the_sampler_and_keeps_what_it_measured(tmp_path, monkeypatch):
    """The budget is checked before every point against the sampler's clock. The clock here advances
    0.1 s per timed pass (every kernel still really runs and is timed), so the cut is the same on any
    machine: a point (fwd + bwd) costs 0.2 s, points 1-3 end at 0.6 s, and point 4 is not started
    because 0.6 s >= the 0.5 s budget. (With the wall clock, a fast machine finished the whole plan
    within the budget and the test failed.)"""
    import bench.sampling.sampler as S
    now = [0.0]
    real = S.time_on_every_rank

    def timed(*a, **k):
        out = real(*a, **k)
        now[0] += 0.1
        return out
    monkeypatch.setattr(S, "time_on_every_rank", timed)
    kw = {"ops": ["res_add", "layernorm", "gelu"], "profile": TINY, "threads": 1, "show_progress": False,
          "target_s": 0.002, "guard_interference": False, "log": lambda m: None, "clock": lambda: now[0]}
    run = run_ops("test-cpu", tmp_path, n_per_op=50, budget_s=0.5, **kw)
    assert run["planned_points"] > 4  # the plan is larger than the budget allows
    assert run["stopped"] == "time budget 0.5 s spent"
    assert run["rows_written"] == 6 and run["sampling_s"] == 0.6  # at most one point beyond the budget
    df = store_io.read_shards(tmp_path, "ops")
    assert len(df) == run["rows_written"] and (df["duration_s"] > 0).all()
    # what it kept is the start of the round-robin plan: point 0 of each op, fwd and bwd
    assert sorted(df["op"]) == sorted(["res_add", "layernorm", "gelu"] * 2) and set(df["design_index"]) == {
        D.op_design(op, 1, TINY)[0].index for op in ("res_add", "layernorm", "gelu")}
    # a rerun with budget left resumes after what the first run kept
    again = run_ops("test-cpu", tmp_path, n_per_op=50, budget_s=0.5, **kw)
    assert again["already_done_points"] == 3 and again["rows_written"] == 6


def test_wide_cpu_profile_samples_what_the_cpu_profile_extrapolates():
    """4096-token batches of large vocabularies (logits of 131 M elements) and hidden-1024 MLPs are
    outside the `cpu` profile's guards (48 M elements, 3e10 FLOPs): `cpu-wide` samples such shapes."""
    wide, cpu = D.PROFILES["cpu-wide"], D.PROFILES["cpu"]
    head = {"tp": 1, "batch": 8, "seq": 512, "hidden": 512, "vocab": 32000}
    assert not D.feasible("lm_head", head, cpu) and D.feasible("lm_head", head, wide)
    ce = {"tp": 1, "batch": 8, "seq": 512, "vocab": 32000}
    assert not D.feasible("cross_entropy", ce, cpu) and D.feasible("cross_entropy", ce, wide)
    mlp = {"tp": 1, "batch": 8, "seq": 512, "hidden": 1024, "ffn_hidden": 4096}
    assert not D.feasible("mlp_up", mlp, cpu) and D.feasible("mlp_up", mlp, wide)
    for op in ("lm_head", "cross_entropy", "optimizer"):
        pts = D.op_design(op, 96, "cpu-wide")
        assert all(D.in_bounds(p, "cpu-wide") for p in pts)
        assert sum(not D.feasible(op, p.shape, cpu) for p in pts) >= 5  # a few large points, not a different plan
        assert len({p.index for p in pts} & {p.index for p in D.op_design(op, 96, "cpu")}) >= 75


def test_design_shapes_are_consistent_models():
    for p in D.op_design("qkv_proj", 64, "cpu") + D.op_design("flash_attn", 64, "cpu"):
        s = p.shape
        assert s["hidden"] % s["heads"] == 0 and s["heads"] % s["kv_heads"] == 0
    plan = D.plan(["res_add", "gelu", "optimizer"], 5, "cpu")
    assert [p.op for p in plan[:3]] == ["res_add", "gelu", "optimizer"]  # round-robin
    opt = D.op_design("optimizer", 20, "cpu")
    for p in opt:
        assert p.shape["params"] == opbench.optimizer_params(p.shape["hidden"], p.shape["layers"], 1, p.extra["vocab"])
        assert p.shape["params"] <= D.PROFILES["cpu"].max_params


def test_every_default_op_builds_and_runs_both_passes():
    import torch
    torch.set_num_threads(1)
    for op in (*D.DEFAULT_OPS, *D.UNFUSED_ATTENTION_OPS):
        p = D.op_design(op, 1, TINY)[0]
        kernels = opbench.build(op, {**p.shape, **p.extra})
        assert set(kernels) == set(P.OPS[op].passes)
        for setup, run in kernels.values():
            run(setup())


def test_interference_meter_sees_other_processes():
    """A busy child process counts as interference; our own work does not."""
    from bench.env import Interference
    m = Interference()
    if not m.available:
        pytest.skip("no /proc/stat")
    s = m.snap()
    x = 0
    for i in range(3_000_00):
        x += i * i
    wall, _tot, own = m.delta(s)
    assert own > 0 or wall < 0.05
    s = m.snap()
    subprocess.run([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<0.4: pass"], check=True)
    cores, disturbed = Interference.others(*m.delta(s))
    assert disturbed and cores > 0.3


def test_catalog_upsert_is_a_small_valid_edit(tmp_path):
    from bench.sampling.device import upsert_catalog_entry
    src = REPO / "predictor" / "catalog" / "clusters.json"
    f = tmp_path / "clusters.json"
    f.write_text(src.read_text())
    before = json.loads(f.read_text())
    upsert_catalog_entry(f, "zz-test", {"device": "x", "gpus_per_node": 1})
    mid = json.loads(f.read_text())
    assert mid["zz-test"] == {"device": "x", "gpus_per_node": 1}
    assert {k: v for k, v in mid.items() if k != "zz-test"} == before
    upsert_catalog_entry(f, "zz-test", {"device": "y", "gpus_per_node": 2})
    after = json.loads(f.read_text())
    assert after["zz-test"]["device"] == "y" and list(after) == list(mid)


def test_error_curve_falls_with_samples(tmp_path):
    """Synthetic samples with a smooth efficiency: the curve must improve from 8 to all points."""
    from bench.sampling.curve import error_curve
    from predictor.hardware.platforms import get_platform
    from predictor.regress import features as F
    dev = get_platform("perlmutter-a100").device
    pts = D.op_design("mlp_down", 96, "cpu")
    shapes = pd.DataFrame([p.shape for p in pts])
    roof = F.roofline_s("mlp_down", "fwd", shapes, dev, "fp32")
    M = shapes["batch"] * shapes["seq"]
    eff = 0.2 + 0.7 * (1 - np.exp(-M / 600.0))
    df = shapes.assign(platform="perlmutter-a100", op="mlp_down", **{"pass": "fwd"}, dtype="fp32",
                       duration_s=roof / eff, design_index=[p.index for p in pts], wall_s=0.1,
                       measured_at=pd.Timestamp("2026-01-01", tz="UTC"))
    store_io.write_shard(tmp_path, "ops", "synthetic", 0, df.to_dict(orient="records"))
    per, summ = error_curve(tmp_path, "perlmutter-a100", steps=(8, 16, 32))
    assert list(summ["n_per_model"]) == [8, 16, 32]
    first, last = per.iloc[0]["mape"], per.iloc[-1]["mape"]
    assert last < first and last < 0.15


@pytest.mark.skipif(importlib.util.find_spec("torch.distributed.run") is None and shutil.which("torchrun") is None,
                    reason="torchrun is not available")
def test_collective_sampler_runs_under_torchrun_with_two_gloo_ranks(tmp_path):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path / "c"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "bench",
           "collectives", "--platform", "test-cpu", "--out", str(out), "--sizes", "2", "--min-bytes", "256",
           "--max-bytes", "4096", "--no-wait", "--no-guard", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    df = store_io.read_shards(out, "coll")
    assert set(df["collective"]) == {"allreduce", "allgather", "reducescatter", "p2p", "alltoall"}
    assert len(df) == 10 and (df["ranks"] == 2).all() and (df["duration_s"] > 0).all()
    assert (df["nodes"] == 1).all() and (df["gpus_per_node"] == 2).all() and (df["backend"] == "gloo").all()
    rep = ingest_path(out, store_path=tmp_path / "st.duckdb")
    assert rep.ok and rep.rows_added["collective_samples"] == 10


# --------------------------------------------------------------------------- a sample set belongs to one machine
def _machines():
    from predictor.hardware.machine import Machine
    amd = Machine(vendor="AuthenticAMD", model_name="AMD EPYC", family="25", model="17", stepping="1", cores=2,
                  arch="x86_64", l2="1024K", l3="32768K", isa=["avx2", "avx512f", "fma"], torch="2.13.0")
    intel = Machine(vendor="GenuineIntel", model_name="Intel(R) Xeon(R) Platinum 8375C", family="6", model="106",
                    stepping="6", cores=2, arch="x86_64", l2="1280K", l3="55296K", isa=["avx2", "avx512f", "fma"],
                    torch="2.13.0")
    return amd, intel


def test_a_sample_set_of_another_machine_is_never_resumed(tmp_path):
    amd, intel = _machines()
    root = tmp_path / "samples"
    out = root / "test-cpu"
    kw = {"ops": ["res_add", "rmsnorm"], "n_per_op": 2, "profile": TINY, "threads": 1, "show_progress": False,
          "target_s": 0.001, "guard_interference": False, "log": lambda m: None}
    first = run_ops("test-cpu", out, machine=amd, **kw)
    m = json.loads((out / "manifest.json").read_text())
    assert first["rows_written"] == 8 and m["machine"]["id"] == m["machine_id"] == amd.id == first["machine_id"]
    assert m["runs"][0]["facts"]["machine"]["model_name"] == "AMD EPYC"
    # another machine: refused before anything is measured or written, naming both machines and why
    with pytest.raises(store_io.ForeignSamples) as exc:
        run_ops("test-cpu", out, machine=intel, **kw)
    msg = str(exc.value)
    assert "AMD EPYC" in msg and "Intel(R) Xeon(R) Platinum 8375C" in msg and amd.id in msg and intel.id in msg
    assert "CPU vendor: AuthenticAMD vs GenuineIntel" in msg and "never mixed" in msg
    assert len(store_io.read_shards(out, "ops")) == 8
    assert len(json.loads((out / "manifest.json").read_text())["runs"]) == 1
    # the same machine resumes (skips what is measured), even with another host name or memory size
    amd_again = dataclasses.replace(amd, host="other-vm", memory_gib=64.0)
    again = run_ops("test-cpu", out, machine=amd_again, **kw)
    assert again["already_done_points"] == again["planned_points"] == 4 and again["rows_written"] == 0
    # where each machine's set of the platform goes by default
    assert store_io.sample_set_dir(root, "test-cpu", amd) == out
    fresh = store_io.sample_set_dir(root, "test-cpu", intel)
    assert fresh == root / f"machine-{intel.id}" / "test-cpu"
    assert store_io.sample_set_dir(root, "other-platform", intel) == root / "other-platform"  # free: anyone's
    run = run_ops("test-cpu", fresh, machine=intel, **kw)
    assert run["rows_written"] == 8 and run["already_done_points"] == 0  # nothing of the AMD set is reused
    assert store_io.set_machine(fresh).id == intel.id and store_io.set_machine(out).id == amd.id
    assert store_io.machine_root(root, ["test-cpu"], intel) == root / f"machine-{intel.id}"
    assert store_io.machine_root(root, ["test-cpu"], amd) == root


def test_older_sets_are_judged_by_the_facts_they_recorded(tmp_path):
    from predictor.hardware.machine import Machine
    shipped = REPO / "bench" / "samples" / "cpu-2t"
    legacy = tmp_path / "cpu-2t"
    legacy.mkdir()
    m = json.loads((shipped / "manifest.json").read_text())
    m.pop("machine"), m.pop("machine_id")
    (legacy / "manifest.json").write_text(json.dumps(m))
    shutil.copy(min(shipped.glob("ops-*.parquet")), legacy)
    old = store_io.set_machine(legacy)
    assert old.model_name == "AMD EPYC" and old.l2 == "512K" and old.family is None  # rebuilt from facts
    assert store_io.set_machine(shipped).id == old.id  # the shipped manifest records that same fingerprint
    like = Machine(vendor="AuthenticAMD", model_name="AMD EPYC", family="25", model="1", stepping="1", cores=2,
                   arch="x86_64", l2="512K", l3="32768K", isa=["avx2"], torch="2.13.0")
    assert store_io.belongs_to(legacy, like)  # every recorded fact agrees
    assert not store_io.belongs_to(legacy, dataclasses.replace(like, l2="1024K"))
    # shards without any record of their machine: nobody's to resume
    (legacy / "manifest.json").unlink()
    with pytest.raises(store_io.ForeignSamples, match="no record of the machine"):
        store_io.check_same_machine(legacy, like)


def test_cli_refuses_another_machines_out_and_defaults_to_this_machines_folder(tmp_path, monkeypatch, capsys):
    import bench.cli as C
    from predictor.hardware.machine import current
    root = tmp_path / "samples"
    here = current()
    run_ops("test-cpu", root / "test-cpu", ops=["res_add"], n_per_op=1, profile=TINY, threads=1, show_progress=False,
            target_s=0.001, guard_interference=False, log=lambda m: None, machine=here)
    monkeypatch.setattr(C, "SAMPLES", root)
    monkeypatch.setenv("PREDICTOR_MACHINE_OVERRIDE", json.dumps({"vendor": "GenuineIntel", "model_name": "Intel Xeon",
                                                                 "family": "6", "model": "143"}))
    other = current()
    args = ["ops", "--platform", "test-cpu", "--ops", "res_add", "--n-per-op", "1", "--threads", "1", "--no-wait",
            "--no-guard", "--no-progress"]
    assert C.main([*args, "--out", str(root / "test-cpu")]) == 2
    err = capsys.readouterr().err
    assert "holds samples of another machine" in err and "Intel Xeon" in err
    assert f"Leave out --out to sample into {root / f'machine-{other.id}' / 'test-cpu'}" in err
    assert C.main(args) == 0
    mine = root / f"machine-{other.id}" / "test-cpu"
    assert len(store_io.read_shards(mine, "ops")) == 2 and store_io.set_machine(mine).model_name == "Intel Xeon"
    assert len(store_io.read_shards(root / "test-cpu", "ops")) == 2  # the other machine's set is untouched
    # the speed check compares a machine only with its own samples
    assert C.main(["speed-check", "--platform", "cpu-2t", "--samples", str(REPO / "bench" / "samples" / "cpu-2t")]) == 2
    assert "sample it first (`python -m bench cpu-platform`)" in capsys.readouterr().err

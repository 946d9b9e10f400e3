"""`python -m bench gpu-quick` on the CPU with tiny shapes and the fake GPU reader: what it writes ingests into a
fresh store, a budget cut or a SIGTERM mid-way still leaves an ingestible set that says which phases finished,
and a rerun resumes without duplicating a sample."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from bench.sampling import gpu_quick as GQ
from bench.sampling import store_io
from bench.sampling.design import sample_key
from predictor.cli.main import main as predictor_main
from predictor.model import ops as P
from predictor.samples.store import connect

REPO = Path(__file__).resolve().parents[1]
QUIET = {"log": lambda m: None}


def _ops(store: Path) -> pd.DataFrame:
    with connect(store, read_only=True) as con:
        return con.execute("SELECT * FROM op_samples").df()


def _keys(out: Path) -> list[str]:
    df = store_io.read_shards(out, "ops")
    return [sample_key(r["op"], r["pass"], r["dtype"], {c: (None if pd.isna(r.get(c)) else r.get(c))
                                                        for c in P.SHAPE_COLUMNS}) for r in df.to_dict("records")]


class StepClock:
    """A clock that moves `step` seconds every time it is read: the budget runs out after a known number of reads."""

    def __init__(self, step: float):
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def test_gpu_plan_is_training_shapes_of_real_models():
    prof = GQ.PROFILES["gpu"]
    gemm = GQ.phase_points("gemm", prof)
    assert {p.op for p in gemm} == set(GQ.GEMM_OPS)
    assert {p.shape["tp"] for p in gemm} == {1, 2, 4, 8}
    assert {p.shape["batch"] * p.shape["seq"] for p in gemm} == {4096, 8192, 16384}
    models = {p.extra["model"] for p in gemm}
    assert models == {"llama3-8b", "llama3-70b", "qwen3-8b", "qwen3-32b"}
    # qwen3-32b's head_dim (128) is not hidden / heads (80): the sample schema cannot hold its attention shapes
    assert not any(p.extra["model"] == "qwen3-32b" and p.op == "qkv_proj" for p in gemm)
    up = next(p for p in gemm if p.op == "mlp_up" and p.extra["model"] == "llama3-70b")
    assert up.shape["ffn_hidden"] == 2 * 28672 and up.shape["hidden"] == 8192  # gate + up fused
    for p in gemm + GQ.phase_points("attention", prof) + GQ.phase_points("pointwise", prof):
        used = {k for k, v in p.shape.items() if v is not None}
        assert used <= set(P.OPS[p.op].shape_columns), (p.op, used)
    att = GQ.phase_points("attention", prof)
    assert {p.op for p in att} == {"flash_attn"} and max(p.shape["seq"] for p in att) == 16384
    assert {p.op for p in GQ.phase_points("pointwise", prof)} == set(GQ.POINTWISE_OPS)
    # the order is fixed (a rerun resumes the same plan) and shuffled (a cut prefix covers every model and TP)
    assert [p.shape for p in GQ.phase_points("gemm", prof)] == [p.shape for p in gemm]
    first = gemm[: len(gemm) // 5]
    assert {p.shape["tp"] for p in first} == {1, 2, 4, 8} and len({p.extra["model"] for p in first}) == 4


def test_tiny_run_ingests_into_a_fresh_store(tmp_path, monkeypatch):
    out = tmp_path / "quick"
    run = GQ.run_quick(out, device="cpu", profile="tiny", budget_s=30, sustained_s=0.5, **QUIET)
    assert run["stopped"] == "all phases finished"
    assert run["phases_finished"] == sorted(GQ.PHASES)
    df = store_io.read_shards(out, "ops")
    assert len(df) == run["rows_written"] > 0 and (df["duration_s"] > 0).all()
    assert set(df["op"]) == set(GQ.GEMM_OPS) | {"flash_attn"} | set(GQ.POINTWISE_OPS)
    bwd = df[(df["pass"] == "bwd") & df["op"].isin(GQ.GEMM_OPS)]
    assert (bwd["dgrad_s"] > 0).all() and (bwd["wgrad_s"] > 0).all()
    assert df.loc[df["pass"] == "fwd", "dgrad_s"].isna().all()
    assert set(df.loc[df["op"] == "flash_attn", "variant"]) == {"sdpa-causal"}
    assert df["sm_clock_mhz"].notna().all() and set(df["power_w"]) == {700.0}
    m = json.loads((out / "manifest.json").read_text())
    prov = m["gpu_quick"]["provenance"]
    for k in ("device_name", "driver", "torch", "cuda", "max_sm_clock_mhz", "power_limit_w", "recorded_at"):
        assert k in prov
    assert prov["telemetry_reader"].startswith("fake") and m["runs"][0]["gpu"]["reader"].startswith("fake")
    sus = m["gpu_quick"]["phases"]["sustained"]
    assert sus["finished"] and sus["windows"] and all(w["tflops"] > 0 for w in sus["windows"])
    assert sus["summary"]["sm_clock_mhz_median"] > 0 and sus["summary"]["temperature_c_max"] >= 50
    # the CLI reads it, into a fresh store named by --store, and by PREDICTOR_STORE
    assert predictor_main(["ingest", str(out), "--store", str(tmp_path / "a.duckdb")]) == 0
    st = _ops(tmp_path / "a.duckdb")
    assert len(st) == len(df) and set(st["platform"]) == {"quick-cpu"}
    monkeypatch.setenv("PREDICTOR_STORE", str(tmp_path / "b.duckdb"))
    assert predictor_main(["ingest", str(out)]) == 0
    assert len(_ops(tmp_path / "b.duckdb")) == len(df)


def test_a_budget_cut_leaves_an_ingestible_set_and_a_rerun_resumes_without_duplicates(tmp_path):
    out = tmp_path / "quick"
    # the clock moves 2 s per read (one read per shape); 100 s of budget: the gemm phase gets 55 % of ~85 s, time
    # for about 23 of its 40 shapes
    cut = GQ.run_quick(out, device="cpu", profile="tiny", budget_s=100, sustained_s=15, clock=StepClock(2.0),
                       **QUIET)
    phases = GQ.read_phases(out)
    assert not phases["gemm"]["finished"] and phases["gemm"]["not_reached_points"] > 0
    assert 0 < cut["rows_written"] and "gemm" not in cut["phases_finished"]
    assert predictor_main(["ingest", str(out), "--store", str(tmp_path / "s.duckdb")]) == 0
    n_cut = len(_ops(tmp_path / "s.duckdb"))
    assert n_cut == cut["rows_written"]
    # a rerun with time enough finishes what is left and measures nothing twice
    again = GQ.run_quick(out, device="cpu", profile="tiny", budget_s=60, sustained_s=0.3, **QUIET)
    assert again["stopped"] == "all phases finished"
    keys = _keys(out)
    assert len(keys) == len(set(keys)) == cut["rows_written"] + again["rows_written"]
    m = json.loads((out / "manifest.json").read_text())
    assert [r["run_id"] for r in m["runs"]] == [cut["run_id"], again["run_id"]]
    assert set(m["runs"][1]["phases_already_finished"]) == set(cut["phases_finished"])
    # the store gets the new rows only
    assert predictor_main(["ingest", str(out), "--store", str(tmp_path / "s.duckdb")]) == 0
    assert len(_ops(tmp_path / "s.duckdb")) == len(keys)
    # a third run has nothing to do
    third = GQ.run_quick(out, device="cpu", profile="tiny", budget_s=60, sustained_s=0.3, **QUIET)
    assert third["rows_written"] == 0 and third["phases"] == {}


def test_sigterm_mid_run_flushes_and_says_which_phases_finished(tmp_path):
    out = tmp_path / "quick"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "bench", "gpu-quick", "--device", "cpu", "--profile", "tiny",
                             "--out", str(out), "--budget-s", "200", "--sustained-s", "30"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait for the sampling phases to finish: the sustained GEMM runs 30 s
            if proc.poll() is not None:
                break
            if (GQ.read_phases(out).get("pointwise") or {}).get("finished") if (out / "manifest.json").exists() \
                    else False:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0]
        proc.send_signal(signal.SIGTERM)
        text = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, text
    m = json.loads((out / "manifest.json").read_text())
    assert m["runs"][-1]["stopped"] == "stopped by SIGTERM during phase sustained"
    assert m["runs"][-1]["phases_finished"] == ["attention", "gemm", "pointwise"]
    assert "sustained" not in GQ.read_phases(out)
    assert predictor_main(["ingest", str(out), "--store", str(tmp_path / "s.duckdb")]) == 0
    assert len(_ops(tmp_path / "s.duckdb")) == m["runs"][-1]["rows_written"] > 0


def test_telemetry_reader_choice_and_nvidia_smi_parsing(monkeypatch):
    tel, why = GQ.choose_telemetry("cpu")
    assert isinstance(tel, GQ.FakeTelemetry) and "not a GPU" in why
    import builtins
    real_import = builtins.__import__

    def no_pynvml(name, *a, **kw):
        if name == "pynvml":
            raise ImportError("no pynvml")
        return real_import(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    monkeypatch.setattr(GQ.shutil, "which", lambda _: None)
    tel, why = GQ.choose_telemetry("cuda:1")
    assert tel.kind == "none" and "no nvidia-smi" in why and tel.read()["sm_clock_mhz"] is None
    monkeypatch.setattr(GQ.shutil, "which", lambda _: "/usr/bin/nvidia-smi")
    tel, why = GQ.choose_telemetry("cuda:1")
    assert isinstance(tel, GQ.SmiTelemetry) and tel.index == 1 and "pynvml unavailable" in why

    class Done:
        def __init__(self, out: str):
            self.returncode, self.stdout, self.stderr = 0, out, ""
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        q = cmd[2]
        return Done("1755, 612.35, 61\n" if "clocks.sm" in q else "570.86, 1980, 2619, 700.00, NVIDIA H100 80GB HBM3\n")
    monkeypatch.setattr(GQ.subprocess, "run", fake_run)
    assert tel.read() == {"sm_clock_mhz": 1755.0, "power_w": 612.35, "temperature_c": 61.0}
    st = tel.static()
    assert st["driver"] == "570.86" and st["power_limit_w"] == 700.0 and st["max_sm_clock_mhz"] == 1980.0
    assert seen[0][1] == "--id=1"


def test_unknown_phase_and_missing_gpu_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown phase"):
        GQ.run_quick(tmp_path, device="cpu", profile="tiny", phases=("gemm", "warp"), **QUIET)
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="--device cpu --profile tiny"):
            GQ.run_quick(tmp_path, device="cuda", profile="tiny", **QUIET)


def test_flash_without_gqa_times_expanded_heads_and_says_so(tmp_path, monkeypatch):
    """Where SDPA's flash backend refuses enable_gqa, the shape is timed on K / V expanded to every head (recorded in
    `gqa_expanded`), its row keeping the model's kv_heads."""
    from bench.kernels import opbench
    real = opbench.build

    def no_gqa(op, shape, dtype="fp32", device="cpu"):
        if op == "flash_attn" and shape.get("kv_heads") != shape.get("heads"):
            raise RuntimeError("No available kernel. Aborting execution.")
        return real(op, shape, dtype, device)
    monkeypatch.setattr(opbench, "build", no_gqa)
    run = GQ.run_quick(tmp_path, device="cpu", profile="tiny", budget_s=30, phases=("attention",), **QUIET)
    assert run["stopped"] == "all phases finished" and run["phases"]["attention"]["skipped_points"] == 0
    df = store_io.read_shards(tmp_path, "ops")
    gqa = df["kv_heads"] != df["heads"]
    assert gqa.any() and df.loc[gqa, "gqa_expanded"].all() and not df.loc[~gqa, "gqa_expanded"].any()


def test_the_cli_counts_its_start_up_against_the_budget():
    assert 0 < GQ.process_age_s() < 24 * 3600


def test_nvml_index_follows_cuda_visible_devices():
    assert GQ.nvml_index(0, "") == 0 and GQ.nvml_index(1, "") == 1
    assert GQ.nvml_index(0, "3,5") == 3 and GQ.nvml_index(1, "3,5") == 5
    assert GQ.nvml_index(0, "GPU-1234abcd") == 0  # UUIDs: left to the driver's order

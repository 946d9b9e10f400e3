"""`python -m bench cpu-platform` (bench/cpu/loop.py) and its pieces, without measuring anything for real:
the plan, the phase order and record, resuming on the same machine only, --fresh, the machine folder
for another machine's sets; the train phase ingesting only this machine's sets; the end-to-end
calibration (bench/cpu/e2e.py) fitting the host term on given step times; the in-context sampler
(bench/cpu/context.py) on one tiny layer; one tiny real HF training job per runner."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import bench.cli as C
import bench.cpu.loop as LP
from bench.sampling import design as D
from bench.sampling import store_io

REPO = Path(__file__).resolve().parents[1]


def _args(tmp_path: Path, *extra: str) -> list[str]:
    return ["cpu-platform", "--out-root", str(tmp_path / "samples"), "--models-dir", str(tmp_path / "models"),
            "--store", str(tmp_path / "st.duckdb"), "--no-wait", "--no-progress", "--no-catalog", *extra]


@pytest.fixture
def fake_phases(monkeypatch):
    """Every phase replaced by a recorder; the sampling phases write one shard into their set."""
    calls: list[tuple[str, float]] = []
    fail: dict[str, int] = {}

    def make(name):
        def fn(L, budget, q):
            calls.append((name, budget))
            if fail.get(name):
                fail[name] -= 1
                time.sleep(0.2)
                raise RuntimeError(f"{name} broke")
            if name in ("ops-2t", "ops-1t", "coll-1t"):
                p = "cpu-2t" if name == "ops-2t" else "cpu-1t"
                from bench.env import this_machine
                m = this_machine(1)
                store_io.update_manifest(L.sets[p], p, facts={"machine": m.to_dict()},
                                         run={"run_id": name, "kind": "ops"})
                store_io.write_shard(L.sets[p], "ops", name, 0, [{"platform": p, "op": "res_add", "pass": "fwd",
                                                                  "duration_s": 1e-5}])
            return {"phase": name, "waited_s": 0.0}
        return fn
    for n in LP.PHASES:
        monkeypatch.setitem(LP.PHASE_FUNCS, n, make(n))
    return calls, fail


def test_plan_shows_phases_budgets_and_destinations_and_measures_nothing(tmp_path, capsys, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("--plan measured something")
    for n in LP.PHASES:
        monkeypatch.setitem(LP.PHASE_FUNCS, n, boom)
    assert C.main(_args(tmp_path, "--plan")) == 0
    out = capsys.readouterr().out
    for n in LP.DEFAULT_PHASES:
        assert f"\n  {n} " in out
    assert "curve" not in out.split("phase")[1]  # opt-in
    total = sum(s.budget_s for s in LP.SPECS if s.name in LP.DEFAULT_PHASES)
    assert total <= LP.LIMIT_S and re.search(rf"\n  total +{total:.0f} s  19.4 min of work \(limit 20 min\)", out)
    for n in LP.DEFAULT_PHASES:
        assert re.search(rf"\n  {n} +{LP.PHASES[n].budget_s:.0f} s  ", out)
    assert "record      : " in out and "sample sets : " in out
    assert not (tmp_path / "samples").exists()  # nothing written
    # budgets can be set per phase (and with the older flags)
    assert C.main(_args(tmp_path, "--plan", "--budget", "ops-2t=100", "--budget-1t", "50", "--phases", "ops-2t",
                        "ops-1t")) == 0
    out = capsys.readouterr().out
    assert re.search(r"ops-2t +100 s", out) and re.search(r"ops-1t +50 s", out) and re.search(r"total +150 s", out)


def test_loop_runs_in_order_records_every_phase_and_resumes_after_a_failure(tmp_path, fake_phases, capsys):
    calls, fail = fake_phases
    fail["calibrate"] = 1
    assert C.main(_args(tmp_path)) == 1
    assert [c[0] for c in calls] == list(LP.DEFAULT_PHASES[:LP.DEFAULT_PHASES.index("calibrate") + 1])
    rec = json.loads((tmp_path / "samples" / LP.RECORD_FILE).read_text())
    assert rec["status"] == "running" and rec["machine_id"] and rec["plan"] == list(LP.DEFAULT_PHASES)
    assert rec["phases"]["ops-2t"]["status"] == "done" and rec["phases"]["ops-2t"]["result"] == {"phase": "ops-2t"}
    assert rec["phases"]["calibrate"]["status"] == "failed" and "calibrate broke" in rec["phases"]["calibrate"]["error"]
    spent = rec["phases"]["calibrate"]["spent_s"]
    assert spent >= 0.2
    calls.clear()
    assert C.main(_args(tmp_path)) == 0  # the same command again: resumes
    assert [c[0] for c in calls] == ["calibrate", "speed-check"]
    assert calls[0][1] == pytest.approx(LP.PHASES["calibrate"].budget_s - spent, abs=0.05)  # what is left of it
    rec = json.loads((tmp_path / "samples" / LP.RECORD_FILE).read_text())
    assert rec["status"] == "done" and rec["finished_at"]
    assert all(rec["phases"][n]["status"] == "done" for n in LP.DEFAULT_PHASES)
    cap = capsys.readouterr()
    assert "resuming the loop started" in cap.err and "phase ops-2t: done" in cap.err
    assert re.search(r"phase +budget +spent +waited +status", cap.out)
    assert re.search(r"\n  calibrate +240 s +\d+ s +\d+ s +done", cap.out)
    assert re.search(r"\n  total +1165 s +\d+ s +\d+ s +done", cap.out)


def test_a_finished_loop_is_not_extended_and_fresh_starts_over(tmp_path, fake_phases, capsys):
    calls, _ = fake_phases
    assert C.main(_args(tmp_path)) == 0
    loop_id = json.loads((tmp_path / "samples" / LP.RECORD_FILE).read_text())["loop_id"]
    calls.clear()
    assert C.main(_args(tmp_path)) == 2 and calls == []
    err = capsys.readouterr().err
    assert "already hold samples of this machine" in err and "--fresh" in err
    assert C.main(_args(tmp_path, "--phases", "train", "calibrate")) == 0  # later phases on the same sets: fine
    assert [c[0] for c in calls] == ["train", "calibrate"]
    rec = json.loads((tmp_path / "samples" / LP.RECORD_FILE).read_text())  # ... in the same record, still done
    assert rec["status"] == "done" and rec["plan"] == list(LP.DEFAULT_PHASES) and rec["loop_id"] == loop_id
    calls.clear()
    assert C.main(_args(tmp_path, "--fresh")) == 0
    assert [c[0] for c in calls] == list(LP.DEFAULT_PHASES)
    prev = list((tmp_path / "samples" / "previous").iterdir())
    assert len(prev) == 1 and (prev[0] / "cpu-2t" / "manifest.json").exists() and (prev[0] / LP.RECORD_FILE).exists()


def test_another_machines_sets_send_this_machine_to_its_own_folder(tmp_path, fake_phases, capsys):
    from predictor.hardware.machine import Machine
    calls, _ = fake_phases
    other = Machine(vendor="GenuineIntel", model_name="Intel Xeon", family="6", model="143", stepping="8", cores=2,
                    arch="x86_64", l2="2048K", l3="107520K", isa=["amx_tile", "avx512f"], torch="2.13.0")
    root = tmp_path / "samples"
    for p in ("cpu-2t", "cpu-1t"):
        store_io.update_manifest(root / p, p, facts={"machine": other.to_dict()}, run={"run_id": "x", "kind": "ops"})
        store_io.write_shard(root / p, "ops", "x", 0,
                             [{"platform": p, "op": "res_add", "pass": "fwd", "duration_s": 1.0}])
    before = {p: (root / p / "manifest.json").read_text() for p in ("cpu-2t", "cpu-1t")}
    assert C.main(_args(tmp_path, "--plan")) == 0
    out = capsys.readouterr().out
    from bench.env import this_machine
    here = this_machine()
    assert f"samples/machine-{here.id}/cpu-2t" in out and "holds samples of another machine: Intel Xeon" in out
    assert C.main(_args(tmp_path)) == 0
    mine = root / f"machine-{here.id}"
    assert (mine / LP.RECORD_FILE).exists() and store_io.set_machine(mine / "cpu-2t").id == here.id
    assert {p: (root / p / "manifest.json").read_text() for p in ("cpu-2t", "cpu-1t")} == before  # untouched
    assert not (root / LP.RECORD_FILE).exists()
    assert [c[0] for c in calls] == list(LP.DEFAULT_PHASES)


def _synthetic_set(out: Path, platform: str, machine, scale: float, ops=("res_add", "layernorm")) -> None:
    rows = []
    for op in ops:
        for p in D.op_design(op, 24, "cpu"):
            for ps in ("fwd", "bwd"):
                el = (p.shape["batch"] or 1) * (p.shape["seq"] or 1) * (p.shape["hidden"] or 1)
                rows.append({"platform": platform, "op": op, "pass": ps, **p.shape, "dtype": "fp32",
                             "duration_s": scale * (2e-6 + el * 1e-9 * (2 if ps == "bwd" else 1)),
                             "design_index": p.index, "measured_at": store_io.now_iso(),
                             "source": f"synthetic {machine.model_name}"})
    store_io.update_manifest(out, platform, facts={"machine": machine.to_dict(), "device_name": machine.model_name},
                             run={"run_id": "syn", "kind": "ops", "started_at": store_io.now_iso()})
    store_io.write_shard(out, "ops", "syn", 0, rows)


def test_train_phase_ingests_and_trains_only_this_machines_sets(tmp_path):
    from bench.env import this_machine
    from predictor.hardware.machine import Machine, mismatch_warning
    from predictor.samples.store import connect, ingest_path
    here = this_machine()
    other = Machine(vendor="GenuineIntel", model_name="Intel Xeon", family="6", model="143", stepping="8", cores=2,
                    arch="x86_64", l2="2048K", l3="107520K", isa=["avx512f"], torch="2.13.0")
    root = tmp_path / "samples"
    _synthetic_set(root / "cpu-2t", "cpu-2t", other, scale=10.0)  # another machine's committed set
    store = str(tmp_path / "st.duckdb")
    ingest_path(root / "cpu-2t", store_path=store)  # ... already in the store, as setup.sh does
    mroot = store_io.machine_root(root, ["cpu-2t"], here)
    assert mroot == root / f"machine-{here.id}"
    _synthetic_set(mroot / "cpu-2t", "cpu-2t", here, scale=1.0)
    models = tmp_path / "models"
    trained = LP.train_platforms(mroot, store, models, platforms=("cpu-2t",), log=lambda m: None)
    assert trained == {"cpu-2t": 4}
    with connect(store, read_only=True) as con:
        src = {r[0] for r in con.execute("SELECT DISTINCT source FROM op_samples WHERE platform='cpu-2t'").fetchall()}
    assert src == {f"synthetic {here.model_name}"}  # the other machine's rows are gone from the store
    path = LP.record_sampled_on("cpu-2t", mroot / "cpu-2t", models, "test")
    rec = json.loads(path.read_text())
    assert rec["machine_id"] == here.id and rec["sample_runs"] == ["syn"]
    assert mismatch_warning("cpu-2t", models, here) is None
    assert "this machine is Intel Xeon" in mismatch_warning("cpu-2t", models, other)


def _copy_models(tmp_path: Path) -> Path:
    models = tmp_path / "models"
    for p in ("cpu-2t", "cpu-1t"):
        shutil.copytree(REPO / "models_store" / p, models / p,
                        ignore=shutil.ignore_patterns("speed_check.json", "host_overhead.json", "validation*"))
    return models


def test_calibration_fits_the_host_term_on_fresh_steps_and_writes_the_validation_record(tmp_path):
    """With step times made as 'kernel prediction + 3 ms per layer pass', the fit finds that host term
    and the cross-validated error is small; files land where predict reads them."""
    from bench.cpu import e2e
    from predictor.step.overhead import load_host_overhead
    models = _copy_models(tmp_path)
    h_true = 0.003

    def fake(platform):
        def runner(configs, deadline):
            rows = e2e.predict_rows([{**c, "measured_s": 1.0} for c in configs], platform,
                                    e2e.PLATFORM_DP[platform], str(models), host=False)
            return [{**c, "measured_s": r["predicted_s"] + 2 * c["layers"] * h_true, "steps_s": [], "load": 0.1,
                     "discarded_steps": 0} for c, r in zip(configs, rows, strict=True)]
        return runner
    measure = {p: fake(p) for p in ("cpu-2t", "cpu-1t")}
    out = tmp_path / "cal"
    rec = e2e.calibrate(out, models_dir=str(models), store=str(tmp_path / "st.duckdb"), budget_s=None,
                        loop_id="L1", machine={"id": "m1"}, log=lambda m: None, measure=measure)
    for p in ("cpu-2t", "cpu-1t"):
        t = rec["tables"][p]
        assert len(t["runs"]) == len(e2e.calibration_configs(p)) and t["left_out"] == []
        ho = load_host_overhead(models, p)
        assert ho.host_s_per_layer_pass == pytest.approx(h_true, rel=0.2) and ho.blend_p == 1.0
        val = json.loads((models / p / "validation.json").read_text())
        assert val["mape"] == pytest.approx(t["fit"]["cv_mape"]) and val["mape"] < 0.05
        assert val["n_runs"] == len(t["runs"])
        assert "leave-one-model-out" in val["mape_basis"]
        runs = pd.read_csv(out / f"{p}-runs.csv")
        assert len(runs) == len(t["runs"]) and (runs["platform"] == p).all()
        assert (models / p / "validation_runs.csv").exists()
    from predictor.samples.store import read_measured_runs
    st = read_measured_runs(platform="cpu-2t", store_path=tmp_path / "st.duckdb")
    assert len(st) == len(e2e.calibration_configs("cpu-2t"))
    # the same loop again: what it measured is kept, nothing is measured twice
    def boom(configs, deadline):
        raise AssertionError("measured again")
    again = e2e.calibrate(out, models_dir=str(models), store=str(tmp_path / "st.duckdb"), budget_s=None,
                          loop_id="L1", log=lambda m: None, measure={"cpu-2t": boom, "cpu-1t": boom})
    assert len(again["tables"]["cpu-2t"]["runs"]) == len(e2e.calibration_configs("cpu-2t"))


def test_calibration_budget_leaves_configs_out_and_says_which(tmp_path):
    from bench.cpu import e2e
    models = _copy_models(tmp_path)

    def slow(configs, deadline):
        out = []
        for c in configs:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
            out.append({**c, "measured_s": 0.1 * c["layers"], "steps_s": [], "load": 0, "discarded_steps": 0})
        return out
    rec = e2e.calibrate(tmp_path / "cal", models_dir=str(models), budget_s=0.12, loop_id="L", log=lambda m: None,
                        measure={"cpu-2t": slow, "cpu-1t": slow}, update_store=False)
    t = rec["tables"]["cpu-2t"]
    assert 0 < len(t["runs"]) < len(e2e.CALIBRATION) and t["left_out"]
    assert [r["name"] for r in t["runs"]] == [c[0] for c in e2e.CALIBRATION[:len(t["runs"])]]


def test_context_times_a_layer_against_its_operators(tmp_path):
    pytest.importorskip("transformers")
    from bench.cpu.context import run_context
    from predictor.hardware.machine import Machine
    calls = []

    def const(fn, setup):
        calls.append(fn)
        return 1e-3
    run = run_context("test-cpu", tmp_path / "set", threads=1, budget_s=None, log=lambda m: None, time_fn=const,
                      shapes=[("gpt", 64, 2, None, None, 32, 2), ("llama", 64, 4, 2, 176, 32, 2)])
    d = run["dispatch"]
    assert {"eager_op_us", "autograd_op_us", "backward_call_fixed_us", "backward_per_node_us"} <= set(d)
    gpt, llama = run["layers"]
    # the decomposition's layer: GPT 10 op calls per pass, Llama 11 (rope); HF issues many more aten ops
    assert gpt["decomposed_ops_fwd"] == 10 and llama["decomposed_ops_fwd"] == 11
    assert gpt["aten_ops_fwd"] > 2 * gpt["decomposed_ops_fwd"] and llama["aten_ops_bwd"] > gpt["aten_ops_bwd"]
    assert gpt["ratio_fwd"] == pytest.approx(1 / 10) and gpt["ops_s"]["layernorm.fwd"] == pytest.approx(2e-3)
    # each shape: the layer's two passes, then every distinct decomposed op of each pass once
    # (GPT: layernorm, qkv_proj, flash_attn, attn_out_proj, res_add, mlp_up, gelu, mlp_down; Llama adds rope)
    assert len(calls) == (2 + 2 * 8) + (2 + 2 * 9)
    rec = json.loads((tmp_path / "set" / "context.json").read_text())
    assert rec["runs"][0]["layers"][0]["arch"] == "gpt" and rec["runs"][0]["machine_id"]
    other = Machine(vendor="GenuineIntel", model_name="Intel Xeon", family="6", model="1", stepping="1", cores=2,
                    arch="x86_64", l2="1M", l3="30M", isa=[], torch="2.13.0")
    store_io.update_manifest(tmp_path / "foreign", "test-cpu", facts={"machine": other.to_dict()},
                             run={"run_id": "x", "kind": "ops"})
    with pytest.raises(store_io.ForeignSamples):
        run_context("test-cpu", tmp_path / "foreign", budget_s=0, log=lambda m: None, time_fn=const, shapes=[])


TINY_CFG = {"name": "t", "arch": "gpt", "layers": 1, "hidden": 32, "heads": 2, "kv_heads": None, "ffn": None,
            "seq": 16, "batch": 2, "vocab": 64}


def test_a_real_tiny_training_job_runs_in_a_fresh_process():
    pytest.importorskip("transformers")
    from bench.cpu.e2e import run_single
    (r,) = run_single([TINY_CFG], steps=2, warmup=1, threads=1, log=lambda m: None)
    assert r["name"] == "t" and r["measured_s"] > 0 and len(r["steps_s"]) >= 2
    assert "keeping freed memory" in r["allocator"] and r["measured_at"]


@pytest.mark.skipif(importlib.util.find_spec("torch.distributed.run") is None, reason="torchrun is not available")
def test_a_real_tiny_ddp_job_runs_under_torchrun():
    pytest.importorskip("transformers")
    from bench.cpu.e2e import run_ddp
    (r,) = run_ddp([{**TINY_CFG, "arch": "llama", "kv_heads": 1, "ffn": 64}], steps=2, warmup=1, log=lambda m: None)
    assert r["measured_s"] > 0 and r["job_attempts"] >= 1


def test_old_step_names_still_select_phases():
    import argparse
    a = argparse.Namespace(phases=None, steps=["ops2t", "coll", "train"])
    assert LP.selected_phases(a) == ["ops-2t", "coll-1t", "train"]
    assert np.isclose(sum(LP.budgets(argparse.Namespace()).values()),
                      sum(s.budget_s for s in LP.SPECS))


def test_a_job_whose_steps_change_regime_is_measured_once_more_and_pooled():
    from bench.cpu.e2e import pool_if_unsteady, unsteady
    gpt_d = [1.146, 1.112, 1.772, 1.734, 1.757, 1.767]     # measured 2026-11-28: 1.15 s, then 1.77 s for the rest
    assert unsteady(gpt_d)
    assert not unsteady([0.79, 1.051, 1.586, 0.947, 0.819, 0.824])   # one slow step is not a regime
    assert not unsteady([1.0, 2.0, 1.0])                    # too few steps to tell
    said: list[str] = []
    calls: list[int] = []

    def rerun() -> dict:
        calls.append(1)
        return {"name": "gpt-d", "measured_s": 1.30, "steps_s": [1.3, 1.28, 1.31, 1.29, 1.33, 1.3],
                "discarded_steps": 1}
    first = {"name": "gpt-d", "measured_s": 1.745, "steps_s": gpt_d, "discarded_steps": 1}
    r = pool_if_unsteady(first, rerun, said.append)
    assert calls == [1] and r["jobs"] == 2 and len(r["steps_s"]) == 12
    assert r["measured_s"] == pytest.approx(float(np.median(gpt_d + [1.3, 1.28, 1.31, 1.29, 1.33, 1.3])))
    assert r["job_measured_s"] == [1.745, 1.30] and r["discarded_steps"] == 2 and "regime" in said[0]
    steady = {"name": "a", "measured_s": 1.0, "steps_s": [1.0, 1.01, 0.99, 1.0]}
    assert pool_if_unsteady(steady, rerun, said.append) == {**steady, "jobs": 1} and calls == [1]


def test_catalog_device_mismatch_names_what_differs():
    from bench.sampling.device import catalog_device_mismatch
    cat = {"peak_tflops": {"fp32": 0.147}, "hbm_bandwidth_gbps": 34.0}
    assert catalog_device_mismatch({"peak_tflops": {"fp32": 0.16}, "hbm_bandwidth_gbps": 31.0}, cat) is None
    why = catalog_device_mismatch({"peak_tflops": {"fp32": 0.3456}, "hbm_bandwidth_gbps": 24.84}, cat)
    assert "peak fp32 GEMM 0.3456 TFLOP/s measured, 0.147 in the catalog" in why and "bandwidth" in why
    assert catalog_device_mismatch({"peak_tflops": {"fp32": 0.15}}, None) == "the catalog has no entry for this device"


def test_no_catalog_on_a_machine_unlike_the_catalogs_stops_at_the_device_phase(tmp_path, monkeypatch, capsys):
    """With --no-catalog the models are trained and judged against the catalog's cpu-host. On a machine more than
    twice as fast (an Intel Xeon at 0.346 TFLOP/s against the catalog's EPYC at 0.147) most GEMM samples then fail
    the physical bound and cpu-2t came out 40 % slow: the loop now stops at the device phase, names both figures
    and the fix, samples nothing and leaves the catalog alone."""
    import bench.env
    import bench.sampling.device as DV
    cat = json.loads((DV.CATALOG / "devices.json").read_text())["cpu-host"]
    fast = {dt: 2.4 * float(v) for dt, v in cat["peak_tflops"].items()}
    monkeypatch.setattr(DV, "measure", lambda *a, **k: {"fake": True})
    monkeypatch.setattr(DV, "cpu_device_entry", lambda m: {"peak_tflops": fast, "sources": [],
                                                           "hbm_bandwidth_gbps": cat["hbm_bandwidth_gbps"]})
    monkeypatch.setattr(bench.env, "wait_calm", lambda *a, **k: 0.0)
    ran: list[str] = []
    for n in LP.PHASES:
        if n != "device":
            monkeypatch.setitem(LP.PHASE_FUNCS, n, lambda L, b, q, n=n: ran.append(n) or {})
    before = (DV.CATALOG / "devices.json").read_bytes()
    assert C.main(_args(tmp_path)) == 1
    assert ran == [] and (DV.CATALOG / "devices.json").read_bytes() == before
    rec = json.loads((tmp_path / "samples" / LP.RECORD_FILE).read_text())
    err = rec["phases"]["device"]["error"]
    assert "not this machine" in err and "TFLOP/s measured" in err and "without --no-catalog" in err
    assert "Traceback" not in capsys.readouterr().err

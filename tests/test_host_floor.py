"""The measured host floor (predictor.step.host_floor, bench/sampling/host_floor.py): what `bench host-floor` measures,
how the file is checked, and that the end-to-end fit keeps each framework's host term at or above it."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from predictor.calibrate import framework as cf
from predictor.paths import ArtifactError
from predictor.step.host_floor import (
    HOST_FLOOR_FILE,
    host_floor_from_dict,
    load_host_floor,
    save_host_floor,
    save_tighter_floor,
)
from predictor.step.terms import EndToEndTerms, HostTerm
from tests.test_calibrate_framework import _runs

GOOD = {"host_s_per_layer_pass": 3e-4, "applies_to": ["megatron-deepspeed", "fsdp"], "kernels_per_layer_pass": 26.5,
        "machine": {"short": "AMD EPYC (test)"}, "measured_at": "2026-11-25T00:00:00+00:00", "source": "test"}


def test_a_valid_record_loads_and_applies_only_to_its_frameworks(tmp_path):
    save_host_floor(GOOD, tmp_path)
    floor, warn = load_host_floor(tmp_path)
    assert warn is None and floor is not None
    assert floor.for_framework("fsdp") == pytest.approx(3e-4)
    assert floor.for_framework("ddp") == 0.0
    assert "0.30 ms per layer pass" in floor.in_words() and "AMD EPYC (test)" in floor.in_words()


@pytest.mark.parametrize("bad, field", [
    ({"host_s_per_layer_pass": -1e-4}, "host_s_per_layer_pass"),
    ({"host_s_per_layer_pass": 0.5}, "host_s_per_layer_pass"),          # half a second: no framework's floor
    ({"host_s_per_layer_pass": None}, "host_s_per_layer_pass"),
    ({"applies_to": ["jax"]}, "applies_to"),
    ({"applies_to": []}, "applies_to"),
    ({"kernels_per_layer_pass": "many"}, "kernels_per_layer_pass"),
    ({"recompute_host_passes": 0.1}, "recompute_host_passes"),
    ({"recompute_host_passes": 9.0}, "recompute_host_passes"),
])
def test_a_bad_record_names_its_field(bad, field, tmp_path):
    with pytest.raises(ArtifactError, match=field):
        host_floor_from_dict({**GOOD, **bad})
    with pytest.raises(ArtifactError, match=field):
        save_host_floor({**GOOD, **bad}, tmp_path)        # never written
    assert not (tmp_path / HOST_FLOOR_FILE).exists()
    (tmp_path / HOST_FLOOR_FILE).write_text(json.dumps({**GOOD, **bad}))
    floor, warn = load_host_floor(tmp_path)
    assert floor is None and HOST_FLOOR_FILE in warn and field in warn


def test_saving_keeps_the_tighter_bound_of_two_machines_and_a_machine_replaces_its_own(tmp_path):
    def rec(ms: float, machine: str) -> dict:
        return {**GOOD, "host_s_per_layer_pass": ms * 1e-3, "machine": {"short": f"CPU {machine}", "id": machine}}
    path, why = save_tighter_floor(rec(0.8, "a"), tmp_path)
    assert path is not None and why is None                      # nothing saved yet
    path, why = save_tighter_floor(rec(0.3, "b"), tmp_path)      # another machine, lower: a looser bound
    assert path is None and "0.80 ms" in why and "CPU a" in why and "0.30 ms" in why
    assert load_host_floor(tmp_path)[0].host_s_per_layer_pass == pytest.approx(0.8e-3)
    path, _ = save_tighter_floor(rec(0.3, "b"), tmp_path, replace=True)    # unless told to
    assert path is not None and load_host_floor(tmp_path)[0].machine_id == "b"
    path, _ = save_tighter_floor(rec(0.9, "a"), tmp_path)        # higher: the tighter bound replaces it
    assert path is not None and load_host_floor(tmp_path)[0].host_s_per_layer_pass == pytest.approx(0.9e-3)
    path, _ = save_tighter_floor(rec(0.5, "a"), tmp_path)        # the same machine measured again replaces its own
    assert path is not None and load_host_floor(tmp_path)[0].host_s_per_layer_pass == pytest.approx(0.5e-3)


def test_no_file_is_no_floor(tmp_path):
    assert load_host_floor(tmp_path) == (None, None)


@pytest.fixture(scope="module")
def fsdp_runs() -> cf.RunSet:
    runs = cf.prepare_runs(pd.DataFrame(_runs("a", "fsdp", 1024, 8, 6) + _runs("b", "fsdp", 512, 8, 6)))
    # runs that want no host time at all: the bare kernel time plus a power term
    runs.measured_s = runs.predict(EndToEndTerms(power_factor=0.1, host={"fsdp": HostTerm(0.0, 2.0, 0.0)}))
    return runs


def test_the_fit_keeps_the_host_term_at_or_above_the_measured_floor(fsdp_runs):
    free = cf.fit_terms(fsdp_runs, options=cf.TermsFitOptions(max_evaluations=20))
    floor = host_floor_from_dict({**GOOD, "host_s_per_layer_pass": 1.2e-3})
    opt = cf.TermsFitOptions(max_evaluations=20).with_floor(floor)
    assert opt.floor_for("fsdp") == pytest.approx(1.2e-3) and opt.floor_for("ddp") == 0.0
    held = cf.fit_terms(fsdp_runs, options=opt)
    assert free.host["fsdp"].host_s_per_layer_pass < 0.6e-3           # the runs alone pull it down
    assert held.host["fsdp"].host_s_per_layer_pass >= 1.2e-3 - 1e-9    # the floor holds it
    # and the floor costs time: those runs are now predicted slower than by the free fit
    assert np.mean(fsdp_runs.predict(held)) > np.mean(fsdp_runs.predict(free))


def test_calibrate_framework_uses_the_floor_file_and_says_so(tmp_path):
    from predictor.samples.store import ingest_path
    f = tmp_path / "runs.csv"
    rows = [{**r, "step_time_s": 2.0 + 0.1 * i} for i, r in
            enumerate(_runs("x", "fsdp", 512, 4, 3) + _runs("y", "megatron-deepspeed", 512, 4, 3))]
    pd.DataFrame(rows).drop(columns=["run_id"]).assign(
        case_id=lambda d: [f"c{i}" for i in range(len(d))]).to_csv(f, index=False)
    db = tmp_path / "s.duckdb"
    ingest_path(f, store_path=db)
    models = tmp_path / "m"
    save_host_floor({**GOOD, "host_s_per_layer_pass": 1.5e-3, "recompute_host_passes": 1.6}, models)
    cal = cf.calibrate_framework(store_path=db, models_dir=models, save=False,
                                 options=cf.TermsFitOptions(max_evaluations=8))
    assert "bounded below by the floor measured on a CPU" in cal.terms.source
    assert "contention held at the published measurement" in cal.terms.source and "2507.03114" in cal.terms.source
    assert cal.terms.recompute_host_passes == pytest.approx(1.6)
    for fw in ("fsdp", "megatron-deepspeed"):
        assert cal.terms.host[fw].host_s_per_layer_pass >= 1.5e-3 - 1e-9
    off = cf.calibrate_framework(store_path=db, models_dir=models, save=False, use_host_floor=False,
                                 options=cf.TermsFitOptions(max_evaluations=8))
    assert "no measured host floor" in off.terms.source and off.terms.recompute_host_passes == 1.0
    (models / HOST_FLOOR_FILE).write_text("{not json")
    from predictor.model.errors import InfeasibleConfig
    with pytest.raises(InfeasibleConfig, match="host_floor"):
        cf.calibrate_framework(store_path=db, models_dir=models, save=False)


def test_bench_host_floor_measures_a_positive_time_and_counts_kernels():
    pytest.importorskip("torch")
    from bench.sampling.host_floor import measure_host_floor
    rec = measure_host_floor(rounds=3, iters=10, warmup=2)
    assert 0 < rec["host_s_per_layer_pass"] < 2e-3
    # full recomputation adds a no-grad forward, the checkpoint machinery and a forward with autograd: more
    # than the half pass a bare no-grad forward would be, less than the 4 passes the file allows
    assert 0.5 < rec["recompute_host_passes"] < 4.0
    # a GPT layer's forward + backward issues some tens of kernels per pass (views not counted)
    assert 10 <= rec["kernels_per_layer_pass"] <= 80
    floor = host_floor_from_dict(rec)          # what bench writes is what the predictor reads
    assert "megatron-deepspeed" in floor.applies_to and floor.machine


def test_recomputation_carries_the_measured_host_passes(tmp_path):
    from predictor.model.presets import get_preset
    from predictor.model.specs import Layout
    from predictor.plan.predict import Predictor
    from predictor.step.engine import rows_for
    from predictor.step.terms import save_terms
    m = get_preset("llama2-7b")
    pr = Predictor("dgx-a100-80gb", tmp_path / "none")
    lays = [Layout(num_gpus=8, tp=8, pp=1, dp=1, micro_batch=1, global_batch=8, seq_len=1024, recompute=rc,
                   framework="megatron-deepspeed") for rc in ("full", "none")]
    rows, structs = rows_for(m, lays)
    host = {}
    for rp in (1.0, 2.0):
        t = EndToEndTerms(host={"megatron-deepspeed": HostTerm(1.5e-3, 2.0, 0.0)}, recompute_host_passes=rp)
        ev = pr.engine.evaluate(m, rows, structs, 1024, "bf16", host=None, terms=t, provenance=False)
        host[rp] = ev.host_all_s
    assert host[2.0][0] > host[1.0][0] * 1.1        # full recomputation: more host passes, more host time
    assert host[2.0][1] == pytest.approx(host[1.0][1])   # no recomputation: unchanged
    save_terms(EndToEndTerms(recompute_host_passes=1.6), tmp_path)
    assert json.loads((tmp_path / "framework_terms.json").read_text())["recompute_host_passes"] == 1.6
    (tmp_path / "framework_terms.json").write_text(json.dumps({"recompute_host_passes": 40}))
    from predictor.step.terms import load_terms_checked
    terms, warn = load_terms_checked(tmp_path)
    assert terms is None and "recompute_host_passes" in warn


# ---- a MoE layer's host passes (bench host-floor --moe; terms.moe_host_passes; engine._framework_host) ----------

MOE = {"moe_layer_host_passes": 1.9, "applies_to": ["megatron"], "measured_at": "2026-12-03T00:00:00+00:00"}


@pytest.mark.parametrize("bad, field", [
    ({"moe_layer_host_passes": 0.5}, "moe.moe_layer_host_passes"),     # fewer than a dense layer: not a MoE layer
    ({"moe_layer_host_passes": 40.0}, "moe.moe_layer_host_passes"),
    ({"moe_layer_host_passes": None}, "moe.moe_layer_host_passes"),
    ({"applies_to": ["jax"]}, "moe.applies_to"),
])
def test_a_bad_moe_record_names_its_field(bad, field):
    with pytest.raises(ArtifactError, match=field):
        host_floor_from_dict({**GOOD, "moe": {**MOE, **bad}})


def test_the_moe_record_is_added_to_the_saved_floor_and_reaches_the_terms(tmp_path):
    from predictor.step.host_floor import save_moe_passes
    from predictor.step.terms import load_terms_checked, save_terms
    with pytest.raises(ArtifactError, match="bench host-floor --save"):
        save_moe_passes(MOE, tmp_path)                    # nothing to add it to
    save_host_floor(GOOD, tmp_path)
    save_moe_passes(MOE, tmp_path)
    floor, _ = load_host_floor(tmp_path)
    assert floor.host_s_per_layer_pass == pytest.approx(3e-4)           # the dense floor untouched
    assert floor.moe_passes_for("megatron") == pytest.approx(1.9) and floor.moe_passes_for("fsdp") == 1.0
    save_terms(EndToEndTerms(), tmp_path)
    terms, warn = load_terms_checked(tmp_path)
    assert warn is None and terms.moe_passes_for("megatron") == pytest.approx(1.9)
    assert terms.moe_passes_for("deepspeed") == 1.0
    # a terms file that states its own value keeps it
    save_terms(EndToEndTerms(moe_host_passes={"megatron": 1.2}), tmp_path)
    terms, _ = load_terms_checked(tmp_path)
    assert terms.moe_passes_for("megatron") == pytest.approx(1.2)
    (tmp_path / "framework_terms.json").write_text(json.dumps({"moe_host_passes": {"megatron": 0.2}}))
    terms, warn = load_terms_checked(tmp_path)
    assert terms is None and "moe_host_passes.megatron" in warn


def test_bench_measures_a_moe_layer_as_more_host_passes_than_a_dense_one():
    pytest.importorskip("torch")
    from bench.sampling.host_floor import measure_moe_host_passes
    rec = measure_moe_host_passes(rounds=3, iters=5, warmup=2)
    # the router, aux loss, permutations and grouped GEMMs issue more operators than the dense MLP they replace
    assert rec["moe_kernels_per_layer_pass"] > rec["dense_kernels_per_layer_pass"]
    assert 1.0 < rec["moe_layer_host_passes"] < 10.0
    passes, applies = host_floor_from_dict({**GOOD, "moe": rec}).moe_layer_host_passes, rec["applies_to"]
    assert passes == pytest.approx(rec["moe_layer_host_passes"]) and applies == ["megatron"]


def test_the_per_expert_record_is_checked_and_reaches_the_terms(tmp_path):
    from predictor.step.host_floor import save_moe_passes
    from predictor.step.terms import load_terms_checked, save_terms
    per = {**MOE, "moe_host_passes_per_local_expert": 0.1, "layer": {"experts": 8}}
    for bad in (-0.1, 2.0, "x"):
        with pytest.raises(ArtifactError, match=r"moe\.moe_host_passes_per_local_expert"):
            host_floor_from_dict({**GOOD, "moe": {**per, "moe_host_passes_per_local_expert": bad}})
    with pytest.raises(ArtifactError, match=r"moe\.layer\.experts"):     # how many experts the measured layer had
        host_floor_from_dict({**GOOD, "moe": {**per, "layer": {}}})
    # a record measured before the per-expert GEMMs were: nothing per expert
    assert host_floor_from_dict({**GOOD, "moe": MOE}).moe_passes_per_expert_for("megatron") == 0.0
    save_host_floor(GOOD, tmp_path)
    save_moe_passes(per, tmp_path)
    floor, _ = load_host_floor(tmp_path)
    assert floor.moe_passes_per_expert_for("megatron") == pytest.approx(0.1)
    assert floor.moe_passes_per_expert_for("fsdp") == 0.0
    save_terms(EndToEndTerms(), tmp_path)
    terms, warn = load_terms_checked(tmp_path)
    assert warn is None
    # the measured layer (8 experts) is 1.9 passes: 1.1 without its experts' GEMMs, 0.1 more per local expert
    assert terms.moe_passes_for("megatron", 8) == pytest.approx(1.9)
    assert terms.moe_passes_for("megatron", 16) == pytest.approx(1.1 + 1.6)
    assert terms.moe_passes_for("megatron") == pytest.approx(1.1)
    assert terms.moe_passes_for("deepspeed", 16) == 1.0
    # a terms file's own value is kept, and checked
    save_terms(EndToEndTerms(moe_host_passes={"megatron": 1.2}, moe_host_passes_per_expert={"megatron": 0.05}),
               tmp_path)
    terms, _ = load_terms_checked(tmp_path)
    assert terms.moe_passes_for("megatron", 4) == pytest.approx(1.4)
    (tmp_path / "framework_terms.json").write_text(json.dumps({"moe_host_passes_per_expert": {"megatron": 5}}))
    terms, warn = load_terms_checked(tmp_path)
    assert terms is None and "moe_host_passes_per_expert.megatron" in warn


def test_bench_measures_what_one_gemm_per_expert_adds():
    pytest.importorskip("torch")
    import torch

    from bench.sampling.host_floor import _moe_layer_class, _time_step
    torch.manual_seed(0)
    x = torch.randn(4, 1, 16, requires_grad=True)
    moe = _moe_layer_class()
    grouped, looped = moe(16, 2, 0.0, experts=8), moe(16, 2, 0.0, experts=8, per_expert_gemms=True)
    looped.load_state_dict(grouped.state_dict())
    torch.manual_seed(1)
    a = grouped(x)
    torch.manual_seed(1)
    b = looped(x)
    # the same arithmetic (bf16 GEMMs either way), issued as one grouped call or as one GEMM per expert
    assert torch.allclose(a, b, atol=1e-2)
    # a forward GEMM per expert and a data- and a weight-gradient GEMM per expert in the backward, for fc1 and fc2
    # (torch's grouped GEMM on a CPU loops the same GEMMs inside one call: the operators agree, the host calls not)
    mm = _mm_calls(looped, x)
    assert mm >= 3 * 2 * 8 and mm == _mm_calls(grouped, x)
    assert _time_step(looped, x, 3) > 0


def _mm_calls(model, x):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(x).sum().backward()
    return sum(e.name == "aten::mm" for e in prof.events())


def _host_of(model, layouts, terms):
    from predictor.plan.predict import Predictor
    from predictor.step.engine import rows_for
    pr = Predictor("dgx-h100")
    rows, structs = rows_for(model, layouts)
    return pr.engine.evaluate(model, rows, structs, layouts[0].seq_len, "bf16", host=None, terms=terms,
                              provenance=False).host_all_s


def test_moe_layers_carry_the_measured_host_passes_and_nothing_else_moves():
    from dataclasses import replace as dc_replace

    from predictor.model.presets import get_preset
    from predictor.model.specs import Layout
    h = 5e-3     # host-bound: a large per-layer host time, so the blend is about the host time itself
    base = EndToEndTerms(host={"default": HostTerm(h, 2.0, 0.0)})
    moe = dc_replace(base, moe_host_passes={"megatron": 2.0})
    qwen = get_preset("qwen3-30b-a3b")
    lays = [Layout(num_gpus=8, tp=1, pp=1, dp=8, ep=8, micro_batch=1, global_batch=8, seq_len=256, framework=fw)
            for fw in ("megatron", "fsdp")]
    off, on = _host_of(qwen, lays, base), _host_of(qwen, lays, moe)
    assert on[1] == pytest.approx(off[1])               # another framework: not measured for it, unchanged
    assert on[0] > off[0] * 1.5
    # megatron: every layer of Qwen3-30B-A3B is a MoE layer, so its host time is that of twice the host time per pass
    twice = EndToEndTerms(host={"default": HostTerm(2 * h, 2.0, 0.0)})
    assert on[0] == pytest.approx(_host_of(qwen, lays, twice)[0], rel=1e-9)
    dense = get_preset("llama2-7b")
    dl = [Layout(num_gpus=8, tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, seq_len=256)]
    assert _host_of(dense, dl, moe)[0] == pytest.approx(_host_of(dense, dl, base)[0])   # a dense model: unchanged
    # leading dense layers of a MoE model keep one pass: 24 dense + 24 MoE layers at 2 passes = 1.5x per layer
    mixed = dc_replace(qwen, dense_layers=24)
    one_and_half = EndToEndTerms(host={"default": HostTerm(1.5 * h, 2.0, 0.0)})
    assert _host_of(mixed, lays[:1], moe)[0] == pytest.approx(_host_of(mixed, lays[:1], one_and_half)[0], rel=1e-9)


def test_each_local_expert_adds_its_measured_passes():
    from dataclasses import replace as dc_replace

    from predictor.model.presets import get_preset
    from predictor.model.specs import Layout
    h = 5e-3
    base = EndToEndTerms(host={"default": HostTerm(h, 2.0, 0.0)}, moe_host_passes={"megatron": 2.0})
    per_expert = dc_replace(base, moe_host_passes_per_expert={"megatron": 0.125})
    qwen = get_preset("qwen3-30b-a3b")      # 128 experts
    lay = {ep: Layout(num_gpus=8, tp=1, pp=1, dp=8, ep=ep, micro_batch=1, global_batch=8, seq_len=256)
           for ep in (8, 2)}
    # ep 8: 16 local experts x 0.125 = 2 more passes: the host time of 4 passes per MoE layer
    four = EndToEndTerms(host={"default": HostTerm(4 * h, 2.0, 0.0)})
    assert _host_of(qwen, [lay[8]], per_expert)[0] == pytest.approx(_host_of(qwen, [lay[8]], four)[0], rel=1e-9)
    # fewer ranks hold more experts each: ep 2 carries 64 local experts, more host time than ep 8
    assert _host_of(qwen, [lay[2]], per_expert)[0] > _host_of(qwen, [lay[8]], per_expert)[0]
    # without the per-expert record nothing depends on the experts per rank beyond the GPU work
    assert _host_of(qwen, [lay[8]], base)[0] < _host_of(qwen, [lay[8]], per_expert)[0]


def test_a_moe_prediction_says_its_host_passes_and_a_dense_one_does_not():
    from predictor.model.presets import get_preset
    from predictor.model.specs import Layout
    from predictor.plan.predict import Predictor
    pr = Predictor("dgx-h100")
    lay = Layout(num_gpus=8, tp=1, pp=1, dp=8, ep=8, micro_batch=1, global_batch=8, seq_len=1024)
    passes = pr.terms.moe_passes_for("megatron", 128 / 8)     # Qwen3-30B-A3B at ep 8: 16 local experts
    assert passes > pr.terms.moe_passes_for("megatron") > 1.0   # the shipped floor carries the measured MoE record
    said = [w for w in pr.predict(get_preset("qwen3-30b-a3b"), lay).warnings if "dense layer passes" in w]
    assert len(said) == 1 and f"{passes:.2f} dense layer passes" in said[0] and "16 local experts" in said[0]
    # a framework the measurement does not apply to says nothing
    fsdp = Layout(num_gpus=8, tp=1, pp=1, dp=8, ep=8, micro_batch=1, global_batch=8, seq_len=1024, framework="ddp")
    assert not [w for w in pr.predict(get_preset("qwen3-30b-a3b"), fsdp).warnings if "dense layer passes" in w]
    dense = Layout(num_gpus=8, tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, seq_len=1024)
    assert not [w for w in pr.predict(get_preset("llama2-7b"), dense).warnings if "dense layer passes" in w]

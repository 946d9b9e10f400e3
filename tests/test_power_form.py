"""The power factor's two forms (predictor.step.terms): 'linear' adds beta x FLOPs / MAMF to every tensor-core kernel;
'cap' runs none faster than MAMF / (1 + beta). The curve the engine keeps per unit, the engine's use of it, the
ceiling it implies, the terms file and the fit."""
from __future__ import annotations

import json

import numpy as np
import pytest

from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.plan.predict import Predictor
from predictor.plan.search import SearchSpace, search
from predictor.step.terms import CapCurve, EndToEndTerms, HostTerm, load_terms_checked, save_terms


def _brute(t, ideal, beta, alpha=1.0):
    t, ideal = np.asarray(t), np.asarray(ideal)
    keep = ideal > 0
    return float(np.maximum(0.0, (1 + beta) * ideal[keep] - alpha * t[keep]).sum())


@pytest.mark.parametrize("seed", range(5))
def test_the_cap_curve_adds_what_each_kernel_lacks_of_the_capped_rate(seed):
    rng = np.random.default_rng(seed)
    ideal = rng.uniform(1e-5, 1e-3, 40) * (rng.uniform(size=40) > 0.2)   # some not tensor-core work (0)
    t = ideal * rng.uniform(0.95, 2.5, 40) + (ideal == 0) * 1e-4
    curve = CapCurve.of(t, ideal)
    for beta in (0.0, 0.05, 0.2, 0.5, 1.0):
        for alpha in (1.0, 1.1):
            assert curve.added_s(beta, alpha) == pytest.approx(_brute(t, ideal, beta, alpha), rel=1e-9, abs=1e-15)
    assert CapCurve().added_s(0.3) == 0.0
    # a kernel sampled far below the achievable rate pays nothing; one sampled at it pays beta x its ideal time
    assert CapCurve.of([3.0], [1.0]).added_s(0.5) == 0.0
    assert CapCurve.of([1.0], [1.0]).added_s(0.25) == pytest.approx(0.25)


def _predictor(terms: EndToEndTerms | None, platform: str = "dgx-a100-80gb") -> Predictor:
    P = Predictor(platform)
    P.terms = terms
    return P


LAYOUT = Layout(num_gpus=8, tp=2, pp=2, dp=2, micro_batch=2, global_batch=64, seq_len=2048, recompute="full")


def test_the_engine_charges_each_unit_what_its_curve_says():
    """The cap form's seconds in a prediction are the units' curves at beta, times the layers and micro-batches:
    rebuilt here from each unit's timed tensor-core calls."""
    model = get_preset("llama2-7b")
    beta = 0.25
    bare = _predictor(EndToEndTerms()).predict(model, LAYOUT, timeline=False)
    P = _predictor(EndToEndTerms(power_factor=beta, power_form="cap"))
    capped = P.predict(model, LAYOUT, timeline=False)
    assert capped.step_time_s > bare.step_time_s
    layer = next(iter(P.engine._parts.values())).layer   # a fresh predictor: this one layout's units
    unit, op_t, _c, _e, _ce = layer.raw
    ideal = P.op_ideal_s(unit.ops, "bf16")
    fwd = [(t * c.count * c.scale, i * c.count * c.scale) for c, (t, _p, _r), i in zip(unit.ops, op_t, ideal)
           if c.phase == "fwd"]
    rest = [(t * c.count * c.scale, i * c.count * c.scale) for c, (t, _p, _r), i in zip(unit.ops, op_t, ideal)
            if c.phase != "fwd"]
    assert layer.caps["fi"].added_s(beta) == pytest.approx(_brute(*zip(*fwd), beta), rel=1e-9)
    assert layer.caps["bi"].added_s(beta) == pytest.approx(_brute(*zip(*rest), beta), rel=1e-9)
    assert layer.caps["fi"].added_s(beta) > 0   # some A100 GEMM runs within 25 % of MAMF


def test_the_step_grows_by_the_curves_of_every_layer_and_micro_batch():
    """One stage, no overlap, no host terms: the step grows by exactly m x (layers x a layer's + the edges') cap."""
    model = get_preset("llama2-7b")
    lay = Layout(num_gpus=8, tp=1, pp=1, dp=8, micro_batch=1, global_batch=64, seq_len=2048,
                 framework="megatron-deepspeed")
    beta = 0.25
    bare = _predictor(EndToEndTerms()).predict(model, lay, timeline=False)
    P = _predictor(EndToEndTerms(power_factor=beta, power_form="cap"))
    capped = P.predict(model, lay, timeline=False)
    parts = next(iter(P.engine._parts.values()))
    per_mb = sum(n * (u.caps["fi"].added_s(beta) + u.caps["bi"].added_s(beta))
                 for n, u in ((model.num_layers, parts.layer), (1, parts.first), (1, parts.last)))
    assert capped.step_time_s - bare.step_time_s == pytest.approx(8 * per_mb, rel=1e-6)


@pytest.mark.parametrize("platform", ["dgx-a100-80gb", "dgx-h100"])
def test_under_the_cap_no_layout_beats_the_capped_matmul_rate(platform):
    beta = 0.3
    P = _predictor(EndToEndTerms(power_factor=beta, power_form="cap"), platform)
    ceiling = P.achievable_flops("bf16") / P.platform.device.peak_flops("bf16") / (1 + beta)
    rep = search(get_preset("llama3-8b"), P, 64, 512, 4096, top_k=1, refine=False,
                 space=SearchSpace(recompute=("none",), zero_stage=(0, 1)))
    ok = rep.table[np.isfinite(rep.table["mfu"])]
    assert len(ok) > 20
    assert ok["mfu"].max() <= ceiling * (1 + 1e-9)
    # the linear form at the same beta has no such cap: it adds beta x ideal on top of whatever was sampled
    lin = _predictor(EndToEndTerms(power_factor=beta, power_form="linear"), platform)
    m, lay = get_preset("llama3-8b"), Layout(num_gpus=8, tp=1, dp=8, micro_batch=1, global_batch=64, seq_len=4096)
    assert lin.predict(m, lay, timeline=False).step_time_s > P.predict(m, lay, timeline=False).step_time_s


def test_the_form_is_written_read_back_and_refused_when_unknown(tmp_path):
    t = EndToEndTerms(power_factor=0.2, power_form="cap", host={"default": HostTerm(1e-3, 2.0, 1e-3)},
                      source="test", fitted_on={"a": 3})
    save_terms(t, tmp_path)
    back, warn = load_terms_checked(tmp_path)
    assert warn is None and back is not None and back.power_form == "cap"
    assert "(1 + power_factor)" in json.loads((tmp_path / "framework_terms.json").read_text())["model"]
    d = json.loads((tmp_path / "framework_terms.json").read_text())
    del d["power_form"]                        # a file written before the form existed was fitted linear
    (tmp_path / "framework_terms.json").write_text(json.dumps(d))
    back, warn = load_terms_checked(tmp_path)
    assert warn is None and back is not None and back.power_form == "linear"
    d["power_form"] = "quadratic"
    (tmp_path / "framework_terms.json").write_text(json.dumps(d))
    back, warn = load_terms_checked(tmp_path)
    assert back is None and warn is not None and "power_form" in warn and "linear, cap" in warn


def test_cap_curve_matches_its_definition_with_ties_and_zero_ideals():
    """The curve (built in plain Python) answers sum_i max(0, (1 + beta) ideal_i - alpha t_i) for any beta / alpha,
    kernels without tensor-core work (ideal 0) left out, equal slacks included."""
    rng = np.random.default_rng(3)
    t = rng.uniform(0.5, 3.0, 40)
    ideal = rng.uniform(0.2, 2.0, 40)
    ideal[::7] = 0.0
    t[5], ideal[5], t[6], ideal[6] = 2.0, 1.0, 4.0, 2.0   # the same slack (1.0) twice
    curve = CapCurve.of(t.tolist(), ideal.tolist())
    assert list(curve.slack) == sorted(curve.slack) and len(curve.slack) == int((ideal > 0).sum())
    for beta in (0.0, 0.1, 0.5, 1.0, 2.5):
        for alpha in (1.0, 0.9, 1.2):
            want = float(np.maximum(0.0, (1.0 + beta) * ideal - alpha * t)[ideal > 0].sum())
            assert curve.added_s(beta, alpha) == pytest.approx(want, rel=1e-12, abs=1e-15)

"""Host (framework) overhead: the blend, the fit, and its use in predictions and in search."""
import json
import shutil

import numpy as np
import pytest

from predictor.calibrate.host import make_evaluator
from predictor.hardware.platforms import get_platform
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.plan.predict import MODELS_DIR, Predictor
from predictor.step.compose import ComposeOptions
from predictor.step.decompose import decompose
from predictor.step.overhead import HostOverhead, blend, fit_host_overhead, load_host_overhead


def test_blend_limits():
    g, h = np.array([1.0, 2.0, 0.0]), np.array([1.0, 0.5, 3.0])
    assert blend(g, h, 1.0) == pytest.approx(g + h)             # no overlap: additive
    assert blend(g, h, np.inf) == pytest.approx(np.maximum(g, h))  # perfect overlap
    b2 = blend(g, h, 2.0)
    assert np.all(b2 >= np.maximum(g, h)) and np.all(b2 <= g + h)
    assert HostOverhead(0.0, 2.0).extra_s(0.01, 24, "bwd", "full") == 0.0


def test_backward_group_counts_recomputed_passes():
    ho = HostOverhead(1e-3, 1.0)
    assert ho.extra_s(0.0, 10, "fwd", "full") == pytest.approx(0.010)
    assert ho.extra_s(0.0, 10, "bwd", "none") == pytest.approx(0.010)
    assert ho.extra_s(0.0, 10, "bwd", "full") == pytest.approx(0.020)


def test_fit_recovers_known_parameters():
    """Synthetic runs made with a known host time and blend are fitted back; CV error near zero."""
    rng = np.random.default_rng(0)
    g = rng.uniform(0.5e-3, 6e-3, 300)       # GPU time per layer pass
    layers = rng.integers(4, 32, 300)
    true_h, true_p = 1.4e-3, 2.0

    def evaluate(h, p):
        return layers * blend(g, h, p)

    meas = evaluate(true_h, true_p)
    groups = np.arange(300) % 12
    ho, rep = fit_host_overhead(evaluate, meas, groups, folds=4, grid_h=np.linspace(0, 3e-3, 16))
    assert ho.host_s_per_layer_pass == pytest.approx(true_h, rel=0.05)
    assert ho.blend_p == true_p
    assert rep["cv_mape"] < 0.01 and rep["no_host_mape"] > 0.1


@pytest.fixture()
def models_with_host(tmp_path):
    d = tmp_path / "models"
    shutil.copytree(MODELS_DIR / "perlmutter-a100", d / "perlmutter-a100")
    (d / "perlmutter-a100" / "host_overhead.json").write_text(json.dumps(
        {"host_s_per_layer_pass": 1e-3, "blend_p": 2.0, "source": "test", "cv_mape": 0.08}))
    return d


def test_prediction_reports_host_overhead_as_its_own_category(models_with_host):
    m = get_preset("gpt3-1.3b")
    L = Layout(num_gpus=8, tp=8, pp=1, dp=1, micro_batch=1, global_batch=4, seq_len=1024, recompute="full")
    with_host = Predictor("perlmutter-a100", models_with_host)
    assert load_host_overhead(models_with_host, "perlmutter-a100").host_s_per_layer_pass == 1e-3
    no_host = Predictor("perlmutter-a100", models_with_host, options=ComposeOptions(host_overhead=False))
    p1, p0 = with_host.predict(m, L), no_host.predict(m, L)
    assert p1.breakdown_s["host_overhead"] > 0 and p0.breakdown_s["host_overhead"] == 0
    assert p1.step_time_s > p0.step_time_s
    assert sum(p1.breakdown_s.values()) == pytest.approx(p1.step_time_s, rel=1e-9)
    assert any(k.startswith("host overhead") for k in p1.provenance_share)
    # the same layout through the calibration evaluator gives the same step time
    ev = make_evaluator(no_host, [(m, L)])
    assert ev(1e-3, 2.0)[0] == pytest.approx(with_host.predict(m, L, timeline=False).step_time_s, rel=1e-9)
    assert ev(0.0, 1.0)[0] == pytest.approx(p0.step_time_s, rel=1e-9)


def test_short_kernels_without_a_fit_warn(models_without_terms):
    m = get_preset("llama2-7b")
    L = Layout(num_gpus=4, tp=4, pp=1, dp=1, micro_batch=1, global_batch=4, seq_len=256, recompute="full")
    bare = Predictor("perlmutter-a100", models_without_terms)
    assert bare.host is None and bare.terms is None and not bare.host_modelled
    assert any("host overhead" in w for w in bare.predict(m, L).warnings)
    # with the end-to-end terms the framework's host time is modelled: no such warning
    with_terms = Predictor("perlmutter-a100")
    assert with_terms.host_modelled
    assert not any("Kernels are short" in w for w in with_terms.predict(m, L).warnings)


def test_optimizer_variant_follows_the_stage():
    m = get_preset("llama2-7b")
    plat = get_platform("perlmutter-a100")
    one = decompose(m, Layout(num_gpus=1, tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=512), plat)
    assert [o.variant for o in one[0].step_ops] == ["first"]
    four = decompose(m, Layout(num_gpus=4, tp=1, pp=4, dp=1, micro_batch=1, global_batch=4, seq_len=512), plat)
    assert [p.step_ops[0].variant for p in four] == ["first", "middle", "middle", "last"]

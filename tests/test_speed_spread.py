"""The GPU speed spread (predictor.step.terms): the slowest of a job's n GPUs sets the pace, so every GPU operator
time is multiplied by 1 + sigma x E[max of n standard normals]. The order statistic, the engine's use of it, the terms
file and the fit that identifies sigma from runs on different GPU counts."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest

from predictor.calibrate import framework as cf
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.plan.predict import Predictor
from predictor.step.terms import (
    PUBLISHED_CONTENTION,
    TERMS_PROVENANCE,
    EndToEndTerms,
    HostTerm,
    load_terms_checked,
    save_terms,
    slowest_of,
    spread_in_words,
    spread_was_fitted,
)


def test_the_slowest_of_n_matches_the_closed_forms_and_grows_with_n():
    assert slowest_of(1) == 0.0 and slowest_of(0) == 0.0
    assert slowest_of(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)            # E[max of 2] = 1 / sqrt(pi)
    assert slowest_of(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-9)      # E[max of 3] = 3 / (2 sqrt(pi))
    # E[max of 5] = 5 / (4 sqrt(pi)) + 15 / (2 pi^(3/2)) arcsin(1/3)  (Bose & Gupta 1959)
    five = 5 / (4 * math.sqrt(math.pi)) + 15 / (2 * math.pi ** 1.5) * math.asin(1 / 3)
    assert slowest_of(5) == pytest.approx(five, rel=1e-7)
    ns = np.array([1, 2, 4, 8, 64, 512, 4096, 65536])
    e = slowest_of(ns)
    assert e.shape == ns.shape and np.all(np.diff(e) > 0)
    assert e[-1] < math.sqrt(2 * math.log(65536))          # below its asymptote sqrt(2 ln n)
    assert slowest_of(np.array([[2, 8], [8, 2]])).shape == (2, 2)


def _predict(spread: float, dp: int, **kw):
    P = Predictor("dgx-a100-80gb")
    P.terms = EndToEndTerms(speed_spread=spread, **kw)
    L = Layout(num_gpus=2 * dp, tp=2, pp=1, dp=dp, micro_batch=2, global_batch=2 * dp * 4, seq_len=2048)
    return P.predict(get_preset("llama2-7b"), L, timeline=False)


@pytest.mark.parametrize("dp", [1, 4, 32])
def test_the_engine_slows_the_compute_by_the_slowest_of_the_jobs_gpus(dp):
    sigma = 0.05
    bare, slow = _predict(0.0, dp), _predict(sigma, dp)
    ratio = slow.breakdown_s["compute"] / bare.breakdown_s["compute"]
    assert ratio == pytest.approx(1 + sigma * float(slowest_of(2 * dp)), rel=1e-9)
    # communication is not a GPU's own speed: the collectives are timed as they are
    assert slow.breakdown_s["tp_comm"] == pytest.approx(bare.breakdown_s["tp_comm"], rel=1e-9)
    assert slow.step_time_s > bare.step_time_s


def test_the_slowdown_is_charged_to_the_end_to_end_terms_in_what_a_prediction_rests_on():
    bare, slow = _predict(0.0, 8).to_dict(), _predict(0.05, 8).to_dict()
    share = slow["provenance_share"].get(TERMS_PROVENANCE, 0.0)
    assert share > 0 and TERMS_PROVENANCE not in bare["provenance_share"]
    # its seconds are the compute it adds: 5 % x E[max of 16] of the compute, over the step
    added = slow["breakdown_s"]["compute"] - bare["breakdown_s"]["compute"]
    assert share * slow["step_time_s"] == pytest.approx(added, rel=0.05)


def test_the_terms_file_keeps_the_spread_and_refuses_one_out_of_bounds(tmp_path):
    t = EndToEndTerms(power_factor=0.1, speed_spread=0.031, host={"default": HostTerm(1e-3, 2.0, 1e-3)},
                      fitted_on={"a": 3})
    save_terms(t, tmp_path)
    loaded, warn = load_terms_checked(tmp_path)
    assert warn is None and loaded is not None and loaded.speed_spread == pytest.approx(0.031)
    for bad in (-0.01, 0.5, "wide"):
        d = json.loads((tmp_path / "framework_terms.json").read_text())
        d["speed_spread"] = bad
        (tmp_path / "framework_terms.json").write_text(json.dumps(d))
        terms, warn = load_terms_checked(tmp_path)
        assert terms is None and warn is not None and "speed_spread" in warn
    (tmp_path / "framework_terms.json").write_text(json.dumps({"power_factor": 0.1}))   # an older file: none
    terms, warn = load_terms_checked(tmp_path)
    assert warn is None and terms is not None and terms.speed_spread == 0.0


def _runs_on_gpu_counts() -> pd.DataFrame:
    """The same per-GPU work (tp 2, mb 2, 4 micro-batches) on 2 to 128 GPUs: only the spread tells them apart."""
    rows = []
    for src, fw, hidden in (("a", "megatron-deepspeed", 1024), ("b", "megatron-deepspeed", 2048), ("c", "fsdp", 1536)):
        for i, (dp, mb) in enumerate([(1, 1), (2, 2), (4, 1), (8, 2), (16, 4), (32, 2), (64, 1)]):
            rows.append({"run_id": f"{src}:{i}", "source_id": src, "platform": "dgx-a100-80gb", "arch": "gpt",
                         "layers": 8, "hidden": hidden, "heads": hidden // 64, "kv_heads": hidden // 64,
                         "ffn_hidden": 4 * hidden, "vocab": 32000, "seq_len": 1024, "num_gpus": 2 * dp, "tp": 2,
                         "pp": 1, "dp": dp, "micro_batch": mb, "global_batch": mb * dp * 4, "vpp": 1,
                         "schedule": "1f1b", "recompute": "none", "sequence_parallel": False,
                         "zero_stage": 3 if fw == "fsdp" else 1, "precision": "bf16", "framework": fw,
                         "step_time_s": 1.0})
    return pd.DataFrame(rows)


TRUE = EndToEndTerms(power_factor=0.15, speed_spread=0.03, power_form="cap", contention=PUBLISHED_CONTENTION,
                     host={"megatron-deepspeed": HostTerm(0.8e-3, 2.0, 2e-3), "fsdp": HostTerm(0.3e-3, 2.0, 5e-3)})


def test_the_fit_recovers_the_spread_from_runs_on_different_gpu_counts():
    runs = cf.prepare_runs(_runs_on_gpu_counts())
    runs.measured_s = runs.predict(TRUE)
    t = cf.fit_terms(runs, options=cf.TermsFitOptions(prior_weight=0.0, max_evaluations=80))
    assert t.speed_spread == pytest.approx(0.03, abs=0.008)
    assert t.power_factor == pytest.approx(0.15, abs=0.04)
    assert np.abs(runs.predict(t) / runs.measured_s - 1).max() < 0.02
    # held, not fitted: the options' value is carried into the terms
    held = cf.fit_terms(runs, options=cf.TermsFitOptions(max_evaluations=10, fit_speed_spread=False,
                                                         speed_spread=0.02))
    assert held.speed_spread == 0.02
    assert "GPU speed spread 2.0 %" in cf.terms_in_words(held)
    none = dataclasses.replace(held, speed_spread=0.0)
    assert "spread" not in cf.terms_in_words(none)


def test_the_spread_in_words_names_what_it_does_on_8_and_1024_gpus():
    w = spread_in_words(0.03)
    assert "3.0 %" in w and f"+{0.03 * float(slowest_of(8)) * 100:.1f} % on 8 GPUs" in w and "1,024" in w
    assert spread_in_words(0.0) == "no GPU speed spread"


def test_the_spread_in_words_says_whether_the_calibration_fitted_it_or_held_it():
    fitted_src = cf.spread_words(cf.TermsFitOptions())
    held_src = cf.spread_words(cf.TermsFitOptions(fit_speed_spread=False, speed_spread=0.02))
    assert spread_was_fitted(fitted_src) and not spread_was_fitted(held_src)
    assert "(fitted)" in spread_in_words(0.02, fitted=spread_was_fitted(fitted_src))
    held = spread_in_words(0.02, fitted=spread_was_fitted(held_src))
    assert "(set, not fitted)" in held and "(fitted)" not in held

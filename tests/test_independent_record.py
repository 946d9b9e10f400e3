"""The independent checks' errors kept for the error band (predictor.plan.accuracy_record): summarised per GPU and
source, written and read back checked, and said (and widened to) by every prediction on a GPU they cover."""
from __future__ import annotations

import json
import math

import pytest

from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.paths import shared_artifact
from predictor.plan import accuracy_record as IR
from predictor.plan.predict import Predictor
from predictor.step.terms import load_terms_checked


def test_runs_are_summarised_per_gpu_and_source_worst_first():
    scored = [("h100", "a", -0.1, "all"), ("h100", "a", -0.3, "all"), ("h100", "b", 0.05, "all"),
              ("b200", "a", 0.2, "all"), ("h100", "b", math.nan, "all")]
    s = IR.summarise(scored)
    assert list(s) == ["b200", "h100"]
    h = s["h100"]
    assert [c.source for c in h] == ["a", "b"]                     # worst MAPE first
    assert h[0].runs == 2 and h[0].mape == pytest.approx(0.2) and h[0].mean_signed == pytest.approx(-0.2)
    assert h[1].runs == 1                                          # the NaN run is not counted


def test_the_record_round_trips_and_a_bad_one_is_refused_naming_the_field(tmp_path):
    rec = IR.record({"h100": [IR.DeviceCheck("a", 3, 0.1, -0.05)]}, "2026-11-28T00:00:00+00:00")
    IR.save(rec, tmp_path)
    got, warn = IR.load_checked(tmp_path)
    assert warn is None and got is not None
    checks, fitted_at, measured_at = got
    assert measured_at
    assert checks["h100"][0] == IR.DeviceCheck("a", 3, 0.1, -0.05) and fitted_at.startswith("2026-11-28")
    good = (tmp_path / IR.INDEPENDENT_CHECKS).read_text()
    for field, bad in (("mape", -0.1), ("runs", 0), ("mean_signed", "x")):
        d = json.loads(good)
        d["devices"]["h100"][0][field] = bad
        (tmp_path / IR.INDEPENDENT_CHECKS).write_text(json.dumps(d))
        got, warn = IR.load_checked(tmp_path)
        assert got is None and warn is not None and field in warn and IR.INDEPENDENT_CHECKS in warn
    with pytest.raises(Exception, match="devices"):
        IR.save({"devices": []}, tmp_path)


def test_band_words_give_the_worst_error_and_say_when_the_record_predates_the_terms():
    cs = [IR.DeviceCheck("nemo", 19, 0.17, 0.08), IR.DeviceCheck("foundry", 52, 0.11, -0.11)]
    worst, words = IR.band_words(cs, "T2", "T2", "2026-11-28T00:00:00")
    assert worst == pytest.approx(0.17)
    assert "nemo 19 runs 17.0% (8.0% slower" in words and "foundry 52 runs 11.0% (11.0% faster" in words
    assert "before the current" not in words
    _worst, stale = IR.band_words(cs, "T3", "T2", "2026-11-28T00:00:00")
    assert "2026-11-28 with end-to-end terms fitted before the current ones" in stale


H100_LAYOUT = Layout(num_gpus=8, tp=1, pp=1, dp=8, micro_batch=2, global_batch=64, seq_len=4096, framework="fsdp",
                     zero_stage=3)


def test_a_prediction_on_a_checked_gpu_says_the_checks_and_its_band_is_at_least_the_worst_of_them():
    P = Predictor("dgx-h100")
    P.independent = [IR.DeviceCheck("made-up check", 7, 0.5, -0.4)]
    P._independent_dates = (P.terms.fitted_at if P.terms else "", "2026-11-28")
    p = P.predict(get_preset("llama3-8b"), H100_LAYOUT, timeline=False)
    assert p.expected_error >= 0.5
    assert "made-up check 7 runs 50.0% (40.0% faster than published on average)" in p.error_basis
    bare = Predictor("dgx-h100")
    bare.independent = []
    q = bare.predict(get_preset("llama3-8b"), H100_LAYOUT, timeline=False)
    assert q.step_time_s == pytest.approx(p.step_time_s)            # the step time does not move
    assert "independent checks" not in q.error_basis and q.expected_error < 0.5


def test_the_shipped_record_was_measured_with_the_shipped_terms_and_covers_the_h100():
    got, warn = IR.load_checked()
    assert warn is None and got is not None, f"{shared_artifact(IR.INDEPENDENT_CHECKS)}: {warn}"
    checks, fitted_at, _ = got
    terms, _w = load_terms_checked()
    assert terms is not None and fitted_at == terms.fitted_at, (
        "models_store/independent_checks.json predates framework_terms.json: "
        "run python -m predictor check-independent --save")
    assert {c.source for c in checks["h100-sxm5-80gb"]} >= {"llm-foundry-h100", "NeMo / Megatron-Bridge tables"}
    # an A100 prediction carries none (no independent run on it; its sources are the fitted ones)
    p = Predictor("dgx-a100-80gb").predict(get_preset("llama3-8b"), H100_LAYOUT, timeline=False)
    assert "independent checks" not in p.error_basis


def test_check_independent_prints_the_record_per_gpu_and_source(capsys):
    from predictor.cli.main import main
    assert main(["check-independent", "--json", "--quiet"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["terms_fitted_at"] and "h100-sxm5-80gb" in rec["devices"]
    foundry = [c for c in rec["devices"]["h100-sxm5-80gb"] if c["source"] == "llm-foundry-h100"]
    assert foundry and foundry[0]["runs"] >= 40 and 0 <= foundry[0]["mape"] < 1


def test_checks_are_kept_per_kind_of_model_and_round_trip_with_it(tmp_path):
    s = IR.summarise([("b200", "nemo", -0.3, "moe"), ("b200", "nemo", -0.2, "moe"), ("b200", "nemo", 0.05, "dense"),
                      ("b200", "other", 0.1, "all")])
    got = {(c.source, c.scope): c for c in s["b200"]}
    assert set(got) == {("nemo", "moe"), ("nemo", "dense"), ("other", "all")}
    assert got[("nemo", "moe")].runs == 2 and got[("nemo", "moe")].mape == pytest.approx(0.25)
    assert got[("nemo", "moe")].applies_to(True) and not got[("nemo", "moe")].applies_to(False)
    assert got[("nemo", "dense")].applies_to(False) and not got[("nemo", "dense")].applies_to(True)
    assert got[("other", "all")].applies_to(True) and got[("other", "all")].applies_to(False)
    IR.save(IR.record(s, "T"), tmp_path)
    back, warn = IR.load_checked(tmp_path)
    assert warn is None and back is not None and sorted(back[0]["b200"], key=repr) == sorted(s["b200"], key=repr)
    d = json.loads((tmp_path / IR.INDEPENDENT_CHECKS).read_text())
    del d["devices"]["b200"][0]["scope"]               # a record without scopes (older version): every kind
    d["devices"]["b200"][1]["scope"] = "sparse"        # an unknown scope: refused, naming the field
    (tmp_path / IR.INDEPENDENT_CHECKS).write_text(json.dumps(d))
    got2, warn2 = IR.load_checked(tmp_path)
    assert got2 is None and warn2 is not None and "devices.b200[1].scope" in warn2
    d["devices"]["b200"][1]["scope"] = "dense"
    (tmp_path / IR.INDEPENDENT_CHECKS).write_text(json.dumps(d))
    got3, _ = IR.load_checked(tmp_path)
    assert got3 is not None and got3[0]["b200"][0].scope == "all"


def test_a_moe_prediction_is_banded_by_the_moe_checks_and_a_dense_one_by_the_dense_checks():
    P = Predictor("dgx-b200")
    P.independent = [IR.DeviceCheck("tables", 7, 0.40, -0.40, "moe"), IR.DeviceCheck("tables", 8, 0.06, -0.05, "dense")]
    P._independent_dates = (P.terms.fitted_at if P.terms else "", "2026-12-03")
    moe = P.predict(get_preset("qwen3-30b-a3b"), Layout(num_gpus=8, tp=1, pp=1, dp=8, ep=8, micro_batch=1,
                                                        global_batch=64, seq_len=4096), timeline=False)
    assert moe.expected_error >= 0.40 and "tables, MoE runs 7 runs 40.0%" in moe.error_basis
    assert "dense runs" not in moe.error_basis
    dense = P.predict(get_preset("llama3-8b"), Layout(num_gpus=8, tp=1, pp=1, dp=8, micro_batch=1, global_batch=64,
                                                      seq_len=4096), timeline=False)
    assert "tables, dense runs 8 runs 6.0%" in dense.error_basis and "MoE runs" not in dense.error_basis
    assert dense.expected_error < 0.40


def test_the_shipped_record_keeps_dense_and_moe_apart_where_the_tables_have_both():
    got, _ = IR.load_checked()
    assert got is not None
    b200 = {c.scope: c for c in got[0]["b200-sxm-180gb"] if c.source == "NeMo / Megatron-Bridge tables"}
    assert set(b200) == {"dense", "moe"}
    foundry = [c for c in got[0]["h100-sxm5-80gb"] if c.source.startswith("llm-foundry")]
    assert foundry and all(c.scope == "dense" for c in foundry)   # MPT models: no experts

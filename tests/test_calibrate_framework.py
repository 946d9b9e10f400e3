"""The end-to-end terms fit (predictor.calibrate.framework): recovers terms it generated, bounds the host
terms, scores each source with terms fitted without it, and what predictions then say."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from predictor.calibrate import framework as cf
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.plan.predict import Predictor
from predictor.step.terms import PUBLISHED_CONTENTION, EndToEndTerms, HostTerm, load_terms_checked, save_terms

PLATFORM = "dgx-a100-80gb"


def _runs(source: str, framework: str, hidden: int, layers: int, n: int) -> list[dict]:
    rows = []
    for i, (tp, pp, mb) in enumerate([(1, 1, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1), (1, 2, 2), (4, 2, 4)][:n]):
        dp = 8 // (tp * pp)
        rows.append({"run_id": f"{source}:{i}", "source_id": source, "platform": PLATFORM, "arch": "gpt",
                     "layers": layers, "hidden": hidden, "heads": hidden // 64, "kv_heads": hidden // 64,
                     "ffn_hidden": 4 * hidden, "vocab": 32000, "seq_len": 1024, "num_gpus": 8, "tp": tp, "pp": pp,
                     "dp": dp, "micro_batch": mb, "global_batch": mb * dp * 4, "vpp": 1, "schedule": "1f1b",
                     "recompute": "none", "sequence_parallel": False, "zero_stage": 3 if framework == "fsdp" else 1,
                     "precision": "bf16",
                     "framework": framework, "step_time_s": 1.0})
    return rows


@pytest.fixture(scope="module")
def runset() -> cf.RunSet:
    df = pd.DataFrame(_runs("small-ds", "megatron-deepspeed", 512, 8, 6) + _runs("big-ds", "megatron-deepspeed", 2048, 8, 6)
                      + _runs("fsdp-src", "fsdp", 1024, 8, 6))
    return cf.prepare_runs(df)


# the fit holds the contention at the published value (not fitted), so the runs are generated with it
TRUE = EndToEndTerms(power_factor=0.15, host={"megatron-deepspeed": HostTerm(0.8e-3, 2.0, 2e-3),
                                              "fsdp": HostTerm(0.3e-3, 2.0, 5e-3)}, contention=PUBLISHED_CONTENTION)


@pytest.mark.parametrize("form", ["linear", "cap"])
def test_fit_recovers_the_terms_that_generated_the_runs(runset, form):
    runset.measured_s = runset.predict(dataclasses.replace(TRUE, power_form=form))
    t = cf.fit_terms(runset, options=cf.TermsFitOptions(prior_weight=0.0, max_evaluations=60, power_form=form))
    assert t.power_form == form
    assert t.power_factor == pytest.approx(0.15, abs=0.03)
    assert t.host["megatron-deepspeed"].host_s_per_layer_pass == pytest.approx(0.8e-3, rel=0.3)
    err = np.abs(runset.predict(t) / runset.measured_s - 1)
    assert err.max() < 0.02
    # frameworks without runs take the pooled term, which lies between the fitted ones
    pooled = t.host["default"].host_s_per_layer_pass
    fitted = [t.host[f].host_s_per_layer_pass for f in ("megatron-deepspeed", "fsdp")]
    assert min(fitted) <= pooled <= max(fitted)


def test_host_terms_stay_within_their_physical_bounds(runset):
    runset.measured_s = runset.predict(None) * 3.0   # a gap no host overhead explains
    opt = cf.TermsFitOptions(max_evaluations=20)
    t = cf.fit_terms(runset, options=opt)
    for h in t.host.values():
        assert 0 <= h.host_s_per_layer_pass <= opt.host_max_s_per_layer_pass + 1e-12
        assert 0 <= h.host_s_per_micro_batch <= opt.host_max_s_per_micro_batch + 1e-12
    assert 0 <= t.power_factor <= opt.power_factor_max


def test_a_fixed_contention_is_carried_into_the_fitted_terms_and_slows_nothing_without_overlap(runset):
    runset.measured_s = runset.predict(TRUE)
    opt = cf.TermsFitOptions(max_evaluations=8)
    shipped = cf.fit_terms(runset, options=opt)
    none = cf.fit_terms(runset, options=dataclasses.replace(opt, contention=0.0))
    held = cf.fit_terms(runset, options=dataclasses.replace(opt, contention=0.3))
    assert shipped.contention == PUBLISHED_CONTENTION and none.contention == 0.0 and held.contention == 0.3
    assert held.host["default"].host_s_per_layer_pass >= 0   # the pooled term keeps it too
    assert cf.with_pooled_host(held).contention == 0.3
    assert "contention 0.300" in cf.terms_in_words(held) and "contention" not in cf.terms_in_words(none)


def test_the_published_contention_is_the_measured_slowdown_per_second_of_overlap():
    # compute W overlapped by a window T of communication runs 18.9 % slower: W * 1.189 = T, so T - W is lost
    T = 1.0
    W = T / (1 + 0.189)
    assert PUBLISHED_CONTENTION == pytest.approx((T - W) / T)
    assert cf.TermsFitOptions().contention == PUBLISHED_CONTENTION


def test_contention_slows_a_zero3_step_by_kappa_times_its_overlapped_communication(runset):
    """The FSDP runs' all-gathers and reduce-scatters hide under compute; contention charges kappa seconds per
    overlapped second: the step grows in proportion to kappa, by the same overlapped seconds at every kappa (with no
    host term, whose blend with the GPU time is not linear)."""
    layout = [int(r.split(":")[1]) for r in runset.run_ids]       # the index into _runs' layouts
    sharded = np.array([i < 5 for i in layout])                      # the sixth is tp4 pp2: dp 1, nothing sharded
    fsdp = runset.frameworks == "fsdp"
    base = dataclasses.replace(TRUE, contention=0.0, host={})
    t0 = runset.predict(base)
    d1 = runset.predict(dataclasses.replace(base, contention=0.1)) - t0
    d2 = runset.predict(dataclasses.replace(base, contention=0.2)) - t0
    assert (d1[fsdp & sharded] > 0).all()                  # ZeRO-3 communication overlaps their compute
    np.testing.assert_allclose(d2[fsdp], 2 * d1[fsdp], rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(d1[fsdp & ~sharded], 0.0, atol=1e-12)
    # Megatron-DeepSpeed's gradient all-reduce runs after the backward here (no overlap): nothing to slow
    np.testing.assert_allclose(d1[~fsdp], 0.0, atol=1e-12)


def test_each_source_is_scored_by_terms_fitted_without_it(runset):
    base = runset.predict(TRUE)
    odd = runset.source_ids == "big-ds"
    runset.measured_s = np.where(odd, base * 1.25, base)    # only this source is 25 % slower
    terms, table, held = cf.validate_terms(runset, cf.TermsFitOptions(max_evaluations=25))
    r = table.set_index("source")
    # held out, nothing in the other sources says big-ds is slow: its error is the 25 %, biased low
    assert r.loc["big-ds", "held_out_mean_signed"] < -0.12
    assert r.loc["big-ds", "held_out_mape"] > r.loc["big-ds", "in_sample_mape"]
    assert not np.isnan(held).any()
    rec = cf.validation_record(table)
    assert set(rec["per_source"]) == {"small-ds", "big-ds", "fsdp-src"}
    assert rec["held_out_mape"] == pytest.approx(table["held_out_mape"].mean())
    for k in ("runs", "in_sample_mape", "in_sample_worst_ape", "held_out_median_ape", "held_out_mean_signed"):
        assert k in rec["per_source"]["big-ds"]
    text = cf.format_table(table)
    assert "big-ds" in text and "held out" in text


def test_predictions_carry_the_held_out_error_and_name_the_terms(tmp_path):
    t = EndToEndTerms(power_factor=0.2, host={"default": HostTerm(1e-3, 2.0, 1e-3)}, source="test runs",
                      fitted_on={"a": 10, "b": 5},
                      validation={"held_out_mape": 0.123, "per_source": {"a": {}, "b": {}}})
    save_terms(t, tmp_path)
    loaded, warn = load_terms_checked(tmp_path)
    assert warn is None and loaded is not None and loaded.power_factor == pytest.approx(0.2)
    pr = Predictor("dgx-h100", tmp_path)
    p = pr.predict(get_preset("llama2-7b"), Layout(num_gpus=8, tp=2, pp=1, dp=4, micro_batch=1, global_batch=32,
                                                   seq_len=2048))
    assert "12.3%" in p.error_basis and "fitted without it" in p.error_basis
    assert p.breakdown_s["host_overhead"] > 0
    assert any("end-to-end terms" in k for k in p.provenance_share)
    # the same layout without terms is faster (the terms only add time)
    bare = Predictor("dgx-h100", tmp_path / "none").predict(
        get_preset("llama2-7b"), Layout(num_gpus=8, tp=2, pp=1, dp=4, micro_batch=1, global_batch=32, seq_len=2048))
    assert p.step_time_s > bare.step_time_s


def test_a_corrupt_terms_file_is_named_and_ignored(tmp_path):
    (tmp_path / "framework_terms.json").write_text(json.dumps({"power_factor": -1}))
    terms, warn = load_terms_checked(tmp_path)
    assert terms is None and "framework_terms.json" in warn and "power_factor" in warn


def test_calibration_needs_two_sources(tmp_path):
    from predictor.model.errors import InfeasibleConfig
    from predictor.samples.store import ingest_path
    f = tmp_path / "runs.csv"
    pd.DataFrame(_runs("only", "megatron", 512, 4, 3)).drop(columns=["run_id", "source_id"]).assign(
        case_id=lambda d: [f"c{i}" for i in range(len(d))]).to_csv(f, index=False)
    db = tmp_path / "s.duckdb"
    ingest_path(f, store_path=db)
    with pytest.raises(InfeasibleConfig, match="at least 2"):
        cf.calibrate_framework(store_path=db, models_dir=tmp_path / "m", save=False)


def test_a_run_that_makes_no_valid_layout_is_skipped_and_counted():
    rows = _runs("s", "fsdp", 512, 4, 2)
    rows[1]["tp"] = 3   # 8 heads on 3 GPUs
    rs = cf.prepare_runs(pd.DataFrame(rows))
    assert len(rs) == 1 and sum(rs.skipped["s"].values()) == 1
    assert any("tp" in k or "num_gpus" in k or "heads" in k for k in rs.skipped["s"])


def test_validate_by_source_reports_each_source_and_its_ingest_skips(tmp_path, capsys):
    from pathlib import Path

    from predictor.cli.main import main
    from predictor.samples.store import ingest_path
    published = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "published-runs"
    if not published.is_dir():
        pytest.skip("../shared/datasets/published-runs is not present")
    db = tmp_path / "s.duckdb"
    ingest_path(published, store_path=db)
    assert main(["validate", "--by-source", "--json", "--quiet", "--store", str(db)]) == 0
    d = json.loads(capsys.readouterr().out)
    rows = {(r["source_id"], r["platform"]): r for r in d["summary"]}
    assert {s for s, _ in rows} == {"llm-foundry", "bigscience-bloom"}
    for r in rows.values():
        assert r["runs"] > 0 and 0 <= r["median_ape"] <= r["mape"] * 3 and r["worst_ape"] >= r["mape"]
        assert -1 < r["mean_signed"] < 1
    skipped = {(r["source_id"], r["reason"]): r["rows"] for r in d["skipped_at_ingest"]}
    assert sum(v for (s, _), v in skipped.items() if s == "bigscience-bloom") == 112


def test_unaligned_gemm_dimensions_are_named_in_the_warnings():
    from predictor.model.specs import ModelSpec
    bloom_like = ModelSpec("c", "gpt", num_layers=4, hidden_size=14400, num_heads=96, vocab_size=250880)
    L = Layout(num_gpus=8, tp=8, pp=1, dp=1, micro_batch=1, global_batch=8, seq_len=2048, precision="bf16")
    p = Predictor("dgx-a100-80gb").predict(bloom_like, L, timeline=False)
    w = [x for x in p.warnings if "multiples of 8" in x]
    assert len(w) == 1 and "head dimension (hidden / heads) 150" in w[0]
    aligned = ModelSpec("c", "gpt", num_layers=4, hidden_size=14336, num_heads=112, vocab_size=250880)
    p = Predictor("dgx-a100-80gb").predict(aligned, L, timeline=False)
    assert not any("multiples of 8" in x for x in p.warnings)


def test_validation_by_source_reads_the_per_source_record():
    from predictor.step.terms import NONE, SOURCE_VALIDATION_COLUMNS, EndToEndTerms, validation_by_source
    rec = {"framework": "fsdp", "runs": 10, "skipped": 2, "in_sample_mape": 0.05, "held_out_mape": 0.08,
           "in_sample_mean_signed": -0.01, "held_out_mean_signed": 0.04,
           "skipped_at_ingest": {"skipped: precision not stated": 3, "skipped: dp not stated": 1}}
    t = validation_by_source(EndToEndTerms(validation={"per_source": {"b": rec, "a": {**rec, "skipped_at_ingest": 0}}}))
    assert list(t.columns) == list(SOURCE_VALIDATION_COLUMNS) and list(t["source"]) == ["a", "b"]
    b = t.set_index("source").loc["b"]
    assert (b["held_out_mape"], b["held_out_mean_signed"], b["runs"]) == (0.08, 0.04, 10)
    assert b["skipped_at_fit"] == 2 and b["skipped_at_ingest"] == 4
    assert b["skipped_why"] == "precision not stated: 3; dp not stated: 1"
    assert t.set_index("source").loc["a", "skipped_why"] == ""
    assert pd.isna(b["held_out_median_ape"])  # not in the record: empty
    empty = validation_by_source(NONE)
    assert empty.empty and list(empty.columns) == list(SOURCE_VALIDATION_COLUMNS)


def test_runs_with_unaligned_gemm_shapes_are_scored_apart_and_widen_the_band(tmp_path):
    rows = (_runs("aligned-a", "megatron-deepspeed", 512, 4, 3) + _runs("aligned-b", "fsdp", 512, 4, 3)
            + [{**r, "heads": 16, "kv_heads": 16} for r in _runs("odd", "megatron-deepspeed", 960, 4, 3)])   # head dim 60
    runs = cf.prepare_runs(pd.DataFrame(rows))
    assert runs.shape_flagged is not None
    assert list(runs.shape_flagged) == [False] * 6 + [True] * 3
    base = runs.predict(TRUE)
    runs.measured_s = np.where(runs.shape_flagged, base * 2.0, base)     # unaligned shapes run 2x slower
    _terms, table, held = cf.validate_terms(runs, cf.TermsFitOptions(max_evaluations=10))
    r = table.set_index("source").loc["odd"]
    assert r["runs_shape_flagged"] == 3 and r["held_out_mean_signed_flagged"] < -0.3
    rec = cf.validation_record(table, None, runs, held)
    assert rec["shape_flagged"]["runs"] == 3 and rec["shape_flagged"]["held_out_mape"] > 0.3
    assert "not in multiples of 8" in cf.format_table(table)
    # a prediction with such shapes carries that error; an aligned one does not
    save_terms(EndToEndTerms(power_factor=0.1, host={"default": HostTerm(1e-3, 2.0, 1e-3)}, fitted_on={"odd": 3},
                             validation={"held_out_mape": 0.05, "shape_flagged": rec["shape_flagged"]}), tmp_path)
    pr = Predictor("dgx-h100", tmp_path)
    lay = Layout(num_gpus=8, tp=2, pp=1, dp=4, micro_batch=1, global_batch=32, seq_len=2048)
    odd = pr.predict(dataclasses.replace(get_preset("llama2-7b"), hidden_size=4000, num_heads=40, num_kv_heads=40),
                     lay)   # head dimension 100
    even = pr.predict(get_preset("llama2-7b"), lay)
    assert odd.expected_error >= rec["shape_flagged"]["held_out_mape"] - 1e-12
    assert "3 measured runs with such shapes" in odd.error_basis
    assert even.expected_error < rec["shape_flagged"]["held_out_mape"] and even.expected_error < odd.expected_error
    assert "such shapes" not in even.error_basis


def test_runs_with_unaligned_gemm_shapes_are_not_fitted_on():
    rows = (_runs("aligned-a", "megatron-deepspeed", 512, 4, 6) + _runs("aligned-b", "fsdp", 1024, 4, 6)
            + [{**r, "heads": 16, "kv_heads": 16} for r in _runs("odd", "megatron-deepspeed", 960, 4, 3)])   # head dim 60
    runs = cf.prepare_runs(pd.DataFrame(rows))
    base = runs.predict(TRUE)
    runs.measured_s = np.where(runs.shape_flagged, base * 1.6, base)     # unaligned shapes run 1.6x slower
    opt = cf.TermsFitOptions(prior_weight=0.0, max_evaluations=40, power_form=TRUE.power_form)
    assert list(cf.fit_mask(runs, None, opt)) == [True] * 12 + [False] * 3
    clean = cf.fit_terms(runs, options=opt)
    assert clean.power_factor == pytest.approx(TRUE.power_factor, abs=0.03)    # the slow runs do not move it
    err = np.abs(runs.predict(clean) / runs.measured_s - 1)[~runs.shape_flagged]
    assert err.max() < 0.03
    # fitted on as well, they pull the shared power factor up and every aligned run with it
    dirty = cf.fit_terms(runs, options=dataclasses.replace(opt, fit_shape_flagged=True))
    assert dirty.power_factor > clean.power_factor + 0.05
    aligned_bias = (runs.predict(dirty) / runs.measured_s - 1)[~runs.shape_flagged].mean()
    assert aligned_bias > 0.03, aligned_bias
    # a fit on nothing but such runs still fits on them (there is nothing else)
    only_odd = runs.shape_flagged
    assert cf.fit_mask(runs, only_odd, opt).sum() == 3


def test_the_band_widens_where_no_measured_run_covers_the_gpu_or_the_framework(tmp_path):
    per = {"a": {"held_out_mape": 0.06, "held_out_mean_signed": 0.02, "framework": "fsdp", "devices": "a100-sxm4-80gb"},
           "b": {"held_out_mape": 0.20, "held_out_mean_signed": -0.12, "framework": "megatron-deepspeed",
                 "devices": "a100-sxm4-80gb"}}
    save_terms(EndToEndTerms(power_factor=0.1, host={"default": HostTerm(1e-3, 2.0, 1e-3)}, fitted_on={"a": 5, "b": 5},
                             validation={"held_out_mape": 0.13, "held_out_mean_signed": -0.05, "per_source": per}),
               tmp_path)
    lay = Layout(num_gpus=8, tp=2, pp=1, dp=4, micro_batch=1, global_batch=32, seq_len=2048)
    a100, h100 = Predictor("dgx-a100-80gb", tmp_path), Predictor("dgx-h100", tmp_path)
    e, _n, how = a100.end_to_end_error("fsdp")                              # covered: the sources' mean
    assert e == pytest.approx(0.13) and "5.0% faster than measured" in how   # ... and their mean bias
    assert a100.end_to_end_error("ddp")[0] == pytest.approx(0.20)           # no ddp run: the worst source
    e, _n, how = h100.end_to_end_error("fsdp")                              # no H100 run: the worst source
    assert e == pytest.approx(0.20) and "h100" in how and "worst" in how
    assert "12.0% faster than measured" in how                              # ... with that source's bias
    m = get_preset("llama2-7b")
    covered = a100.predict(m, dataclasses.replace(lay, framework="fsdp"))
    uncovered = a100.predict(m, dataclasses.replace(lay, framework="ddp"))
    assert uncovered.expected_error > covered.expected_error
    assert "the framework ddp" in uncovered.error_basis and "framework_terms.json" in uncovered.error_basis
    assert "held out, those predictions were 12.0% faster" in uncovered.error_basis


def test_the_held_out_error_is_kept_by_host_share_and_sets_the_band_of_host_bound_steps(tmp_path):
    """Host-bound runs (the framework's host time a large share of the work) were never identified on another source's
    runs: their held-out error is kept apart, per source averaged with the sources weighted equally, and a prediction
    takes the error of its own bin."""
    from types import SimpleNamespace
    runs = SimpleNamespace(measured_s=np.ones(7), source_ids=np.array(["a", "a", "a", "b", "b", "b", "b"]))
    held = np.array([0.9, 1.1, 0.5, 1.02, 1.04, 0.7, 0.6])
    shares = np.array([0.01, 0.1, 0.5, 0.0, 0.02, 0.3, 1.0])
    bins = cf.host_share_bins(runs, held, shares)   # type: ignore[arg-type]
    assert [(b["from"], b["to"], b["runs"], b["sources"]) for b in bins] == [
        (0.0, 0.05, 3, ["a", "b"]), (0.05, 0.2, 1, ["a"]), (0.2, 1.0, 3, ["a", "b"])]
    assert bins[0]["held_out_mape"] == pytest.approx((0.1 + 0.03) / 2)        # a: 10 %; b: 2 % and 4 %
    assert bins[2]["held_out_mean_signed"] == pytest.approx((-0.5 + (-0.3 - 0.4) / 2) / 2)
    assert "host 20%-100%" in cf.format_host_share({"by_host_share": bins})
    from predictor.step.terms import host_share_bin
    assert host_share_bin(bins, 1.0) is bins[2] and host_share_bin(bins, 0.05) is bins[1]
    assert host_share_bin(None, 0.5) is None and host_share_bin([{"from": 0.0, "to": 1.0}], 0.5) is None
    # edges that end below 1: the writer closes its last bin and the reader honours that, not "to == 1"
    short = cf.host_share_bins(runs, held, np.minimum(shares, 0.5), edges=(0.0, 0.05, 0.5))  # type: ignore[arg-type]
    assert short[-1]["closed"] and not short[0]["closed"] and short[-1]["runs"] == 4   # 0.1, 0.3 and two at 0.5
    assert host_share_bin(short, 0.5) is short[-1] and host_share_bin(short, 0.05) is short[-1]
    assert host_share_bin(short, 0.6) is None
    # a prediction takes its bin's error: a host-bound step (a small model, micro-batch 1, TP 8) the high one
    per = {"a": {"held_out_mape": 0.08, "framework": "megatron-deepspeed", "devices": "a100-sxm4-80gb"}}
    bands = [{"from": 0.0, "to": 0.2, "runs": 9, "sources": ["a"], "held_out_mape": 0.05},
             {"from": 0.2, "to": 1.0, "runs": 9, "sources": ["a"], "held_out_mape": 0.30}]
    save_terms(EndToEndTerms(power_factor=0.1, host={"default": HostTerm(0.8e-3, 2.0, 2e-3)}, fitted_on={"a": 18},
                             validation={"held_out_mape": 0.08, "per_source": per, "by_host_share": bands}), tmp_path)
    pr = Predictor("dgx-a100-80gb", tmp_path)
    small = pr.predict(get_preset("gpt3-1.3b"), Layout(num_gpus=8, tp=8, micro_batch=1, global_batch=64, seq_len=1024,
                                                       framework="megatron-deepspeed", precision="fp16"))
    big = pr.predict(get_preset("llama2-7b"), Layout(num_gpus=8, tp=2, dp=4, micro_batch=4, global_batch=64,
                                                     seq_len=4096, framework="megatron-deepspeed"))
    # (no operator models in tmp_path: the parts rest on the roofline, the same for both)
    assert "end-to-end MAPE 30.0%" in small.error_basis and "20%-100% of the work" in small.error_basis
    assert "end-to-end MAPE 5.0%" in big.error_basis and "0%-20% of the work" in big.error_basis
    assert small.expected_error >= 0.30 > big.expected_error
    shipped, _w = load_terms_checked()
    assert shipped is not None and len(shipped.validation["by_host_share"]) == 3


@pytest.mark.parametrize("bad, says", [("abc", "takes a number"), ("-1", "must lie in [0, 2]"),
                                       ("nan", "must lie in [0, 2]"), ("3", "must lie in [0, 2]")])
def test_calibrate_framework_refuses_a_contention_that_is_not_a_kappa(bad, says, capsys):
    from predictor.cli.main import main
    with pytest.raises(SystemExit) as e:
        main(["calibrate-framework", "--dry-run", "--contention", bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--contention" in err and says in err and "Traceback" not in err

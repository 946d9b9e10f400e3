"""The speed check: re-timing sampled shapes scales a platform's measured operator times."""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from predictor.hardware.speed import (
    SPEED_CHECK_FILE,
    SpeedCheck,
    load_speed_check,
    save_speed_check,
    speed_check_from_dict,
    speed_factor,
)
from predictor.model.specs import Layout, ModelSpec
from predictor.plan.predict import Predictor, default_models_dir
from predictor.step.compose import ComposeOptions

REPO = Path(__file__).resolve().parents[1]
SAMPLES_2T = REPO / "bench" / "samples" / "cpu-2t"


def _check(factor: float, platform: str = "cpu-2t") -> SpeedCheck:
    return SpeedCheck(platform=platform, speed_factor=factor, points=10, measured_at="2026-11-23T10:00:00+00:00")


# --------------------------------------------------------------------------- the factor
def test_uniform_change_gives_exactly_that_factor():
    then = [0.001, 0.02, 0.3, 0.05]
    assert speed_factor(then, [t * 0.8 for t in then]) == pytest.approx(0.8)


def test_one_unlucky_shape_does_not_move_the_factor():
    then = [0.05, 0.06, 0.07, 0.08, 0.055]
    now = [t * 0.9 for t in then]
    now[1] = then[1] * 5.0  # one shape page-faulted its memory in again
    assert speed_factor(then, now) == pytest.approx(0.9)


def test_long_operators_outweigh_many_short_ones():
    then = [0.5] + [0.001] * 20            # one long GEMM, twenty microsecond element-wise ops
    now = [0.5 * 0.7] + [0.001 * 1.5] * 20
    assert speed_factor(then, now) == pytest.approx(0.7)


@pytest.mark.parametrize("then,now", [([], []), ([0.1], [0.1, 0.2]), ([0.1, -1.0], [0.1, 0.1]),
                                      ([0.1], [float("nan")])])
def test_bad_durations_are_refused(then, now):
    with pytest.raises(ValueError):
        speed_factor(then, now)


# --------------------------------------------------------------------------- the file
def test_save_and_load_round_trip(tmp_path):
    sc = replace(_check(0.87), per_op={"qkv_proj": 0.85}, ratio_p25=0.8, ratio_p75=0.95)
    path = save_speed_check(tmp_path, sc)
    assert path == tmp_path / "cpu-2t" / SPEED_CHECK_FILE
    assert load_speed_check(tmp_path, "cpu-2t") == sc
    assert load_speed_check(tmp_path, "cpu-1t") is None


def test_implausible_factor_is_not_saved(tmp_path):
    with pytest.raises(ValueError, match="sample it again"):
        save_speed_check(tmp_path, _check(3.0))
    assert not (tmp_path / "cpu-2t").exists()


@pytest.mark.parametrize("text", ["{not json", json.dumps({"platform": "cpu-2t"}),
                                  json.dumps({"platform": "cpu-2t", "speed_factor": "fast", "points": 3,
                                              "measured_at": "x"})])
def test_corrupt_file_names_itself_and_the_fix(tmp_path, text):
    (tmp_path / "cpu-2t").mkdir()
    (tmp_path / "cpu-2t" / SPEED_CHECK_FILE).write_text(text)
    with pytest.raises(ValueError) as e:
        load_speed_check(tmp_path, "cpu-2t")
    assert SPEED_CHECK_FILE in str(e.value) and "speed-check" in str(e.value)


# --------------------------------------------------------------------------- predictions
MODEL = ModelSpec(name="t", arch="gpt", num_layers=4, hidden_size=512, num_heads=8, ffn_hidden_size=2048,
                  vocab_size=16384)


def _pair(factor: float, platform: str = "cpu-1t", dp: int = 2):
    layout = Layout(num_gpus=dp, tp=1, pp=1, dp=dp, micro_batch=2, global_batch=2 * dp, seq_len=256,
                    precision="fp32")
    plain = Predictor(platform, options=ComposeOptions(speed_check=False)).predict(MODEL, layout, timeline=False)
    checked = Predictor(platform, options=ComposeOptions(speed_check=False),
                        speed_check=_check(factor, platform)).predict(MODEL, layout, timeline=False)
    return plain, checked


def test_speed_check_scales_measured_operators_only():
    plain, checked = _pair(0.8)
    assert checked.breakdown_s["compute"] == pytest.approx(0.8 * plain.breakdown_s["compute"], rel=1e-9)
    assert checked.breakdown_s["dp_comm"] == pytest.approx(plain.breakdown_s["dp_comm"], rel=1e-9)
    assert checked.step_time_s < plain.step_time_s
    assert any("x0.800" in w and "25 % faster" in w for w in checked.warnings)
    assert not any("speed check" in w for w in plain.warnings)


def test_saved_speed_check_is_used_and_a_corrupt_one_is_reported(tmp_path):
    src = default_models_dir() / "cpu-2t"
    dst = tmp_path / "cpu-2t"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(SPEED_CHECK_FILE))
    layout = Layout(num_gpus=1, tp=1, pp=1, dp=1, micro_batch=2, global_batch=2, seq_len=256, precision="fp32")
    base = Predictor("cpu-2t", tmp_path).predict(MODEL, layout, timeline=False)
    save_speed_check(tmp_path, _check(1.25))
    slower = Predictor("cpu-2t", tmp_path).predict(MODEL, layout, timeline=False)
    assert slower.breakdown_s["compute"] == pytest.approx(1.25 * base.breakdown_s["compute"], rel=1e-9)
    assert any("20 % slower" in w for w in slower.warnings)
    ignored = Predictor("cpu-2t", tmp_path, ComposeOptions(speed_check=False)).predict(MODEL, layout, timeline=False)
    assert ignored.step_time_s == pytest.approx(base.step_time_s)
    (dst / SPEED_CHECK_FILE).write_text("{broken")
    broken = Predictor("cpu-2t", tmp_path).predict(MODEL, layout, timeline=False)
    assert broken.step_time_s == pytest.approx(base.step_time_s)
    assert any(w.startswith("Speed check ignored") and "--save" in w for w in broken.warnings)


def test_speed_check_dict_round_trip_keeps_the_factor():
    sc = replace(_check(0.9), facts={"host": "vm"})
    from dataclasses import asdict
    assert speed_check_from_dict(json.loads(json.dumps(asdict(sc)))) == sc


# --------------------------------------------------------------------------- the bench side
def test_reference_points_are_sampled_shapes_rebuilt_exactly():
    from bench.sampling import design as D
    from bench.sampling.speed import reference_points
    from bench.sampling.store_io import read_shards
    refs = reference_points(SAMPLES_2T, per_op=2)
    assert refs == reference_points(SAMPLES_2T, per_op=2)  # deterministic
    stored = read_shards(SAMPLES_2T, "ops")
    keys = {D.sample_key(r["op"], r["pass"], r["dtype"], r): r["duration_s"] for r in stored.to_dict("records")}
    ops = set()
    for p, passes in refs:
        ops.add(p.op)
        assert 1e-3 <= sum(passes.values()) <= 0.2
        for ps, secs in passes.items():
            assert keys[p.key(ps, "fp32")] == secs
    assert len(ops) >= 12 and len(refs) <= 2 * len(ops)


def test_run_speed_check_compares_each_shape_with_its_own_sample(monkeypatch):
    """With the timer replaced by 'stored time x 0.75', the check must find exactly 0.75: it rebuilt
    the very shapes it compares with and paired each timing with its own sample."""
    import bench.sampling.speed as S
    from bench.sampling.timing import Timing
    refs = S.reference_points(SAMPLES_2T, per_op=1, max_s=0.01)
    stored_by_fn = {}
    real_build = S.opbench.build

    def build(op, shape, dtype, device):
        kernels = real_build(op, shape, dtype, device)
        passes = next(v for p, v in refs if p.op == op and {**p.shape, **p.extra} == shape)
        for ps, (_setup, fn) in kernels.items():
            stored_by_fn[fn] = passes.get(ps)
        return kernels

    monkeypatch.setattr(S.opbench, "build", build)
    import bench.sampling.sampler
    monkeypatch.setattr(bench.sampling.sampler, "time_call",
                        lambda fn, setup, **kw: Timing(stored_by_fn[fn] * 0.75, 0.0, 0.0, 0.0, 3))
    monkeypatch.setattr(S, "reference_points", lambda *a, **kw: refs)
    sc = S.run_speed_check("cpu-2t", SAMPLES_2T, per_op=1)
    assert sc.speed_factor == pytest.approx(0.75, rel=1e-3)
    assert sc.points == sum(len(v) for _p, v in refs)
    assert set(sc.per_op) == {p.op for p, _ in refs}
    assert sc.facts["threads"] == 2  # the sampling run's threads


def test_cli_names_a_missing_sample_directory(tmp_path, capsys):
    from bench.cli import main
    rc = main(["speed-check", "--platform", "nowhere", "--samples", str(tmp_path / "none")])
    assert rc == 2
    assert "sample the platform first" in capsys.readouterr().err


def test_error_band_uses_the_speed_checked_mape_only_with_a_speed_check(tmp_path):
    shutil.copytree(default_models_dir() / "cpu-2t", tmp_path / "cpu-2t",
                    ignore=shutil.ignore_patterns(SPEED_CHECK_FILE))
    val = {"platform": "cpu-2t", "n_runs": 84, "mape": 0.30, "measuring_runs": 6, "source": "test",
           "mape_speed_checked": 0.05, "n_runs_speed_checked": 42}
    (tmp_path / "cpu-2t" / "validation.json").write_text(json.dumps(val))
    layout = Layout(num_gpus=1, tp=1, pp=1, dp=1, micro_batch=2, global_batch=2, seq_len=256, precision="fp32")
    plain = Predictor("cpu-2t", tmp_path).predict(MODEL, layout, timeline=False)
    assert "MAPE 30.0% on 84 measured runs over 6 measuring runs, as sampled" in plain.error_basis
    checked = Predictor("cpu-2t", tmp_path, speed_check=_check(0.9)).predict(MODEL, layout, timeline=False)
    assert "MAPE 5.0% on 42 measured runs with a speed check" in checked.error_basis
    assert checked.expected_error < plain.expected_error
    del val["mape_speed_checked"]
    (tmp_path / "cpu-2t" / "validation.json").write_text(json.dumps(val))
    fallback = Predictor("cpu-2t", tmp_path, speed_check=_check(0.9)).predict(MODEL, layout, timeline=False)
    assert "MAPE 30.0%" in fallback.error_basis


def test_save_validation_summary_overrides_and_keeps_the_latest_run(tmp_path):
    import pandas as pd

    from predictor.checks.validate import save_validation
    res = pd.DataFrame({"case_id": ["a", "b"], "measured_s": [1.0, 2.0], "predicted_s": [1.1, 1.8],
                        "ape": [0.1, 0.1], "signed_error": [0.1, -0.1], "source": ["x", "x"]})
    path = save_validation("p", res, tmp_path, summary={"mape": 0.2, "n_runs": 10, "mape_speed_checked": 0.05})
    d = json.loads(path.read_text())
    assert d["mape"] == 0.2 and d["n_runs"] == 10 and d["mape_speed_checked"] == 0.05
    assert d["latest_run_mape"] == pytest.approx(0.1) and d["latest_run_n"] == 2

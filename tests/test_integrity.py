"""Integrity of what the predictor reads from models_store: each damaged file is named with the
reason, its value rejected, and the platform degrades (the rest still served) instead of crashing
or silently using a bad number. Outcome classes: REPORTED (a problem naming the file), REJECTED (a
value out of range refused, naming the field), DEGRADED (the platform keeps working without it)."""
from __future__ import annotations

import json
import logging
import pickle
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictor import paths
from predictor.calibrate import training
from predictor.hardware import network as N
from predictor.hardware.platforms import get_platform
from predictor.hardware.speed import SPEED_CHECK_FILE, SpeedCheck, load_speed_check, load_speed_check_checked
from predictor.paths import ArtifactError
from predictor.regress import features as F
from predictor.regress import regressors as R
from predictor.regress import transfer as T
from predictor.step.overhead import HostOverhead, load_host_overhead, load_host_overhead_checked, save_host_overhead

MODELS = R.MODELS_DIR
PLATFORM = "perlmutter-a100"
A100 = get_platform(PLATFORM).device
ROW = pd.DataFrame([{"tp": 2, "batch": 2, "seq": 2048, "hidden": 4096, "heads": 32, "kv_heads": None,
                     "ffn_hidden": None, "vocab": None, "layers": 4, "params": None, "variant": None}])


@pytest.fixture()
def plat(tmp_path) -> Path:
    """A copy of the shipped perlmutter-a100 folder (models + network.json)."""
    d = tmp_path / PLATFORM
    shutil.copytree(MODELS / PLATFORM, d)
    return d


def _problems(d: Path) -> dict[str, str]:
    return dict(R.ModelBank(d.name, d).problems)


# --------------------------------------------------------------------------- shipped store
def test_shipped_models_store_passes_the_check_entirely():
    assert training.check_models_store(MODELS) == []
    banks = 0
    for d in sorted(p for p in MODELS.iterdir() if p.is_dir()):
        if not any(d.glob("*.txt")):
            continue
        bank = R.ModelBank.load(d.name, MODELS)
        assert bank.problems == [] and not bank.degraded, d.name
        assert bank.unhashed == [], f"{d.name}: sidecars without a hash: {bank.unhashed}"
        assert bank.warnings() == []
        banks += 1
    assert banks >= 4


# --------------------------------------------------------------------------- model files: REPORTED + DEGRADED
def test_swapped_txt_is_detected_by_its_hash_and_the_rest_is_served(plat):
    shutil.copy(plat / "mlp_up.fwd.txt", plat / "mlp_down.fwd.txt")
    bank = R.ModelBank(PLATFORM, plat)
    assert bank.degraded and [p.stem for p in bank.problems] == ["mlp_down.fwd"]
    _stem, reason = bank.problems[0]
    assert "mlp_down.fwd.txt" in reason and "records" in reason  # size / sha256 against the sidecar
    assert not bank.has_op("mlp_down", "fwd") and bank.has_op("mlp_up", "fwd")
    assert ("mlp_down", "fwd") not in bank.ops_available()
    assert np.isfinite(bank.predict_op("mlp_up", "fwd", ROW, A100)).all()
    with pytest.raises(KeyError):
        bank.predict_op("mlp_down", "fwd", ROW, A100)
    assert any(w.startswith("Model mlp_down.fwd of platform 'perlmutter-a100' is not used") for w in bank.warnings())


def test_swapped_txt_of_the_same_size_is_detected_by_the_sha256(plat):
    data = bytearray((plat / "mlp_down.fwd.txt").read_bytes())
    i = data.index(b"leaf_value=") + len(b"leaf_value=")
    data[i] = ord("9") if data[i] != ord("9") else ord("8")  # same length, other content
    (plat / "mlp_down.fwd.txt").write_bytes(bytes(data))
    reason = _problems(plat)["mlp_down.fwd"]
    assert "sha256" in reason and "mlp_down.fwd.txt" in reason


def test_swapped_pair_is_detected_by_its_identity(plat):
    for ext in (".txt", ".json"):
        shutil.copy(plat / f"mlp_up.fwd{ext}", plat / f"mlp_down.fwd{ext}")
    reason = _problems(plat)["mlp_down.fwd"]
    assert "mlp_down.fwd.json" in reason and "field 'op'" in reason and "mlp_up.fwd" in reason


def test_model_copied_from_another_platform_is_detected(plat):
    for ext in (".txt", ".json"):
        shutil.copy(MODELS / "vista-gh200" / f"mlp_up.fwd{ext}", plat / f"mlp_up.fwd{ext}")
    reason = _problems(plat)["mlp_up.fwd"]
    assert "field 'platform'" in reason and "vista-gh200" in reason


@pytest.mark.parametrize("damage, file, words", [
    (lambda d: (d / "mlp_up.fwd.json").write_text('{"kind": "op", "op": "mlp_'), "mlp_up.fwd.json", "not valid JSON"),
    (lambda d: (d / "mlp_up.fwd.json").write_bytes(b"\xff\xfe\x00"), "mlp_up.fwd.json", "not valid JSON"),
    (lambda d: (d / "mlp_up.fwd.json").write_text("[1, 2]"), "mlp_up.fwd.json", "JSON object"),
    (lambda d: (d / "mlp_up.fwd.txt").unlink(), "mlp_up.fwd.txt", "is missing"),
    (lambda d: (d / "mlp_up.fwd.json").unlink(), "mlp_up.fwd.json", "is missing"),
    (lambda d: (d / "mlp_up.fwd.txt").write_text(""), "mlp_up.fwd.txt", "bytes"),
    (lambda d: (d / "mlp_up.fwd.txt").write_bytes(b"\x00" * 500), "mlp_up.fwd.txt", "bytes"),
], ids=["json-cut", "json-binary", "json-not-object", "txt-missing", "json-missing", "txt-empty", "txt-binary"])
def test_damaged_model_file_is_reported_by_name(plat, damage, file, words):
    damage(plat)
    problems = _problems(plat)
    assert list(problems) == ["mlp_up.fwd"]
    assert file in problems["mlp_up.fwd"] and words in problems["mlp_up.fwd"]
    bank = R.ModelBank(PLATFORM, plat)
    intact = R.ModelBank.load(PLATFORM, MODELS).ops_available()
    assert not bank.has_op("mlp_up", "fwd") and bank.ops_available() == [o for o in intact if o != ("mlp_up", "fwd")]


def _edit_sidecar(d: Path, stem: str, **changes) -> None:
    p = d / f"{stem}.json"
    md = json.loads(p.read_text())
    for k, v in changes.items():
        if v is KeyError:
            md.pop(k)
        else:
            md[k] = v
    p.write_text(json.dumps(md, indent=1))


@pytest.mark.parametrize("changes, field", [
    ({"cv_mape": -0.1}, "cv_mape"),
    ({"cv_mape": float("nan")}, "cv_mape"),
    ({"n_samples": "many"}, "n_samples"),
    ({"kind": "tree"}, "kind"),
    ({"pass": "sideways"}, "pass"),
    ({"feature_names": ["a", "b"]}, "feature_names"),
    ({"feature_names": KeyError}, "feature_names"),
    ({"reliable": "yes"}, "reliable"),
    ({"outlier_filter": {"physical_bound": {"fraction": 3.0}}}, "outlier_filter.physical_bound.fraction"),
    ({"shape_ranges": {"hidden": [4096.0, 1024.0]}}, "shape_ranges.hidden"),
    ({R.MODEL_FILE_KEY: {"name": "mlp_up.fwd.txt", "sha256": "xyz", "bytes": 1, "num_trees": 1}}, "model_file.sha256"),
    ({R.MODEL_FILE_KEY: {"name": "mlp_down.fwd.txt", "sha256": "0" * 64, "bytes": 1, "num_trees": 1}},
     "model_file.name"),
])
def test_sidecar_values_out_of_range_are_rejected_naming_the_field(plat, changes, field):
    _edit_sidecar(plat, "mlp_up.fwd", **changes)
    reason = _problems(plat)["mlp_up.fwd"]
    assert "mlp_up.fwd.json" in reason and f"field '{field}'" in reason


def test_tree_count_must_match_the_sidecar(plat):
    md = json.loads((plat / "mlp_up.fwd.json").read_text())
    md[R.MODEL_FILE_KEY]["num_trees"] = md[R.MODEL_FILE_KEY]["num_trees"] + 1
    (plat / "mlp_up.fwd.json").write_text(json.dumps(md))
    assert "trees where mlp_up.fwd.json records" in _problems(plat)["mlp_up.fwd"]


def test_model_without_a_hash_is_checked_structurally_and_says_so(plat):
    _edit_sidecar(plat, "mlp_up.fwd", **{R.MODEL_FILE_KEY: KeyError})
    bank = R.ModelBank(PLATFORM, plat)
    assert bank.problems == [] and bank.unhashed == ["mlp_up.fwd"] and bank.has_op("mlp_up", "fwd")
    assert any("no content hash" in w and "structure only" in w for w in bank.warnings())
    # structural only: a tree cut out of the middle is still found
    text = (plat / "mlp_up.fwd.txt").read_text()
    a, b = text.index("\nTree=5\n"), text.index("\nTree=6\n")
    (plat / "mlp_up.fwd.txt").write_text(text[:a] + text[b:])
    assert "Tree=6" in _problems(plat)["mlp_up.fwd"]


def test_unknown_txt_without_sidecar_is_not_a_model(plat):
    (plat / "notes.txt").write_text("not a model")
    assert _problems(plat) == {}


def test_model_replaced_after_the_bank_was_built_is_verified_again(plat):
    bank = R.ModelBank(PLATFORM, plat)
    assert bank.has_op("mlp_up", "fwd")
    full = (plat / "mlp_up.fwd.txt").read_bytes()
    (plat / "mlp_up.fwd.txt").write_bytes(full[: len(full) // 2])
    with pytest.raises(ArtifactError, match=r"mlp_up\.fwd\.txt"):
        bank.predict_op("mlp_up", "fwd", ROW, A100)
    assert not bank.has_op("mlp_up", "fwd") and [p.stem for p in bank.problems] == ["mlp_up.fwd"]


def test_predictor_falls_back_for_a_failed_model(tmp_path, plat):
    from predictor.model.presets import get_preset
    from predictor.model.specs import Layout
    from predictor.plan.predict import Predictor
    model = get_preset("gpt3-1.3b")
    lay = Layout(num_gpus=8, tp=2, pp=1, dp=4, micro_batch=2, global_batch=16, seq_len=1024)
    before = Predictor(PLATFORM, tmp_path).predict(model, lay, timeline=False)
    up = before.ops[(before.ops["op"] == "mlp_up") & (before.ops["pass"] == "fwd")]
    assert (up["provenance"] == "measured").all()
    (plat / "mlp_up.fwd.txt").write_bytes((plat / "mlp_up.fwd.txt").read_bytes()[:5000])
    R._cached_bank.cache_clear()
    after = Predictor(PLATFORM, tmp_path).predict(model, lay, timeline=False)
    up = after.ops[(after.ops["op"] == "mlp_up") & (after.ops["pass"] == "fwd")]
    assert len(up) and not (up["provenance"] == "measured").any()
    assert np.isfinite(after.step_time_s) and after.step_time_s > 0
    # never a silent fallback: the prediction names the model file that failed
    assert any("mlp_up.fwd" in w for w in after.warnings)


# --------------------------------------------------------------------------- writing: atomic
def _fit(op: str = "mlp_up", scale: float = 1.3, n: int = 60) -> R.OpRegressor:
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"tp": 1, "batch": rng.choice([1, 2, 4], n), "seq": rng.choice([1024, 2048], n),
                       "hidden": rng.choice([2048, 4096], n)})
    df["ffn_hidden"] = 4 * df["hidden"]
    t = F.roofline_s(op, "fwd", df, A100) * scale * np.exp(rng.normal(0, 0.02, n))
    return R.OpRegressor(op, "fwd", {"num_boost_round": 20}).fit(df, t, A100)


def test_save_writes_the_hash_and_a_failed_sidecar_write_keeps_the_old_pair(tmp_path, monkeypatch):
    txt, meta = _fit(scale=1.3).save(tmp_path, platform=PLATFORM)
    md = json.loads(meta.read_text())
    assert md[R.MODEL_FILE_KEY]["sha256"] == R.model_sha256(txt.read_bytes())
    assert md[R.MODEL_FILE_KEY]["bytes"] == len(txt.read_bytes()) and md["platform"] == PLATFORM
    old = (txt.read_bytes(), meta.read_bytes())
    real = R.write_bytes_atomic

    def failing(path, data):
        if Path(path).suffix == ".json":
            raise OSError("disk full")
        return real(path, data)
    monkeypatch.setattr(R, "write_bytes_atomic", failing)
    with pytest.raises(OSError, match="disk full"):
        _fit(scale=2.0).save(tmp_path, platform=PLATFORM)
    assert (txt.read_bytes(), meta.read_bytes()) == old  # the new .txt was rolled back
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp_up.fwd.json", "mlp_up.fwd.txt"]  # no temp files
    assert R.check_models(tmp_path, PLATFORM)[1] == []


OPS3 = ("mlp_up", "mlp_down", "gelu")
_real_train = training.train_platform


def _fake_store(monkeypatch, scale: float) -> None:
    rng = np.random.default_rng(1)
    dev = get_platform("cpu-2t").device
    frames = []
    for op in OPS3:
        n = 60
        df = pd.DataFrame({"tp": 1, "batch": rng.choice([1, 2, 4], n), "seq": rng.choice([128, 256, 512], n),
                           "hidden": rng.choice([256, 512, 1024], n)})
        df["ffn_hidden"] = 4 * df["hidden"]
        for c in ("heads", "kv_heads", "vocab", "layers", "params"):
            df[c] = None
        df["duration_s"] = F.roofline_s(op, "fwd", df, dev, "fp32") * scale * np.exp(rng.normal(0, 0.03, n))
        df = df.assign(platform="cpu-2t", op=op, **{"pass": "fwd"}, variant=None, dtype="fp32",
                       source="test", batch_id="b")
        frames.append(df)
    ops_df = pd.concat(frames, ignore_index=True)

    def unavailable(*a, **k):
        raise RuntimeError("no store in this test")
    monkeypatch.setattr(training.store, "read_op_samples", lambda *a, **k: ops_df.copy())
    monkeypatch.setattr(training.store, "read_collective_samples", lambda *a, **k: pd.DataFrame(columns=["collective"]))
    for name in ("read_paper_errors", "store_fingerprint", "list_batches"):
        monkeypatch.setattr(training.store, name, unavailable)


def _hashes(d: Path) -> dict[str, str]:
    good, problems = R.check_models(d, "cpu-2t")
    assert problems == [], problems
    return {s: v.sha256 for s, v in good.items()}


@pytest.mark.parametrize("where", ["fit of the 2nd model", "sidecar of the 2nd model", "txt of the 3rd model"])
def test_interrupted_train_leaves_each_model_old_or_new(tmp_path, monkeypatch, where):
    _fake_store(monkeypatch, 1.5)
    training.train_platform("cpu-2t", models_dir=tmp_path, cv_folds=0, write_readme=False)
    old = _hashes(tmp_path / "cpu-2t")
    assert sorted(old) == sorted(f"{o}.fwd" for o in OPS3)
    _fake_store(monkeypatch, 3.0)  # other samples: every model changes
    writes: list[str] = []
    real_write, real_fit = R.write_bytes_atomic, R.OpRegressor.fit

    def write(path, data):
        writes.append(Path(path).name)
        if where == "sidecar of the 2nd model" and len(writes) == 4:
            raise KeyboardInterrupt  # Ctrl-C between the 2nd model's .txt and its .json
        if where == "txt of the 3rd model" and len(writes) == 5:
            raise OSError("disk full")
        return real_write(path, data)

    def fit(self, *a, **k):
        if where == "fit of the 2nd model" and self.op == "mlp_down":  # jobs run sorted: gelu, mlp_down, mlp_up
            raise KeyboardInterrupt
        return real_fit(self, *a, **k)
    monkeypatch.setattr(R, "write_bytes_atomic", write)
    monkeypatch.setattr(R.OpRegressor, "fit", fit)
    with pytest.raises((KeyboardInterrupt, OSError)):
        training.train_platform("cpu-2t", models_dir=tmp_path, cv_folds=0, write_readme=False)
    now = _hashes(tmp_path / "cpu-2t")  # every model verifies (no half pair, no half file)
    assert sorted(now) == sorted(old)
    changed = {s for s in now if now[s] != old[s]}
    expect = {"fit of the 2nd model": {"gelu.fwd"}, "sidecar of the 2nd model": {"gelu.fwd"},
              "txt of the 3rd model": {"gelu.fwd", "mlp_down.fwd"}}[where]
    assert changed == expect
    assert not [p for p in (tmp_path / "cpu-2t").iterdir() if p.name.startswith(".")]  # no temp files left


def test_cli_train_verifies_what_it_wrote(tmp_path, monkeypatch, capsys):
    from predictor.cli.main import main
    _fake_store(monkeypatch, 1.5)
    monkeypatch.setattr(training, "train_platform",
                        lambda pid, **k: _real_train(pid, **{**k, "cv_folds": 0, "write_readme": False}))
    assert main(["train", "--platform", "cpu-2t", "--models-dir", str(tmp_path), "--quiet"]) == 0
    assert "cpu-2t: 3 models on disk verified" in capsys.readouterr().out
    # a model broken on disk by something else is named and the command fails
    real_save = R.OpRegressor.save

    def save_then_break(self, directory, **extra):
        out = real_save(self, directory, **extra)
        if self.op == "gelu":
            out[0].write_bytes(out[0].read_bytes()[:100])
        return out
    monkeypatch.setattr(R.OpRegressor, "save", save_then_break)
    assert main(["train", "--platform", "cpu-2t", "--models-dir", str(tmp_path), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "model gelu.fwd FAILS its check" in err and "gelu.fwd.txt" in err



def test_seal_adds_the_hash_without_touching_the_model_and_refuses_a_broken_one(tmp_path):
    d = tmp_path / PLATFORM
    d.mkdir()
    for stem in ("mlp_up.fwd", "mlp_down.fwd"):
        shutil.copy(MODELS / PLATFORM / f"{stem}.txt", d / f"{stem}.txt")
        md = json.loads((MODELS / PLATFORM / f"{stem}.json").read_text())
        md.pop(R.MODEL_FILE_KEY)
        (d / f"{stem}.json").write_text(json.dumps(md, indent=1) + "\n")
    txt_before = (d / "mlp_up.fwd.txt").read_bytes()
    assert sorted(training.seal_model_sidecars(tmp_path)) == [f"{PLATFORM}/mlp_down.fwd", f"{PLATFORM}/mlp_up.fwd"]
    assert training.seal_model_sidecars(tmp_path) == []  # idempotent
    assert (d / "mlp_up.fwd.txt").read_bytes() == txt_before
    # byte-identical to the shipped (sealed) sidecar: the seal is deterministic
    assert (d / "mlp_up.fwd.json").read_bytes() == (MODELS / PLATFORM / "mlp_up.fwd.json").read_bytes()
    assert R.ModelBank(PLATFORM, d).unhashed == []
    _edit_sidecar(d, "mlp_down.fwd", **{R.MODEL_FILE_KEY: KeyError})
    (d / "mlp_down.fwd.txt").write_bytes(txt_before[:1000])
    with pytest.raises(ArtifactError, match=r"mlp_down\.fwd\.txt"):
        training.seal_model_sidecars(tmp_path)
    assert R.MODEL_FILE_KEY not in json.loads((d / "mlp_down.fwd.json").read_text())


# --------------------------------------------------------------------------- JSON artifacts: REJECTED
def test_artifact_error_names_file_and_field_and_is_a_value_error():
    e = ArtifactError("/x/network.json", "intra.bandwidth_gbps", "is -1; must be > 0")
    assert isinstance(e, ValueError)
    assert str(e) == "/x/network.json: field 'intra.bandwidth_gbps': is -1; must be > 0"
    back = pickle.loads(pickle.dumps(e))
    assert (back.path, back.field, back.problem) == (e.path, e.field, e.problem)


def _net_file(tmp_path: Path, pid: str, **tier_changes) -> Path:
    net = N.spec_network(get_platform(pid))
    d = json.loads(net.to_json())
    for k, v in tier_changes.items():
        tier, _, name = k.partition("__")
        if name:
            d[tier][name] = v
        else:
            d[tier] = v
    p = tmp_path / pid / "network.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("change, field", [
    ({"intra__bandwidth_gbps": -5.0}, "intra.bandwidth_gbps"),
    ({"inter__bandwidth_gbps": 0.0}, "inter.bandwidth_gbps"),
    ({"intra__ll_bandwidth_gbps": -1.0}, "intra.ll_bandwidth_gbps"),
    ({"inter__latency_us": -3.0}, "inter.latency_us"),
    ({"intra__base_latency_us": float("nan")}, "intra.base_latency_us"),
    ({"intra__bandwidth_gbps": "fast"}, "intra.bandwidth_gbps"),
    ({"algorithms": ["ring", "butterfly"]}, "algorithms"),
    ({"collective_efficiency": {"allgather": 0.0}}, "collective_efficiency.allgather"),
    ({"collective_efficiency": {"allgather": 1.6}}, "collective_efficiency.allgather"),
    ({"intra_topology": "torus"}, "intra_topology"),
    ({"node_gpus": 0}, "node_gpus"),
    ({"intra": None}, "intra"),
])
def test_network_json_with_a_bad_value_falls_back_to_specs_with_a_warning(tmp_path, change, field):
    h200 = get_platform("dgx-h200")
    p = _net_file(tmp_path, "dgx-h200", **change)
    net, warn = N.load_network_checked(h200, tmp_path)
    assert net == N.spec_network(h200)
    assert warn and str(p) in warn and f"field '{field}'" in warn and "link specs" in warn
    with pytest.raises(ArtifactError) as e:
        N.NetworkModel.from_json(p.read_text(), p)
    assert e.value.field == field
    assert N.load_network(h200, tmp_path) == N.spec_network(h200)


def test_network_json_corrupt_or_borrowed_corrupt_is_named(tmp_path, caplog):
    p = _net_file(tmp_path, "dgx-h200")
    net, warn = N.load_network_checked(get_platform("dgx-h200"), tmp_path)
    assert warn is None and net.platform_id == "dgx-h200"
    p.write_text('{"intra": {"bandwidth_gbps": 3')
    h100 = get_platform("dgx-h100")  # borrows dgx-h200's calibration
    net, warn = N.load_network_checked(h100, tmp_path)
    assert net == N.spec_network(h100) and "dgx-h200/network.json" in warn and "not valid JSON" in warn
    with caplog.at_level(logging.WARNING):
        N.load_network(h100, tmp_path)
    assert "dgx-h200/network.json" in caplog.text  # the unchecked loader no longer fails silently


def test_save_network_refuses_a_bad_value_and_writes_nothing(tmp_path):
    net = N.spec_network(get_platform("dgx-h200"))
    from dataclasses import replace
    bad = replace(net, intra=replace(net.intra, bandwidth_gbps=-1.0))
    with pytest.raises(ArtifactError, match=r"intra\.bandwidth_gbps"):
        N.save_network(bad, tmp_path / "dgx-h200" / "network.json")
    assert not (tmp_path / "dgx-h200" / "network.json").exists()


@pytest.mark.parametrize("text, field", [
    ('{"host_s_per_layer_pass": NaN, "blend_p": 2.0}', "host_s_per_layer_pass"),
    ('{"host_s_per_layer_pass": -0.001, "blend_p": 2.0}', "host_s_per_layer_pass"),
    ('{"host_s_per_layer_pass": 1.5, "blend_p": 2.0}', "host_s_per_layer_pass"),
    ('{"host_s_per_layer_pass": 0.001, "blend_p": 0.5}', "blend_p"),
    ('{"host_s_per_layer_pass": 0.001, "blend_p": Infinity}', "blend_p"),
    ('{"host_s_per_layer_pass": 0.001}', "blend_p"),
    ('{"host_s_per_layer_pass": 0.001, "blend_p": 2.0, "cv_mape": -1}', "cv_mape"),
    ('{"host_s_per_layer_pass": 0.00', None),
])
def test_host_overhead_with_a_bad_value_is_rejected_with_a_warning(tmp_path, caplog, text, field):
    (tmp_path / "cpu-2t").mkdir()
    (tmp_path / "cpu-2t" / "host_overhead.json").write_text(text)
    ho, warn = load_host_overhead_checked(tmp_path, "cpu-2t")
    assert ho is None and "host_overhead.json" in warn and "not modelled" in warn
    assert (f"field '{field}'" in warn) if field else ("not valid JSON" in warn)
    with caplog.at_level(logging.WARNING):
        assert load_host_overhead(tmp_path, "cpu-2t") is None
    assert "host_overhead.json" in caplog.text  # no longer ignored silently


def test_host_overhead_good_file_and_save_round_trip(tmp_path):
    assert load_host_overhead_checked(tmp_path, "cpu-2t") == (None, None)
    ho = HostOverhead(host_s_per_layer_pass=2e-3, blend_p=3.0, source="t", fitted_on_runs=4, cv_mape=0.1)
    save_host_overhead(tmp_path, "cpu-2t", ho, {"cv_mape": 0.1})
    assert load_host_overhead_checked(tmp_path, "cpu-2t") == (ho, None)
    with pytest.raises(ArtifactError, match="host_s_per_layer_pass"):
        save_host_overhead(tmp_path, "cpu-1t", HostOverhead(-1.0, 2.0), {})
    assert not (tmp_path / "cpu-1t" / "host_overhead.json").exists()


def test_predictor_runs_without_the_bad_host_overhead(tmp_path):
    from predictor.model.specs import Layout, ModelSpec
    from predictor.plan.predict import Predictor
    shutil.copytree(MODELS / "cpu-2t", tmp_path / "cpu-2t", ignore=shutil.ignore_patterns(SPEED_CHECK_FILE))
    model = ModelSpec(name="t", arch="gpt", num_layers=2, hidden_size=256, num_heads=4, ffn_hidden_size=1024,
                      vocab_size=1000)
    lay = Layout(num_gpus=1, tp=1, pp=1, dp=1, micro_batch=2, global_batch=2, seq_len=256, precision="fp32")
    good = Predictor("cpu-2t", tmp_path).predict(model, lay, timeline=False)
    assert good.breakdown_s["host_overhead"] > 0  # the shipped fit is used
    (tmp_path / "cpu-2t" / "host_overhead.json").write_text('{"host_s_per_layer_pass": -5, "blend_p": 1}')
    pred = Predictor("cpu-2t", tmp_path).predict(model, lay, timeline=False)
    assert pred.breakdown_s["host_overhead"] == 0 and 0 < pred.step_time_s < good.step_time_s


def _speed(tmp_path: Path, **changes) -> None:
    d = {"platform": "cpu-2t", "speed_factor": 0.9, "points": 30, "measured_at": "2026-01-01T00:00:00+00:00"}
    d.update(changes)
    (tmp_path / "cpu-2t").mkdir(exist_ok=True)
    (tmp_path / "cpu-2t" / SPEED_CHECK_FILE).write_text(json.dumps(d))


@pytest.mark.parametrize("changes, field", [
    ({"speed_factor": float("nan")}, "speed_factor"),
    ({"speed_factor": -1.0}, "speed_factor"),
    ({"speed_factor": 40.0}, "speed_factor"),
    ({"speed_factor": True}, "speed_factor"),
    ({"points": 0}, "points"),
    ({"ratio_p25": -0.5}, "ratio_p25"),
    ({"per_op": {"qkv_proj": 0}}, "per_op.qkv_proj"),
    ({"platform": "cpu-1t"}, "platform"),
])
def test_speed_check_with_a_bad_value_is_rejected_naming_the_field(tmp_path, changes, field):
    _speed(tmp_path, **changes)
    with pytest.raises(ArtifactError) as e:
        load_speed_check(tmp_path, "cpu-2t")
    assert e.value.field == field and e.value.path.name == SPEED_CHECK_FILE and "speed-check" in str(e.value)
    sc, warn = load_speed_check_checked(tmp_path, "cpu-2t")
    assert sc is None and warn.startswith("Speed check ignored") and f"field '{field}'" in warn


def test_speed_check_good_file_loads(tmp_path):
    _speed(tmp_path)
    sc, warn = load_speed_check_checked(tmp_path, "cpu-2t")
    assert warn is None and isinstance(sc, SpeedCheck) and sc.speed_factor == 0.9


@pytest.mark.parametrize("record, field", [
    ({"per_op": {"mlp_up.fwd": {"perlmutter-a100": -0.1}}, "overall_median_ape": 0.1},
     "per_op.mlp_up.fwd.perlmutter-a100"),
    ({"per_op": {}, "overall_median_ape": float("nan")}, "overall_median_ape"),
    ({"per_op": {"mlp_up.fwd": 0.1}, "overall_median_ape": 0.1}, "per_op"),
])
def test_transfer_validation_with_a_bad_error_is_rejected(tmp_path, caplog, record, field):
    (tmp_path / T.VALIDATION_FILE).write_text(json.dumps(record))
    rec, warn = T.load_validation_checked(tmp_path)
    assert rec is None and T.VALIDATION_FILE in warn and f"field '{field}'" in warn
    with caplog.at_level(logging.WARNING):
        assert T.load_validation(tmp_path) is None
    assert T.VALIDATION_FILE in caplog.text


def test_network_validation_with_a_bad_error_is_rejected(tmp_path):
    (tmp_path / N.NETWORK_VALIDATION_FILE).write_text('{"calibrated_median_ape": NaN, "spec_loo_median_ape": 0.2}')
    rec, warn = N.load_network_validation_checked(tmp_path)
    assert rec == {} and "network_validation.json" in warn and "field 'calibrated_median_ape'" in warn
    assert N.load_network_validation(tmp_path) == {}
    e, _basis = N.expected_error(N.spec_network(get_platform("dgx-h200")), tmp_path)
    assert e == pytest.approx(0.30)  # no record: the assumed error, not NaN


def test_platform_validation_with_a_bad_error_is_rejected(tmp_path):
    (tmp_path / "cpu-2t").mkdir()
    p = tmp_path / "cpu-2t" / paths.VALIDATION
    p.write_text(json.dumps({"platform": "cpu-2t", "n_runs": 4, "mape": -0.2}))
    rec, warn = paths.load_platform_validation_checked("cpu-2t", tmp_path)
    assert rec is None and "validation.json" in warn and "field 'mape'" in warn
    p.write_text(json.dumps({"platform": "cpu-2t", "n_runs": 4, "mape": 0.2}))
    assert paths.load_platform_validation_checked("cpu-2t", tmp_path) == (json.loads(p.read_text()), None)


def test_check_models_store_lists_every_problem(tmp_path):
    for pid in ("cpu-2t", PLATFORM):
        shutil.copytree(MODELS / pid, tmp_path / pid, ignore=shutil.ignore_patterns(SPEED_CHECK_FILE))
    shutil.copy(MODELS / T.VALIDATION_FILE, tmp_path / T.VALIDATION_FILE)
    assert training.check_models_store(tmp_path) == []
    (tmp_path / PLATFORM / "gelu.fwd.txt").write_text("tree\n")
    _net_file(tmp_path, PLATFORM, inter__bandwidth_gbps=-1.0)
    (tmp_path / "cpu-2t" / "host_overhead.json").write_text('{"host_s_per_layer_pass": NaN, "blend_p": 1}')
    out = training.check_models_store(tmp_path)
    assert len(out) == 3
    assert any("gelu.fwd.txt" in o for o in out)
    assert any("network.json" in o and "inter.bandwidth_gbps" in o for o in out)
    assert any("host_overhead.json" in o and "host_s_per_layer_pass" in o for o in out)


def test_a_consistent_hash_does_not_skip_the_full_check_before_lightgbm(plat, monkeypatch):
    """A pair re-hashed after a bad edit passes the bank's fast check (size, sha256, outline); the
    full structural check still runs before LightGBM parses it, and refuses it."""
    text = (plat / "mlp_up.fwd.txt").read_text()
    i = text.index("\nTree=3\nnum_leaves=") + len("\nTree=3\nnum_leaves=")
    j = text.index("\n", i)
    bad = (text[:i] + str(int(text[i:j]) + 1) + text[j:]).encode()
    (plat / "mlp_up.fwd.txt").write_bytes(bad)
    md = json.loads((plat / "mlp_up.fwd.json").read_text())
    md[R.MODEL_FILE_KEY] = R.model_file_record("mlp_up.fwd", bad, md[R.MODEL_FILE_KEY]["num_trees"])
    (plat / "mlp_up.fwd.json").write_text(json.dumps(md, indent=1))
    bank = R.ModelBank(PLATFORM, plat)
    assert bank.has_op("mlp_up", "fwd") and bank.problems == []

    def booster(*a, **k):
        raise AssertionError("reached LightGBM")
    monkeypatch.setattr(R.lgb, "Booster", booster)
    with pytest.raises(ArtifactError, match="tree 3: leaf_value has"):
        bank.predict_op("mlp_up", "fwd", ROW, A100)
    assert not bank.has_op("mlp_up", "fwd") and [p.stem for p in bank.problems] == ["mlp_up.fwd"]
    assert any("mlp_up.fwd" in p.reason for p in R.check_models(plat, PLATFORM)[1])  # the full check of train / store

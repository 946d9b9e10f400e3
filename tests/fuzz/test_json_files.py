"""Every JSON the predictor reads from the models folder: an out-of-range, non-finite or mistyped value
is refused with a warning naming the file and the field (the file is ignored, never used as it is),
a valid file loads; and random JSON (Hypothesis) never raises out of a checked loader."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from predictor import paths
from predictor.hardware.network import load_network_file_checked
from predictor.hardware.speed import load_speed_check_checked
from predictor.step.overhead import load_host_overhead_checked
from predictor.step.terms import load_terms_checked

STORE = Path(__file__).resolve().parents[2] / "models_store"
P = "cpu-1t"

VALID = {
    "network.json": json.loads((STORE / P / "network.json").read_text()),
    "host_overhead.json": json.loads((STORE / P / "host_overhead.json").read_text()),
    "validation.json": json.loads((STORE / P / "validation.json").read_text()),
    "speed_check.json": {"platform": P, "speed_factor": 1.05, "points": 30, "measured_at": "2026-11-24T10:00:00",
                         "ratio_p25": 0.98, "ratio_p75": 1.1, "check_s": 30.0, "per_op": {"mlp_up": 1.02}},
    "framework_terms.json": {"compute_factor": 1.1, "contention": 0.2, "power_factor": 0.1,
                             "host": {"megatron": {"host_s_per_layer_pass": 0.001, "blend_p": 2.0}}},
}


def load(tmp_path: Path, name: str, data) -> tuple[object, str | None]:
    """(value, warning) of the checked loader of `name`, the file written with `data`."""
    d = tmp_path / "models"
    (d / P).mkdir(parents=True, exist_ok=True)
    target = d / name if name == "framework_terms.json" else d / P / name
    target.write_text(data if isinstance(data, str) else json.dumps(data))
    if name == "network.json":
        return load_network_file_checked(target)
    if name == "host_overhead.json":
        return load_host_overhead_checked(d, P)
    if name == "speed_check.json":
        return load_speed_check_checked(d, P)
    if name == "framework_terms.json":
        return load_terms_checked(d)
    return paths.load_platform_validation_checked(P, d)


def set_path(d: dict, dotted: str, value) -> dict:
    d = copy.deepcopy(d)
    keys = dotted.split(".")
    cur = d
    for k in keys[:-1]:
        cur = cur[k]
    if value is KeyError:
        del cur[keys[-1]]
    else:
        cur[keys[-1]] = value
    return d


BAD = [  # (file, field, value); value KeyError = the field removed
    ("network.json", "intra.bandwidth_gbps", -5.0), ("network.json", "intra.bandwidth_gbps", 0),
    ("network.json", "intra.bandwidth_gbps", float("nan")), ("network.json", "inter.bandwidth_gbps", float("inf")),
    ("network.json", "inter.bandwidth_gbps", "fast"), ("network.json", "intra.latency_us", -1.0),
    ("network.json", "inter.latency_us", KeyError), ("network.json", "intra", KeyError),
    ("network.json", "intra", [1, 2]), ("network.json", "node_gpus", 0), ("network.json", "node_gpus", 2.5),
    ("network.json", "algorithms", ["teleport"]), ("network.json", "intra_topology", "torus"),
    ("network.json", "intra.ll_bandwidth_gbps", -1.0), ("network.json", "intra.n_samples", -3),
    ("host_overhead.json", "host_s_per_layer_pass", -0.001), ("host_overhead.json", "host_s_per_layer_pass", 5.0),
    ("host_overhead.json", "host_s_per_layer_pass", float("nan")), ("host_overhead.json", "blend_p", 0.5),
    ("host_overhead.json", "blend_p", KeyError), ("host_overhead.json", "fitted_on_runs", -1),
    ("host_overhead.json", "cv_mape", -0.1), ("host_overhead.json", "source", 7),
    ("host_overhead.json", "host_s_per_layer_pass", "1ms"), ("host_overhead.json", "host_s_per_layer_pass", True),
    ("speed_check.json", "speed_factor", 0), ("speed_check.json", "speed_factor", -1.0),
    ("speed_check.json", "speed_factor", 100.0), ("speed_check.json", "speed_factor", float("nan")),
    ("speed_check.json", "points", 0), ("speed_check.json", "platform", "cpu-2t"),
    ("speed_check.json", "per_op.mlp_up", -2.0), ("speed_check.json", "ratio_p25", 0),
    ("speed_check.json", "measured_at", KeyError), ("speed_check.json", "check_s", -5),
    ("framework_terms.json", "compute_factor", 0), ("framework_terms.json", "compute_factor", float("inf")),
    ("framework_terms.json", "contention", -0.5), ("framework_terms.json", "power_factor", 3.0),
    ("framework_terms.json", "power_form", "square"), ("framework_terms.json", "power_form", 1),
    ("framework_terms.json", "host.megatron.host_s_per_layer_pass", -1.0),
    ("framework_terms.json", "host.megatron.blend_p", 0.1), ("framework_terms.json", "host", [1]),
    ("framework_terms.json", "fitted_on", [1, 2]), ("framework_terms.json", "fitted_on", {"cpu-2t": "many"}),
    ("framework_terms.json", "fitted_on", {"cpu-2t": None}), ("framework_terms.json", "validation", "good"),
    ("framework_terms.json", "validation", {"held_out_mean_signed": float("nan")}),
    ("validation.json", "mape", -0.2), ("validation.json", "mape", float("nan")), ("validation.json", "n_runs", -1),
    ("validation.json", "median_ape", float("inf")), ("validation.json", "mape", "low"),
]


@pytest.mark.parametrize("name,field,value", BAD, ids=[f"{n.split('.')[0]}-{f}-{v!r}" for n, f, v in BAD])
def test_a_bad_value_is_refused_naming_file_and_field(tmp_path, name, field, value):
    got, warn = load(tmp_path, name, set_path(VALID[name], field, value))
    assert got is None, f"{name} {field}={value!r} was accepted"
    assert warn and name in warn, warn
    leaf = field.split(".")[-1]
    assert leaf in warn or field.split(".")[0] in warn, warn


@pytest.mark.parametrize("name", sorted(VALID))
@pytest.mark.parametrize("text", ["", "{", "[]", "null", "42", '"text"', "{\"a\": NaN}", "\xff"])
def test_unreadable_files_are_ignored_with_a_warning(tmp_path, name, text):
    if name == "framework_terms.json" and text == '{"a": NaN}':
        pytest.skip("framework_terms.json: every field is optional and unknown keys are ignored")
    got, warn = load(tmp_path, name, text)
    assert got is None and warn and name in warn


@pytest.mark.parametrize("name", sorted(VALID))
def test_the_valid_files_load(tmp_path, name):
    got, warn = load(tmp_path, name, VALID[name])
    assert got is not None and warn is None, warn


def test_the_shipped_files_load():
    """Every JSON of models_store/ passes its checks (a signed gap may be negative)."""
    assert load_terms_checked(STORE) == (load_terms_checked(STORE)[0], None)
    for pid in sorted(p.name for p in STORE.iterdir() if p.is_dir()):
        assert paths.load_platform_validation_checked(pid, STORE)[1] is None
        assert load_host_overhead_checked(STORE, pid)[1] is None
        assert load_network_file_checked(STORE / pid / "network.json")[1] is None


JSON = st.recursive(st.none() | st.booleans() | st.integers(-10 ** 20, 10 ** 20) | st.floats() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                    max_leaves=12)


def _mutations(name: str):
    """A valid file with one field (at any depth) replaced by random JSON, or random JSON outright."""
    base = VALID[name]
    leaves = []

    def walk(o, where):
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{where}.{k}" if where else k)
        if where:
            leaves.append(where)
    walk(base, "")
    return st.one_of(JSON, st.tuples(st.sampled_from(sorted(leaves)), JSON).map(lambda fv: set_path(base, *fv)))


@pytest.mark.parametrize("name", sorted(VALID))
def test_random_json_never_escapes_a_checked_loader(tmp_path_factory, name):
    tmp = tmp_path_factory.mktemp("j")

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(_mutations(name))
    def check(data):
        got, warn = load(tmp, name, json.dumps(data, allow_nan=True))
        assert (got is None) or (warn is None)
        if warn is not None:
            assert name in warn
        if got is not None:  # accepted: every number in it finite
            _all_finite(got)
    check()


def _all_finite(obj) -> None:
    vals = obj.__dict__ if hasattr(obj, "__dict__") else obj
    if isinstance(vals, dict):
        for v in vals.values():
            _all_finite(v)
    elif isinstance(vals, (list, tuple)):
        for v in vals:
            _all_finite(v)
    elif isinstance(vals, float) and not math.isinf(vals):  # blend_p may be +inf by design (max(G, H))
        assert math.isfinite(vals)

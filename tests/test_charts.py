"""Chart builders and UI helpers, without a browser: the Altair specs and the frames behind them."""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.plan.predict import get_predictor
from predictor_ui import charts, fmt


@pytest.fixture(scope="module")
def bare_models(tmp_path_factory):
    from tests.conftest import make_models_without_terms
    return make_models_without_terms(tmp_path_factory.mktemp("m"))   # no host model at all


@pytest.fixture(scope="module")
def pred(bare_models):
    models = bare_models
    layout = Layout(num_gpus=16, tp=2, pp=4, dp=2, micro_batch=1, global_batch=32, seq_len=2048)
    return get_predictor("perlmutter-a100", str(models)).predict(get_preset("llama2-7b"), layout)


def spec(chart) -> dict:
    d = chart.to_dict()
    json.dumps(d)  # serialisable as Streamlit sends it
    return d


def encodings(d: dict) -> list[dict]:
    if "layer" in d:
        return [l.get("encoding", {}) for l in d["layer"]]
    return [d.get("encoding", {})]


def test_breakdown_chart_sums_to_step_time(pred):
    df = charts.breakdown_frame({"A": pred.breakdown_s, "B": pred.breakdown_s})
    assert set(df["setup"]) == {"A", "B"}
    assert df[df["setup"] == "A"]["seconds"].sum() == pytest.approx(pred.step_time_s, rel=1e-9)
    assert df.groupby("setup")["share"].sum().tolist() == pytest.approx([1.0, 1.0])
    d = spec(charts.breakdown_chart({"A": pred.breakdown_s}))
    enc = d["encoding"]
    assert enc["x"]["aggregate"] == "sum" and enc["x"]["field"] == "seconds"
    assert enc["color"]["field"] == "label"
    # fixed colours per category, and a step height (a fixed total height gets squeezed by Streamlit)
    assert "compute" in enc["color"]["scale"]["domain"]
    assert d["height"] == {"step": 34}


def test_html_bars(pred):
    h = charts.breakdown_html(pred.breakdown_s)
    assert h.count('title="') == sum(1 for v in pred.breakdown_s.values() if v > 0)
    assert "compute" in h and charts.CATEGORY_COLORS["compute"] in h
    widths = [float(w) for w in re.findall(r'title="[^"]*" style="width:([0-9.]+)%', h)]
    assert sum(widths) == pytest.approx(100.0, abs=0.01)
    p = charts.provenance_html({"measured": 0.75, "analytical": 0.25})
    assert "measured <b>75%</b>" in p and charts.PROVENANCE_COLORS["measured"] in p
    assert charts.html_stacked_bar([]).count("<div") == 2


def test_ops_frame_ranks_by_total(pred):
    f = charts.ops_frame(pred.ops, pred.critical_stage, top=5)
    assert f["op"].nunique() == 5
    totals = f.drop_duplicates("op")["total"].tolist()
    assert totals == sorted(totals, reverse=True)
    assert set(f["phase"]) <= {"fwd", "bwd", "recompute", "step"}
    d = spec(charts.ops_chart(pred.ops, pred.critical_stage, top=5))
    assert d["encoding"]["y"]["sort"] == list(dict.fromkeys(f["op"]))


def test_timeline_shows_every_microbatch_and_the_bubbles(pred):
    f, merged = charts.timeline_frame(pred.timeline)
    assert not merged
    work = f[f["micro_batch"] >= 0]
    m = pred.layout.num_micro_batches
    assert len(work) == len(pred.timeline)
    assert set(work["kind"]) == {"forward", "backward"}
    assert work.groupby(["stage", "kind"]).size().eq(m).all()
    idle = f[f["kind"] == "idle (bubble)"]
    assert len(idle) > 0  # a pipeline has warm-up / cool-down bubbles
    end = max(t["end_s"] for t in pred.timeline)
    for _s, g in f.groupby("stage"):  # busy + idle cover each stage from 0 to the end
        assert g["seconds"].sum() == pytest.approx(end, rel=1e-6)
    spec(charts.timeline_chart(pred.timeline))


def test_timeline_merges_when_huge_but_keeps_bubbles(pred):
    f, merged = charts.timeline_frame(pred.timeline, max_items=10)
    assert merged
    assert set(f["kind"]) <= {"busy", "idle (bubble)"}
    end = max(t["end_s"] for t in pred.timeline)
    for _, g in f.groupby("stage"):
        assert g["seconds"].sum() == pytest.approx(end, rel=1e-6)
    d = spec(charts.timeline_chart(pred.timeline, max_items=10))
    assert "layer" not in d  # no per-micro-batch labels when merged


def test_empty_timeline():
    f, merged = charts.timeline_frame([])
    assert f.empty and not merged
    spec(charts.timeline_chart([]))


def test_provenance_chart_orders_and_colours():
    share = {"analytical": 0.25, "measured": 0.7, "transferred": 0.05}
    f = charts.provenance_frame(share)
    assert f["provenance"].tolist() == ["measured", "transferred", "analytical"]
    d = spec(charts.provenance_chart(share))
    sc = d["encoding"]["color"]["scale"]
    assert sc["range"][sc["domain"].index("measured")] == charts.PROVENANCE_COLORS["measured"]


def test_memory_chart_has_capacity_rules():
    frame = pd.DataFrame([{"stage": s, "part": p, "gib": 5.0 + s} for s in range(3)
                          for p in ("weights", "optimizer", "activations")])
    d = spec(charts.memory_chart(frame, 80.0, 76.0))
    assert len(d["layer"]) == 2
    rule_data = [v for k, v in d["datasets"].items() if any("what" in r for r in v)][0]
    assert {r["gib"] for r in rule_data} == {80.0, 76.0}
    spec(charts.memory_chart({"weights": 10.0, "activations": 20.0}, 80.0))


def test_search_scatter_marks_fit():
    df = pd.DataFrame({"rank": [1, 2, 0], "tp": [4, 8, 1], "pp": [4, 2, 1], "dp": [4, 4, 64], "micro_batch": [1, 1, 1],
                       "schedule": ["1f1b", "interleaved", "1f1b"], "vpp": [1, 2, 1], "recompute": ["none"] * 3,
                       "step_time_s": [10.0, 11.0, 9.0], "peak_mem_gib": [60.0, 50.0, 200.0],
                       "fits": [True, True, False], "mfu": [0.4, 0.38, 0.45]})
    d = spec(charts.search_scatter(df, capacity_gib=80.0, selected_rank=1))
    data = list(d["datasets"].values())[0]
    assert {r["fits_label"] for r in data} == {"fits", "does not fit"}
    assert any(r["layout"].startswith("TP8 PP2 DP4 mb1 interleaved×2") for r in data)


def test_samples_chart_with_curve():
    pts = pd.DataFrame({"seq": [512, 1024, 2048, 4096], "duration_s": [1e-3, 2e-3, 4e-3, 8e-3],
                        "tp": [1, 1, 2, 2], "on_slice": [True, True, False, False]})
    curve = pd.DataFrame({"seq": [512, 4096], "predicted_s": [1.1e-3, 7.9e-3]})
    d = spec(charts.samples_chart(pts, "seq", curve=curve, highlight="on_slice"))
    assert len(d["layer"]) == 3  # other samples, samples on the slice, the regressor
    assert d["layer"][0]["encoding"]["x"]["scale"]["type"] == "log"
    on = [v for k, v in d["datasets"].items() if v and all(r.get("sample") == "on the slice" for r in v)]
    assert on and len(on[0]) == 2
    # no curve when the regressor is missing; coloured by a column without a slice
    d2 = spec(charts.samples_chart(pts, "seq", color="tp", curve=pd.DataFrame({"seq": [1], "predicted_s": [np.nan]})))
    assert len(d2["layer"]) == 1 and d2["layer"][0]["encoding"]["color"]["field"] == "tp"


def test_accuracy_scatter_and_hist():
    df = pd.DataFrame({"platform": ["p"] * 3, "measured_s": [1.0, 2.0, 3.0], "predicted_s": [1.1, 1.8, np.nan],
                       "ape": [0.1, 0.1, np.nan], "signed_error": [0.1, -0.1, np.nan]})
    d = spec(charts.accuracy_scatter(df))
    assert len(d["layer"]) == 3
    spec(charts.error_hist(df))
    spec(charts.accuracy_scatter(df.iloc[0:0]))


def test_op_error_chart():
    s = pd.DataFrame({"platform": ["a", "a", "b"], "kind": ["op"] * 3, "model": ["mlp_up", "qkv_proj", "mlp_up"],
                      "pass": ["fwd", "bwd", "fwd"], "n_samples": [10, 20, 30], "cv_mape": [0.05, 0.1, 0.07],
                      "paper_best_error": [0.04, None, None]})
    d = spec(charts.op_error_chart(s))
    assert len(d["layer"]) == 2
    spec(charts.op_error_chart(pd.DataFrame()))


def network_frames(n_small: int = 30):
    """Points and curves as predictor.checks.network_check returns them: a 1x8 and a 4x8 all-reduce sweep."""
    rows, curves = [], []
    for group, nodes, bw in (("allreduce 1x8", 1, 800.0), ("allreduce 4x8", 4, 380.0)):
        n = nodes * 8
        for S in 2.0 ** np.arange(15, 15 + n_small):
            t = 2 * (n - 1) / n * S / (bw * 1e9) + 3e-5
            busbw = 2 * (n - 1) / n * S / t / 1e9
            rows.append({"platform": "p", "group": group, "dataset": f"sweep {nodes} nodes", "collective": "allreduce",
                         "nodes": nodes, "gpus_per_node": 8, "algorithm": None, "message_bytes": S,
                         "duration_s": t * 1.05, "predicted_s": t, "ape": 0.05 / 1.05, "busbw_measured": busbw / 1.05,
                         "busbw_predicted": busbw})
        for S in np.geomspace(2.0**15, 2.0 ** (14 + n_small), 40):
            t = 2 * (n - 1) / n * S / (bw * 1e9) + 3e-5
            curves.append({"platform": "p", "group": group, "message_bytes": S, "predicted_s": t,
                           "busbw_predicted": 2 * (n - 1) / n * S / t / 1e9, "chosen": "ring/simple"})
    return pd.DataFrame(rows), pd.DataFrame(curves)


def test_network_fit_chart():
    pts, curves = network_frames()
    d = spec(charts.network_fit_chart(pts, curves))
    assert len(d["layer"]) == 2  # measured dots, fitted lines
    dots, lines = d["layer"]
    assert dots["mark"]["type"] == "circle" and lines["mark"]["type"] == "line"
    for layer in (dots, lines):
        enc = layer["encoding"]
        assert enc["x"]["field"] == "message_bytes" and enc["x"]["scale"]["type"] == "log"
        assert enc["color"]["field"] == "group"
        assert enc["color"]["scale"]["domain"] == ["allreduce 1x8", "allreduce 4x8"]  # the same colours
    assert "bus bandwidth" in dots["encoding"]["y"]["title"] and dots["encoding"]["y"]["scale"]["type"] == "log"
    data = {len(v): v for v in d["datasets"].values()}
    assert set(data) == {60, 80}   # every measured timing is a dot; 40 curve points per group
    assert max(r["measured"] for r in data[60] if r["group"] == "allreduce 4x8") == pytest.approx(
        pts.loc[pts["group"] == "allreduce 4x8", "busbw_measured"].max())
    # time: both axes log, the measured seconds
    t = spec(charts.network_fit_chart(pts, curves, y="time"))
    assert t["layer"][0]["encoding"]["y"]["scale"]["type"] == "log"
    tdots = next(v for v in t["datasets"].values() if len(v) == 60)
    assert sorted(r["measured"] for r in tdots) == pytest.approx(sorted(pts["duration_s"]))
    # many timings: medians per 1/16 octave of message size, each dot saying how many it stands for
    many = pd.concat([pts] * 50, ignore_index=True)
    f = charts.network_points_frame(many, max_points=1000)
    assert len(f) == 60 and set(f["n"]) == {50}
    assert len(charts.network_points_frame(many, max_points=10_000)) == 3000
    spec(charts.network_fit_chart(pts.iloc[0:0], curves.iloc[0:0]))  # empty: still a chart


def test_shared_datasets_follow_the_predictor(monkeypatch, tmp_path):
    from predictor.hardware.network_fit import SHARED
    from predictor_ui import config
    monkeypatch.delenv(config.ENV_SHARED, raising=False)
    assert config.shared_datasets() == SHARED
    monkeypatch.setenv(config.ENV_SHARED, str(tmp_path / "elsewhere"))
    assert config.shared_datasets() == tmp_path / "elsewhere"
    assert config.shared_version().endswith(":missing")


def test_sweep():
    xs = charts.sweep(1, 1000, 20)
    assert xs[0] == 1 and xs[-1] == 1000 and np.all(np.diff(xs) > 0)
    assert len(charts.sweep(5, 5)) == 1
    assert len(charts.sweep(0, 0)) == 0


def test_fmt():
    assert fmt.seconds(0.0123) == "12.3 ms"
    assert fmt.seconds(16.9) == "16.9 s"
    assert fmt.seconds(5e-5) == "50 µs"
    assert fmt.duration(3 * 86400) == "3 days"
    assert fmt.duration(800 * 86400) == "2.19 years"
    assert fmt.count(1.23e6) == "1.23 M"
    assert fmt.money(2.5e6) == "$2.5 M"
    assert fmt.pct(0.345) == "34%"
    assert fmt.seconds(None) == "–"


def test_training_estimate_matches_arithmetic(pred):
    """What Predict and Compare show as time and money: predictor.plan.costing.training_estimate."""
    from predictor.plan.costing import training_estimate
    L = pred.layout
    c = training_estimate(pred.step_time_s, L.num_gpus, L.tokens_per_step, 1e9, 2.0).scalar()
    steps = int(np.ceil(1e9 / L.tokens_per_step))
    assert c.steps == steps
    assert c.seconds == pytest.approx(steps * pred.step_time_s)
    assert c.gpu_hours == pytest.approx(c.seconds * 16 / 3600)
    assert c.cost == pytest.approx(2.0 * c.gpu_hours)
    assert isinstance(c.seconds, float)  # plain numbers for the metrics
    assert training_estimate(pred.step_time_s, L.num_gpus, L.tokens_per_step, 1e9, None).cost is None


def test_memory_frames_of_the_prediction(pred):
    """The prediction's MemoryReport (the engine's) as the per-stage chart frame and the per-part bar."""
    from predictor.step.memory import GIB, estimate_memory
    plat = get_predictor("perlmutter-a100").platform
    m = pred.memory
    assert m is not None and m.capacity_bytes / GIB == pytest.approx(plat.device.hbm_gib)
    ref = estimate_memory(pred.model, pred.layout, plat)
    assert m.peak_gib == pytest.approx(ref.peak_gib, rel=1e-9) and m.fits == ref.fits
    parts = charts.memory_parts_gib(m.peak)
    assert list(parts) == charts.MEMORY_ORDER
    assert sum(parts.values()) == pytest.approx(m.peak_gib, rel=1e-9)
    frame = charts.memory_stages_frame(m)
    assert set(frame["stage"]) == set(range(pred.layout.pp)) and len(frame) == len(charts.MEMORY_ORDER) * pred.layout.pp
    assert frame.groupby("stage")["gib"].sum().max() == pytest.approx(m.peak_gib, rel=1e-9)
    d = spec(charts.memory_chart(frame, m.capacity_bytes / GIB, m.usable_bytes / GIB))
    assert d["layer"][0]["mark"]["type"] == "bar"


def test_search_view_and_predict_query(bare_models):
    from predictor.model.layout_io import layout_from_fields
    from predictor.plan.search import OBJECTIVES, SearchSpace, search
    from predictor_ui.search_view import OBJECTIVE_LABELS, search_view
    assert set(OBJECTIVE_LABELS) == set(OBJECTIVES)
    pr = get_predictor("perlmutter-a100", str(bare_models))
    model = get_preset("llama2-7b")
    rep = search(model, pr, 16, 32, 2048, space=SearchSpace(schedules=("1f1b",), max_micro_batch=2),
                 tokens_to_train=1e9, price_per_gpu_hour=2.0)
    v = search_view(rep, pr.host_modelled)
    t = v.table
    assert v.enumerated == len(t) and v.feasible == int(t["fits"].sum()) > 0
    feas = t[t["fits"]]
    assert feas["step_time_s"].is_monotonic_increasing
    assert set(feas["schedule"]) == {"1f1b"}
    assert {"peak_mem_gib", "tokens_per_s", "mfu", "reason", "expected_error", "warnings", "cost"} <= set(t.columns)
    assert t["expected_error"].notna().sum() >= 1  # the error band of the best rows
    assert t.loc[rep.top[0].table_index, "warnings"] == " ".join(rep.top[0].prediction.warnings)
    # without end-to-end terms perlmutter-a100 has no host overhead: its column is empty (not modelled), not 0
    assert v.host_modelled is False and t["host_overhead_s"].isna().all()
    assert rep.table["host_overhead_s"].notna().all()  # the report itself is untouched
    assert list(v.rejections.columns) == ["reason", "layouts", "example"]
    with_terms = get_predictor("perlmutter-a100")
    assert with_terms.host_modelled and search_view(rep, True).table["host_overhead_s"].notna().all()
    from predictor_ui.search_view import predict_query
    f = predict_query(feas.iloc[0])
    L = layout_from_fields(f)
    L.validate(model)
    assert L.tp * L.pp * L.cp * L.dp == 16
    assert (L.tp, L.pp, L.micro_batch, L.schedule) == (feas.iloc[0]["tp"], feas.iloc[0]["pp"],
                                                       feas.iloc[0]["micro_batch"], "1f1b")


def test_custom_platform_and_saved_cluster(tmp_path):
    from predictor.hardware.platforms import cluster_entry, load_platforms, save_cluster
    from predictor.model.errors import InfeasibleConfig
    from predictor_ui.clusters import DASHBOARD_SOURCE, custom_platform
    p = custom_platform({"c_name": "mine", "c_device": "a100-sxm4-80gb", "c_gpn": 8, "c_intra_bw": 300,
                         "c_inter_bw": 50, "c_models": "none"})
    assert p.platform_id == "mine" and p.op_models is None and p.gpus_per_node == 8
    auto = custom_platform({"c_name": "a", "c_device": "a100-sxm4-80gb", "c_gpn": 8, "c_intra_bw": 300,
                            "c_inter_bw": 50, "c_models": "auto"})
    assert auto.op_models == auto.device.transfer_source
    with pytest.raises(InfeasibleConfig) as e:
        custom_platform({"c_device": "nope"})
    assert e.value.field == "c_device"
    with pytest.raises(InfeasibleConfig) as e:
        custom_platform({"c_device": "a100-sxm4-80gb", "c_gpn": 8, "c_intra_bw": 300, "c_inter_bw": 0})
    assert e.value.field == "c_inter_bw"
    path = save_cluster(tmp_path / "clusters.json", p, DASHBOARD_SOURCE)
    plats = load_platforms(str(path))
    back = plats["mine"]
    assert back.inter_node == p.inter_node and back.intra_node == p.intra_node and back.op_models is None
    assert back.sources == DASHBOARD_SOURCE and back.user_defined
    assert cluster_entry(back, DASHBOARD_SOURCE) == cluster_entry(p, DASHBOARD_SOURCE)  # round trip
    # a second cluster is added beside the first; a file with a `clusters` section keeps its shape
    save_cluster(path, auto)
    assert {"mine", "a"} <= set(load_platforms(str(path)))
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"clusters": {}, "devices": {}}))
    save_cluster(nested, p)
    assert set(json.loads(nested.read_text())["clusters"]) == {"mine"} and "mine" in load_platforms(str(nested))


def test_regressor_curves_over_samples(tmp_path):
    """The Samples page's curve: a bank trained on a few synthetic samples, drawn along seq."""
    from predictor.regress.lgb_import import import_lightgbm
    import_lightgbm()
    from predictor.regress.regressors import load_bank
    from predictor_ui.curves import regressor_over_samples
    bank = load_bank("perlmutter-a100")
    plat = get_predictor("perlmutter-a100").platform
    assert bank is not None and bank.has_op("mlp_up", "fwd")
    samples = pd.DataFrame([{"tp": 1, "batch": 1, "seq": s, "hidden": 4096, "heads": 32, "kv_heads": 32,
                             "ffn_hidden": 11008, "duration_s": 1e-3} for s in (512, 1024, 2048)])
    xs = np.array([512.0, 1024.0, 2048.0, 4096.0])
    curve, per, note = regressor_over_samples(bank, plat, "mlp_up", "fwd", samples, x="seq", xs=xs, fixed={},
                                              precision="fp16")
    assert note == "" and list(curve["seq"]) == list(xs) and curve["predicted_s"].notna().all()
    assert curve["predicted_s"].is_monotonic_increasing  # more tokens, more time
    assert len(per) == len(samples) and per.iloc[0] == pytest.approx(curve["predicted_s"].iloc[0], rel=1e-6)
    _, _, note = regressor_over_samples(bank, plat, "allreduce", None, samples, x="seq", xs=xs, fixed={},
                                        precision="fp16")
    assert "message_bytes" in note


# --------------------------------------------------------------------------- host overhead
def test_breakdown_table_and_visible_breakdown_host(pred):
    bd = pred.breakdown_s
    assert "host_overhead" in bd  # the library's category, 0 here (perlmutter-a100 has no host fit)
    t = charts.breakdown_table(bd, pred.step_time_s, host_modelled=False)
    host = t[t["category_id"] == "host_overhead"].iloc[0]
    assert np.isnan(host["seconds"]) and np.isnan(host["share"]) and host["note"] == charts.HOST_NOT_MODELLED
    assert host["category"] == charts.CATEGORY_LABELS["host_overhead"]
    assert t["category_id"].tolist() == [c for c in charts.CATEGORY_ORDER if c in bd]
    assert t["seconds"].sum() == pytest.approx(pred.step_time_s, rel=1e-9)  # NaN skipped
    assert "host_overhead" not in charts.visible_breakdown(bd, False)
    assert charts.visible_breakdown(bd, True) == bd
    d = spec(charts.breakdown_chart({"A": charts.visible_breakdown(bd, False)}))
    assert charts.CATEGORY_LABELS["host_overhead"] not in d["encoding"]["color"]["scale"]["domain"]
    # exports: null, not 0
    table = charts.breakdown_table(bd, pred.step_time_s, False)
    assert json.loads(table.to_json(orient="records"))[1]["seconds"] is None
    t2 = charts.breakdown_table({**bd, "host_overhead": 0.25}, pred.step_time_s + 0.25, host_modelled=True)
    assert t2.loc[t2["category_id"] == "host_overhead", "seconds"].iloc[0] == 0.25
    d = pred.to_dict()  # the prediction itself knows: perlmutter-a100 has no host fit
    assert d["breakdown_s"]["host_overhead"] is None and d["host_overhead_modelled"] is False


def test_host_overhead_on_a_fitted_platform():
    from predictor.step.engine import TERMS_HOST_PROVENANCE as HOST_PROVENANCE
    p = get_predictor("dgx-a100-80gb")
    assert p.host_modelled
    layout = Layout(num_gpus=8, tp=2, pp=2, dp=2, micro_batch=1, global_batch=16, seq_len=2048)
    pr = p.predict(get_preset("gpt3-1.3b"), layout)
    assert pr.breakdown_s["host_overhead"] > 0
    assert HOST_PROVENANCE in pr.provenance_share
    assert charts.provenance_color(HOST_PROVENANCE) == charts.PROVENANCE_COLORS[HOST_PROVENANCE]
    assert charts.CATEGORY_LABELS["host_overhead"] in charts.breakdown_html(pr.breakdown_s)
    from predictor.plan.backing import describe_backing
    assert "fitted" in describe_backing(p).host_overhead
    # no fit of its own, but the per-framework end-to-end host terms apply (and are said: #36)
    assert describe_backing(get_predictor("perlmutter-a100")).host_overhead.startswith("from the end-to-end terms")


def test_provenance_colours_by_kind():
    assert charts.provenance_color("transferred from vista-gh200") == charts.PROVENANCE_COLORS["transferred"]
    assert charts.provenance_color("analytical (calibrated)") == charts.PROVENANCE_COLORS["analytical (calibrated)"]
    assert charts.provenance_color("something else") == "#bdbdbd"
    assert charts.provenance_color("derived (flash bwd = fwd x 3.1)") == charts.PROVENANCE_COLORS["derived"]
    share = {"analytical (calibrated)": 0.2, "transferred from vista-gh200 (x)": 0.7, "measured": 0.1}
    assert charts.provenance_frame(share)["provenance"].tolist() == [
        "measured", "transferred from vista-gh200 (x)", "analytical (calibrated)"]
    h = charts.provenance_html(share)
    assert charts.PROVENANCE_COLORS["transferred"] in h


def test_saved_validation_round_trip(tmp_path):
    from predictor.checks.validate import (
        VALIDATION_RUNS_FILE,
        mark_unmodelled_host,
        read_saved_validation,
        save_validation,
        saved_validation_platforms,
    )
    res = pd.DataFrame({"run_id": ["a", "b", "c"], "platform": ["p1"] * 3, "arch": ["gpt"] * 3, "layers": [24] * 3,
                        "measured_s": [1.0, 2.0, 3.0], "predicted_s": [1.1, 1.8, np.nan],
                        "ape": [0.1, 0.1, np.nan], "signed_error": [0.1, -0.1, np.nan],
                        "provenance": ["measured 100%", "measured 100%", ""], "error": ["", "", "tp: bad"],
                        "source": ["s"] * 3, "batch_id": ["x"] * 3,
                        "pred_compute_s": [1.0, 1.7, np.nan], "pred_host_overhead_s": [0.0, 0.0, np.nan]})
    save_validation("p1", res, tmp_path)
    assert (tmp_path / "p1" / VALIDATION_RUNS_FILE).is_file() and (tmp_path / "p1" / "validation.json").is_file()
    assert saved_validation_platforms(tmp_path) == ["p1"]
    sv = read_saved_validation(tmp_path, "p1")
    runs = sv.runs
    assert len(runs) == 3 and "batch_id" not in runs and "source" not in runs  # one source: in the JSON
    assert runs["ape"].mean() == pytest.approx(0.1) and sv.meta["n_runs"] == 2 and sv.warning is None
    assert sv.path == tmp_path / "p1" / VALIDATION_RUNS_FILE
    assert runs.loc[2, "error"] == "tp: bad" and runs.loc[0, "error"] == ""
    # a platform whose runs never got a host term: empty, not 0
    assert mark_unmodelled_host(runs)["pred_host_overhead_s"].isna().all()
    both = pd.concat([runs, runs.assign(platform="p2", pred_host_overhead_s=[0.05, 0.0, np.nan])])
    marked = mark_unmodelled_host(both)
    assert marked[marked["platform"] == "p2"]["pred_host_overhead_s"].tolist()[:2] == [0.05, 0.0]
    assert read_saved_validation(tmp_path, "nope") is None
    # a broken validation.json is ignored with a warning naming it; a broken CSV is an ArtifactError
    (tmp_path / "p1" / "validation.json").write_text("{not json")
    sv = read_saved_validation(tmp_path, "p1")
    assert sv.meta == {} and "validation.json" in sv.warning and len(sv.runs) == 3
    from predictor.paths import ArtifactError
    (tmp_path / "p1" / VALIDATION_RUNS_FILE).write_bytes(b'a,b\n"1,2\n')
    with pytest.raises(ArtifactError):
        read_saved_validation(tmp_path, "p1")


def test_import_lightgbm_skips_sklearn_until_needed():
    """A cold process: lightgbm without its scikit-learn wrappers (the first prediction's import path),
    predictions work, and scikit-learn still imports normally afterwards (training)."""
    import subprocess
    import sys
    from pathlib import Path
    code = ("import sys\n"
            "from predictor.regress.lgb_import import import_lightgbm\n"
            "import_lightgbm()\n"
            "assert 'lightgbm' in sys.modules and 'sklearn' not in sys.modules\n"
            "from predictor.plan.predict import get_predictor\n"
            "from predictor.model.presets import get_preset\n"
            "from predictor.model.specs import Layout\n"
            "L = Layout(num_gpus=8, tp=2, pp=2, dp=2, micro_batch=1, global_batch=16, seq_len=2048)\n"
            "assert get_predictor('perlmutter-a100').predict(get_preset('llama2-7b'), L).step_time_s > 0\n"
            "assert 'sklearn' not in sys.modules\n"
            "from sklearn.model_selection import KFold\n"
            "import_lightgbm()\n")
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr[-2000:]


def test_store_path_follows_the_predictor(monkeypatch, tmp_path):
    from predictor.samples.store import default_store_path
    from predictor_ui import config
    monkeypatch.delenv("PREDICTOR_STORE", raising=False)
    assert config.store_path() == default_store_path()
    monkeypatch.setenv("PREDICTOR_STORE", str(tmp_path / "s.duckdb"))
    assert config.store_path() == default_store_path() == tmp_path / "s.duckdb"


def test_html_table_formats_and_escapes():
    df = pd.DataFrame({"name": ["a<b", "c"], "seconds": [0.0123, np.nan], "share": [0.5, None]})
    h = charts.html_table(df, {"seconds": fmt.seconds, "share": ".0%"})
    assert "a&lt;b" in h and "12.3 ms" in h and "50%" in h
    assert h.count("<tr>") == 3 and h.count("–") == 2  # header + 2 rows; missing values read "–"
    assert 'text-align:right' in h  # numbers right-aligned


def test_breakdown_table_leaves_out_the_cp_row_without_context_parallelism():
    bd = {"compute": 1.0, "tp_comm": 0.2, "cp_comm": 0.0, "pp_comm": 0.1}
    assert "cp_comm" not in set(charts.breakdown_table(bd, 1.3, cp=1)["category_id"])
    assert "cp_comm" in set(charts.breakdown_table({**bd, "cp_comm": 0.05}, 1.35, cp=2)["category_id"])
    assert "cp_comm" in set(charts.breakdown_table(bd, 1.3)["category_id"])  # unknown cp (Compare): all rows


def test_one_large_paper_error_does_not_stretch_the_operator_chart():
    s = pd.DataFrame({"platform": ["vista-gh200"] * 3, "kind": ["op"] * 3, "model": ["linear", "optimizer", "gelu"],
                      "pass": ["fwd", "step", "fwd"], "cv_mape": [0.04, 0.09, 0.02],
                      "paper_best_error": [0.03, 66.9, None], "n_samples": [100, 100, 100]})
    d = charts.op_error_chart(s).to_dict()
    x = d["layer"][0]["encoding"]["x"]
    assert x["scale"]["clamp"] is True and x["scale"]["domain"][1] < 0.2   # the bars' range, not 6,690 %
    assert d["layer"][1]["encoding"]["x"]["scale"] == x["scale"]          # ticks share it (clamped at the end)


def test_the_error_histogram_counts_whole_runs():
    df = pd.DataFrame({"signed_error": [0.01, -0.02, 0.05], "platform": ["a", "a", "a"]})
    y = charts.error_hist(df).to_dict()["encoding"]["y"]
    assert y["axis"]["tickMinStep"] == 1 and y["axis"]["format"] == "d"


# --- zero-bubble schedules: W passes drawn in their own colour ---
@pytest.mark.parametrize("schedule", ["zb-h1", "dualpipe"])
def test_timeline_draws_weight_passes_in_their_own_colour(bare_models, schedule):
    layout = Layout(num_gpus=16, tp=2, pp=4, dp=2, micro_batch=1, global_batch=32, seq_len=2048, schedule=schedule)
    p = get_predictor("perlmutter-a100", str(bare_models)).predict(get_preset("llama2-7b"), layout)
    f, merged = charts.timeline_frame(p.timeline)
    assert not merged
    assert {"forward", "backward", "weight"} <= set(f["kind"])
    d = spec(charts.timeline_chart(p.timeline))
    enc = [e for e in encodings(d) if "color" in e][0]["color"]
    domain, colours = enc["scale"]["domain"], enc["scale"]["range"]
    assert colours[domain.index("weight")] not in (colours[domain.index("forward")], colours[domain.index("backward")])
    end = max(t["end_s"] for t in p.timeline)
    for _, g in f.groupby("stage"):   # busy + idle cover every stage, W passes included
        assert g["seconds"].sum() == pytest.approx(end, rel=1e-6)

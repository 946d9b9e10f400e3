"""Every dashboard page under streamlit.testing.v1.AppTest (no browser): it renders without an
exception, shows what it should, and turns bad input into a warning naming the field and the fix.

Pages that read the sample store run against a tiny store built here (PREDICTOR_STORE) with
regressors trained into a temporary folder (PREDICTOR_MODELS_DIR), and against a missing store.
"""
from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from predictor.hardware.platforms import get_platform
from predictor.regress import features
from predictor_ui import views

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
STEP_RE = re.compile(r"^\d[\d.,]*\s?(µs|ms|s|min|h|days|years)$")
PLATFORM = "perlmutter-a100"


# --------------------------------------------------------------------------- tiny data
def op_samples_frame(op: str = "mlp_up", pass_: str = "fwd", seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [{"platform": PLATFORM, "op": op, "pass": pass_, "tp": tp, "batch": b, "seq": s, "hidden": h,
             "heads": h // 128, "ffn_hidden": 4 * h, "dtype": "fp16"}
            for tp in (1, 2) for b in (1, 2, 4) for s in (512, 1024, 2048) for h in (1024, 2048)]
    df = pd.DataFrame(rows)
    roof = features.roofline_s(op, pass_, df, get_platform(PLATFORM).device, "fp16")
    df["duration_s"] = roof * rng.uniform(1.4, 1.8, len(df))
    df["source"] = "synthetic test samples"
    return df


def collective_frame(seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for nodes, gpn in ((1, 4), (2, 4)):
        for mb in 2 ** np.arange(16, 30, 1):
            ranks = nodes * gpn
            rows.append({"platform": PLATFORM, "collective": "allreduce", "message_bytes": int(mb), "ranks": ranks,
                         "nodes": nodes, "gpus_per_node": gpn, "dtype": "fp16",
                         "duration_s": 2e-5 + 2 * mb / (40e9 if nodes > 1 else 200e9) * rng.uniform(1.0, 1.2)})
    return pd.DataFrame(rows)


def runs_frame() -> pd.DataFrame:
    base = {"platform": PLATFORM, "arch": "gpt", "layers": 24, "hidden": 2048, "heads": 16, "seq_len": 2048,
            "micro_batch": 1, "precision": "fp16"}
    rows = [{**base, "case_id": "r1", "num_gpus": 8, "tp": 2, "pp": 2, "dp": 2, "global_batch": 16, "step_time_s": 1.2},
            {**base, "case_id": "r2", "num_gpus": 4, "tp": 1, "pp": 4, "dp": 1, "global_batch": 8, "step_time_s": 2.0},
            {**base, "case_id": "r3", "num_gpus": 4, "tp": 4, "pp": 1, "dp": 1, "global_batch": 4, "step_time_s": 0.6}]
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A store with a few samples and measured runs, and regressors trained from it."""
    from predictor.calibrate.training import train_platform
    from predictor.samples.store import ingest_path
    d = tmp_path_factory.mktemp("tiny")
    src = d / "src"
    src.mkdir()
    op_samples_frame().to_csv(src / "ops.csv", index=False)
    collective_frame().to_parquet(src / "coll.parquet", index=False)
    runs_frame().to_csv(src / "runs.csv", index=False)
    store = d / "samples.duckdb"
    rep = ingest_path(src, store_path=store)
    assert rep.ok and rep.files_ingested == 3, rep.to_text()
    models = d / "models"
    train_platform(PLATFORM, store_path=str(store), models_dir=str(models), cv_folds=2)
    assert (models / PLATFORM / "mlp_up.fwd.txt").exists()
    return {"store": store, "models": models, "src": src}


@pytest.fixture()
def tiny_env(tiny, monkeypatch):
    monkeypatch.setenv("PREDICTOR_STORE", str(tiny["store"]))
    monkeypatch.setenv("PREDICTOR_MODELS_DIR", str(tiny["models"]))
    monkeypatch.setenv("PREDICTOR_CLUSTERS", str(tiny["store"].parent / "clusters.json"))
    return tiny


@pytest.fixture()
def no_store(tmp_path, monkeypatch):
    monkeypatch.setenv("PREDICTOR_STORE", str(tmp_path / "missing" / "samples.duckdb"))
    monkeypatch.setenv("PREDICTOR_MODELS_DIR", str(tmp_path / "no-models"))
    monkeypatch.setenv("PREDICTOR_CLUSTERS", str(tmp_path / "clusters.json"))
    return tmp_path


# --------------------------------------------------------------------------- helpers
def run(page: str | None = None, query: dict | None = None, timeout: float = 120) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=timeout)
    for k, v in (query or {}).items():
        at.query_params[k] = str(v)
    at.run()
    if page:
        at.switch_page(page)
        for k, v in (query or {}).items():
            at.query_params[k] = str(v)
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metric(at: AppTest, label: str) -> str:
    for m in at.metric:
        if m.label == label:
            return m.value
    raise AssertionError(f"no metric {label!r}: {[m.label for m in at.metric]}")


def text(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption] + [w.value for w in at.warning] + \
        [i.value for i in at.info] + [e.value for e in at.error] + [s.value for s in at.success]
    return "\n".join(map(str, parts))


# --------------------------------------------------------------------------- predict
def test_predict_default_page():
    at = run()
    assert at.title[0].value == "Predict a training step"
    assert STEP_RE.match(metric(at, "Step time"))
    assert "k" in metric(at, "Tokens / s") or metric(at, "Tokens / s").replace(".", "").isdigit()
    assert metric(at, "MFU").endswith("%")
    assert metric(at, "Time to 2T tokens") != "-"
    assert "512 GPUs = TP 8 × PP 4 × CP 1 × DP 16" in text(at)
    mem = metric(at, "Memory / GPU")
    assert mem.endswith("GiB") or mem == "–"
    assert any(m.label == "Data behind it" for m in at.metric)
    # the card's value is one word that fits it (it used to read "transferre..."); the caption has the detail
    data = metric(at, "Data behind it")
    assert data in {w for _, w in views.PROV_WORDS} and len(data) <= 9
    # its small text is short enough for the card at 1366 px ("measured 40%, analytical …" was cut): the share
    delta = next(m for m in at.metric if m.label == "Data behind it").delta
    assert re.fullmatch(r"\d+% of the time", delta), delta


def test_the_memory_tab_shows_allocated_reserved_and_total_side_by_side():
    """The three figures a user compares with torch's counters and nvidia-smi, in that order: allocated <= reserved
    <= total, each the fullest stage's, and the total the headline memory figure."""
    at = run(query={"view": "Memory"})
    vals = [float(metric(at, k).replace(",", "").split()[0]) for k in ("Allocated", "Reserved", "Total")]
    assert 0 < vals[0] <= vals[1] <= vals[2]
    head = float(metric(at, "Memory / GPU").split()[0])
    assert vals[2] == pytest.approx(head, rel=0.01)


def test_data_behind_it_sums_a_family_over_its_labels():
    """A measured platform's GEMMs come as 'measured' and 'measured (derived: ...)' shares: together they are the
    largest family, so the card says Measured, not the single largest label (analytical), as it did on dgx-h100."""
    share = {"measured": 0.14, "measured (derived: the forward GEMM grid at the gradient shapes)": 0.26,
             "analytical (calibrated)": 0.28, "analytical (fused kernel)": 0.09, "derived (flash-attention)": 0.03,
             "framework host overhead (end-to-end terms)": 0.10, "end-to-end terms (power factor)": 0.08}
    assert views.prov_word(share) == "Measured"
    assert views.short_prov(share, families=2) == "measured 40%, analytical 37%"
    assert views.prov_word({"analytical (calibrated)": 0.6, "measured": 0.4}) == "Analytic"
    assert views.prov_word({}) == "-"


def test_predict_a_layout_that_does_not_fit_shows_the_verdict_not_headline_numbers():
    """llama3-70b on 8 GPUs without sharding cannot run: the red verdict first, no full-size step time / time to
    train; the times stay readable in small print, and the tabs still work."""
    q = {"model": "llama3-70b", "num_gpus": 8, "tp": 1, "pp": 1, "global_batch": 8, "seq_len": 2048,
         "sequence_parallel": "false", "zero_stage": 0}
    at = run(query=q)
    assert any(e.value.startswith("**Does not fit:**") and "GiB per GPU" in e.value for e in at.error)
    # one verdict in one number format (it was "1.41e+03 GiB" in red and "1406.4 GiB" in a warning below), with
    # the parts that push it over
    verdict = next(e.value for e in at.error if e.value.startswith("**Does not fit:**"))
    assert "e+" not in verdict and re.search(r"needs \d,\d{3}\.\d GiB per GPU", verdict)
    assert "optimizer" in verdict and "gradients" in verdict
    assert not any("Does not fit in memory" in w.value for w in at.warning)
    labels = [m.label for m in at.metric]
    assert "Step time" not in labels and not any(lbl.startswith("Time to") for lbl in labels)
    assert "If it fitted: step time" in text(at) and "Not a plan" in text(at)
    at = run(query={**q, "view": "Memory"})
    assert not at.exception


def test_predict_takes_the_framework_and_its_overlap_switches():
    """The framework and its overlap switches are dashboard inputs (as --framework / --overlap-* on the CLI): they
    reach the prediction, show in the setup caption, and change the step where they change what overlaps."""
    q = {"model": "llama3-8b", "num_gpus": 64, "tp": 2, "pp": 1, "global_batch": 128, "seq_len": 4096,
         "sequence_parallel": "true", "zero_stage": 1}
    base = run(query=q)
    assert "megatron" in text(base)
    sel = {s.label: s for s in base.selectbox}
    assert "Framework" in sel and sel["Framework"].value == "megatron"
    tog = {t.label: t for t in base.toggle}
    assert "Overlap TP communication" in tog and not tog["Overlap TP communication"].disabled
    over = run(query={**q, "overlap_tp_comm": "true"})
    assert "TP overlap" in text(over)
    assert metric(over, "Step time") != metric(base, "Step time")
    ds = run(query={**q, "framework": "megatron-deepspeed", "overlap_grad_reduce": "off"})
    assert "megatron-deepspeed" in text(ds)
    assert {s.label: s.value for s in ds.selectbox}["Grad reduce overlap"] == "off"
    # no TP overlap without tensor parallelism: the switch is disabled
    one = run(query={**q, "tp": 1})
    assert {t.label: t for t in one.toggle}["Overlap TP communication"].disabled
    # the gradient precision and FP8 primary weights (the latter only with fp8) reach the memory figure
    assert {t.label: t for t in base.toggle}["FP8 primary weights"].disabled
    lean = run(query={**q, "precision": "fp8", "grad_reduce_in_fp32": "off", "fp8_param_gather": "true"})
    fp8 = run(query={**q, "precision": "fp8"})
    assert "FP8 primary weights" in text(lean) and "gradients in bf16" in text(lean)
    assert float(metric(lean, "Memory / GPU").split()[0]) < float(metric(fp8, "Memory / GPU").split()[0])


def test_predict_from_query_params_and_every_tab():
    q = {"model": "llama3-8b", "num_gpus": 16, "tp": 2, "pp": 2, "global_batch": 64, "seq_len": 2048,
         "price": 2.5, "tokens_b": 100}
    for view in ("Where the time goes", "Operators", "Pipeline timeline", "Memory", "Data basis", "Export"):
        at = run(query={**q, "view": view})
        assert "llama3-8b" in text(at) and "16 GPUs = TP 2 × PP 2 × CP 1 × DP 4" in text(at)
        assert metric(at, "Cost").startswith("$")
        assert "Time to 100B tokens" in [m.label for m in at.metric]
    # the last run opened Export: the operator table is there
    assert len(at.dataframe) >= 1


def test_predict_infeasible_inputs_warn_with_field_and_fix():
    at = run()
    at.number_input(key="num_gpus").set_value(500).run()
    assert not at.exception
    w = [x.value for x in at.warning if "num_gpus" in x.value]
    assert w and "How to fix" in w[0]
    assert not [m for m in at.metric if m.label == "Step time"]  # no stale prediction shown
    at = run(query={"num_gpus": 6, "tp": 3, "pp": 1, "global_batch": 2})  # 64 heads on 3 ranks
    assert any("`tp`" in x.value and "How to fix" in x.value for x in at.warning)
    at = run(query={"schedule": "interleaved", "vpp": 3})  # 80 layers / (4 * 3)
    assert any("vpp" in x.value for x in at.warning)


def test_predict_custom_model_and_custom_cluster(tmp_path, monkeypatch):
    clusters = tmp_path / "clusters.json"
    monkeypatch.setenv("PREDICTOR_CLUSTERS", str(clusters))
    at = run()
    at.selectbox(key="model").set_value("custom").run()
    assert not at.exception
    # the custom fields start from the preset the user had
    assert at.number_input(key="layers").value == 80
    at.number_input(key="layers").set_value(40).run()
    assert "custom" in text(at) and STEP_RE.match(metric(at, "Step time"))
    at.selectbox(key="platform").set_value("custom").run()
    assert not at.exception
    at.number_input(key="c_inter_bw").set_value(40.0).run()
    assert STEP_RE.match(metric(at, "Step time"))
    at.selectbox(key="c_models").set_value("none").run()
    assert metric(at, "Data behind it") == "Analytic"
    # saved, the cluster becomes a platform of its own
    at.text_input(key="c_name").set_value("my-a100-cluster").run()
    at.button(key="c_save").click().run()
    assert not at.exception
    assert clusters.exists() and "my-a100-cluster" in clusters.read_text()
    at = run(query={"platform": "my-a100-cluster", "model": "llama2-7b", "num_gpus": 16, "tp": 2, "pp": 2})
    assert "on **my-a100-cluster**" in text(at)


def test_predict_custom_mla_model_from_an_mla_preset():
    """Multi-head latent attention on the dashboard: switching an MLA preset to 'custom' keeps its attention kind
    and ranks (KV heads / head dim are not asked for), and a bad rank is a warning naming the field."""
    at = run(query={"model": "deepseek-v2-lite", "num_gpus": 8, "tp": 1, "pp": 1, "global_batch": 8, "ep": 8})
    at.selectbox(key="model").set_value("custom").run()
    assert not at.exception
    assert at.selectbox(key="attention_kind").value == "mla"
    assert at.number_input(key="kv_lora_rank").value == 512 and at.number_input(key="q_lora_rank").value is None
    assert not [w for w in at.number_input if w.key in ("kv_heads", "head_dim")]
    assert STEP_RE.match(metric(at, "Step time"))
    at.number_input(key="qk_rope_head_dim").set_value(63).run()
    assert any("qk_rope_head_dim" in x.value for x in at.warning)


# a small MoE model on one node with 8-way expert parallelism: the Predict page's MoE settings act on it
MOE_PAGE = {"model": "deepseek-v2-lite", "num_gpus": 8, "tp": 1, "pp": 1, "global_batch": 8, "ep": 8}


def _predicted_with_select(query: dict, key: str):
    """The Predict page run from `query`: predicted, with the select `key` showing the query's value."""
    at = run(query=query)
    assert not at.exception
    assert at.selectbox(key=key).value == query[key]
    assert STEP_RE.match(metric(at, "Step time"))
    return at


def test_predict_takes_the_moe_token_dispatcher():
    """The Token dispatcher select (Layout.moe_dispatcher): allgather from the URL is predicted and kept in the
    select; with the dispatch / combine overlap on it is a warning naming the field and the fix."""
    q = {**MOE_PAGE, "moe_dispatcher": "allgather"}
    _predicted_with_select(q, "moe_dispatcher")
    at = run(query={**q, "moe_overlap": "true"})
    assert not at.exception
    assert any("moe_dispatcher" in w.value and "alltoall" in w.value for w in at.warning)


def test_predict_takes_cuda_graphs():
    """The CUDA graphs select (Layout.cuda_graphs): a value from the URL is predicted and kept in the select, and the
    prediction says what it removed; full_iteration on a dropless MoE model is a warning naming the field."""
    q = {**MOE_PAGE, "cuda_graphs": "attn+moe_router+moe_preprocess"}
    _predicted_with_select(q, "cuda_graphs")
    at = run(query={**q, "cuda_graphs": "full_iteration"})
    assert not at.exception
    said = [w.value.replace("\\", "") for w in at.warning]   # the page escapes markdown
    assert any("cuda_graphs" in w and "capacity_factor" in w for w in said)


def test_a_custom_model_from_maverick_or_gpt_oss_keeps_its_layer_pattern():
    """Switching Llama 4 Maverick / GPT-OSS to 'custom' keeps the MoE interval and the sliding window (never a
    silent every-layer MoE or full attention)."""
    at = run(query={"model": "llama4-maverick", "num_gpus": 64, "tp": 1, "pp": 4, "global_batch": 64, "ep": 16})
    at.selectbox(key="model").set_value("custom").run()
    assert not at.exception
    assert at.number_input(key="moe_layer_interval").value == 2
    at = run(query={"model": "gpt-oss-20b", "num_gpus": 8, "tp": 1, "pp": 1, "global_batch": 8, "ep": 8,
                    "recompute": "full"})
    at.selectbox(key="model").set_value("custom").run()
    assert not at.exception
    assert at.number_input(key="sliding_window").value == 128
    assert at.number_input(key="full_attention_interval").value == 2
    assert STEP_RE.match(metric(at, "Step time"))


def test_predict_uses_trained_models_when_present(tiny_env):
    at = run(query={"model": "gpt3-1.3b", "platform": PLATFORM, "num_gpus": 8, "tp": 2, "pp": 2, "global_batch": 16,
                    "schedule": "1f1b", "sequence_parallel": "false", "view": "Data basis"})
    card = [m for m in at.metric if m.label == "Data behind it"][0]
    # the card's help lists the families with their shares (the card itself: the largest one and its share)
    assert re.search(r"measured \d+%", card.proto.help)  # mlp_up / allreduce come from the tiny store's regressors


def breakdown_rows(at: AppTest) -> dict[str, list[str]]:
    """The Predict page's breakdown table (plain HTML): category -> [seconds, share, note]."""
    html = [h.proto.body for h in at.get("html") if "<table" in h.proto.body][0]
    rows = {}
    for tr in re.findall(r"<tr>(.*?)</tr>", html)[1:]:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", tr)
        rows[cells[0]] = cells[1:]
    return rows


def test_predict_host_overhead_fitted_and_not_modelled(monkeypatch, models_without_terms):
    q = {"model": "gpt3-1.3b", "num_gpus": 8, "tp": 2, "pp": 2, "global_batch": 16, "view": "Where the time goes"}
    # the end-to-end terms give every GPU platform the framework's host overhead: seconds, fitted on measured runs
    for plat in ("dgx-a100-80gb", "dgx-h100"):
        at = run(query={**q, "platform": plat})
        secs, share, note = breakdown_rows(at)["host / framework overhead"]
        assert STEP_RE.match(secs) and share.endswith("%") and "fitted" in note
        assert "compute" in breakdown_rows(at)
    # without them (a models folder with no framework_terms.json): "not modelled", not a measured 0
    monkeypatch.setenv("PREDICTOR_MODELS_DIR", str(models_without_terms))
    at = run(query={**q, "platform": "dgx-h100"})
    assert breakdown_rows(at)["host / framework overhead"] == ["–", "–", "not modelled on this platform"]
    assert "not modelled" in text(at)
    assert any("Kernels are short" in w.value for w in at.warning)
    at = run(query={**q, "platform": "dgx-h100", "view": "Data basis"})
    assert any("**host overhead**: not modelled" in m.value for m in at.markdown)


# --------------------------------------------------------------------------- compare
def test_compare_three_then_four_setups():
    at = run("pages/compare.py")
    assert at.title[0].value == "Compare setups"
    assert len(at.table) == 1
    t = at.table[0].value
    assert list(t.columns[:3]) == ["Setup A", "Setup B", "Setup C"]
    assert "step time" in t.index and "memory / GPU" in t.index
    assert "Fastest: **Setup" in text(at)
    at.button_group(key="n").set_value(4).run()
    assert not at.exception
    assert "Setup D" in at.table[0].value.columns
    # a bad setup warns and the others still compare
    at.number_input(key="b_tp").set_value(3).run()
    assert not at.exception
    assert any("Setup B" in w.value and "How to fix" in w.value for w in at.warning)
    assert "Setup B" not in at.table[0].value.columns


def test_compare_host_overhead_row_and_warnings(monkeypatch, models_without_terms):
    q = {"n": 4}
    for x in "abcd":
        q.update({f"{x}_model": "gpt3-1.3b", f"{x}_num_gpus": 8, f"{x}_tp": 2, f"{x}_pp": 2, f"{x}_global_batch": 16})
    at = run("pages/compare.py", q)  # the end-to-end terms model the host overhead on every GPU platform
    row = at.table[0].value.loc["host / framework overhead"]
    assert all(STEP_RE.match(row[f"Setup {x}"]) for x in "ABCD")
    assert not any("Kernels are short" in w.value for w in at.warning)
    monkeypatch.setenv("PREDICTOR_MODELS_DIR", str(models_without_terms))   # no terms: not modelled anywhere
    at = run("pages/compare.py", q)
    row = at.table[0].value.loc["host / framework overhead"]
    assert row["Setup A"] == "not modelled" and row["Setup D"] == "not modelled"
    assert any("Kernels are short" in w.value and "Setup A" in w.value for w in at.warning)
    assert "not modelled for setup A, B, C" in text(at)


# --------------------------------------------------------------------------- search
def test_search_page_ranks_layouts():
    at = run("pages/search.py", {"sr_model": "llama2-7b", "sr_num_gpus": 16, "sr_global_batch": 32,
                                 "sr_seq_len": 2048})
    if any("not installed in this build" in i.value for i in at.info):
        pytest.skip("predictor.plan.search is not available")
    assert STEP_RE.match(metric(at, "Best step time"))
    assert "layouts enumerated" in text(at)
    df = at.dataframe[0].value
    assert len(df) > 0 and df["fits"].all()
    assert df["step_time_s"].is_monotonic_increasing
    # filters narrow the table
    at.toggle(key="fits_only").set_value(False).run()
    assert not at.exception


def test_search_infeasible_job_explains():
    at = run("pages/search.py", {"sr_model": "llama3-405b", "sr_num_gpus": 4, "sr_global_batch": 4})
    if any("not installed in this build" in i.value for i in at.info):
        pytest.skip("predictor.plan.search is not available")
    assert any("How to fix" in w.value for w in at.warning)


# --------------------------------------------------------------------------- samples
def test_samples_without_store(no_store):
    at = run("pages/samples.py")
    assert any("predictor ingest" in i.value for i in at.info)


def test_samples_with_store_and_regressor(tiny_env):
    at = run("pages/samples.py", {"s_platform": PLATFORM, "s_op": "mlp_up", "s_pass": "fwd"})
    assert metric(at, "Samples") == str(len(op_samples_frame()))
    assert any(m.label == "Regressor error, all samples" for m in at.metric)
    assert not [i for i in at.info if "No trained regressors" in i.value]
    at = run("pages/samples.py", {"s_platform": PLATFORM, "s_op": "allreduce"})
    assert metric(at, "Samples") == str(len(collective_frame()))


# --------------------------------------------------------------------------- accuracy
def test_accuracy_shows_the_memory_check():
    """The published per-GPU memory figures against the memory model: the compared ones first, with the summary."""
    from predictor.checks.published_memory import compare
    at = run("pages/accuracy.py")
    t = text(at)
    assert "Memory: published per-GPU figures against the memory model" in [h.value for h in at.subheader]
    d = compare()
    ok = d[d["ours_gib"].notna()]
    assert f"{len(ok)} published figures" in t and f"worst {ok['error'].abs().max():.1%}" in t
    frame = next(f.value for f in at.dataframe if "measures" in f.value.columns)
    assert frame["ours_gib"].head(len(ok)).notna().all() and frame["ours_gib"].iloc[len(ok):].isna().all()


def test_accuracy_names_the_measured_host_floor_and_the_unaligned_runs():
    """The per-source table's notes: runs with GEMM dimensions not in multiples of 8, and the host floor."""
    from predictor.step.host_floor import load_host_floor
    from predictor.step.terms import load_terms_checked
    at = run("pages/accuracy.py")
    t = text(at)
    floor, _ = load_host_floor()
    terms, _ = load_terms_checked()
    assert floor is not None and terms is not None
    assert f"{floor.host_s_per_layer_pass * 1e3:.2f} ms per layer pass" in t
    flagged = terms.validation["shape_flagged"]
    assert f"{flagged['runs']} runs have GEMM dimensions not in multiples of 8" in t
    top = terms.validation["by_host_share"][-1]
    assert "framework host time" in t and f"over {int(top['runs']):,} runs" in t


def test_accuracy_warns_about_a_broken_host_floor_file(tmp_path, monkeypatch):
    import shutil
    models = tmp_path / "models"
    shutil.copytree(Path(__file__).resolve().parents[1] / "models_store", models)
    (models / "host_floor.json").write_text('{"host_s_per_layer_pass": -1, "applies_to": ["fsdp"]}')
    monkeypatch.setenv("PREDICTOR_MODELS_DIR", str(models))
    at = run("pages/accuracy.py")
    assert any("host_floor.json" in w.value and "host_s_per_layer_pass" in w.value for w in at.warning)
    assert not at.exception


def test_accuracy_without_store(no_store):
    at = run("pages/accuracy.py")
    assert any("predictor ingest" in i.value for i in at.info)
    at = run("pages/accuracy.py", {"acc_view": "Operators"})
    assert any("No trained regressors" in i.value for i in at.info)


def test_accuracy_operators_with_only_network_calibrations(no_store):
    d = no_store / "no-models" / PLATFORM
    d.mkdir(parents=True)
    (d / "network.json").write_text("{}")
    at = run("pages/accuracy.py", {"acc_view": "Operators"})
    assert any("No trained regressors" in i.value for i in at.info)


def test_accuracy_end_to_end_and_operators(tiny_env):
    at = run("pages/accuracy.py")
    assert metric(at, "Runs predicted") == "3"
    assert metric(at, "Mean abs. error (MAPE)").endswith("%")
    assert len(at.dataframe) >= 2  # summary + per run
    at = run("pages/accuracy.py", {"acc_view": "Operators"})
    ops = at.dataframe[0].value
    assert {"mlp_up.fwd", "collective.allreduce"} <= set(ops["model"])
    assert ops["cv_mape"].notna().any()
    # the extrapolation check: the tiny store has no shapes beyond the training limits
    at.button(key="ext_go").click().run()
    assert not at.exception
    assert any("Not enough samples" in i.value for i in at.info)


@pytest.fixture()
def saved_validation_env(tiny, tmp_path, monkeypatch):
    """The tiny store and a copy of its models with a saved end-to-end validation."""
    import shutil

    from predictor.checks.validate import save_validation, validate_runs
    models = tmp_path / "models"
    shutil.copytree(tiny["models"], models)
    res = validate_runs(platform=PLATFORM, store_path=tiny["store"], models_dir=models)
    res.loc[0, "predicted_s"] = res.loc[0, "measured_s"] * 10.5  # so the saved file is told apart
    res.loc[0, "ape"] = 9.5
    save_validation(PLATFORM, res, models)
    monkeypatch.setenv("PREDICTOR_STORE", str(tiny["store"]))
    monkeypatch.setenv("PREDICTOR_MODELS_DIR", str(models))
    monkeypatch.setenv("PREDICTOR_CLUSTERS", str(tmp_path / "clusters.json"))
    return models


def test_accuracy_reads_the_saved_validation_and_recomputes(saved_validation_env):
    at = run("pages/accuracy.py")
    assert metric(at, "Runs predicted") == "3"
    assert "saved end-to-end validation" in text(at)
    runs = at.dataframe[1].value
    assert runs["ape"].max() == pytest.approx(9.5)  # read from the file, not predicted again
    at.button(key="acc_recompute").click().run()
    assert not at.exception
    assert "Predicted now with the current models" in text(at)
    assert at.dataframe[1].value["ape"].max() < 9.5
    # saving makes it the platform's validation
    at.button(key="acc_save").click().run()
    assert not at.exception
    from predictor.checks.validate import read_saved_validation
    assert read_saved_validation(saved_validation_env, PLATFORM).runs["ape"].max() < 9.5


def test_accuracy_end_to_end_per_source_in_sample_vs_held_out():
    """The end-to-end terms' leave-one-source-out validation (models_store/framework_terms.json), one row
    per source, in-sample beside source-held-out."""
    from predictor.step.terms import load_terms_checked
    terms, warning = load_terms_checked()
    assert terms is not None and warning is None
    sources = sorted(terms.validation["per_source"])
    assert len(sources) >= 2
    at = run("pages/accuracy.py")
    assert any(s.value == "End-to-end accuracy per source: in-sample vs source-held-out" for s in at.subheader)
    assert "measured GPU runs of" in text(at) and "scored, not fitted on" in text(at)
    assert "refit without that source" in text(at)
    table = next(d.value for d in at.dataframe if "held_out_mape" in d.value)
    assert sorted(table["source"]) == sources and len(table) == len(sources)  # one row per source
    for c in ("in_sample_mape", "held_out_mape", "in_sample_mean_signed", "held_out_mean_signed", "runs",
              "held_out_mfu_gap_points", "skipped_at_ingest", "skipped_why"):
        assert c in table
    cols = list(table.columns)
    assert cols.index("held_out_mape") == cols.index("in_sample_mape") + 1  # side by side
    row = table.set_index("source").loc[sources[0]]
    rec = terms.validation["per_source"][sources[0]]
    assert row["held_out_mape"] == pytest.approx(rec["held_out_mape"])
    assert row["in_sample_mean_signed"] == pytest.approx(rec["in_sample_mean_signed"])
    assert row["runs"] == rec["runs"]


def test_accuracy_shows_the_independent_check_of_published_runs_never_fitted():
    """The published H100 runs (never fitted): overall and per node count, signed error beside MAPE. The words say
    what dgx-h100's operators rest on now (measured GEMMs and attention), not that nobody sampled the GPU."""
    from predictor.checks.independent import run_check
    from predictor_ui import data
    c = run_check()
    at = run("pages/accuracy.py")
    assert any(s.value == "Independent check: published runs never fitted to" for s in at.subheader)
    assert "never ingested" in text(at) and "dgx-h100" in text(at)
    assert data.backing_kind("dgx-h100") == "measured + transferred"
    assert "measured on this GPU (published kernel tables)" in text(at) and "never sampled" not in text(at)
    table = next(d.value for d in at.dataframe if "published_mfu" in d.value and "group" in d.value)
    assert list(table["group"]) == ["all runs", *c.summary("nodes")["group"]]
    assert table["mean_signed"].iloc[0] == pytest.approx(c.summary()["mean_signed"].iloc[0])
    runs = next(d.value for d in at.dataframe if "signed_error" in d.value and "gpus" in d.value)
    assert len(runs) == len(c.runs)
    # every source of the catalog gets its table (BF16 and FP8 today), the FP8 one says its MFU basis
    from predictor.checks.independent import load_sources
    summaries = [d.value for d in at.dataframe if "published_mfu" in d.value and "group" in d.value]
    assert len(summaries) == len(load_sources()) >= 2
    assert "against the FP8 peak" in text(at)


def test_accuracy_splits_the_independent_error_into_the_a100_error_and_the_speedup():
    """Beside the H100 check: the speed-up over the A100 run of the same configuration, measured vs predicted."""
    from predictor.checks.independent import reference_runs, run_check, speedup_pairs, speedup_summary
    c = run_check()
    pairs = speedup_pairs(c, reference_runs(c))
    if pairs.empty:
        pytest.skip("the store holds no reference runs")
    at = run("pages/accuracy.py")
    t = text(at)
    o = speedup_summary(pairs).iloc[0]
    assert f"Measured speed-up {o['measured_speedup']:.2f}x, predicted {o['predicted_speedup']:.2f}x" in t
    table = next(d.value for d in at.dataframe if "speedup_error" in d.value)
    assert table["runs"].sum() == len(pairs)
    assert table["measured_speedup"].to_numpy() == pytest.approx(
        speedup_summary(pairs, "seq_len")["measured_speedup"].to_numpy())


def test_accuracy_shows_the_nemo_megatron_core_check():
    """NVIDIA's published NeMo / Megatron-Core runs (never fitted): summaries by GPU and MoE / dense, every run."""
    from predictor.checks.independent_nemo import run_check
    c = run_check()
    at = run("pages/accuracy.py")
    assert any(s.value == "Independent check: NVIDIA NeMo / Megatron-Core published runs" for s in at.subheader)
    table = next(d.value for d in at.dataframe if "by" in d.value and "predicted" in d.value)
    overall = table[table["by"] == "all runs"].iloc[0]
    assert overall["mape"] == pytest.approx(c.summary()["mape"].iloc[0])
    assert set(table.loc[table["by"] == "MoE / dense", "group"]) == {"MoE", "dense"}
    runs = next(d.value for d in at.dataframe if "signed_error" in d.value and "ep" in d.value)
    assert len(runs) == len(c.runs)


def test_accuracy_opens_on_the_platform_with_the_most_measured_runs():
    """Not on the alphabetically first platform (cpu-1t, 8 runs) for everyone; the address bar still wins."""
    from predictor.samples import store
    counts = store.read_measured_runs().groupby("platform").size()
    if len(counts) < 2:
        pytest.skip("needs measured runs of two platforms in the store (scripts/setup.sh with ../shared)")
    at = run("pages/accuracy.py")
    assert at.selectbox(key="acc_platform").value == counts.idxmax()
    assert counts.idxmax() != sorted(counts.index)[0]  # the check means something here
    at = run("pages/accuracy.py", {"acc_platform": sorted(counts.index)[0]})
    assert at.selectbox(key="acc_platform").value == sorted(counts.index)[0]


SHARED = ROOT.parent / "shared" / "datasets"


@pytest.mark.skipif(not (SHARED / "ml-engineering").exists(), reason="shared datasets absent")
def test_accuracy_network_fits_against_the_sweeps(monkeypatch):
    """The Network tab: the saved network.json of the platform with the most measured timings against its
    NCCL sweeps (chart and per-dataset table); another platform from the selector; time instead of bus bw."""
    monkeypatch.delenv("PREDICTOR_SHARED_DATASETS", raising=False)
    monkeypatch.delenv("PREDICTOR_MODELS_DIR", raising=False)
    from predictor.checks.network_check import network_check
    chk = network_check(SHARED)
    at = run("pages/accuracy.py", {"acc_view": "Network"})
    assert at.selectbox(key="acc_net_platform").value == chk.platform_ids()[0]
    assert len(at.get("vega_lite_chart")) == 1
    table = at.dataframe[0].value
    assert {"dataset", "collective", "rows", "median_ape", "mape", "mean_signed"} <= set(table.columns)
    assert table["rows"].sum() == metric_int(at, "Measured timings")
    assert "what predictions use" in text(at)
    at.selectbox(key="acc_net_platform").set_value("dgx-b200").run()
    assert not at.exception
    table = at.dataframe[0].value
    assert "ml-eng B200 all_reduce_bench 4 nodes" in set(table["dataset"])
    assert "of the node's aggregate NIC bandwidth (8 × 50 GB/s = 400 GB/s)" in text(at)
    at.segmented_control(key="acc_net_y").set_value("time").run()
    assert not at.exception and len(at.get("vega_lite_chart")) == 1


def test_accuracy_network_without_the_datasets(tmp_path, monkeypatch):
    monkeypatch.setenv("PREDICTOR_SHARED_DATASETS", str(tmp_path / "no-shared"))
    at = run("pages/accuracy.py", {"acc_view": "Network"})
    msg = next(i.value for i in at.info if "NCCL sweeps" in i.value)
    assert str(tmp_path / "no-shared") in msg and "not on this machine" in msg and "ml-engineering" in msg
    assert not at.get("vega_lite_chart") and not at.dataframe
    # the datasets are there but no platform has a saved calibration
    monkeypatch.setenv("PREDICTOR_SHARED_DATASETS", str(tmp_path))
    monkeypatch.setenv("PREDICTOR_MODELS_DIR", str(tmp_path / "no-models"))
    at = run("pages/accuracy.py", {"acc_view": "Network"})
    assert any("holds no sweeps of a platform with a saved calibration" in i.value for i in at.info)


def metric_int(at: AppTest, label: str) -> int:
    return int(metric(at, label).replace(",", ""))


def test_accuracy_upload_your_runs():
    at = run("pages/accuracy.py", {"acc_view": "Your runs"})
    runs = runs_frame()
    runs.loc[2, "tp"] = 3  # one infeasible row: reported, not fatal
    at.file_uploader(key="runs_upload").set_value(("mine.csv", runs.to_csv(index=False).encode(), "text/csv")).run()
    assert not at.exception
    assert metric(at, "Your runs") == "2"
    assert any("could not be predicted" in w.value for w in at.warning)
    bad = pd.DataFrame({"x": [1]}).to_csv(index=False).encode()
    at.file_uploader(key="runs_upload").set_value(("bad.csv", bad, "text/csv")).run()
    assert not at.exception
    assert any("How to fix" in w.value for w in at.warning)


# --------------------------------------------------------------------------- calibrate
def test_calibrate_upload_validate_ingest_retrain(tmp_path, monkeypatch):
    store = tmp_path / "new" / "samples.duckdb"
    models = tmp_path / "models"
    monkeypatch.setenv("PREDICTOR_STORE", str(store))
    monkeypatch.setenv("PREDICTOR_MODELS_DIR", str(models))
    monkeypatch.setenv("PREDICTOR_CLUSTERS", str(tmp_path / "clusters.json"))
    at = run("pages/calibrate.py")
    assert "does not exist yet" in text(at)
    buf = io.BytesIO()
    op_samples_frame("qkv_proj", "fwd").assign(kv_heads=None).to_parquet(buf, index=False)
    bad = b"foo,bar\n1,2\n"
    at.file_uploader(key="cal_files").set_value([("qkv.parquet", buf.getvalue(), "application/octet-stream"),
                                                 ("bad.csv", bad, "text/csv")]).run()
    assert not at.exception
    preview = at.dataframe[0].value
    assert preview.set_index("file")["status"].to_dict() == {"qkv.parquet": "ok", "bad.csv": "skipped"}
    assert any("bad.csv" in w.value for w in at.warning)
    assert any(PLATFORM in s.value for s in at.success)
    at.button(key="cal_ingest").click().run()
    assert not at.exception
    assert store.exists()
    assert "Ingested 1 of" in [c.value for c in at.code][0]
    at.select_slider(key="cal_folds").set_value(0).run()
    at.button(key="cal_train").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert (models / PLATFORM / "qkv_proj.fwd.txt").exists()
    report = at.dataframe[-1].value if "operators" in at.dataframe[-1].value else at.dataframe[1].value
    assert "measured" in report.to_string()
    assert any(p.label == f"Predict on {PLATFORM}" for p in at.get("page_link"))


def test_the_projects_streamlit_config_turns_the_file_watcher_off():
    """`streamlit run app.py` must not watch the tree (.venv, data/): its inotify queue overflowed and flooded
    the log. Read as Streamlit reads it when started in the project folder."""
    import tomllib
    cfg = tomllib.loads((Path(APP).parent / ".streamlit" / "config.toml").read_text())
    assert cfg["server"]["fileWatcherType"] == "none" and cfg["server"]["runOnSave"] is False


def test_predict_context_parallel_input_from_the_url():
    """The CP input sits beside TP / PP / DP, is bound to the URL, and its layout is predicted (cp_comm shown)."""
    q = {"model": "llama3-70b", "platform": "dgx-h100", "num_gpus": 64, "tp": 8, "pp": 4, "cp": 2,
         "global_batch": 32, "seq_len": 8192, "view": "Where the time goes"}
    at = run(query=q)
    assert at.number_input(key="cp").value == 2
    assert "64 GPUs = TP 8 × PP 4 × CP 2 × DP 1" in text(at)
    assert STEP_RE.match(metric(at, "Step time"))
    at = run(query={**q, "seq_len": 2048, "cp": 32, "num_gpus": 1024})   # 2048 / 32 = 64 = 2 x 32: valid
    assert not at.exception
    at = run(query={**q, "seq_len": 1024, "cp": 32, "num_gpus": 1024})   # 1024 / 32 = 32, not a multiple of 64
    assert any("`cp`" in x.value and "How to fix" in x.value for x in at.warning)


def test_layout_fields_survive_the_url_into_predict():
    """A link built from layout fields (the Compare page's 'Setup A in Predict', search's 'open in Predict') keeps
    the tri-state switches: the Predict page's selects read on / off, not true / false."""
    from predictor_ui.inputs import query_value
    fields = {"model": "llama3-8b", "num_gpus": 16, "tp": 2, "global_batch": 64, "sequence_parallel": True,
              "zero_stage": 1, "overlap_grad_reduce": True, "grad_reduce_in_fp32": False, "overlap_tp_comm": True}
    at = run(query={k: query_value(k, v) for k, v in fields.items()})
    sel = {s.label: s.value for s in at.selectbox}
    assert (sel["Grad reduce overlap"], sel["FP32 gradients"]) == ("on", "off")
    assert {t.label: t.value for t in at.toggle}["Overlap TP communication"] is True
    assert "TP overlap" in text(at) and "gradients in bf16" in text(at)


# --------------------------------------------------------------------------- pasted links
def link_notes(at: AppTest) -> list[str]:
    return [w.value for w in at.warning if w.value.startswith("Link parameter")]


@pytest.mark.parametrize("page,query,named", [
    (None, {"tp": "inf"}, "tp=inf"),
    (None, {"num_gpus": "1e309"}, "num_gpus=1e309"),
    (None, {"num_gpus": "7" * 20000}, "num_gpus=7777"),
    (None, {"tp": "-1"}, "tp=-1"),
    (None, {"tp": "nan"}, "tp=nan"),
    (None, {"tp": "2.5"}, "tp=2.5"),
    (None, {"seq_len": "4097"}, "seq_len=4097"),
    (None, {"platform": "nope"}, "platform=nope"),
    (None, {"sequence_parallel": "maybe"}, "sequence_parallel=maybe"),
    (None, {"view": "Nope"}, "view=Nope"),
    ("pages/compare.py", {"a_tp": "inf"}, "a_tp=inf"),
    ("pages/compare.py", {"n": "9"}, "n=9"),
    ("pages/search.py", {"sr_num_gpus": "1e309"}, "sr_num_gpus=1e309"),
    ("pages/search.py", {"max_mb": "inf"}, "max_mb=inf"),
    ("pages/accuracy.py", {"acc_view": "nope"}, "acc_view=nope"),
])
def test_a_pasted_link_with_a_bad_value_is_named_not_a_traceback_nor_a_silent_default(page, query, named):
    """Streamlit's number input raised on an overflowing URL value (int(inf) before its finiteness check), which
    stopped the page with the sidebar half-drawn, and replaced other bad values by the default without a word.
    Each parameter dropped from the link is named at the top of the page, with the value used instead; the
    sidebar is complete and the page still answers."""
    at = run(page, query)
    notes = link_notes(at)
    assert len(notes) == 1 and named in notes[0] and "dropped" in notes[0] and "default" in notes[0], notes
    clean = run(page)
    assert len(at.sidebar.number_input) == len(clean.sidebar.number_input)
    assert len(at.number_input) == len(clean.number_input) and len(at.selectbox) == len(clean.selectbox)
    assert not link_notes(clean)
    if page is None:
        assert metric(at, "Step time") == metric(clean, "Step time")   # the default, said so above


def test_a_good_link_is_taken_whole_and_a_mistyped_parameter_is_named():
    at = run(query={"model": "llama3-8b", "num_gpus": 16, "tp": 2, "pp": 2, "global_batch": 64, "tpp": 4})
    notes = link_notes(at)
    assert len(notes) == 1 and "`tpp`" in notes[0] and "ignored" in notes[0]
    assert "16 GPUs = TP 2 × PP 2 × CP 1 × DP 4" in text(at)


@pytest.mark.parametrize("page,pre", [(None, ""), ("pages/search.py", "sr_")])
def test_a_cluster_name_from_the_link_is_checked_before_it_becomes_a_path(page, pre, monkeypatch):
    """?platform=custom&c_name=<path>: the name is refused naming c_name, and no file under it is looked for."""
    opened: list[str] = []
    real_exists = Path.exists
    monkeypatch.setattr(Path, "exists", lambda p: opened.append(str(p)) or real_exists(p))
    at = run(page, {f"{pre}platform": "custom", f"{pre}c_name": "../../../etc/evil"})
    assert any("`c_name`" in w.value and "not a valid platform / cluster name" in w.value for w in at.warning)
    assert not [p for p in opened if "evil" in p]


def test_the_default_page_answers_the_question_as_the_command_line_does(capsys):
    """Same model, platform, GPUs, TP, PP and global batch: the same step time on the page and from `predict`
    (one set of layout defaults, predictor.model.layout_io.LAYOUT_DEFAULTS)."""
    import json

    from predictor.cli.main import main
    from predictor_ui import fmt
    assert main(["predict", "--platform", "dgx-h100", "--model", "llama3-70b", "--num-gpus", "512", "--tp", "8",
                 "--pp", "4", "--global-batch", "1024", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    at = run()
    assert metric(at, "Step time") == fmt.seconds(d["step_time_s"])
    assert f"seq {d['layout']['seq_len']}" in text(at) and "recompute none" in text(at)


def test_error_text_is_shown_as_written_and_names_the_inputs_not_the_flags():
    """'num_gpus: ... tp*pp = 32' went through Markdown as 'tppp = 32' (the stars became emphasis); a fix naming
    CLI flags ('set --vpp 2 ... or use --schedule 1f1b') names the page's inputs instead."""
    at = run(query={"num_gpus": 500})
    w = [x.value for x in at.warning if "Infeasible input" in x.value]
    assert len(w) == 1 and r"tp\*pp = 32" in w[0], w
    at = run(query={"schedule": "interleaved", "vpp": 1})
    w = [x.value for x in at.warning if "Infeasible input" in x.value]
    assert len(w) == 1 and "**Virtual stages** 2" in w[0] and "**Schedule**" in w[0] and "--" not in w[0], w


def test_search_leaves_tight_layouts_out_by_default_and_says_so_when_shown():
    # the pipeline's send / receive overlap off: its best layout is then a tight one (with the overlap on, the
    # interleaved layouts gain and the best one fits with the typical reserve)
    q = {"sr_model": "llama3-70b", "sr_platform": "dgx-h100", "sr_num_gpus": 512, "sr_global_batch": 1024,
         "sr_seq_len": 4096, "sr_overlap_p2p_comm": "off"}
    at = run("pages/search.py", q)
    if any("not installed in this build" in i.value for i in at.info):
        pytest.skip("predictor.plan.search is not available")
    assert not at.exception
    assert not at.dataframe[0].value["memory_tight"].any()
    assert STEP_RE.match(metric(at, "Best step time"))
    at.toggle(key="no_tight").set_value(False).run()
    assert not at.exception
    assert at.dataframe[0].value["memory_tight"].any()
    assert STEP_RE.match(metric(at, "Best step time (tight)"))
    assert any("best layout here is tight" in w.value for w in at.warning)


def test_accuracy_says_why_without_the_shared_datasets(monkeypatch, tmp_path):
    """Without ../shared/datasets the store holds only CPU runs and the page opened on cpu-2t with no word on why:
    it now says the datasets are missing and how to add them; with them, no such note."""
    from predictor import paths
    if paths.SHARED_DATASETS.exists():
        at = run("pages/accuracy.py")
        assert not any("are not on this machine" in i.value for i in at.info)
    monkeypatch.setattr(paths, "SHARED_DATASETS", tmp_path / "no-datasets")
    at = run("pages/accuracy.py")
    assert not at.exception
    assert any("are not on this machine" in i.value and "scripts/setup.sh" in i.value for i in at.info)


# --- zero-bubble and bidirectional schedules in the picker ---
def test_predict_offers_the_new_schedules_and_refuses_bad_ones_by_field():
    at = run(query={"schedule": "zb-v"})   # llama3-70b, 80 layers on pp 4: 2 chunks per GPU in a V (vpp set to 2)
    assert "zb-v" in at.selectbox(key="schedule").options and "dualpipe-v" in at.selectbox(key="schedule").options
    assert [m for m in at.metric if m.label == "Step time"]
    at = run(query={"schedule": "dualpipe", "pp": 5, "tp": 8, "num_gpus": 640})   # DualPipe needs an even pp
    assert any("`pp`" in x.value and "How to fix" in x.value for x in at.warning)

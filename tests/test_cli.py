import json

import pandas as pd
import pytest

from predictor.cli.main import main
from predictor.model.layout_io import BATCH_COLUMNS
from predictor.step.compose import CATEGORIES
from tests.batch_rows import batch_row


def test_predict_json_is_complete_and_consistent(capsys, models_without_terms):
    rc = main(["predict", "--platform", "perlmutter-a100", "--models-dir", str(models_without_terms),
               "--model", "llemma-7b", "--num-gpus", "16", "--tp", "2", "--pp", "4", "--micro-batch", "4",
               "--global-batch", "64", "--seq-len", "4096", "--recompute", "full",
               "--precision", "fp16", "--json", "--ops"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["layout"]["dp"] == 2 and d["step_time_s"] > 0
    # without end-to-end terms perlmutter-a100 has no host overhead: null (not modelled), never a measured-looking 0
    assert d["host_overhead_modelled"] is False and d["breakdown_s"]["host_overhead"] is None
    assert sum(v for v in d["breakdown_s"].values() if v is not None) == pytest.approx(d["step_time_s"], rel=1e-9)
    assert 0 < d["mfu"] < 1 and d["expected_error"] > 0
    assert sum(d["provenance_share"].values()) == pytest.approx(1.0)
    assert {o["op"] for o in d["ops"]} >= {"qkv_proj", "flash_attn", "mlp_up", "swiglu", "lm_head", "optimizer"}


def test_predict_table_mentions_provenance(capsys):
    assert main(["predict", "--platform", "dgx-a100-80gb", "--model", "llama3-8b", "--num-gpus", "8", "--tp", "8",
                 "--sequence-parallel", "--global-batch", "8"]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "rests on:" in out and "tp_comm" in out
    assert "cp_comm" not in out  # no context parallelism: no CP row


def test_predict_table_prints_each_warning_once_after_the_tables(capsys):
    """An unaligned model (head dimension 100) gets the alignment warning: once, after both tables."""
    assert main(["predict", "--platform", "dgx-a100-80gb", "--arch", "gpt", "--layers", "4", "--hidden", "1000",
                 "--heads", "10", "--num-gpus", "8", "--tp", "2", "--global-batch", "8", "--seq-len", "1024"]) == 0
    out = capsys.readouterr().out
    assert out.count("Tensor cores need GEMM dimensions") == 1
    assert out.index("Top operators") < out.index("Tensor cores need GEMM dimensions")


@pytest.mark.parametrize("args,field", [
    (["--model", "llama2-7b", "--num-gpus", "8", "--tp", "3"], "num_gpus"),
    (["--model", "gpt3-1.3b", "--num-gpus", "32", "--tp", "32"], "tp"),
    (["--arch", "llama", "--layers", "2", "--hidden", "100", "--heads", "3"], "hidden"),
    (["--arch", "gpt", "--hidden", "1024", "--heads", "16"], "layers"),
])
def test_bad_input_names_the_field_without_traceback(capsys, args, field):
    rc = main(["predict", "--platform", "dgx-a100-80gb", *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"error: {field}:") and "Traceback" not in err


def test_unknown_platform_is_a_clear_error(capsys):
    assert main(["predict", "--platform", "tpu-v9", "--model", "llama2-7b"]) == 2
    err = capsys.readouterr().err
    assert "platform" in err and "dgx-a100-80gb" in err


ROW = {"platform": "dgx-a100-80gb", "arch": "llama", "layers": "4", "hidden": "2048", "heads": "16",
       "seq_len": "2048", "num_gpus": "8", "tp": "2", "micro_batch": "1", "global_batch": "16"}


def _row(**kw):
    return batch_row(ROW, **kw)


def test_predict_batch_keeps_going_past_bad_rows(tmp_path, capsys):
    rows = [_row(case_id="ok"), _row(case_id="badtp", tp="3"), _row(case_id="noplat", platform="nowhere"),
            _row(case_id="pp", pp="2", schedule="interleaved", vpp="2", global_batch="16", layers="8"),
            _row(case_id="gpt", arch="gpt", kv_heads="", ffn_hidden="", vocab="")]
    inp = tmp_path / "cases.csv"
    pd.DataFrame(rows, columns=BATCH_COLUMNS).to_csv(inp, index=False)
    out = tmp_path / "out.csv"
    assert main(["predict-batch", "--input", str(inp), "--output", str(out), "--quiet"]) == 0
    res = pd.read_csv(out, keep_default_na=False).set_index("case_id")
    assert list(res.columns[:len(BATCH_COLUMNS) - 1]) == BATCH_COLUMNS[1:]
    for ok in ("ok", "pp", "gpt"):
        assert res.loc[ok, "error"] == "" and float(res.loc[ok, "step_time_s"]) > 0
        parts = sum(float(res.loc[ok, f"{k}_s"]) for k in CATEGORIES)
        assert parts == pytest.approx(float(res.loc[ok, "step_time_s"]), rel=1e-6)
        assert res.loc[ok, "provenance"]
    assert res.loc["badtp", "error"].startswith("num_gpus:")
    assert res.loc["noplat", "error"].startswith("platform:")
    assert res.loc["badtp", "step_time_s"] == ""


def test_predict_batch_rejects_a_file_missing_columns(tmp_path, capsys):
    inp = tmp_path / "cases.csv"
    pd.DataFrame([{"case_id": 1, "platform": "dgx-a100-80gb"}]).to_csv(inp, index=False)
    assert main(["predict-batch", "--input", str(inp), "--output", str(tmp_path / "o.csv")]) == 2
    assert "lacks columns" in capsys.readouterr().err


def test_platforms_lists_what_backs_each(capsys):
    assert main(["platforms", "--json"]) == 0
    rows = {r["platform"]: r for r in json.loads(capsys.readouterr().out)}
    assert {"perlmutter-a100", "vista-gh200", "dgx-a100-80gb"} <= set(rows)
    assert rows["dgx-a100-80gb"]["gpus_per_node"] == 8


def test_validate_reads_measured_runs_from_the_store(tmp_path, capsys):
    runs = [dict(_row(case_id=f"r{i}", tp=str(tp), num_gpus=str(tp)), step_time_s=str(0.5 * i + 0.1))
            for i, tp in enumerate((1, 2, 4), start=1)]
    csv = tmp_path / "runs.csv"
    pd.DataFrame(runs).to_csv(csv, index=False)
    store = str(tmp_path / "s.duckdb")
    assert main(["ingest", "--store", store, "--quiet", str(csv)]) == 0
    capsys.readouterr()
    assert main(["validate", "--store", store, "--quiet", "--json", "--output", str(tmp_path / "v.csv")]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"][0]
    assert summary["runs"] == 3 and summary["mape"] > 0
    per_run = pd.read_csv(tmp_path / "v.csv")
    ape = (per_run["predicted_s"] - per_run["measured_s"]).abs() / per_run["measured_s"]
    assert (per_run["ape"] - ape).abs().max() < 1e-9


def test_train_without_platform_trains_every_platform_in_the_store(monkeypatch, tmp_path):
    """`train` with no --platform takes the store's platform ids (list_platforms returns a list of ids)."""
    import predictor.calibrate.training as training
    import predictor.samples.store as store
    seen = []
    monkeypatch.setattr(store, "list_platforms", lambda **kw: ["p1", "p2"])
    monkeypatch.setattr(training, "train_platform", lambda pid, **kw: seen.append(pid) or pd.DataFrame())
    assert main(["train", "--models-dir", str(tmp_path), "--quiet"]) == 0
    assert seen == ["p1", "p2"]


CLUSTER = """{"my-h100": {"description": "8x H100 per node, 4x400 Gb/s per node", "device": "h100-sxm5-80gb",
 "gpus_per_node": 8, "intra_node": {"kind": "nvswitch", "bandwidth_gbps": 450, "latency_us": 6},
 "inter_node": {"kind": "infiniband", "bandwidth_gbps": RATE, "latency_us": 10}}}"""


def test_predict_predict_batch_and_search_take_a_users_cluster_file(tmp_path, capsys):
    good = tmp_path / "clusters.json"
    good.write_text(CLUSTER.replace("RATE", "25"))
    args = ["--platform", "my-h100", "--model", "llama2-7b", "--num-gpus", "16", "--tp", "2", "--global-batch", "64"]
    assert main(["predict", "--clusters", str(good), *args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["platform"] == "my-h100" and d["step_time_s"] > 0
    # the file's network is the one used: half the inter-node rate, more data-parallel time
    fast = tmp_path / "fast.json"
    fast.write_text(CLUSTER.replace("RATE", "50"))
    assert main(["predict", "--clusters", str(fast), *args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["breakdown_s"]["dp_comm"] < d["breakdown_s"]["dp_comm"]
    rows = pd.DataFrame([batch_row(case_id="a", platform="my-h100", arch="llama", layers=4, hidden=1024, heads=8,
                                   num_gpus=16, tp=2)])
    rows.to_csv(tmp_path / "in.csv", index=False)
    assert main(["predict-batch", "--clusters", str(good), "--input", str(tmp_path / "in.csv"),
                 "--output", str(tmp_path / "out.csv")]) == 0
    out = pd.read_csv(tmp_path / "out.csv", keep_default_na=False)
    assert out.loc[0, "error"] == "" and float(out.loc[0, "step_time_s"]) > 0
    assert main(["search", "--clusters", str(good), "--platform", "my-h100", "--model", "llama2-7b",
                 "--num-gpus", "16", "--global-batch", "64", "--seq-len", "2048", "--top", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layouts"]


def test_a_bad_cluster_file_or_an_unknown_platform_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "clusters.json"
    bad.write_text(CLUSTER.replace("RATE", "-5"))
    args = ["--platform", "my-h100", "--model", "llama2-7b", "--num-gpus", "16"]
    assert main(["predict", "--clusters", str(bad), *args]) == 2
    err = capsys.readouterr().err
    assert "inter_node.bandwidth_gbps" in err and "Traceback" not in err
    assert main(["predict", *args]) == 2
    assert "--clusters FILE" in capsys.readouterr().err


def test_the_dashboards_saved_clusters_are_the_clis_default(tmp_path, monkeypatch, capsys):
    """One user clusters file for the app and the CLI: $PREDICTOR_CLUSTERS (else clusters.local.json by the store)."""
    f = tmp_path / "clusters.local.json"
    f.write_text(CLUSTER.replace("RATE", "25"))
    monkeypatch.setenv("PREDICTOR_CLUSTERS", str(f))
    assert main(["predict", "--platform", "my-h100", "--model", "llama2-7b", "--num-gpus", "16", "--tp", "2",
                 "--global-batch", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["platform"] == "my-h100"
    from predictor_ui import config
    assert config.clusters_file() == f


# ---- the dashboard's question on the command line -------------------------------------------
QUESTION = ["predict", "--platform", "dgx-h100", "--model", "llama3-70b", "--num-gpus", "512", "--tp", "8", "--pp", "4",
            "--global-batch", "1024"]


def test_predict_takes_the_dashboards_defaults_and_names_them(capsys):
    """`predict` with model, platform, GPUs, tp, pp and global batch answers as the dashboard opens (one set of
    defaults, layout_io.LAYOUT_DEFAULTS, used by both; they differed: seq 2048 / no recomputation / no SP / ZeRO-0
    here, seq 4096 / selective / SP / ZeRO-1 there), and says which defaults it took."""
    from predictor.model.layout_io import LAYOUT_DEFAULTS
    from predictor_ui.inputs import DEFAULT_SETUP
    rest = [k for k in LAYOUT_DEFAULTS if k not in ("tp", "pp")]   # tp and pp are part of the question
    assert {k: DEFAULT_SETUP[k] for k in rest} == {k: LAYOUT_DEFAULTS[k] for k in rest}
    q = dict(zip(QUESTION[1::2], QUESTION[2::2]))
    assert {k.lstrip("-").replace("-", "_"): v for k, v in q.items()} == {
        k: str(DEFAULT_SETUP[k]) for k in ("platform", "model", "num_gpus", "tp", "pp", "global_batch")}
    assert main([*QUESTION, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["defaults_used"] == {"seq_len": 2048, "micro_batch": 1, "recompute": "none",
                                  "sequence_parallel": False, "zero_stage": 0, "precision": "bf16"}
    assert d["layout"]["seq_len"] == DEFAULT_SETUP["seq_len"] and d["layout"]["recompute"] == DEFAULT_SETUP["recompute"]
    assert main(QUESTION) == 0
    out = capsys.readouterr().out
    assert "defaults taken" in out and "recompute none" in out and "--recompute" in out
    assert main([*QUESTION, "--seq-len", "4096", "--recompute", "selective", "--sequence-parallel", "--zero-stage",
                 "1", "--micro-batch", "1", "--precision", "bf16"]) == 0
    assert "defaults taken" not in capsys.readouterr().out


def test_predict_tokens_and_price_give_the_training_run(capsys):
    assert main([*QUESTION, "--json", "--tokens", "2T", "--price", "2.5"]) == 0
    d = json.loads(capsys.readouterr().out)
    t, L = d["training"], d["layout"]
    steps = -(-2e12 // (L["global_batch"] * L["seq_len"]))
    assert t["steps"] == steps
    assert t["gpu_hours"] == pytest.approx(steps * d["step_time_s"] * 512 / 3600)
    assert t["days"] == pytest.approx(steps * d["step_time_s"] / 86400)
    assert t["cost"] == pytest.approx(2.5 * t["gpu_hours"])
    assert main([*QUESTION, "--tokens", "2T"]) == 0
    out = capsys.readouterr().out
    assert f"to 2T tokens: {steps:,.0f} steps" in out and "GPU-hours" in out and "cost" not in out.split("to 2T")[1]
    for flag, value, field in (("--tokens", "lots", "tokens"), ("--tokens", "-5", "tokens"),
                               ("--price", "nan", "price_per_gpu_hour"), ("--price", "-1", "price_per_gpu_hour")):
        assert main([*QUESTION, flag, value]) == 2
        assert capsys.readouterr().err.startswith(f"error: {field}:")


def test_predict_batch_days_gpu_hours_and_cost_with_a_token_budget(tmp_path, capsys):
    """--tokens / --price for every row, a `tokens` / `price_per_gpu_hour` cell for one: days, gpu_hours and cost
    columns as `predict --tokens` gives them; a bad cell is that row's error, naming the column."""
    rows = [_row(case_id="flag"), {**_row(case_id="own"), "tokens": "300B", "price_per_gpu_hour": "4"},
            {**_row(case_id="bad"), "tokens": "many", "price_per_gpu_hour": ""}]
    inp = tmp_path / "cases.csv"
    pd.DataFrame(rows).to_csv(inp, index=False)
    out = tmp_path / "out.csv"
    assert main(["predict-batch", "--input", str(inp), "--output", str(out), "--quiet", "--tokens", "1T",
                 "--price", "2"]) == 0
    res = pd.read_csv(out, keep_default_na=False).set_index("case_id")
    assert {"days", "gpu_hours", "cost"} <= set(res.columns)
    for case, tokens, price in (("flag", 1e12, 2.0), ("own", 3e11, 4.0)):
        r = res.loc[case]
        steps = -(-tokens // (16 * 2048))
        assert float(r["gpu_hours"]) == pytest.approx(steps * float(r["step_time_s"]) * 8 / 3600)
        assert float(r["days"]) == pytest.approx(steps * float(r["step_time_s"]) / 86400)
        assert float(r["cost"]) == pytest.approx(price * float(r["gpu_hours"]))
    assert res.loc["bad", "error"].startswith("tokens:")
    # no budget anywhere: no such columns
    pd.DataFrame([_row(case_id="plain")]).to_csv(inp, index=False)
    assert main(["predict-batch", "--input", str(inp), "--output", str(out), "--quiet"]) == 0
    assert "days" not in pd.read_csv(out).columns


def test_predict_warns_when_tp_crosses_nodes_with_the_fix(capsys):
    """perlmutter-a100 has 4 GPUs a node: TP 8 puts every layer's TP exchanges on the network (the search refuses
    it by default); predict says so with the share of the step and the fix, and TP 4 gets no such warning."""
    base = ["predict", "--platform", "perlmutter-a100", "--model", "llama3-8b", "--num-gpus", "32", "--pp", "1",
            "--global-batch", "64", "--json"]
    assert main([*base, "--tp", "8"]) == 0
    d = json.loads(capsys.readouterr().out)
    w = [x for x in d["warnings"] if "crosses nodes" in x]
    assert len(w) == 1 and "has 4 GPUs" in w[0] and "set tp to 4 or less" in w[0]
    share = d["breakdown_s"]["tp_comm"] / d["step_time_s"]
    assert f"({share:.0%} of the step is TP communication)" in w[0]
    assert main([*base, "--tp", "4"]) == 0
    assert not [x for x in json.loads(capsys.readouterr().out)["warnings"] if "crosses nodes" in x]


def test_predict_batch_with_a_model_column_needs_no_model_columns_and_takes_zeros_as_dense(tmp_path, capsys):
    """A file of presets (a `model` column) does not have to carry arch, layers, hidden, ... (the preset fills
    them); in a mixed dense / MoE file a dense row's num_experts 0 / top_k 0 means no experts (it was refused:
    'top_k: must be a positive integer'); a row with neither a preset nor the fields is its own error."""
    cols = ["case_id", "platform", "model", "seq_len", "num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch",
            "vpp", "schedule", "recompute", "sequence_parallel", "zero_stage", "precision", "num_experts", "top_k"]
    base = {"platform": "dgx-a100-80gb", "seq_len": "2048", "num_gpus": "8", "tp": "2", "micro_batch": "1",
            "global_batch": "16"}
    rows = [{**base, "case_id": "dense", "model": "llama3-8b", "num_experts": "0", "top_k": "0"},
            {**base, "case_id": "moe", "model": "mixtral-8x7b", "num_experts": "8", "top_k": "2", "tp": "8",
             "sequence_parallel": "true"},
            {**base, "case_id": "none", "model": ""}]
    inp = tmp_path / "cases.csv"
    pd.DataFrame([{c: r.get(c, "") for c in cols} for r in rows]).to_csv(inp, index=False)
    out = tmp_path / "out.csv"
    assert main(["predict-batch", "--input", str(inp), "--output", str(out), "--quiet", "--allow-oom"]) == 0
    res = pd.read_csv(out, keep_default_na=False).set_index("case_id")
    for ok in ("dense", "moe"):
        assert res.loc[ok, "error"] == "" and float(res.loc[ok, "step_time_s"]) > 0, res.loc[ok, "error"]
    assert res.loc["none", "error"].startswith("model:")
    # a MoE row's top_k 0 is still refused, naming it
    rows[1]["top_k"] = "0"
    pd.DataFrame([{c: r.get(c, "") for c in cols} for r in rows]).to_csv(inp, index=False)
    assert main(["predict-batch", "--input", str(inp), "--output", str(out), "--quiet"]) == 0
    assert pd.read_csv(out, keep_default_na=False).set_index("case_id").loc["moe", "error"].startswith("top_k:")

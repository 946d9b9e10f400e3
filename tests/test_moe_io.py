"""Mixture-of-Experts inputs through every input surface: CLI flags (predict, search, models), predict-batch
columns (read, validated, carried back in the output), and the refusals that name the field and the fix. The
step-time engine's MoE numbers are not asserted here (tests of predictor.model.moe do that): only input handling."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from predictor.cli.main import main
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import BATCH_COLUMNS, MOE_ECHO_COLUMNS, layout_from_fields, model_from_fields
from tests.batch_rows import batch_row

MIX = ["--model", "mixtral-8x7b", "--num-gpus", "64", "--tp", "2", "--pp", "4", "--sequence-parallel",
       "--global-batch", "64"]


def _cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:   # argparse refusing a flag value
        rc = int(e.code or 0)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# ---- fields -> ModelSpec / Layout ------------------------------------------------------------------------
def test_a_preset_with_overriding_moe_fields():
    m = model_from_fields({"model": "mixtral-8x7b", "top_k": "1", "capacity_factor": "1.25", "moe_imbalance": ""})
    assert (m.num_experts, m.top_k, m.capacity_factor, m.moe_imbalance) == (8, 1, 1.25, None)
    q = model_from_fields({"model": "qwen3-30b-a3b", "moe_ffn_hidden": "", "shared_experts": "1"})
    assert (q.num_experts, q.top_k, q.moe_ffn_hidden, q.shared_experts) == (128, 8, 768, 1)   # empty = preset's
    assert q.total_params() > model_from_fields({"model": "qwen3-30b-a3b"}).total_params()


def test_num_experts_0_makes_a_moe_preset_dense_and_a_dense_preset_can_become_moe():
    d = model_from_fields({"model": "mixtral-8x7b", "num_experts": "0"})
    assert not d.is_moe and d.top_k is None and d.total_params() == d.active_params()
    with pytest.raises(InfeasibleConfig) as e:   # a routing field given with it is still a contradiction
        model_from_fields({"model": "mixtral-8x7b", "num_experts": "0", "top_k": "2"})
    assert e.value.field == "top_k"
    m = model_from_fields({"model": "llama3-8b", "num_experts": "8", "top_k": "2", "moe_ffn_hidden": "4096"})
    assert m.is_moe and m.expert_ffn == 4096 and m.active_params() < m.total_params()


def test_a_custom_moe_model_from_its_fields():
    m = model_from_fields({"arch": "llama", "layers": "4", "hidden": "1024", "heads": "8", "num_experts": "16",
                           "top_k": "4", "moe_ffn_hidden": "512", "shared_experts": "1", "shared_ffn_hidden": "1024",
                           "dense_layers": "1", "capacity_factor": "1.0", "moe_imbalance": "1.3"})
    assert (m.num_experts, m.top_k, m.expert_ffn, m.shared_ffn, m.dense_layers, m.moe_layers) == (16, 4, 512, 1024,
                                                                                                   1, 3)
    assert (m.capacity_factor, m.moe_imbalance) == (1.0, 1.3)
    assert layout_from_fields({"num_gpus": "8", "ep": "4"}).ep == 4
    assert layout_from_fields({"num_gpus": "8", "ep": ""}).ep == 1


@pytest.mark.parametrize("fields,field", [
    ({"model": "mixtral-8x7b", "capacity_factor": "nan"}, "capacity_factor"),
    ({"model": "mixtral-8x7b", "moe_imbalance": "inf"}, "moe_imbalance"),
    ({"model": "mixtral-8x7b", "capacity_factor": "lots"}, "capacity_factor"),
    ({"model": "mixtral-8x7b", "top_k": "2.5"}, "top_k"),
    ({"model": "mixtral-8x7b", "num_experts": "-8"}, "num_experts"),
    ({"model": "mixtral-8x7b", "dense_layers": "32"}, "dense_layers"),
    ({"model": "mixtral-8x7b", "num_experts": "1"}, "num_experts"),
    ({"arch": "llama", "layers": "4", "hidden": "1024", "heads": "8", "num_experts": "8"}, "top_k"),
])
def test_bad_moe_fields_are_named(fields, field):
    with pytest.raises(InfeasibleConfig) as e:
        model_from_fields(fields)
    assert e.value.field == field


# ---- CLI ------------------------------------------------------------------------------------------------
def test_cli_predict_takes_the_moe_flags_and_ep(capsys, models_without_terms):
    rc, out, err = _cli(capsys, ["predict", "--platform", "dgx-h100", "--models-dir", str(models_without_terms), *MIX,
                                 "--ep", "4", "--top-k", "1", "--capacity-factor", "1.25", "--moe-imbalance", "1.1",
                                 "--allow-oom", "--json"])
    assert rc == 0, err
    d = json.loads(out)
    assert d["layout"]["ep"] == 4
    assert {k: d["model"][k] for k in ("num_experts", "top_k", "capacity_factor", "moe_imbalance")} == {
        "num_experts": 8, "top_k": 1, "capacity_factor": 1.25, "moe_imbalance": 1.1}
    rc, out, err = _cli(capsys, ["predict", "--platform", "dgx-h100", "--models-dir", str(models_without_terms), *MIX,
                                 "--ep", "4", "--allow-oom"])
    assert rc == 0, err
    head = " ".join(out.split())   # rich wraps long lines
    assert "8 experts, top-2, dropless; 46.7 B parameters, 12.9 B active per token" in head
    assert "tp2 pp4 dp8 ep4" in head


def test_cli_models_lists_total_and_active_parameters(capsys):
    rc, out, _ = _cli(capsys, ["models", "--json"])
    rows = {r["model"]: r for r in json.loads(out)}
    assert rc == 0
    mix = rows["mixtral-8x7b"]
    assert (mix["num_experts"], mix["top_k"], mix["params_b"]) == (8, 2, 46.7)   # Mistral AI: 46.7B total
    assert mix["active_params_b"] == pytest.approx(12.9, abs=0.05)                # and 12.9B active
    assert rows["qwen3-30b-a3b"]["active_params_b"] == pytest.approx(3.3, abs=0.1)
    dense = rows["llama3-8b"]
    assert dense["num_experts"] == 0 and dense["top_k"] is None and dense["active_params_b"] == dense["params_b"]
    assert "deepseek-v3.2" not in rows
    rc, out, _ = _cli(capsys, ["models"])
    header, *lines = out.splitlines()
    assert "experts" in header and "active_b" in header
    line = next(ln.split() for ln in lines if ln.split()[0] == "mixtral-8x7b")
    assert line[-1] == "12.88" and line[-2] == "46.70"


PRED = ["predict", "--platform", "dgx-h100"]
BAD_CLI = [
    ([*MIX, "--ep", "3"], "ep"),                                                   # 3 does not divide 8 experts
    (["--model", "mixtral-8x7b", "--num-gpus", "8", "--tp", "2", "--pp", "2", "--sequence-parallel",
      "--global-batch", "8", "--ep", "8"], "ep"),                                  # tp*cp*dp = 4
    ([*MIX, "--top-k", "9"], "top_k"),                                             # more than 8 experts
    (["--model", "llama3-8b", "--num-experts", "8", "--num-gpus", "8"], "top_k"),  # MoE without top_k
    (["--arch", "llama", "--layers", "4", "--hidden", "1024", "--heads", "8", "--num-experts", "8"], "top_k"),
    (["--model", "llama3-8b", "--top-k", "2", "--num-gpus", "8"], "top_k"),       # MoE fields on a dense model
    (["--model", "llama3-8b", "--capacity-factor", "1.25", "--num-gpus", "8"], "capacity_factor"),
    (["--model", "llama3-8b", "--dense-layers", "2", "--num-gpus", "8"], "dense_layers"),
    (["--model", "llama3-8b", "--ep", "2", "--num-gpus", "8"], "ep"),             # ep on a dense model
    (["--model", "mixtral-8x7b", "--num-gpus", "8", "--tp", "2", "--global-batch", "8"], "sequence_parallel"),
    ([*MIX, "--ep", "0"], "ep"),
    ([*MIX, "--capacity-factor", "nan"], "capacity_factor"),
    ([*MIX, "--moe-imbalance", "0.5"], "moe_imbalance"),
    (["--model", "deepseek-v3.2", "--num-gpus", "8"], "model"),
]


@pytest.mark.parametrize("args,field", BAD_CLI)
def test_cli_bad_moe_input_exits_2_naming_the_field(capsys, args, field):
    rc, out, err = _cli(capsys, [*PRED, *args])
    assert rc == 2 and err.startswith(f"error: {field}:"), err
    assert "Traceback" not in err and out == ""
    if "must be" not in err:   # a malformed value is named; a value that cannot work also says what would
        assert "Fix:" in err


def test_deepseek_v3_2_is_refused_with_the_reason_and_a_fix(capsys):
    rc, _, err = _cli(capsys, [*PRED, "--model", "deepseek-v3.2"])
    assert rc == 2 and "Sparse Attention" in err and "qwen3-235b-a22b" in err


@pytest.mark.parametrize("platform", ["dgx-a100-80gb", "dgx1-v100"])
def test_fp8_on_a_device_without_fp8_names_precision_everywhere(capsys, tmp_path, platform):
    """Never a silent BF16 fallback: predict, search and predict-batch all refuse it by name."""
    small = ["--arch", "llama", "--layers", "4", "--hidden", "1024", "--heads", "16"]
    extra = ["--attention", "unfused"] if platform == "dgx1-v100" else []
    rc, out, err = _cli(capsys, ["predict", "--platform", platform, *small, *extra, "--precision", "fp8"])
    assert rc == 2 and err.startswith("error: precision:") and out == ""
    assert "has no FP8 tensor cores" in err and "bf16" in err.split("Fix:")[1]
    rc, out, err = _cli(capsys, ["search", "--platform", platform, *small, *extra, "--precision", "fp8",
                                 "--num-gpus", "8", "--global-batch", "8", "--seq-len", "2048"])
    assert rc == 2 and err.startswith("error: precision:"), err
    inp, outp = tmp_path / "in.csv", tmp_path / "out.csv"
    row = batch_row({"platform": platform, "arch": "llama", "layers": 4, "hidden": 1024, "heads": 16,
                     "num_gpus": 8, "global_batch": 8, "precision": "fp8"}, case_id="fp8")
    pd.DataFrame([{**row, "attention": "unfused" if extra else ""}]).to_csv(inp, index=False)
    assert main(["predict-batch", "--input", str(inp), "--output", str(outp), "--quiet"]) == 0
    res = pd.read_csv(outp, keep_default_na=False)
    assert res.loc[0, "error"].startswith("precision:") and res.loc[0, "step_time_s"] == ""


@pytest.mark.parametrize("seed", ["0", "1", "2", "3"])
def test_fp8_on_v100_names_fp8_whatever_the_hash_seed(seed):
    """V100 lacks both FP8 and BF16: the message is about the fp8 asked for, in every process (it used to depend on
    the order of a set of precision names, i.e. on PYTHONHASHSEED)."""
    import os
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "predictor", "predict", "--platform", "dgx1-v100", "--arch", "llama",
                        "--layers", "4", "--hidden", "1024", "--heads", "16", "--attention", "unfused",
                        "--precision", "fp8"], check=False, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONHASHSEED": seed})
    assert r.returncode == 2 and r.stderr.startswith("error: precision:") and "FP8 tensor cores" in r.stderr


def test_cli_search_takes_the_model_flags(capsys):
    base = ["search", "--platform", "dgx-h100", "--num-gpus", "8", "--global-batch", "8", "--seq-len", "2048"]
    rc, _, err = _cli(capsys, [*base, "--model", "llama3-8b", "--top-k", "2"])
    assert rc == 2 and err.startswith("error: top_k:")
    rc, _, err = _cli(capsys, [*base, "--model", "mixtral-8x7b", "--top-k", "9"])
    assert rc == 2 and err.startswith("error: top_k:")
    rc, _, err = _cli(capsys, [*base, "--model", "qwen3-8b", "--head-dim", "100"])
    assert rc == 2 and err.startswith("error: head_dim:")
    rc, _, err = _cli(capsys, [*base, "--model", "mixtral-8x7b", "--capacity-factor", "nan"])
    assert rc == 2 and err.startswith("error: capacity_factor:")


# ---- predict-batch --------------------------------------------------------------------------------------
ROW = {"platform": "dgx-h100", "seq_len": "2048", "num_gpus": "64", "tp": "2", "pp": "4", "micro_batch": "1",
       "global_batch": "64", "sequence_parallel": "true"}


def _batch(tmp_path, rows: list[dict], columns: list[str]) -> pd.DataFrame:
    inp, out = tmp_path / "in.csv", tmp_path / "out.csv"
    pd.DataFrame(rows, columns=columns).to_csv(inp, index=False)
    assert main(["predict-batch", "--input", str(inp), "--output", str(out), "--quiet", "--allow-oom"]) == 0
    return pd.read_csv(out, keep_default_na=False, dtype=str).set_index("case_id")


def test_predict_batch_reads_the_moe_columns_and_carries_them_back(tmp_path):
    cols = [*BATCH_COLUMNS, "model", "ep", "top_k", "capacity_factor"]
    dense = {"arch": "llama", "layers": "4", "hidden": "2048", "heads": "16", "sequence_parallel": "true"}
    rows = [batch_row(ROW, case_id="preset", model="mixtral-8x7b", ep="4"),
            batch_row(ROW, case_id="override", model="mixtral-8x7b", ep="8", top_k="1", capacity_factor="1.25"),
            batch_row(ROW, case_id="defaults", model="mixtral-8x7b"),
            batch_row({**ROW, **dense}, case_id="dense"),
            batch_row(ROW, case_id="badep", model="mixtral-8x7b", ep="3"),
            batch_row(ROW, case_id="epranks", model="mixtral-8x7b", ep="8", dp="2", num_gpus="16"),
            batch_row(ROW, case_id="topk", model="mixtral-8x7b", top_k="9"),
            batch_row({**ROW, **dense}, case_id="densetopk", top_k="2"),
            batch_row({**ROW, **dense}, case_id="denseep", ep="2"),
            batch_row(ROW, case_id="dsv32", model="deepseek-v3.2"),
            batch_row(ROW, case_id="cf", model="mixtral-8x7b", capacity_factor="inf")]
    res = _batch(tmp_path, rows, cols)
    # every MoE column is in the output (the absent ones appended), filled with what was predicted
    assert all(c in res.columns for c in MOE_ECHO_COLUMNS)
    for case in ("preset", "override", "defaults", "dense"):
        assert res.loc[case, "error"] == "" and float(res.loc[case, "step_time_s"]) > 0, res.loc[case, "error"]
    p = res.loc["preset"]
    assert (p["num_experts"], p["top_k"], p["ep"], p["moe_ffn_hidden"], p["capacity_factor"]) == ("8", "2", "4", "",
                                                                                                  "")
    o = res.loc["override"]
    assert (o["top_k"], o["ep"], o["capacity_factor"]) == ("1", "8", "1.25")
    assert (res.loc["defaults", "ep"], res.loc["defaults", "top_k"]) == ("1", "2")   # empty cells: the values used
    assert (res.loc["dense", "num_experts"], res.loc["dense", "ep"], res.loc["dense", "top_k"]) == ("0", "1", "")
    for case, field in (("badep", "ep"), ("epranks", "ep"), ("topk", "top_k"), ("densetopk", "top_k"),
                        ("denseep", "ep"), ("dsv32", "model"), ("cf", "capacity_factor")):
        assert res.loc[case, "error"].startswith(f"{field}:"), (case, res.loc[case, "error"])
        assert "Fix:" in res.loc[case, "error"] or field == "capacity_factor"
        assert res.loc[case, "step_time_s"] == ""
    # a refused row keeps what the user wrote (nothing filled in for a row that was not predicted)
    assert res.loc["badep", "num_experts"] == "" and res.loc["badep", "ep"] == "3"


def test_a_dense_file_without_model_or_moe_columns_keeps_its_output_columns(tmp_path):
    res = _batch(tmp_path, [batch_row({"platform": "dgx-h100", "arch": "llama", "layers": "4", "hidden": "2048",
                                       "heads": "16", "num_gpus": "8", "global_batch": "8"}, case_id="d")],
                 list(BATCH_COLUMNS))
    assert not any(c in res.columns for c in MOE_ECHO_COLUMNS) and res.loc["d", "error"] == ""


@pytest.mark.parametrize("bad", ["num_expert", "topk", "expert_parallel", "moe_ffn"])
def test_a_misspelt_moe_column_is_refused_by_name(tmp_path, capsys, bad):
    inp = tmp_path / "in.csv"
    row = batch_row(ROW, case_id="x", model="mixtral-8x7b")
    pd.DataFrame([{**row, bad: "8"}], columns=[*BATCH_COLUMNS, "model", bad]).to_csv(inp, index=False)
    rc, _, err = _cli(capsys, ["predict-batch", "--input", str(inp), "--output", str(tmp_path / "o.csv")])
    assert rc == 2 and err.startswith("error: input:") and repr(bad) in err and "num_experts" in err
    assert not (tmp_path / "o.csv").exists()


def test_predict_rows_dataframe_api_carries_the_moe_columns():
    from predictor.plan.batch import predict_rows
    df = pd.DataFrame([batch_row(ROW, case_id="m", model="mixtral-8x7b", ep="2")])
    out = predict_rows(df, allow_oom=True)
    assert list(out.columns[:len(df.columns)]) == list(df.columns)
    assert out.loc[0, "num_experts"] == 8 and out.loc[0, "ep"] == "2" and out.loc[0, "error"] == ""


# ---- dashboard ------------------------------------------------------------------------------------------
def _keys(at) -> set[str]:
    return {w.key for w in [*at.number_input, *at.selectbox, *at.toggle]}


def test_dashboard_a_moe_preset_shows_its_experts_and_active_parameters():
    from tests.test_app import run, text
    at = run()
    assert "num_experts" not in _keys(at)                        # a dense preset: no Experts section
    assert at.selectbox(key="ep").disabled and at.selectbox(key="ep").options == ["1"]
    at.selectbox(key="model").set_value("mixtral-8x7b").run()
    assert not at.exception
    vals = {k: at.number_input(key=k).value for k in ("num_experts", "top_k", "moe_ffn_hidden", "shared_experts",
                                                       "shared_ffn_hidden", "dense_layers", "capacity_factor",
                                                       "moe_imbalance")}
    assert vals == {"num_experts": 8, "top_k": 2, "moe_ffn_hidden": None, "shared_experts": 0,
                    "shared_ffn_hidden": None, "dense_layers": 0, "capacity_factor": None, "moe_imbalance": None}
    assert "46.7 B parameters, 12.9 B active · 8 experts, top-2" in text(at)
    ep = at.selectbox(key="ep")   # the default layout: tp 8 x cp 1 x dp 16 = 128 ranks per stage
    assert not ep.disabled and ep.options == ["1", "2", "4", "8"]
    # another MoE preset brings its own experts (keyed widgets would keep mixtral's otherwise)
    at.selectbox(key="model").set_value("qwen3-30b-a3b").run()
    assert (at.number_input(key="num_experts").value, at.number_input(key="top_k").value,
            at.number_input(key="moe_ffn_hidden").value) == (128, 8, 768)
    assert "3.35 B active" in text(at)
    # an override shows in the caption and reaches the model
    at.number_input(key="top_k").set_value(2).run()
    assert not at.exception and "top-2" in text(at)


@pytest.mark.parametrize("query,words", [
    ({"num_gpus": 8, "tp": 2, "pp": 4, "ep": 4}, "does not divide the tp x cp x dp = 2 x 1 x 1 = 2 ranks"),
    ({"ep": 3}, "ep 3 does not divide num_experts 8"),
])
def test_dashboard_an_invalid_ep_warns_naming_ep_not_a_traceback(query, words):
    from tests.test_app import run
    at = run(query={"model": "mixtral-8x7b", "global_batch": 64, **query})
    assert at.selectbox(key="ep").value == query["ep"]   # kept as given, never silently replaced
    w = [x.value for x in at.warning if "`ep`" in x.value]
    assert w and words in w[0].replace("\\", "") and "How to fix" in w[0]   # Markdown-escaped as shown
    assert not [m for m in at.metric if m.label == "Step time"]


def test_dashboard_ep_on_a_dense_model_warns_and_can_be_undone():
    from tests.test_app import run
    at = run(query={"model": "llama3-8b", "num_gpus": 16, "tp": 2, "pp": 1, "global_batch": 16, "ep": 2})
    assert any("`ep`" in w.value and "dense" in w.value for w in at.warning)
    ep = at.selectbox(key="ep")
    assert not ep.disabled and ep.options == ["1", "2"]
    ep.set_value("1").run()
    assert not at.exception and not any("`ep`" in w.value for w in at.warning)
    assert at.selectbox(key="ep").disabled


def test_dashboard_custom_model_turns_moe_on():
    from tests.test_app import run, text
    at = run(query={"model": "custom"})
    assert not at.toggle(key="moe").value and "num_experts" not in _keys(at)
    at.toggle(key="moe").set_value(True).run()
    assert not at.exception
    assert (at.number_input(key="num_experts").value, at.number_input(key="top_k").value) == (8, 2)
    assert "B active · 8 experts, top-2" in text(at)
    at.number_input(key="top_k").set_value(9).run()
    assert any("`top_k`" in w.value and "How to fix" in w.value for w in at.warning)
    # switching to custom from a MoE preset keeps its experts
    at = run(query={"model": "mixtral-8x7b"})
    at.selectbox(key="model").set_value("custom").run()
    assert at.toggle(key="moe").value and at.number_input(key="num_experts").value == 8


def test_dashboard_fp8_on_an_a100_names_precision():
    from tests.test_app import run
    at = run(query={"model": "llama3-8b", "platform": "dgx-a100-80gb", "num_gpus": 8, "tp": 8, "pp": 1,
                    "global_batch": 8, "precision": "fp8"})
    # the picker offers only what the device runs (an A100 has no FP8 tensor cores): the link's fp8 is named as
    # dropped, with the value used instead, never taken silently
    assert any("`precision=fp8`" in w.value and "dropped" in w.value and "bf16" in w.value for w in at.warning)


def test_dashboard_compare_shows_cp_and_ep_per_setup():
    from tests.test_app import run
    q = {"n": 2, "a_model": "mixtral-8x7b", "a_ep": 4, "a_sequence_parallel": "true", "b_model": "llama3-8b",
         "b_tp": 8, "b_pp": 4}
    at = run("pages/compare.py", q)
    t = at.table[0].value
    assert t.loc["EP (expert parallel)", "Setup A"] == "4" and t.loc["EP (expert parallel)", "Setup B"] == "1"
    assert t.loc["TP × PP × CP × DP", "Setup A"] == "8 × 4 × 1 × 16"


def test_a_search_row_opens_in_predict_with_its_ep():
    from predictor.model.specs import Layout
    from predictor_ui.search_view import predict_query
    L = Layout(num_gpus=64, tp=2, pp=4, dp=8, global_batch=64, sequence_parallel=True, ep=4)
    q = predict_query({**{f: getattr(L, f) for f in ("num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch",
                                                      "seq_len", "vpp", "schedule", "recompute", "sequence_parallel",
                                                      "zero_stage", "precision", "cp")}, "stage_layers": "",
                       "ep": 4})
    assert q["ep"] == "4"
    assert layout_from_fields(q).ep == int(q["ep"])


def test_dashboard_search_takes_a_moe_model_and_ranks_ep():
    from tests.test_app import run, text
    at = run("pages/search.py", {"sr_model": "mixtral-8x7b", "sr_num_gpus": 64, "sr_global_batch": 256,
                                 "sr_top_k": 1})
    assert at.number_input(key="sr_top_k").value == 1 and "top-1" in text(at)
    assert not at.exception
    at = run("pages/search.py", {"sr_model": "mixtral-8x7b", "sr_num_gpus": 64, "sr_global_batch": 256,
                                 "sr_top_k": 9})
    assert any("`top_k`" in w.value and "How to fix" in w.value for w in at.warning)


def test_a_search_row_opens_in_predict_with_its_framework_and_overlaps():
    from predictor.model.specs import Layout
    from predictor_ui.search_view import predict_query
    L = Layout(num_gpus=16, tp=2, dp=8, global_batch=16, sequence_parallel=True, zero_stage=1,
               framework="megatron-deepspeed", overlap_grad_reduce=True, overlap_tp_comm=True)
    row = {f: getattr(L, f) for f in ("num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch", "seq_len", "vpp",
                                      "schedule", "recompute", "sequence_parallel", "zero_stage", "precision", "cp",
                                      "ep", "framework", "overlap_grad_reduce", "overlap_param_gather",
                                      "overlap_tp_comm")}
    q = predict_query({**row, "stage_layers": ""})
    assert q["framework"] == "megatron-deepspeed" and q["overlap_grad_reduce"] == "on"
    assert "overlap_param_gather" not in q   # the framework's default: the widget's own default
    back = layout_from_fields(q)
    assert (back.framework, back.overlap_grad_reduce, back.overlap_param_gather, back.overlap_tp_comm) == \
        ("megatron-deepspeed", True, None, True)

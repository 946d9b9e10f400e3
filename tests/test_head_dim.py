"""head_dim decoupled from hidden / heads (Qwen3): None keeps every prediction bit-identical, an explicit
head_dim moves the QKV / output-projection widths, attention, parameters, FLOPs and memory."""
from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from predictor.cli.main import main
from predictor.hardware.platforms import get_platform
from predictor.model import params
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import model_from_fields
from predictor.model.ops import OP_SHAPE_COLUMNS
from predictor.model.presets import get_preset
from predictor.model.specs import Layout, ModelSpec
from predictor.plan.predict import get_predictor, model_flops_per_step
from predictor.regress import features
from predictor.step.decompose import decompose
from predictor.step.memory import activation_terms

LAYOUTS = [Layout(num_gpus=16, tp=2, pp=4, dp=2, micro_batch=1, global_batch=32, seq_len=2048),
           Layout(num_gpus=8, tp=8, pp=1, dp=1, micro_batch=2, global_batch=8, seq_len=4096,
                  sequence_parallel=True, recompute="selective")]


def _explicit(m: ModelSpec) -> ModelSpec:
    return replace(m, head_dim=m.hidden_size // m.num_heads)


@pytest.mark.parametrize("name", ["llama2-7b", "llama3-70b", "gpt3-13b", "mistral-7b"])
def test_head_dim_none_equals_explicit_hidden_over_heads(name, models_without_terms):
    m = get_preset(name)
    e = _explicit(m)
    assert m.head_dim is None and e.head_dim == m.hidden_size // m.num_heads
    assert params.total_params(m) == params.total_params(e)
    pr = get_predictor("perlmutter-a100", str(models_without_terms))
    for lay in LAYOUTS:
        assert model_flops_per_step(m, lay) == model_flops_per_step(e, lay)
        assert activation_terms(m, lay.seq_len, lay.micro_batch, lay.tp) == activation_terms(
            e, lay.seq_len, lay.micro_batch, lay.tp)
        plat = get_platform("perlmutter-a100")
        assert [p.ops for p in decompose(m, lay, plat)] == [p.ops for p in decompose(e, lay, plat)]
        a, b = pr.predict(m, lay, timeline=False), pr.predict(e, lay, timeline=False)
        assert a.step_time_s == b.step_time_s   # bit-identical, not approximately
        assert a.to_dict()["breakdown_s"] == b.to_dict()["breakdown_s"]


def test_qwen3_32b_parameter_count_matches_the_published_size():
    # Qwen/Qwen3-32B model card: 32.8B parameters (see the source notes in predictor/model/presets.py)
    m = get_preset("qwen3-32b")
    assert m.head_dim == 128 and m.attn_width == 8192 != m.hidden_size
    assert abs(m.total_params() / 32.8e9 - 1) < 0.01
    # with head_dim = hidden / heads (80) the count would be off by far more than 1 %
    assert abs(replace(m, head_dim=None).total_params() / 32.8e9 - 1) > 0.05


def test_projection_widths_and_flops_follow_heads_times_head_dim():
    m = get_preset("qwen3-32b")
    h = m.hidden_size
    assert params.qkv_width(m) == (64 + 2 * 8) * 128
    assert params.layer_matmul_params(m) == h * (64 + 16) * 128 + 64 * 128 * h + 3 * h * m.ffn
    lay = Layout(num_gpus=8, tp=8, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=2048)
    ops = {(o.op, o.pass_): o for o in decompose(m, lay, get_platform("perlmutter-a100"))[0].ops}
    for op, n_width, k_width in (("qkv_proj", (64 + 16) * 128 / 8, h), ("attn_out_proj", h, 64 * 128 / 8)):
        shp = ops[(op, "fwd")].shape
        arrays = features.arrays_from_shapes([shp])
        d = features._dims(arrays)
        M, N, K, _ = features.gemm_mnk(op, d)
        assert (N[0], K[0]) == (n_width, k_width)
        flops, _ = features.op_work(op, pd.DataFrame([shp], columns=list(OP_SHAPE_COLUMNS)), "bf16")
        assert float(flops[0]) == pytest.approx(2 * M[0] * N[0] * K[0])
    # flash attention sees head_dim 128, not 5120 / 64 = 80
    fa = features._dims(features.arrays_from_shapes([ops[("flash_attn", "fwd")].shape]))
    assert fa["hd"][0] == 128
    # model FLOPs: attention scores / context over heads * head_dim, not hidden
    s = lay.seq_len
    diff = model_flops_per_step(m, lay) - model_flops_per_step(replace(m, head_dim=None), lay)
    per_tok = 2 * m.num_layers * (params.layer_matmul_params(m) - params.layer_matmul_params(replace(m, head_dim=None)))
    per_tok += 2 * 2 * m.num_layers * s * (8192 - h)
    assert diff == pytest.approx(3 * per_tok * lay.tokens_per_step)


@pytest.mark.parametrize("bad, words", [(0, "positive"), (-128, "positive"), (100, "multiple of 8"),
                                        (4096, "4 x hidden")])
def test_bad_head_dim_is_named(bad, words):
    with pytest.raises(InfeasibleConfig) as ei:
        replace(get_preset("llama3-8b"), head_dim=bad).validate()
    assert ei.value.field == "head_dim" and words in str(ei.value) and ei.value.fix


def test_head_dim_need_not_divide_hidden_but_tp_still_divides_heads():
    m = ModelSpec("x", "llama", 4, 5120, 64, 8, 25600, 151936, head_dim=128)
    m.validate()
    with pytest.raises(InfeasibleConfig) as ei:
        Layout(num_gpus=3, tp=3, global_batch=1).validate(m)
    assert ei.value.field == "tp"


def test_fields_and_cli_take_head_dim(capsys, models_without_terms):
    m = model_from_fields({"arch": "llama", "layers": 4, "hidden": 5120, "heads": 64, "kv_heads": 8,
                           "head_dim": "128"})
    assert m.head_dim == 128
    assert model_from_fields({"arch": "llama", "layers": 4, "hidden": 4096, "heads": 32, "head_dim": ""}).head_dim \
        is None
    assert model_from_fields({"model": "llama3-8b", "head_dim": 256}).head_dim == 256
    with pytest.raises(InfeasibleConfig) as ei:
        model_from_fields({"arch": "llama", "layers": 4, "hidden": 4096, "heads": 32, "head_dim": "12.5"})
    assert ei.value.field == "head_dim"
    base = ["predict", "--platform", "perlmutter-a100", "--models-dir", str(models_without_terms), "--model",
            "llama3-8b", "--num-gpus", "8", "--tp", "8", "--global-batch", "8", "--json"]
    assert main(base) == 0
    t0 = json.loads(capsys.readouterr().out)["step_time_s"]
    assert main([*base, "--head-dim", "256"]) == 0
    t1 = json.loads(capsys.readouterr().out)["step_time_s"]
    assert t1 > t0   # twice the attention width: more work
    assert main([*base, "--head-dim", "100"]) != 0
    assert "head_dim" in capsys.readouterr().err + capsys.readouterr().out


def test_predict_batch_takes_an_optional_head_dim_column(tmp_path):
    from predictor.model.layout_io import BATCH_COLUMNS
    row = {"case_id": "q", "platform": "perlmutter-a100", "arch": "llama", "layers": "8", "hidden": "5120",
           "heads": "64", "kv_heads": "8", "ffn_hidden": "25600", "vocab": "151936", "seq_len": "2048",
           "num_gpus": "8", "tp": "8", "pp": "1", "dp": "1", "micro_batch": "1", "global_batch": "1", "vpp": "1",
           "schedule": "1f1b", "recompute": "none", "sequence_parallel": "false", "zero_stage": "0",
           "precision": "bf16"}
    rows = [{**row, "case_id": "hd128", "head_dim": "128"}, {**row, "case_id": "none", "head_dim": ""},
            {**row, "case_id": "bad", "head_dim": "7"}]
    inp = tmp_path / "cases.csv"
    pd.DataFrame(rows, columns=[*BATCH_COLUMNS, "head_dim"]).to_csv(inp, index=False)
    out = tmp_path / "out.csv"
    assert main(["predict-batch", "--input", str(inp), "--output", str(out), "--quiet"]) == 0
    res = pd.read_csv(out, keep_default_na=False).set_index("case_id")
    assert res.loc["hd128", "error"] == "" and res.loc["none", "error"] == ""
    assert float(res.loc["hd128", "step_time_s"]) > float(res.loc["none", "step_time_s"])
    assert res.loc["bad", "error"].startswith("head_dim:")


def test_dashboard_custom_model_has_a_head_dim_field():
    from tests.test_app import STEP_RE, metric, run
    at = run()
    at.selectbox(key="model").set_value("custom").run()
    assert not at.exception
    assert at.number_input(key="head_dim").value is None   # blank = hidden / heads
    before = metric(at, "Step time")
    at.number_input(key="head_dim").set_value(256).run()
    assert not at.exception and STEP_RE.match(metric(at, "Step time"))
    assert metric(at, "Step time") != before

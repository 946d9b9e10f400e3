"""The HF MoE harness (bench/cpu/e2e_moe.py, tests/benchmarks/cpu_moe_end_to_end.py) without measuring anything:
each family's model is what its config dict says, the router hook counts every routed token, and the
predict-batch rows carry the predictor's MoE columns with values the predictor's specs accept."""
from __future__ import annotations

import dataclasses

import pytest

from bench.cpu.e2e_moe import (
    MOE_COLUMNS,
    RoutingRecorder,
    build_moe_model,
    describe_model,
    hf_config,
    moe_row,
    routing_summary,
)
from predictor.model.layout_io import BATCH_COLUMNS, OPTIONAL_BATCH_COLUMNS, layout_from_fields, model_from_fields
from predictor.model.specs import Layout, ModelSpec
from tests.benchmarks import cpu_moe_end_to_end as bm

TINY = dict(layers=3, hidden=64, heads=4, kv_heads=2, ffn=96, seq=16, batch=2, vocab=256)
FAMILIES = {
    "mixtral": dict(TINY, name="t-mix", arch="mixtral", experts=4, top_k=2),
    "qwen3moe": dict(TINY, name="t-q3", arch="qwen3moe", experts=8, top_k=4, moe_ffn=32, head_dim=32, dense_layers=1),
    "qwen2moe": dict(TINY, name="t-q2", arch="qwen2moe", experts=6, top_k=1, moe_ffn=48, shared_ffn=80),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_model_is_what_the_config_says(family):
    torch = pytest.importorskip("torch")
    c = FAMILIES[family]
    model = build_moe_model(c)
    d = describe_model(model)
    dense = c.get("dense_layers", 0)
    assert (d["experts"], d["top_k"], d["dense_layers"], d["moe_layers"]) == (c["experts"], c["top_k"], dense,
                                                                              c["layers"] - dense)
    assert d["expert_ffn"] == c.get("moe_ffn", c["ffn"])
    assert d["shared_ffn"] == c.get("shared_ffn")
    assert d["experts_implementation"] == "grouped_mm"  # HF 5.x's default with torch >= 2.10 on CPU
    assert model.training and next(model.parameters()).dtype == torch.float32
    assert model.config.output_router_logits is False  # HF's default: no auxiliary loss
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.out_features == c["heads"] * c.get("head_dim", c["hidden"] // c["heads"])
    if dense:  # the leading dense layers keep the dense MLP of width ffn
        assert model.model.layers[0].mlp.gate_proj.out_features == c["ffn"]


def test_eager_experts_and_wrong_configs():
    assert hf_config({**FAMILIES["mixtral"], "experts_impl": "eager"})._experts_implementation == "eager"
    with pytest.raises(ValueError, match="shared expert"):
        hf_config({**FAMILIES["mixtral"], "shared_ffn": 64})
    with pytest.raises(ValueError, match="needs shared_ffn"):
        hf_config({k: v for k, v in FAMILIES["qwen2moe"].items() if k != "shared_ffn"})
    with pytest.raises(ValueError, match="experts and top_k"):
        hf_config({**FAMILIES["qwen3moe"], "top_k": None})


def test_router_hook_counts_every_routed_token():
    torch = pytest.importorskip("torch")
    c = FAMILIES["qwen3moe"]
    model = build_moe_model(c)
    rec = RoutingRecorder(model)
    ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"]))
    for kept in (False, True, True):  # a warm-up / redone step is not counted
        with torch.no_grad():
            model(input_ids=ids)
        rec.step_done(kept)
    assert len(rec.counts) == 2
    moe_layers = c["layers"] - c["dense_layers"]
    for step in rec.counts:
        assert len(step) == moe_layers
        assert all(len(x) == c["experts"] and sum(x) == c["batch"] * c["seq"] * c["top_k"] for x in step)
    s = rec.summary()
    assert 1.0 <= s["imbalance_min"] <= s["imbalance"] <= s["imbalance_max"] <= c["experts"] / c["top_k"]


def test_routing_summary_by_hand():
    # 2 experts, top-1: layer 0 balanced (4, 4), layer 1 all on one expert (8, 0)
    s = routing_summary([[[4, 4], [8, 0]], [[6, 2], [8, 0]]], experts=2, top_k=1)
    assert s["imbalance_by_layer"] == [1.25, 2.0]            # (1 + 1.5) / 2, (2 + 2) / 2
    assert s["imbalance"] == pytest.approx((1 + 2 + 1.5 + 2) / 4)
    assert (s["imbalance_min"], s["imbalance_max"], s["imbalance_worst_possible"]) == (1.0, 2.0, 2.0)
    assert s["experts_idle_max"] == 1 and s["routing_steps"] == 2 and s["routed_tokens_per_layer"] == 8
    assert routing_summary([], 2, 1) == {"routing_steps": 0}


@pytest.mark.parametrize("platform", ["cpu-2t", "cpu-1t"])
def test_rows_carry_the_moe_columns_the_predictor_accepts(platform):
    """Every benchmark config's row: the MoE columns named as ModelSpec / Layout fields, values the specs
    validate (a config the predictor would refuse for its own fields is caught here, not after measuring)."""
    spec_fields = {f.name for f in dataclasses.fields(ModelSpec)}
    assert set(MOE_COLUMNS) - {"ep"} <= spec_fields and "ep" in {f.name for f in dataclasses.fields(Layout)}
    known = set(BATCH_COLUMNS) | set(OPTIONAL_BATCH_COLUMNS) | set(MOE_COLUMNS)
    for c in bm.CONFIGS:
        row = moe_row(c, platform)
        assert set(row) <= known and set(BATCH_COLUMNS) - {"case_id"} <= set(row)
        assert row["arch"] == "llama" and row["ep"] == 1 and row["platform"] == platform
        assert (row["num_experts"], row["top_k"]) == (c["experts"], c["top_k"])
        assert row["shared_experts"] == (1 if c["arch"] == "qwen2moe" else 0)
        assert row["dense_layers"] == c.get("dense_layers", 0)
        assert row["head_dim"] == ("" if c.get("head_dim") in (None, c["hidden"] // c["heads"]) else c["head_dim"])
        m = dataclasses.replace(model_from_fields(row), **{k: row[k] or None for k in ("moe_ffn_hidden",
                                                                                      "shared_ffn_hidden")},
                                **{k: row[k] for k in ("num_experts", "top_k", "shared_experts", "dense_layers")})
        m.validate()
        layout = layout_from_fields(row)
        layout.validate(m)
        assert m.is_moe and m.expert_ffn == (c.get("moe_ffn") or c["ffn"]) and layout.dp == row["dp"]


def test_benchmark_spans_what_it_should():
    cs = bm.CONFIGS
    assert len(cs) >= 14 and len(bm.DDP_NAMES) >= 6
    assert set(bm.DDP_NAMES) | set(bm.EAGER_NAMES) <= {c["name"] for c in cs}
    assert {c["top_k"] for c in cs} >= {1, 2, 4, 8} and {c["arch"] for c in cs} == {"mixtral", "qwen3moe", "qwen2moe"}
    assert min(c["experts"] for c in cs) == 4 and max(c["experts"] for c in cs) == 64
    assert any(c.get("dense_layers") for c in cs) and any(c.get("shared_ffn") for c in cs)
    assert all(c["experts_impl"] == "eager" for c in bm.table_configs("eager"))


def test_rescore_prints_refusals_per_row(monkeypatch, capsys):
    """A row the predictor refuses prints its message; one it reads as dense is not scored; a scored one shows
    its signed error in the per-platform / per-family summary."""
    import predictor.plan.batch
    runs = [{**bm.by_name()[n], "measured_s": 1.0, "steps_s": [1.0], "load": 0.1, "discarded_steps": 0,
             "routing": {"imbalance": 1.5}} for n in ("mix-a", "q3-a", "q2-a")]

    def fake(rows, models_dir=None):
        return [{"step_time_s": None, "error": "num_experts: MoE is not modelled yet"},
                {"step_time_s": 1.2, "error": ""}, {"step_time_s": 0.5, "error": ""}]
    monkeypatch.setattr(predictor.plan.batch, "predict_records", fake)
    monkeypatch.setattr("predictor.model.layout_io.model_from_fields",  # q3-a read as MoE, the others as dense
                        lambda row: ModelSpec("x", "llama", 2, 64, 4, num_experts=4 if row["name"] == "q3-a" else 0,
                                              top_k=1 if row["name"] == "q3-a" else None))
    rows = bm.score_rows(runs, "cpu-2t")
    assert [r["predicted_s"] for r in rows] == [None, 1.2, None]
    assert rows[0]["note"] == "num_experts: MoE is not modelled yet" and "dense model" in rows[2]["note"]
    assert rows[1]["signed"] == pytest.approx(0.2)
    bm.print_scored("t", rows)
    out = capsys.readouterr().out
    assert "mix-a: num_experts: MoE is not modelled yet" in out and "q2-a: not scored" in out
    assert "cpu-2t: MAPE 20.0%, mean signed +20.0% (1 of 3 scored)" in out and "qwen2moe 0 of 1 scored" in out

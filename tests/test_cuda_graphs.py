"""CUDA graphs (Layout.cuda_graphs): Megatron-Core's cuda_graph_impl / cuda_graph_scope as a host-time change only. The
default (none) leaves every prediction as it was; full_iteration removes the per-layer and per-micro-batch host time
(one replay per step left); a per-layer scope removes exactly its measured share less one replay per layer; bad input
is refused by name; the measured record is checked; the CLI, batch column and search carry the field."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from predictor.cli.main import main
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import layout_from_fields
from predictor.model.presets import get_preset
from predictor.model.specs import Layout, ModelSpec, cuda_graphs_mask, cuda_graphs_value, normalize_cuda_graphs
from predictor.paths import ArtifactError
from predictor.step.host_floor import host_floor_from_dict, load_host_floor, save_host_floor
from predictor.step.terms import EndToEndTerms, HostTerm

# measured-looking shares (dense layer passes), not the shipped ones: the tests check the arithmetic, not the values
CG = {"attn": 0.55, "mlp": 0.43, "moe_router": 0.3, "moe_preprocess": 0.02, "replay": 0.03}
H = 5e-3    # host-bound: a large per-layer host time, so the blend is about the host time itself
FLOOR = {"host_s_per_layer_pass": 3e-4, "applies_to": ["megatron"], "measured_at": "2026-12-03T00:00:00+00:00",
         "source": "test"}
RECORD = {"scope_host_passes": {k: v for k, v in CG.items() if k != "replay"}, "replay_host_passes": CG["replay"],
          "applies_to": ["megatron"], "measured_at": "2026-12-03T00:00:00+00:00"}
DENSE = get_preset("llama2-7b")
QWEN = get_preset("qwen3-30b-a3b")     # every layer a MoE layer, dropless


def _dense(**kw) -> Layout:
    return Layout(**{**dict(num_gpus=8, tp=1, pp=1, dp=8, micro_batch=1, global_batch=16, seq_len=256), **kw})


def _moe(**kw) -> Layout:
    return Layout(**{**dict(num_gpus=8, tp=1, pp=1, dp=8, ep=8, micro_batch=1, global_batch=16, seq_len=256), **kw})


def _host_of(model, layouts, terms):
    from predictor.plan.predict import Predictor
    from predictor.step.engine import rows_for
    pr = Predictor("dgx-h100")
    rows, structs = rows_for(model, layouts)
    return pr.engine.evaluate(model, rows, structs, layouts[0].seq_len, "bf16", host=None, terms=terms,
                              provenance=False).host_all_s


def _terms(h=H, u=0.0, **kw) -> EndToEndTerms:
    return EndToEndTerms(host={"default": HostTerm(h, 2.0, u)}, cuda_graph_passes=dict(CG), **kw)


# ---- the value ---------------------------------------------------------------------------------------------------
def test_values_round_trip_in_canonical_order():
    assert Layout(num_gpus=1).cuda_graphs == "none"
    assert cuda_graphs_mask("none") == 0 == cuda_graphs_mask("")
    for v in ("attn", "mlp", "attn+mlp", "moe_router+moe_preprocess", "attn+moe_router+moe_preprocess",
              "full_iteration"):
        assert cuda_graphs_value(cuda_graphs_mask(v)) == v
    # any order, ',' read as '+': one canonical value
    assert normalize_cuda_graphs("moe_preprocess,moe_router+attn") == "attn+moe_router+moe_preprocess"
    assert normalize_cuda_graphs(None) == "none"


def test_engine_rows_carry_the_field_and_give_it_back():
    from predictor.step.engine import I_CG, layout_of_row, rows_for
    lays = [_moe(), _moe(cuda_graphs="attn+moe_router+moe_preprocess")]
    rows, structs = rows_for(QWEN, lays)
    assert rows[0, I_CG] == 0 and rows[1, I_CG] == cuda_graphs_mask("attn+moe_router+moe_preprocess")
    back = layout_of_row(rows[1], structs[0], 16, 256, "bf16")
    assert back.cuda_graphs == "attn+moe_router+moe_preprocess"


# ---- the time model ----------------------------------------------------------------------------------------------
def test_none_changes_nothing():
    """The default adds no column value: host time, and a whole prediction, as without the field."""
    base = EndToEndTerms(host={"default": HostTerm(H, 2.0, 1e-3)}, moe_host_passes={"megatron": 2.0})
    with_cg = dataclasses.replace(base, cuda_graph_passes=dict(CG))
    assert _host_of(QWEN, [_moe()], with_cg)[0] == _host_of(QWEN, [_moe()], base)[0]
    assert _host_of(DENSE, [_dense()], with_cg)[0] == _host_of(DENSE, [_dense()], base)[0]
    from predictor.plan.predict import Predictor
    pr = Predictor("dgx-h100")
    a, b = pr.predict(QWEN, _moe(), timeline=False), pr.predict(QWEN, _moe(cuda_graphs="none"), timeline=False)
    assert a.step_time_s == b.step_time_s and a.memory_gib == b.memory_gib


def test_full_iteration_leaves_one_replay_per_step():
    """full_iteration: no per-layer and no per-micro-batch host time; what is left is one replay per step."""
    terms = _terms(u=2e-3)
    cap = dataclasses.replace(DENSE)
    for lay in (_dense(cuda_graphs="full_iteration"), _dense(cuda_graphs="full_iteration", global_batch=64)):
        assert _host_of(cap, [lay], terms)[0] == pytest.approx(CG["replay"] * H, rel=1e-9)
    eager = _host_of(cap, [_dense()], terms)[0]
    assert eager > 100 * CG["replay"] * H
    # a MoE model with static expert shapes (a capacity factor: drop and pad) may capture the whole step too
    dropped = dataclasses.replace(QWEN, capacity_factor=1.0)
    assert _host_of(dropped, [_moe(cuda_graphs="full_iteration")], terms)[0] == pytest.approx(CG["replay"] * H,
                                                                                              rel=1e-9)


def test_a_dense_scope_removes_exactly_its_measured_share_less_one_replay():
    """attn on a dense layer: a layer pass of host time becomes 1 - (attn - replay) passes; attn+mlp one replay."""
    terms = _terms()
    for scope, left in (("attn", 1 - (CG["attn"] - CG["replay"])), ("mlp", 1 - (CG["mlp"] - CG["replay"])),
                        ("attn+mlp", 1 - (CG["attn"] + CG["mlp"] - CG["replay"]))):
        same = EndToEndTerms(host={"default": HostTerm(H * left, 2.0, 0.0)})
        assert _host_of(DENSE, [_dense(cuda_graphs=scope)], terms)[0] == pytest.approx(
            _host_of(DENSE, [_dense()], same)[0], rel=1e-9), scope


def test_moe_scopes_remove_their_measured_share_of_a_moe_layer_pass():
    """A MoE layer pass of 2 dense passes with attn+moe_router+moe_preprocess: 2 - (attn + router + preprocess -
    replay) passes left (one graph per layer: one replay); moe_router alone: 2 - (router - replay)."""
    terms = _terms(moe_host_passes={"megatron": 2.0})
    for scope, cut in (("attn+moe_router+moe_preprocess",
                        CG["attn"] + CG["moe_router"] + CG["moe_preprocess"] - CG["replay"]),
                       ("moe_router", CG["moe_router"] - CG["replay"]),
                       ("moe_router+moe_preprocess", CG["moe_router"] + CG["moe_preprocess"] - CG["replay"])):
        same = EndToEndTerms(host={"default": HostTerm(H * (2.0 - cut), 2.0, 0.0)})
        assert _host_of(QWEN, [_moe(cuda_graphs=scope)], terms)[0] == pytest.approx(
            _host_of(QWEN, [_moe()], same)[0], rel=1e-9), scope
    # leading dense layers of a MoE model shed the dense share: attn from both kinds
    mixed = dataclasses.replace(QWEN, dense_layers=24)
    dense_left, moe_left = 1 - (CG["attn"] - CG["replay"]), 2.0 - (CG["attn"] - CG["replay"])
    same = EndToEndTerms(host={"default": HostTerm(H * (dense_left + moe_left) / 2, 2.0, 0.0)})
    assert _host_of(mixed, [_moe(cuda_graphs="attn")], terms)[0] == pytest.approx(
        _host_of(mixed, [_moe()], same)[0], rel=1e-9)


def test_scopes_without_a_measured_record_are_refused_by_name():
    bare = EndToEndTerms(host={"default": HostTerm(H, 2.0, 0.0)})
    with pytest.raises(InfeasibleConfig) as e:
        _host_of(DENSE, [_dense(cuda_graphs="attn")], bare)
    assert e.value.field == "cuda_graphs" and "host-floor --cuda-graphs" in e.value.fix
    assert _host_of(DENSE, [_dense(cuda_graphs="full_iteration")], bare)[0] == 0.0   # no replay measured: nothing


def test_the_shipped_record_is_used_and_said():
    from predictor.plan.predict import Predictor
    pr = Predictor("dgx-h100")
    assert pr.terms is not None and set(pr.terms.cuda_graph_passes) == {*CG}
    eager = pr.predict(QWEN, _moe(), timeline=False)
    cg = pr.predict(QWEN, _moe(cuda_graphs="attn+moe_router+moe_preprocess"), timeline=False)
    assert cg.breakdown_s["host_overhead"] < eager.breakdown_s["host_overhead"]
    assert cg.step_time_s <= eager.step_time_s and cg.memory_gib == eager.memory_gib
    said = [w for w in cg.warnings if w.startswith("CUDA graphs")]
    assert len(said) == 1 and "not modelled" in said[0]
    assert not [w for w in eager.warnings if w.startswith("CUDA graphs")]


# ---- refusals ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, model, words", [
    ("attn+flash", DENSE, "unknown CUDA graph scope 'flash'"),
    ("moe", QWEN, "not modelled"),
    ("full_iteration+attn", DENSE, "cannot be combined"),
    ("moe_router", DENSE, "dense"),
    ("attn+moe_preprocess", QWEN, "with moe_router only"),
    ("mlp", QWEN, "every layer of this MoE model"),
    ("full_iteration", QWEN, "moe_pad_expert_input_to_capacity"),
])
def test_bad_values_are_refused_naming_the_field_and_the_fix(value, model, words):
    lay = _moe(cuda_graphs=value) if model.is_moe else _dense(cuda_graphs=value)
    with pytest.raises(InfeasibleConfig) as e:
        lay.validate(model)
    assert e.value.field == "cuda_graphs" and words in str(e.value) and e.value.fix


def test_cuda_graphs_are_megatron_cores_setting():
    with pytest.raises(InfeasibleConfig) as e:
        _dense(cuda_graphs="attn", framework="fsdp").validate(DENSE)
    assert e.value.field == "cuda_graphs" and "megatron" in e.value.fix
    _dense(cuda_graphs="none", framework="fsdp").validate(DENSE)


# ---- the measured record -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, field", [
    ({"scope_host_passes": {"attn": 0.5}}, "cuda_graphs.scope_host_passes.mlp"),
    ({"scope_host_passes": {**RECORD["scope_host_passes"], "attn": -0.1}}, "cuda_graphs.scope_host_passes.attn"),
    ({"replay_host_passes": 3.0}, "cuda_graphs.replay_host_passes"),
    ({"applies_to": ["jax"]}, "cuda_graphs.applies_to"),
])
def test_a_bad_record_names_its_field(bad, field):
    with pytest.raises(ArtifactError, match=field):
        host_floor_from_dict({**FLOOR, "cuda_graphs": {**RECORD, **bad}})


def test_the_record_is_added_to_the_saved_floor_and_reaches_the_terms(tmp_path):
    from predictor.step.host_floor import save_cuda_graph_shares
    from predictor.step.terms import load_terms_checked, save_terms
    with pytest.raises(ArtifactError, match="bench host-floor --save"):
        save_cuda_graph_shares(RECORD, tmp_path)
    save_host_floor(FLOOR, tmp_path)
    save_cuda_graph_shares(RECORD, tmp_path)
    floor, _ = load_host_floor(tmp_path)
    assert floor.host_s_per_layer_pass == pytest.approx(3e-4) and floor.cuda_graph_passes == pytest.approx(CG)
    save_terms(EndToEndTerms(), tmp_path)
    terms, warn = load_terms_checked(tmp_path)
    assert warn is None and terms.cuda_graph_passes == pytest.approx(CG)
    (tmp_path / "framework_terms.json").write_text(json.dumps({"cuda_graph_passes": {"attn": 20.0}}))
    terms, warn = load_terms_checked(tmp_path)
    assert terms is None and "cuda_graph_passes.attn" in warn


def test_bench_measures_the_parts_a_layer_is_made_of():
    pytest.importorskip("torch")
    from bench.sampling.host_floor import measure_cuda_graph_shares
    rec = measure_cuda_graph_shares(rounds=3, iters=5, warmup=2)
    s = rec["scope_host_passes"]
    # attention and MLP are the dense layer: their shares add up to about one pass (each less its replay, plus it)
    assert 0.7 < s["attn"] + s["mlp"] < 1.3
    assert 0 < rec["replay_host_passes"] < min(s["attn"], s["mlp"], s["moe_router"])
    assert host_floor_from_dict({**FLOOR, "cuda_graphs": rec}).cuda_graph_passes is not None


# ---- wiring ------------------------------------------------------------------------------------------------------
def test_the_cli_and_the_batch_column_take_the_field(capsys):
    base = ["predict", "--platform", "dgx-h100", "--model", "qwen3-30b-a3b", "--num-gpus", "8", "--ep", "8",
            "--global-batch", "16", "--seq-len", "1024", "--json", "--allow-oom"]
    assert main([*base, "--cuda-graphs", "moe_router+attn+moe_preprocess"]) == 0
    assert '"cuda_graphs": "attn+moe_router+moe_preprocess"' in capsys.readouterr().out
    assert main([*base, "--cuda-graphs", "full_iteration"]) == 2
    err = capsys.readouterr().err
    assert "cuda_graphs" in err and "capacity_factor" in err
    fields = {"model": "qwen3-30b-a3b", "num_gpus": 8, "ep": 8, "global_batch": 16, "seq_len": 1024}
    assert layout_from_fields({**fields, "cuda_graphs": ""}).cuda_graphs == "none"
    assert layout_from_fields({**fields, "cuda_graphs": "moe_router,moe_preprocess"}).cuda_graphs == \
        "moe_router+moe_preprocess"


def test_search_keeps_the_field_fixed_and_agrees_with_predict():
    from predictor.plan.predict import get_predictor
    from predictor.plan.search import SearchSpace, layout_of, search
    P = get_predictor("dgx-h100")
    model = ModelSpec(name="ft-moe", arch="gpt", num_layers=12, hidden_size=512, num_heads=8, ffn_hidden_size=2048,
                      vocab_size=50257, num_experts=8, top_k=2, moe_imbalance=1.0, attention_impl="flash")
    rep = search(model, P, 8, 32, 1024, top_k=1, refine=False,
                 space=SearchSpace(tp=(1,), pp=(1,), ep=(4, 8), micro_batch=(4,), zero_stage=(0,),
                                   recompute=("none",), cuda_graphs="attn+moe_router+moe_preprocess"))
    t = rep.table
    assert len(t) and set(t["cuda_graphs"]) == {"attn+moe_router+moe_preprocess"}
    for _, row in t.iterrows():
        L = layout_of(row)
        assert L.cuda_graphs == "attn+moe_router+moe_preprocess"
        assert row["step_time_s"] == pytest.approx(P.predict(model, L, timeline=False).step_time_s, rel=1e-9)
    with pytest.raises(InfeasibleConfig) as e:
        search(model, P, 8, 32, 1024, top_k=1, refine=False, space=SearchSpace(tp=(1,), cuda_graphs="full_iteration"))
    assert e.value.field == "cuda_graphs"
    assert np.all(t["cuda_graphs"].map(cuda_graphs_mask) > 0)

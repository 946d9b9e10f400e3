"""Selective recomputation by module (Layout.recompute_modules; Megatron-Core TransformerConfig.recompute_modules):
bad input named, the memory each module frees against the tensors computed here by hand, the time it adds against
the forward of the same calls, and search agreeing with predict on the new field."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import layout_from_fields, parse_recompute_modules
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.plan.predict import get_predictor
from predictor.plan.search import SearchSpace, layout_of, search
from predictor.step import decompose as D
from predictor.step import memory as mem
from predictor.step.engine import unit_key

LLAMA = get_preset("llama3-8b")                     # dense, GQA, SwiGLU, RMSNorm, no dropout
QWEN = replace(get_preset("qwen3-30b-a3b"), moe_imbalance=1.0)   # every layer MoE, no shared experts
V3 = get_preset("deepseek-v3")                      # MLA, 3 dense layers, a shared expert
E = 2                                               # bf16 bytes per element


def _layout(rc: str = "selective", mods=None, **kw) -> Layout:
    base = dict(num_gpus=8, tp=2, dp=4, micro_batch=1, global_batch=32, seq_len=4096, sequence_parallel=True,
                recompute=rc, recompute_modules=mods)
    base.update(kw)
    return Layout(**base)


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("model,mods,words", [
    (LLAMA, ("attn",), "unknown module"),
    (LLAMA, ("moe_act",), "dense"),
    (LLAMA, ("moe",), "dense"),
    (LLAMA, ("mla_up_proj",), "latent attention"),
    (QWEN, ("shared_experts",), "no shared experts"),
    (QWEN, ("mlp",), "MoE layer"),
    (LLAMA, ("mlp", "mlp"), "twice"),
    (LLAMA, ("layernorm",), "fused"),
])
def test_a_module_that_does_not_apply_is_refused_naming_the_field(model, mods, words):
    with pytest.raises(InfeasibleConfig) as e:
        _layout(mods=mods).validate(model)
    assert e.value.field == "recompute_modules"
    assert words in str(e.value)
    assert e.value.fix


def test_modules_need_selective_recomputation():
    for rc in ("none", "full"):
        with pytest.raises(InfeasibleConfig) as e:
            _layout(rc, ("core_attn",)).validate(LLAMA)
        assert e.value.field == "recompute_modules" and "selective" in e.value.fix


def test_the_flag_and_the_batch_cell_parse_to_the_field():
    assert parse_recompute_modules("mlp, core_attn") == ("mlp", "core_attn")
    assert parse_recompute_modules("") is None and parse_recompute_modules("none") == ()
    L = layout_from_fields({"num_gpus": 8, "tp": 2, "sequence_parallel": True, "recompute": "selective",
                            "recompute_modules": "mlp,layernorm"})
    assert L.selective_modules == ("layernorm", "mlp")   # RECOMPUTE_MODULES order
    with pytest.raises(InfeasibleConfig) as e:
        layout_from_fields({"num_gpus": 8, "recompute": "selective", "recompute_modules": "mlp,foo"}).validate(LLAMA)
    assert e.value.field == "recompute_modules" and "foo" in str(e.value)


def test_megatron_default_is_core_attn():
    assert _layout().selective_modules == ("core_attn",)
    assert _layout("none").selective_modules == () and _layout(mods=()).selective_modules == ()


# --------------------------------------------------------------------------------- memory freed per module
def _freed(model, mods, moe=False, tp=2, sp=True, s=4096, b=1):
    return mem.recompute_freed_bytes(model, s, b, tp, sp, mods, "bf16", moe=moe, ep=8 if moe else 1)


def test_recompute_modules_are_megatron_core_only():
    with pytest.raises(InfeasibleConfig) as e:
        _layout(mods=("core_attn",), framework="megatron-deepspeed").validate(LLAMA)
    assert e.value.field == "recompute_modules" and "megatron" in e.value.fix
    _layout(framework="megatron-deepspeed").validate(LLAMA)   # selective without modules stays valid there


def test_layernorm_frees_the_norms_that_are_modules_of_their_own():
    """Transformer Engine specs fuse a norm into the linear after it except MLA's input norm and a MoE layer's
    pre-MLP norm; those norms' outputs (sequence-parallel shards) are what 'layernorm' frees."""
    s, b, t = 4096, 1, 2
    one = s * b * V3.hidden_size * E / t
    assert _freed(V3, ("layernorm",)) == pytest.approx(one, rel=1e-12)               # a dense layer: the input norm
    assert _freed(V3, ("layernorm",), moe=True) == pytest.approx(2 * one, rel=1e-12)  # + the pre-MLP norm
    assert _freed(QWEN, ("layernorm",), moe=True) == pytest.approx(s * b * QWEN.hidden_size * E / t, rel=1e-12)
    assert _freed(LLAMA, ("layernorm",)) == 0.0
    u = D.layer_unit(QWEN, 2, 1, 4096, True, "selective", "bf16", (2, 1, 8), ep=8, ep_topo=(8, 1, 8),
                     recompute_modules=("layernorm",))
    assert [(c.op, c.count) for c in u.ops if c.phase == "recompute"] == [("rmsnorm", 1)]


def test_dense_modules_free_the_tensors_they_hold():
    s, b, t = 4096, 1, 2
    # SwiGLU MLP: fc1's output (gate and up, 2 x ffn) and the activation output (fc2's input), split over tp
    assert _freed(LLAMA, ("mlp",)) == pytest.approx(s * b * LLAMA.ffn / t * 3 * E, rel=1e-12)
    # flash attention: only its fp32 logsumexp, [b, heads / tp, s]
    assert _freed(LLAMA, ("core_attn",)) == pytest.approx(4 * b * LLAMA.num_heads / t * s, rel=1e-12)
    both = _freed(LLAMA, ("core_attn", "mlp"))
    assert both == pytest.approx(sum(_freed(LLAMA, (m,)) for m in ("core_attn", "mlp")), rel=1e-12)


def test_unfused_core_attention_frees_korthikanti_5as_over_h_term():
    m = replace(get_preset("gpt3-175b"), attention_impl="unfused")
    s, b, t = 2048, 1, 8
    none = mem.activation_bytes_per_layer(m, s, b, t, True, "none", "bf16")
    sel = mem.activation_bytes_per_layer(m, s, b, t, True, "selective", "bf16", modules=("core_attn",))
    assert none - sel == pytest.approx(5 * m.num_heads * s * s * b / t, rel=1e-12)


def test_moe_modules_free_the_routed_rows_tensors():
    s, b, t = 4096, 1, 1
    # balanced (moe_imbalance 1), dropless: a rank receives tokens x top_k rows; the activation output per row is
    # the expert's width
    rows = s * b * QWEN.top_k
    assert _freed(QWEN, ("moe_act",), moe=True, tp=t, sp=False) == pytest.approx(rows * QWEN.expert_ffn * E, rel=1e-12)
    # moe: the whole block: per row dispatched input + expert output (2h), fc1 output (2 x ffn_e) and activation
    # output (ffn_e); the fp32 router probabilities (tokens x experts) and the routing map (8 bytes per routed row)
    block = rows * (2 * QWEN.hidden_size + 3 * QWEN.expert_ffn) * E + 4 * s * b * QWEN.num_experts + 8 * rows
    assert _freed(QWEN, ("moe",), moe=True, tp=t, sp=False) == pytest.approx(block, rel=1e-12)
    # moe contains moe_act: nothing counted twice
    assert _freed(QWEN, ("moe", "moe_act"), moe=True, tp=t, sp=False) == pytest.approx(block, rel=1e-12)
    # a dense layer of a MoE model: moe modules free nothing there, mlp its MLP
    assert _freed(V3, ("moe_act", "moe")) == 0.0
    assert _freed(V3, ("mlp",)) == pytest.approx(s * b * V3.ffn / 2 * 3 * E, rel=1e-12)


def test_shared_experts_and_mla_up_projection():
    s, b, t = 4096, 1, 2
    sh = V3.shared_experts * V3.shared_ffn
    assert _freed(V3, ("shared_experts",), moe=True) == pytest.approx(s * b * sh / t * 3 * E, rel=1e-12)
    # the normed latents (SP shards; the norms are fused into the checkpointed up projections) and the up-projected
    # Q (heads x 192), K (heads x 192) and V (heads x 128)
    lat = s * b * (V3.q_lora_rank + V3.kv_lora_rank) * E / t
    qkv = s * b * V3.num_heads / t * (2 * V3.qk_head_size + V3.v_head_size) * E
    assert _freed(V3, ("mla_up_proj",)) == pytest.approx(lat + qkv, rel=1e-12)


def test_mla_up_proj_reruns_the_latent_norms_up_projections_and_rope():
    u = D.layer_unit(V3, 2, 1, 4096, True, "selective", "bf16", (2, 1, 8), moe=False,
                     recompute_modules=("mla_up_proj",))
    rc = [c for c in u.ops if c.phase == "recompute"]
    proj = D.mla_projection_ops(V3, 2, 1, 4096, True, "recompute")
    down = [c for c in proj if c.op == "mlp_up"][:2]   # W_DQ and W_DKV stay outside the checkpoint
    assert sorted((c.op, c.shape) for c in rc) == sorted((c.op, c.shape) for c in proj if c not in down)
    ups = [c for c in rc if c.op == "mlp_up"]
    # W_UQ (q_lora_rank -> heads x 192) and W_UKV (kv_lora_rank -> heads x (128 + 128)), column-parallel
    assert [c.shape[D.SHAPE_COLUMNS.index("hidden")] for c in ups] == [V3.q_lora_rank, V3.kv_lora_rank]


def test_estimate_memory_moves_the_freed_bytes_out_of_activations():
    """pp = 1: one micro-batch in flight; every layer frees its share, one layer's worth comes back as the buffer
    its backward rematerialises."""
    L0, L1 = _layout("selective", ()), _layout("selective", ("core_attn", "mlp"))
    r0, r1 = mem.estimate_memory(LLAMA, L0), mem.estimate_memory(LLAMA, L1)
    per_layer = _freed(LLAMA, ("core_attn", "mlp"))
    assert r0.stages[0].activations_bytes - r1.stages[0].activations_bytes == pytest.approx(
        LLAMA.num_layers * per_layer, rel=1e-9)
    assert r1.stages[0].buffers_bytes - r0.stages[0].buffers_bytes == pytest.approx(per_layer, rel=1e-9)
    # an empty module list stores what recompute none stores
    rn = mem.estimate_memory(LLAMA, _layout("none"))
    assert r0.stages[0].activations_bytes == rn.stages[0].activations_bytes


# ------------------------------------------------------------------------------------------- time added
def _forward_of(unit, ops):
    return [c for c in unit.ops if c.phase == "fwd" and c.op in ops]


def test_the_recompute_phase_is_the_forward_of_the_modules():
    topo = (2, 1, 8)
    none = D.layer_unit(LLAMA, 2, 1, 4096, True, "none", "bf16", topo)
    mlp = D.layer_unit(LLAMA, 2, 1, 4096, True, "selective", "bf16", topo, recompute_modules=("mlp",))
    r = [c for c in mlp.ops if c.phase == "recompute"]
    fwd = _forward_of(none, ("mlp_up", "swiglu", "mlp_down"))
    assert [(c.op, c.pass_, c.shape, c.count) for c in r] == [(c.op, c.pass_, c.shape, c.count) for c in fwd]
    # and its tensor-parallel exchange (fc1 all-gathers, fc2 reduce-scatters) once more
    rc_comms = [c for c in mlp.comms if c.phase == "recompute"]
    assert sorted(c.collective for c in rc_comms) == ["allgather", "reducescatter"]
    # core_attn under flash attention re-runs the flash kernel (Megatron-Core's checkpointed core attention)
    ca = D.layer_unit(LLAMA, 2, 1, 4096, True, "selective", "bf16", topo)
    assert [c.op for c in ca.ops if c.phase == "recompute"] == ["flash_attn"]
    # nothing recomputed: no recompute phase
    empty = D.layer_unit(LLAMA, 2, 1, 4096, True, "selective", "bf16", topo, recompute_modules=())
    assert not [c for c in empty.ops if c.phase == "recompute"] and empty.comms == none.comms


def test_moe_act_reruns_the_experts_activation_on_their_rows():
    r = D.moe_.routing(QWEN, 1, 4096, 1, 1, 8, False)
    u = D.layer_unit(QWEN, 1, 1, 4096, False, "selective", "bf16", (1, 1, 8), ep=8, ep_topo=(8, 1, 8),
                     recompute_modules=("moe_act",))
    rc = [c for c in u.ops if c.phase == "recompute"]
    assert len(rc) == 1 and rc[0].op == "swiglu" and rc[0].count == r.local_experts
    assert rc[0].shape == [c for c in u.ops if c.phase == "fwd" and c.op == "swiglu" and c.part == "experts"][0].shape


def test_predicted_recompute_seconds_are_the_modules_forward_seconds():
    P = get_predictor("dgx-h100")
    L_none, L_mlp = _layout("none"), _layout("selective", ("mlp",))
    p_none, p_mlp = P.predict(LLAMA, L_none), P.predict(LLAMA, L_mlp)
    u_none = P.engine._parts[(LLAMA, 4096, "bf16", *unit_key(L_none, P.platform, LLAMA))].layer
    u_mlp = P.engine._parts[(LLAMA, 4096, "bf16", *unit_key(L_mlp, P.platform, LLAMA))].layer
    fwd = sum(t.seconds * t.call.count for t in u_none.calls
              if isinstance(t.call, D.OpCall) and t.call.phase == "fwd"
              and t.call.op in ("mlp_up", "swiglu", "mlp_down"))
    assert u_mlp.rc == pytest.approx(fwd, rel=1e-9)
    assert u_mlp.bc - u_none.bc == pytest.approx(u_mlp.rc, rel=1e-9)
    assert p_mlp.step_time_s > p_none.step_time_s
    assert p_mlp.memory.peak.activations_bytes < p_none.memory.peak.activations_bytes


# -------------------------------------------------------------------------------------- search == predict
def test_search_and_predict_agree_on_recompute_modules():
    P = get_predictor("dgx-h100")
    space = SearchSpace(tp=(2,), pp=(1, 2), micro_batch=(1,), recompute=("selective",),
                        recompute_modules=("mlp", "core_attn"), sequence_parallel=(True,), zero_stage=(1,),
                        schedules=("1f1b",), uneven_splits=False)
    rep = search(LLAMA, P, 8, 32, 4096, space=space)
    t = rep.table
    assert set(t["recompute_modules"]) == {"core_attn,mlp"}
    for _, row in t.head(3).iterrows():
        L = layout_of(row)
        assert L.selective_modules == ("core_attn", "mlp")
        assert P.predict(LLAMA, L).step_time_s == pytest.approx(float(row["step_time_s"]), rel=1e-9)


def test_search_and_predict_agree_on_default_selective_under_flash():
    """The case search used to call 'equal to none': searched alone it is ranked, at predict's time."""
    P = get_predictor("dgx-h100")
    space = SearchSpace(tp=(2,), pp=(1,), micro_batch=(1,), recompute=("selective",), sequence_parallel=(True,),
                        zero_stage=(1,), schedules=("1f1b",))
    row = search(LLAMA, P, 8, 32, 4096, space=space).table.iloc[0]
    L = layout_of(row)
    assert L.recompute == "selective" and L.selective_modules == ("core_attn",)
    p = P.predict(LLAMA, L)
    assert p.step_time_s == pytest.approx(float(row["step_time_s"]), rel=1e-9)
    assert p.step_time_s > P.predict(LLAMA, replace(L, recompute="none")).step_time_s


# ------------------------------------------------------------------------ recipes behind the NeMo / MB rows
def test_recipe_recompute_reaches_exactly_the_rows_it_names():
    """Every `recipe_recompute` entry of the catalog names a kept row and cites its file; those rows go to the
    predictor as selective with the recipe's modules, every other row as recompute none."""
    from predictor.checks import independent_nemo as nemo
    doc = nemo.load()
    pr = nemo.published_runs(doc)
    entries = [(sid, e) for sid, src in doc["sources"].items() for e in src.get("recipe_recompute", [])]
    assert entries
    for _, e in entries:
        assert "Megatron-Bridge@" in e["cite"] and e["recompute_modules"]
        hit = pr.ok[(pr.ok["release"] == e["release"]) & (pr.ok["system"] == e["system"])
                    & (pr.ok["model"] == e["model"]) & (pr.ok["precision"] == e["precision"])]
        assert len(hit) == 1, e
    selective = 0
    for _, r in pr.ok.iterrows():
        key = r.get("model_key")
        if key not in doc["models"]:
            continue
        row = nemo.batch_row(r, doc["models"][key])
        named = r["recompute_modules"]
        assert row["recompute"] == ("selective" if named else "none")
        assert row["recompute_modules"] == ",".join(named or ())
        selective += bool(named)
    assert selective == len(entries)


# ----------------------------------------------------------------------------------------------- dashboard
def test_a_search_row_opens_in_predict_with_its_recompute_modules():
    from predictor_ui.search_view import predict_query
    L = _layout(mods=("mlp", "core_attn"))
    row = {f: getattr(L, f) for f in ("num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch", "seq_len", "vpp",
                                      "schedule", "recompute", "sequence_parallel", "zero_stage", "precision", "cp",
                                      "ep")}
    q = predict_query({**row, "stage_layers": "", "recompute_modules": "core_attn,mlp"})
    assert q["recompute_modules"] == "core_attn,mlp"
    assert layout_from_fields(q).selective_modules == ("core_attn", "mlp")
    assert "recompute_modules" not in predict_query({**row, "stage_layers": "", "recompute_modules": "core_attn"})


def test_predict_page_takes_recompute_modules_from_the_url():
    from tests.test_app import metric, run, text
    q = {"model": "llama3-8b", "platform": "dgx-h100", "num_gpus": 8, "tp": 2, "pp": 1, "global_batch": 32,
         "seq_len": 4096, "sequence_parallel": "true", "zero_stage": 1, "recompute": "selective"}
    base = run(query=q)
    more = run(query={**q, "recompute_modules": "core_attn,mlp"})
    assert float(metric(more, "Memory / GPU").split()[0]) < float(metric(base, "Memory / GPU").split()[0])
    bad = run(query={**q, "recompute_modules": "moe_act"})
    assert any("`recompute_modules`" in w.value and "How to fix" in w.value for w in bad.warning), text(bad)


# --------------------------------------------------------------------- fp8: the experts' GEMM inputs as FP8
def test_fp8_moe_rows_keep_fc1_and_fc2_inputs_as_their_fp8_casts():
    """Transformer Engine's GroupedLinear saves the quantized input of each expert GEMM (as Linear does for the dense
    ones): per routed row the fc1 input (h) and the fc2 input (ffn_e) are 1 byte under fp8, the fc1 output
    (2 ffn_e) and the expert output the un-permutation keeps (h) stay 16-bit."""
    from predictor.step import fp8
    s, b = 4096, 1
    rows = s * b * QWEN.top_k            # balanced, dropless, ep 8, tp 1
    g = fp8.saved_input_bytes("fp8", E)
    assert g == 1
    _, p16 = mem.activation_breakdown(QWEN, s, b, 1, "bf16", moe=True, ep=8)
    _, p8 = mem.activation_breakdown(QWEN, s, b, 1, "fp8", moe=True, ep=8)
    assert p16["mlp"] - p8["mlp"] == pytest.approx(rows * (QWEN.hidden_size + QWEN.expert_ffn) * (E - g), rel=1e-12)
    assert p8["mlp"] == pytest.approx(rows * (QWEN.hidden_size * (g + E) + QWEN.expert_ffn * (2 * E + g))
                                      + 4 * s * b * QWEN.num_experts + 8 * rows, rel=1e-12)


def test_the_cli_takes_recompute_modules_and_refuses_one_that_does_not_apply(capsys):
    from predictor.cli.main import main
    q = ["predict", "--platform", "dgx-h100", "--model", "llama3-8b", "--num-gpus", "8", "--tp", "2", "--dp", "4",
         "--global-batch", "32", "--seq-len", "4096", "--sequence-parallel", "--recompute", "selective"]
    assert main([*q, "--recompute-modules", "mlp,core_attn", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout"]["recompute_modules"] == ["mlp", "core_attn"]
    assert main([*q, "--recompute-modules", "moe_act"]) == 2
    err = capsys.readouterr().err
    assert "recompute_modules" in err and "moe_act" in err and "Fix" in err


def test_legacy_megatron_attention_does_not_checkpoint_flash():
    """Frameworks other than Megatron-Core run the legacy Megatron-LM attention, which checkpoints the core attention
    only without flash attention: their selective layout under flash re-runs nothing and stores what none stores, so
    predict charges it nothing over none and search may rank it as none."""
    P = get_predictor("dgx-h100")
    base = dict(num_gpus=8, tp=2, dp=4, micro_batch=1, global_batch=32, seq_len=4096, sequence_parallel=True,
                framework="megatron-deepspeed")
    sel, none = Layout(**base, recompute="selective"), Layout(**base, recompute="none")
    assert mem.recompute_mask(LLAMA, sel) == 0
    assert not [c for plan in D.decompose(LLAMA, sel, P.platform) for c in plan.ops if c.phase == "recompute"]
    assert [c.op for plan in D.decompose(LLAMA, replace(sel, framework="megatron"), P.platform)[:1]
            for c in plan.ops if c.phase == "recompute"] == ["flash_attn"]
    ps, pn = P.predict(LLAMA, sel), P.predict(LLAMA, none)
    assert ps.step_time_s == pytest.approx(pn.step_time_s, rel=1e-12)
    assert ps.memory.peak_bytes == pytest.approx(pn.memory.peak_bytes, rel=1e-12)
    # Megatron-Core re-runs the flash forward
    mc = P.predict(LLAMA, replace(sel, framework="megatron"))
    assert mc.step_time_s > P.predict(LLAMA, replace(none, framework="megatron")).step_time_s
    # unfused attention: the legacy code checkpoints the core attention as Korthikanti et al. describe
    unfused = replace(get_preset("gpt3-1.3b"), attention_impl="unfused")
    assert mem.recompute_mask(unfused, replace(sel, num_gpus=8)) == mem.modules_mask(("core_attn",))
    # search: under megatron-deepspeed the row searched alone is ranked at predict's time (and equals none's)
    space = SearchSpace(tp=(2,), pp=(1,), micro_batch=(1,), recompute=("selective",), sequence_parallel=(True,),
                        zero_stage=(1,), schedules=("1f1b",), framework="megatron-deepspeed")
    row = search(LLAMA, P, 8, 32, 4096, space=space).table.iloc[0]
    L = layout_of(row)
    assert L.recompute == "selective" and L.recompute_modules is None
    assert P.predict(LLAMA, L).step_time_s == pytest.approx(float(row["step_time_s"]), rel=1e-9)


@pytest.mark.parametrize("fw,words", [("megatron", "re-runs the attention forward"),
                                      ("megatron-deepspeed", "equals none")])
def test_search_says_why_default_selective_is_not_enumerated_under_flash(fw, words):
    P = get_predictor("dgx-h100")
    rep = search(LLAMA, P, 8, 32, 4096, space=SearchSpace(tp=(2,), pp=(1,), micro_batch=(1,), framework=fw,
                                                          zero_stage=(1,), schedules=("1f1b",)))
    rej = rep.rejection_summary()
    row = rej[rej["reason"] == "not enumerated: recompute=selective"]
    assert len(row) == 1 and words in row["example"].iloc[0]
    assert set(rep.table["recompute"]) == {"none", "full"}


def test_an_oom_moe_layout_names_selective_modules_as_a_lever():
    from predictor.plan.memory_verdict import oom_fix
    P = get_predictor("dgx-h100")
    L = Layout(num_gpus=8, tp=1, dp=8, ep=8, micro_batch=8, global_batch=64, seq_len=4096)
    p = P.predict(QWEN, L)
    assert not p.memory.fits
    fix = oom_fix(p)
    assert "selective recomputation of moe_act or moe" in fix and "--recompute-modules" in fix
    dense = P.predict(LLAMA, Layout(num_gpus=1, micro_batch=16, global_batch=16, seq_len=8192))
    assert "selective recomputation" not in oom_fix(dense)

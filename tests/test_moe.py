"""Mixture-of-Experts: parameters, the MoE layer's calls, expert parallelism in time and memory, one engine."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from predictor.hardware.platforms import get_platform
from predictor.model import moe, params
from predictor.model.errors import InfeasibleConfig
from predictor.model.presets import get_preset
from predictor.model.specs import Layout, ModelSpec
from predictor.plan.predict import get_predictor
from predictor.plan.search import SearchSpace, layout_of, search
from predictor.step.compose import CATEGORIES
from predictor.step.decompose import decompose
from predictor.step.memory import estimate_memory

# A small MoE model with everything a MoE can have: leading dense layers and a shared expert
SMALL = ModelSpec("moe-small", "llama", 8, 1024, 16, 4, 4096, 32000, tied_embeddings=False, num_experts=16, top_k=4,
                  moe_ffn_hidden=512, shared_experts=1, shared_ffn_hidden=1024, dense_layers=2)


@pytest.mark.parametrize("name,total_b,active_b", [
    # published sizes: Mixtral-8x7B 46.7B / 12.9B active (Mistral AI), Mixtral-8x22B 141B / 39B, Qwen3-30B-A3B
    # 30.5B / 3.3B, Qwen3-235B-A22B 235B / 22B (Qwen3 model cards)
    ("mixtral-8x7b", 46.7, 12.9), ("mixtral-8x22b", 141.0, 39.0), ("qwen3-30b-a3b", 30.5, 3.3),
    ("qwen3-235b-a22b", 235.0, 22.0)])
def test_moe_presets_have_their_published_sizes(name, total_b, active_b):
    m = get_preset(name)
    assert m.total_params() / 1e9 == pytest.approx(total_b, rel=0.01)
    assert m.active_params() / 1e9 == pytest.approx(active_b, rel=0.02)


def test_deepseek_v3_2_is_refused_with_the_reason():
    """DeepSeek Sparse Attention is not modelled: refused by name, never predicted as dense attention (DeepSeek-V3,
    refused here before multi-head latent attention was modelled, is a preset now)."""
    with pytest.raises(InfeasibleConfig) as e:
        get_preset("deepseek-v3.2")
    assert e.value.field == "model" and "Sparse Attention" in str(e.value)


def test_moe_layer_calls_follow_the_routing():
    """One MoE layer of one micro-batch: router on T tokens, T*top_k rows permuted, each local expert's MLP on its
    share of the busiest rank's rows, all-to-all of those rows in both directions over the ep group."""
    L = Layout(num_gpus=8, dp=8, ep=4, micro_batch=2, global_batch=16, seq_len=512, zero_stage=1)
    plan = decompose(SMALL, L, get_platform("dgx-h100"))[0]
    r = moe.routing(SMALL, 2, 512, 1, 1, 4, False)
    assert r.tokens == 1024 and r.routed_rows == 4096 and r.local_experts == 4
    assert r.rows_per_expert == math.ceil(4096 * r.imbalance / 4) and r.imbalance > 1.0
    n_moe = SMALL.num_layers - SMALL.dense_layers
    ups = [c for c in plan.ops if c.op == "mlp_up" and c.part == "experts" and c.phase == "fwd"]
    assert len(ups) == 1 and ups[0].count == n_moe * 4
    shp = dict(zip(("tp", "batch", "seq", "hidden", "heads", "kv_heads", "ffn_hidden"), ups[0].shape))
    assert shp["tp"] == 1 and shp["seq"] == r.rows_per_expert and shp["ffn_hidden"] == 2 * 512
    # dense layers keep the dense MLP, MoE layers the shared expert (width 1024)
    dense_up = [c for c in plan.ops if c.op == "mlp_up" and c.part == "layer" and c.phase == "fwd"]
    assert dense_up[0].count == SMALL.dense_layers and dense_up[0].shape[6] == 2 * 4096
    shared = [c for c in plan.ops if c.op == "mlp_up" and c.part == "shared_experts" and c.phase == "fwd"]
    assert shared[0].count == n_moe and shared[0].shape[6] == 2 * 1024
    a2a = [c for c in plan.comms if c.collective == "alltoall"]
    assert {c.phase for c in a2a} == {"fwd", "bwd"} and all(c.ranks == 4 and c.group == "ep" for c in a2a)
    assert sum(c.count for c in a2a if c.phase == "fwd") == 2 * n_moe     # dispatch + combine per MoE layer
    assert a2a[0].message_bytes == math.ceil(4096 * r.imbalance) * 1024 * 2
    # expert gradients go over the expert-data-parallel group (8 / 4 = 2 ranks), the rest over dp = 8
    groups = {(c.group, c.ranks) for c in plan.step_comms}
    assert ("edp", 2) in groups and ("dp", 8) in groups


def test_params_split_experts_by_ep():
    full = params.chunk_params(SMALL, 1, 1, 8, True, True, 512, dense=2, ep=1)
    split = params.chunk_params(SMALL, 1, 1, 8, True, True, 512, dense=2, ep=4)
    assert full - split == 6 * (16 - 4) * params.expert_params(SMALL)
    assert params.total_params(SMALL) == full  # one GPU holding everything


def test_ep_shrinks_expert_memory_and_adds_all_to_all():
    P = get_predictor("dgx-h100")
    m = get_preset("mixtral-8x7b")
    base = Layout(num_gpus=64, tp=1, pp=4, dp=16, micro_batch=1, global_batch=256, seq_len=4096, zero_stage=1)
    p1, p8 = P.predict(m, base), P.predict(m, replace(base, ep=8))
    assert p1.breakdown_s["ep_comm"] == 0.0 and p8.breakdown_s["ep_comm"] > 0.0
    w1 = estimate_memory(m, base, P.platform).peak
    w8 = estimate_memory(m, replace(base, ep=8), P.platform).peak
    experts_per_gpu = 8 * params.layer_expert_params_per_gpu(m, 1)   # 8 layers a stage, all experts (ep = 1)
    assert w1.weights_bytes - w8.weights_bytes == pytest.approx(2 * experts_per_gpu * 7 / 8, rel=1e-9)
    # ZeRO-1: the experts' optimizer states shard over the expert-data-parallel group (16 / 8 = 2 ranks with
    # ep = 8, 16 with ep = 1): same bytes per GPU for the experts either way (E/ep experts / (dp/ep))
    assert w8.optimizer_bytes == pytest.approx(w1.optimizer_bytes, rel=1e-9)


def test_imbalance_scales_the_expert_work():
    P = get_predictor("dgx-h100")
    L = Layout(num_gpus=8, dp=8, ep=8, micro_batch=1, global_batch=64, seq_len=4096, zero_stage=1)
    m = get_preset("qwen3-30b-a3b")
    base = P.predict(replace(m, moe_imbalance=1.0), L)
    worse = P.predict(replace(m, moe_imbalance=1.5), L)
    assert worse.step_time_s > base.step_time_s
    assert worse.breakdown_s["ep_comm"] > base.breakdown_s["ep_comm"]
    capped = P.predict(replace(m, moe_imbalance=1.5, capacity_factor=1.0), L)
    assert capped.step_time_s == pytest.approx(base.step_time_s, rel=1e-9)   # dropping caps at the mean load
    assert moe.modelled_imbalance(4096, 1) == 1.0
    assert 1.0 < moe.modelled_imbalance(64, 8) < moe.modelled_imbalance(16, 8)


def test_dense_layers_sit_between_all_dense_and_all_moe():
    P = get_predictor("dgx-a100-80gb")
    L = Layout(num_gpus=8, pp=2, dp=4, ep=4, micro_batch=1, global_batch=32, seq_len=2048, zero_stage=1)
    none = P.predict(replace(SMALL, dense_layers=0), L).step_time_s
    some = P.predict(SMALL, L).step_time_s
    more = P.predict(replace(SMALL, dense_layers=6), L).step_time_s
    assert len({none, some, more}) == 3
    assert (none < some < more) or (none > some > more)


def test_search_and_predict_agree_on_a_moe_with_dense_and_shared_layers():
    P = get_predictor("dgx-h100")
    rep = search(SMALL, P, 16, 64, 2048, top_k=1, refine=False, space=SearchSpace(schedules=("1f1b", "interleaved")))
    t = rep.table
    assert set(t["ep"]) >= {1, 2, 4, 8, 16}
    assert ((t["tp"] == 1) | t["sequence_parallel"]).all()       # MoE with tp > 1 only with SP
    assert not ((t["ep"] > 1) & (t["zero_stage"] >= 2)).any()
    rng = np.random.default_rng(11)
    for i in rng.choice(len(t), size=40, replace=False):
        row = t.iloc[int(i)]
        p = P.predict(SMALL, layout_of(row), timeline=False)
        assert row["step_time_s"] == pytest.approx(p.step_time_s, rel=1e-9)
        for c in CATEGORIES:
            assert row[f"{c}_s"] == pytest.approx(p.breakdown_s[c], rel=1e-9, abs=1e-12 * p.step_time_s)
        assert row["peak_mem_gib"] == pytest.approx(p.memory_gib, rel=1e-12)


def test_operator_table_lists_the_moe_calls():
    """Every MoE call appears in the operator table (router, permutations, experts, all-to-all, edp reductions);
    with ep = dp the expert-data-parallel group is one rank and has no reduction."""
    P = get_predictor("dgx-h100")
    assert "reducescatter[edp]" not in {r[4] for r in P.predict(SMALL, Layout(
        num_gpus=16, pp=2, dp=8, ep=8, micro_batch=1, global_batch=64, seq_len=2048, zero_stage=1)).op_rows}
    L = Layout(num_gpus=16, pp=2, dp=8, ep=4, micro_batch=1, global_batch=64, seq_len=2048, zero_stage=1)
    p = P.predict(SMALL, L)
    ops = {r[4] for r in p.op_rows}
    assert {"moe_router", "moe_permute", "moe_unpermute", "alltoall[ep]", "reducescatter[edp]"} <= ops
    a2a = sum(r[9] for r in p.op_rows if r[4] == "alltoall[ep]" and r[0] == 0)
    assert a2a > 0


@pytest.mark.parametrize("kw,field", [
    (dict(num_experts=8), "top_k"), (dict(num_experts=8, top_k=9), "top_k"), (dict(top_k=2), "top_k"),
    (dict(num_experts=1, top_k=1), "num_experts"), (dict(num_experts=8, top_k=2, dense_layers=4), "dense_layers"),
    (dict(num_experts=8, top_k=2, capacity_factor=0.0), "capacity_factor"),
    (dict(num_experts=8, top_k=2, moe_imbalance=0.5), "moe_imbalance")])
def test_bad_moe_model_names_the_field(kw, field):
    with pytest.raises(InfeasibleConfig) as e:
        ModelSpec("x", "llama", 4, 512, 8, **kw).validate()
    assert e.value.field == field and e.value.fix


@pytest.mark.parametrize("kw,field", [
    (dict(ep=3), "ep"), (dict(ep=16, dp=8, num_gpus=8), "ep"), (dict(tp=2, dp=4, ep=2), "sequence_parallel"),
    (dict(ep=2, zero_stage=3, framework="fsdp"), "zero_stage")])
def test_bad_ep_names_the_field(kw, field):
    m = ModelSpec("x", "llama", 4, 512, 8, num_experts=16, top_k=2)
    L = Layout(**{"num_gpus": 8, "dp": 8, "global_batch": 16, **kw})
    with pytest.raises(InfeasibleConfig) as e:
        L.validate(m)
    assert e.value.field == field and e.value.fix
    with pytest.raises(InfeasibleConfig) as e:
        Layout(num_gpus=8, dp=8, ep=2, global_batch=16).validate(get_preset("llama3-8b"))
    assert e.value.field == "ep"


def test_the_routing_note_says_how_experts_are_split_over_tp():
    """With tp > 1 a MoE prediction says its expert tensor parallelism and where it comes from: unset, Megatron-Core's
    default (expert TP = TP); given as 1, experts whole on each rank; with tp 1 there is nothing to say."""
    from predictor.model.moe import routing_note
    from predictor.model.presets import get_preset
    from predictor.model.specs import Layout
    m = get_preset("mixtral-8x7b")
    kw = dict(num_gpus=16, tp=2, dp=8, global_batch=16, seq_len=4096, sequence_parallel=True)
    unset = routing_note(m, Layout(**kw, ep=4))
    whole = routing_note(m, Layout(**kw, ep=8, etp=1))
    one = routing_note(m, Layout(num_gpus=8, dp=8, ep=8, global_batch=8, seq_len=4096))
    assert "Expert tensor parallelism 2 (unset: the megatron default)" in unset
    assert "Experts whole on each rank (expert tensor parallelism 1, as given)" in whole and "tp 2" in whole
    assert "xpert tensor parallelism" not in one

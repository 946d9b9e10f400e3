"""The hybridep dispatcher (Layout.moe_dispatcher "hybridep": Megatron-Core's flex dispatcher with the HybridEP
backend, megatron/core/transformer/moe/fused_a2a.py): its permutations inside the dispatch / combine kernels, each
token sent once per destination rank (checked against a simulation of random top-k routing), its own communication
buffer in place of the all-to-all's NCCL peers, refusals by name, and the search wiring."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from predictor.cli.main import main
from predictor.model import moe as moe_
from predictor.model.errors import InfeasibleConfig
from predictor.model.specs import Layout, ModelSpec
from predictor.step import decompose as D
from predictor.step import memory as mem

# 64 experts top-4 over ep 8 (8 local experts), hidden 1024, balanced routing so that the busiest rank is the mean
M = ModelSpec(name="hyb-moe", arch="llama", num_layers=4, hidden_size=1024, num_heads=8, ffn_hidden_size=4096,
              vocab_size=32000, num_experts=64, top_k=4, moe_ffn_hidden=512, moe_imbalance=1.0,
              attention_impl="flash")
MB, SEQ, EP = 2, 2048, 8
T = MB * SEQ


def _layout(**kw) -> Layout:
    base = dict(num_gpus=8, dp=8, ep=EP, etp=1, micro_batch=MB, global_batch=16, seq_len=SEQ, zero_stage=1)
    return Layout(**{**base, **kw})


def _unit(dispatcher: str):
    return D.layer_unit(M, 1, MB, SEQ, False, "none", "bf16", D.topology(8, 1, 1, 1, "tp"), ep=EP,
                        ep_topo=D.ep_topology(8, EP, 1), etp=1, etp_topo=D.etp_topology(8, 1),
                        dispatcher=dispatcher, dispatch_topo=D.tp_ep_topology(8, EP, 1))


def test_expected_distinct_ranks_matches_a_simulation_of_random_top_k_routing():
    """E[ranks a token reaches] = ep x (1 - C(E - E/ep, k) / C(E, k)), against 200,000 simulated tokens each drawing
    top_k distinct experts uniformly (experts e // (E / ep) on rank e // (E / ep))."""
    rng = np.random.default_rng(7)
    for experts, k, ep in ((64, 4, 8), (128, 8, 8), (256, 8, 64), (128, 8, 32)):
        draws = np.argsort(rng.random((200_000, experts)), axis=1)[:, :k]
        ranks = draws // (experts // ep)
        simulated = np.mean([len(set(r)) for r in ranks[:20_000]])
        assert moe_.expected_distinct_ranks(k, experts, ep) == pytest.approx(simulated, rel=0.01)
    assert moe_.expected_distinct_ranks(8, 128, 1) == 1.0
    # every expert on its own rank: a token reaches exactly top_k ranks (nothing to deduplicate)
    assert moe_.expected_distinct_ranks(4, 64, 64) == pytest.approx(4.0)


def test_hybridep_sends_each_token_once_per_rank_and_runs_no_permute_kernels():
    r_a = moe_.routing(M, MB, SEQ, 1, 1, EP, False, 1, "alltoall")
    r_h = moe_.routing(M, MB, SEQ, 1, 1, EP, False, 1, "hybridep")
    assert r_a.sent_rows == T * 4 and r_a.permutes == 2
    distinct = EP * (1 - math.comb(56, 4) / math.comb(64, 4))
    assert r_h.sent_rows == math.ceil(T * distinct) and r_h.permutes == 0
    # the experts compute the same rows either way
    assert (r_h.rows_per_expert, r_h.local_experts, r_h.imbalance) == (r_a.rows_per_expert, r_a.local_experts,
                                                                     r_a.imbalance)
    ua, uh = _unit("alltoall"), _unit("hybridep")
    ops_a = {c.op for c in ua.ops if c.phase == "fwd"}
    ops_h = {c.op for c in uh.ops if c.phase == "fwd"}
    assert {"moe_permute", "moe_unpermute"} <= ops_a
    assert not ops_h & {"moe_permute", "moe_unpermute"}
    a2a_a = [c for c in ua.comms if c.collective == "alltoall" and c.phase == "fwd"]
    a2a_h = [c for c in uh.comms if c.collective == "alltoall" and c.phase == "fwd"]
    assert len(a2a_a) == len(a2a_h) == 1 and a2a_a[0].count == a2a_h[0].count == 2
    assert a2a_a[0].message_bytes == T * 4 * 1024 * 2
    assert a2a_h[0].message_bytes == math.ceil(T * distinct) * 1024 * 2


def test_hybridep_memory_has_its_buffer_in_place_of_the_all_to_all_peers():
    a = mem.estimate_memory(M, _layout()).stages[0]
    h = mem.estimate_memory(M, _layout(moe_dispatcher="hybridep")).stages[0]
    buf = T * EP * (2 * 1024 + 4 * 64)
    assert mem.hybridep_buffer_bytes(M, T, EP) == buf
    # 8 GPUs in one node (the default comm): 7 NCCL peers of 447 MiB for the all-to-all
    assert a.nccl_bytes - h.nccl_bytes == pytest.approx(7 * 447 * 2**20 - buf)
    assert h.states_bytes == a.states_bytes
    assert mem.hybridep_buffer_bytes(M, T, 1) == 0.0


@pytest.mark.parametrize("kw, model, field, words", [
    (dict(moe_dispatcher="hybridep", etp=2, num_gpus=16, dp=16, global_batch=32), M, "etp", "hybridep"),
    (dict(moe_dispatcher="hybridep"), dataclasses.replace(M, capacity_factor=1.25), "moe_dispatcher",
     "capacity factor"),
    (dict(moe_dispatcher="deepep"), M, "moe_dispatcher", "DeepEP"),
    (dict(moe_dispatcher="flex"), M, "moe_dispatcher", "hybridep"),
])
def test_bad_hybridep_settings_are_refused_by_name(kw, model, field, words):
    with pytest.raises(InfeasibleConfig) as e:
        _layout(**kw).validate(model)
    assert e.value.field == field and words in str(e.value) and e.value.fix


def test_hybridep_runs_with_the_dispatch_combine_overlap_and_the_cli_takes_it(capsys):
    _layout(moe_dispatcher="hybridep", moe_overlap=True).validate(M)
    base = ["predict", "--platform", "gb200-nvl72", "--model", "qwen3-30b-a3b", "--num-gpus", "8", "--ep", "8",
            "--etp", "1", "--global-batch", "64", "--micro-batch", "4", "--seq-len", "4096", "--precision", "mxfp8",
            "--json", "--allow-oom"]
    assert main([*base, "--moe-dispatcher", "hybridep"]) == 0
    out = capsys.readouterr().out
    assert '"moe_dispatcher": "hybridep"' in out and "HybridEP" in out
    assert main([*base, "--moe-dispatcher", "hybridep", "--moe-overlap"]) == 0
    capsys.readouterr()


def test_search_with_hybridep_keeps_experts_whole_and_agrees_with_predict():
    from predictor.plan.predict import get_predictor
    from predictor.plan.search import SearchSpace, layout_of, search
    P = get_predictor("gb200-nvl72")
    rep = search(M, P, 16, 64, SEQ, top_k=1, refine=False,
                 space=SearchSpace(tp=(1, 2), pp=(1,), ep=(8,), micro_batch=(2,), zero_stage=(1,),
                                   recompute=("none",), moe_overlap=(False, True), moe_dispatcher="hybridep"))
    t = rep.table
    assert len(t) and set(t["moe_dispatcher"]) == {"hybridep"} and set(t["etp"].astype(int)) == {1}
    assert t["moe_overlap"].any()
    for _, row in t.iterrows():
        L = layout_of(row)
        p = P.predict(M, L, timeline=False)
        assert row["step_time_s"] == pytest.approx(p.step_time_s, rel=1e-9)
        assert row["peak_mem_gib"] == pytest.approx(p.memory_gib, rel=1e-12)

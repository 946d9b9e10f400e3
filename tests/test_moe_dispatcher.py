"""The MoE token dispatcher (Layout.moe_dispatcher): Megatron-Core's allgather dispatcher against hand-computed
collective sizes and tensor bytes (MoEAllGatherTokenDispatcher, megatron/core/transformer/moe/token_dispatcher.py),
the default left alltoall, refusals by name, and the CLI, batch and search wiring."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from predictor.cli.main import main
from predictor.model import moe as moe_
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import layout_from_fields
from predictor.model.presets import get_preset
from predictor.model.specs import Layout, ModelSpec
from predictor.step import decompose as D
from predictor.step import memory as mem

# the Megatron-LM functional test's model (tests/functional_tests/test_cases/moe/gpt3_mcore_te_tp2_pp1_te_8experts_
# etp1_ep4): 12 layers, hidden 512, 8 heads, 8 experts top-2 of width 2048; routing balanced (imbalance 1) so that the
# busiest rank's rows are exactly the mean, T x top_k
FT = ModelSpec(name="ft-moe", arch="gpt", num_layers=12, hidden_size=512, num_heads=8, ffn_hidden_size=2048,
               vocab_size=50257, num_experts=8, top_k=2, moe_imbalance=1.0, attention_impl="flash")
H, E, K = 512, 8, 2
MB, SEQ, TP = 4, 1024, 2
T = MB * SEQ // TP                  # 2048 tokens per rank (sequence parallel)


def _ft(**kw) -> Layout:
    base = dict(num_gpus=8, tp=2, dp=4, ep=4, etp=1, micro_batch=4, global_batch=32, seq_len=1024,
                sequence_parallel=True, zero_stage=0)
    return Layout(**{**base, **kw})


def _unit(dispatcher: str, ep: int = 4, etp: int = 1):
    return D.layer_unit(FT, TP, MB, SEQ, True, "none", "bf16", D.topology(8, TP, 1, 1, "tp"), ep=ep,
                        ep_topo=D.ep_topology(8, ep, etp), etp=etp, etp_topo=D.etp_topology(8, etp),
                        dispatcher=dispatcher, dispatch_topo=D.tp_ep_topology(8, ep, etp))


# ---- the default --------------------------------------------------------------------------------------------
def test_the_default_is_the_alltoall_dispatcher_everywhere():
    """An unset dispatcher is alltoall (what every prediction before this field assumed): the Layout field, an empty
    predict-batch cell, and a layer built without naming it all equal the alltoall one."""
    assert Layout(num_gpus=1).moe_dispatcher == "alltoall"
    fields = dict(_ft().__dict__)
    fields["moe_dispatcher"] = ""
    assert layout_from_fields({k: "" if v is None else v for k, v in fields.items()}).moe_dispatcher == "alltoall"
    plain = D.layer_unit(FT, TP, MB, SEQ, True, "none", "bf16", D.topology(8, TP, 1, 1, "tp"), ep=4,
                         ep_topo=D.ep_topology(8, 4))
    assert plain == _unit("alltoall")
    assert moe_.routing(FT, MB, SEQ, TP, 1, 4, True) == moe_.routing(FT, MB, SEQ, TP, 1, 4, True, 1, "alltoall")
    a = mem.estimate_memory(FT, _ft())
    b = mem.estimate_memory(FT, _ft(moe_dispatcher="alltoall"))
    assert a.stages[0].allocated_bytes == b.stages[0].allocated_bytes


# ---- time: the collectives and the permutation ----------------------------------------------------------------
def test_allgather_gathers_map_probs_and_hidden_over_etp_x_ep_and_reduce_scatters_back():
    """token_permutation all-gathers over tp_ep_group (etp x ep = 4 ranks) the bool routing map [T, E], the
    probabilities [T, E] (bf16: the router's dtype follows its input) and the hidden states [T, h]; token_unpermutation
    reduce-scatters [4T, h] back. The backward: the same sizes (reduce-scatters of the gathered tensors' gradients, an
    all-gather of the output's), without the map (gathered under torch.no_grad)."""
    u = _unit("allgather")
    G = 4
    fwd = sorted((c.collective, c.message_bytes, c.ranks) for c in u.comms if c.group == "ep" and c.phase == "fwd")
    assert fwd == sorted([("allgather", G * T * E, G), ("allgather", G * T * E * 2, G),
                          ("allgather", G * T * H * 2, G), ("reducescatter", G * T * H * 2, G)])
    assert (G * T * E, G * T * H * 2) == (65_536, 8_388_608)
    bwd = sorted((c.collective, c.message_bytes) for c in u.comms if c.group == "ep" and c.phase == "bwd")
    assert bwd == sorted([("allgather", G * T * E * 2), ("allgather", G * T * H * 2),
                          ("reducescatter", G * T * H * 2)])
    assert not [c for c in u.comms if c.collective == "alltoall"]
    # the alltoall dispatcher of the same layer: its all-to-alls of the T x top_k rows, nothing gathered
    a2a = [c for c in _unit("alltoall").comms if c.group == "ep" and c.phase == "fwd"]
    assert [(c.collective, c.message_bytes, c.count) for c in a2a] == [("alltoall", T * K * H * 2, 2)]


def test_allgather_group_is_etp_x_ep_consecutive_ranks():
    """With etp 2 x ep 2 the gather spans the same 4 ranks (tp_ep_group: etp fastest, then ep); each rank's local
    experts compute the rows the alltoall dispatcher gives them after its etp all-gather, etp x T x top_k x
    imbalance (1 here) rows over its num_experts / ep experts."""
    u = _unit("allgather", ep=2, etp=2)
    hidden = [c for c in u.comms if c.group == "ep" and c.phase == "fwd" and c.message_bytes == 4 * T * H * 2]
    assert len(hidden) == 2 and {c.ranks for c in hidden} == {4}
    assert D.tp_ep_topology(8, 4, 2) == (8, 1, 8) and D.tp_ep_topology(16, 8, 4) == (32, 2, 16)
    r_ag = moe_.routing(FT, MB, SEQ, TP, 1, 2, True, 2, "allgather")
    r_a2a = moe_.routing(FT, MB, SEQ, TP, 1, 2, True, 2, "alltoall")
    assert r_ag.rows_per_expert == r_a2a.rows_per_expert == 2 * T * K // 4   # etp x T x k over 4 local experts
    assert (r_ag.permutes, r_a2a.permutes, r_ag.gathered_rows) == (1, 2, 4 * T)


def test_allgather_permutes_the_local_rows_once_and_zero_fills_the_gathered_tensor():
    """One permutation (index_select) of the R = T x top_k local rows (imbalance 1, etp 1), one un-permutation
    (scatter-add) of them, and the zero fill of the [G T, h] tensor it scatters into: half a moe_permute pass
    (2 elements per element) over G T rows."""
    u = _unit("allgather")
    col = {c: i for i, c in enumerate(D.SHAPE_COLUMNS)}
    perm = sorted((c.shape[col["seq"]], c.count) for c in u.ops if c.op == "moe_permute" and c.phase == "fwd")
    assert perm == sorted([(T * K, 1), (4 * T, 0.5)])
    unperm = [(c.shape[col["seq"]], c.count) for c in u.ops if c.op == "moe_unpermute" and c.phase == "fwd"]
    assert unperm == [(T * K, 1)]
    # the experts' GEMMs are the alltoall dispatcher's
    exp = lambda x: [c for c in x.ops if c.part == "experts"]  # noqa: E731
    assert exp(u) == exp(_unit("alltoall"))


def test_allgather_without_expert_parallelism_gathers_nothing():
    """etp x ep = 1 (tp 2, etp 1, ep 1): `if self.tp_size > 1 or self.ep_size > 1` is false, no collective; the layer
    is the alltoall dispatcher's."""
    assert moe_.routing(FT, MB, SEQ, TP, 1, 1, True, 1, "allgather").gathered_rows == 0
    a, b = _unit("allgather", ep=1), _unit("alltoall", ep=1)
    assert a.ops == b.ops and a.comms == b.comms


def test_allgather_moves_its_bytes_into_the_ep_category_of_a_prediction():
    from predictor.plan.predict import get_predictor
    P = get_predictor("dgx-h100")
    a = P.predict(FT, _ft(), timeline=False)
    g = P.predict(FT, _ft(moe_dispatcher="allgather"), timeline=False)
    assert g.breakdown_s["ep_comm"] > a.breakdown_s["ep_comm"] > 0
    note = moe_.routing_note(FT, _ft(moe_dispatcher="allgather"))
    assert "allgather token dispatcher: the 2,048 tokens of each of the 4 etp x ep ranks all-gathered" in note
    assert "allgather" not in moe_.routing_note(FT, _ft())


# ---- memory ---------------------------------------------------------------------------------------------------
def test_allgather_saved_tensors_are_the_local_row_indices_and_the_masked_select():
    """Saved per layer and micro-batch besides the experts' rows (equal for both): alltoall keeps the int64 indices
    of its T x top_k permuted rows; allgather those of its R local rows (here R = T x top_k) and the masked_select of
    the local experts' probabilities, [2 local experts, 4T] bf16 values and a bool mask."""
    s = SEQ
    ag = mem.activation_terms(FT, s, MB, TP, moe=True, ep=4, sequence_parallel=True, dispatcher="allgather")
    aa = mem.activation_terms(FT, s, MB, TP, moe=True, ep=4, sequence_parallel=True, dispatcher="alltoall")
    R, G, local = T * K, 4 * T, E // 4
    assert ag["sharded"] - aa["sharded"] == pytest.approx(8 * R + G * local * (2 + 1) - 8 * T * K, abs=1e-6)
    assert ag["sharded"] - aa["sharded"] == 49_152


def test_allgather_buffers_the_gathered_tensor_and_the_global_memory_buffer():
    """Transient: the zeroed [G T, h] tensor of the un-permutation (in the backward the gathered gradients) beside the
    R local rows' gradient, (G T + R) h e; alltoall: the T x top_k rows sent and the R received. Persistent: the
    hidden states gathered into Megatron's global memory buffer ('mpu'), G T h e, held once."""
    R, G = T * K, 4 * T
    ag = mem.moe_dispatch_buffer_bytes(FT, SEQ, MB, TP, True, "bf16", 1, 4, 1, "allgather")
    aa = mem.moe_dispatch_buffer_bytes(FT, SEQ, MB, TP, True, "bf16", 1, 4, 1, "alltoall")
    assert (ag, aa) == ((G + R) * H * 2, (T * K + R) * H * 2) == (12_582_912, 8_388_608)
    # the whole stage: 12 layers x one micro-batch in flight (pp 1) of saved tensors, the transient's difference and
    # the global buffer (Transformer Engine: nothing else in it)
    a = mem.estimate_memory(FT, _ft()).stages[0]
    g = mem.estimate_memory(FT, _ft(moe_dispatcher="allgather")).stages[0]
    assert g.activations_bytes - a.activations_bytes == pytest.approx(12 * 49_152, abs=1e-3)
    assert g.buffers_bytes - a.buffers_bytes == pytest.approx((ag - aa) + G * H * 2, abs=1e-3)
    assert g.states_bytes == a.states_bytes
    # under the local transformer implementation the buffer is shared: the largest tensor asked of it
    opts = mem.MemoryOptions(transformer_impl="local")
    gb = mem.global_buffer_bytes(FT, SEQ, np.array([MB]), np.array([TP]), np.array([1]), "bf16", opts,
                                 np.array([G]))
    assert gb[0] == max(SEQ * MB * H * 2, G * H * 2) == G * H * 2


# ---- refusals -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, model, words", [
    (dict(moe_dispatcher="ring"), FT, "unknown MoE token dispatcher 'ring'"),
    (dict(moe_dispatcher="flex"), FT, "DeepEP"),
    (dict(moe_dispatcher="allgather", moe_overlap=True), FT, "alltoall dispatcher only"),
    (dict(moe_dispatcher="allgather"), dataclasses.replace(FT, capacity_factor=1.25), "capacity factor"),
])
def test_bad_dispatcher_settings_are_refused_by_name(kw, model, words):
    with pytest.raises(InfeasibleConfig) as e:
        _ft(**kw).validate(model)
    assert e.value.field == "moe_dispatcher" and words in str(e.value) and e.value.fix


def test_allgather_on_a_dense_model_and_an_unknown_one_without_a_model_are_refused():
    with pytest.raises(InfeasibleConfig) as e:
        Layout(num_gpus=2, tp=2, global_batch=2, sequence_parallel=True,
               moe_dispatcher="allgather").validate(get_preset("llama3-8b"))
    assert e.value.field == "moe_dispatcher" and "dense" in str(e.value) and "alltoall" in e.value.fix
    with pytest.raises(InfeasibleConfig) as e:
        Layout(num_gpus=1, moe_dispatcher="all-gather").validate()
    assert e.value.field == "moe_dispatcher"


# ---- wiring -------------------------------------------------------------------------------------------------
def test_the_cli_and_the_batch_column_take_the_dispatcher(capsys):
    base = ["predict", "--platform", "dgx-h100", "--model", "qwen3-30b-a3b", "--num-gpus", "16", "--tp", "2",
            "--sequence-parallel", "--ep", "8", "--etp", "1", "--global-batch", "16", "--seq-len", "4096", "--json",
            "--allow-oom"]
    assert main([*base, "--moe-dispatcher", "allgather"]) == 0
    assert '"moe_dispatcher": "allgather"' in capsys.readouterr().out
    assert main([*base, "--moe-dispatcher", "allgather", "--moe-overlap"]) == 2
    err = capsys.readouterr().err
    assert "moe_dispatcher" in err and "moe_overlap" in err
    fields = {k: "" if v is None else v for k, v in _ft().__dict__.items()}
    assert layout_from_fields({**fields, "moe_dispatcher": "allgather"}).moe_dispatcher == "allgather"


def test_search_keeps_the_dispatcher_fixed_and_agrees_with_predict():
    """The dispatcher is a fixed input of search (every layout gets it; the overlap is never tried with allgather);
    a row's step time and memory equal a single prediction of its layout."""
    from predictor.plan.predict import get_predictor
    from predictor.plan.search import SearchSpace, layout_of, search
    P = get_predictor("dgx-h100")
    rep = search(FT, P, 8, 32, 1024, top_k=1, refine=False,
                 space=SearchSpace(tp=(2,), pp=(1,), ep=(2, 4), etp=(1,), micro_batch=(4,), zero_stage=(0,),
                                   recompute=("none",), moe_overlap=(False, True), moe_dispatcher="allgather"))
    t = rep.table
    assert len(t) and set(t["moe_dispatcher"]) == {"allgather"} and not t["moe_overlap"].any()
    for _, row in t.iterrows():
        L = layout_of(row)
        assert L.moe_dispatcher == "allgather"
        p = P.predict(FT, L, timeline=False)
        assert row["step_time_s"] == pytest.approx(p.step_time_s, rel=1e-9)
        assert row["peak_mem_gib"] == pytest.approx(p.memory_gib, rel=1e-12)
    with pytest.raises(InfeasibleConfig) as e:
        search(dataclasses.replace(FT, capacity_factor=1.25), P, 8, 32, 1024, top_k=1, refine=False,
               space=SearchSpace(tp=(2,), pp=(1,), moe_dispatcher="allgather"))
    assert e.value.field == "moe_dispatcher"

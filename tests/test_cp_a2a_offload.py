"""All-to-all context parallelism (Layout.cp_comm a2a / a2a+p2p, DeepSpeed-Ulysses) and activation offloading
(Layout.offload_activations, Megatron-Core cpu_offloading): validation, communication volume, attention work,
critical-path exposure, memory, the published runs whose recipes offload, search and the batch columns."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictor.checks import independent_nemo
from predictor.hardware.platforms import get_platform
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import layout_from_fields, model_from_fields
from predictor.model.ops import SHAPE_COLUMNS
from predictor.model.presets import get_preset
from predictor.model.specs import BYTES_PER_ELEMENT, Layout, ModelSpec
from predictor.plan.predict import PER_MICRO_BATCH, get_predictor
from predictor.plan.search import SearchSpace, search
from predictor.regress import features
from predictor.step import decompose as D
from predictor.step import memory as mem
from predictor.step.memory import MemoryOptions, estimate_memory

MHA = ModelSpec(name="mha-test", arch="llama", num_layers=8, hidden_size=4096, num_heads=32, num_kv_heads=32,
                ffn_hidden_size=11008, vocab_size=32000)


def _ulysses(cp: int, seq: int = 32768, b: int = 1, model: ModelSpec = MHA) -> D.Unit:
    return D.layer_unit(model, 1, b, seq, False, "none", "bf16", (1, 1, 1), cp, (1, 1, 1), cp_a2a=cp,
                        a2a_topo=D.topology(8, 1, cp, 1, "cp"))


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_ulysses_forward_volume_is_4Nh_over_P_and_the_ring_s_is_2Nh_P_minus_1_over_P(cp):
    """DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509, section 3.2): the all-to-alls of Q, K, V and the output
    move an aggregate 4Nh / P per GPU (N tokens, h hidden, P ranks), falling with P; Megatron-Core's ring sends its K/V
    block to the next rank P - 1 times, 2Nh (P - 1) / P, which does not fall with P."""
    seq, b, e = 32768, 1, BYTES_PER_ELEMENT["bf16"]
    N, h = seq * b, MHA.hidden_size
    a2a = [c for c in _ulysses(cp, seq, b).comms if c.collective == "alltoall" and c.phase == "fwd"]
    assert {c.group for c in a2a} == {"cp"}
    assert sum(c.message_bytes * c.count for c in a2a) == 4 * N * h // cp * e
    ring = D.cp_comms(MHA, 1, b, seq, "bf16", cp, (cp, 1, cp), "none")
    fwd = sum(c.message_bytes * c.count for c in ring if c.phase == "fwd")
    assert fwd == 2 * N * h * (cp - 1) // cp * e


def _attention_flops(unit: D.Unit, phase: str = "fwd") -> float:
    tot = 0.0
    for c in unit.ops:
        if c.op == "flash_attn" and c.phase == phase:
            f, _ = features.op_work(c.op, pd.DataFrame([c.shape], columns=list(SHAPE_COLUMNS)), "bf16")
            tot += float(np.asarray(f)[0]) * c.count
    return tot


def test_ulysses_attention_runs_the_full_sequence_on_heads_over_cp_with_the_ring_s_work():
    m = get_preset("llama3-8b")
    ring = D.layer_unit(m, 1, 1, 32768, False, "none", "bf16", (1, 1, 1), 8, (8, 1, 8))
    uly = _ulysses(8, model=m)
    calls = [c for c in uly.ops if c.op == "flash_attn" and c.phase == "fwd"]
    assert len(calls) == 1 and calls[0].count == 1
    sh = dict(zip(SHAPE_COLUMNS, calls[0].shape))
    assert sh["seq"] == 32768 and sh["tp"] == 8          # full sequence, heads over tp x cp
    assert _attention_flops(uly) == pytest.approx(_attention_flops(ring), rel=1e-12)
    # every other operator still sees seq / cp tokens
    other = {c.op: dict(zip(SHAPE_COLUMNS, c.shape))["seq"] for c in uly.ops if c.op == "qkv_proj"}
    assert other == {"qkv_proj": 32768 // 8}


def test_a2a_p2p_with_groups_of_one_is_the_ring_exactly():
    P = get_predictor("dgx-h100")
    m = get_preset("llama3-8b")
    kw = dict(num_gpus=16, tp=1, cp=8, dp=2, global_batch=16, seq_len=32768)
    a = P.predict(m, Layout(**kw), timeline=False)
    b = P.predict(m, Layout(**kw, cp_comm="a2a+p2p", cp_a2a_size=1), timeline=False)
    assert a.step_time_s == b.step_time_s and a.breakdown_s == b.breakdown_s


def test_the_all_to_alls_are_on_the_critical_path_whole():
    P = get_predictor("dgx-h100")
    m = get_preset("llama3-8b")
    L = Layout(num_gpus=16, tp=1, cp=8, dp=2, global_batch=16, seq_len=32768, cp_comm="a2a")
    p = P.predict(m, L)
    a2a = sum(r[9] for r in p.op_rows if r[4] == "alltoall[cp]" and r[12] == PER_MICRO_BATCH)
    assert a2a > 0
    assert p.breakdown_s["cp_comm"] == pytest.approx(a2a * L.num_micro_batches, rel=1e-9)


def test_cp_groups_topology():
    m = get_preset("llama3-8b")
    assert D.cp_a2a_ranks(m, 1, 8, "a2a", None, 8) == 8
    assert D.cp_a2a_ranks(m, 2, 8, "a2a+p2p", None, 8) == 4          # the cp ranks of a node, heads dividing
    assert D.cp_a2a_ranks(m, 1, 8, "p2p", None, 8) == 1
    ring, a2a = D.cp_topologies(8, 2, 8, 4)
    assert a2a == (4, 1, 4) and ring == (2, 2, 1)                     # a2a in the node, the ring across nodes
    assert D.cp_topologies(8, 1, 8, 1) == (D.topology(8, 1, 8, 1, "cp"), (1, 1, 1))


@pytest.mark.parametrize("kw, field", [
    (dict(cp=1, cp_comm="a2a"), "cp_comm"),
    (dict(cp=2, cp_comm="ring"), "cp_comm"),
    (dict(cp=4, cp_comm="a2a+p2p", cp_a2a_size=3), "cp_a2a_size"),
    (dict(cp=4, cp_comm="a2a", cp_a2a_size=2), "cp_a2a_size"),
    (dict(cp=16, cp_comm="a2a"), "cp_comm"),                            # 8 kv heads over 16 ranks (GQA)
    (dict(cp=8, tp=2, cp_comm="a2a"), "cp_comm"),                       # 4 kv heads per tp rank over 8
    (dict(offload_activations=-1), "offload_activations"),
    (dict(offload_activations=32), "offload_activations"),              # all 32 layers of llama3-8b
    (dict(offload_activations=4, recompute="full"), "offload_activations"),
    (dict(offload_activations=4, pp=2), "offload_activations"),
])
def test_bad_input_names_the_field(kw, field):
    m = get_preset("llama3-8b")
    base = dict(tp=1, pp=1, cp=1, seq_len=65536, global_batch=2)
    base.update(kw)
    base["num_gpus"] = base["tp"] * base["pp"] * base["cp"] * 2
    base["dp"] = 2
    with pytest.raises(InfeasibleConfig) as e:
        Layout(**base).validate(m)
    assert e.value.field == field and e.value.fix


def test_offload_memory_moves_the_offloaded_layers_to_the_host():
    m = get_preset("llama3-70b")
    dev = get_platform("gb200-nvl72")
    kw = dict(num_gpus=64, dp=64, micro_batch=2, global_batch=256, seq_len=8192, zero_stage=3, precision="fp8")
    base, off = (estimate_memory(m, Layout(**kw, offload_activations=n), dev) for n in (0, 40))
    layer = mem.activation_bytes_per_layer(m, 8192, 2, 1, False, "none", "fp8", MemoryOptions())
    b, o = base.peak, off.peak
    assert b.offloaded_bytes == 0
    assert o.offloaded_bytes == pytest.approx(40 * layer, rel=1e-12)       # pp = 1: one micro-batch in flight
    assert b.activations_bytes - o.activations_bytes == pytest.approx(40 * layer, rel=1e-12)
    assert o.buffers_bytes - b.buffers_bytes == pytest.approx(layer, rel=1e-12)   # the copy in flight


def test_offload_time_is_the_copy_beyond_the_neighbouring_layer_s_compute():
    P = get_predictor("dgx-h100")
    m = get_preset("llama3-8b")
    L = Layout(num_gpus=8, dp=8, micro_batch=2, global_batch=32, seq_len=8192, offload_activations=20)
    p = P.predict(m, L, timeline=False)
    layer = mem.activation_bytes_per_layer(m, 8192, 2, 1, False, "none", "bf16", MemoryOptions())
    t = layer / (P.platform.device.host_link_gbps * 1e9)
    from predictor.step.engine import unit_key
    u = P.engine._parts[(m, 8192, "bf16", *unit_key(L, P.platform, m))].layer
    want = L.num_micro_batches * 20 * (max(0.0, t - u.fc) + max(0.0, t - u.bc))
    assert want > 0
    assert p.breakdown_s["offload_comm"] == pytest.approx(want, rel=1e-9)
    q = P.predict(m, L.__class__(**{**L.__dict__, "offload_activations": 0}), timeline=False)
    assert q.breakdown_s["offload_comm"] == 0.0
    assert p.step_time_s == pytest.approx(q.step_time_s + want, rel=1e-9)


def test_offload_needs_a_stated_host_link():
    P = get_predictor("mi300x-8")
    assert P.platform.device.host_link_gbps == 0
    with pytest.raises(InfeasibleConfig) as e:
        P.predict(get_preset("llama3-8b"), Layout(num_gpus=8, dp=8, global_batch=8, seq_len=4096,
                                                  offload_activations=4), timeline=False)
    assert e.value.field == "offload_activations"


def test_host_link_figures_follow_their_published_specs():
    """PCIe 5.0 x16: 32 GT/s x 16 lanes x 128/130 / 8 = 63.0 GB/s per direction (H100 datasheet: 128 GB/s both
    ways); PCIe 4.0 x16 half that; GH200 NVLink-C2C 900 GB/s both ways = 450 per direction."""
    gen5 = 32e9 * 16 * 128 / 130 / 8 / 1e9
    assert get_platform("dgx-h100").device.host_link_gbps == pytest.approx(gen5, rel=0.02)
    assert get_platform("dgx-a100-80gb").device.host_link_gbps == pytest.approx(gen5 / 2, rel=0.02)
    assert get_platform("vista-gh200").device.host_link_gbps == 900 / 2


def _recipe_run(model_name: str, system: str, release: str = "25.11") -> dict[str, str]:
    doc = independent_nemo.load()
    pr = independent_nemo.published_runs(doc, ["megatron-bridge"])
    r = pr.ok[(pr.ok["model"] == model_name) & (pr.ok["system"] == system) & (pr.ok["release"] == release)].iloc[0]
    rec, why = independent_nemo.predictable_record(independent_nemo.batch_row(r, doc["models"][r["model_key"]]))
    assert not why
    return rec


@pytest.mark.parametrize("system", ["DGX-GB200", "DGX-GB300"])
def test_published_llama3_70b_runs_that_offload_fit_with_their_recipe_s_offload(system):
    """Megatron-Bridge 25.11's Llama3 70B FP8-CS runs on 64 GB200 / GB300 (FSDP, micro-batch 2) trained with
    cpu_offloading_num_layers 40 / 20 (its llama3_workload_base_configs.py): without the offload the model says
    'does not fit', with it the run fits (tight allowed)."""
    rec = _recipe_run("LLAMA3_70B", system)
    assert rec["offload_activations"] == ("40" if system == "DGX-GB200" else "20")
    P = get_predictor(rec["platform"], memory_options=MemoryOptions(nccl_nvls_mib=independent_nemo.NO_NVLS_MIB))
    m = model_from_fields(rec)
    with_off = P.predict(m, layout_from_fields(rec), timeline=False)
    without = P.predict(m, layout_from_fields({**rec, "offload_activations": ""}), timeline=False)
    assert with_off.fits_memory and not without.fits_memory
    assert with_off.memory is not None and with_off.memory.peak.offloaded_bytes > 0


def test_search_tries_a2a_and_offload_only_when_asked():
    P = get_predictor("dgx-h100")
    m = get_preset("llama3-8b")
    kw = dict(global_batch=16, seq_len=32768, top_k=3)
    plain = search(m, P, 16, space=SearchSpace(cp=(8,), tp=(1,), zero_stage=(1,), recompute=("none",)), **kw)
    assert set(plain.table["cp_comm"]) == {"p2p"} and set(plain.table["offload_activations"]) == {0}
    both = search(m, P, 16, space=SearchSpace(cp=(8,), tp=(1,), zero_stage=(1,), recompute=("none", "full"),
                                              cp_comm=("p2p", "a2a"), offload_activations=(0, 8)), **kw)
    t = both.table
    assert set(t["cp_comm"]) == {"p2p", "a2a"}
    off = t[t["offload_activations"] > 0]
    assert len(off) and set(off["recompute"]) == {"none"} and set(off["pp"]) == {1}
    best = both.top[0]
    exact = P.predict(m, best.layout, timeline=False)
    assert exact.step_time_s == pytest.approx(best.step_time_s, rel=1e-6)


def test_batch_columns_parse():
    L = layout_from_fields({"num_gpus": 16, "cp": 8, "cp_comm": "A2A+P2P", "cp_a2a_size": "4",
                            "offload_activations": "3", "seq_len": 32768})
    assert (L.cp_comm, L.cp_a2a_size, L.offload_activations) == ("a2a+p2p", 4, 3)
    d = layout_from_fields({"num_gpus": 8})
    assert (d.cp_comm, d.cp_a2a_size, d.offload_activations) == ("p2p", None, 0)


@pytest.mark.parametrize("r", [-0.1, 1.0, float("nan")])
def test_a_memory_reserve_outside_0_1_is_refused(r):
    with pytest.raises(InfeasibleConfig) as e:
        MemoryOptions(allocator_reserve=r)
    assert e.value.field == "allocator_reserve"


def test_search_marks_a_layout_that_fits_only_with_offload():
    P = get_predictor("gb200-nvl72", memory_options=MemoryOptions(nccl_nvls_mib=0.0))
    space = SearchSpace(tp=(1,), pp=(1,), cp=(1,), zero_stage=(3,), recompute=("none",), micro_batch=(2,),
                        sequence_parallel=(False,), precision="fp8", fp8_param_gather=True, grad_reduce_in_fp32=False,
                        offload_activations=(0, 40))
    t = search(get_preset("llama3-70b"), P, 64, global_batch=256, seq_len=8192, space=space, top_k=1).table
    assert set(t["offload_activations"]) == {0, 40}
    assert not t.loc[t["offload_activations"] == 0, "fits"].any()
    marked = t[t["needs_offload"]]
    assert len(marked) and set(marked["offload_activations"]) == {40} and marked["fits"].all()


def test_predict_batch_takes_the_columns_and_returns_the_offload_time():
    from predictor.plan.batch import predict_records
    base = {"platform": "dgx-h100", "model": "llama3-8b", "num_gpus": "16", "cp": "8", "seq_len": "32768",
            "global_batch": "16", "zero_stage": "1"}
    out = predict_records([base, {**base, "cp_comm": "a2a"}, {**base, "cp": "1", "num_gpus": "8", "seq_len": "8192",
                                                             "offload_activations": "8"},
                           {**base, "cp_comm": "a2a", "cp_a2a_size": "2"}], allow_oom=True)
    assert not out[0]["error"] and not out[1]["error"] and not out[2]["error"]
    assert out[0]["step_time_s"] != out[1]["step_time_s"]
    assert out[0]["offload_comm_s"] == 0 and out[2]["offload_comm_s"] > 0
    assert "cp_a2a_size" in out[3]["error"]


def test_search_leaves_offload_out_where_the_device_has_no_host_link():
    rep = search(get_preset("llama3-8b"), get_predictor("mi300x-8"), 8, global_batch=16, seq_len=4096, top_k=1,
                 space=SearchSpace(tp=(1,), pp=(1,), zero_stage=(1,), offload_activations=(0, 4)))
    assert set(rep.table["offload_activations"]) == {0}
    assert any("host-link" in e["reason"] for e in rep.exclusions)

"""The parts of device memory outside the allocated tensors (predictor.step.memory): the caching allocator's reserve,
NCCL communicator buffers and the CUDA context, so that the total is what nvidia-smi shows."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from predictor.hardware.platforms import get_platform
from predictor.model.errors import InfeasibleConfig
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.step import memory as mem
from predictor.step.memory import GIB, DeviceComm, MemoryOptions, estimate_memory, nccl_buffer_arrays

LAYOUT = dict(num_gpus=8, tp=2, dp=4, micro_batch=1, global_batch=64, seq_len=4096, sequence_parallel=True,
              zero_stage=1, recompute="selective")


def test_total_is_allocated_plus_allocator_reserve_plus_nccl_plus_context():
    opts = MemoryOptions()
    pk = estimate_memory(get_preset("llama3-8b"), Layout(**LAYOUT), get_platform("dgx-h100"), opts).peak
    allocated = pk.weights_bytes + pk.grads_bytes + pk.optimizer_bytes + pk.activations_bytes + pk.buffers_bytes
    assert pk.allocated_bytes == pytest.approx(allocated)
    assert pk.allocator_bytes == pytest.approx(opts.allocator_overhead * allocated)
    assert pk.reserved_bytes == pytest.approx(allocated * (1 + opts.allocator_overhead))
    assert pk.framework_bytes == pytest.approx(opts.framework_gib * GIB)
    assert pk.total_bytes == pytest.approx(pk.reserved_bytes + pk.framework_bytes + pk.nccl_bytes)
    assert pk.nccl_bytes > 0


def test_the_allocated_view_drops_every_overhead():
    m, lay, plat = get_preset("llama3-8b"), Layout(**LAYOUT), get_platform("dgx-h100")
    full = estimate_memory(m, lay, plat).peak
    bare = estimate_memory(m, lay, plat, MemoryOptions(device_overheads=False)).peak
    assert bare.nccl_bytes == bare.allocator_bytes == bare.framework_bytes == 0
    assert bare.total_bytes == pytest.approx(full.allocated_bytes)


def test_a_cpu_platform_has_no_nccl_context_or_allocator_reserve():
    m = replace(get_preset("llama3-8b"), num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=4,
                ffn_hidden_size=512, vocab_size=1024)
    pk = estimate_memory(m, Layout(num_gpus=2, dp=2, global_batch=2, seq_len=128), get_platform("cpu-1t")).peak
    assert pk.nccl_bytes == pk.allocator_bytes == pk.framework_bytes == 0
    assert pk.total_bytes == pytest.approx(pk.allocated_bytes)


def test_nvls_nodes_carry_nvls_buffers_per_communicator():
    lay = Layout(**LAYOUT)
    m = get_preset("llama3-8b")
    h100 = estimate_memory(m, lay, get_platform("dgx-h100")).peak.nccl_bytes    # NVSwitch + NVLS
    a100 = estimate_memory(m, lay, get_platform("dgx-a100-80gb")).peak.nccl_bytes  # NVSwitch, no NVLS
    o = MemoryOptions()
    # tp, dp and the world: three collective communicators, each with two or more GPUs in the node
    assert a100 == pytest.approx(3 * o.nccl_coll_mib * 2 ** 20)
    assert h100 == pytest.approx(3 * (o.nccl_coll_mib + o.nccl_nvls_mib) * 2 ** 20)
    off = estimate_memory(m, lay, get_platform("dgx-h100"), replace(o, nccl_nvls_mib=0.0)).peak.nccl_bytes
    assert off == pytest.approx(a100)


def test_communicators_counted_follow_the_layout():
    comm = DeviceComm(gpus_per_node=8, nvls=False)
    o = MemoryOptions()
    coll, peer = o.nccl_coll_mib * 2 ** 20, o.nccl_p2p_peer_mib * 2 ** 20

    def one(pp: int = 1, vpp: int = 1, tp: int = 1, dp: int = 1, cp: int = 1, ep: int = 1, moe: bool = False,
            tied: bool = False) -> np.ndarray:
        a = lambda v: np.array([v])  # noqa: E731
        return nccl_buffer_arrays(comm, pp, vpp, tp=a(tp), dp=a(dp * cp), cp=a(cp), ep=a(ep), moe=moe, tied=tied,
                                  options=o)[0]
    assert one().sum() == 0                                        # one GPU: no communicator
    assert one(dp=8)[0] == pytest.approx(coll)                     # dp = the world: one communicator
    assert one(tp=8)[0] == pytest.approx(coll)                     # tp = the world
    assert one(tp=2, dp=4)[0] == pytest.approx(3 * coll)           # tp, dp, world
    # pp 4: tp, dp, model parallel (tp x pp), world; the ends of a 1F1B pipeline have one neighbour, the middle two
    got = one(pp=4, tp=2, dp=2)
    assert got[1] == pytest.approx(4 * coll + 2 * peer) and got[0] == pytest.approx(4 * coll + peer)
    assert one(pp=4, vpp=2, tp=2, dp=2)[0] == pytest.approx(4 * coll + 2 * peer)   # interleaved: both neighbours
    # tied embeddings with pp > 1: the first and last stages share one more communicator
    tied = one(pp=4, tp=2, dp=2, tied=True)
    assert tied[0] - got[0] == pytest.approx(coll) and tied[1] == pytest.approx(got[1])
    # context parallelism: the ring's two neighbours
    assert one(tp=2, dp=2, cp=2)[0] - one(tp=2, dp=4)[0] == pytest.approx(peer)
    # expert parallelism: the all-to-all reaches ep - 1 peers, plus the expert-data-parallel group
    moe = one(tp=1, dp=8, ep=4, moe=True)[0]
    assert moe == pytest.approx(coll + 3 * peer + coll)
    # peers on other nodes share one pool per communicator (NCCL_NET_SHARED_BUFFERS), not one buffer each
    pool = o.nccl_net_pool_mib * 2 ** 20
    wide = one(tp=1, dp=128, ep=64, moe=True)[0]
    assert wide == pytest.approx(coll + coll + 7 * peer + pool)
    # a pipeline whose neighbours sit on other nodes: the pool once, whatever the neighbours
    far = one(pp=4, tp=8, dp=2)
    assert far[0] == far[1] == pytest.approx(4 * coll + pool)


def test_predict_reports_the_device_total_and_judges_fit_by_it():
    from predictor.plan.predict import get_predictor
    m, lay, plat = get_preset("llama3-8b"), Layout(**LAYOUT), get_platform("dgx-h100")
    pred = get_predictor("dgx-h100").predict(m, lay, timeline=False)
    ref = estimate_memory(m, lay, plat).peak
    assert pred.memory is not None
    assert pred.memory_gib == pytest.approx(ref.total_bytes / GIB)
    assert ref.nccl_bytes > 0 and pred.memory.peak.nccl_bytes == pytest.approx(ref.nccl_bytes)
    assert ref.allocator_bytes > 0 and pred.memory.peak.allocator_bytes == pytest.approx(ref.allocator_bytes)
    assert pred.fits_memory == (ref.low_total_bytes <= plat.device.hbm_gib * GIB)
    assert mem.MEMORY_PARTS[-2:] == ("nccl", "allocator")


def test_cli_memory_model_flags(capsys, tmp_path):
    import json

    from predictor.cli.main import main
    args = ["predict", "--platform", "dgx-h100", "--model", "llama3-8b", "--num-gpus", "8", "--tp", "2",
            "--global-batch", "64", "--seq-len", "4096", "--sequence-parallel", "--zero-stage", "1", "--json"]
    assert main(args) == 0
    base = json.loads(capsys.readouterr().out)
    assert main(args + ["--nvls-mib", "0", "--allocator-overhead", "0.02"]) == 0
    lean = json.loads(capsys.readouterr().out)
    o = MemoryOptions()
    # three communicators lose their NVLS buffers; the allocator's reserve shrinks to 2 % of the same allocation
    assert base["memory_gib"] - lean["memory_gib"] > 3 * o.nccl_nvls_mib / 1024
    for bad, field in ((["--nvls-mib", "-1"], "nvls_mib"), (["--allocator-reserve", "1.5"], "allocator_reserve"),
                       (["--allocator-overhead", "inf"], "allocator_overhead")):
        assert main(args + bad) == 2
        assert capsys.readouterr().err.startswith(f"error: {field}:")
    csv = tmp_path / "in.csv"
    from predictor.model.layout_io import BATCH_COLUMNS
    row = {"case_id": "a", "platform": "dgx-h100", "arch": "llama", "layers": "32", "hidden": "4096", "heads": "32",
           "kv_heads": "8", "ffn_hidden": "14336", "vocab": "128256", "seq_len": "4096", "num_gpus": "8", "tp": "2",
           "pp": "1", "dp": "4", "micro_batch": "1", "global_batch": "64", "vpp": "1", "schedule": "1f1b",
           "recompute": "none", "sequence_parallel": "true", "zero_stage": "1", "precision": "bf16"}
    csv.write_text(",".join(BATCH_COLUMNS) + "\n" + ",".join(row[c] for c in BATCH_COLUMNS) + "\n")
    got = {}
    for nvls in ("1536", "0"):
        out = tmp_path / f"out{nvls}.csv"
        assert main(["predict-batch", "--input", str(csv), "--output", str(out), "--nvls-mib", nvls, "--quiet"]) == 0
        import pandas as pd
        got[nvls] = float(pd.read_csv(out)["memory_gib"].iloc[0])
    assert got["0"] < got["1536"]
    capsys.readouterr()


def test_fit_is_judged_with_the_least_allocator_reserve_and_tight_said_between():
    """A layout fits when its total with the least reserve published runs show fits; between that and the total
    with the typical reserve it is 'tight': it fits, with a warning, and search keeps it flagged."""
    m, lay = get_preset("llama3-8b"), Layout(**LAYOUT)
    rep = estimate_memory(m, lay, get_platform("dgx-h100"))
    pk = rep.peak
    o = MemoryOptions()
    assert pk.low_total_bytes == pytest.approx(pk.total_bytes - pk.allocator_bytes
                                               + o.allocator_overhead_min * pk.allocated_bytes)
    between = (pk.low_total_bytes + pk.total_bytes) / 2 / GIB
    t = estimate_memory(m, lay, hbm_gib=between)
    # (hbm_gib alone: a GPU node of 8 without NVLS; judge it against its own totals)
    lo, hi = t.low_peak_bytes / GIB, t.peak_gib
    for hbm, fits, tight in ((hi * 1.01, True, False), ((lo + hi) / 2, True, True), (lo * 0.99, False, False)):
        r = estimate_memory(m, lay, hbm_gib=hbm)
        assert (r.fits, r.tight) == (fits, tight), hbm
        assert bool(r.reason) == (not fits)


def test_predict_and_search_say_tight():
    from predictor.plan.predict import get_predictor
    from predictor.plan.search import SearchSpace, search
    P = get_predictor("dgx-h100")
    m = get_preset("llama3-8b")
    space = SearchSpace(tp=(1, 2), pp=(1,), zero_stage=(1,), recompute=("none",), sequence_parallel=(False, True))
    rep = search(m, P, 8, 64, 8192, space=space)
    t = rep.table
    assert {"fits", "memory_tight"} <= set(t.columns)
    assert not (t["memory_tight"] & ~t["fits"]).any()
    usable = t["usable_gib"].iloc[0]
    assert (t.loc[t["memory_tight"], "peak_mem_gib"] > usable).all()
    assert (t.loc[t["fits"] & ~t["memory_tight"], "peak_mem_gib"] <= usable).all()
    tight = t[t["memory_tight"]]
    if len(tight):
        from predictor.plan.search import layout_of
        pred = P.predict(m, layout_of(tight.iloc[0]), timeline=False)
        assert pred.fits_memory and pred.memory_tight
        assert any(w.startswith("Memory is tight") for w in pred.warnings)


def test_library_workspaces_are_allocated_tensors_on_a_known_gpu():
    """PyTorch's cuBLAS workspace, one per handle (the forward thread's and autograd's), and Transformer Engine's
    GEMM workspace (+4 per compute stream for a MoE's grouped GEMM) are torch allocations: in `allocated`, sized by
    the architecture, 0 without a device."""
    from predictor.step.memory import cublas_workspace_mib_of, workspace_bytes
    m = get_preset("llama3-8b")
    mib = 2.0 ** 20
    hopper, ampere = DeviceComm.of(get_platform("dgx-h100")), DeviceComm.of(get_platform("dgx-a100-80gb"))
    assert workspace_bytes(m, hopper) == pytest.approx((2 * 32 + 32) * mib)
    assert workspace_bytes(m, ampere) == pytest.approx((2 * 8.125 + 4) * mib)
    assert workspace_bytes(m, ampere, MemoryOptions(cublas_workspace_mib=32.0, transformer_impl="local")) \
        == pytest.approx(64 * mib)
    assert workspace_bytes(m, DeviceComm()) == 0.0
    assert cublas_workspace_mib_of(":4096:8") == 32.0 and cublas_workspace_mib_of(":4096:2:16:8") == 8.125
    moe = get_preset("mixtral-8x7b")
    assert workspace_bytes(moe, hopper) - workspace_bytes(m, hopper) == pytest.approx(4 * 32 * mib)
    lay = Layout(**LAYOUT)
    full = estimate_memory(m, lay, get_platform("dgx-h100")).peak
    bare = estimate_memory(m, lay).peak
    assert full.buffers_bytes - bare.buffers_bytes == pytest.approx(workspace_bytes(m, hopper))


def test_the_local_attention_keeps_its_scores_buffer():
    """Megatron's local unfused attention takes its [b * heads / tp, s, s] baddbmm input from the global memory
    buffer, held for the whole run; Transformer Engine's does not."""
    m = replace(get_preset("llama3-8b"), attention_impl="unfused")
    lay = Layout(num_gpus=8, tp=2, dp=4, global_batch=32, micro_batch=2, seq_len=2048)
    plat = get_platform("dgx-h100")
    te = estimate_memory(m, lay, plat, MemoryOptions(transformer_impl="transformer_engine")).peak
    local = estimate_memory(m, lay, plat, MemoryOptions(transformer_impl="local")).peak
    scores = 2 * (m.num_heads / 2) * 2048 ** 2 * 2
    te_ws = 32 * 2.0 ** 20
    assert local.buffers_bytes - te.buffers_bytes == pytest.approx(scores - te_ws)
    with pytest.raises(InfeasibleConfig):
        MemoryOptions(transformer_impl="apex")


def test_the_one_graph_fused_cross_entropy_adds_one_fp32_logits_copy():
    m = get_preset("llama3-8b")
    lay = Layout(num_gpus=8, tp=2, dp=4, global_batch=32, micro_batch=1, seq_len=4096)
    base = estimate_memory(m, lay).stages[-1]
    old = estimate_memory(m, lay, options=MemoryOptions(fused_ce_logits_copy=True)).stages[-1]
    from predictor.step.memory import padded_vocab
    assert old.buffers_bytes - base.buffers_bytes == pytest.approx(4 * 4096 * padded_vocab(m.vocab_size, 2) / 2)

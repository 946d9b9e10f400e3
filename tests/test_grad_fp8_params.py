"""Gradient precision (Layout.grad_reduce_in_fp32) and FP8 primary weights (Layout.fp8_param_gather): what they
change in memory and in the data-parallel traffic, and how every input path takes them."""
from __future__ import annotations

import pytest

from predictor.hardware.platforms import get_platform
from predictor.model import params
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import layout_from_fields
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.step import decompose as D
from predictor.step import fp8
from predictor.step.memory import estimate_memory

BASE = dict(num_gpus=8, tp=2, dp=4, global_batch=64, seq_len=4096, sequence_parallel=True, zero_stage=1)


def test_grad_bytes_follow_the_precision_unless_set():
    assert Layout(**BASE).grad_bytes == 4                                   # bf16: fp32 gradients (Megatron-LM)
    assert Layout(**BASE, precision="fp16").grad_bytes == 2
    assert Layout(**BASE, grad_reduce_in_fp32=False).grad_bytes == 2
    assert Layout(**BASE, precision="fp16", grad_reduce_in_fp32=True).grad_bytes == 4


def test_bad_combinations_name_the_field():
    m = get_preset("llama3-8b")
    with pytest.raises(InfeasibleConfig) as e:
        Layout(**BASE, fp8_param_gather=True).validate(m)
    assert e.value.field == "fp8_param_gather" and "fp8" in e.value.fix
    with pytest.raises(InfeasibleConfig) as e:
        Layout(**BASE, precision="fp32", grad_reduce_in_fp32=False).validate(m)
    assert e.value.field == "grad_reduce_in_fp32"
    with pytest.raises(InfeasibleConfig) as e:
        layout_from_fields({**BASE, "grad_reduce_in_fp32": "maybe"})
    assert e.value.field == "grad_reduce_in_fp32"


def test_bf16_gradients_halve_the_gradient_buffers_without_an_fp32_copy():
    m, plat = get_preset("llama3-8b"), get_platform("dgx-h100")
    fp32 = estimate_memory(m, Layout(**BASE), plat).peak
    bf16 = estimate_memory(m, Layout(**BASE, grad_reduce_in_fp32=False), plat).peak
    assert bf16.grads_bytes == pytest.approx(fp32.grads_bytes / 2)
    assert bf16.optimizer_bytes == pytest.approx(fp32.optimizer_bytes)   # master + moments only, sharded
    assert bf16.weights_bytes == fp32.weights_bytes and bf16.activations_bytes == fp32.activations_bytes


def test_fp8_primary_weights_drop_the_bf16_copy_of_the_gemm_weights():
    m, plat = get_preset("llama3-8b"), get_platform("dgx-h100")
    kw = {**BASE, "precision": "fp8"}
    bf16 = estimate_memory(m, Layout(**BASE), plat).peak
    fp8_copies = estimate_memory(m, Layout(**kw), plat).peak
    primary = estimate_memory(m, Layout(**kw, fp8_param_gather=True), plat).peak
    gemm = fp8.layer_gemm_params_per_gpu(m, 2) * primary.layers
    assert fp8_copies.weights_bytes == pytest.approx(bf16.weights_bytes + 2 * gemm)
    # an FP8 weight + its transpose (2 bytes per GEMM parameter) in place of the BF16 weight + two FP8 copies
    assert primary.weights_bytes == pytest.approx(bf16.weights_bytes)
    assert primary.activations_bytes == pytest.approx(fp8_copies.activations_bytes)


def test_mxfp8_primary_weights_keep_the_two_mxfp8_copies_with_their_scales():
    """MXFP8 primary weights (Megatron --fp8-param-gather with the mxfp8 recipe; Megatron-Bridge's fp8_mx preset): the
    GEMM weights are the rowwise and columnwise MXFP8 copies (1 + 1/32 bytes each) in place of the BF16 weight, and the
    distributed optimizer all-gathers them at 1 + 1/32 bytes per GEMM parameter."""
    m, plat = get_preset("llama3-8b"), get_platform("dgx-b200")
    kw = {**BASE, "precision": "mxfp8"}
    bf16 = estimate_memory(m, Layout(**BASE), plat).peak
    copies = estimate_memory(m, Layout(**kw), plat).peak
    primary = estimate_memory(m, Layout(**kw, fp8_param_gather=True), plat).peak
    gemm = fp8.layer_gemm_params_per_gpu(m, 2) * primary.layers
    assert copies.weights_bytes == pytest.approx(bf16.weights_bytes + 2 * 1.03125 * gemm)
    assert primary.weights_bytes == pytest.approx(bf16.weights_bytes + (2 * 1.03125 - 2) * gemm)
    w = dict(tp=2, pp=1, dp=4, zero_stage=1, seq_len=4096, layers=32, first=True, last=True, dp_topo=(4, 1, 8))
    prim = D.step_work(m, precision="mxfp8", fp8_param=True, **w)
    n = params.chunk_params(m, 2, 1, 32, True, True, 4096)
    g = 32 * fp8.layer_gemm_params_per_gpu(m, 2)
    ag = sum(x.message_bytes for x in prim.step_comms if x.collective == "allgather")
    assert ag == pytest.approx(2 * n - (2 - 1.03125) * g, rel=1e-6)
    with pytest.raises(InfeasibleConfig) as e:
        Layout(**BASE, precision="nvfp4", fp8_param_gather=True).validate(m)
    assert e.value.field == "fp8_param_gather"


def test_data_parallel_traffic_follows_the_gradient_and_weight_bytes():
    m = get_preset("llama3-8b")
    kw = dict(tp=2, pp=1, dp=4, zero_stage=1, seq_len=4096, layers=32, first=True, last=True,
              dp_topo=(4, 1, 8))
    base = D.step_work(m, precision="fp8", **kw)
    half = D.step_work(m, precision="fp8", grad_bytes=2, **kw)
    prim = D.step_work(m, precision="fp8", fp8_param=True, **kw)
    by = lambda w, c: sum(x.message_bytes for x in w.step_comms if x.collective == c)  # noqa: E731
    assert by(half, "reducescatter") == pytest.approx(by(base, "reducescatter") / 2, rel=1e-6)
    assert by(half, "allgather") == by(base, "allgather")
    n = params.chunk_params(m, 2, 1, 32, True, True, 4096)
    gemm = 32 * fp8.layer_gemm_params_per_gpu(m, 2)
    assert by(prim, "allgather") == pytest.approx(2 * n - gemm, rel=1e-6)    # GEMM weights in 1 byte, the rest 2
    assert by(prim, "reducescatter") == by(base, "reducescatter")


def test_the_engine_and_every_input_path_carry_them():
    from predictor.plan.predict import get_predictor
    from predictor.step.engine import layout_of_row, rows_for, structure_of
    m = get_preset("llama3-8b")
    L = Layout(**BASE, precision="fp8", grad_reduce_in_fp32=False, fp8_param_gather=True)
    rows, _ = rows_for(m, [L])
    back = layout_of_row(rows[0], structure_of(m, L), L.global_batch, L.seq_len, "fp8")
    assert (back.grad_reduce_in_fp32, back.fp8_param_gather) == (False, True)
    P = get_predictor("dgx-h100")
    pred = P.predict(m, L, timeline=False)
    ref = estimate_memory(m, L, P.platform).peak
    assert pred.memory is not None and pred.memory.peak.total_bytes == pytest.approx(ref.total_bytes)
    plain = P.predict(m, Layout(**BASE, precision="fp8"), timeline=False)
    assert pred.memory_gib < plain.memory_gib
    row = {**{k: str(v) for k, v in BASE.items()}, "precision": "fp8", "grad_reduce_in_fp32": "false",
           "fp8_param_gather": "true"}
    got = layout_from_fields(row)
    assert (got.grad_reduce_in_fp32, got.fp8_param_gather) == (False, True)


def test_cli_flags(capsys):
    import json

    from predictor.cli.main import main
    args = ["predict", "--platform", "dgx-h100", "--model", "llama3-8b", "--num-gpus", "8", "--tp", "2",
            "--global-batch", "64", "--seq-len", "4096", "--sequence-parallel", "--zero-stage", "1", "--precision",
            "fp8", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(args + ["--no-grad-reduce-in-fp32", "--fp8-param-gather"]) == 0
    lean = json.loads(capsys.readouterr().out)
    assert lean["layout"]["grad_reduce_in_fp32"] is False and lean["layout"]["fp8_param_gather"] is True
    assert lean["memory_gib"] < plain["memory_gib"]
    rc = main(["predict", "--platform", "dgx-h100", "--model", "llama3-8b", "--num-gpus", "8", "--tp", "2",
               "--global-batch", "64", "--fp8-param-gather"])
    assert rc == 2 and capsys.readouterr().err.startswith("error: fp8_param_gather:")


def test_search_applies_them_to_every_layout_and_refuses_a_bad_one():
    from predictor.plan.predict import get_predictor
    from predictor.plan.search import SearchSpace, layout_of, search
    m, P = get_preset("llama3-8b"), get_predictor("dgx-h100")
    with pytest.raises(InfeasibleConfig) as e:
        search(m, P, 8, 64, 4096, space=SearchSpace(fp8_param_gather=True))
    assert e.value.field == "fp8_param_gather"
    space = dict(tp=(2,), pp=(1,), zero_stage=(1,), recompute=("none",), precision="fp8")
    lean = search(m, P, 8, 64, 4096, space=SearchSpace(**space, grad_reduce_in_fp32=False, fp8_param_gather=True))
    plain = search(m, P, 8, 64, 4096, space=SearchSpace(**space))
    t, u = lean.table, plain.table
    assert t["fp8_param_gather"].all() and (t["grad_bytes"] == 2).all() and (u["grad_bytes"] == 4).all()
    L = layout_of(t.iloc[0])
    assert (L.grad_reduce_in_fp32, L.fp8_param_gather) == (False, True)
    assert t["peak_mem_gib"].min() < u["peak_mem_gib"].min()

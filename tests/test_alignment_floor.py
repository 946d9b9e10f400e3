"""GEMMs with a dimension not in multiples of 8 elements run without tensor cores (predictor.step.alignment): charged at
least their FLOPs at the device's FP32 peak, a spec-sheet bound; aligned shapes, fp32 and non-GEMM operators are
untouched."""
from __future__ import annotations

import numpy as np
import pytest

from predictor.hardware.platforms import get_platform
from predictor.model.specs import Layout, ModelSpec
from predictor.plan.predict import Predictor
from predictor.regress import features
from predictor.step.alignment import alignment_warning, shape_flagged, simt_floor_s

A100 = get_platform("dgx-a100-80gb").device


def _arrays(hidden: int, heads: int, tp: int = 8, batch: int = 1, seq: int = 2048):
    # (tp, batch, seq, hidden, heads, kv_heads, ffn_hidden, vocab, layers, params)
    return features.arrays_from_shapes([(tp, batch, seq, hidden, heads, None, None, None, None, None)])


@pytest.mark.parametrize("op", ["attn_scores", "attn_context"])
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_an_attention_gemm_over_an_unaligned_head_dimension_is_charged_at_the_fp32_peak(op, pass_):
    a = _arrays(14400, 96)                                   # head dimension 150
    flops, _ = features.op_work(op, a, "bf16", pass_)
    floor = simt_floor_s(op, pass_, a, A100, "bf16")
    assert np.asarray(floor) == pytest.approx(np.asarray(flops) / 19.5e12, rel=1e-9)
    # ~16x what the same FLOPs take at the tensor-core peak
    assert float(np.asarray(floor)[0]) > 15 * float(np.asarray(flops)[0]) / A100.peak_flops("bf16")


def test_aligned_shapes_other_operators_and_fp32_pay_nothing():
    assert simt_floor_s("attn_scores", "fwd", _arrays(14336, 112), A100, "bf16") == 0.0    # head dimension 128
    assert simt_floor_s("softmax", "fwd", _arrays(14400, 96), A100, "bf16") == 0.0         # not a GEMM
    assert simt_floor_s("attn_scores", "fwd", _arrays(14400, 96), A100, "fp32") == 0.0     # no tensor cores anyway
    # the token count (M) may be anything: a MoE expert's share of the tokens, an odd sequence
    assert simt_floor_s("mlp_up", "fwd", _arrays(4096, 32, tp=1, seq=1001), A100, "bf16") == 0.0
    # only the rows with an unaligned dimension, in a group of shapes
    a = features.arrays_from_shapes([(8, 1, 2048, 14400, 96, None, None, None, None, None),
                                     (8, 1, 2048, 14336, 112, None, None, None, None, None)])
    f = np.asarray(simt_floor_s("attn_scores", "fwd", a, A100, "bf16"))
    assert f[0] > 0 and f[1] == 0.0


def test_the_flag_the_warning_and_the_floor_follow_one_tensor_core_rule():
    """fp16 / bf16 / fp8 GEMMs run on the tensor cores, fp32 ones do not: the three places agree."""
    m = ModelSpec("c", "gpt", num_layers=4, hidden_size=14400, num_heads=96, vocab_size=250880)
    for precision, tensor_cores in (("bf16", True), ("fp16", True), ("fp8", True), ("fp32", False)):
        L = Layout(num_gpus=8, tp=8, pp=1, dp=1, micro_batch=1, global_batch=8, seq_len=2048, precision=precision)
        assert shape_flagged(m, 8, precision) is tensor_cores
        assert (alignment_warning(m, L) is not None) is tensor_cores
        floor = np.asarray(simt_floor_s("attn_scores", "fwd", _arrays(14400, 96), A100, precision))
        assert bool((floor > 0).any()) is tensor_cores


def test_a_prediction_of_an_unaligned_model_charges_its_attention_gemms_no_faster_than_the_fp32_peak():
    bloom_like = ModelSpec("c", "gpt", num_layers=4, hidden_size=14400, num_heads=96, vocab_size=250880,
                           attention_impl="unfused")
    L = Layout(num_gpus=8, tp=8, pp=1, dp=1, micro_batch=1, global_batch=8, seq_len=2048, precision="bf16")
    p = Predictor("dgx-a100-80gb").predict(bloom_like, L, timeline=False)
    ops = p.ops
    for op in ("attn_scores", "attn_context"):
        row = ops[(ops["op"] == op) & (ops["phase"] == "fwd")].iloc[0]
        per_call_flops = 2.0 * 2048 * 2048 * 150 * 12          # 12 heads per rank, batch 1
        assert row["seconds_total"] / row["count"] >= per_call_flops / 19.5e12 * 0.999
    w = [x for x in p.warnings if "multiples of 8" in x]
    assert len(w) == 1 and "FP32" in w[0]

"""features.py: exact work counts, roofline sanity, collective alpha-beta model."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictor.hardware.platforms import get_platform
from predictor.model import ops
from predictor.model.specs import padded_vocab
from predictor.regress import features as F

A100 = get_platform("perlmutter-a100").device

BASE = {"tp": 2, "batch": 2, "seq": 1024, "hidden": 4096, "heads": 32, "kv_heads": None, "ffn_hidden": None,
        "vocab": None, "layers": 4, "params": None}


def _df(**changes) -> pd.DataFrame:
    return pd.DataFrame([{**BASE, **changes}])


def test_gemm_flops_and_bytes_exact():
    # mlp_up: M = b*l = 2048, K = hidden = 4096, N = 4*hidden/tp = 8192
    flops, byts = F.op_work("mlp_up", _df(), "fp16")
    M, K, N = 2048, 4096, 8192
    assert flops[0] == 2 * M * N * K
    assert byts[0] == 2 * (M * K + K * N + M * N)
    fb, bb = F.op_work("mlp_up", _df(), "fp16", pass_="bwd")
    assert fb[0] == 2 * flops[0] and bb[0] == 2 * byts[0]


def test_gemm_dims_gqa_vocab_and_defaults():
    d = F._dims(F.shape_arrays(_df(heads=32, kv_heads=8, tp=4)))
    M, N, K, B = F.gemm_mnk("qkv_proj", d)
    assert (M[0], N[0], K[0], B[0]) == (2048, (8 + 2 * 2) * 128, 4096, 1)  # (32/4 + 2*8/4) heads of 128
    # NULL heads on a paper-style linear1 row -> 3*hidden/tp
    d = F._dims(F.shape_arrays(_df(heads=None)))
    assert F.gemm_mnk("qkv_proj", d)[1][0] == 3 * 4096 / 2
    # lm_head: NULL vocab = 50257 padded to a multiple of 128*tp, split over tp
    d = F._dims(F.shape_arrays(_df()))
    assert F.gemm_mnk("lm_head", d)[1][0] == padded_vocab(50257, 2) / 2 == 25216
    assert F.gemm_mnk("mlp_down", d)[2][0] == 4 * 4096 / 2
    assert F.gemm_mnk("attn_out_proj", d)[2][0] == 4096 / 2


def test_flash_attention_flops_non_causal():
    flops, _ = F.op_work("flash_attn", _df(), "fp16")
    b, hr, l, hd = 2, 16, 1024, 128
    assert flops[0] == 4 * b * hr * l * l * hd
    fb, _ = F.op_work("flash_attn", _df(), "fp16", pass_="bwd")
    assert fb[0] == pytest.approx(2.5 * flops[0])


def test_elementwise_bytes():
    _, byts = F.op_work("res_add", _df(), "fp16")
    assert byts[0] == 3 * 2 * (2 * 1024 * 4096)
    _, gf = F.op_work("gelu", _df(), "fp16")
    _, gb = F.op_work("gelu", _df(), "fp16", pass_="bwd")
    n = 2 * 1024 * 4 * 4096 / 2
    assert gf[0] == 2 * 2 * n and gb[0] == 3 * 2 * n


def test_optimizer_bytes_use_params_or_estimate():
    _, byts = F.op_work("optimizer", _df(params=1_000_000), "fp16", pass_="step")
    assert byts[0] == F.OPTIMIZER_BYTES_PER_PARAM * 1_000_000
    est = F.optimizer_params(F.shape_arrays(_df(params=None, variant="middle", layers=2, hidden=1024, tp=1)))
    assert est[0] == 2 * (12 * 1024 * 1024 + 13 * 1024)


@pytest.mark.parametrize("op", list(ops.OPS))
def test_roofline_positive_and_monotone(op):
    info = ops.OPS[op]
    for ps in info.passes:
        small = _df(seq=1024, batch=2, hidden=2048, heads=16, layers=2, params=10_000_000)
        big = _df(seq=4096, batch=8, hidden=8192, heads=64, layers=8, params=80_000_000)
        rs, rb = F.roofline_s(op, ps, small, A100), F.roofline_s(op, ps, big, A100)
        assert np.isfinite(rs).all() and (rs > F.LAUNCH_LATENCY_S).all()
        assert rb[0] > rs[0], (op, ps)
        X = F.op_features(op, ps, pd.concat([small, big]), A100)
        assert list(X.columns) == list(F.feature_names(op))
        assert len(X) == 2 and np.isfinite(X["log2_roofline"]).all()


def test_features_accept_mapping_and_nullable_ints():
    df = _df().astype({"tp": "Int64", "kv_heads": "Int64"})
    a = F.op_features("qkv_proj", "fwd", df, A100)
    b = F.op_features("qkv_proj", "fwd", {**BASE}, A100)
    pd.testing.assert_frame_equal(a, b)


def test_wave_quantisation():
    # 108 SMs: M=N=128*108 tiles -> exactly... use 109 tiles -> 2 waves, efficiency ~0.5
    X = F.op_features("attn_out_proj", "fwd", _df(batch=1, seq=128 * 109, hidden=128, tp=1), A100)
    assert X["waves"].iloc[0] == pytest.approx(109 / 108)
    assert X["wave_eff"].iloc[0] == pytest.approx(109 / 216)


def test_collective_roofline():
    plat = get_platform("perlmutter-a100")
    S = 1e9
    ar = F.collective_roofline_s("allreduce", S, 1, 4, plat)[0]
    bw = plat.intra_node.bandwidth_gbps * 1e9
    assert ar == pytest.approx(2 * 3 / 4 * S / bw + 6 * plat.intra_node.latency_us * 1e-6 + F.LAUNCH_LATENCY_S)
    # crossing nodes: the slower inter-node tier dominates
    assert F.collective_roofline_s("allreduce", S, 2, 4, plat)[0] > ar
    ag = F.collective_roofline_s("allgather", S, 1, 4, plat)[0]
    assert ag == pytest.approx(3 * S / bw + 3 * plat.intra_node.latency_us * 1e-6 + F.LAUNCH_LATENCY_S)
    p2p = F.collective_roofline_s("p2p", S, 2, 1, plat)[0]
    assert p2p == pytest.approx(S / (plat.inter_node.bandwidth_gbps * 1e9) + plat.inter_node.latency_us * 1e-6
                                + F.LAUNCH_LATENCY_S)
    vista = get_platform("vista-gh200")  # no intra-node link: uses the inter-node tier
    assert np.isfinite(F.collective_roofline_s("allreduce", S, 2, 1, vista)).all()
    X = F.collective_features("allreduce", [1e8, 2e8], [1, 2], [4, 4], plat)
    assert list(X.columns) == list(F.COLLECTIVE_FEATURES) and len(X) == 2


def test_derived_dims_follow_the_arrays_asked_not_the_last_answer():
    """_dims remembers its last answer by the arrays' identity: other arrays (even equal-looking ones built anew,
    or ones that differ) get their own dimensions."""
    a1 = F.arrays_from_shapes([(2, 1, 1024, 4096, 32, 8, 14336, 128256, None, None)])
    a2 = F.arrays_from_shapes([(4, 2, 2048, 4096, 32, 8, 14336, 128256, None, None)])
    d1 = F.derived_dims(a1)
    assert F.derived_dims(a1) is d1
    d2 = F.derived_dims(a2)
    assert d2["tp"][0] == 4 and d2["b"][0] == 2 and d2["l"][0] == 2048
    assert F.derived_dims(a1)["tp"][0] == 2
    fresh = F.arrays_from_shapes([(2, 1, 1024, 4096, 32, 8, 14336, 128256, None, None)])
    assert all(np.array_equal(F.derived_dims(fresh)[k], d1[k], equal_nan=True) for k in d1)


def test_arrays_from_shapes_takes_one_variant_per_shape():
    shapes = [(1, None, None, 4096, None, None, None, None, 4, 1e9)] * 3
    a = F.arrays_from_shapes(shapes, ["first", "middle", "last"])
    assert a["variant"].tolist() == [F.OPTIMIZER_VARIANTS[v] for v in ("first", "middle", "last")]
    assert F.arrays_from_shapes(shapes, "last")["variant"].tolist() == [F.OPTIMIZER_VARIANTS["last"]] * 3

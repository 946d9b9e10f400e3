"""Low-precision GEMMs timed by their own measured grids (the published tables' fp8 / fp8_block / nvfp4 rows, one
regressor per format, ops.FORMAT_GEMMS) instead of the BF16 time x a MAMF ratio, where a platform has them."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictor.calibrate.training import train_platform
from predictor.hardware.platforms import get_platform
from predictor.model import ops
from predictor.plan import predict as P
from predictor.regress import features
from predictor.samples import store
from predictor.step import fp8
from predictor.step.decompose import OpCall


def call(op: str, pass_: str, b=1, l=2048, h=4096, ffn=8192, tp=1) -> OpCall:
    return OpCall(op, pass_, (tp, b, l, h, 32, 8, ffn, 128256, None, None), 1.0, pass_, "layer")


def tree(tmp_path: Path, tflops: dict[str, float]) -> Path:
    """A collector tree for h100_sxm whose GEMMs run at the given TFLOP/s per table dtype."""
    d = tmp_path / "aic" / "h100_sxm" / "gemm" / "trtllm" / "9.9"
    d.mkdir(parents=True)
    (tmp_path / "aic" / "h100_sxm" / "system.yaml").write_text("gpu: {}\n")
    grid = [(m, n, k) for m in (16, 64, 256, 512, 1024, 2048, 4096, 8192) for n in (1024, 2048, 4096, 8192)
            for k in (1024, 2048, 4096, 8192)]
    frames = [pd.DataFrame({"gemm_dtype": dt, "m": [g[0] for g in grid], "n": [g[1] for g in grid],
                            "k": [g[2] for g in grid],
                            "latency": [(2.0 * m * n * k / (tf * 1e12) + 8e-6) * 1e3 for m, n, k in grid]})
              for dt, tf in tflops.items()]
    pd.concat(frames).to_parquet(d / "gemm_perf.parquet")
    return tmp_path / "aic"


def test_each_table_dtype_trains_its_own_grid_regressor_and_fp8_gemms_follow_it(tmp_path: Path) -> None:
    db, models = tmp_path / "s.duckdb", tmp_path / "models"
    store.ingest_path(tree(tmp_path, {"bfloat16": 600.0, "fp8": 1000.0}), store_path=db)
    rep = train_platform("dgx-h100", store_path=db, models_dir=models, cv_folds=3, write_readme=False)
    assert sorted(rep["op"]) == ["gemm", "gemm_fp8"]
    pr = P.Predictor("dgx-h100", models_dir=models)
    dev = pr.platform.device
    # each grid records its best measured throughput (the synthetic grids: 600 / 1000 TFLOP/s less the 8 us)
    assert 500e12 < pr.kernel_bank.op_info("gemm", "fwd")["grid_best_flops"] < 600e12
    assert 900e12 < pr.kernel_bank.op_info("gemm_fp8", "fwd")["grid_best_flops"] < 1000e12
    # and its error with whole m ranges held out (a smooth synthetic grid: small)
    assert 0 <= pr.kernel_bank.op_info("gemm_fp8", "fwd")["block_heldout"]["mape"] < 0.1
    c = call("mlp_up", "fwd")  # (m, n, k) = (2048, 8192, 4096), sampled
    (tf, pf, ef), (tb, pb, _) = pr.op_times([c, OpCall(c.op, "bwd", c.shape, 1.0, "bwd", "layer")], "fp8")
    # the synthetic grid times the GEMM alone; the model takes each timing to include its input's quantize (as the
    # collector's Linear.forward does), so it adds the rest of TE's casts and takes back the wgrad input's
    M, N, K = 2048, 8192, 4096
    cast_f = (1 * M * K + 4 * K * N) / dev.hbm_bytes_per_s
    cast_b = (1 * M * N - 3 * K * M) / dev.hbm_bytes_per_s
    gemm_s = 2.0 * M * N * K / 1000e12 + 8e-6
    assert pf.startswith("measured (per-tensor FP8 GEMM grid)") and fp8.CAST_RULE in pf
    assert tf == pytest.approx(gemm_s + cast_f, rel=0.1)
    assert pb.startswith("measured (derived: the per-tensor FP8 GEMM grid") and tb == pytest.approx(
        2 * gemm_s + cast_b, rel=0.15)
    assert ef is not None and ef < fp8.FP8_ASSUMED_ERROR  # the regressor's own error, not the rule's
    # BF16 still on the BF16 grid; blockwise FP8 has no table in this tree: the derived rule, said so
    (t16, p16, _), = pr.op_times([c], "bf16")
    assert p16 == "measured" and t16 == pytest.approx(2.0 * 2048 * 8192 * 4096 / 600e12 + 8e-6, rel=0.1)
    (_, pmx, _), = pr.op_times([c], "mxfp8")
    assert "blockwise FP8 derived" in pmx


def test_a_slower_fp8_grid_gives_a_slower_fp8_gemm(tmp_path: Path) -> None:
    """The measured grid decides, not the MAMF ratio: the same BF16 grid with a slow FP8 table predicts a slower
    FP8 GEMM than with a fast one (the rule would give the same time for both)."""
    times = []
    for k, tf8 in enumerate((700.0, 1200.0)):
        d = tmp_path / str(k)
        store.ingest_path(tree(d, {"bfloat16": 600.0, "fp8": tf8}), store_path=d / "s.duckdb")
        train_platform("dgx-h100", store_path=d / "s.duckdb", models_dir=d / "m", cv_folds=0, write_readme=False)
        (t, _, _), = P.Predictor("dgx-h100", models_dir=d / "m").op_times([call("mlp_up", "fwd")], "fp8")
        times.append(t)
    assert times[0] > 1.4 * times[1]


@pytest.mark.parametrize("pid, precision, label", [
    ("dgx-h100", "fp8", "per-tensor FP8 GEMM grid"),
    ("dgx-h100", "mxfp8", "blockwise FP8 GEMM grid"),
    ("dgx-b200", "nvfp4", "NVFP4 GEMM grid"),
    ("gb200-nvl72", "mxfp8", "blockwise FP8 GEMM grid as MXFP8"),
])
def test_shipped_measured_platforms_time_their_formats_from_the_grids(pid: str, precision: str, label: str) -> None:
    pr = P.Predictor(pid)
    assert pr.kernel_bank is not None and pr.kernel_bank.has_op(fp8.format_grid(pr.platform.device, precision).op,
                                                                 "fwd")
    c = call("qkv_proj", "fwd", b=1, l=8192, h=8192, ffn=28672)
    (t, prov, _), = pr.op_times([c], precision)
    assert prov.startswith(f"measured ({label}")
    # never faster than the format's achievable floor (the MFU cap)
    r, _ = fp8.format_ratio(pr.platform.device, precision)
    flops, _ = features.op_work("qkv_proj", features.arrays_from_shapes([c.shape]), "bf16", "fwd")
    assert t >= float(flops[0]) / (pr.achievable_flops("bf16") / r)


def test_platforms_without_format_grids_keep_the_derived_rule() -> None:
    pr = P.Predictor("vista-gh200")
    (_, prov, err), = pr.op_times([call("qkv_proj", "fwd")], "fp8")
    assert fp8.FP8_PROVENANCE in prov and err >= fp8.FP8_ASSUMED_ERROR
    assert fp8.format_grid(get_platform("dgx-h100").device, "bf16") is None


def test_format_grid_ops_are_grid_gemms_with_the_format_peak() -> None:
    dev = get_platform("dgx-b200").device
    for f in ops.FORMAT_GEMMS.values():
        assert f.op in ops.OPS and f.op in features.GRID_GEMM_OPS and f.op not in P.KERNEL_GEMM_OPS
        a = features.arrays_from_shapes([(1, 1, 4096, 4096, None, None, 8192, None, None, None)])
        M, N, K, _ = features.gemm_mnk(f.op, features.derived_dims(a))
        assert (float(M[0]), float(N[0]), float(K[0])) == (4096.0, 8192.0, 4096.0)
    assert dev.peak_flops(ops.FORMAT_GEMMS["nvfp4"].roofline_precision) == 2 * dev.peak_flops("fp8")
    assert np.isfinite(features.roofline_s("gemm_nvfp4", "fwd", {"tp": 1, "batch": 1, "seq": 4096, "hidden": 4096,
                                                                  "ffn_hidden": 8192}, dev, "fp4"))


@pytest.mark.parametrize("precision", ["fp8", "mxfp8", "nvfp4"])
def test_grid_cast_bytes_are_te_casts_less_the_quantize_the_grid_times(precision: str) -> None:
    shape = [(1, 2, 4096, 8192, 64, 8, 28672, 128256, None, None)]
    a = features.arrays_from_shapes(shape)
    M, N, K, _ = features.gemm_mnk("mlp_up", features.derived_dims(a))
    timed = 2.0 + fp8.FORMATS[precision].stored_bytes_per_element
    fwd = fp8.grid_cast_bytes("mlp_up", "fwd", a, precision) + timed * M * K
    bwd = fp8.grid_cast_bytes("mlp_up", "bwd", a, precision) + timed * M * N + timed * K * M
    np.testing.assert_allclose(fwd, fp8.cast_bytes("mlp_up", "fwd", a, precision))
    np.testing.assert_allclose(bwd, fp8.cast_bytes("mlp_up", "bwd", a, precision))


def test_the_grids_fixed_quantize_latency_is_measured_against_bf16_and_taken_out(tmp_path: Path) -> None:
    """A format grid that pays 10 us per call over BF16 at every shape (the tables' per-tensor FP8: dynamic input
    scaling before the GEMM): the fixed latency is measured on the small shapes and taken out of each GEMM."""
    db, models = tmp_path / "s.duckdb", tmp_path / "models"
    root = tree(tmp_path, {"bfloat16": 600.0})
    f = root / "h100_sxm" / "gemm" / "trtllm" / "9.9" / "gemm_perf.parquet"
    bf = pd.read_parquet(f)
    fp = bf.assign(gemm_dtype="fp8", latency=bf["latency"] + 0.010)  # ms
    pd.concat([bf, fp]).to_parquet(f)
    store.ingest_path(root, store_path=db)
    from predictor.calibrate.training import grid_fixed_overhead_s
    g = store.read_op_samples("dgx-h100", "gemm", "fwd", store_path=db)
    assert grid_fixed_overhead_s(g, "fp8") == pytest.approx(10e-6, rel=1e-6)
    assert grid_fixed_overhead_s(g, "nvfp4") is None
    train_platform("dgx-h100", store_path=db, models_dir=models, cv_folds=0, write_readme=False)
    pr = P.Predictor("dgx-h100", models_dir=models)
    assert pr.kernel_bank.op_info("gemm_fp8", "fwd")["grid_fixed_overhead_s"] == pytest.approx(10e-6, rel=1e-6)
    c = call("mlp_up", "fwd")
    (t16, _, _), = pr.op_times([c], "bf16")
    (t8, _, _), = pr.op_times([c], "fp8")
    M, N, K = 2048, 8192, 4096
    # the same GEMM as BF16 once the grid's 10 us are out, plus TE's casts the grid leaves out
    assert t8 == pytest.approx(t16 + (1 * M * K + 4 * K * N) / pr.platform.device.hbm_bytes_per_s, rel=0.05)


def test_no_predicted_gemm_beats_its_measured_grid() -> None:
    """The MFU cap on a table platform is the lower of the catalog's MAMF and the grid's best measured throughput
    (B200: the grid's 1,716 TFLOP/s under ml-engineering's 1,745), in BF16 and in each low-precision grid."""
    pr = P.Predictor("dgx-b200")
    best = float(pr.kernel_bank.op_info("gemm", "fwd")["grid_best_flops"])
    mamf = pr.platform.device.achievable_flops("bf16")
    assert best < mamf and pr.achievable_flops("bf16") == pytest.approx(best)
    big = call("mlp_up", "fwd", b=8, l=8192, h=16384, ffn=53248)  # beyond the grid's largest m
    flops = 2.0 * 8 * 8192 * 16384 * 53248
    for precision, op in (("bf16", "gemm"), ("fp8", "gemm_fp8"), ("nvfp4", "gemm_nvfp4")):
        cap = float(pr.kernel_bank.op_info(op, "fwd")["grid_best_flops"])
        (t, _, _), = pr.op_times([big], precision)
        assert flops / t <= cap * (1 + 1e-9), precision
    # a platform whose grid beats the catalog's MAMF keeps the MAMF
    h = P.Predictor("dgx-h100")
    assert h.achievable_flops("bf16") == pytest.approx(h.platform.device.achievable_flops("bf16"))

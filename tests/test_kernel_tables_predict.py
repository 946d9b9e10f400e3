"""Platforms whose GEMMs and flash attention rest on published kernel tables (Platform.kernel_models): what
they are timed with, how the backward passes are obtained, and that other platforms are untouched."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictor.calibrate.training import _drop_power_monitored, _training_dtype
from predictor.hardware.platforms import get_platform
from predictor.plan import predict as P
from predictor.plan.backing import describe_backing
from predictor.regress import features
from predictor.step.decompose import OpCall

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
MEASURED = ("dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72", "dgx-b300", "gb300-nvl72")


def call(op: str, pass_: str, tp=1, b=2, l=4096, h=4096, heads=32, kv=8, ffn=14336, vocab=128256) -> OpCall:
    return OpCall(op, pass_, (tp, b, l, h, heads, kv, ffn, vocab, None, None), 1.0, pass_, "layer")


def bwd_of(c: OpCall) -> OpCall:
    return OpCall(c.op, "bwd", c.shape, 1.0, "bwd", "layer")


@pytest.mark.parametrize("pid", MEASURED)
def test_measured_platforms_time_gemms_and_attention_from_their_kernel_tables(pid: str) -> None:
    pr = P.Predictor(pid)
    assert get_platform(pid).kernel_models == pid and pr.kernel_bank is not None
    got = dict(zip(["qf", "qb", "ff", "fb", "rms"], pr.op_times(
        [call("qkv_proj", "fwd"), call("qkv_proj", "bwd"), call("flash_attn", "fwd"), call("flash_attn", "bwd"),
         call("rmsnorm", "fwd")], "bf16")))
    assert got["qf"][1] == "measured" and got["ff"][1] == "measured"
    assert got["qb"][1] == P.BWD_GEMM_PROVENANCE and got["fb"][1].startswith("derived")
    assert got["rms"][1].startswith("transferred")  # no table measures it: today's transfer, said so
    assert "measured" in describe_backing(pr).operators


def test_backward_gemm_is_the_forward_grid_at_the_gradient_shapes() -> None:
    pr = P.Predictor("dgx-h100")
    # a square GEMM: data and weight gradients are the same [n, n] x [n, n] problem as the forward
    sq = call("mlp_up", "fwd", b=1, l=8192, h=8192, ffn=8192)
    f, b = (t for t, _p, _e in pr.op_times([sq, bwd_of(sq)], "bf16"))
    assert 1.8 < b / f < 2.2
    # a skinny one: M = 256 tokens against an 8192 x 28672 weight; the weight gradient [8192, 256] x [256, 28672]
    # is a different kernel from the forward [256, 8192] x [8192, 28672], so the ratio need not be 2
    sk = call("mlp_up", "fwd", b=1, l=256, h=8192, ffn=28672)
    f2, b2 = (t for t, _p, _e in pr.op_times([sk, bwd_of(sk)], "bf16"))
    M, N, K, _ = features.gemm_mnk("mlp_up", features.derived_dims(features.arrays_from_shapes([sk.shape])))
    grid = [float(pr.kernel_bank.predict_op("gemm", "fwd", P.gemm_shapes(m, n, k), pr.platform.device, "bf16")[0])
            for m, n, k in ((M, K, N), (K, N, M))]
    assert b2 == pytest.approx(max(sum(grid), pr._ideal_cache[(*bwd_of(sk).key, "bf16")]))
    assert f2 > 0


def test_flash_backward_is_the_forward_times_the_paper_ratio() -> None:
    pr = P.Predictor("dgx-b200")
    (f, _, _), (b, _, _) = pr.op_times([call("flash_attn", "fwd", l=8192), call("flash_attn", "bwd", l=8192)], "bf16")
    assert b >= f * P.FLASH_BWD_OVER_FWD * 0.999  # the MAMF floor may only raise it


def test_flash_ratio_is_what_the_paper_samples_measure() -> None:
    f = SHARED / "paper-samples" / "Perlmutter" / "operator" / "NVIDIAA100-SXM4-80GB_flash_atten_fp16.csv"
    if not f.exists():
        pytest.skip("shared paper samples not present")
    d = pd.read_csv(f)
    r = d["B_dur(us)"] / d["F_dur(us)"]
    assert np.median(r) == pytest.approx(P.FLASH_BWD_OVER_FWD, abs=0.005)
    q1, q3 = np.percentile(r, [25, 75])
    assert (q3 - q1) / 2 / np.median(r) == pytest.approx(P.FLASH_BWD_RATIO_SPREAD, abs=0.005)


@pytest.mark.parametrize("pid", ["perlmutter-a100", "vista-gh200", "dgx-a100-80gb", "cpu-2t"])
def test_platforms_without_kernel_tables_are_untouched(pid: str) -> None:
    pr = P.Predictor(pid)
    assert pr.kernel_bank is None
    (_, prov, _), = pr.op_times([call("qkv_proj", "bwd")], "fp32" if pid.startswith("cpu") else "bf16")
    assert prov != P.BWD_GEMM_PROVENANCE


def test_training_picks_half_precision_and_leaves_power_monitored_rows_out() -> None:
    assert _training_dtype(pd.Series(["fp8"] * 5 + ["bf16"] * 2 + ["nvfp4"] * 9)) == "bf16"
    assert _training_dtype(pd.Series(["fp32"] * 3)) == "fp32"
    g = pd.DataFrame({"variant": ["trtllm/1", "vllm/0.22:power-monitored", "trtllm/1"]})
    kept, n = _drop_power_monitored(g)
    assert n == 1 and list(kept["variant"]) == ["trtllm/1", "trtllm/1"]
    only = g.iloc[[1]]
    assert _drop_power_monitored(only)[1] == 0  # nothing else to fit on: kept


def test_triton_attention_stays_on_its_fa2_base() -> None:
    """TRITON_ATTENTION_FACTOR is relative to FlashAttention-2; the published tables time an inference FMHA kernel,
    so a Triton-attention model's attention keeps the FA2 base (transferred) while a 'flash' model's is measured."""
    from dataclasses import replace

    from predictor.model.presets import get_preset
    from predictor.model.specs import Layout
    pr = P.Predictor("dgx-h100")
    m = get_preset("llama3-8b")
    L = Layout(num_gpus=8, dp=8, micro_batch=1, global_batch=8, seq_len=4096)
    flash = pr.predict(m, L).provenance
    triton = pr.predict(replace(m, attention_impl="triton"), L).provenance
    assert "derived (flash-attention" in flash
    assert "derived (flash-attention" not in triton and "transferred" in triton


def test_ingest_train_predict_from_a_collector_tree(tmp_path: Path) -> None:
    """A collector tree (synthetic, 600 TFLOP/s everywhere) ingested, trained for dgx-h100 into a fresh models
    folder, predicted: the linear layer's forward follows the samples, its backward is the grid's two GEMMs."""
    from predictor.calibrate.training import train_platform
    from predictor.samples import store
    d = tmp_path / "aic" / "h100_sxm" / "gemm" / "trtllm" / "9.9"
    d.mkdir(parents=True)
    (tmp_path / "aic" / "h100_sxm" / "system.yaml").write_text("gpu: {}\n")
    grid = [(m, n, k) for m in (256, 512, 1024, 2048, 4096, 8192) for n in (1024, 2048, 4096, 8192)
            for k in (1024, 2048, 4096, 8192)]
    lat_ms = [(2.0 * m * n * k / 600e12 + 8e-6) * 1e3 for m, n, k in grid]
    pd.DataFrame({"gemm_dtype": "bfloat16", "m": [g[0] for g in grid], "n": [g[1] for g in grid],
                  "k": [g[2] for g in grid], "latency": lat_ms}).to_parquet(d / "gemm_perf.parquet")
    db, models = tmp_path / "s.duckdb", tmp_path / "models"
    assert store.ingest_path(tmp_path / "aic", store_path=db).rows_added["op_samples"] == len(grid)
    rep = train_platform("dgx-h100", store_path=db, models_dir=models, cv_folds=0, write_readme=False)
    assert list(rep["op"]) == ["gemm"]
    pr = P.Predictor("dgx-h100", models_dir=models)
    assert pr.kernel_bank is not None and not pr.kernel_bank.has_op("flash_attn", "fwd")
    c = call("mlp_up", "fwd", b=1, l=2048, h=4096, ffn=8192)  # the sampled (m, n, k) = (2048, 8192, 4096)
    (tf, pf, _), (tb, pb, _) = pr.op_times([c, bwd_of(c)], "bf16")
    want = 2.0 * 2048 * 8192 * 4096 / 600e12 + 8e-6
    assert pf == "measured" and tf == pytest.approx(want, rel=0.1)
    # data gradient (2048, 4096, 8192) and weight gradient (4096, 8192, 2048): both sampled, same FLOPs
    assert pb == P.BWD_GEMM_PROVENANCE and tb == pytest.approx(2 * want, rel=0.15)


def test_measured_table_error_is_the_held_out_error_with_the_harness_bias() -> None:
    import math
    assert P.measured_table_error({"cv_mape": 0.02, "block_heldout": {"mape": 0.05}}) == pytest.approx(
        math.hypot(0.05, P.CROSS_HARNESS_BIAS))
    assert P.measured_table_error({"cv_mape": 0.02}) == pytest.approx(math.hypot(0.02, P.CROSS_HARNESS_BIAS))
    pr = P.Predictor("dgx-h100")
    info = pr.kernel_bank.op_info("gemm", "fwd")
    assert info["block_heldout"]["mape"] > 0  # the shipped grids carry their held-out error
    (_, prov, err), = pr.op_times([call("qkv_proj", "fwd")], "bf16")
    assert prov == "measured" and err == pytest.approx(P.measured_table_error(info))


def _synthetic_grid(slow_from_m: int | None = None) -> pd.DataFrame:
    rows = []
    for m in (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384):
        for n in (1024, 2048, 4096, 8192):
            for k in (1024, 2048, 4096, 8192):
                t = 2.0 * m * n * k / 600e12 + 8e-6
                if slow_from_m is not None and m >= slow_from_m:
                    t *= 1.5
                rows.append({"tp": 1, "batch": 1, "seq": m, "hidden": k, "ffn_hidden": n, "variant": "x/1",
                             "duration_s": t})
    return pd.DataFrame(rows)


def test_block_heldout_error_can_fail() -> None:
    """A smooth grid interpolates across a held-out m range; one whose largest m run 1.5x slower cannot be predicted
    from the others, and the held-out error says so."""
    from predictor.calibrate.training import block_heldout_error
    dev = get_platform("dgx-h100").device
    smooth = block_heldout_error("gemm", _synthetic_grid(), dev, "bf16")
    broken = block_heldout_error("gemm", _synthetic_grid(slow_from_m=4097), dev, "bf16")
    assert smooth is not None and broken is not None and smooth["rows"] > 0
    assert smooth["mape"] < 0.10 and broken["mape"] > 2 * smooth["mape"]

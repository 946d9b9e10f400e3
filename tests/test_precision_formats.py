"""mxfp8 and nvfp4 next to fp8 (predictor.step.fp8): their GEMM speed rules order as stated, their cast / scale
passes and memory are the format's bytes, devices without the format are refused naming `precision` and the GPUs
that run it, and bf16 / fp8 predictions are exactly what the fp8-only rule gave."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictor.hardware.platforms import get_platform, supported_precisions
from predictor.model.errors import InfeasibleConfig
from predictor.model.presets import get_preset
from predictor.model.specs import PRECISIONS, Layout
from predictor.plan.predict import Predictor
from predictor.regress import features
from predictor.step import fp8
from predictor.step.decompose import OpCall

L8 = dict(num_gpus=8, tp=1, pp=1, dp=8, micro_batch=1, global_batch=64)
SHAPE = [(1, 1, 4096, 4096, 32, 8, 14336, 128256, 32, None)]  # tp, b, l, h, heads, kv, ffn, vocab, layers, params


def _predict(platform: str, precision: str, model: str = "llama3-8b", **kw):
    lay = {**L8, **kw}
    return Predictor(get_platform(platform)).predict(get_preset(model), Layout(**lay, precision=precision))


def _gemm_s(platform: str, precision: str, op: str = "mlp_up", pass_: str = "fwd") -> tuple[float, float, str]:
    dev = get_platform(platform).device
    arr = features.arrays_from_shapes(SHAPE, None)
    t_bf16 = np.array([0.01])
    t, floor, how = fp8.gemm_times(op, pass_, arr, t_bf16, dev, dev.achievable_flops("bf16"), precision)
    return float(t[0]), float(floor[0]), how


def test_precisions_are_offered_where_the_device_runs_them():
    assert {"mxfp8", "nvfp4"} <= set(PRECISIONS)
    assert supported_precisions(get_platform("dgx-b200").device)[-3:] == ["fp8", "mxfp8", "nvfp4"]
    h100 = supported_precisions(get_platform("dgx-h100").device)
    assert "mxfp8" in h100 and "nvfp4" not in h100
    a100 = supported_precisions(get_platform("dgx-a100-80gb").device)
    assert not {"fp8", "mxfp8", "nvfp4"} & set(a100) and "bf16" in a100
    assert "mxfp8" not in supported_precisions(get_platform("mi300x-8").device)  # FP8, but no MX / blockwise path


@pytest.mark.parametrize("platform,precision,names", [
    ("dgx-h100", "nvfp4", ["b200-sxm-180gb", "gb200"]),
    ("dgx-a100-80gb", "mxfp8", ["h100-sxm5-80gb", "b200-sxm-180gb"]),
    ("dgx-a100-80gb", "nvfp4", ["gb200"]),
])
def test_a_device_without_the_format_is_refused_with_the_gpus_that_have_it(platform, precision, names):
    with pytest.raises(InfeasibleConfig) as e:
        _predict(platform, precision)
    assert e.value.field == "precision" and precision in e.value.problem
    assert all(n in e.value.fix for n in names)
    if platform.startswith("dgx-a100"):
        assert "fp8" not in e.value.fix.split(",")[0]  # A100 is not told to use fp8 either


def test_fp8_on_a100_is_still_refused():
    with pytest.raises(InfeasibleConfig, match="FP8 tensor cores") as e:
        _predict("dgx-a100-80gb", "fp8")
    assert e.value.field == "precision"


def test_gemm_speed_rules_order_as_stated():
    b_fp8, _, _ = _gemm_s("dgx-b200", "fp8")
    b_mx, _, how_mx = _gemm_s("dgx-b200", "mxfp8")
    b_nv, f_nv, how_nv = _gemm_s("dgx-b200", "nvfp4")
    assert b_nv < b_mx and b_nv < b_fp8                   # FP4 at twice the FP8 peak rate
    assert b_fp8 < b_mx < b_fp8 * 1.01                    # same rate as FP8 on Blackwell, scales cost bytes only
    assert "MXFP8 derived" in how_mx and "NVFP4 derived" in how_nv and "4500/9000" in how_nv
    dev = get_platform("dgx-b200").device
    r8, _ = fp8.matmul_ratio(dev)
    assert fp8.format_ratio(dev, "nvfp4")[0] == pytest.approx(r8 * 4500 / 9000)
    assert fp8.format_ratio(dev, "mxfp8")[0] == r8
    # Hopper's blockwise FP8 applies its scales on CUDA cores: slower than per-tensor FP8, by the DeepGEMM rate
    h_fp8, _, _ = _gemm_s("dgx-h100", "fp8")
    h_mx, _, how_h = _gemm_s("dgx-h100", "mxfp8")
    assert h_mx > h_fp8 and "blockwise FP8 derived" in how_h
    hdev = get_platform("dgx-h100").device
    assert fp8.format_ratio(hdev, "mxfp8")[0] == pytest.approx(fp8.matmul_ratio(hdev)[0] * 1402.6 / 1350)
    # the FP4 floor: FLOPs at the FP4-scaled achievable rate
    flops, _ = features.op_work("mlp_up", features.arrays_from_shapes(SHAPE, None), "bf16", "fwd")
    assert f_nv == pytest.approx(float(np.asarray(flops)[0]) / (dev.achievable_flops("bf16") / (r8 / 2)))


def test_cast_and_scale_passes_are_the_formats_bytes():
    arr = features.arrays_from_shapes(SHAPE, None)
    f, m, x = (float(fp8.cast_bytes("mlp_down", "bwd", arr, p)[0]) for p in ("fp8", "mxfp8", "nvfp4"))
    assert m / f == pytest.approx((2 + 2 * (1 + 1 / 32)) / 4)
    assert x / f == pytest.approx((2 + 2 * (0.5 + 1 / 16)) / 4)
    assert fp8.saved_input_bytes("nvfp4", 2) == 0.5 + 1 / 16 and fp8.saved_input_bytes("bf16", 2) == 2


def test_fp8_rule_is_unchanged():
    """The fp8 path computed here from the fp8-only formula (module docstring) equals what gemm_times gives."""
    for platform in ("dgx-h100", "dgx-b200", "mi300x-8", "pcie-l40s-8"):
        dev = get_platform(platform).device
        arr = features.arrays_from_shapes(SHAPE, None)
        for op in sorted(fp8.FP8_GEMM_OPS):
            for ps in ("fwd", "bwd"):
                t_bf16 = np.array([0.004])
                ach = dev.achievable_flops("bf16") or dev.peak_flops("bf16")
                r, from_mamf = fp8.matmul_ratio(dev)
                flops, byts = (np.asarray(v, dtype=float) for v in features.op_work(op, arr, "bf16", ps))
                t_c, t_m = flops / ach, byts / dev.hbm_bytes_per_s
                want = np.maximum(t_bf16 * (1 - t_c / (t_c + t_m) * (1 - r)), flops / (ach / r))
                d = features._dims(features.shape_arrays(arr))
                M, N, K, _ = features.gemm_mnk(op, d)
                want = want + 4.0 * (M * N if ps == "bwd" else M * K + K * N) / dev.hbm_bytes_per_s
                got, _, how = fp8.gemm_times(op, ps, arr, t_bf16, dev, dev.achievable_flops("bf16"))
                assert got[0] == want[0]
                assert how == (fp8.FP8_PROVENANCE if from_mamf else fp8.FP8_PEAK_PROVENANCE)


def test_predictions_through_predict_order_and_say_what_they_rest_on():
    bf, f8, mx, nv = (_predict("dgx-b200", p) for p in ("bf16", "fp8", "mxfp8", "nvfp4"))
    # the measured B200 grids: NVFP4 faster than blockwise (MX-style) FP8, itself faster than per-tensor FP8
    assert nv.step_time_s < mx.step_time_s < f8.step_time_s < bf.step_time_s
    # memory: the saved GEMM inputs and weight copies at the format's bytes
    assert nv.memory_gib < f8.memory_gib < mx.memory_gib
    assert bf.mfu < nv.mfu  # MFU against the BF16 peak for every low-precision format
    ops = nv.ops
    gemm = ops[ops["op"].isin(sorted(fp8.FP8_GEMM_OPS))]
    assert len(gemm) and gemm["provenance"].str.contains("NVFP4 GEMM grid").all()
    # the same Blackwell GPU without its tables falls back to the derived rule and says so
    P = Predictor(get_platform("dgx-b200"))
    P.kernel_bank = None
    call = OpCall("mlp_up", "fwd", SHAPE[0], 1.0, "fwd", "layer")
    (_, prov, err), = P.op_times([call], "nvfp4")
    assert "NVFP4 derived" in prov and err >= fp8.NVFP4_ASSUMED_ERROR
    rest = ops[(ops["category"] == "compute") & ~ops["op"].isin(sorted(fp8.FP8_GEMM_OPS))]
    # lm_head, attention, norms: BF16 as under fp8 (no format rule; a backward GEMM may still be derived from the
    # measured forward grid, which says so in its own words)
    assert not rest["provenance"].str.contains(r"FP[48] derived").any()
    assert nv.expected_error >= f8.expected_error


def test_predict_batch_takes_the_new_precisions():
    from predictor.plan.batch import predict_records
    rows = ([{"case_id": p, "platform": "dgx-b200", "model": "llama3-8b", **L8, "seq_len": 4096,
                          "precision": p} for p in ("bf16", "mxfp8", "nvfp4")]
                        + [{"case_id": "h100-nvfp4", "platform": "dgx-h100", "model": "llama3-8b", **L8,
                            "seq_len": 4096, "precision": "nvfp4"}])
    by = pd.DataFrame(predict_records(rows)).set_index("case_id")
    assert by.loc["nvfp4", "step_time_s"] < by.loc["mxfp8", "step_time_s"] < by.loc["bf16", "step_time_s"]
    bad = by.loc["h100-nvfp4"]
    assert "precision" in str(bad.to_dict()) and "b200" in str(bad.to_dict())


def test_search_with_nvfp4_on_b200():
    from predictor.cli.main import main
    assert main(["search", "--platform", "dgx-b200", "--model", "llama3-8b", "--num-gpus", "8",
                 "--global-batch", "64", "--seq-len", "4096", "--precision", "nvfp4", "--top", "2"]) == 0
    assert main(["search", "--platform", "dgx-h100", "--model", "llama3-8b", "--num-gpus", "8",
                 "--global-batch", "64", "--seq-len", "4096", "--precision", "nvfp4", "--top", "2"]) != 0


def test_dashboard_offers_only_the_devices_precisions():
    from tests.test_app import run

    def options(platform: str, page: str | None = None) -> list[str]:
        q = {"sr_platform": platform, "sr_num_gpus": 16, "sr_global_batch": 32} if page else {"platform": platform}
        at = run(page, q)
        return list(next(s for s in at.selectbox if s.label == "Precision").options)
    assert options("dgx-b200")[-3:] == ["fp8", "mxfp8", "nvfp4"]
    h = options("dgx-h100")
    assert "mxfp8" in h and "nvfp4" not in h
    assert not {"fp8", "mxfp8", "nvfp4"} & set(options("dgx-a100-80gb"))
    assert options("dgx-b200", "pages/search.py")[-1] == "nvfp4"
    assert "nvfp4" not in options("dgx-h100", "pages/search.py")


def test_dashboard_predicts_nvfp4_on_b200():
    from tests.test_app import metric, run
    at = run(query={"platform": "dgx-b200", "model": "llama3-8b", "num_gpus": 8, "tp": 1, "pp": 1,
                    "global_batch": 64, "seq_len": 4096, "sequence_parallel": "false", "precision": "nvfp4"})
    assert next(s for s in at.selectbox if s.label == "Precision").value == "nvfp4"
    assert metric(at, "Step time")

"""FP8 training precision (predictor.step.fp8): accepted where the device has FP8 tensor cores, refused elsewhere
naming the field; FP8 GEMMs faster than their BF16 twins by less than the MAMF ratio; everything else unchanged."""
from __future__ import annotations

import json

import numpy as np
import pytest

from predictor.checks import independent as ind
from predictor.cli.main import main
from predictor.model.errors import InfeasibleConfig
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.plan.batch import predict_records
from predictor.plan.predict import get_predictor
from predictor.plan.search import SearchSpace, search
from predictor.step import fp8
from predictor.step.decompose import layer_unit
from predictor.step.memory import estimate_memory

LAYOUT = dict(num_gpus=64, tp=8, pp=4, dp=2, micro_batch=1, global_batch=64, seq_len=4096, sequence_parallel=True,
              zero_stage=1)


def _pair(platform="dgx-h100", model="llama3-70b"):
    P = get_predictor(platform)
    m = get_preset(model)
    return P, m, P.predict(m, Layout(**LAYOUT, precision="bf16"), timeline=False), \
        P.predict(m, Layout(**LAYOUT, precision="fp8"), timeline=False)


def test_cli_accepts_fp8_on_h100_and_refuses_it_on_a100_naming_the_field(capsys):
    args = ["predict", "--model", "llama3-8b", "--num-gpus", "8", "--tp", "8", "--global-batch", "8",
            "--precision", "fp8"]
    assert main([*args, "--platform", "dgx-h100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout"]["precision"] == "fp8"
    assert main([*args, "--platform", "dgx-a100-80gb"]) == 2
    err = capsys.readouterr()
    text = err.out + err.err
    assert "precision" in text and "use bf16, or a Hopper/Blackwell/MI300 device" in text


def test_fp8_is_refused_on_devices_without_fp8_tensor_cores_never_a_silent_bf16_fallback():
    for pid in ("dgx-a100-80gb", "perlmutter-a100"):
        P = get_predictor(pid)
        with pytest.raises(InfeasibleConfig) as e:
            P.predict(get_preset("llama3-8b"), Layout(num_gpus=8, tp=8, global_batch=8, precision="fp8"))
        assert e.value.field == "precision" and "bf16" in e.value.fix
    from predictor.hardware.platforms import get_platform
    for pid in ("cpu-1t",):
        with pytest.raises(InfeasibleConfig):
            get_platform(pid).device.check_precision("fp8")


def test_predict_batch_row_error_and_search_message():
    base = {"model": "llama3-8b", "num_gpus": "8", "tp": "8", "global_batch": "8", "precision": "fp8"}
    out = predict_records([{**base, "platform": "dgx-h100"}, {**base, "platform": "dgx-a100-80gb"}])
    assert not out[0]["error"] and float(out[0]["step_time_s"]) > 0
    assert out[1]["error"] and "precision" in out[1]["error"] and not out[1]["step_time_s"]
    with pytest.raises(InfeasibleConfig) as e:
        search(get_preset("llama3-8b"), "dgx-a100-80gb", 8, 64, 2048, space=SearchSpace(precision="fp8"))
    assert e.value.field == "precision"
    rep = search(get_preset("llama3-8b"), "dgx-h100", 8, 64, 2048, top_k=1, refine=False,
                 space=SearchSpace(precision="fp8"))
    assert len(rep.table) and (rep.table["precision"] == "fp8").all()


def test_fp8_gemms_are_faster_by_less_than_the_mamf_ratio_and_the_rest_is_unchanged():
    # a GPU whose FP8 GEMMs no table measures: the derived rule (dgx-h100 has a measured FP8 grid, below)
    P, m, b, f = _pair("vista-gh200")
    dev = P.platform.device
    r, from_mamf = fp8.matmul_ratio(dev)
    assert from_mamf and r == pytest.approx(828.6 / 1535.0)
    assert f.step_time_s < b.step_time_s
    assert f.breakdown_s["compute"] > b.breakdown_s["compute"] * r   # casts and memory-bound shares cost something
    for c in ("tp_comm", "pp_comm", "dp_comm", "optimizer"):
        assert f.breakdown_s[c] == pytest.approx(b.breakdown_s[c], rel=1e-12)
    unit = layer_unit(m, 8, 1, 4096, True, "none", "bf16", (8, 1, 8))
    tb, tf = P.op_times(unit.ops, "bf16"), P.op_times(unit.ops, "fp8")
    gemm_b = gemm_f = 0.0
    for c, (sb, pb, _), (sf, pf, _) in zip(unit.ops, tb, tf):
        if c.op in fp8.FP8_GEMM_OPS:
            assert sf > sb * r, c.op   # never the full MAMF ratio (a small GEMM's casts can even outweigh the gain)
            assert fp8.FP8_PROVENANCE in pf and pb in pf
            gemm_b, gemm_f = gemm_b + sb * c.count, gemm_f + sf * c.count
        else:
            assert sf == sb and pf == pb, c.op
    assert gemm_b * r < gemm_f < gemm_b
    assert any(fp8.FP8_PROVENANCE in k for k in f.provenance_share)


def test_fp8_gemms_on_a_measured_fp8_grid_are_measured_and_still_faster_than_bf16():
    P, m, b, f = _pair("dgx-h100")
    r, _ = fp8.matmul_ratio(P.platform.device)
    unit = layer_unit(m, 8, 1, 4096, True, "none", "bf16", (8, 1, 8))
    tb, tf = P.op_times(unit.ops, "bf16"), P.op_times(unit.ops, "fp8")
    gemm_b = gemm_f = 0.0
    for c, (sb, pb, _), (sf, pf, _) in zip(unit.ops, tb, tf):
        if c.op in fp8.FP8_GEMM_OPS:
            assert pf.startswith("measured") and "FP8 GEMM grid" in pf and fp8.FP8_PROVENANCE not in pf, c.op
            gemm_b, gemm_f = gemm_b + sb * c.count, gemm_f + sf * c.count
        else:
            assert sf == sb and pf == pb, c.op
    # the measured grid: faster than BF16, but by less than the MAMF ratio the rule assumed
    assert gemm_b * r < gemm_f < gemm_b
    assert f.step_time_s < b.step_time_s


def test_fp8_mfu_is_against_the_bf16_peak_and_under_the_fp8_matmul_ceiling():
    P, _, b, f = _pair()
    dev = P.platform.device
    assert f.mfu / b.mfu == pytest.approx(b.step_time_s / f.step_time_s, rel=1e-9)  # same FLOPs, same peak
    rep = search(get_preset("llama3-8b"), P, 64, 512, 4096, top_k=1, refine=False,
                 space=SearchSpace(recompute=("none",), zero_stage=(0, 1), precision="fp8"))
    ok = rep.table[np.isfinite(rep.table["mfu"])]
    assert ok["mfu"].max() <= dev.achievable_flops("fp8") / dev.peak_flops("bf16") * (1 + 1e-9)


def test_fp8_memory_has_fp8_weight_and_transpose_copies_and_smaller_activations():
    m = get_preset("llama3-70b")
    for rc in ("none", "selective", "full"):
        kw = {**LAYOUT, "recompute": rc}
        b = estimate_memory(m, Layout(**kw, precision="bf16")).peak
        f = estimate_memory(m, Layout(**kw, precision="fp8")).peak
        from predictor.model.params import layer_matmul_params
        # an FP8 weight and its FP8 transpose (TE on Hopper) per GEMM parameter: 2 bytes, tp 8
        extra = 2 * layer_matmul_params(m) / 8 * f.layers
        assert f.weights_bytes == pytest.approx(b.weights_bytes + extra)
        assert f.activations_bytes <= b.activations_bytes
        assert f.grads_bytes == b.grads_bytes and f.optimizer_bytes == b.optimizer_bytes
    assert estimate_memory(m, Layout(**LAYOUT, precision="fp8")).peak.activations_bytes < \
        estimate_memory(m, Layout(**LAYOUT, precision="bf16")).peak.activations_bytes


def test_the_fp8_independent_source_checks_and_predicts_every_row():
    src = ind.load_sources()["llm-foundry-h100-fp8"]
    assert src["precision"] == "fp8" and src["peak_flops_basis"] == "fp8"
    d, dropped = ind.published_runs(src)
    assert dropped == {} and len(d) == 10
    # against the BF16 peak the same rows would all fail the MFU check: the basis matters
    d2, dropped2 = ind.published_runs({**src, "peak_flops_basis": "bf16"})
    assert len(d2) == 0 and sum(dropped2.values()) == 10
    c = ind.run_check("llm-foundry-h100-fp8")
    assert len(c.runs) == 10 and c.runs["predicted_s"].notna().all()
    assert c.runs["provenance"].str.contains("per-tensor FP8 GEMM grid", regex=False).all()


def test_fp8_gemm_sampler_refuses_on_cpu():
    from bench.kernels import opbench
    ok, why = opbench.fp8_supported("cpu")
    assert not ok and "8.9" in why
    with pytest.raises(opbench.Fp8Unsupported, match="compute capability"):
        opbench.build_fp8_gemm("mlp_up", {"tp": 1, "batch": 1, "seq": 128, "hidden": 256, "ffn_hidden": 1024}, "cpu")

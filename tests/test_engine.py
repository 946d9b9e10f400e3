"""The one step-time engine: search, predict and predict-batch agree; physical ceilings hold."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictor.hardware.platforms import get_platform
from predictor.model.errors import InfeasibleConfig
from predictor.model.frameworks import FRAMEWORK_SPECS, FRAMEWORKS
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.plan.predict import get_predictor
from predictor.plan.search import SearchSpace, layout_of, search
from predictor.step.compose import CATEGORIES
from predictor.step.memory import estimate_memory

# (model, platform, GPUs, global batch, sequence, framework): different shapes, fabrics, data behind them
SEARCHES = [
    ("llama3-8b", "dgx-a100-80gb", 64, 256, 4096, "megatron"),
    ("gpt3-13b", "perlmutter-a100", 32, 64, 2048, "megatron-deepspeed"),
    ("llama3-70b", "dgx-h100", 256, 512, 8192, "megatron"),
    ("mistral-7b", "vista-gh200", 16, 64, 4096, "fsdp"),
    ("gpt3-2.7b", "dgx-b200", 48, 96, 2048, "deepspeed"),
    ("llama2-13b", "dgx-a100-40gb", 32, 128, 4096, "ddp"),
    # Mixture-of-Experts: expert parallelism enumerated too (ep dividing num_experts and tp x cp x dp)
    ("mixtral-8x7b", "dgx-h100", 64, 256, 4096, "megatron"),
    ("qwen3-30b-a3b", "dgx-b200", 32, 128, 4096, "megatron"),
]


@pytest.mark.parametrize("name,platform,n,gb,seq,fw", SEARCHES)
def test_search_and_predict_are_one_engine(name, platform, n, gb, seq, fw):
    """Random layouts of every search (a few hundred in all, fitting or not): the search table's step time,
    breakdown and memory equal Predictor.predict's to float rounding."""
    _search_and_predict_agree(name, platform, n, gb, seq, fw, "bf16")


@pytest.mark.parametrize("name,platform,n,gb,seq,fw", [s for s in SEARCHES
                                                       if get_platform(s[1]).device.peak_tflops.get("fp8")])
def test_search_and_predict_are_one_engine_in_fp8(name, platform, n, gb, seq, fw):
    """The same agreement for fp8 layouts, on every platform of SEARCHES whose device has FP8 tensor cores."""
    _search_and_predict_agree(name, platform, n, gb, seq, fw, "fp8")


@pytest.mark.parametrize("name,platform,n,gb,seq,fw,precision", [
    ("llama3-70b", "dgx-h100", 256, 512, 8192, "megatron", "mxfp8"),      # Hopper blockwise FP8
    ("gpt3-2.7b", "dgx-b200", 48, 96, 2048, "deepspeed", "mxfp8"),        # Blackwell MXFP8
    ("qwen3-30b-a3b", "dgx-b200", 32, 128, 4096, "megatron", "nvfp4"),    # Blackwell NVFP4, MoE
])
def test_search_and_predict_are_one_engine_in_block_scaled_formats(name, platform, n, gb, seq, fw, precision):
    """The same agreement for mxfp8 / nvfp4 layouts (predictor.step.fp8)."""
    _search_and_predict_agree(name, platform, n, gb, seq, fw, precision)


def _search_and_predict_agree(name, platform, n, gb, seq, fw, precision):
    P = get_predictor(platform)
    model = get_preset(name)
    # the default space enumerates context parallelism too (cp = 1, 2, 4, ... where valid)
    rep = search(model, P, n, gb, seq, top_k=1, refine=False,
                 space=SearchSpace(framework=fw, schedules=("1f1b", "interleaved", "gpipe"), precision=precision))
    t = rep.table
    assert (t["cp"] > 1).any() == (model.attention_impl in ("flash", "triton") and model.sliding_window is None)
    assert (t["ep"] > 1).any() == model.is_moe
    assert len(t) >= 50
    rng = np.random.default_rng(7)
    for i in rng.choice(len(t), size=50, replace=False):
        row = t.iloc[int(i)]
        L = layout_of(row)
        assert L.framework == fw and L.precision == precision
        p = P.predict(model, L, timeline=False)
        assert row["step_time_s"] == pytest.approx(p.step_time_s, rel=1e-9)
        for c in CATEGORIES:
            assert row[f"{c}_s"] == pytest.approx(p.breakdown_s[c], rel=1e-9, abs=1e-12 * p.step_time_s)
        assert row["peak_mem_gib"] == pytest.approx(p.memory_gib, rel=1e-12)
        assert bool(row["fits"]) == p.fits_memory == p.memory.fits
        assert p.memory.peak_bytes == pytest.approx(estimate_memory(model, L, P.platform).peak_bytes, rel=1e-12)
        if row["expected_error"] == row["expected_error"]:  # the band is computed for the best rows
            assert row["expected_error"] == pytest.approx(p.expected_error, rel=1e-9)


def test_predict_batch_equals_predict():
    """predict-batch (Predictor.predict_many) and predict give the same numbers."""
    P = get_predictor("dgx-a100-80gb")
    rng = np.random.default_rng(3)
    items = []
    while len(items) < 60:
        model = get_preset(str(rng.choice(["llama3-8b", "gpt3-1.3b", "llama2-13b"])))
        tp, pp, dp, mb, cp = (int(rng.choice(v)) for v in ([1, 2, 4, 8], [1, 2, 4], [1, 2, 8], [1, 2], [1, 1, 2, 4]))
        rc, fw = str(rng.choice(["none", "full", "selective"])), str(rng.choice(FRAMEWORKS))
        # selective recomputation by module (Megatron-Core's recompute_modules; the default core_attn elsewhere)
        mods = (tuple(m for m in ("core_attn", "mlp") if rng.random() < 0.5)
                if rc == "selective" and fw == "megatron" else None)
        L = Layout(num_gpus=tp * pp * cp * dp, tp=tp, pp=pp, dp=dp, cp=cp, micro_batch=mb, global_batch=mb * dp * 4,
                   seq_len=int(rng.choice([1024, 4096])), recompute=rc, zero_stage=int(rng.choice([0, 1])),
                   framework=fw, recompute_modules=mods)
        try:
            L.validate(model)
        except InfeasibleConfig:
            continue
        items.append((model, L))
    assert any(L.recompute == "selective" and L.recompute_modules for _, L in items)
    batch = P.predict_many(items)
    for (model, L), b in zip(items, batch):
        p = P.predict(model, L, timeline=False)
        assert b.step_time_s == pytest.approx(p.step_time_s, rel=1e-12)
        assert b.memory_gib == pytest.approx(p.memory_gib, rel=1e-12)
        assert b.expected_error == pytest.approx(p.expected_error, rel=1e-12)
        assert b.provenance == p.provenance


@pytest.mark.parametrize("platform", ["dgx-a100-80gb", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72",
                                      "vista-gh200", "mi300x-8"])
def test_no_prediction_beats_the_achievable_matmul_ceiling(platform):
    """Every GEMM-class operator is floored at its FLOPs over the device's measured achievable matmul
    throughput (MAMF), so no layout's MFU exceeds MAMF / peak, whatever the regressors extrapolate to."""
    P = get_predictor(platform)
    dev = P.platform.device
    ceiling = P.achievable_flops("bf16") / dev.peak_flops("bf16")
    rep = search(get_preset("llama3-8b"), P, 64, 512, 4096, top_k=1, refine=False,
                 space=SearchSpace(recompute=("none",), zero_stage=(0, 1)))
    ok = rep.table[np.isfinite(rep.table["mfu"])]
    assert len(ok) > 20
    assert ok["mfu"].max() <= ceiling * (1 + 1e-9)
    # the floor binds somewhere only when it has to: an A100 measured on its own samples stays below it
    best = P.predict(get_preset("llama3-8b"), Layout(num_gpus=8, tp=1, dp=8, micro_batch=4, global_batch=32,
                                                     seq_len=4096), timeline=False)
    assert best.mfu <= ceiling


def test_framework_decides_when_the_gradients_are_reduced():
    """Same layout, four frameworks: Megatron / Megatron-DeepSpeed reduce after the backward (the whole
    sync shows), DDP hides it behind the backward but the last bucket, FSDP and DeepSpeed add per
    micro-batch ZeRO traffic at stage 3; an unknown framework is a clear error naming the valid ones."""
    P = get_predictor("dgx-a100-80gb")
    m = get_preset("llama3-8b")
    base = dict(num_gpus=64, tp=1, pp=1, dp=64, micro_batch=2, global_batch=128, seq_len=4096)
    dp = {fw: P.predict(m, Layout(**base, framework=fw), timeline=False).breakdown_s["dp_comm"]
          for fw in ("megatron", "megatron-deepspeed", "ddp")}
    assert dp["megatron"] == pytest.approx(dp["megatron-deepspeed"], rel=1e-9)
    assert dp["ddp"] < 0.5 * dp["megatron"]
    over = P.predict(m, Layout(**base, framework="megatron", overlap_grad_reduce=True), timeline=False)
    assert over.breakdown_s["dp_comm"] == pytest.approx(dp["ddp"], rel=1e-9)
    # DeepSpeed ZeRO-2 gathers the parameters once per step; FSDP SHARD_GRAD_OP before every micro-batch
    z2 = dict(base, micro_batch=1, zero_stage=2)
    ds = P.predict(m, Layout(**z2, framework="deepspeed"), timeline=False)
    fs = P.predict(m, Layout(**z2, framework="fsdp"), timeline=False)
    gathers = lambda p: p.ops[p.ops["op"] == "allgather[dp]"]  # noqa: E731
    assert set(gathers(ds)["phase"]) == {"step"} and set(gathers(fs)["phase"]) == {"fwd"}
    with pytest.raises(InfeasibleConfig) as e:
        Layout(**base, framework="jax").validate(m)
    assert e.value.field == "framework" and all(f in str(e.value) for f in FRAMEWORKS)
    with pytest.raises(InfeasibleConfig) as e:
        Layout(**dict(base, tp=1, pp=2, dp=32), zero_stage=3, framework="deepspeed").validate(m)
    assert e.value.field == "zero_stage"
    assert set(FRAMEWORK_SPECS) == set(FRAMEWORKS)


def test_predict_batch_framework_column(tmp_path):
    from predictor.cli.main import main
    from predictor.model.layout_io import BATCH_COLUMNS
    row = dict.fromkeys(BATCH_COLUMNS, "")
    row.update(case_id="a", platform="dgx-a100-80gb", arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8,
               ffn_hidden=14336, vocab=128256, seq_len=4096, num_gpus=64, tp=1, pp=1, dp=64, micro_batch=2,
               global_batch=128)
    rows = [dict(row, case_id=fw, framework=fw) for fw in ("megatron", "ddp", "nonsense")]
    src = tmp_path / "in.csv"
    pd.DataFrame(rows).to_csv(src, index=False)
    # the layout needs 145 GiB per A100: --allow-oom for the times (without it they are empty, see test_cli)
    assert main(["predict-batch", "--input", str(src), "--output", str(tmp_path / "out.csv"), "--allow-oom"]) == 0
    out = pd.read_csv(tmp_path / "out.csv", keep_default_na=False).set_index("case_id")
    assert set(out.loc[["megatron", "ddp"], "fits"]) == {"False"}
    assert float(out.loc["ddp", "dp_comm_s"]) < float(out.loc["megatron", "dp_comm_s"])
    assert "framework" in out.loc["nonsense", "error"] and "megatron-deepspeed" in out.loc["nonsense", "error"]


def test_megatron_core_runs_fused_memory_bound_kernels():
    """Megatron-Core (framework megatron) times norms, RoPE, SwiGLU and residual adds as one fused pass at the HBM
    bandwidth (FUSED_BANDWIDTH_EFFICIENCY); Megatron-DeepSpeed keeps the sampled kernels; a CPU platform never fuses."""
    from predictor.regress import features
    from predictor.step.decompose import FUSABLE_OPS
    P = get_predictor("dgx-h100")
    m = get_preset("llama3-8b")
    L = Layout(num_gpus=8, dp=8, micro_batch=1, global_batch=16, seq_len=4096, zero_stage=1)
    core = P.predict(m, L, timeline=False).ops
    ds = P.predict(m, Layout(**{**L.__dict__, "framework": "megatron-deepspeed"}), timeline=False).ops
    fused = core[core["op"].isin(FUSABLE_OPS)]
    assert len(fused) and (fused["provenance"] == "analytical (fused kernel)").all()
    assert not (ds["provenance"] == "analytical (fused kernel)").any()
    row = fused[(fused["op"] == "rmsnorm") & (fused["pass"] == "bwd") & (fused["part"] == "layer")].iloc[0]
    want = features.fused_kernel_s("rmsnorm", "bwd", {"batch": 1, "seq": 4096, "hidden": 4096},
                                   P.platform.device, "bf16")
    assert row["seconds_each"] == pytest.approx(float(want[0]), rel=1e-9)
    rms_ds = ds[(ds["op"] == "rmsnorm") & (ds["pass"] == "bwd") & (ds["part"] == "layer")].iloc[0]
    assert rms_ds["seconds_each"] > row["seconds_each"]   # the sampled (unfused) kernel takes several passes
    cpu = get_predictor("cpu-2t").predict(get_preset("llama3-8b"), Layout(num_gpus=1, global_batch=1, seq_len=128,
                                                                            precision="fp32"), timeline=False).ops
    assert not (cpu["provenance"] == "analytical (fused kernel)").any()


def test_gradient_accumulation_pass_by_framework():
    """Every micro-batch after the first adds its gradients into the earlier ones': a memory-bound pass over the
    gradients the rank holds (3 x gradient bytes per parameter, timed as the sampled elementwise add), except under
    Megatron, whose weight-gradient GEMM accumulates itself. FSDP / ZeRO-3 accumulate only their shard."""
    from predictor.model.params import chunk_params
    P = get_predictor("dgx-a100-80gb")
    m = get_preset("llama3-8b")
    base = dict(num_gpus=8, tp=2, pp=1, dp=4, micro_batch=1, seq_len=2048)

    def run(fw: str, steps: int, **kw):
        return P.predict(m, Layout(**base, global_batch=4 * steps, framework=fw, **kw), timeline=False)

    def accum(p):
        ops = p.ops
        return ops[ops["part"] == "grad_accum"]

    assert accum(run("megatron", 8)).empty and accum(run("megatron-deepspeed", 1)).empty
    ds8, ds1 = run("megatron-deepspeed", 8), run("megatron-deepspeed", 1)
    acc = accum(ds8)
    assert len(acc) and set(acc["op"]) == {"grad_accum (res_add)"} and set(acc["phase"]) == {"bwd"}
    per_mb = float(acc["seconds_total"].sum())   # the table is per micro-batch: 7/8 of a pass each
    acc_s = 8 * per_mb
    # the pass's time is on the critical path: compute grows by it beyond 8 x one micro-batch's (slowed, like every
    # GPU operator, by the slowest of the job's 8 GPUs: predictor.step.terms.slowest_of)
    from predictor.step.terms import slowest_of
    slow = 1.0 + (P.terms.speed_spread if P.terms is not None else 0.0) * float(slowest_of(8))
    assert ds8.breakdown_s["compute"] - 8 * ds1.breakdown_s["compute"] == pytest.approx(acc_s * slow, rel=1e-6)
    # 7 passes over this GPU's gradients (fp32 for bf16: 12 bytes per parameter) at no more than the HBM bandwidth
    n = chunk_params(m, 2, 1, m.num_layers, True, True, 2048)
    bytes_moved = 7 * 3 * 4 * n
    bw = P.platform.device.hbm_bandwidth_gbps * 1e9
    assert bytes_moved / bw < acc_s < 2 * bytes_moved / bw
    bf16_grads = float(accum(run("megatron-deepspeed", 8, grad_reduce_in_fp32=False))["seconds_total"].sum())
    assert bf16_grads == pytest.approx(per_mb / 2, rel=0.05)
    ddp = float(accum(run("ddp", 8))["seconds_total"].sum())
    assert ddp == pytest.approx(per_mb, rel=1e-9)
    fsdp = float(accum(run("fsdp", 8, zero_stage=3))["seconds_total"].sum())
    assert fsdp == pytest.approx(per_mb / 4, rel=0.1)


@pytest.mark.parametrize("platform", ["dgx-a100-80gb", "vista-gh200"])
def test_optimizer_stage_variants_timed_together_equal_each_alone(platform):
    """op_times asks the optimizer regressor once for every stage variant (the variant is one of its features):
    the same seconds, provenance and error as asking for each variant in a fresh predictor of its own."""
    from predictor.plan.predict import Predictor
    from predictor.step.decompose import OpCall, make_shape
    calls = [OpCall("optimizer", "step", make_shape(tp=2, hidden=4096, layers=n, params=p), 1, "step", "optimizer",
                    variant=v)
             for n, p, v in ((8, 900_000_000, "first"), (8, 800_000_000, "middle"), (8, 1_000_000_000, "last"),
                             (16, 1_700_000_000, "middle"))]
    together = Predictor(platform).op_times(calls, "bf16")
    alone = [Predictor(platform).op_times([c], "bf16")[0] for c in calls]
    assert together == alone
    assert len({t for t, _, _ in together}) == len(calls)   # the variants are not all answered alike

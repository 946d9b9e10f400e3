"""Cross-GPU transfer of operator regressors, and its use by the Predictor."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictor.hardware.platforms import get_platform, load_devices, make_cluster
from predictor.model.errors import InfeasibleConfig
from predictor.regress import features as F
from predictor.regress import transfer as T

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
DEV = load_devices()
A100, GH200, H100 = DEV["a100-sxm4-80gb"], DEV["gh200-96gb"], DEV["h100-sxm5-80gb"]


def shapes(**kw) -> pd.DataFrame:
    return pd.DataFrame({k: [v] if np.isscalar(v) else v for k, v in kw.items()})


BIG_GEMM = shapes(tp=1, batch=8, seq=4096, hidden=8192, ffn_hidden=32768)
ELTWISE = shapes(tp=1, batch=8, seq=4096, hidden=8192, ffn_hidden=32768)
FLASH = shapes(tp=1, batch=8, seq=4096, hidden=4096, heads=32)


def test_same_device_ratio_is_one():
    for op, sh in (("mlp_up", BIG_GEMM), ("gelu", ELTWISE), ("flash_attn", FLASH)):
        assert T.transfer_ratio(op, "fwd", sh, A100, A100)[0] == pytest.approx(1.0)


def test_compute_bound_gemm_scales_with_achievable_matmul():
    r = T.transfer_ratio("mlp_up", "fwd", BIG_GEMM, GH200, A100)[0]
    mamf = GH200.achievable_matmul_tflops["bf16"] / A100.achievable_matmul_tflops["bf16"]
    assert r == pytest.approx(mamf, rel=0.05)
    peak_cfg = T.TransferConfig(achievable_compute=False)
    ratio = T.transfer_ratio("mlp_up", "fwd", BIG_GEMM, GH200, A100, cfg=peak_cfg)[0]
    assert ratio == pytest.approx(989 / 312, rel=0.05)


def test_memory_bound_op_scales_with_hbm():
    r = T.transfer_ratio("gelu", "fwd", ELTWISE, GH200, A100)[0]
    assert r == pytest.approx(4000 / 2039, rel=0.03)


def test_flash_attention_uses_kernel_utilisation():
    r = T.transfer_ratio("flash_attn", "fwd", FLASH, GH200, A100)[0]
    assert r == pytest.approx(0.35 * 989 / (0.615 * 312), rel=0.05)
    no_util = T.TransferConfig(kernel_utilization=False)
    assert T.transfer_ratio("flash_attn", "fwd", FLASH, GH200, A100, cfg=no_util)[0] > 2.8


def test_unpublished_mamf_keeps_the_source_efficiency():
    l4 = DEV["l4"]
    C = T.compute_roof("mlp_up", l4, "bf16", source=A100)
    assert C == pytest.approx(l4.peak_flops("bf16") * 271.2 / 312, rel=1e-6)


def test_wave_quantisation_uses_each_sm_count():
    # 108 tiles: one full wave on A100 (108 SMs), 0.82 of a wave on an H100 (132 SMs)
    sh = shapes(tp=1, batch=1, seq=128 * 9, hidden=4096, ffn_hidden=12 * 128 * 4)
    w_a = T.wave_efficiency("mlp_up", F.shape_arrays(sh), A100)[0]
    w_h = T.wave_efficiency("mlp_up", F.shape_arrays(sh), H100)[0]
    assert w_a == pytest.approx(1.0) and w_h == pytest.approx(108 / 132)


class FakeBank:
    """predict_op returns 1 ms x (1 + hidden/1e4) on any device; records which device it was asked for."""

    def __init__(self):
        self.devices = []

    def has_op(self, op, pass_):
        return True

    def predict_op(self, op, pass_, df, device, precision="fp16"):
        self.devices.append(device.device_id)
        return 1e-3 * (1 + np.asarray(df["hidden"], float) / 1e4)


def test_predict_transferred_evaluates_the_source_device():
    bank = FakeBank()
    t = T.predict_transferred(bank, "mlp_up", "fwd", BIG_GEMM, A100, GH200)
    assert bank.devices == ["a100-sxm4-80gb"]
    assert t[0] == pytest.approx(1e-3 * 1.8192 * T.transfer_ratio("mlp_up", "fwd", BIG_GEMM, A100, GH200)[0])
    base = T.predict_transferred(bank, "mlp_up", "fwd", BIG_GEMM, A100, GH200, cfg=T.TransferConfig(method="baseline"))
    assert bank.devices[-1] == "gh200-96gb" and base[0] == pytest.approx(1.8192e-3)


def test_evaluate_transfer_and_summary():
    bank = FakeBank()
    target = pd.concat([shapes(op="mlp_up", **{"pass": "fwd"}, tp=1, batch=4, seq=2048, hidden=h, ffn_hidden=4 * h)
                        for h in (2048, 4096, 8192)], ignore_index=True)
    target["duration_s"] = [5e-4, 1e-3, 3e-3]
    res = T.evaluate_transfer(bank, A100, GH200, target, [T.DEFAULT_CONFIG, T.TransferConfig(method="baseline")])
    assert set(res["config"]) == {T.DEFAULT_CONFIG.label(), "baseline"} and (res["n"] == 3).all()
    s = T.summarize(res)
    assert len(s) == 2 and (s["median_of_op_medians"] >= 0).all()


def test_plausible_drops_faster_than_physics():
    y = T.kernel_time_s("mlp_up", "fwd", BIG_GEMM, GH200)
    assert T.plausible("mlp_up", "fwd", BIG_GEMM, y, GH200)[0]
    assert not T.plausible("mlp_up", "fwd", BIG_GEMM, y * 0.2, GH200)[0]


def test_transfer_error_lookup():
    val = {"per_op": {"mlp_up.fwd": {"perlmutter-a100": 0.05, "vista-gh200": 0.07}, "flash_attn.bwd": {"x": None}},
           "overall_median_ape": 0.09}
    assert T.transfer_error(val, "mlp_up", "fwd", "vista-gh200") == pytest.approx(0.07)
    assert T.transfer_error(val, "mlp_up", "fwd") == pytest.approx(0.06)
    assert T.transfer_error(val, "flash_attn", "bwd") == pytest.approx(0.09)
    assert T.transfer_error(val, "flash_attn", "bwd", "x") == pytest.approx(0.09)
    assert T.transfer_error(None, "mlp_up", "fwd") is None
    assert T.trustworthy({"reliable": False}) is False
    assert T.trustworthy({"outlier_filter": {"physical_bound": {"fraction": 0.8}}}) is False
    assert T.trustworthy({"outlier_filter": {"physical_bound": {"fraction": 0.1}}}) is True


# --------------------------------------------------------------------------- Predictor integration
def _train_tiny(models_dir: Path, platform_id: str, device, reliable: bool | None = None) -> None:
    from predictor.regress.regressors import OpRegressor
    rng = np.random.default_rng(0)
    n = 80
    df = pd.DataFrame({"tp": 1, "batch": rng.choice([1, 2, 4], n), "seq": rng.choice([1024, 2048, 4096], n),
                       "hidden": rng.choice([2048, 4096, 5120], n)})
    df["ffn_hidden"] = 4 * df["hidden"]
    t = T.kernel_time_s("mlp_up", "fwd", df, device) * 1.3 * np.exp(rng.normal(0, 0.02, n))
    r = OpRegressor("mlp_up", "fwd", {"num_boost_round": 30}).fit(df, t, device, "fp16")
    r.save(models_dir / platform_id)
    if reliable is not None:
        p = models_dir / platform_id / "mlp_up.fwd.json"
        md = json.loads(p.read_text())
        md["reliable"] = reliable
        p.write_text(json.dumps(md))


def _tiny_model():
    from predictor.model.specs import Layout, ModelSpec
    return ModelSpec("tiny", "gpt", 2, 2048, 16), Layout(num_gpus=1, micro_batch=2, global_batch=4, seq_len=1024)


def test_predictor_labels_and_rescales_transferred_ops(tmp_path):
    from predictor.plan.predict import Predictor
    _train_tiny(tmp_path, "perlmutter-a100", A100)
    (tmp_path / T.VALIDATION_FILE).write_text(json.dumps(
        {"per_op": {"mlp_up.fwd": {"perlmutter-a100": 0.061}}, "overall_median_ape": 0.09}))
    plat = make_cluster("a100-sxm4-40gb", 8, op_models="perlmutter-a100", platform_id="test-a100-40")
    pred = Predictor(plat, tmp_path)
    model, lay = _tiny_model()
    out = pred.predict(model, lay, timeline=False)
    up = out.ops[(out.ops["op"] == "mlp_up") & (out.ops["pass"] == "fwd")]
    assert (up["provenance"] == "transferred from perlmutter-a100").all()
    assert up["cv_mape"].iloc[0] == pytest.approx(0.061)
    others = out.ops[out.ops["op"] == "gelu"]
    assert others["provenance"].str.startswith("analytical").all()   # (Megatron-Core's fused kernel: analytical too)
    assert "transferred from perlmutter-a100" in out.error_basis
    # the transferred time is the A100 regressor's time on the A100, times the 40GB/80GB ratio (HBM 1555 vs 2039)
    from predictor.regress.regressors import ModelBank
    bank = ModelBank.load("perlmutter-a100", models_dir=tmp_path)
    row = pd.DataFrame([{"tp": 1, "batch": 2, "seq": 1024, "hidden": 2048, "heads": 16, "kv_heads": None,
                         "ffn_hidden": None, "vocab": None, "layers": None, "params": None}])
    want = T.predict_transferred(bank, "mlp_up", "fwd", row, A100, DEV["a100-sxm4-40gb"], "bf16")
    assert up["seconds_each"].iloc[0] == pytest.approx(float(want[0]), rel=1e-6)
    own = Predictor(get_platform("perlmutter-a100"), tmp_path).predict(model, lay, timeline=False)
    assert (own.ops[(own.ops["op"] == "mlp_up") & (own.ops["pass"] == "fwd")]["provenance"] == "measured").all()


def test_predictor_falls_back_when_the_source_samples_are_corrupt(tmp_path):
    from predictor.plan.predict import Predictor
    _train_tiny(tmp_path, "vista-gh200", GH200, reliable=False)
    _train_tiny(tmp_path, "perlmutter-a100", A100)
    out = Predictor(make_cluster("h100-sxm5-80gb", 8, platform_id="test-h100"), tmp_path).predict(*_tiny_model(),
                                                                                             timeline=False)
    prov = out.ops[(out.ops["op"] == "mlp_up") & (out.ops["pass"] == "fwd")]["provenance"].iloc[0]
    assert prov.startswith("transferred from perlmutter-a100")


def test_predictor_rejects_what_the_device_cannot_run(tmp_path):
    from predictor.model.specs import Layout, ModelSpec
    from predictor.plan.predict import Predictor
    v100 = get_platform("dgx1-v100")
    pred = Predictor(v100, tmp_path)
    with pytest.raises(InfeasibleConfig) as e:
        pred.predict(ModelSpec("t", "gpt", 2, 1024, 8), Layout(num_gpus=1, precision="bf16", seq_len=512),
                     timeline=False)
    assert e.value.field == "precision"
    with pytest.raises(InfeasibleConfig) as e:
        Predictor(v100, tmp_path).predict(ModelSpec("t", "gpt", 2, 1024, 8),
                                          Layout(num_gpus=1, precision="fp16", seq_len=512), timeline=False)
    assert e.value.field == "attention_impl"


# --------------------------------------------------------------------------- the paper's samples
PAPER_COLS = {"mp": "tp", "b": "batch", "l": "seq", "dim": "hidden", "h": "heads"}
PAPER_OPS = {"linear1": "qkv_proj", "linear3": "mlp_up", "linear4": "mlp_down", "gelu": "gelu",
             "flash_atten": "flash_attn", "softmax": "softmax", "RMSlayernorm": "rmsnorm", "bmm": "attn_context"}


def _paper(dev_dir: str, gpu: str, name: str) -> pd.DataFrame:
    df = pd.read_csv(SHARED / "paper-samples" / dev_dir / "operator" / f"{gpu}_{name}_fp16.csv")
    df = df.rename(columns=PAPER_COLS)
    keys = [c for c in PAPER_COLS.values() if c in df]
    return df.groupby(keys, as_index=False)[["F_dur(us)"]].median()


@pytest.mark.skipif(not (SHARED / "paper-samples").exists(), reason="shared datasets absent")
@pytest.mark.parametrize("direction", ["A100->GH200", "GH200->A100"])
def test_analytic_ratio_on_the_paper_samples(direction):
    """The measured A100 time of each shape, rescaled, against the measured GH200 time of the same shape
    (forward pass of 8 representative ops): median error well inside 15 %."""
    errs = []
    for name, op in PAPER_OPS.items():
        a = _paper("Perlmutter", "NVIDIAA100-SXM4-80GB", name)
        g = _paper("Vista", "NVIDIAGH200120GB", name)
        keys = [c for c in PAPER_COLS.values() if c in a]
        m = a.merge(g, on=keys, suffixes=("_a", "_g"))
        S, D, ys, yt = ((A100, GH200, m["F_dur(us)_a"], m["F_dur(us)_g"]) if direction == "A100->GH200"
                        else (GH200, A100, m["F_dur(us)_g"], m["F_dur(us)_a"]))
        sh = m[keys]
        pred = ys.to_numpy() * T.transfer_ratio(op, "fwd", sh, S, D)
        ok = T.plausible(op, "fwd", sh, yt.to_numpy() * 1e-6, D)
        errs.append(float(np.median(np.abs(pred[ok] - yt.to_numpy()[ok]) / yt.to_numpy()[ok])))
    assert np.median(errs) < 0.15, dict(zip(PAPER_OPS, errs))

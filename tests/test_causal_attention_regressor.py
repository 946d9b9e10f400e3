"""Flash-attention regressors of a causal kernel (the published prefill tables): normalised by the kernel's tile
work, with the fixed cost per query block fitted on the training rows, so that the efficiency left to the trees is
smooth in the sequence length and a held-out range of lengths is interpolated (tests.benchmarks.measured_kernels)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from predictor.calibrate.training import op_regressor_for
from predictor.hardware.platforms import get_platform
from predictor.paths import ArtifactError
from predictor.regress import features as F
from predictor.regress.regressors import (
    CAUSAL_KEY,
    MODELS_DIR,
    ModelBank,
    OpRegressor,
    fit_causal_overhead_tiles,
    verify_model,
)
from predictor.step.terms import causal_attention_factors

DEV = get_platform("dgx-h100").device


def tiles_by_count(seq: int, c: float) -> float:
    """Walk the (query block, key block) pairs a causal kernel visits, one by one."""
    nb = -(-seq // F.ATTENTION_TILE)
    visited = sum(1 for q in range(nb) for k in range(nb) if k <= q)
    return (visited + c * nb) / (nb * nb)


@pytest.mark.parametrize("seq", [128, 129, 512, 1000, 4096, 16384])
def test_tile_work_counts_the_blocks_on_and_below_the_diagonal(seq: int) -> None:
    assert F.causal_tile_work(np.array([seq]), 0.0)[0] == pytest.approx(tiles_by_count(seq, 0.0))
    assert F.causal_tile_work(np.array([seq]), 3.5)[0] == pytest.approx(tiles_by_count(seq, 3.5))
    # c = 0 is the tile share the predictor already applies to non-causal samples
    assert F.causal_tile_work(np.array([seq]), 0.0)[0] == pytest.approx(causal_attention_factors([seq])[0])


def synthetic(c_true: float, rng: np.random.Generator) -> pd.DataFrame:
    """A causal kernel whose time is exactly (tiles + c per query block) x a per-tile cost, with 2 % noise."""
    rows = []
    for hd, heads, kv in ((128, 32, 8), (128, 64, 8), (64, 32, 32)):
        for b in (1, 2, 4, 8, 16, 32):
            for seq in (256, 512, 1024, 2048, 4096, 8192):
                nb = seq / F.ATTENTION_TILE
                t = 1.5e-8 * (hd / 128) * b * heads * (nb * (nb + 1) / 2 + c_true * nb)
                rows.append({"tp": 1, "batch": b, "seq": seq, "hidden": heads * hd, "heads": heads, "kv_heads": kv,
                             "variant": "trtllm/x:causal", "duration_s": t * float(np.exp(rng.normal(0, 0.02)))})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("c_true", [0.0, 3.0, 8.0])
def test_fixed_cost_per_query_block_is_recovered_from_the_samples(c_true: float) -> None:
    g = synthetic(c_true, np.random.default_rng(1))
    c = fit_causal_overhead_tiles(F.shape_arrays(g), g["duration_s"].to_numpy(), DEV)
    assert abs(c - c_true) <= 1.0


def test_too_few_rows_that_fill_the_gpu_fit_nothing() -> None:
    g = synthetic(5.0, np.random.default_rng(2))
    g = g[g["batch"] == 1].head(10)
    assert fit_causal_overhead_tiles(F.shape_arrays(g), g["duration_s"].to_numpy(), DEV) == 0.0


def test_only_an_all_causal_flash_sample_set_gets_a_causal_regressor() -> None:
    g = synthetic(2.0, np.random.default_rng(3))
    assert op_regressor_for("flash_attn", "fwd", g).causal
    mixed = g.assign(variant=["trtllm/x:causal"] * (len(g) - 1) + ["paper"])
    assert not op_regressor_for("flash_attn", "fwd", mixed).causal
    assert not op_regressor_for("gemm", "fwd", g).causal
    with pytest.raises(ValueError, match="flash_attn only"):
        OpRegressor("gemm", "fwd", causal=True)


def test_causal_regressor_round_trips_and_the_bank_predicts_the_same(tmp_path) -> None:
    g = synthetic(4.0, np.random.default_rng(4))
    m = OpRegressor("flash_attn", "fwd", causal=True).fit(g, g["duration_s"].to_numpy(), DEV, "bf16")
    assert m.causal_overhead_tiles_ is not None
    m.save(tmp_path / "p", platform="p")
    md = json.loads((tmp_path / "p" / "flash_attn.fwd.json").read_text())
    assert md[CAUSAL_KEY] == m.causal_overhead_tiles_
    back = OpRegressor.load(tmp_path / "p", "flash_attn", "fwd")
    assert back.causal and back.causal_overhead_tiles_ == m.causal_overhead_tiles_
    shapes = g.drop(columns=["duration_s", "variant"]).head(20)
    np.testing.assert_allclose(back.predict(shapes, DEV, "bf16"), m.predict(shapes, DEV, "bf16"))
    bank = ModelBank("p", tmp_path / "p")
    np.testing.assert_allclose(bank.predict_op("flash_attn", "fwd", shapes, DEV, "bf16"),
                               m.predict(shapes, DEV, "bf16"))
    # the same trees read without the causal normalisation would predict something else: the key is used
    plain = OpRegressor("flash_attn", "fwd")
    plain.booster_ = back.booster_
    assert not np.allclose(plain.predict(shapes, DEV, "bf16"), m.predict(shapes, DEV, "bf16"))


def test_causal_key_is_checked_before_use(tmp_path) -> None:
    g = synthetic(4.0, np.random.default_rng(5))
    OpRegressor("flash_attn", "fwd", causal=True).fit(g, g["duration_s"].to_numpy(), DEV, "bf16").save(
        tmp_path / "p", platform="p")
    path = tmp_path / "p" / "flash_attn.fwd.json"
    md = json.loads(path.read_text())
    md[CAUSAL_KEY] = -1.0
    path.write_text(json.dumps(md))
    with pytest.raises(ArtifactError, match=CAUSAL_KEY):
        verify_model(tmp_path / "p", "flash_attn.fwd", "p")


def test_shipped_measured_attention_models_are_causal_and_others_are_not() -> None:
    for pid in ("dgx-h100", "dgx-b200", "gb300-nvl72"):
        assert ModelBank(pid, MODELS_DIR / pid).op_info("flash_attn", "fwd").get(CAUSAL_KEY) is not None
    # the paper's A100 samples are of the non-causal kernel: no tile normalisation
    pm = "perlmutter-a100"
    assert ModelBank(pm, MODELS_DIR / pm).op_info("flash_attn", "fwd").get(CAUSAL_KEY) is None

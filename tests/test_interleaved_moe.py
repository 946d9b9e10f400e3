"""Interleaved MoE layers (ModelSpec.moe_layer_interval, Llama 4 Maverick) and the Llama 4 presets: published sizes,
which layers are MoE (HF Llama4TextDecoderLayer's rule), per-chunk dense / MoE counts through the decomposition and
the memory model, and bad input."""
from __future__ import annotations

import pytest

from predictor.hardware.platforms import get_platform
from predictor.model import params
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import model_from_fields
from predictor.model.presets import get_preset
from predictor.model.specs import Layout, with_changes
from predictor.step.decompose import decompose

MAV = get_preset("llama4-maverick")


# Published: Scout 109B total / 17B active, Maverick 400B / 17B (Meta's Llama 4 model card). Totals within 1.5 %:
# the published Scout total is the multimodal checkpoint's (its vision encoder is not part of a text-only plan).
@pytest.mark.parametrize("name,total_b,active_b", [("llama4-scout", 109.0, 17.0), ("llama4-maverick", 400.0, 17.0)])
def test_llama4_presets_have_their_published_sizes(name, total_b, active_b):
    m = get_preset(name)
    assert m.total_params() / 1e9 == pytest.approx(total_b, rel=0.015)
    assert m.active_params() / 1e9 == pytest.approx(active_b, rel=0.03)


def test_maverick_alternates_dense_and_moe_layers():
    """interleave_moe_layer_step 2: layers 1, 3, 5, ... (0-based) are MoE, as HF's (i + 1) % step == 0."""
    assert [MAV.is_moe_layer(i) for i in range(6)] == [False, True] * 3
    assert MAV.moe_layers == 24 and MAV.has_dense_layers
    dense = 3 * 5120 * 16384
    moe = 5120 * 128 + (128 + 1) * 3 * 5120 * 8192
    attn = 5120 * (40 + 16) * 128 + 40 * 128 * 5120 + 2 * 5120
    vp = 202112   # 202048 padded to a multiple of 128 (Megatron)
    assert MAV.total_params() == 24 * (attn + dense) + 24 * (attn + moe) + 2 * vp * 5120 + 5120
    # with leading dense layers the interval counts from the first layer after them
    m = with_changes(MAV, dense_layers=3)
    assert [m.is_moe_layer(i) for i in range(7)] == [False, False, False, False, True, False, True]
    assert m.moe_layers == 45 // 2


def test_interleaved_layers_reach_every_chunk_and_the_plan():
    assert params.chunk_dense_layers(MAV, [12, 12, 12, 12]) == [6, 6, 6, 6]
    assert params.chunk_dense_layers(MAV, [13, 11, 12, 12]) == [7, 5, 6, 6]
    lay = Layout(num_gpus=32, tp=2, pp=4, dp=4, ep=8, etp=1, sequence_parallel=True, seq_len=4096, global_batch=32,
                 zero_stage=1)
    plans = decompose(MAV, lay, get_platform("dgx-h100"))
    for p in plans:
        routers = [c for c in p.ops if c.op == "moe_router" and c.phase == "fwd"]
        assert sum(c.count for c in routers) == 6      # 6 MoE layers of 12 per stage
        dense_up = [c for c in p.ops if c.op == "mlp_up" and c.part == "layer" and c.phase == "fwd"]
        assert sum(c.count for c in dense_up) == 6 and dense_up[0].shape[6] == 2 * 16384 and dense_up[0].shape[0] == 2
    # parameters per stage: 6 dense + 6 MoE layers with 128 / 8 experts here
    first = params.chunk_params(MAV, 2, 4, 12, True, False, 4096, dense=6, ep=8)
    assert plans[0].params_per_gpu == first


def test_interleaving_changes_the_prediction_and_the_memory():
    from predictor.plan.predict import get_predictor
    lay = Layout(num_gpus=64, tp=2, pp=4, dp=8, ep=8, sequence_parallel=True, seq_len=4096, global_batch=64,
                 zero_stage=1, recompute="full")
    pred = get_predictor("dgx-h100")
    every = with_changes(MAV, moe_layer_interval=1)
    a, b = pred.predict(MAV, lay), pred.predict(every, lay)
    assert a.memory.peak_gib < b.memory.peak_gib     # half the layers hold 16 experts each instead of every layer
    assert a.step_time_s != b.step_time_s


@pytest.mark.parametrize("row,field", [
    ({"model": "llama3-8b", "moe_layer_interval": "2"}, "moe_layer_interval"),      # a dense model
    ({"model": "llama4-maverick", "moe_layer_interval": "0"}, "moe_layer_interval"),
    ({"model": "llama4-maverick", "moe_layer_interval": "64"}, "moe_layer_interval"),   # no MoE layer left
])
def test_bad_interval_names_the_field(row, field):
    with pytest.raises(InfeasibleConfig) as e:
        model_from_fields(row)
    assert e.value.field == field


def test_the_interval_is_a_cli_flag_and_a_batch_column(capsys):
    from predictor.cli.main import main
    base = ["predict", "--platform", "dgx-h100", "--model", "llama4-scout", "--num-gpus", "64", "--tp", "2", "--pp",
            "4", "--ep", "8", "--sequence-parallel", "--global-batch", "64", "--seq-len", "4096", "--recompute",
            "full", "--zero-stage", "1", "--allow-oom", "--json"]
    import json
    assert main(base) == 0
    every = json.loads(capsys.readouterr().out)
    assert main([*base, "--moe-layer-interval", "2"]) == 0
    half = json.loads(capsys.readouterr().out)
    assert half["model"]["moe_layer_interval"] == 2 and half["step_time_s"] < every["step_time_s"]
    assert model_from_fields({"model": "llama4-scout", "moe_layer_interval": "2"}).moe_layers == 24

import pytest

from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import layout_from_fields, model_from_fields
from predictor.model.presets import get_preset, list_presets
from predictor.model.specs import Layout, ModelSpec, padded_vocab


def test_presets_have_published_sizes():
    # published parameter counts, within 2 %
    expected_b = {"llama2-7b": 6.74, "llama2-13b": 13.0, "llama2-70b": 69.0, "llama3-8b": 8.03,
                  "llama3-70b": 70.6, "llama3-405b": 405.9, "gpt3-175b": 175.0, "mistral-7b": 7.24,
                  "gpt-neox-20b": 20.6}
    for name, b in expected_b.items():
        got = get_preset(name).total_params() / 1e9
        assert abs(got - b) / b < 0.02, (name, got, b)
    assert {"llemma-7b", "llama3-405b", "gpt3-175b"} <= set(list_presets())


def test_padded_vocab_megatron_rule():
    assert padded_vocab(50257, 1) == 50304
    assert padded_vocab(50257, 2) == 50432
    assert padded_vocab(32000, 8) == 32768


@pytest.mark.parametrize("layout,field", [
    (Layout(num_gpus=8, tp=3, pp=1, dp=1, micro_batch=1, global_batch=1), "num_gpus"),
    (Layout(num_gpus=8, tp=8, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=2048), None),
    (Layout(num_gpus=4, tp=1, pp=1, dp=4, micro_batch=2, global_batch=10), "global_batch"),
    (Layout(num_gpus=4, tp=1, pp=4, dp=1, micro_batch=1, global_batch=8, vpp=2, schedule="1f1b"), "vpp"),
    (Layout(num_gpus=4, tp=1, pp=1, dp=4, micro_batch=1, global_batch=4, sequence_parallel=True), "sequence_parallel"),
    (Layout(num_gpus=4, tp=1, pp=1, dp=4, micro_batch=1, global_batch=4, recompute="some"), "recompute"),
])
def test_layout_validation_names_the_field(layout, field):
    model = get_preset("llama2-7b")
    if field is None:
        layout.validate(model)
        return
    with pytest.raises(InfeasibleConfig) as e:
        layout.validate(model)
    assert e.value.field == field
    assert field in str(e.value)


def test_heads_not_divisible_by_tp():
    m = ModelSpec("x", "gpt", 4, 1536, 12)
    with pytest.raises(InfeasibleConfig) as e:
        Layout(num_gpus=8, tp=8, dp=1, micro_batch=1, global_batch=1).validate(m)
    assert e.value.field == "tp" and "divide" in str(e.value)


def test_stage_layers_must_sum_to_layers():
    m = get_preset("llama2-7b")
    Layout(num_gpus=4, pp=4, micro_batch=1, global_batch=4, stage_layers=(7, 9, 9, 7)).validate(m)
    with pytest.raises(InfeasibleConfig) as e:
        Layout(num_gpus=4, pp=4, micro_batch=1, global_batch=4, stage_layers=(7, 9, 9, 6)).validate(m)
    assert e.value.field == "stage_layers"


def test_fields_fill_documented_defaults():
    m = model_from_fields({"arch": "llama", "layers": "2", "hidden": "4096", "heads": "32"})
    assert m.ffn == 11008 and m.kv_heads == 32
    g = model_from_fields({"arch": "gpt", "layers": 2, "hidden": 1024, "heads": 16, "kv_heads": ""})
    assert g.ffn == 4096 and g.vocab_size == 50257
    L = layout_from_fields({"num_gpus": "16", "tp": "2", "pp": "2", "micro_batch": "2"})
    assert (L.dp, L.global_batch, L.schedule, L.precision) == (4, 8, "1f1b", "bf16")
    with pytest.raises(InfeasibleConfig) as e:
        layout_from_fields({"num_gpus": "10", "tp": "4"})
    assert e.value.field == "num_gpus"
    with pytest.raises(InfeasibleConfig) as e:
        layout_from_fields({"tp": "two"})
    assert e.value.field == "tp"
    with pytest.raises(InfeasibleConfig) as e:
        model_from_fields({"model": "llama9-1t"})
    assert e.value.field == "model"

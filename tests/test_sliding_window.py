"""Sliding-window attention (ModelSpec.sliding_window / full_attention_interval, GPT-OSS): the published GPT-OSS
sizes, the score work of the windowed layers against the closed form, the layer pattern, the model FLOPs, and the
refusals (unfused attention, context parallelism, an interval without a window)."""
from __future__ import annotations

import pytest

from predictor.model import params
from predictor.model.errors import InfeasibleConfig
from predictor.model.presets import get_preset
from predictor.model.specs import Layout, ModelSpec, with_changes
from predictor.plan.predict import model_flops_per_step
from predictor.regress import features
from predictor.step import decompose as D

OSS = get_preset("gpt-oss-120b")


# Published (gpt-oss model card, arXiv 2508.10925, Table 1): 116.83B / 20.91B total, 5.13B / 3.61B active, which the
# card counts without the input embedding. Tolerance 0.5 %: sinks and biases (~0.05 %) are not modelled.
@pytest.mark.parametrize("name,total_b,active_b", [("gpt-oss-120b", 116.83, 5.13), ("gpt-oss-20b", 20.91, 3.61)])
def test_gpt_oss_presets_have_their_published_sizes(name, total_b, active_b):
    m = get_preset(name)
    assert m.total_params() / 1e9 == pytest.approx(total_b, rel=0.005)
    active = m.active_params() - params.padded_vocab(m.vocab_size) * m.hidden_size
    assert active / 1e9 == pytest.approx(active_b, rel=0.005)


def _score_work(model: ModelSpec, s: int) -> float:
    """Forward flash-attention FLOPs of one layer's calls, over the model's layers' mix."""
    ops = [c for c in D.layer_unit(model, 1, 1, s, False, "none", "bf16", (1, 1, 1), moe=False).ops
           if c.op == "flash_attn" and c.phase == "fwd"]
    return sum(float(features.op_work("flash_attn", features.arrays_from_shapes([c.shape]), "bf16")[0][0]) * c.count
               for c in ops)


def test_windowed_layers_do_the_closed_form_score_work():
    """A query i attends keys i-W+1..i: the windowed score work is s*W - W^2/2 against the causal s^2/2; half of
    GPT-OSS's layers are windowed (W = 128), half full."""
    s, w = 8192, 128
    full = with_changes(OSS, sliding_window=None, full_attention_interval=None)
    ratio = _score_work(OSS, s) / _score_work(full, s)
    assert ratio == pytest.approx(0.5 + 0.5 * (s * w - w * w / 2) / (s * s / 2), rel=1e-12)
    every = with_changes(OSS, full_attention_interval=None)            # every layer windowed
    assert _score_work(every, s) / _score_work(full, s) == pytest.approx((s * w - w * w / 2) / (s * s / 2))
    # the windowed calls run at the 2W-token blocks a windowed kernel tiles, s / (2W) - 1/4 of them per layer
    calls = D.sliding_window_calls(every, s)
    assert calls == [(s, 0.0), (2 * w, s / (2 * w) - 0.25)]
    # a sequence within the window is plain causal attention
    assert _score_work(OSS, w) == _score_work(with_changes(OSS, sliding_window=None, full_attention_interval=None), w)


def test_gpt_oss_alternates_sliding_and_full_layers():
    assert OSS.full_attention_share == 0.5
    assert with_changes(OSS, num_layers=35).full_attention_share == pytest.approx(17 / 35)   # layers 1, 3, ..., 33
    assert with_changes(OSS, full_attention_interval=6).full_attention_share == pytest.approx(6 / 36)


def test_model_flops_count_the_windowed_attention():
    s, w = 8192, 128
    lay = Layout(num_gpus=1, seq_len=s, global_batch=1)
    full = with_changes(OSS, sliding_window=None, full_attention_interval=None)
    saved = model_flops_per_step(full, lay) - model_flops_per_step(OSS, lay)
    attn_full = 3 * 2 * 2 * OSS.num_layers * s * OSS.attn_width * s      # per step, attention not discounted
    assert saved == pytest.approx(attn_full * 0.5 * (1 - (s * w - w * w / 2) / (s * s / 2)), rel=1e-9)


@pytest.mark.parametrize("over,field", [
    (dict(attention_impl="unfused"), "sliding_window"),
    (dict(sliding_window=None), "full_attention_interval"),
    (dict(full_attention_interval=1), "full_attention_interval"),
    (dict(sliding_window=0), "sliding_window"),
])
def test_bad_sliding_window_input_names_the_field(over, field):
    with pytest.raises(InfeasibleConfig) as e:
        with_changes(OSS, **over).validate()
    assert e.value.field == field and e.value.fix


def test_context_parallelism_with_a_window_is_refused():
    lay = Layout(num_gpus=16, tp=1, cp=2, dp=8, ep=8, seq_len=8192, global_batch=8)
    with pytest.raises(InfeasibleConfig) as e:
        lay.validate(OSS)
    assert e.value.field == "cp"


def test_the_window_is_a_cli_flag(capsys):
    import json

    from predictor.cli.main import main
    base = ["predict", "--platform", "dgx-h100", "--model", "gpt-oss-20b", "--num-gpus", "8", "--ep", "8",
            "--global-batch", "8", "--seq-len", "32768", "--recompute", "full", "--allow-oom", "--json"]
    assert main(base) == 0
    windowed = json.loads(capsys.readouterr().out)
    assert main([*base, "--sliding-window", "32768"]) == 0    # a window as long as the sequence: full attention
    full = json.loads(capsys.readouterr().out)
    assert windowed["model"]["sliding_window"] == 128 and full["step_time_s"] > windowed["step_time_s"]

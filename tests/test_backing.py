"""What a platform's predictions rest on, in words, agrees with what the prediction applies (#36: one tab said the
host overhead was fitted on measured runs while `predictor platforms` said it was not modelled)."""
from __future__ import annotations

from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.plan.backing import describe_backing
from predictor.plan.predict import get_predictor


def test_the_words_on_host_overhead_agree_with_the_breakdown():
    for pid in ("dgx-h100", "dgx-a100-80gb", "cpu-2t"):
        P = get_predictor(pid)
        b = describe_backing(P)
        n = 1 if pid.startswith("cpu") else 8
        pred = P.predict(get_preset("gpt3-1.3b"), Layout(num_gpus=n, dp=n, global_batch=8 * n, seq_len=1024),
                         timeline=False)
        applied = pred.host_overhead_modelled and pred.breakdown_s["host_overhead"] > 0
        assert applied == ("not modelled" not in b.host_overhead), (pid, b.host_overhead)
        assert applied == (b.short["host_overhead"] != "not modelled"), (pid, b.short)
    words = describe_backing(get_predictor("dgx-h100")).host_overhead
    assert words.startswith("from the end-to-end terms") and "other frameworks (pooled)" in words

"""The interleaved schedule's default split: even, or Megatron-Core's account-for-embedding / loss split."""
from __future__ import annotations

import pytest

from predictor.model.errors import InfeasibleConfig
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.model.stages import chunk_layer_counts, interleaved_split
from predictor.plan.predict import get_predictor
from predictor.plan.search import SearchSpace, layout_of, search


def test_even_split_and_the_embedding_loss_split():
    assert interleaved_split(32, 8) == [4] * 8
    # Llama 3.1 405B: 126 layers over pp 8 x vpp 8 = 64 chunks; with the embedding and the loss counted as a
    # layer each, 128 / 64 = 2 per chunk, the edge chunks one transformer layer fewer
    assert interleaved_split(126, 64) == [1] + [2] * 62 + [1]
    assert sum(interleaved_split(94, 32) or []) == 94      # Qwen3-235B: 96 / 32 = 3
    assert interleaved_split(125, 64) is None               # neither 125 nor 127 divides
    assert interleaved_split(62, 64) is None                # fewer than one layer per edge chunk


def test_layout_uses_it_and_refuses_what_megatron_cannot_split():
    m = get_preset("llama3.1-405b")
    L = Layout(num_gpus=1024, tp=8, pp=8, dp=16, vpp=8, schedule="interleaved", micro_batch=1, global_batch=512,
               seq_len=8192, zero_stage=1, sequence_parallel=True)
    L.validate(m)
    assert chunk_layer_counts(m, L) == [1] + [2] * 62 + [1]
    with pytest.raises(InfeasibleConfig) as e:
        Layout(num_gpus=1024, tp=8, pp=8, dp=16, vpp=7, schedule="interleaved", micro_batch=1, global_batch=512,
               seq_len=8192).validate(m)
    assert e.value.field == "vpp" and "layers + 2" in str(e.value)


def test_search_enumerates_the_split_and_predict_agrees():
    P = get_predictor("dgx-h100")
    m = get_preset("qwen3-235b-a22b")   # 94 layers: only the embedding / loss split interleaves over pp 8
    rep = search(m, P, 256, 512, 4096, top_k=1, refine=False,
                 space=SearchSpace(pp=(8,), schedules=("interleaved",), ep=(8,), cp=(1,), tp=(1, 2)))
    t = rep.table
    inter = t[t["schedule"] == "interleaved"]
    assert len(inter) and set(inter["vpp"]) >= {4}
    row = inter.iloc[0]
    p = P.predict(m, layout_of(row), timeline=False)
    assert row["step_time_s"] == pytest.approx(p.step_time_s, rel=1e-9)

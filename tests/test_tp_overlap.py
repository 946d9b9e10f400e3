"""Transformer Engine's tensor-parallel communication overlap (Layout.overlap_tp_comm)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import layout_from_fields
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.plan.predict import get_predictor
from predictor.plan.search import SearchSpace, layout_of, search
from predictor.step.compose import CATEGORIES

L70 = Layout(num_gpus=64, tp=4, pp=4, dp=4, micro_batch=1, global_batch=64, seq_len=8192, zero_stage=1,
             sequence_parallel=True)


def test_overlap_hides_the_exchanges_under_the_gemms():
    P = get_predictor("dgx-h100")
    m = get_preset("llama3-70b")
    off, on = P.predict(m, L70), P.predict(m, replace(L70, overlap_tp_comm=True))
    assert off.breakdown_s["tp_comm"] > 0
    # the layer's exchanges are shorter than its tensor-parallel GEMMs here: all hidden but the edge chunks' own
    # (embedding reduce-scatter, LM head exchanges), which are not overlapped
    assert 0 <= on.breakdown_s["tp_comm"] < 0.2 * off.breakdown_s["tp_comm"]
    assert on.step_time_s < off.step_time_s
    assert on.breakdown_s["compute"] == pytest.approx(off.breakdown_s["compute"], rel=1e-9)


@pytest.mark.parametrize("kw", [dict(tp=1, dp=16), dict(sequence_parallel=False)])
def test_overlap_needs_tp_with_sequence_parallelism(kw):
    with pytest.raises(InfeasibleConfig) as e:
        replace(L70, overlap_tp_comm=True, **kw).validate(get_preset("llama3-70b"))
    assert e.value.field == "overlap_tp_comm" and e.value.fix


def test_search_and_batch_carry_it():
    P = get_predictor("dgx-h100")
    m = get_preset("llama3-70b")
    rep = search(m, P, 64, 64, 8192, top_k=1, refine=False,
                 space=SearchSpace(overlap_tp_comm=True, cp=(1,), schedules=("1f1b",)))
    t = rep.table
    assert (t["overlap_tp_comm"] == ((t["tp"] > 1) & t["sequence_parallel"])).all()
    row = t[t["overlap_tp_comm"]].iloc[0]
    p = P.predict(m, layout_of(row), timeline=False)
    assert row["step_time_s"] == pytest.approx(p.step_time_s, rel=1e-9)
    for c in CATEGORIES:
        assert row[f"{c}_s"] == pytest.approx(p.breakdown_s[c], rel=1e-9, abs=1e-12 * p.step_time_s)
    fields = {"num_gpus": "64", "tp": "4", "pp": "4", "global_batch": "64", "sequence_parallel": "true",
              "overlap_tp_comm": "true"}
    assert layout_from_fields(fields).overlap_tp_comm is True
    assert layout_from_fields({**fields, "overlap_tp_comm": ""}).overlap_tp_comm is False

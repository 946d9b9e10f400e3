"""The pipeline's point-to-point overlap (Layout.overlap_p2p_comm; Megatron-Core overlap_p2p_comm): on by default for
Megatron-Core's interleaved schedule, the steady-phase sends / receives hidden under the neighbouring chunk's compute
(never more than it), the warm-up / cool-down passes exposed; off elsewhere; refusals by name; batch, CLI and search
wiring."""
from __future__ import annotations

import numpy as np
import pytest

from predictor.cli.main import main
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import layout_from_fields
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.plan.predict import get_predictor
from predictor.step.engine import pp_overlap_share

MODEL = get_preset("llama3-70b")


def _layout(**kw) -> Layout:
    # 64 H100s over 8 nodes: the pipeline neighbours tp x dp = 32 ranks apart cross nodes
    base = dict(num_gpus=64, tp=4, pp=8, dp=2, vpp=5, schedule="interleaved", micro_batch=1, global_batch=128,
                seq_len=8192, sequence_parallel=True, zero_stage=1, precision="bf16")
    return Layout(**{**base, **kw})


def test_the_default_is_on_for_megatron_interleaved_only():
    assert _layout().pp_comm_overlap
    assert not _layout(overlap_p2p_comm=False).pp_comm_overlap
    assert not _layout(vpp=1, schedule="1f1b").pp_comm_overlap
    assert not _layout(framework="megatron-deepspeed", vpp=1, schedule="1f1b", zero_stage=1).pp_comm_overlap


def test_the_share_is_the_steady_phase_of_the_first_stage():
    """m x vpp passes, of which the first stage's warm-up 2 (pp - 1) + (vpp - 1) pp are exposed."""
    m, pp, vpp = np.array([64.0]), 8, 5
    assert pp_overlap_share(m, pp, vpp)[0] == pytest.approx((64 * 5 - (2 * 7 + 4 * 8)) / (64 * 5))
    assert pp_overlap_share(np.array([8.0]), 8, 5)[0] == 0.0   # all warm-up: nothing hidden


def test_the_overlap_hides_pipeline_traffic_and_never_more_than_it():
    P = get_predictor("dgx-h100")
    on = P.predict(MODEL, _layout(), timeline=False)
    off = P.predict(MODEL, _layout(overlap_p2p_comm=False), timeline=False)
    assert off.breakdown_s["pp_comm"] > 0
    assert on.breakdown_s["pp_comm"] < off.breakdown_s["pp_comm"]
    assert on.step_time_s < off.step_time_s
    # what is hidden is at most the pipeline traffic itself; compute and the other parts are untouched
    assert off.step_time_s - on.step_time_s <= off.breakdown_s["pp_comm"] + 1e-9
    for c in ("compute", "tp_comm", "dp_comm"):
        assert on.breakdown_s[c] == pytest.approx(off.breakdown_s[c], rel=1e-9)
    # a non-interleaved layout is unchanged by the field's default
    one = _layout(vpp=1, schedule="1f1b")
    a = P.predict(MODEL, one, timeline=False)
    b = P.predict(MODEL, _layout(vpp=1, schedule="1f1b", overlap_p2p_comm=None), timeline=False)
    assert a.step_time_s == b.step_time_s


@pytest.mark.parametrize("kw, words", [
    (dict(vpp=1, schedule="1f1b", overlap_p2p_comm=True), "interleaved schedule only"),
    (dict(pp=1, dp=16, vpp=1, schedule="1f1b", overlap_p2p_comm=True), "pp > 1"),
])
def test_the_overlap_where_it_cannot_run_is_refused_by_name(kw, words):
    with pytest.raises(InfeasibleConfig) as e:
        _layout(**kw).validate(MODEL)
    assert e.value.field == "overlap_p2p_comm" and words in str(e.value) and e.value.fix


def test_the_batch_column_and_the_cli_take_it(capsys):
    fields = {k: "" if v is None else v for k, v in _layout().__dict__.items()}
    assert layout_from_fields({**fields, "overlap_p2p_comm": "false"}).overlap_p2p_comm is False
    assert layout_from_fields({**fields, "overlap_p2p_comm": ""}).overlap_p2p_comm is None
    base = ["predict", "--platform", "dgx-h100", "--model", "llama3-70b", "--num-gpus", "64", "--tp", "4", "--pp",
            "8", "--vpp", "5", "--micro-batch", "1", "--global-batch", "128", "--seq-len", "8192",
            "--sequence-parallel", "--json", "--allow-oom"]
    assert main(base) == 0
    on = capsys.readouterr().out
    assert main([*base, "--no-overlap-p2p-comm"]) == 0
    off = capsys.readouterr().out
    assert on != off
    assert main([*base[:-2], "--vpp", "1", "--schedule", "1f1b", "--overlap-p2p-comm", "--json"]) == 2
    assert "overlap_p2p_comm" in capsys.readouterr().err


def test_search_rows_carry_it_and_agree_with_predict():
    from predictor.plan.search import SearchSpace, layout_of, search
    P = get_predictor("dgx-h100")
    space = SearchSpace(tp=(4,), pp=(8,), vpp=(5,), micro_batch=(1,), zero_stage=(1,), recompute=("none",),
                        sequence_parallel=(True,), schedules=("1f1b", "interleaved"))
    t = search(MODEL, P, 64, 128, 8192, top_k=1, refine=False, space=space).table
    inter = t[t["schedule"] == "interleaved"]
    assert len(inter) and inter["overlap_p2p_comm"].all() and not t[t["schedule"] == "1f1b"]["overlap_p2p_comm"].any()
    for _, row in t.iterrows():
        p = P.predict(MODEL, layout_of(row), timeline=False)
        assert row["step_time_s"] == pytest.approx(p.step_time_s, rel=1e-9)
    t_off = search(MODEL, P, 64, 128, 8192, top_k=1, refine=False,
                   space=SearchSpace(**{**space.__dict__, "overlap_p2p_comm": False})).table
    assert not t_off["overlap_p2p_comm"].any()

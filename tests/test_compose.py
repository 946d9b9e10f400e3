import itertools

import pytest

from predictor.step.compose import (
    ChunkTimes,
    ComposeOptions,
    StageTail,
    compose,
    pipeline_time_closed_form,
    simulate_pipeline,
    stage_totals,
)


def _uniform(p, v, f=1.0, b=2.0):
    return [ChunkTimes(c % p, c // p, {"compute": f / v}, {"compute": b / v}) for c in range(p * v)]


@pytest.mark.parametrize("schedule,p,v,m", [("1f1b", 4, 1, 8), ("gpipe", 4, 1, 8), ("interleaved", 4, 2, 8),
                                             ("interleaved", 4, 3, 12), ("1f1b", 8, 1, 3), ("1f1b", 1, 1, 5)])
def test_simulation_matches_closed_form_for_uniform_stages(schedule, p, v, m):
    chunks = _uniform(p, v)
    sim, timeline = simulate_pipeline(chunks, p, v, m, schedule)
    F, B = stage_totals(chunks, p)
    assert sim == pytest.approx(pipeline_time_closed_form(F, B, m, schedule, v))
    assert len(timeline) == 2 * m * p * v
    # no two tasks overlap on one GPU
    for s in range(p):
        ev = sorted((e["start_s"], e["end_s"]) for e in timeline if e["stage"] == s)
        assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(ev))


def test_textbook_bubble_fraction():
    # 1F1B bubble = (p-1)/m of the ideal time; interleaving divides it by v
    p, m, t = 4, 8, 3.0
    one = pipeline_time_closed_form(*stage_totals(_uniform(p, 1), p), m, "1f1b", 1)
    assert one - m * t == pytest.approx((p - 1) * t)
    inter = pipeline_time_closed_form(*stage_totals(_uniform(p, 2), p), m, "interleaved", 2)
    assert inter - m * t == pytest.approx((p - 1) * t / 2)


def test_slowest_stage_dominates_uneven_pipelines():
    chunks = [ChunkTimes(0, 0, {"compute": 1.0}, {"compute": 2.0}),
              ChunkTimes(1, 0, {"compute": 2.0}, {"compute": 4.0})]
    sim, _ = simulate_pipeline(chunks, 2, 1, 10, "1f1b")
    assert sim >= 10 * 6.0


def test_breakdown_sums_to_step_time_and_overlap_hides_grad_sync():
    chunks = _uniform(2, 1)
    tails = [StageTail(s, dp_comm_s=1.5, param_gather_s=0.0, embedding_sync_s=0.0, optimizer_s=0.2,
                       last_bwd_compute_s=2.0) for s in range(2)]
    no = compose(chunks, tails, pp=2, vpp=1, m=4, schedule="1f1b", options=ComposeOptions(overlap_grad_reduce=False))
    ov = compose(chunks, tails, pp=2, vpp=1, m=4, schedule="1f1b", options=ComposeOptions(overlap_grad_reduce=True))
    for c in (no, ov):
        assert sum(c.breakdown_s.values()) == pytest.approx(c.step_time_s)
        assert all(v >= -1e-12 for v in c.breakdown_s.values())
    # stage 0 finishes its last backward last: its whole tail is exposed without overlap ...
    assert no.step_time_s == pytest.approx(no.pipeline_s + 1.5 + 0.2)
    assert no.breakdown_s["dp_comm"] == pytest.approx(1.5)
    # ... and with bucketed overlap only the last of 8 buckets is (1.5 s of sync under 2 s of backward)
    assert ov.step_time_s == pytest.approx(ov.pipeline_s + 1.5 / 8 + 0.2)


def test_platform_whose_collectives_share_the_cores_exposes_the_whole_grad_sync():
    """cpu-1t: every core runs a rank's compute, so gloo's gradient all-reduce cannot hide behind the
    backward; the same platform with overlap allowed hides all but the last bucket."""
    from dataclasses import replace

    from predictor.hardware.platforms import get_platform
    from predictor.model.specs import Layout, ModelSpec
    from predictor.plan.predict import Predictor, platform_options

    cpu = get_platform("cpu-1t")
    assert cpu.overlaps_comm_with_compute is False
    assert platform_options(cpu, ComposeOptions()).overlap_grad_reduce is False
    assert platform_options(replace(cpu, overlaps_comm_with_compute=True), ComposeOptions()).overlap_grad_reduce
    model = ModelSpec(name="small-gpt", arch="gpt", num_layers=2, hidden_size=512, num_heads=8, vocab_size=8192,
                      tied_embeddings=True, attention_impl="flash")
    L = Layout(num_gpus=2, dp=2, micro_batch=1, global_batch=2, seq_len=256, precision="fp32", framework="ddp")
    serial = Predictor(cpu).predict(model, L, timeline=False)
    hidden = Predictor(replace(cpu, overlaps_comm_with_compute=True)).predict(model, L, timeline=False)
    full = serial.breakdown_s["dp_comm"]
    assert full > 0
    assert hidden.breakdown_s["dp_comm"] < full
    # Megatron reduces after the backward unless told to overlap: the whole sync shows on any platform
    meg = Predictor(replace(cpu, overlaps_comm_with_compute=True)).predict(
        model, replace(L, framework="megatron"), timeline=False)
    assert meg.breakdown_s["dp_comm"] == pytest.approx(full, rel=1e-9)
    ovl = Predictor(replace(cpu, overlaps_comm_with_compute=True)).predict(
        model, replace(L, framework="megatron", overlap_grad_reduce=True), timeline=False)
    assert ovl.breakdown_s["dp_comm"] == pytest.approx(hidden.breakdown_s["dp_comm"], rel=1e-9)
    assert serial.step_time_s - hidden.step_time_s == pytest.approx(full - hidden.breakdown_s["dp_comm"], rel=1e-6)

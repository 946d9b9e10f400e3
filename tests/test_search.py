"""Configuration search, the vectorised fast path, ZeRO / FSDP timing, costing and the CLI."""
import json
from dataclasses import replace

import numpy as np
import pytest

from predictor.cli.main import main
from predictor.hardware.platforms import get_platform
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.plan import costing
from predictor.plan.predict import Predictor, get_predictor
from predictor.plan.search import SearchSpace, _unique_rows, layout_of, search
from predictor.step.compose import CATEGORIES
from predictor.step.decompose import decompose
from predictor.step.memory import estimate_memory

DGX = get_platform("dgx-a100-80gb")


@pytest.fixture(scope="module")
def P():
    return get_predictor("dgx-a100-80gb")


@pytest.fixture(scope="module")
def llama70(P):
    return search(get_preset("llama3-70b"), P, 1024, 1024, 4096, top_k=5)


CASES = [
    ("llama3-70b", 1024, 1024, 4096, SearchSpace()),
    ("gpt3-1.3b", 16, 64, 2048, SearchSpace(schedules=("1f1b", "interleaved", "gpipe"))),
    ("gpt3-13b-unfused", 64, 128, 2048, SearchSpace(max_micro_batch=4)),
    ("llama3-8b", 24, 48, 4096, SearchSpace(tp_within_node=False, max_micro_batch=4)),
]


def _model(name):
    if name.endswith("-unfused"):
        return replace(get_preset(name[: -len("-unfused")]), attention_impl="unfused")
    return get_preset(name)


@pytest.mark.parametrize("name,n,gb,s,space", CASES)
def test_fast_path_agrees_with_predictor(P, name, n, gb, s, space):
    """The search table and Predictor.predict(timeline=False) agree to float rounding on step time,
    breakdown and memory, on a random sample of every enumerated layout (one engine)."""
    m = _model(name)
    rep = search(m, P, n, gb, s, top_k=3, space=space, refine=False)
    t = rep.table
    assert len(t) > 100
    rng = np.random.default_rng(1)
    for i in rng.choice(len(t), size=25, replace=False):
        row = t.iloc[i]
        L = layout_of(row)
        p = P.predict(m, L, timeline=False)
        assert row["step_time_s"] == pytest.approx(p.step_time_s, rel=1e-9)
        for c in CATEGORIES:
            assert row[f"{c}_s"] == pytest.approx(p.breakdown_s[c], rel=1e-9, abs=1e-12 * p.step_time_s)
        r = estimate_memory(m, L, DGX)
        assert row["peak_mem_gib"] * 2 ** 30 == pytest.approx(r.peak_bytes, rel=1e-12)
        assert p.memory.peak_bytes == pytest.approx(r.peak_bytes, rel=1e-12)
        assert bool(row["fits"]) == r.fits


def test_search_ranks_fitting_layouts_with_reasons(llama70):
    rep = llama70
    t = rep.table
    feas = rep.feasible
    assert rep.n_enumerated > 1000 and 0 < rep.n_feasible < rep.n_enumerated
    assert (feas["rank"].to_numpy() == np.arange(1, len(feas) + 1)).all()
    assert np.all(np.diff(feas["step_time_s"].to_numpy()) >= -1e-12)
    assert (feas["peak_mem_gib"] <= feas["peak_mem_gib"].max()).all()
    rej = rep.rejected
    assert (rej["reason"].str.startswith("out of memory")).all() and (t["rank"] == 0).sum() == len(rej)
    # top results: exact predictions, fitting memory reports, throughput numbers
    assert len(rep.top) == 5
    for r in rep.top:
        assert r.memory.fits and r.prediction is not None
        assert r.step_time_s == pytest.approx(r.fast_step_time_s, rel=0.01)
        assert 0 < r.mfu < 1 and r.tflops_per_gpu > 0
        assert sum(r.breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)
    assert rep.top[0].layout == layout_of(feas.iloc[0])


def test_why_absent_names_the_reason(llama70):
    # Megatron without distributed optimizer and without pipelining cannot hold 70B on 8-way TP
    w = llama70.why_absent(tp=8, pp=1, zero_stage=0)
    assert len(w) > 0 and w["reason"].str.contains("out of memory").all()
    assert "optimizer" in w["reason"].iloc[0]
    # tensor parallelism across nodes is not enumerated by default, and says so
    w = llama70.why_absent(tp=16)
    assert w["reason"].str.contains("node").any()
    summ = llama70.rejection_summary()
    assert summ["layouts"].sum() == len(llama70.rejected)


def test_search_space_covers_the_dimensions(llama70):
    t = llama70.table
    assert set(t["tp"]) == {1, 2, 4, 8}
    assert {1, 2, 4, 8, 16, 32, 64} <= set(t["pp"])
    assert set(t["zero_stage"]) == {0, 1, 2, 3}
    assert set(t["schedule"]) == {"1f1b", "interleaved"}
    assert set(t["recompute"]) == {"none", "full"}  # selective core_attn under flash: none re-run slower (not searched)
    assert t["sequence_parallel"].any() and (t["stage_layers"] != "").any()
    assert (t[t["schedule"] == "interleaved"]["vpp"] >= 2).all()
    # uneven split: first and last stage one layer lighter
    sl = t[t["stage_layers"] != ""]["stage_layers"].iloc[0]
    counts = [int(x) for x in sl.split(",")]
    assert sum(counts) == 80 and counts[0] < max(counts) and counts[-1] < max(counts)


def test_objectives_and_num_gpu_ranges(P):
    m = get_preset("llama3-8b")
    rep = search(m, P, [64, 128, 256], 512, 8192, top_k=3, objective="cost", tokens_to_train=1e12,
                 price_per_gpu_hour=2.0)
    t = rep.feasible
    assert set(t["num_gpus"]) == {64, 128, 256}
    assert np.all(np.diff(t["gpu_hours_per_mtok"].to_numpy()) >= -1e-12)
    assert {"steps", "days", "gpu_hours", "cost"} <= set(t.columns)
    r = t.iloc[0]
    assert r["cost"] == pytest.approx(r["gpu_hours"] * 2.0)
    assert r["steps"] == np.ceil(1e12 / (512 * 8192))
    mfu = search(m, P, [64, 256], 512, 8192, top_k=3, objective="mfu", refine=False).feasible
    assert np.all(np.diff(mfu["mfu"].to_numpy()) <= 1e-12)


def test_restricted_space_and_infeasible_everything(P):
    m = get_preset("llama3-70b")
    rep = search(m, P, 8, 8, 4096, space=SearchSpace(tp=(8,), pp=(1,), zero_stage=(0,)), refine=False)
    assert rep.n_feasible == 0 and len(rep.top) == 0 and len(rep.rejected) > 0


def test_unique_rows_and_comm_cache(P):
    a = np.array([[1, 2, 3], [1, 2, 3], [0, 5, 1], [7, 0, 0]])
    u, inv = _unique_rows(a)
    assert (u[inv] == a).all() and len(u) == 3
    # one vectorised comm_times call gives the same values as Predictor.time_comm one by one
    fresh = Predictor(DGX)
    L = Layout(num_gpus=256, tp=4, pp=4, dp=16, micro_batch=1, global_batch=64, zero_stage=3)
    plans = decompose(get_preset("llama3-8b"), L, DGX)
    calls = [c for p in plans for c in p.comms + p.step_comms]
    batch = fresh.comm_times(calls)
    ref = Predictor(DGX)
    for c, (t, _prov) in zip(calls, batch):
        assert t == pytest.approx(ref.time_comm(c)[0], rel=1e-12)


# ---- ZeRO / FSDP timing ---------------------------------------------------------------------
def _pred(P, model, **kw):
    return P.predict(get_preset(model), Layout(**kw), timeline=False)


def test_zero_traffic_per_stage():
    m = get_preset("llama3-8b")
    base = dict(num_gpus=64, tp=2, pp=1, dp=32, micro_batch=1, global_batch=128, seq_len=4096)
    p = {z: decompose(m, Layout(**base, zero_stage=z), DGX)[0] for z in range(4)}
    assert [c.collective for c in p[0].step_comms] == ["allreduce"] and not [c for c in p[0].comms if c.group == "dp"]
    assert {c.collective for c in p[1].step_comms} == {"reducescatter", "allgather"}
    for z in (2, 3):
        dp_calls = [c for c in p[z].comms if c.group == "dp"]
        assert not p[z].step_comms
        fwd = [c for c in dp_calls if c.phase == "fwd"]
        bwd = [c for c in dp_calls if c.phase == "bwd"]
        assert {c.collective for c in fwd} == {"allgather"}
        assert {c.collective for c in bwd} == ({"reducescatter"} if z == 2 else {"allgather", "reducescatter"})
        # one call per unit: the layers plus the embedding / head unit
        assert sum(c.count for c in fwd) == m.num_layers + 1
        # gathered bytes = the chunk's parameters in bf16; reduce-scattered gradients in fp32
        assert sum(c.message_bytes * c.count for c in fwd) == p[z].params_per_gpu * 2
        rs = [c for c in bwd if c.collective == "reducescatter"]
        assert sum(c.message_bytes * c.count for c in rs) == p[z].params_per_gpu * 4
    # dp = 1: no data-parallel traffic at any stage
    one = decompose(m, Layout(num_gpus=2, tp=2, global_batch=4, zero_stage=3), DGX)[0]
    assert not one.step_comms and not [c for c in one.comms if c.group == "dp"]


def test_fsdp_cost_grows_with_micro_batches_and_is_partly_hidden(P):
    kw = dict(num_gpus=256, tp=1, pp=1, dp=256, global_batch=1024, seq_len=4096, recompute="full")
    one = _pred(P, "llama3-8b", micro_batch=4, zero_stage=3, **kw)   # 1 micro-batch
    four = _pred(P, "llama3-8b", micro_batch=1, zero_stage=3, **kw)  # 4 micro-batches, 4x the gathers
    assert four.breakdown_s["dp_comm"] > one.breakdown_s["dp_comm"]
    # prefetch: at least one unit is exposed, never more than the traffic itself
    plans = decompose(get_preset("llama3-8b"), Layout(micro_batch=4, zero_stage=3, **kw), DGX)
    traffic = sum(P.time_comm(c)[0] * c.count for c in plans[0].comms if c.group == "dp")
    assert 0 < one.breakdown_s["dp_comm"] <= traffic + 1e-12
    # bytes per parameter and micro-batch: FULL_SHARD 2 + 2 (bf16 gathers) + 4 (fp32 reduce-scatter);
    # Megatron's distributed optimizer (ZeRO-1) 4 + 2 once per step
    z1 = decompose(get_preset("llama3-8b"), Layout(micro_batch=4, zero_stage=1, **kw), DGX)[0]
    z1_bytes = sum(c.message_bytes for c in z1.step_comms)
    z3_bytes = sum(c.message_bytes * c.count for c in plans[0].comms if c.group == "dp")
    assert z3_bytes == pytest.approx(z1_bytes * 8 / 6, rel=1e-9)


def test_fsdp_times_tp_uses_the_dp_group_over_tp(P):
    m = get_preset("llama3-70b")
    L = Layout(num_gpus=1024, tp=8, pp=1, dp=128, micro_batch=1, global_batch=1024, seq_len=4096,
               sequence_parallel=True, recompute="full", zero_stage=3)
    plan = decompose(m, L, DGX)[0]
    ag = [c for c in plan.comms if c.group == "dp"][0]
    assert (ag.ranks, ag.nodes, ag.gpus_per_node) == (128, 128, 1)
    p = P.predict(m, L, timeline=False)
    assert p.breakdown_s["dp_comm"] > 0 and p.breakdown_s["tp_comm"] > 0


# ---- costing --------------------------------------------------------------------------------
def test_training_estimate_and_parse():
    e = costing.training_estimate(10.0, 1024, 4 * 2 ** 20, tokens_to_train=15e12, price_per_gpu_hour=2.0)
    steps = np.ceil(15e12 / (4 * 2 ** 20))
    assert e.steps == steps
    assert e.days == pytest.approx(steps * 10 / 86400)
    assert e.gpu_hours == pytest.approx(steps * 10 * 1024 / 3600)
    assert e.cost == pytest.approx(e.gpu_hours * 2)
    assert costing.training_estimate(10.0, 8, 1000).steps is None
    assert costing.parse_count("15T") == 15e12 and costing.parse_count("300b") == 3e11
    assert costing.parse_count("2.5e9") == 2.5e9 and costing.parse_count(None) is None
    with pytest.raises(ValueError):
        costing.parse_count("lots")
    tf, mfu = costing.throughput(312e12 * 8 * 10, 10.0, 8, 312e12)
    assert tf == pytest.approx(312) and mfu == pytest.approx(1.0)


# ---- CLI ------------------------------------------------------------------------------------
ARGS = ["search", "--model", "llama3-8b", "--platform", "dgx-a100-80gb", "--num-gpus", "64", "--global-batch", "256",
        "--seq-len", "4096", "--top", "4"]


def test_cli_csv_one_header_one_row_per_layout(capsys):
    assert main(ARGS + ["--csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 5
    header = lines[0].split(",")
    assert {"rank", "tp", "pp", "dp", "step_time_s", "mfu", "peak_mem_gib"} <= set(header)
    assert all(len(ln.split(",")) == len(header) for ln in lines[1:])


def test_cli_json_and_table(capsys):
    assert main(ARGS + ["--json", "--objective", "mfu", "--tokens", "1T", "--price-per-gpu-hour", "3"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["objective"] == "mfu" and len(d["layouts"]) == 4 and len(d["top"]) == 4
    assert d["top"][0]["training"]["cost"] > 0 and d["top"][0]["memory"]["fits"]
    assert main(ARGS + ["--explain", "tp=1,zero_stage=0"]) == 0
    out = capsys.readouterr().out
    assert "Top 4 layouts" in out and "--explain" in out


def test_cli_bad_input_names_the_field(capsys):
    assert main(["search", "--model", "llama3-8b", "--platform", "dgx-a100-80gb", "--num-gpus", "x",
                 "--global-batch", "8", "--seq-len", "1024"]) == 2
    assert capsys.readouterr().err.startswith("error: num_gpus:")


def test_cli_table_breakdown_header_names_one_category_per_number(capsys):
    """The share column's header lists as many categories as there are numbers in its cells, in their order
    (it once named 8 over 9 numbers after EP was added, so every column after cp was read as the wrong one)."""
    from predictor.step.compose import CATEGORIES
    assert main(ARGS) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(ln for ln in lines if "(%)" in ln)
    names = head[head.index("compute"):head.index("(%)")].split(" / ")
    assert [n.strip() for n in names] == ["compute", "host", "tp", "cp", "ep", "pp", "dp", "bubble", "opt",
                                          "offload"]
    assert len(names) == len(CATEGORIES)
    rows = [ln for ln in lines if ln.count(" / ") >= len(CATEGORIES) - 1 and "compute" not in ln]
    assert rows
    for ln in rows:
        cell = [c for c in ln.split("│") if " / " in c][-1]
        assert len(cell.split(" / ")) == len(CATEGORIES), ln

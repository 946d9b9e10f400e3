"""The memory verdict over published runs (predictor.checks.memory_verdicts), the allocated / reserved columns of
predict-batch, and layouts that really run out of memory staying refused."""
from __future__ import annotations

import math

import pytest

from predictor.checks.memory_verdicts import RunSet, every_known_run, judge_runs, verdict_counts
from predictor.plan.batch import RESULT_COLUMNS, predict_records
from tests.batch_rows import batch_row

SMALL = dict(platform="dgx-a100-80gb", model="gpt3-1.3b", num_gpus=8, tp=1, pp=1, dp=8, micro_batch=1,
             global_batch=64, seq_len=2048)


def test_predict_batch_reports_allocated_reserved_and_total_memory():
    assert RESULT_COLUMNS.index("memory_allocated_gib") == RESULT_COLUMNS.index("memory_gib") + 1
    (out,) = predict_records([batch_row(**SMALL)])
    alloc, res, total = out["memory_allocated_gib"], out["memory_reserved_gib"], out["memory_gib"]
    assert out["error"] == ""
    # torch's allocated peak < its reserved peak (the caching allocator's reserve) < nvidia-smi's total
    # (+ the CUDA context and NCCL buffers), all of one plausible size for a 1.3B model
    assert 1.0 < alloc < res < total < 80.0


# The ZeRO paper (Rajbhandari et al. 2020, section 1): "Basic DP does not reduce memory per device, and runs out of
# memory for models with more than 1.4B parameters on current generation of GPUs with 32 GB memory."
@pytest.mark.parametrize("model", ["gpt3-2.7b", "gpt3-6.7b"])
def test_data_parallel_alone_above_1_4b_parameters_runs_out_of_memory_on_a_32gb_v100(model):
    rs = RunSet("ZeRO paper", [batch_row(platform="dgx1-v100", model=model, num_gpus=8, tp=1, pp=1, dp=8,
                                         micro_batch=1, global_batch=8, seq_len=1024, precision="fp16",
                                         zero_stage=0, recompute="full", attention="unfused")], ["dp8"])
    (row,) = judge_runs([rs]).to_dict(orient="records")
    assert row["verdict"] == "does not fit"
    assert row["over_gib"] > 0
    assert row["parts"].split(",")[0].split()[0] in ("optimizer", "weights", "gradients")


# OpenRLHF/OpenRLHF#698 ("OOM on Llama 8B"): Meta-Llama-3-8B SFT on one 80 GB A100 with DeepSpeed, "--zero_stage 2
# --bf16 --flash_attn --gradient_checkpointing --max_len 128 --micro_train_batch_size 1 --train_batch_size 1",
# "deepspeed --num_gpus 1"; "after backward pass happens it's at 61 GB and during the step function it goes out of
# memory" (the maintainer's fix, --adam_offload, moves the Adam states to the host, which confirms the states decide)
def test_llama3_8b_on_one_a100_with_deepspeed_zero2_runs_out_of_memory_in_the_optimizer_step():
    rs = RunSet("OpenRLHF#698", [batch_row(platform="dgx-a100-80gb", model="llama3-8b", num_gpus=1, tp=1, pp=1, dp=1,
                                           micro_batch=1, global_batch=1, seq_len=128, precision="bf16",
                                           framework="deepspeed", zero_stage=2, recompute="full",
                                           attention="flash")], ["zero2-1gpu"])
    (row,) = judge_runs([rs]).to_dict(orient="records")
    assert row["verdict"] == "does not fit"
    assert row["over_gib"] > 0
    assert row["parts"].split(",")[0].split()[0] == "optimizer"


def test_a_layout_that_fits_is_judged_so_and_has_no_parts():
    (row,) = judge_runs([RunSet("small", [batch_row(**SMALL)], ["a"])]).to_dict(orient="records")
    assert row["verdict"] in ("fits", "tight")
    assert row["parts"] == "" and math.isnan(row["over_gib"])


def test_a_refused_layout_is_not_predicted_with_its_reason():
    bad = batch_row(**{**SMALL, "tp": 3, "num_gpus": 24})
    (row,) = judge_runs([RunSet("bad", [bad], ["x"])]).to_dict(orient="records")
    assert row["verdict"] == "not predicted" and "tp" in row["error"]


def test_every_catalogued_source_is_a_memory_test(tmp_path):
    sets = [s for s in every_known_run(store_path=tmp_path / "empty.duckdb") if not s.source.startswith("store")]
    names = [s.source for s in sets]
    assert "published memory figures" in names
    assert any(n.startswith("independent: llm-foundry-h100") for n in names)
    assert "independent: NeMo / Megatron-Bridge" in names
    assert all(len(s.records) == len(s.labels) and s.records for s in sets)
    counts = verdict_counts(judge_runs([s for s in sets if s.source == "published memory figures"]))
    assert list(counts.columns) == ["source", "runs", "fits", "tight", "does not fit", "not predicted"]
    assert int(counts["runs"].sum()) == len(sets[-1].records)


def test_search_can_leave_out_tight_layouts_keeping_them_in_the_table_unranked():
    from predictor.model.presets import get_preset
    from predictor.plan.search import SearchSpace, search
    args = dict(model=get_preset("llama3-70b"), platform="dgx-h100", num_gpus=512, global_batch=1024, seq_len=4096,
                top_k=3, refine=False)
    # the case, with the interleaved schedule's send / receive overlap off (with it on, an interleaved layout
    # that fits with the typical reserve is the fastest)
    plain = search(**args, space=SearchSpace(overlap_p2p_comm=False)).table
    assert bool(plain.loc[0, "memory_tight"])          # the case: the fastest layout is a tight one
    rep = search(**args, space=SearchSpace(leave_out_tight=True, overlap_p2p_comm=False))
    t = rep.table
    ranked = t[t["rank"] > 0]
    assert len(ranked) and not ranked["memory_tight"].any() and ranked["fits"].all()
    assert not any(r.memory.tight for r in rep.top)
    left_out = t[t["fits"] & t["memory_tight"]]
    assert len(left_out) == int(plain["memory_tight"].sum()) and (left_out["rank"] == 0).all()
    assert left_out["reason"].str.startswith("tight, left out").all()
    # the best untight layout is slower than the tight one it replaces, never faster
    assert t.loc[0, "step_time_s"] >= plain.loc[0, "step_time_s"]


def test_the_scatter_colours_tight_layouts_apart():
    import pandas as pd

    from predictor_ui.charts import search_scatter
    df = pd.DataFrame({"rank": [1, 2, 0], "tp": [8, 8, 8], "pp": [1, 2, 1], "dp": [1, 1, 1], "micro_batch": [1, 1, 1],
                       "step_time_s": [1.0, 1.1, 0.9], "peak_mem_gib": [70.0, 78.0, 90.0], "fits": [True, True, False],
                       "memory_tight": [False, True, False]})
    labels = search_scatter(df, capacity_gib=80).to_dict()["datasets"]
    values = next(iter(labels.values()))
    assert [v["fits_label"] for v in values] == ["fits", "tight", "does not fit"]


def test_mpt_runs_keep_no_dropout_masks_as_their_configs_say():
    from predictor.checks.independent import load_sources, memory_options_of
    from predictor.samples.formats.sources import load_source_definitions
    from predictor.step.memory import MemoryOptions
    for src in (load_sources()["llm-foundry-h100"], load_source_definitions()["llm-foundry"]):
        assert memory_options_of(src) == MemoryOptions(dropout=False)
        assert "attn_pdrop" in src["memory"]["dropout"]["cite"]
    assert memory_options_of(load_source_definitions()["vtrain"]) == MemoryOptions()
    # what the fact changes: MPT-1B, seq 2048, micro-batch 20 (published on 16-64 H100s) keeps fewer bytes
    row = batch_row(platform="dgx-h100", arch="gpt", layers=24, hidden=2048, heads=16, kv_heads=16,
                    ffn_hidden=8192, vocab=50368, seq_len=2048, num_gpus=16, tp=1, pp=1, dp=16, micro_batch=20,
                    global_batch=320, zero_stage=3, framework="fsdp", attention="triton")
    with_masks, without = (judge_runs([RunSet("mpt", [row], ["1b"], opts)]).iloc[0]
                           for opts in (MemoryOptions(), MemoryOptions(dropout=False)))
    assert without["memory_allocated_gib"] < with_masks["memory_allocated_gib"] - 2.0
    assert with_masks["verdict"] == "does not fit" and without["verdict"] in ("fits", "tight")


def test_a_memory_fact_that_names_no_option_is_refused(tmp_path, monkeypatch):
    import json

    from predictor.samples.formats import sources
    from predictor.samples.formats.common import SourceDefinitionError
    defs = json.loads(sources.PUBLISHED_SOURCES_FILE.read_text())
    defs["sources"]["llm-foundry"]["memory"] = {"dropuot": {"value": False, "cite": "x"}}
    bad = tmp_path / "published_sources.json"
    bad.write_text(json.dumps(defs))
    with pytest.raises(SourceDefinitionError, match=r"sources\.llm-foundry\.memory\.dropuot: give one of dropout"):
        sources.load_source_definitions(bad)

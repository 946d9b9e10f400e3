"""predictor.checks.published_memory: published per-GPU memory figures, cited, compared with the memory model."""
from __future__ import annotations

import json

import pytest

from predictor.checks import published_memory as pm


def compare_edited(doc, tmp_path, name: str):
    """`pm.compare` of an edited copy of the catalog, written to tmp_path / name."""
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return pm.compare(path)


def test_catalog_entries_are_complete():
    doc = pm.load()
    assert len(doc["entries"]) >= 5 and len({e["id"] for e in doc["entries"]}) == len(doc["entries"])
    for e in doc["entries"]:
        assert e["document"] and e["counts"] and e["unit"] in pm.TO_GIB and e["published"] > 0, e["id"]
        if not e.get("unpredictable"):
            assert e["model"] in doc["models"] and e["platform"] and e["setup"], e["id"]
            lay = e["layout"]
            assert lay["tp"] * lay["pp"] * lay["cp"] * lay["dp"] == lay["num_gpus"], e["id"]
            assert lay["global_batch"] % (lay["micro_batch"] * lay["dp"]) == 0, e["id"]
    kinds = {(e.get("layout") or {}).get("precision") for e in doc["entries"]}
    assert "fp8" in kinds  # an FP8 figure, and a MoE one, are comparable today
    assert any(doc["models"][e["model"]].get("num_experts") for e in doc["entries"] if not e.get("unpredictable"))


def test_every_comparable_figure_is_estimated_and_the_rest_say_why():
    d = pm.compare()
    comparable = d[d["note"] == ""]
    assert len(comparable) >= 5 and comparable["ours_gib"].gt(0).all()
    assert ((comparable["error"] - (comparable["ours_gib"] / comparable["published_gib"] - 1)).abs() < 1e-12).all()
    assert d.loc[d["ours_gib"].isna(), "note"].str.startswith(("not comparable", "not estimated")).all()
    mb = d[d["id"] == "megatron-lm-2772-qwen3-30b-a3b-ep8"].iloc[0]
    assert mb["published_gib"] == pytest.approx(45552.0e6 / 2 ** 30)  # units converted, MB = 1e6 bytes


def test_a_refused_model_is_reported_not_raised(tmp_path):
    doc = pm.load()
    doc["models"]["qwen1.5-moe-8x1.8b"]["top_k"] = 99  # more than num_experts: the predictor refuses it
    d = compare_edited(doc, tmp_path, "mem.json")
    bad = d[d["model"] == "qwen1.5-moe-8x1.8b"]
    assert len(bad) == 2 and bad["ours_gib"].isna().all() and bad["note"].str.contains("top_k").all()


def test_each_figure_is_compared_with_the_quantity_it_counts(tmp_path):
    """A nvidia-smi figure is compared with our device total, a max-reserved one with allocated + the allocator's
    reserve, a max-allocated one with the allocated peak: relabelling one entry changes only its own number."""
    doc = pm.load()
    base = pm.compare().set_index("id")
    e = next(x for x in doc["entries"] if x["id"] == "flagperf-llama3-8b-h100-bf16-8gpu")
    assert e["measures"] == "device"
    got = {}
    for measures in ("reserved", "allocated"):
        e["measures"] = measures
        got[measures] = compare_edited(doc, tmp_path, f"{measures}.json").set_index("id").loc[e["id"], "ours_gib"]
    assert base.loc[e["id"], "ours_gib"] > got["reserved"] > got["allocated"] > 0
    from predictor.hardware.platforms import get_platform
    from predictor.step.memory import GIB, estimate_memory
    peak = estimate_memory(pm.model_spec(e["model"], doc["models"][e["model"]]), pm.layout_of(e["layout"]),
                           get_platform(e["platform"])).peak
    assert got["allocated"] == pytest.approx(peak.allocated_bytes / GIB)
    assert got["reserved"] == pytest.approx(peak.reserved_bytes / GIB)
    assert base.loc[e["id"], "ours_gib"] == pytest.approx(peak.total_bytes / GIB)
    e["measures"] = "something else"
    row = compare_edited(doc, tmp_path, "unknown.json").set_index("id").loc[e["id"]]
    assert row["ours_gib"] is None or row["ours_gib"] != row["ours_gib"]
    assert "does not say what its figure counts" in row["note"]


def test_the_gradient_precision_the_document_states_is_applied():
    """The Megatron-Bridge Qwen3 run reduces gradients in bf16 (grad_reduce_in_fp32 False): 2-byte gradient
    buffers, which our estimate takes from the entry's layout instead of the fp32 default."""
    doc = pm.load()
    e = next(x for x in doc["entries"] if x.get("layout", {}).get("grad_reduce_in_fp32") is False)
    from predictor.hardware.platforms import get_platform
    from predictor.step.memory import GIB, estimate_memory
    m, lay = pm.model_spec(e["model"], doc["models"][e["model"]]), pm.layout_of(e["layout"])
    assert lay.grad_reduce_in_fp32 is False and lay.grad_bytes == 2
    from dataclasses import replace
    fp32 = estimate_memory(m, replace(lay, grad_reduce_in_fp32=None), get_platform(e["platform"])).peak
    bf16 = estimate_memory(m, lay, get_platform(e["platform"])).peak
    assert bf16.grads_bytes == pytest.approx(fp32.grads_bytes / 2)
    ours = pm.compare().set_index("id").loc[e["id"], "ours_gib"]
    assert ours == pytest.approx(bf16.allocated_bytes / GIB)


def test_a_figure_of_a_named_stage_is_compared_with_that_stage(tmp_path):
    """Megatron-LM writes its tensorboard memory scalars on the last rank: those figures are compared with our last
    pipeline stage, not the fullest one; an unknown stage is reported, not raised."""
    doc = pm.load()
    e = next(x for x in doc["entries"] if x.get("stage") == "last" and x["layout"]["pp"] > 1)
    from predictor.hardware.platforms import get_platform
    from predictor.step.memory import GIB, estimate_memory
    rep = estimate_memory(pm.model_spec(e["model"], doc["models"][e["model"]]), pm.layout_of(e["layout"]),
                          get_platform(e["platform"]), pm.memory_options(e))
    ours = pm.compare().set_index("id").loc[e["id"], "ours_gib"]
    assert ours == pytest.approx(rep.stages[-1].allocated_bytes / GIB)
    assert rep.peak.stage != rep.stages[-1].stage  # the choice matters for this entry
    e["stage"] = "middle"
    row = compare_edited(doc, tmp_path, "stage.json").set_index("id").loc[e["id"]]
    assert row["ours_gib"] is None or row["ours_gib"] != row["ours_gib"]
    assert "stage must be one of" in row["note"]


def test_byte_figures_are_converted():
    d = pm.compare().set_index("id")
    assert d.loc["megatron-ft-gpt-tp1-pp2-h100", "published_gib"] == pytest.approx(3637371904.0 / 2 ** 30)


def test_a_figure_is_estimated_with_the_settings_its_run_states():
    """The functional tests set CUBLAS_WORKSPACE_CONFIG ':4096:8' (32 MiB per cuBLAS handle, on A100 too) and run
    either Megatron's local modules or Transformer Engine; the estimate takes both from the entry."""
    doc = pm.load()
    e = next(x for x in doc["entries"] if x["id"] == "megatron-ft-gpt-tp1-pp1-distopt-a100")
    opts = pm.memory_options(e)
    assert opts.cublas_workspace_mib == 32.0 and opts.transformer_impl == "local"
    plain = next(x for x in doc["entries"] if x["id"] == "flagperf-llama3-8b-h100-bf16-8gpu")
    from predictor.step.memory import MemoryOptions
    assert pm.memory_options(plain) == MemoryOptions()


def test_the_allocated_figures_are_matched():
    """torch's max allocated of the Megatron-LM functional tests and Megatron-Bridge logs: the dense Megatron-LM
    figures within 3 % each, all of them within 1.5 % on average except the two whose gaps the docs leave open
    (docs/memory_overheads.md: the MoE test, the Llama-3.2-1B run)."""
    d = pm.compare()
    alloc = d[(d["measures"] == "allocated") & d["error"].notna()].set_index("id")
    assert len(alloc) >= 12
    dense = alloc[alloc.index.str.startswith("megatron-ft-gpt")]
    assert len(dense) >= 8 and dense["error"].abs().max() <= 0.03
    known = alloc.drop([i for i in alloc.index if i.startswith(("megatron-ft-moe", "mbridge-llama3.2-1b"))])
    assert known["error"].abs().mean() <= 0.015

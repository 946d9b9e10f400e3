"""predictor.checks.independent: published runs on GPUs never sampled, checked, predicted, never fitted to."""
from __future__ import annotations

import json

import numpy as np
import pytest

from predictor.checks import independent as ind


def test_every_transcribed_row_passes_both_checks():
    """A typo in a transcribed number breaks the batch arithmetic or the MFU recomputed from the throughput."""
    src = ind.load_sources()["llm-foundry-h100"]
    d, dropped = ind.published_runs(src)
    assert dropped == {} and len(d) == len(src["rows"]) == 52
    assert (d["measured_s"] > 0).all()


@pytest.mark.parametrize("column,factor,reason", [("tokens_per_s", 1.3, "published MFU"),
                                                   ("global_batch", 2, "batch arithmetic")])
def test_a_corrupted_row_is_dropped_and_counted(tmp_path, column, factor, reason):
    doc = json.loads(ind.CATALOG.read_text())
    src = doc["sources"]["llm-foundry-h100"]
    i = src["columns"].index(column)
    src["rows"][5][i] = int(src["rows"][5][i] * factor)
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(doc))
    d, dropped = ind.published_runs(ind.load_sources(path)["llm-foundry-h100"])
    assert len(d) == 51 and list(dropped.values()) == [1] and reason in next(iter(dropped))


def test_the_check_predicts_every_run_on_dgx_h100():
    c = ind.run_check()
    d = c.runs
    assert len(d) == 52 and d["predicted_s"].notna().all() and (d["predicted_s"] > 0).all()
    assert set(d["platform"]) == {"dgx-h100"}
    # what measured on an H100 backs it: NVIDIA's published kernel tables (GEMMs; MPT's Triton attention keeps its
    # FA2 base, transferred); no H100 training run and nothing of this check
    assert d["provenance"].str.contains("measured (derived: the forward GEMM grid", regex=False).all()
    assert not d["provenance"].str.contains("derived (flash-attention", regex=False).any()
    assert np.allclose(d["signed_error"], d["predicted_s"] / d["measured_s"] - 1)
    assert (d["predicted_mfu"] < 1).all()
    s = c.summary("nodes")
    assert set(s["group"]) == {"one node", "several nodes (network not stated)"} and s["runs"].sum() == 52
    overall = c.summary().iloc[0]
    assert overall["mape"] >= abs(overall["mean_signed"])


def test_no_independent_run_is_in_the_store():
    """Never fitted to: the store (what every fit reads) holds no run on the check's GPU."""
    from predictor.samples import store
    try:
        runs = store.read_measured_runs()
    except Exception as e:  # noqa: BLE001 - no store on this machine
        pytest.skip(f"no sample store: {e}")
    assert not runs["platform"].str.contains("h100", case=False).any()


def _store_or_skip():
    from predictor.samples import store
    try:
        return store.read_measured_runs(source_id="llm-foundry")
    except Exception as e:  # noqa: BLE001 - no store on this machine
        pytest.skip(f"no sample store: {e}")


def test_each_h100_run_is_paired_with_the_a100_run_of_the_same_configuration():
    """The speed-up table pairs like with like, and splits each H100 error into the A100 error and the speed-up's."""
    if _store_or_skip().empty:
        pytest.skip("the store holds no llm-foundry runs")
    c = ind.run_check()
    ref = ind.reference_runs(c)
    assert not ref.empty and set(ref["platform"]) == {"mosaicml-a100-80gb"} and ref["predicted_s"].gt(0).all()
    p = ind.speedup_pairs(c, ref)
    assert 0 < len(p) <= len(c.runs)
    for r in p.itertuples():
        m = c.source["models"][r.model]
        same = ref[(ref["layers"] == m["layers"]) & (ref["hidden"] == m["hidden"]) & (ref["seq_len"] == r.seq_len)
                   & (ref["num_gpus"] == r.gpus) & (ref["micro_batch"] == r.micro_batch)
                   & ((ref["recompute"] == "full") == r.activation_checkpointing)]
        assert len(same) >= 1
    # 1 + error = (1 + A100 error) x measured / predicted speed-up, per pair: the decomposition is exact
    assert np.allclose(1 + p["signed_error"],
                       (1 + p["reference_signed_error"]) * p["measured_speedup"] / p["predicted_speedup"])
    assert (p["measured_speedup"] > 1).all()   # an H100 outruns an A100 on every published configuration


def test_a_source_without_a_reference_has_no_speedup_table():
    c = ind.run_check("llm-foundry-h100-fp8")
    assert "reference" not in c.source
    ref = ind.reference_runs(c)
    assert ref.empty and ind.speedup_pairs(c, ref).empty

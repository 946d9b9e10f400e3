"""predictor.independent: published runs on GPUs never sampled, checked, predicted, never fitted to."""
from __future__ import annotations

import json

import numpy as np
import pytest

from predictor import independent as ind


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


def test_the_check_predicts_every_run_on_a_platform_without_h100_measurements():
    c = ind.run_check()
    d = c.runs
    assert len(d) == 52 and d["predicted_s"].notna().all() and (d["predicted_s"] > 0).all()
    assert set(d["platform"]) == {"dgx-h100"}
    assert not d["provenance"].str.contains("measured").any()  # nothing measured on an H100 backs it
    assert np.allclose(d["signed_error"], d["predicted_s"] / d["measured_s"] - 1)
    assert (d["predicted_mfu"] < 1).all()
    s = c.summary("nodes")
    assert set(s["group"]) == {"one node", "several nodes (network not stated)"} and s["runs"].sum() == 52
    overall = c.summary().iloc[0]
    assert overall["mape"] >= abs(overall["mean_signed"])


def test_no_independent_run_is_in_the_store():
    """Never fitted to: the store (what every fit reads) holds no run on the check's GPU."""
    from predictor import store
    try:
        runs = store.read_measured_runs()
    except Exception as e:  # noqa: BLE001 - no store on this machine
        pytest.skip(f"no sample store: {e}")
    assert not runs["platform"].str.contains("h100", case=False).any()

"""predictor.checks.extrapolation: the regressors trained on small shapes, scored on larger ones (the Accuracy
page's check and table (b) of tests/benchmarks/op_accuracy.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from predictor.checks.extrapolation import extrapolation_table
from predictor.hardware.platforms import get_platform
from predictor.regress import features

PLATFORM = "perlmutter-a100"


def _store(tmp_path, hiddens):
    from predictor.samples.store import ingest_path
    rng = np.random.default_rng(0)
    rows = [{"platform": PLATFORM, "op": "mlp_up", "pass": "fwd", "tp": tp, "batch": b, "seq": s, "hidden": h,
             "heads": h // 128, "ffn_hidden": 4 * h, "dtype": "fp16"}
            for tp in (1, 2) for b in (1, 2) for s in (512, 1024, 2048) for h in hiddens]
    df = pd.DataFrame(rows)
    df["duration_s"] = features.roofline_s("mlp_up", "fwd", df, get_platform(PLATFORM).device, "fp16") * \
        rng.uniform(1.5, 1.6, len(df))
    df["source"] = "synthetic test samples"
    src = tmp_path / "src"
    src.mkdir()
    df.to_csv(src / "ops.csv", index=False)
    store = tmp_path / "samples.duckdb"
    assert ingest_path(src, store_path=store).ok
    return store


def test_extrapolation_along_hidden(tmp_path):
    store = _store(tmp_path, (1024, 2048, 4096, 6144, 8192))
    seen = []
    t = extrapolation_table(PLATFORM, store, {"mlp_up"}, progress=seen.append)
    assert len(t) == 1 and len(seen) == 1
    row = t.iloc[0]
    assert (row["op"], row["pass"]) == ("mlp_up", "fwd")
    assert row["n_hidden"] == 12  # hidden 8192: 2 tp x 2 batch x 3 seq
    assert 0 <= row["hidden"] < 0.5  # a constant efficiency extrapolates well
    # no sequence 5120 and no TP 16 in the samples: those axes (and "all") are not scored
    assert not {"seq", "tp", "all"} & set(t.columns)
    assert extrapolation_table(PLATFORM, store, {"qkv_proj"}).empty  # an op without samples


def test_extrapolation_needs_rows_beyond_the_limits(tmp_path):
    store = _store(tmp_path, (1024, 2048, 4096))
    t = extrapolation_table(PLATFORM, store)
    assert len(t) == 1 and "hidden" not in t  # nothing beyond hidden 6144

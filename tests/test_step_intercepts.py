"""tests.benchmarks.step_intercepts: per-layer costs from straight lines across layouts, and the flag on cells that
cost less at twice the micro-batch."""
from __future__ import annotations

import pandas as pd
import pytest

from tests.benchmarks.step_intercepts import per_layer


def _layouts(per_layer_ms: dict[int, float], fixed_ms: float = 5.0) -> pd.DataFrame:
    """Intercept rows of one (hidden, tp) cell: per-micro-batch cost = fixed + per_layer x layers per stage, at three
    layer counts and two pp x dp layouts, for each micro-batch in `per_layer_ms`; predictions 10 % over."""
    rows = []
    for mb, ms in per_layer_ms.items():
        for pp, dp in ((1, 2), (2, 1)):
            for layers in (12, 16, 24):
                cost = fixed_ms + ms * layers / pp
                rows.append({"hidden": 1024, "layers": layers, "tp": 2, "pp": pp, "dp": dp, "micro_batch": mb,
                             "per_mb_ms_measured": cost, "per_mb_ms_predicted": 1.1 * cost})
    return pd.DataFrame(rows)


def test_the_slope_across_layers_is_the_cost_of_one_layer():
    out = per_layer(_layouts({1: 3.0, 2: 4.5}))
    assert list(out["micro_batch"]) == [1, 2] and (out["lines"] == 2).all()
    assert out["layer_ms_measured"].tolist() == pytest.approx([3.0, 4.5])
    assert out["error"].tolist() == pytest.approx([0.1, 0.1])
    assert out["measured_range_ms"].tolist() == pytest.approx([0.0, 0.0], abs=1e-9)
    assert not out["cheaper_than_half_the_batch"].any()


def test_twice_the_micro_batch_for_less_is_flagged():
    out = per_layer(_layouts({1: 3.0, 2: 2.8}))
    assert out.set_index("micro_batch")["cheaper_than_half_the_batch"].to_dict() == {1: False, 2: True}

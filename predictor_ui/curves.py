"""The Samples page's regressor curves: a platform's trained regressor along one shape column, and its
prediction for every measured sample (a ModelBank from predictor.regress.regressors.load_bank)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from predictor.hardware.platforms import DeviceSpec, Platform
from predictor.model.ops import COLLECTIVES, SHAPE_COLUMNS

if TYPE_CHECKING:  # the bank itself comes from data.bank (load_bank imports lightgbm)
    from predictor.regress.regressors import ModelBank


def op_curve(bank: ModelBank, op: str, pass_: str, shapes: pd.DataFrame, device: DeviceSpec,
             precision: str) -> pd.Series:
    """The regressor's seconds for each row of shape columns (NaN when the bank has no such model)."""
    if not bank.has_op(op, pass_):
        return pd.Series(np.nan, index=shapes.index)
    return pd.Series(np.asarray(bank.predict_op(op, pass_, shapes, device, precision), dtype=float),
                     index=shapes.index)


def collective_curve(bank: ModelBank, collective: str, message_bytes: Any, nodes: int, gpus_per_node: int,
                     platform: Platform) -> pd.Series:
    """The collective regressor's seconds per message size (NaN when the bank has no such model)."""
    mb = np.asarray(message_bytes, dtype=float)
    if not bank.has_collective(collective):
        return pd.Series(np.full(len(mb), np.nan))
    n = np.broadcast_to(np.asarray(nodes), mb.shape)
    g = np.broadcast_to(np.asarray(gpus_per_node), mb.shape)
    return pd.Series(np.asarray(bank.predict_collective(collective, mb, n, g, platform), dtype=float))


def _common(samples: pd.DataFrame, col: str, fixed: dict[str, Any], default: Any = None) -> Any:
    """The value of `col` on the slice: the one fixed on the page, else the samples' most common one."""
    if col in fixed:
        return fixed[col]
    if col in samples and samples[col].notna().any():
        return samples[col].mode().iloc[0]
    return default


def regressor_over_samples(bank: ModelBank, platform: Platform, name: str, pass_: str | None, samples: pd.DataFrame,
                           *, x: str, xs: np.ndarray, fixed: dict[str, Any], precision: str
                           ) -> tuple[pd.DataFrame | None, pd.Series | None, str]:
    """The regressor's curve along `x` (other shape columns at `fixed`, else their most common value)
    and its prediction for every sample (operators only). Returns (curve, per_sample, note)."""
    if name in COLLECTIVES:
        if x != "message_bytes":
            return None, None, "The regressor's curve is drawn against message_bytes."
        pred = collective_curve(bank, name, xs, int(_common(samples, "nodes", fixed, 1)),
                                int(_common(samples, "gpus_per_node", fixed, 1)), platform)
        note = "" if bank.has_collective(name) else f"No regressor for collective {name} on {platform.platform_id}."
        return pd.DataFrame({x: xs, "predicted_s": pred.values}), None, note
    assert pass_ is not None, "an operator has a pass"
    base = {c: _common(samples, c, fixed) for c in SHAPE_COLUMNS}
    shapes = pd.DataFrame([{**base, x: v} for v in xs], columns=list(SHAPE_COLUMNS)).astype("float64")
    curve = pd.DataFrame({x: xs, "predicted_s": op_curve(bank, name, pass_, shapes, platform.device,
                                                          precision).values})
    if not bank.has_op(name, pass_):
        return curve, None, f"No regressor for {name}/{pass_} on {platform.platform_id} (too few samples?)."
    cols = [c for c in SHAPE_COLUMNS if c in samples]
    per = op_curve(bank, name, pass_, samples[cols].astype("float64"), platform.device, precision)
    return curve, per, ""

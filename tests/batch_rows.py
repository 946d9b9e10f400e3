"""One predict-batch row for tests: every BATCH_COLUMNS cell empty, then a file's defaults, then the cells given
(all as strings, as a CSV reader hands them to predict-batch)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from predictor.model.layout_io import BATCH_COLUMNS


def batch_row(defaults: Mapping[str, Any] | None = None, **cells: Any) -> dict[str, str]:
    r = dict.fromkeys(BATCH_COLUMNS, "")
    r.update({k: str(v) for k, v in (defaults or {}).items()})
    r.update({k: str(v) for k, v in cells.items()})
    return r

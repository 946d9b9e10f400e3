"""Import lightgbm without its scikit-learn wrappers and its pandas support.

`import lightgbm` imports scikit-learn and scipy.stats for its sklearn-API classes (about 1.2 s of the
1.5 s a cold import takes) and pandas for DataFrame inputs (0.2 s), on the path of every first
prediction (the CLI, the dashboard's first visitor). The predictor uses only `lgb.Booster`,
`lgb.Dataset` and `lgb.train` on numpy arrays. Training imports scikit-learn itself later (KFold),
which then loads normally. Modules already imported are left alone.
"""
from __future__ import annotations

import sys
from types import ModuleType


def import_lightgbm() -> ModuleType:
    if "lightgbm" not in sys.modules:
        blocked = [m for m in ("sklearn", "pandas") if m not in sys.modules]
        for m in blocked:
            sys.modules[m] = None  # type: ignore[assignment]  # lightgbm.compat: ImportError -> feature off
        try:
            import lightgbm
        finally:
            for m in blocked:
                if sys.modules.get(m, 0) is None:
                    del sys.modules[m]
    import lightgbm
    return lightgbm

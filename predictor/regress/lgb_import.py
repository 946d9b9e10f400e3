"""Import lightgbm without its scikit-learn wrappers, its pandas support, and (until first needed) scipy.

`import lightgbm` imports scikit-learn and scipy.stats for its sklearn-API classes (about 1.2 s of the
1.5 s a cold import takes) and pandas for DataFrame inputs (0.2 s), on the path of every first
prediction (the CLI, the dashboard's first visitor). The predictor uses only `lgb.Booster`,
`lgb.Dataset` and `lgb.train` on numpy arrays. Training imports scikit-learn itself later (KFold),
which then loads normally. Modules already imported are left alone.

`lightgbm.basic` also imports `scipy.sparse` (0.15 s, a third of a CLI prediction) only to test
`isinstance(data, scipy.sparse.csr_matrix)` and friends, and to convert inputs that are neither arrays
nor frames. While lightgbm is imported, `scipy` / `scipy.sparse` are stand-ins whose three classes
answer `isinstance` as the real ones do once scipy is loaded (never true before: nothing sparse can exist
then) and build the real matrices when called; any other attribute loads the real `scipy.sparse`. The
stand-ins leave `sys.modules` right after, so `import scipy` anywhere else is the real one. Should a
lightgbm version need more of scipy at import time, the import is redone plainly.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

_SPARSE_CLASSES = ("spmatrix", "csr_matrix", "csc_matrix")


class _DeferredSparseClass(type):
    """A scipy.sparse class name that resolves to the real class when scipy is loaded."""

    def __instancecheck__(cls, obj: object) -> bool:
        real = sys.modules.get("scipy.sparse")
        return isinstance(real, ModuleType) and not getattr(real, "_planner_stand_in", False) \
            and isinstance(obj, getattr(real, cls.__name__))

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module("scipy.sparse"), cls.__name__)(*args, **kwargs)


def _stand_ins() -> dict[str, ModuleType]:
    pkg, sparse = ModuleType("scipy"), ModuleType("scipy.sparse")
    pkg.__path__ = []
    pkg.sparse = sparse  # type: ignore[attr-defined]
    for m in (pkg, sparse):
        m._planner_stand_in = True  # type: ignore[attr-defined]
    for name in _SPARSE_CLASSES:
        setattr(sparse, name, _DeferredSparseClass(name, (), {}))

    def real_attribute(name: str) -> Any:
        if sys.modules.get("scipy.sparse") is sparse:  # still importing lightgbm: it needs more than we stand in for
            raise AttributeError(name)
        return getattr(importlib.import_module("scipy.sparse"), name)

    setattr(sparse, "__getattr__", real_attribute)  # noqa: B010  # PEP 562 module __getattr__
    return {"scipy": pkg, "scipy.sparse": sparse}


def import_lightgbm() -> ModuleType:
    if "lightgbm" not in sys.modules:
        blocked = [m for m in ("sklearn", "pandas") if m not in sys.modules]
        for m in blocked:
            sys.modules[m] = None  # type: ignore[assignment]  # lightgbm.compat: ImportError -> feature off
        stand_ins = {} if "scipy" in sys.modules else _stand_ins()
        sys.modules.update(stand_ins)
        try:
            import lightgbm
        except AttributeError:  # a lightgbm that uses more of scipy at import: import it plainly
            for name in [n for n in sys.modules if n == "lightgbm" or n.startswith("lightgbm.")]:
                del sys.modules[name]
            for name, mod in stand_ins.items():
                if sys.modules.get(name) is mod:
                    del sys.modules[name]
            stand_ins = {}
            import lightgbm
        finally:
            for name, mod in stand_ins.items():
                if sys.modules.get(name) is mod:
                    del sys.modules[name]
            for m in blocked:
                if sys.modules.get(m, 0) is None:
                    del sys.modules[m]
    import lightgbm
    return lightgbm


def single_thread_predictor(booster: Any) -> Callable[[Any], Any]:
    """A function X -> booster.predict(X, num_threads=1), the same numbers without the per-call set-up.

    `Booster.predict` builds a new `_InnerPredictor` on every call (a C call for the current iteration, a deep copy
    of its parameters), about a third of a small prediction's time. This builds it once, with the parameters and
    iteration limit `Booster.predict` passes (lightgbm 4.7, the pinned version); where that private class is not as
    expected, it falls back to `booster.predict`. The function keeps the booster alive, whose handle the inner
    predictor borrows."""
    try:
        from lightgbm.basic import _InnerPredictor
        inner = _InnerPredictor.from_booster(booster=booster, pred_parameter={"num_threads": 1})
        limit = booster.best_iteration
    except (ImportError, AttributeError, TypeError):
        return lambda X: booster.predict(X, num_threads=1)

    def predict(X: Any, _booster: Any = booster) -> Any:
        return inner.predict(data=X, start_iteration=0, num_iteration=limit, raw_score=False, pred_leaf=False,
                             pred_contrib=False, data_has_header=False, validate_features=False)
    return predict

"""Warm starts: work a fresh server would otherwise do on its first visitor's time.

- `at_server_start()` (app.py's st.App start-up hook under `streamlit run app.py`): a daemon thread
  imports what the Predict page needs (pandas, the predictor, lightgbm without its scikit-learn
  wrappers) and predicts the default setup into the same caches the page reads, while the first
  visitor's browser is still loading Streamlit's JavaScript.
- `after_first_run()` (end of every script run, once per process): a daemon thread imports the chart
  library, which the first view of Predict does not need (plain HTML bars and tables).

Nothing here is needed for correctness: a failure only means a colder start.
"""
from __future__ import annotations

import os
import sys
import threading
import time

_STARTED = threading.Event()
_SERVER = threading.Event()
CHART_MODULES = ("altair",)


def _log(msg: str) -> None:
    if os.environ.get("PLANNER_TIMING"):
        print(f"[planner] warm-up: {msg}", file=sys.stderr, flush=True)


def _default_prediction() -> None:
    t0 = time.perf_counter()
    try:
        from . import adapters, data, inputs
        adapters.import_lightgbm_fast()
        d = inputs.DEFAULT_SETUP
        fields = {k: v for k, v in d.items() if k not in ("model", "platform", "attention")}  # as the page
        model, layout = data.build({"model": d["model"]}, {**fields, "stage_layers": None})
        data.predict(d["platform"], model, layout)
        data.memory(d["platform"], model, layout)
        data.default_price(d["platform"])
        _log(f"default prediction cached in {time.perf_counter() - t0:.2f} s")
    except Exception as e:  # noqa: BLE001 - best effort
        _log(f"skipped ({type(e).__name__}: {e})")


def at_server_start() -> None:
    if _SERVER.is_set():
        return
    _SERVER.set()
    threading.Thread(target=_default_prediction, name="planner-warm-start", daemon=True).start()


def _import_charts() -> None:
    for name in CHART_MODULES:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - the page imports it again if needed
            pass


def after_first_run() -> None:
    """Start the chart-library import once per process (a no-op when it is imported already)."""
    if _STARTED.is_set():
        return
    _STARTED.set()
    if all(m in sys.modules for m in CHART_MODULES):
        return
    threading.Thread(target=_import_charts, name="planner-warm-charts", daemon=True).start()

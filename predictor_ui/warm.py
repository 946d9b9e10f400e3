"""Warm starts: work a fresh server would otherwise do on its first visitor's time.

`warm_up()` runs in app.py's `st.App` start-up hook under `streamlit run app.py`, *before* the server
accepts connections (and before `/_stcore/health` answers): it imports what the pages need (pandas,
the predictor, lightgbm without its scikit-learn wrappers, the chart library) and predicts the
default setup into the same caches the Predict page reads. Done in the background instead, it would
compete for the GIL and the CPU with the first visitor's browser loading Streamlit's JavaScript from
this very process, which made the first visit about a second slower than later ones.

The start-up hook bounds it (`WARM_UP_TIMEOUT_S`): a slow or failing warm-up only means a colder
start, never a server that does not come up. Nothing here is needed for correctness.
"""
from __future__ import annotations

import os
import sys
import threading
import time

_DONE = threading.Event()
CHART_MODULES = ("altair",)
WARM_UP_TIMEOUT_S = 30.0


def _log(msg: str) -> None:
    if os.environ.get("PLANNER_TIMING"):
        print(f"[planner] warm-up: {msg}", file=sys.stderr, flush=True)


def _default_prediction() -> None:
    from predictor.regress.lgb_import import import_lightgbm

    from . import data, inputs
    import_lightgbm()
    d = inputs.DEFAULT_SETUP
    fields = {k: v for k, v in d.items() if k not in ("model", "platform", "attention")}  # as the page
    model, layout = data.build({"model": d["model"]}, {**fields, "stage_layers": None})
    data.predict(d["platform"], model, layout)


def _settle_streamlit_first_run() -> None:
    """What Streamlit does on the first script run of a process, done here instead (private API,
    best effort; each step is a no-op where the attribute is missing):

    - the check whether it runs in a REPL, an inspect.stack() from deep in the script: 0.25 s;
    - the switch from pages/-folder (v1) multipage mode to st.navigation mode, which app.py's first
      run makes anyway; made by the first run it costs that visitor a rerun (views.page_setup);
    - compiling app.py and the pages into Streamlit's script cache.
    """
    from streamlit import delta_generator
    if hasattr(delta_generator, "_use_warning_has_been_displayed"):
        delta_generator._use_warning_has_been_displayed = True
    from streamlit.runtime.pages_manager import PagesManager
    if hasattr(PagesManager, "uses_pages_directory"):
        PagesManager.uses_pages_directory = False
    from streamlit.runtime import Runtime
    cache = getattr(Runtime.instance(), "_script_cache", None) if Runtime.exists() else None
    if cache is not None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for rel in ["app.py"] + [os.path.join("pages", f) for f in sorted(os.listdir(os.path.join(root, "pages")))
                                 if f.endswith(".py")]:
            cache.get_bytecode(os.path.join(root, rel))


def _import_charts() -> None:
    for name in CHART_MODULES:
        __import__(name)


def warm_up() -> None:
    """Once per process: the default prediction, then the chart library. Best effort."""
    if _DONE.is_set():
        return
    _DONE.set()
    for what, step in (("Streamlit first-run work done", _settle_streamlit_first_run),
                       ("default prediction cached", _default_prediction), ("chart library imported", _import_charts)):
        t0 = time.perf_counter()
        try:
            step()
            _log(f"{what} in {time.perf_counter() - t0:.2f} s")
        except Exception as e:  # noqa: BLE001 - best effort: the page does it again if needed
            _log(f"{what}: skipped ({type(e).__name__}: {e})")


async def warm_up_before_serving(timeout_s: float = WARM_UP_TIMEOUT_S) -> None:
    """The start-up hook's body: `warm_up()` in a worker thread, waited for at most `timeout_s`."""
    import asyncio
    try:
        await asyncio.wait_for(asyncio.to_thread(warm_up), timeout_s)
    except TimeoutError:
        _log(f"still running after {timeout_s:g} s; serving anyway")

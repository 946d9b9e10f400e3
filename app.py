"""LLM training-step planner: the dashboard.

    .venv/bin/streamlit run app.py

Pages live in pages/ and stay thin over predictor/ (shared UI code: predictor_ui/).

Streamlit runs this file as the script of every session (`__name__ == "__main__"`; AppTest too). Under
`streamlit run app.py` it is also imported once as a module to find `app`, an `st.App` whose start-up
hook warms the server before it accepts connections (imports, the default prediction and the chart
library, predictor_ui/warm.py), so that the first visitor after a restart does not wait for them.
"""
import os
import sys
import time

import streamlit as st

PAGES = {
    "Plan": [
        ("pages/predict.py", "Predict", ":material/speed:", None),
        ("pages/compare.py", "Compare", ":material/compare_arrows:", "compare"),
        ("pages/search.py", "Search", ":material/travel_explore:", "search"),
    ],
    "Trust": [
        ("pages/accuracy.py", "Accuracy", ":material/verified:", "accuracy"),
        ("pages/samples.py", "Samples", ":material/scatter_plot:", "samples"),
        ("pages/calibrate.py", "Calibrate", ":material/upload_file:", "calibrate"),
    ],
}


def run_dashboard() -> None:
    t0 = time.perf_counter()
    st.set_page_config(page_title="LLM step-time planner", page_icon=":material/speed:", layout="wide",
                       initial_sidebar_state="expanded")
    pages = {group: [st.Page(path, title=title, icon=icon, default=url is None,
                             **({"url_path": url} if url else {})) for path, title, icon, url in entries]
             for group, entries in PAGES.items()}
    page = st.navigation(pages, position="top")
    try:
        page.run()
        # the link's parameters no input read are named on the page (not after st.stop() or a rerun request:
        # Streamlit takes no more output then)
        from predictor_ui import urlcheck
        urlcheck.finish()
    finally:
        if os.environ.get("PLANNER_TIMING"):  # script time per run, for the browser test's report
            heavy = [m for m in ("pandas", "lightgbm", "sklearn", "scipy.stats", "altair", "duckdb", "torch")
                     if m in sys.modules]
            print(f"[planner] {page.title}: script run {time.perf_counter() - t0:.3f} s (loaded: {', '.join(heavy)})",
                  file=sys.stderr, flush=True)


if __name__ == "__main__":
    run_dashboard()
else:  # imported by `streamlit run app.py` (ASGI mode): the server, with a warm start
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def _lifespan(_app):
        from predictor_ui import warm
        await warm.warm_up_before_serving()
        yield

    app = st.App(os.path.abspath(__file__), lifespan=_lifespan)

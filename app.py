"""LLM training-step planner: the dashboard.

    .venv/bin/streamlit run app.py

Pages live in pages/ and stay thin over predictor/ (shared UI code: predictor_ui/).
"""
import os
import sys
import time

import streamlit as st

_T0 = time.perf_counter()

st.set_page_config(page_title="LLM step-time planner", page_icon=":material/speed:", layout="wide",
                   initial_sidebar_state="expanded")

PAGES = {
    "Plan": [
        st.Page("pages/predict.py", title="Predict", icon=":material/speed:", default=True),
        st.Page("pages/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
        st.Page("pages/search.py", title="Search", icon=":material/travel_explore:", url_path="search"),
    ],
    "Trust": [
        st.Page("pages/accuracy.py", title="Accuracy", icon=":material/verified:", url_path="accuracy"),
        st.Page("pages/samples.py", title="Samples", icon=":material/scatter_plot:", url_path="samples"),
        st.Page("pages/calibrate.py", title="Calibrate", icon=":material/upload_file:", url_path="calibrate"),
    ],
}

page = st.navigation(PAGES, position="top")
try:
    page.run()
finally:
    if os.environ.get("PLANNER_TIMING"):  # script time per run, for the browser test's report
        print(f"[planner] {page.title}: script run {time.perf_counter() - _T0:.3f} s", file=sys.stderr, flush=True)

"""Shared pieces of the Streamlit dashboard (`app.py`, `pages/`).

- `config`   where the store, the models and user clusters live (env overrides), version stamps for caches
- `adapters` every call into predictor modules whose API may still move (memory, search, costing, training,
             regressors, ingest), in one place, each degrading to a clear "not available" answer
- `data`     Streamlit caches over the predictor (st.cache_resource) and the store (st.cache_data)
- `inputs`   sidebar / form widgets bound to the URL query string (shareable links)
- `charts`   Altair chart builders: plain functions of DataFrames / dicts, testable without a browser
- `views`    small rendering helpers shared by pages (infeasible warnings, exports, headline metrics)
- `fmt`      human formatting of seconds, tokens, money
- `warm`     after the first page of a fresh server is drawn, imports the chart library in the background

predictor/ never imports this package; this package may import streamlit.
"""

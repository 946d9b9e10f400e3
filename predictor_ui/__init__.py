"""Shared pieces of the Streamlit dashboard (`app.py`, `pages/`).

- `config`   where the store, the models and user clusters live (env overrides), version stamps for caches
- `data`     Streamlit caches over the predictor (st.cache_resource), the store and the models folder
             (st.cache_data); pages call predictor modules directly for everything else
- `clusters` the custom-cluster form's fields -> a Platform (saving: predictor.hardware.platforms.save_cluster)
- `search_view` a predictor.plan.search.SearchReport as the Search page's table, a row as Predict's query
- `curves`   the Samples page's regressor curves over the measured samples
- `inputs`   sidebar / form widgets bound to the URL query string (shareable links)
- `charts`   Altair chart builders: plain functions of DataFrames / dicts, testable without a browser
- `views`    small rendering helpers shared by pages (infeasible warnings, exports, headline metrics)
- `fmt`      human formatting of seconds, tokens, money
- `warm`     after the first page of a fresh server is drawn, imports the chart library in the background

predictor/ never imports this package; this package may import streamlit.
"""

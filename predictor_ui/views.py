"""Small rendering helpers shared by the pages."""
from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from predictor.model.errors import InfeasibleConfig

from . import fmt, urlcheck
from .search_view import predict_query

PROVENANCE_HELP = ("**measured**: regressors trained on this device's own samples · **transferred**: another "
                   "device's regressors rescaled by the specs · **stand-in**: an op nobody sampled, timed as a "
                   "sampled relative scaled by its work · **host overhead (fitted on measured runs)**: the "
                   "framework's per-layer host time, fitted on measured end-to-end runs of this platform (where "
                   "there is no fit it is not modelled) · **analytical**: roofline / link specs only")


def page_setup() -> None:
    """First call of every page.

    Streamlit treats a `pages/` folder next to app.py as a v1 multipage app until app.py has called
    st.navigation once in the process; a fresh server's first request for e.g. /compare would run
    pages/compare.py directly (no top navigation, no page config). Switch the process to
    st.navigation mode and rerun, so the request goes through app.py.
    """
    try:
        from streamlit.runtime.pages_manager import PagesManager
    except ImportError:  # a Streamlit without it has no v1 fallback either
        return
    if getattr(PagesManager, "uses_pages_directory", False):
        PagesManager.uses_pages_directory = False
        # Only a session's first run can be in this mode on a real server; rerunning later would drop
        # the widget event that triggered the run (AppTest resets the flag on every run).
        if not list(st.session_state.keys()):
            st.rerun()
    urlcheck.start()   # the link's dropped parameters are named here, at the top of the page


# The command-line flags a fix may name, as the inputs they are on a page.
FLAG_LABELS = {"--tp": "TP", "--pp": "PP", "--cp": "CP", "--dp": "DP", "--ep": "EP", "--num-gpus": "GPUs",
               "--vpp": "Virtual stages", "--schedule": "Schedule", "--micro-batch": "Micro-batch",
               "--global-batch": "Global batch", "--seq-len": "Sequence length", "--recompute": "Recomputation",
               "--zero-stage": "ZeRO stage", "--sequence-parallel": "Sequence parallelism", "--precision": "Precision",
               "--stage-layers": "Layers per stage", "--framework": "Framework", "--layers": "Layers",
               "--hidden": "Hidden size", "--heads": "Heads", "--kv-heads": "KV heads", "--head-dim": "Head dim",
               "--ffn-hidden": "FFN hidden", "--vocab": "Vocabulary", "--num-experts": "Experts", "--top-k": "Top-k",
               "--model": "Model", "--platform": "Platform", "--overlap-tp-comm": "Overlap TP communication",
               "--fp8-param-gather": "FP8 primary weights", "--grad-reduce-in-fp32": "FP32 gradients"}


def plain(text: str) -> str:
    """`text` (an error message) shown as written by st.markdown / st.warning: Markdown's characters escaped
    ('tp*pp*dp = 2*4*32' was rendered as 'tpppdp = 2432')."""
    return re.sub(r"([\\`*_{}\[\]()#+!|~<>$])", r"\\\1", str(text))


def on_page(text: str) -> str:
    """An error message for a page: Markdown-escaped, the command-line flags it names as the inputs they are
    here ('set --vpp 2' -> 'set Virtual stages 2')."""
    out = plain(text)
    for flag, label in sorted(FLAG_LABELS.items(), key=lambda kv: -len(kv[0])):
        out = re.sub(re.escape(plain(flag)) + r"(?![\w-])", f"**{label}**", out)
    return out


def infeasible(e: InfeasibleConfig, where: str = "") -> None:
    """What is wrong (the field) and how to fix it; never a traceback."""
    fix = f"\n\n**How to fix:** {on_page(e.fix)}" if getattr(e, "fix", "") else ""
    st.warning(f"**{where}Infeasible input · `{e.field}`**: {on_page(e.problem)}{fix}", icon=":material/warning:")


def failed(e: Exception, what: str, platform: str | None = None) -> None:
    """A failure that is not the user's input (stale or broken model files, an unreadable store):
    what went wrong and what to run, without a traceback."""
    hint = ""
    if platform and ("feature" in str(e).lower() or "lightgbm" in type(e).__module__.lower()
                     or "model" in type(e).__name__.lower()):
        hint = (f"\n\nThe trained regressors of **{platform}** do not match this version of the predictor. "
                f"Retrain them: `.venv/bin/python -m predictor train --platform {platform}` (or on **Calibrate**).")
    st.error(f"**{what} failed**: {type(e).__name__}: {plain(str(e)[:400])}{hint}", icon=":material/error:")


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (np.bool_,)):
        return bool(o)
    if isinstance(o, (pd.Timestamp,)):
        return o.isoformat()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def to_json(obj: Any) -> str:
    if isinstance(obj, pd.DataFrame):
        obj = obj.replace({np.nan: None}).to_dict(orient="records")
    return json.dumps(obj, indent=2, default=_json_default)


def export(df: pd.DataFrame, name: str, key: str, container=None) -> None:
    """CSV and JSON downloads of a table. The files are written when a button is clicked (deferred
    data), not on every script run: no serialisation and no media fetch on the page's first paint."""
    c = container or st
    a, b, _ = c.columns([1, 1, 4])
    a.download_button("CSV", lambda: df.to_csv(index=False).encode(), file_name=f"{name}.csv", mime="text/csv",
                      key=f"{key}_csv", icon=":material/download:", on_click="ignore")
    b.download_button("JSON", lambda: to_json(df).encode(), file_name=f"{name}.json", mime="application/json",
                      key=f"{key}_json", icon=":material/download:", on_click="ignore")


def table(df: pd.DataFrame, name: str, key: str, height: int | str = "auto", shown: pd.DataFrame | None = None,
          **kwargs: Any) -> Any:
    """A dataframe with its CSV / JSON export underneath; `shown`: what the page shows instead of `df` (formatted
    for reading), the export keeping `df`'s values."""
    ev = st.dataframe(df if shown is None else shown, height=height, hide_index=True, key=key, **kwargs)
    export(df, name, key + "_x")
    return ev


def store_missing(message: str) -> None:
    st.info(message, icon=":material/database:")


def share_hint() -> None:
    st.caption(":material/link: The address bar holds every input: copy it to share this view.")


def step_band(pred) -> str:
    lo, hi = pred.step_time_s * (1 - pred.expected_error), pred.step_time_s * (1 + pred.expected_error)
    return f"± {fmt.pct(pred.expected_error)} ({fmt.seconds(lo)} – {fmt.seconds(hi)})"


# The headline card has room for about nine characters at its font size: the kind of the largest share in one
# short word (the full text sits in the card's caption and in the provenance bar below).
PROV_WORDS = (("measured", "Measured"), ("derived", "Derived"), ("transferred", "Transfer"),
              ("analytical", "Analytic"), ("stand-in", "Stand-in"), ("end-to-end", "E2E terms"),
              ("framework host", "Host fit"))


def family_shares(share: dict[str, float]) -> dict[str, float]:
    """The provenance shares summed by family (the first word of each label: 'measured (derived: ...)' is
    measured, 'analytical (fused kernel)' analytical), largest first."""
    out: dict[str, float] = {}
    for label, v in share.items():
        fam = next((prefix for prefix, _ in PROV_WORDS if label.startswith(prefix)), label.split(" ")[0])
        out[fam] = out.get(fam, 0.0) + v
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def prov_word(share: dict[str, float]) -> str:
    """One short word for the family of data the largest share of a prediction rests on (shares of one family
    summed, so measured GEMMs split over two labels still count as measured)."""
    fams = family_shares(share)
    if not fams:
        return "-"
    top = next(iter(fams))
    return next((w for prefix, w in PROV_WORDS if top == prefix), top[:9].capitalize())


def short_prov(share: dict[str, float], families: int | None = None) -> str:
    """'label 26%, ...' largest first; with `families`, only that many families summed ('measured 40%, ...'),
    short enough for a metric card."""
    if families is not None:
        return ", ".join(f"{k} {v:.0%}" for k, v in list(family_shares(share).items())[:families] if v >= 0.005)
    return ", ".join(f"{k} {v:.0%}" for k, v in sorted(share.items(), key=lambda kv: -kv[1]) if v >= 0.005)


def open_in_predict(model_fields: dict, plat_fields: dict, row: pd.Series, target: dict) -> None:
    """Switch to Predict with a search row's layout (and the search's model, platform and target) in the URL."""
    qp = {**{k: str(v) for k, v in model_fields.items() if v is not None and k != "name"},
          **{k: str(v) for k, v in plat_fields.items()}, **predict_query(row),
          "tokens_b": str(target["tokens"] / 1e9)}
    if target["price"] is not None:
        qp["price"] = str(target["price"])
    st.switch_page("pages/predict.py", query_params=qp)

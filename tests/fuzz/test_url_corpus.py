"""The address-bar corpus: every dashboard page's query parameters set to values a pasted or hand-edited link can
hold (overflowing numbers, NaN, negatives, fractions, unknown options, empty), all at once, under
streamlit.testing.v1.AppTest. Outcome for every case: no exception (Streamlit's number input used to raise
OverflowError on `inf` / `1e309` / a 20,000-digit number and stop the page half-drawn), and every parameter the
page cannot take is named on the page (never replaced by its default without a word); one it can take is shown.

The parameters of each page are those of its widgets in a run that opens every section (custom model with
experts, custom cluster, interleaved schedule, four setups on Compare), plus the tab and segmented-control keys.
A parameter whose widget the bad run does not draw (a closed tab's, Compare's fourth setup once `n` is dropped) is
named as not read by app.py at the end of the run; AppTest runs a page other than the first one without app.py
(its `pages/` folder makes it a v1 multipage app), and a page that stops early (an infeasible layout) takes no
more output, so there only the drawn widgets' parameters are checked.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")
KINDS = ("number_input", "selectbox", "toggle", "text_input", "multiselect", "select_slider")

PAGES = {  # page -> (query opening every section, keys no element list shows: tabs, segmented controls)
    "predict": ({"model": "custom", "platform": "custom", "moe": "true", "schedule": "interleaved"}, ["view"]),
    "compare": ({"n": "4", **{f"{x}_model": "custom" for x in "abcd"}, **{f"{x}_moe": "true" for x in "abcd"}},
                ["n"]),
    "search": ({"sr_model": "custom", "sr_platform": "custom", "sr_moe": "true"}, []),
    "accuracy": ({}, ["acc_view", "acc_net_y"]),
    "samples": ({}, []),
    "calibrate": ({}, []),
}
PATHS = {"predict": None, "compare": "pages/compare.py", "search": "pages/search.py", "accuracy": "pages/accuracy.py",
         "samples": "pages/samples.py", "calibrate": "pages/calibrate.py"}
# "9" * 400 overflows a float as 1e309 does; the 20,000-digit number is one parameter at a time below (Streamlit
# ignores a query string over 512 KiB, which every parameter at 20,000 characters would be)
BAD = ["inf", "-inf", "1e309", "9" * 400, "nan", "-1", "2.5", "nope", ""]


def _run(page: str, query: dict[str, str]) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    path = PATHS[page]
    if path:
        at.switch_page(path)   # before the first run: a key bound on another page would be filtered out
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    return at


def _widgets(at: AppTest) -> dict[str, tuple[str, object]]:
    out: dict[str, tuple[str, object]] = {}
    for kind in KINDS:
        for el in at.get(kind):
            key = getattr(el, "key", None)
            if key and getattr(el.proto, "query_param_key", ""):   # bound to the URL
                out[key] = (kind, getattr(el, "value", None))
    return out


@pytest.fixture(scope="module")
def page_keys() -> dict[str, list[str]]:
    keys = {}
    for page, (setup, extra) in PAGES.items():
        at = _run(page, setup)
        assert not at.exception, (page, [e.value for e in at.exception])
        keys[page] = sorted(set(_widgets(at)) | set(extra))
    return keys


def _taken(kind: str, shown: object, value: str) -> bool:
    """Whether the widget shows the URL's value (the page took it)."""
    if kind == "text_input":
        return shown == value
    if kind == "number_input" and shown is not None:
        try:
            return math.isclose(float(shown), float(value))  # type: ignore[arg-type]
        except ValueError:
            return False
    return False


@pytest.mark.parametrize("bad", BAD, ids=lambda v: v if len(v) < 12 else f"{len(v)}-digits")
@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_parameter_of_every_page_is_taken_or_named(page, bad, page_keys):
    setup, _ = PAGES[page]
    keys = [k for k in page_keys[page] if k not in setup]
    at = _run(page, {**setup, **dict.fromkeys(keys, bad)})
    assert not at.exception, [e.value for e in at.exception]
    notes = "\n".join(w.value for w in at.warning if w.value.startswith("Link parameter"))
    refused = "\n".join(w.value for w in at.warning if "Infeasible input" in w.value)
    widgets = _widgets(at)
    if bad == "":
        return   # an empty value clears an optional input (dp: auto, price: none): nothing to name
    for k in keys:
        field = re.sub(r"^(?:[abcd]_|sr_)", "", k)
        # named as dropped from the link, or taken into the setup and refused by the page naming the field
        named = f"`{k}={bad[:40]}" in notes or f"`{k}`" in notes or f"`{field}`" in refused
        stopped = any("Infeasible input" in w.value for w in at.warning)
        if k not in widgets and (PATHS[page] is not None or stopped):
            continue   # not drawn, and not through app.py or the page stopped early (see the module doc)
        kind, shown = widgets.get(k, ("", None))
        assert named or _taken(kind, shown, bad), f"{page}: {k}={bad[:20]!r} neither named nor taken ({shown!r})"


@pytest.mark.parametrize("page,key", [("predict", "num_gpus"), ("predict", "global_batch"), ("compare", "a_num_gpus"),
                                      ("compare", "b_tp"), ("search", "sr_num_gpus"), ("search", "top")])
def test_a_20000_digit_number_is_named(page, key):
    at = _run(page, {key: "7" * 20000})
    assert not at.exception, [e.value for e in at.exception]
    notes = [w.value for w in at.warning if w.value.startswith("Link parameter")]
    assert len(notes) == 1 and f"`{key}=7777" in notes[0] and "20,000 characters" in notes[0], notes

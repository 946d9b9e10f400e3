"""The dashboard in a real browser: Debian's chromium driven by Playwright against
`streamlit run app.py` on loopback. Asserts on what a person sees, saves screenshots under
out/browser/ (or $PLANNER_SCREENSHOTS), and prints first-paint and interaction timings.

Skips (with the reason) when the playwright package or a chromium binary is missing.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.browser import harness

REASON = harness.missing_requirements()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"browser tests skipped: {REASON}")

SHOTS = Path(os.environ.get("PLANNER_SCREENSHOTS") or harness.DEFAULT_OUT)
TIMINGS: dict[str, float] = {}
STEP_RE = re.compile(r"^\d[\d.,]*\s?(µs|ms|s|min|h|days)$")


@pytest.fixture(scope="module")
def server(browser):  # the browser starts first, so "since server start" holds no browser start-up
    SHOTS.mkdir(parents=True, exist_ok=True)
    with harness.streamlit_server(log_dir=SHOTS) as srv:
        TIMINGS["server_start_to_healthy_s"] = srv.startup_s
        yield srv
    (SHOTS / "timings.json").write_text(json.dumps(TIMINGS, indent=2))  # printed by conftest at the end


@pytest.fixture(scope="module")
def browser():
    with harness.browser() as b:
        yield b


@pytest.fixture()
def page(browser):
    ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    p = ctx.new_page()
    p.set_default_timeout(60_000)
    yield p
    ctx.close()


def shot(page, name: str) -> None:
    """The whole page: Streamlit scrolls inside its main block, so grow the viewport to fit it."""
    size = page.viewport_size
    h = page.evaluate("""() => Math.max(...['stMain', 'stSidebar', 'stAppViewContainer'].map(id => {
        const el = document.querySelector(`[data-testid="${id}"]`);
        return el ? el.scrollHeight : 0; }))""")
    page.set_viewport_size({"width": size["width"], "height": min(max(size["height"], int(h) + 40), 6000)})
    harness.wait_idle(page, 30_000)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    page.set_viewport_size(size)


def no_errors(page) -> None:
    errs = harness.errors_on_page(page)
    assert not errs, f"exception shown on the page: {errs}"


def timed_change(page, action, until_js: str, timeout_ms: int = 30_000) -> float:
    """Run `action`, wait until `until_js` is true and the app is idle; seconds taken."""
    t0 = time.perf_counter()
    action()
    page.wait_for_function(until_js, timeout=timeout_ms)
    harness.wait_idle(page, timeout_ms)
    return time.perf_counter() - t0


def set_number(page, label: str, value: int | str) -> None:
    inp = page.locator('[data-testid="stNumberInput"]').filter(has_text=label).locator("input").first
    inp.fill(str(value))
    inp.press("Enter")


# --------------------------------------------------------------------------- predict
def test_predict_first_paint_interactions_and_infeasible(server, page):
    t0 = time.perf_counter()
    page.goto(server.url + "/")
    page.locator('[data-testid="stMetric"]').filter(has_text="Step time").wait_for()
    first_metric = time.perf_counter() - t0
    harness.wait_idle(page, 120_000)
    TIMINGS["predict_first_paint_s (goto -> step time shown)"] = first_metric
    TIMINGS["predict_first_load_complete_s"] = time.perf_counter() - t0
    TIMINGS["predict_first_paint_since_server_start_s"] = first_metric + (t0 - server.started)
    no_errors(page)
    step = harness.metric_value(page, "Step time")
    assert STEP_RE.match(step), step
    assert page.get_by_text("Predict a training step").is_visible()
    for label in ("Tokens / s", "MFU", "Memory / GPU", "Time to 2T tokens", "Data behind it"):
        assert page.locator('[data-testid="stMetric"]').filter(has_text=label).count() == 1, label
    assert page.get_by_text("pipeline bubble").first.is_visible()  # the breakdown bar's legend
    shot(page, "predict")

    # a later interaction: PP 4 -> 8 (the caption and the URL follow; on the default ZeRO-0 layout TP 4 would not
    # fit, and the page would rightly say so instead of a step time)
    dt = timed_change(page, lambda: set_number(page, "PP", 8),
                      "() => document.body.innerText.includes('TP 8 × PP 8 × CP 1 × DP 8')")
    TIMINGS["predict_change_pp_s"] = dt
    page.wait_for_function("() => location.search.includes('pp=8')", timeout=10_000)
    step2 = harness.metric_value(page, "Step time")
    assert STEP_RE.match(step2), step2
    no_errors(page)

    # the pipeline timeline tab
    dt = timed_change(page, lambda: page.get_by_role("tab", name="Pipeline timeline").click(),
                      "() => document.body.innerText.includes('micro-batches (1f1b')")
    TIMINGS["predict_open_timeline_tab_s"] = dt
    assert page.locator('[data-testid="stVegaLiteChart"]').count() >= 1
    shot(page, "predict_timeline")

    # the operators tab
    dt = timed_change(page, lambda: page.get_by_role("tab", name="Operators").click(),
                      "() => document.body.innerText.includes('Operators shown')")
    TIMINGS["predict_open_operators_tab_s"] = dt
    no_errors(page)
    shot(page, "predict_operators")

    # an infeasible input: a warning naming the field and the fix, no traceback
    dt = timed_change(page, lambda: set_number(page, "GPUs", 500),
                      "() => document.body.innerText.includes('How to fix')")
    TIMINGS["predict_infeasible_warning_s"] = dt
    warn = page.locator('[data-testid="stAlert"]').filter(has_text="num_gpus")
    assert warn.count() >= 1
    assert "How to fix" in warn.first.inner_text()
    no_errors(page)
    shot(page, "predict_infeasible")


def test_predict_first_paint_new_visitor(server, browser):
    """A new visitor (fresh browser context, no cached scripts) once the server has served someone."""
    for i in range(2):
        ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
        p = ctx.new_page()
        t0 = time.perf_counter()
        p.goto(server.url + "/")
        p.locator('[data-testid="stMetric"]').filter(has_text="Step time").wait_for(timeout=60_000)
        TIMINGS[f"predict_first_paint_new_visitor_{i + 1}_s"] = time.perf_counter() - t0
        harness.wait_idle(p, 60_000)
        no_errors(p)
        ctx.close()


def test_predict_shareable_url(server, page):
    t0 = time.perf_counter()
    page.goto(server.url + "/?model=llama3-8b&num_gpus=16&tp=2&pp=2&global_batch=64&view=Memory")
    page.locator('[data-testid="stMetric"]').filter(has_text="Step time").wait_for()
    harness.wait_idle(page, 60_000)
    TIMINGS["predict_from_shared_url_s"] = time.perf_counter() - t0
    body = page.inner_text("body")
    assert "llama3-8b" in body and "16 GPUs = TP 2 × PP 2 × CP 1 × DP 4" in body
    no_errors(page)
    shot(page, "predict_shared_url_memory")


def test_predict_breakdown_downloads(server, browser):
    """The breakdown's CSV and JSON are written when clicked (deferred data): the files hold the
    categories shown, and their shares add up to the step time."""
    import io

    import pandas as pd
    ctx = browser.new_context(accept_downloads=True, viewport={"width": 1440, "height": 1000})
    page = ctx.new_page()
    try:
        page.goto(server.url + "/")
        page.locator('[data-testid="stMetric"]').filter(has_text="Step time").wait_for(timeout=60_000)
        harness.wait_idle(page, 60_000)
        got = {}
        for label in ("CSV", "JSON"):
            t0 = time.perf_counter()
            with page.expect_download(timeout=30_000) as dl:
                page.locator('[data-testid="stDownloadButton"]').filter(has_text=label).first.click()
            TIMINGS[f"predict_download_breakdown_{label.lower()}_s"] = time.perf_counter() - t0
            assert dl.value.suggested_filename == f"breakdown.{label.lower()}"
            got[label] = Path(dl.value.path()).read_text()
        csv = pd.read_csv(io.StringIO(got["CSV"]))
        assert {"compute", "tp_comm", "bubble"} <= set(csv["category_id"])
        assert csv["share"].sum() == pytest.approx(1.0, abs=1e-6)
        assert [r["category_id"] for r in json.loads(got["JSON"])] == list(csv["category_id"])
        no_errors(page)
    finally:
        ctx.close()


def test_predict_host_overhead_fitted_and_not_modelled(server, page):
    """The end-to-end terms give every GPU platform the framework's host overhead: a category of its own in
    the breakdown, on the sampled dgx-a100-80gb and the unsampled dgx-h100 alike (the 'not modelled' case,
    a models folder without the terms, is the AppTest's)."""
    q = "model=gpt3-1.3b&num_gpus=8&tp=2&pp=2&global_batch=16"
    t0 = time.perf_counter()
    page.goto(f"{server.url}/?{q}&platform=dgx-a100-80gb")
    page.locator('[data-testid="stMetric"]').filter(has_text="Step time").wait_for()
    harness.wait_idle(page, 60_000)
    TIMINGS["predict_other_platform_from_url_s"] = time.perf_counter() - t0
    no_errors(page)
    assert page.get_by_text("host / framework overhead").first.is_visible()
    assert "fitted on measured runs" in page.inner_text("body")
    shot(page, "predict_host_overhead")
    page.goto(f"{server.url}/?{q}&platform=dgx-h100")   # unsampled, yet the framework terms apply to it
    page.locator('[data-testid="stMetric"]').filter(has_text="Step time").wait_for()
    harness.wait_idle(page, 60_000)
    body = page.inner_text("body")
    assert "fitted on measured runs" in body and "not modelled on this platform" not in body
    no_errors(page)


# --------------------------------------------------------------------------- search
def test_search_ranks_and_opens_in_predict(server, page):
    t0 = time.perf_counter()
    page.goto(server.url + "/search")
    page.get_by_text("Search layouts").first.wait_for()
    harness.wait_idle(page, 120_000)
    TIMINGS["search_first_paint_s"] = time.perf_counter() - t0
    no_errors(page)
    body = page.inner_text("body")
    if "not installed in this build" in body:
        shot(page, "search_unavailable")
        pytest.skip("predictor.plan.search is not available in this build")
    assert page.locator('[data-testid="stMetric"]').filter(has_text="Best step time").count() == 1
    assert STEP_RE.match(harness.metric_value(page, "Best step time"))
    grid = page.locator('[data-testid="stDataFrame"]').first
    grid.wait_for()
    assert "layouts enumerated" in body
    shot(page, "search")

    # a filter: max PP
    # a click on the first row opens it in Predict
    box = grid.bounding_box()
    t1 = time.perf_counter()
    page.mouse.click(box["x"] + 14, box["y"] + 35 + 17)  # the row-selection marker of row 1
    page.get_by_text("Predict a training step").wait_for(timeout=30_000)
    page.locator('[data-testid="stMetric"]').filter(has_text="Step time").wait_for()
    harness.wait_idle(page, 60_000)
    TIMINGS["search_row_click_to_predict_s"] = time.perf_counter() - t1
    assert "tp=" in page.url or "pp=" in page.url
    no_errors(page)
    # this layout rests on several kinds of data with long names: the legend items must stay in their
    # column and off each other
    overlaps = page.evaluate("""() => {
        const bad = [];
        for (const box of document.querySelectorAll('[data-testid="stHtml"] div[style*="line-height"]')) {
            const outer = box.getBoundingClientRect();
            const items = Array.from(box.children).map(e => e.getBoundingClientRect());
            items.forEach((a, i) => {
                if (a.right > outer.right + 1) bad.push('item ' + i + ' leaves its column');
                items.slice(i + 1).forEach((b, j) => {
                    if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1)
                        bad.push('items ' + i + ' and ' + (i + 1 + j) + ' overlap');
                });
            });
        }
        return bad;
    }""")
    assert overlaps == [], overlaps
    shot(page, "search_opened_in_predict")


# --------------------------------------------------------------------------- compare
def test_compare_side_by_side(server, page):
    t0 = time.perf_counter()
    page.goto(server.url + "/compare")
    page.get_by_text("Side by side").wait_for()
    harness.wait_idle(page, 120_000)
    TIMINGS["compare_first_paint_s"] = time.perf_counter() - t0
    no_errors(page)
    table = page.locator('[data-testid="stTable"]').first
    text = table.inner_text()
    for s in ("Setup A", "Setup B", "Setup C", "step time", "tokens / s", "memory / GPU"):
        assert s in text, s
    # cells that differ from setup A are highlighted
    highlighted = table.evaluate("""t => Array.from(t.querySelectorAll('td')).filter(
        td => getComputedStyle(td).backgroundColor.startsWith('rgba(255, 193, 7')).length""")
    assert highlighted > 0, "no highlighted difference"
    assert "Fastest: Setup" in page.inner_text("body")
    shot(page, "compare")

    # four setups
    dt = timed_change(page, lambda: page.locator('[data-testid="stButtonGroup"]').get_by_text("4", exact=True).click(),
                      "() => document.body.innerText.includes('Setup D')")
    TIMINGS["compare_switch_to_4_setups_s"] = dt
    page.wait_for_function("() => location.search.includes('n=4')", timeout=10_000)
    assert "Setup D" in page.locator('[data-testid="stTable"]').first.inner_text()
    no_errors(page)
    shot(page, "compare_4")


# --------------------------------------------------------------------------- every page
@pytest.mark.parametrize("path,heading", [("accuracy", "Accuracy"), ("samples", "Samples"),
                                          ("calibrate", "Calibrate a platform")])
def test_other_pages_render(server, page, path, heading):
    t0 = time.perf_counter()
    page.goto(f"{server.url}/{path}")
    page.get_by_role("heading", name=heading).first.wait_for()
    harness.wait_idle(page, 180_000)
    TIMINGS[f"{path}_first_paint_s"] = time.perf_counter() - t0
    no_errors(page)
    if path == "accuracy" and "saved end-to-end validation" in page.inner_text("body"):
        # read from models_store/<platform>/validation_runs.csv, not predicted again on load
        assert page.locator('[data-testid="stMetric"]').filter(has_text="Runs predicted").count() == 1
    shot(page, path)
    if path == "accuracy":
        # the Network tab: the saved network calibration against the measured NCCL sweeps (B200: 1 vs 4 nodes)
        page.goto(f"{server.url}/accuracy?acc_view=Network")
        page.get_by_role("heading", name=heading).first.wait_for()
        harness.wait_idle(page, 180_000)
        no_errors(page)
        body = page.inner_text("body")
        if "not on this machine" not in body:  # the datasets folder is there: chart and table
            page.locator('[data-testid="stVegaLiteChart"]').first.wait_for()
            assert page.locator('[data-testid="stDataFrame"]').count() >= 1
        shot(page, "accuracy_network")
        if "not on this machine" not in body:  # B200: one node against four
            page.goto(f"{server.url}/accuracy?acc_view=Network&acc_net_platform=dgx-b200")
            page.locator('[data-testid="stVegaLiteChart"]').first.wait_for()
            harness.wait_idle(page, 60_000)
            no_errors(page)
            assert "aggregate NIC bandwidth" in page.inner_text("body")
            shot(page, "accuracy_network_b200")

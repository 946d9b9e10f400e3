"""The Calibrate page's own-runs flow in a real browser: upload a runs CSV, read each run before / after, save it as
a new platform, and find that platform in Predict's platform picker. The server gets a clusters file and a user
models dir of its own (tmp), so nothing of the repository's is written. Screenshots of each step under
out/browser/ (or $PLANNER_SCREENSHOTS): calibrate_runs_1_uploaded, _2_fitted, _3_saved, _4_predict.

Skips (with the reason) when the playwright package or a chromium binary is missing.
"""
from __future__ import annotations

import json
import re
import time

import pytest

from tests.browser import harness
from tests.browser.test_browser import SHOTS, STEP_RE, TIMINGS, no_errors, shot

REASON = harness.missing_requirements()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"browser tests skipped: {REASON}")

BASE = "dgx-a100-80gb"
NEW = "browser-a100"
SLOWER = 1.12   # the "measured" runs: BASE's prediction x this


def _runs_csv(path) -> None:
    import pandas as pd

    from predictor.model.layout_io import layout_from_fields, model_from_fields
    from predictor.plan.predict import Predictor
    from predictor.step.compose import ComposeOptions
    pr = Predictor(BASE, options=ComposeOptions(simulate=False))
    base = {"arch": "gpt", "layers": 12, "hidden": 2048, "heads": 16, "vocab": 50304, "seq_len": 2048,
            "num_gpus": 8, "tp": 1, "pp": 1, "micro_batch": 2, "global_batch": 64, "precision": "bf16"}
    rows = []
    for i, kw in enumerate(({}, {"tp": 2, "micro_batch": 4}, {"micro_batch": 1})):
        r = {"case_id": f"run{i}", **base, **kw}
        t = pr.predict(model_from_fields(r), layout_from_fields(r), timeline=False).step_time_s
        rows.append({**r, "step_time_s": round(t * SLOWER, 4)})
    pd.DataFrame(rows).to_csv(path, index=False)


@pytest.fixture(scope="module")
def calib_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("own_runs_user")
    env = {"PREDICTOR_CLUSTERS": str(d / "clusters.json"), "PREDICTOR_USER_MODELS_DIR": str(d / "user_models")}
    SHOTS.mkdir(parents=True, exist_ok=True)
    with harness.streamlit_server(env=env, log_dir=SHOTS) as srv:
        yield srv, d


@pytest.fixture(scope="module")
def chromium():
    with harness.browser() as b:
        yield b


def _percent(text: str, before: str) -> float:
    m = re.search(re.escape(before) + r"\s*\**\s*(-?[\d.]+)%", text)
    assert m, f"no '{before} N%' in: {text[:600]}"
    return float(m.group(1)) / 100.0


def test_upload_fit_save_and_predict_on_the_new_platform(calib_server, chromium, tmp_path):
    srv, user = calib_server
    csv = tmp_path / "my_runs.csv"
    _runs_csv(csv)
    ctx = chromium.new_context(viewport={"width": 1440, "height": 1000})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    try:
        t0 = time.perf_counter()
        page.goto(f"{srv.url}/calibrate")
        page.get_by_role("heading", name="Calibrate a platform").first.wait_for()
        harness.wait_idle(page, 120_000)
        page.get_by_text("Calibrate on your own runs").first.click()
        uploader = page.locator('[data-testid="stFileUploader"]').filter(has_text="Measured runs")
        uploader.locator('input[type="file"]').set_input_files(str(csv))
        page.get_by_role("button", name="Fit on these runs").wait_for()
        harness.wait_idle(page, 60_000)
        no_errors(page)
        assert "my_runs.csv" in uploader.inner_text()
        shot(page, "calibrate_runs_1_uploaded")

        # fit: nothing saved; the before / after table, the terms, the held-out error
        t1 = time.perf_counter()
        page.get_by_role("button", name="Fit on these runs").click()
        page.get_by_text("MAPE before").wait_for(timeout=180_000)
        harness.wait_idle(page, 60_000)
        TIMINGS["calibrate_runs_fit_s (3 runs, leave-one-run-out)"] = time.perf_counter() - t1
        no_errors(page)
        summary = page.get_by_text("MAPE before").first.inner_text()
        before, after = _percent(summary, "MAPE before"), _percent(summary, "after")
        held = _percent(summary, "held out")
        assert before == pytest.approx(1 - 1 / SLOWER, abs=0.01)   # BASE is 12 % fast on these runs
        assert after < before / 3 and held < before
        assert page.locator('[data-testid="stDataFrame"]').count() >= 2   # the runs and the terms
        assert not (user / "clusters.json").exists()
        shot(page, "calibrate_runs_2_fitted")

        # save as a new platform
        name = page.locator('[data-testid="stTextInput"]').filter(has_text="Save as").locator("input")
        name.fill(NEW)
        name.press("Enter")
        page.get_by_role("button", name=f"Save as {NEW}").wait_for()
        harness.wait_idle(page, 60_000)
        page.get_by_role("button", name=f"Save as {NEW}").click()
        page.get_by_text(f"Saved {NEW}").wait_for(timeout=120_000)
        harness.wait_idle(page, 60_000)
        no_errors(page)
        assert json.loads((user / "clusters.json").read_text())[NEW]["calibrated_from"] == BASE
        assert (user / "user_models" / NEW / "own_runs_terms.json").is_file()
        shot(page, "calibrate_runs_3_saved")

        # Predict on it: the link opens Predict with the new platform picked, which the picker lists
        page.get_by_role("link", name=f"Predict on {NEW}").click()
        page.get_by_text("Predict a training step").wait_for()
        page.locator('[data-testid="stMetric"]').filter(has_text="Step time").wait_for()
        harness.wait_idle(page, 120_000)
        no_errors(page)
        assert f"platform={NEW}" in page.url
        picker = page.locator('[data-testid="stSelectbox"]').filter(has_text="Platform").first
        assert picker.locator("input").input_value() == NEW
        assert STEP_RE.match(harness.metric_value(page, "Step time"))
        assert "calibrated on 3 of your runs" in page.inner_text("body")
        TIMINGS["calibrate_runs_flow_total_s"] = time.perf_counter() - t0
        shot(page, "calibrate_runs_4_predict")
        picker.get_by_role("button", name="Open").click()
        options = page.locator('[role="option"]')
        options.first.wait_for()
        assert NEW in [o.inner_text().strip() for o in options.all()]
        assert BASE in [o.inner_text().strip() for o in options.all()]
        page.screenshot(path=str(SHOTS / "calibrate_runs_5_picker.png"))
        page.keyboard.press("Escape")
    finally:
        ctx.close()

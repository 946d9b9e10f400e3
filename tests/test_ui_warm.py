"""The dashboard's start-up warm-up and its cheap models-folder stamp."""
from __future__ import annotations

import asyncio
import threading
import time

from predictor_ui import config, warm


def test_models_version_sees_a_rewrite_after_forget(tmp_path, monkeypatch):
    monkeypatch.setenv(config.ENV_MODELS, str(tmp_path))
    (tmp_path / "p").mkdir()
    f = tmp_path / "p" / "op.fwd.txt"
    f.write_text("a")
    v1 = config.models_version()
    f.write_text("a longer model")
    assert config.models_version() == v1  # remembered for VERSION_TTL_S: one stat pass per run
    config.forget_versions()
    v2 = config.models_version()
    assert v2 != v1
    (tmp_path / "p" / "op.bwd.txt").write_text("b")
    time.sleep(config.VERSION_TTL_S + 0.05)
    assert config.models_version() != v2  # and by itself once the second is over


def test_warm_up_is_bounded_and_never_raises(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(warm, "warm_up", lambda: release.wait(5))

    async def start_up() -> float:
        t0 = time.perf_counter()
        await warm.warm_up_before_serving(timeout_s=0.2)  # a hung warm-up: serve anyway
        waited = time.perf_counter() - t0
        release.set()  # let the worker thread end, so asyncio.run can shut its executor down
        return waited

    assert asyncio.run(start_up()) < 2.0


def test_warm_up_survives_a_failing_step(monkeypatch):
    calls = []
    monkeypatch.setattr(warm, "_DONE", threading.Event())
    monkeypatch.setattr(warm, "_settle_streamlit_first_run", lambda: calls.append("settle"))
    monkeypatch.setattr(warm, "_default_prediction", lambda: (_ for _ in ()).throw(RuntimeError("no models")))
    monkeypatch.setattr(warm, "_import_charts", lambda: calls.append("charts"))
    warm.warm_up()
    assert calls == ["settle", "charts"]  # the failing prediction did not stop the chart import
    warm.warm_up()
    assert calls == ["settle", "charts"]  # once per process

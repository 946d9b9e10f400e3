"""Start the dashboard headless on loopback and drive it with Playwright + Debian's chromium.

Used by tests/browser/test_browser.py (part of the README's `pytest -q`). The runner alone, for
screenshots (out/browser/*.png, or $PLANNER_SCREENSHOTS) and the timings table:

    .venv/bin/python -m tests.browser.harness

No browser download: Playwright drives /usr/bin/chromium (Debian package `chromium`, installed by
scripts/setup.sh when run as root; $CHROMIUM points elsewhere).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
DEFAULT_OUT = ROOT / "out" / "browser"


def chromium_path() -> str | None:
    for cand in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")):
        if cand and Path(cand).exists():
            return cand
    return None


def missing_requirements() -> str | None:
    """Why browser tests cannot run here, or None."""
    try:
        import playwright.sync_api as _  # noqa: F401
    except ImportError:
        return "the playwright Python package is not installed (pip install -r requirements.txt)"
    if chromium_path() is None:
        return "no chromium binary (apt-get install chromium, as scripts/setup.sh does when run as root)"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, started: float, healthy: float, log: Path):
        self.proc, self.port, self.started, self.healthy, self.log = proc, port, started, healthy, log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def startup_s(self) -> float:
        return self.healthy - self.started


@contextmanager
def streamlit_server(env: dict[str, str] | None = None, timeout_s: float = 60.0,
                     log_dir: Path | None = None) -> Iterator[Server]:
    """`streamlit run app.py` headless on 127.0.0.1:<free port>; yields once /_stcore/health answers."""
    port = free_port()
    log_dir = Path(log_dir or DEFAULT_OUT)
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "streamlit.log"
    cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.headless", "true",
           "--server.address", "127.0.0.1", "--server.port", str(port), "--browser.gatherUsageStats", "false"]
    # the file watcher is off by the project's .streamlit/config.toml (tested), not by a flag here
    started = time.perf_counter()
    fh = open(log, "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        deadline = started + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.perf_counter() > deadline:
                raise RuntimeError(f"streamlit did not answer /_stcore/health in {timeout_s} s")
            time.sleep(0.1)
        yield Server(proc, port, started, time.perf_counter(), log)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        fh.close()


@contextmanager
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


# --------------------------------------------------------------------------- page helpers
def wait_idle(page, timeout_ms: int = 30000) -> None:
    """Until the script run has finished and everything is drawn: no 'Running...' status widget, no
    stale elements, no skeletons (element code still loading)."""
    page.wait_for_function(
        """() => {
            const app = document.querySelector('[data-testid="stApp"]');
            if (!app) return false;
            const running = document.querySelector('[data-testid="stStatusWidget"]');
            const stale = document.querySelector('[data-stale="true"]');
            const skeleton = document.querySelector('[data-testid="stSkeleton"]');
            return !running && !stale && !skeleton && app.getAttribute('data-test-script-state') !== 'running';
        }""", timeout=timeout_ms)


def errors_on_page(page) -> list[str]:
    return [e.inner_text()[:500] for e in page.query_selector_all('[data-testid="stException"]')]


def metric_value(page, label: str) -> str:
    loc = page.locator('[data-testid="stMetric"]').filter(has_text=label).locator('[data-testid="stMetricValue"]')
    return loc.first.inner_text()


if __name__ == "__main__":  # the runner: the browser tests with their timings and screenshots
    import pytest
    raise SystemExit(pytest.main(["-q", str(Path(__file__).resolve().parent)]))

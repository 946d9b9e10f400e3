"""Print the browser timings (first paint, interactions) at the end of every pytest run that ran them."""
from __future__ import annotations


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    from tests.browser import test_browser
    t = getattr(test_browser, "TIMINGS", None)
    if not t:
        return
    terminalreporter.section("dashboard in chromium: timings (s)")
    for k, v in t.items():
        terminalreporter.write_line(f"{k:<52} {v:6.2f}")
    terminalreporter.write_line(f"screenshots: {test_browser.SHOTS}")

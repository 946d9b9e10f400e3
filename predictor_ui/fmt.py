"""Human formatting for the dashboard (plain functions, no streamlit). Missing values read "–" (an en dash:
a plain "-" turns into a list bullet in Markdown tables)."""
from __future__ import annotations

import math


def seconds(s: float | None) -> str:
    """0.0123 -> '12.3 ms', 16.9 -> '16.9 s'."""
    if s is None or (isinstance(s, float) and not math.isfinite(s)):
        return "–"
    a = abs(s)
    if a == 0:
        return "0 s"
    if a < 1e-3:
        return f"{s * 1e6:.3g} µs"
    if a < 1:
        return f"{s * 1e3:.3g} ms"
    if a < 120:
        return f"{s:.3g} s"
    return duration(s)


def duration(s: float | None) -> str:
    """Long spans: '3.2 h', '12.5 days'."""
    if s is None or not math.isfinite(s):
        return "–"
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{s / 60:.3g} min"
    if s < 2 * 86400:
        return f"{s / 3600:.3g} h"
    d = s / 86400
    if d >= 730:
        return f"{d / 365.25:.3g} years"
    return f"{d:.3g} days" if d < 100 else f"{d:,.0f} days"


def count(n: float | None, unit: str = "") -> str:
    """1.23e6 -> '1.23 M'."""
    if n is None or not math.isfinite(n):
        return "–"
    a = abs(n)
    for div, suf in ((1e12, " T"), (1e9, " B"), (1e6, " M"), (1e3, " k")):
        if a >= div:
            return f"{n / div:.3g}{suf}{unit}"
    return f"{n:.3g}{(' ' + unit) if unit else ''}"


def money(x: float | None, currency: str = "$") -> str:
    if x is None or not math.isfinite(x):
        return "–"
    if abs(x) >= 1e6:
        return f"{currency}{x / 1e6:.3g} M"
    if abs(x) >= 1e3:
        return f"{currency}{x / 1e3:.3g} k"
    return f"{currency}{x:,.0f}"


def pct(x: float | None, digits: int = 0) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{100 * x:.{digits}f}%"


def gib(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:.3g} GiB"

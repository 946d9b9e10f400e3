"""The address bar's query parameters, checked before the widget bound to each is built.

Every input widget is bound to the URL (`bind="query-params"`), so a shared or hand-edited link seeds it. Streamlit
turns a value it cannot use into the widget's default without a word (`tp=-1`, `tp=2.5`, `seq_len=4097`,
`platform=nope`), and a number input raises on an overflowing one (`tp=inf`, `num_gpus=1e309`: its deserialiser
calls `int()` before its finiteness check), which stops the page half-drawn. So a page builds its bound widgets
through `guard(container)`: a wrapper that, before each bound widget is created, checks the parameter against the
very arguments the widget gets (its bounds, whole-number-ness, options), drops one it cannot take from the URL and
names it at the top of the page, with the value the widget shows instead. Parameters no input of the page read
(a typo, a custom-model field with a preset model) are named too, by `finish()` at the end of a run that
reaches its end (app.py calls it; after an st.stop() Streamlit takes no more output).

`start()` (from views.page_setup, the first call of every page) places the notes' container at the top of the page.
"""
from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import streamlit as st

BIND = "query-params"
_RUN = threading.local()   # one script run per thread: this run's notes, the keys its inputs read, the notes' box

_SINGLE_CHOICE = {"selectbox", "radio", "segmented_control", "pills", "select_slider"}
_CHECKED = _SINGLE_CHOICE | {"number_input", "toggle", "checkbox", "multiselect", "tabs", "text_input"}
_LAYOUT = {"columns", "expander", "container", "popover", "empty", "sidebar", "form"}


def start() -> None:
    """A new page run: no notes yet; their box goes here (the top of the page)."""
    _RUN.notes = []
    _RUN.seen = set()
    _RUN.box = st.container()


def notes() -> list[str]:
    """This run's notes so far (one per parameter changed or dropped)."""
    return list(getattr(_RUN, "notes", []))


def _shown(v: str, limit: int = 40) -> str:
    """A URL value as the note quotes it: short, and without the characters that would end a code span."""
    v = v.replace("`", "'").replace("\n", " ")
    return v if len(v) <= limit else f"{v[:limit]}… ({len(v):,} characters)"


def _note(text: str) -> None:
    if not hasattr(_RUN, "notes"):
        start()
    _RUN.notes.append(text)
    box = getattr(_RUN, "box", None)
    (box if box is not None else st).warning(text, icon=":material/link_off:")


def _drop(key: str) -> None:
    """Remove `key` from the URL before its widget reads it (the address bar is updated too)."""
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx
    ctx = get_script_run_ctx()
    if ctx is None:
        return
    with ctx.session_state.query_params() as qp:
        qp.remove_param(key)
        # widgets seed from the run's initial snapshot of the URL: take the dropped value out of it too
        qp.set_initial_query_params_from_current()


def _fmt_number(v: Any) -> str:
    return "empty" if v is None else f"{v:,}" if isinstance(v, int) else f"{v:g}"


def number_problem(text: str, lo: Any, hi: Any, whole: bool, clearable: bool) -> str | None:
    """Why `text` cannot be this number input's value (None if it can)."""
    if text == "":
        return None if clearable else "is empty"
    try:
        v = float(text)
    except ValueError:
        return "is not a number"
    if not math.isfinite(v):
        return "is not a finite number"
    if whole and not v.is_integer():
        return "is not a whole number"
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        return f"is outside {_fmt_number(lo)} … {_fmt_number(hi)}"
    return None


def _labels(options: Sequence[Any], format_func: Callable[[Any], str] | None) -> list[str]:
    out = [str(o) for o in options]
    if format_func is not None:
        out += [str(format_func(o)) for o in options]
    return out


def _check(kind: str, b: dict[str, Any], values: list[str]) -> tuple[str, str] | None:
    """(why, what the widget shows instead) when the URL's `values` cannot be this widget's; else None."""
    last = values[-1] if values else ""
    if kind == "number_input":
        lo, hi, value, step = (b.get(k) for k in ("min_value", "max_value", "value", "step"))
        nums = [x for x in (lo, hi, value, step) if isinstance(x, (int, float)) and not isinstance(x, bool)]
        whole = all(isinstance(x, int) for x in nums)
        default = lo if value == "min" else value
        why = number_problem(last, lo, hi, whole, value is None)
        return (why, f"the default {_fmt_number(default)}") if why else None
    if kind in ("toggle", "checkbox"):
        if last.lower() in ("true", "false"):
            return None
        return "is not true or false", f"the default {'on' if b.get('value') else 'off'}"
    if kind == "tabs":
        labels = list(b.get("tabs") or [])
        default = b.get("default") or (labels[0] if labels else "")
        return None if last in labels else ("is not one of the tabs", f"the default tab {default!r}")
    if kind == "text_input":
        return None
    options = list(b.get("options") or [])
    labels = _labels(options, b.get("format_func"))
    if kind == "multiselect":
        bad = [v for v in values if v and v not in labels]
        if not bad:
            return None
        return (f"has {', '.join(repr(_shown(v)) for v in bad)}, not among the choices "
                f"({', '.join(map(str, options[:12]))}{', …' if len(options) > 12 else ''})", "the default choices")
    if last == "" and (b.get("index", 0) is None or kind in ("segmented_control", "pills")):
        return None
    if last in labels:
        return None
    if kind == "selectbox" or kind == "radio":
        i = b.get("index", 0)
        default = options[i] if options and isinstance(i, int) and 0 <= i < len(options) else None
    elif kind == "select_slider":
        default = b.get("value", options[0] if options else None)
    else:
        default = b.get("default")
    shown = ", ".join(map(str, options[:12])) + (", …" if len(options) > 12 else "")
    return f"is not one of {shown}", ("no choice" if default is None else f"the default {default}")


def _checked(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    try:
        sig: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None

    def call(*args: Any, **kwargs: Any) -> Any:
        key = kwargs.get("key")
        if kwargs.get("bind") == BIND and key is not None and sig is not None:
            key = str(key)
            if not hasattr(_RUN, "seen"):
                start()
            _RUN.seen.add(key)
            values = st.query_params.get_all(key)
            if values:
                b = sig.bind_partial(*args, **kwargs).arguments
                bad = _check(kind, b, values)
                if bad is not None:
                    why, instead = bad
                    _drop(key)
                    label = "which tab is open" if kind == "tabs" else (b.get("label") or key)
                    shown = "&".join(f"{key}={_shown(v)}" for v in values[-3:])
                    _note(f"Link parameter `{shown}` ({label}) {why}: dropped, {instead} is used. "
                          f"Fix the link, or set {label} on the page.")
        out = fn(*args, **kwargs)
        return [Guarded(x) for x in out] if kind == "tabs" else out

    return call


class Guarded:
    """A Streamlit container (st, st.sidebar, a column, an expander, ...) whose bound input widgets check their
    URL parameter first (see the module doc); layout calls return guarded containers; anything else is the
    container's own."""

    def __init__(self, container: Any):
        object.__setattr__(self, "_c", container)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._c, name)
        if name in _CHECKED:
            return _checked(name, attr)
        if name == "columns":
            return lambda *a, **k: [Guarded(x) for x in attr(*a, **k)]
        if name in _LAYOUT:
            return Guarded(attr) if name == "sidebar" else (lambda *a, **k: Guarded(attr(*a, **k)))
        return attr

    def __enter__(self) -> Guarded:
        self._c.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._c.__exit__(*exc)


def guard(container: Any = None) -> Any:
    """`container` (default: the page) with its bound widgets' URL parameters checked; idempotent."""
    c = st if container is None else container
    return c if isinstance(c, Guarded) else Guarded(c)


def finish() -> None:
    """End of a page run: name the URL parameters no input of this page read (ignored, so a mistyped or
    leftover parameter does not pass for part of the plan). Parameters bound to a widget are never named."""
    seen = getattr(_RUN, "seen", None)
    if seen is None:
        return
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx
    ctx = get_script_run_ctx()
    if ctx is None:
        return
    with ctx.session_state.query_params() as qp:
        unread = [k for k in qp if k not in seen and not qp.is_bound(k)]
    if unread:
        shown = ", ".join(f"`{_shown(k)}`" for k in unread)
        _note(f"Link parameter{'s' if len(unread) > 1 else ''} {shown}: not an input of this page with these "
              "settings (a typo, another page's, or a custom-model / custom-cluster field while a preset is "
              "chosen): ignored.")
    _RUN.seen = None

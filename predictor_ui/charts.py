"""Chart builders: plain functions from DataFrames / dicts to Altair charts.

No streamlit here, so tests check the chart specs (`chart.to_dict()`) without a browser. Altair is
imported on the first chart built (the HTML helpers need none).
Colours are fixed per category / provenance so every page reads the same way.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from predictor.step.memory import GIB, MEMORY_PART_LABELS, MEMORY_PARTS, MemoryReport, StageMemory, stage_parts_bytes
from predictor.step.terms import TERMS_PROVENANCE


class _LazyAltair:
    """`alt` imports altair on first use (about 0.3 s on a cold start): the Predict page's first view
    draws plain HTML bars and tables only, so a first visit does not pay for the chart library."""

    def __getattr__(self, name: str) -> Any:
        import altair
        globals()["alt"] = altair
        return getattr(altair, name)


alt: Any = _LazyAltair()

CATEGORY_ORDER = ["compute", "host_overhead", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble",
                  "optimizer", "offload_comm"]
CATEGORY_LABELS = {"compute": "compute", "host_overhead": "host / framework overhead", "tp_comm": "TP communication",
                   "cp_comm": "CP communication (exposed ring)", "ep_comm": "EP all-to-all (MoE dispatch / combine)",
                   "pp_comm": "PP communication",
                   "dp_comm": "DP communication", "bubble": "pipeline bubble",
                   "optimizer": "optimizer step", "offload_comm": "activation offload (exposed host-link copies)"}
CATEGORY_COLORS = {"compute": "#4c78a8", "host_overhead": "#9ecae9", "tp_comm": "#f58518", "cp_comm": "#ff9da6",
                   "ep_comm": "#eeca3b", "pp_comm": "#e45756",
                   "dp_comm": "#72b7b2", "bubble": "#bab0ac", "optimizer": "#54a24b", "offload_comm": "#9d755d"}
PROVENANCE_COLORS = {"measured": "#2e7d32", "derived": "#66bb6a", "host overhead (fitted on measured runs)": "#6a1b9a",
                     "transferred": "#1e88e5", "stand-in": "#f9a825", "analytical (calibrated)": "#8d6e63",
                     "analytical": "#9e9e9e", "none": "#e0e0e0",
                     "framework host overhead (end-to-end terms)": "#ab47bc",
                     TERMS_PROVENANCE: "#ce93d8"}
PHASE_COLORS = {"fwd": "#4c78a8", "bwd": "#f58518", "recompute": "#b279a2", "step": "#54a24b"}
KIND_COLORS = {"forward": "#4c78a8", "backward": "#f58518", "busy": "#7f7f7f", "idle (bubble)": "#eeeeee",
               # --- zero-bubble schedules: the weight-gradient pass W, split off the backward (docs/schedules.md) ---
               "weight": "#54a24b"}
MEMORY_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"]


HOST_NOT_MODELLED = "not modelled on this platform"


def provenance_color(label: str) -> str:
    """The colour of a provenance label; labels with detail ("transferred from vista-gh200 ...") take
    the colour of their kind."""
    if label in PROVENANCE_COLORS:
        return PROVENANCE_COLORS[label]
    for k in sorted(PROVENANCE_COLORS, key=len, reverse=True):
        if label.startswith(k):
            return PROVENANCE_COLORS[k]
    return "#bdbdbd"


def _prov_order(label: str) -> int:
    order = list(PROVENANCE_COLORS)
    if label in order:
        return order.index(label)
    for i, k in enumerate(order):
        if label.startswith(k):
            return i
    return 99


def visible_breakdown(breakdown: dict[str, float], host_modelled: bool = True) -> dict[str, float]:
    """The breakdown to draw: without `host_overhead` where the platform has no fitted host overhead
    (its 0 there means "not modelled", not "measured zero")."""
    if host_modelled:
        return dict(breakdown)
    return {k: v for k, v in breakdown.items() if k != "host_overhead"}


def breakdown_table(breakdown: dict[str, float], step_time_s: float, host_modelled: bool = True,
                    cp: int | None = None, ep: int | None = None, offload: int | None = None) -> pd.DataFrame:
    """One row per category (category_id, category, seconds, share, note) in the fixed order; the host
    overhead's seconds are empty (NaN, null in JSON) with a note where it is not modelled. With `cp` = 1 (a
    layout without context parallelism) the CP row is left out: there is no ring, not a measured zero; likewise the
    EP all-to-all row with `ep` = 1."""
    rows = []
    for k in sorted(breakdown, key=lambda c: CATEGORY_ORDER.index(c) if c in CATEGORY_ORDER else 99):
        if (k == "cp_comm" and cp == 1) or (k == "ep_comm" and ep == 1):
            continue
        if k == "offload_comm" and offload == 0:   # no activation offloading: no host-link copies (not a zero)
            continue
        v = breakdown[k]
        note = ""
        if k == "host_overhead":
            if not host_modelled:
                v, note = math.nan, HOST_NOT_MODELLED
            else:
                note = "fitted on measured runs" + ("; hidden under GPU time here" if not v else "")
        v = float(v) if v is not None else math.nan
        rows.append({"category_id": k, "category": CATEGORY_LABELS.get(k, k), "seconds": v,
                     "share": v / step_time_s if step_time_s and v == v else math.nan, "note": note})
    return pd.DataFrame(rows, columns=["category_id", "category", "seconds", "share", "note"])


def _scale(mapping: dict[str, str], present: Iterable[str]) -> alt.Scale:
    present = list(dict.fromkeys(present))
    domain = [k for k in mapping if k in present] + [k for k in present if k not in mapping]
    palette = list(mapping.values())
    rng = [mapping.get(k, palette[i % len(palette)]) for i, k in enumerate(domain)]
    return alt.Scale(domain=domain, range=rng)


# --------------------------------------------------------------------------- breakdown
def breakdown_frame(breakdowns: dict[str, dict[str, float]]) -> pd.DataFrame:
    """{setup: {category: seconds}} -> long frame (setup, category, label, seconds, share, order)."""
    rows = []
    for setup, bd in breakdowns.items():
        total = sum(float(v) for v in bd.values()) or 1.0
        for cat, v in bd.items():
            rows.append({"setup": setup, "category": cat, "label": CATEGORY_LABELS.get(cat, cat),
                         "seconds": float(v), "share": float(v) / total,
                         "order": CATEGORY_ORDER.index(cat) if cat in CATEGORY_ORDER else 99})
    return pd.DataFrame(rows, columns=["setup", "category", "label", "seconds", "share", "order"])


def breakdown_chart(breakdowns: dict[str, dict[str, float]], height: int | None = None) -> alt.Chart:
    """Stacked horizontal bar per setup: where the step time goes (sums to the step time).
    `height`: pixels per bar (Streamlit squeezes a fixed total height, so bands use alt.Step)."""
    df = breakdown_frame(breakdowns)
    labels = {CATEGORY_LABELS.get(k, k): v for k, v in CATEGORY_COLORS.items()}
    return alt.Chart(df, height=alt.Step(height or 34)).mark_bar().encode(
        x=alt.X("sum(seconds):Q", title="seconds per step", stack="zero"),
        y=alt.Y("setup:N", title=None, sort=list(breakdowns)),
        color=alt.Color("label:N", title="category", scale=_scale(labels, df["label"]),
                        # labels are up to ~40 characters ("EP all-to-all (MoE dispatch / combine)"): never cut
                        legend=alt.Legend(orient="bottom", columns=3, labelLimit=400)),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("setup:N"), alt.Tooltip("label:N", title="category"),
                 alt.Tooltip("seconds:Q", format=".4g"), alt.Tooltip("share:Q", format=".1%")],
    )


# --------------------------------------------------------------------------- HTML bars
def html_stacked_bar(parts: list[tuple[str, float, str]], unit: str = "s", fmt_value=None,
                     height_px: int = 22) -> str:
    """A 100 % stacked bar as plain HTML (no chart library: it paints with the page). `parts` are
    (label, value, colour); hovering a segment names it; a legend with values and shares follows."""
    total = sum(max(0.0, float(v)) for _, v, _ in parts) or 1.0
    show = fmt_value or (lambda v: f"{v:.3g} {unit}".strip())
    segs, legend = [], []
    for label, v, color in parts:
        v = max(0.0, float(v))
        share = v / total
        if share <= 0:
            continue
        tip = f"{label}: {show(v)} ({share:.1%})"
        segs.append(f'<div title="{tip}" style="width:{100 * share:.3f}%;background:{color};height:100%"></div>')
        # an item wraps inside itself when it is wider than the column, never over its neighbours
        legend.append(f'<span style="display:inline-block;max-width:100%;margin-right:14px;vertical-align:top">'
                      f'<span style="display:inline-block;width:10px;height:10px;background:{color};'
                      f'margin-right:5px;border-radius:2px"></span>'
                      f'{label} <b>{share:.0%}</b> <span style="opacity:.65">{show(v)}</span></span>')
    return (f'<div style="display:flex;width:100%;height:{height_px}px;border-radius:4px;overflow:hidden;'
            f'background:#f0f2f6">{"".join(segs)}</div>'
            f'<div style="font-size:0.82rem;line-height:1.9;margin-top:4px">{"".join(legend)}</div>')


def html_table(df: pd.DataFrame, formats: dict[str, Any] | None = None, na: str = "–") -> str:
    """A small table as plain HTML: it paints with the page, without the Arrow / table code that
    st.table loads in the browser (about 1 MB of JavaScript on a first visit). `formats`: column ->
    format string or callable; missing values read `na`."""
    import html as _h
    formats = formats or {}

    def cell(c: str, v: Any) -> str:
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return na
        f = formats.get(c)
        if f is None:
            return _h.escape(str(v))
        return _h.escape(f(v) if callable(f) else format(v, f))

    num = {c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])}
    th = "".join(f'<th style="text-align:{"right" if c in num else "left"};padding:4px 10px;'
                 f'border-bottom:1px solid #d5d7de;font-weight:600">{_h.escape(str(c))}</th>' for c in df.columns)
    rows = "".join("<tr>" + "".join(f'<td style="text-align:{"right" if c in num else "left"};padding:3px 10px;'
                                    f'border-bottom:1px solid #eef0f4">{cell(c, v)}</td>'
                                    for c, v in zip(df.columns, r)) + "</tr>"
                   for r in df.itertuples(index=False, name=None))
    return (f'<table style="border-collapse:collapse;font-size:0.9rem;margin:4px 0 8px 0">'
            f"<thead><tr>{th}</tr></thead><tbody>{rows}</tbody></table>")


def breakdown_html(breakdown: dict[str, float]) -> str:
    parts = [(CATEGORY_LABELS.get(k, k), v, CATEGORY_COLORS.get(k, "#999")) for k, v in
             sorted(breakdown.items(), key=lambda kv: CATEGORY_ORDER.index(kv[0]) if kv[0] in CATEGORY_ORDER else 99)]
    return html_stacked_bar(parts, "s", fmt_value=_fmt_seconds)


def provenance_html(share: dict[str, float]) -> str:
    items = sorted(share.items(), key=lambda kv: _prov_order(kv[0]))
    return html_stacked_bar([(k, v, provenance_color(k)) for k, v in items], "", fmt_value=lambda v: "")


def _fmt_seconds(v: float) -> str:
    from .fmt import seconds
    return seconds(v)


# --------------------------------------------------------------------------- operators
def ops_frame(ops: pd.DataFrame, stage: int | None = None, top: int = 15, per: str = "micro-batch") -> pd.DataFrame:
    """Seconds per operator and phase on one stage (all chunks), ranked by total: the calls of every micro-batch
    (`per` 'micro-batch') or those made once per step (`per` 'step': data-parallel traffic, optimizer)."""
    df = ops if stage is None else ops[ops["stage"] == stage]
    if "per" in df:
        df = df[df["per"] == per]
    df = df[df["seconds_total"] > 0]
    g = (df.groupby(["op", "phase"], as_index=False)
         .agg(seconds=("seconds_total", "sum"), calls=("count", "sum"),
              provenance=("provenance", lambda s: ", ".join(sorted(set(map(str, s))))),
              category=("category", "first")))
    if g.empty:
        return g.assign(total=[], rank=[])
    tot = g.groupby("op")["seconds"].sum().sort_values(ascending=False)
    keep = list(tot.index[:top])
    g = g[g["op"].isin(keep)].copy()
    g["total"] = g["op"].map(tot)
    g["rank"] = g["op"].map({op: i for i, op in enumerate(keep)})
    return g.sort_values(["rank", "phase"]).reset_index(drop=True)


def ops_chart(ops: pd.DataFrame, stage: int | None = None, top: int = 15, per: str = "micro-batch") -> alt.Chart:
    """Ranked horizontal bars: the operators that cost most, split into forward / backward / recompute."""
    df = ops_frame(ops, stage, top, per)
    order = list(dict.fromkeys(df["op"])) if len(df) else []
    return alt.Chart(df, height=alt.Step(22)).mark_bar().encode(
        x=alt.X("sum(seconds):Q", title=f"seconds per {'step' if per == 'step' else 'micro-batch'} on this stage"),
        y=alt.Y("op:N", sort=order, title=None),
        color=alt.Color("phase:N", scale=_scale(PHASE_COLORS, df["phase"] if len(df) else []),
                        legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("op:N"), alt.Tooltip("phase:N"), alt.Tooltip("seconds:Q", format=".4g"),
                 alt.Tooltip("calls:Q", format=".0f"), alt.Tooltip("provenance:N")],
    )


# --------------------------------------------------------------------------- pipeline timeline
def timeline_frame(timeline: list[dict[str, Any]], max_items: int = 3000) -> tuple[pd.DataFrame, bool]:
    """Bars (forward / backward per micro-batch, plus idle gaps = bubbles) per pipeline stage.

    With more than `max_items` bars, adjacent work on a stage merges into 'busy' spans (the bubbles
    stay exact); returns (frame, merged).
    """
    cols = ["stage", "row", "kind", "micro_batch", "chunk", "start_s", "end_s", "seconds"]
    if not timeline:
        return pd.DataFrame(columns=cols), False
    df = pd.DataFrame(timeline)
    if "chunk" not in df:
        df["chunk"] = 0
    df = df.sort_values(["stage", "start_s"]).reset_index(drop=True)
    end = float(df["end_s"].max())
    merged = len(df) > max_items
    out = []
    eps = 1e-9 * max(end, 1e-12)
    for stage, g in df.groupby("stage", sort=True):
        cursor = 0.0
        span_start = None
        span_end = None
        for r in g.itertuples(index=False):
            if r.start_s > cursor + eps:
                if merged and span_start is not None:
                    out.append((stage, "busy", -1, -1, span_start, span_end))
                    span_start = None
                out.append((stage, "idle (bubble)", -1, -1, cursor, float(r.start_s)))
            if merged:
                span_start = float(r.start_s) if span_start is None else span_start
                span_end = float(r.end_s)
            else:
                out.append((stage, r.kind, int(r.micro_batch), int(r.chunk), float(r.start_s), float(r.end_s)))
            cursor = max(cursor, float(r.end_s))
        if merged and span_start is not None:
            out.append((stage, "busy", -1, -1, span_start, span_end))
        if end > cursor + eps:
            out.append((stage, "idle (bubble)", -1, -1, cursor, end))
    f = pd.DataFrame(out, columns=["stage", "kind", "micro_batch", "chunk", "start_s", "end_s"])
    f["seconds"] = f["end_s"] - f["start_s"]
    f["row"] = "stage " + f["stage"].astype(str)
    return f[cols], merged


def timeline_chart(timeline: list[dict[str, Any]], max_items: int = 3000, width: int | None = None) -> alt.Chart:
    """Gantt chart: one row per pipeline stage, micro-batches as bars, bubbles as light gaps."""
    df, merged = timeline_frame(timeline, max_items)
    stages = sorted(df["stage"].unique()) if len(df) else []
    rows = [f"stage {s}" for s in stages]
    base = alt.Chart(df, height=alt.Step(28 if len(rows) <= 16 else 16))
    bars = base.mark_bar(stroke="white", strokeWidth=0.3 if len(df) < 600 else 0).encode(
        x=alt.X("start_s:Q", title="seconds from the start of the step"),
        x2="end_s:Q",
        y=alt.Y("row:N", sort=rows, title=None),
        color=alt.Color("kind:N", scale=_scale(KIND_COLORS, df["kind"] if len(df) else []),
                        legend=alt.Legend(orient="bottom", title=None)),
        tooltip=[alt.Tooltip("row:N", title="stage"), alt.Tooltip("kind:N"), alt.Tooltip("micro_batch:Q"),
                 alt.Tooltip("chunk:Q"), alt.Tooltip("start_s:Q", format=".4g"),
                 alt.Tooltip("seconds:Q", format=".4g")],
    )
    if not merged and 0 < len(df) <= 160:
        work = df[df["micro_batch"] >= 0]
        text = alt.Chart(work).mark_text(fontSize=9, color="white").encode(
            x=alt.X("mid:Q"), y=alt.Y("row:N", sort=rows), text="micro_batch:Q"
        ).transform_calculate(mid="(datum.start_s + datum.end_s) / 2")
        return alt.layer(bars, text)
    return bars


# --------------------------------------------------------------------------- provenance
def provenance_frame(share: dict[str, float]) -> pd.DataFrame:
    rows = [{"what": "share of the predicted time", "provenance": k, "share": float(v)}
            for k, v in share.items() if v > 0]
    df = pd.DataFrame(rows, columns=["what", "provenance", "share"])
    df["order"] = [_prov_order(p) for p in df["provenance"]]
    return df.sort_values("order", kind="stable").reset_index(drop=True)


def provenance_chart(share: dict[str, float]) -> alt.Chart:
    """One 100 % bar: the share of predicted time resting on measured / transferred / ... data."""
    df = provenance_frame(share)
    return alt.Chart(df, height=alt.Step(26)).mark_bar().encode(
        y=alt.Y("what:N", title=None, axis=None),
        x=alt.X("sum(share):Q", title=None, axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("provenance:N", scale=_scale({p: provenance_color(p) for p in df["provenance"]},
                                                     df["provenance"]),
                        legend=alt.Legend(orient="right", title="data behind it")),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("provenance:N"), alt.Tooltip("share:Q", format=".1%")],
    )


# --------------------------------------------------------------------------- memory
MEMORY_ORDER = [MEMORY_PART_LABELS[k] for k in MEMORY_PARTS]


def memory_parts_gib(stage: StageMemory) -> dict[str, float]:
    """{part: GiB} of one pipeline stage of a MemoryReport (the parts in MEMORY_ORDER)."""
    return {part: b / GIB for part, b in stage_parts_bytes(stage).items()}


def memory_stages_frame(report: MemoryReport) -> pd.DataFrame:
    """(stage, part, gib) for every pipeline stage of a MemoryReport: memory_chart's per-stage input."""
    return pd.DataFrame([{"stage": s.stage, "part": part, "gib": gib} for s in report.stages
                         for part, gib in memory_parts_gib(s).items()], columns=["stage", "part", "gib"])


def memory_frame(parts_gib: dict[str, float], setup: str = "this layout") -> pd.DataFrame:
    """{part: GiB} -> (row, part, gib) for one bar."""
    return pd.DataFrame([{"row": setup, "part": k, "gib": float(v)} for k, v in parts_gib.items()],
                        columns=["row", "part", "gib"])


def memory_chart(frame: pd.DataFrame | dict[str, float], capacity_gib: float, usable_gib: float | None = None
                 ) -> alt.Chart:
    """Stacked bars of memory per GPU by part (one bar per pipeline stage, or per setup), with the
    usable memory (capacity less the allocator reserve) as a red rule and the HBM size dashed.

    `frame`: columns (stage or row, part, gib), or a {part: GiB} dict for a single bar.
    """
    df = memory_frame(frame) if isinstance(frame, dict) else frame.copy()
    if "row" not in df:
        df["row"] = "stage " + df["stage"].astype(str)
    rows = list(dict.fromkeys(df["row"]))
    df["order"] = [MEMORY_ORDER.index(p) if p in MEMORY_ORDER else 99 for p in df["part"]]
    peak = float(df.groupby("row")["gib"].sum().max()) if len(df) else 0.0
    hi = max(capacity_gib, peak) * 1.06
    parts = list(dict.fromkeys([p for p in MEMORY_ORDER if p in set(df["part"])] + list(df["part"])))
    bars = alt.Chart(df, height=alt.Step(26)).mark_bar().encode(
        x=alt.X("sum(gib):Q", title="GiB per GPU", scale=alt.Scale(domain=[0, hi])),
        y=alt.Y("row:N", title=None, sort=rows),
        color=alt.Color("part:N", scale=alt.Scale(domain=parts, range=MEMORY_COLORS[:len(parts)] or MEMORY_COLORS),
                        legend=alt.Legend(orient="bottom", title=None)),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("row:N", title="where"), alt.Tooltip("part:N"),
                 alt.Tooltip("gib:Q", format=".3g", title="GiB")],
    )
    lines = pd.DataFrame({"gib": [capacity_gib] + ([usable_gib] if usable_gib else []),
                          "what": ["device memory"] + (["usable (less allocator reserve)"] if usable_gib else [])})
    rule = alt.Chart(lines).mark_rule(strokeWidth=2).encode(
        x="gib:Q", color=alt.value("#d62728"),
        strokeDash=alt.condition("datum.what == 'device memory'", alt.value([5, 3]), alt.value([1, 0])),
        tooltip=[alt.Tooltip("what:N"), alt.Tooltip("gib:Q", format=".3g", title="GiB")])
    return alt.layer(bars, rule)


# --------------------------------------------------------------------------- search
def search_scatter(df: pd.DataFrame, capacity_gib: float | None = None, selected_rank: int | None = None
                   ) -> alt.Chart:
    """Step time vs memory per GPU for every candidate layout; the capacity as a vertical rule."""
    d = df.copy()
    if "peak_mem_gib" not in d:
        d["peak_mem_gib"] = np.nan
    d["layout"] = d.apply(_layout_label, axis=1) if len(d) else []
    d["fits_label"] = d["fits"].map({True: "fits", False: "does not fit"}).fillna("unknown") if "fits" in d \
        else "unknown"
    if "memory_tight" in d:   # fits only with the least allocator reserve: coloured apart
        d.loc[d["memory_tight"].fillna(False).astype(bool) & (d["fits_label"] == "fits"), "fits_label"] = "tight"
    d["selected"] = d["rank"] == selected_rank if selected_rank is not None and "rank" in d else False
    tips = [alt.Tooltip("rank:Q"), alt.Tooltip("layout:N"), alt.Tooltip("step_time_s:Q", format=".4g"),
            alt.Tooltip("peak_mem_gib:Q", format=".3g", title="memory per GPU (GiB)")]
    if "mfu" in d:
        tips.append(alt.Tooltip("mfu:Q", format=".1%"))
    pts = alt.Chart(d).mark_circle(size=70, opacity=0.8).encode(
        x=alt.X("peak_mem_gib:Q", title="memory per GPU (GiB)"),
        y=alt.Y("step_time_s:Q", title="step time (s)", scale=alt.Scale(zero=False)),
        color=alt.Color("fits_label:N", title=None,
                        scale=alt.Scale(domain=["fits", "tight", "does not fit", "unknown"],
                                        range=["#2e7d32", "#f9a825", "#d62728", "#9e9e9e"]),
                        legend=alt.Legend(orient="bottom")),
        size=alt.condition("datum.selected", alt.value(260), alt.value(70)),
        tooltip=tips,
    )
    layers = [pts]
    if capacity_gib:
        layers.append(alt.Chart(pd.DataFrame({"capacity": [capacity_gib]})).mark_rule(
            color="#d62728", strokeDash=[6, 4]).encode(x="capacity:Q"))
    return alt.layer(*layers).properties(height=320)


def _layout_label(r: pd.Series) -> str:
    parts = [f"TP{int(r['tp'])}" if "tp" in r and pd.notna(r.get("tp")) else "",
             f"PP{int(r['pp'])}" if "pp" in r and pd.notna(r.get("pp")) else "",
             f"CP{int(r['cp'])}" if "cp" in r and pd.notna(r.get("cp")) and int(r["cp"]) > 1 else "",
             f"DP{int(r['dp'])}" if "dp" in r and pd.notna(r.get("dp")) else "",
             f"EP{int(r['ep'])}" if "ep" in r and pd.notna(r.get("ep")) and int(r["ep"]) > 1 else "",
             f"mb{int(r['micro_batch'])}" if "micro_batch" in r and pd.notna(r.get("micro_batch")) else ""]
    if "schedule" in r and pd.notna(r.get("schedule")):
        parts.append(str(r["schedule"]) + (f"×{int(r['vpp'])}" if "vpp" in r and pd.notna(r.get("vpp"))
                                           and int(r["vpp"]) > 1 else ""))
    if "recompute" in r and pd.notna(r.get("recompute")) and r["recompute"] != "none":
        parts.append(f"rc-{r['recompute']}")
    return " ".join(p for p in parts if p)


# --------------------------------------------------------------------------- samples
def samples_chart(points: pd.DataFrame, x: str, y: str = "duration_s", color: str | None = None,
                  curve: pd.DataFrame | None = None, log_x: bool = True, log_y: bool = True,
                  highlight: str | None = None) -> alt.Chart:
    """Measured samples (dots) and the regressor's curve (black line) over them.

    `curve` has columns x and `predicted_s`. `highlight` names a boolean column of `points`: the
    samples on the curve's slice, drawn in colour; the others faint grey. Without it the dots are
    coloured by `color`.
    """
    p = points.copy()
    xs = alt.Scale(type="log" if log_x and (p[x] > 0).all() else "linear", nice=False, zero=False)
    ys = alt.Scale(type="log" if log_y else "linear", nice=False, zero=False)
    tips = [alt.Tooltip(c) for c in p.columns if c in (x, y, "tp", "batch", "seq", "hidden", "heads", "ffn_hidden",
                                                        "vocab", "message_bytes", "nodes", "gpus_per_node")]
    if "predicted_s" in p:
        tips.append(alt.Tooltip("predicted_s:Q", format=".4g", title="regressor s"))
    X = alt.X(f"{x}:Q", scale=xs, title=x)
    Y = alt.Y(f"{y}:Q", scale=ys, title="seconds")
    layers = []
    if highlight and highlight in p:
        p["sample"] = np.where(p[highlight].astype(bool), "on the slice", "other samples")
        legend = alt.Color("sample:N", title=None, legend=alt.Legend(orient="bottom"),
                           scale=alt.Scale(domain=["on the slice", "other samples", "regressor"],
                                           range=["#e45756", "#bdbdbd", "#111111"]))
        off = p[~p[highlight].astype(bool)]
        on = p[p[highlight].astype(bool)]
        layers.append(alt.Chart(off).mark_circle(size=22, opacity=0.35).encode(x=X, y=Y, color=legend, tooltip=tips))
        layers.append(alt.Chart(on).mark_circle(size=70, opacity=0.95).encode(x=X, y=Y, color=legend, tooltip=tips))
    else:
        enc: dict[str, Any] = {"x": X, "y": Y, "tooltip": tips}
        if color and color in p:
            enc["color"] = alt.Color(f"{color}:N", legend=alt.Legend(orient="right"))
        layers.append(alt.Chart(p).mark_circle(size=36, opacity=0.7).encode(**enc))
    if curve is not None and len(curve) and curve["predicted_s"].notna().any():
        c = curve.dropna(subset=["predicted_s"]).assign(sample="regressor")
        layers.append(alt.Chart(c).mark_line(color="#111", strokeWidth=2.5).encode(
            x=X, y=alt.Y("predicted_s:Q", scale=ys),
            tooltip=[alt.Tooltip(f"{x}:Q"), alt.Tooltip("predicted_s:Q", format=".4g", title="regressor s")]))
    return alt.layer(*layers).properties(height=380)


# --------------------------------------------------------------------------- accuracy
def accuracy_scatter(df: pd.DataFrame, color: str = "platform") -> alt.Chart:
    """Predicted vs measured step time (log-log) with the y = x line and a ±20 % band."""
    d = df[df["predicted_s"].notna() & df["measured_s"].notna()].copy()
    if d.empty:
        lo, hi = 0.01, 10.0
    else:
        lo = float(min(d["predicted_s"].min(), d["measured_s"].min())) * 0.8
        hi = float(max(d["predicted_s"].max(), d["measured_s"].max())) * 1.25
    xs = np.geomspace(max(lo, 1e-9), max(hi, 2e-9), 20)
    ref = pd.DataFrame({"measured_s": xs, "ideal": xs, "plus20": xs * 1.2, "minus20": xs * 0.8})
    scale = alt.Scale(type="log", domain=[lo, hi])
    tips = [alt.Tooltip(c) for c in ("run_id", "platform", "arch", "layers", "hidden", "num_gpus", "tp", "pp", "dp",
                                     "micro_batch", "global_batch") if c in d]
    tips += [alt.Tooltip("measured_s:Q", format=".4g"), alt.Tooltip("predicted_s:Q", format=".4g"),
             alt.Tooltip("ape:Q", format=".1%", title="error")]
    pts = alt.Chart(d).mark_circle(size=34, opacity=0.65).encode(
        x=alt.X("measured_s:Q", scale=scale, title="measured step time (s)"),
        y=alt.Y("predicted_s:Q", scale=scale, title="predicted step time (s)"),
        color=alt.Color(f"{color}:N", legend=alt.Legend(orient="bottom")) if color in d else alt.value("#4c78a8"),
        tooltip=tips,
    )
    ideal = alt.Chart(ref).mark_line(color="#333").encode(x="measured_s:Q", y="ideal:Q")
    band = alt.Chart(ref).mark_area(opacity=0.12, color="#2e7d32").encode(
        x="measured_s:Q", y="minus20:Q", y2="plus20:Q")
    return alt.layer(band, ideal, pts).properties(height=400)


def op_error_chart(summary: pd.DataFrame) -> alt.Chart:
    """CV MAPE per operator model (bars) and the paper's best error (ticks) where known."""
    d = summary.copy()
    if d.empty:
        return alt.Chart(pd.DataFrame({"model": [], "cv_mape": []})).mark_bar()
    d["label"] = d.apply(lambda r: f"{r['model']}.{r['pass']}" if r.get("pass") else f"{r['kind']} {r['model']}",
                         axis=1)
    order = list(d.sort_values("cv_mape", ascending=False)["label"].drop_duplicates())
    # the axis spans the bars (and ticks within reach): one paper error of 17 or 67 (the paper's fits on its corrupt
    # GH200 rows) must not flatten every bar; a tick beyond the axis sits at its end, its value in the tooltip
    top = float(np.nanmax(d["cv_mape"].to_numpy(dtype=float))) if d["cv_mape"].notna().any() else 1.0
    x_max = max(0.05, min(1.0, top) * 1.15) if top <= 1.0 else top * 1.05
    scale = alt.Scale(domain=[0, x_max], clamp=True)
    bars = alt.Chart(d).mark_bar().encode(
        y=alt.Y("label:N", sort=order, title=None),
        x=alt.X("cv_mape:Q", title="cross-validated MAPE (paper ticks beyond the axis sit at its end)",
                axis=alt.Axis(format="%"), scale=scale),
        yOffset=alt.YOffset("platform:N"),
        color=alt.Color("platform:N", legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip(c) for c in ("platform", "label", "n_samples") if c in d]
        + [alt.Tooltip("cv_mape:Q", format=".1%"),
           alt.Tooltip("paper_best_error:Q", format=".1%", title="paper best error")],
    )
    layers = [bars]
    if "paper_best_error" in d and d["paper_best_error"].notna().any():
        layers.append(alt.Chart(d[d["paper_best_error"].notna()]).mark_tick(color="black", thickness=2).encode(
            y=alt.Y("label:N", sort=order), yOffset=alt.YOffset("platform:N"),
            x=alt.X("paper_best_error:Q", scale=scale)))
    return alt.layer(*layers).properties(height=alt.Step(max(16, 8 * max(1, d["platform"].nunique()))))


def error_hist(df: pd.DataFrame) -> alt.Chart:
    """Distribution of the signed error of end-to-end predictions."""
    d = df[df["signed_error"].notna()] if "signed_error" in df else df.iloc[0:0]
    return alt.Chart(d).mark_bar().encode(
        x=alt.X("signed_error:Q", bin=alt.Bin(maxbins=40), title="(predicted − measured) / measured",
                axis=alt.Axis(format="%")),
        y=alt.Y("count():Q", title="runs", axis=alt.Axis(tickMinStep=1, format="d")),   # whole runs
        color=alt.Color("platform:N", legend=None) if "platform" in d else alt.value("#4c78a8"),
        tooltip=[alt.Tooltip("count():Q", title="runs")],
    ).properties(height=260)


def sweep(lo: float, hi: float, n: int = 60, integer: bool = True) -> np.ndarray:
    """Log-spaced points between lo and hi (integers when the column is integral)."""
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= 0:
        return np.array([])
    lo = max(lo, 1.0 if integer else hi * 1e-6)
    xs = np.geomspace(lo, hi, n) if hi > lo else np.array([lo])
    if integer:
        xs = np.unique(np.round(xs).astype(np.int64))
    return xs


# --------------------------------------------------------------------------- network fits
NETWORK_Y = {"busbw": ("busbw_measured", "busbw_predicted", "bus bandwidth (GB/s)"),
             "time": ("duration_s", "predicted_s", "time (s)")}
NETWORK_MAX_POINTS = 2500   # more measured timings than this are drawn as medians per 1/16 octave
NETWORK_BINS_PER_OCTAVE = 16


def network_points_frame(points: pd.DataFrame, y: str = "busbw", max_points: int = NETWORK_MAX_POINTS
                         ) -> pd.DataFrame:
    """The measured dots of `network_fit_chart`: columns group, dataset, message_bytes, measured, predicted,
    ape, n (timings behind the dot). Up to `max_points` rows every timing is a dot (n = 1); above, each
    (group, dataset, 1/16 octave of message size) is one dot at the medians of its timings."""
    meas, pred, _ = NETWORK_Y[y]
    d = points[(points["message_bytes"] > 0) & points[meas].notna()]
    out = pd.DataFrame({"group": d["group"].astype(str), "dataset": d["dataset"].astype(str),
                        "message_bytes": d["message_bytes"].astype(float), "measured": d[meas].astype(float),
                        "predicted": d[pred].astype(float), "ape": d["ape"].astype(float), "n": 1})
    if len(out) <= max_points:
        return out.reset_index(drop=True)
    out["bin"] = np.floor(np.log2(out["message_bytes"]) * NETWORK_BINS_PER_OCTAVE)
    g = out.groupby(["group", "dataset", "bin"], sort=True)
    agg = g.agg(message_bytes=("message_bytes", "median"), measured=("measured", "median"),
                predicted=("predicted", "median"), ape=("ape", "median"), n=("n", "size"))
    return agg.reset_index().drop(columns="bin")


def network_fit_chart(points: pd.DataFrame, curves: pd.DataFrame, y: str = "busbw",
                      max_points: int = NETWORK_MAX_POINTS) -> alt.Chart:
    """Measured collective timings (dots) and the saved network calibration's curve (line) per group
    ('allreduce 4x8': nodes x GPUs per node, with the algorithm when the sweep forced one), against the
    message size, both axes log (inter-node groups run 10-100x below the NVLink ones). `y`: "busbw"
    (nccl-tests bus bandwidth, GB/s) or "time" (seconds). `points` / `curves` as
    predictor.checks.network_check.network_check returns them (one platform)."""
    _, pred, title = NETWORK_Y[y]
    dots = network_points_frame(points, y, max_points)
    line = curves[["group", "message_bytes", pred, "chosen"]].rename(columns={pred: "predicted"})
    line = line[line["predicted"].notna() & (line["message_bytes"] > 0)]
    groups = sorted(set(dots["group"]) | set(line["group"]))
    color = alt.Color("group:N", scale=alt.Scale(domain=groups, scheme="tableau20"),
                      title="group (collective, nodes x GPUs per node)",
                      legend=alt.Legend(orient="bottom", columns=min(6, max(1, len(groups))), labelLimit=200,
                                         titleLimit=400))
    ys = alt.Scale(type="log", nice=False)
    x = alt.X("message_bytes:Q", scale=alt.Scale(type="log", nice=False), title="message size (bytes, full buffer)",
              axis=alt.Axis(format="~s"))
    fmt_y = ".4g"
    tips = [alt.Tooltip("group:N"), alt.Tooltip("dataset:N"), alt.Tooltip("message_bytes:Q", format="~s",
                                                                          title="message bytes"),
            alt.Tooltip("measured:Q", format=fmt_y, title=f"measured {title}"),
            alt.Tooltip("predicted:Q", format=fmt_y, title=f"fitted {title}"),
            alt.Tooltip("ape:Q", format=".1%", title="error"), alt.Tooltip("n:Q", title="timings")]
    pts = alt.Chart(dots).mark_circle(size=30, opacity=0.55).encode(
        x=x, y=alt.Y("measured:Q", scale=ys, title=title), color=color, tooltip=tips)
    lines = alt.Chart(line).mark_line(strokeWidth=2.2).encode(
        x=x, y=alt.Y("predicted:Q", scale=ys, title=title), color=color, detail="group:N",
        tooltip=[alt.Tooltip("group:N"), alt.Tooltip("message_bytes:Q", format="~s", title="message bytes"),
                 alt.Tooltip("predicted:Q", format=fmt_y, title=f"fitted {title}"),
                 alt.Tooltip("chosen:N", title="algorithm/protocol")])
    return alt.layer(pts, lines).properties(height=440)

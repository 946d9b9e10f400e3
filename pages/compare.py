"""Compare: two to four setups (layouts, platforms or models) side by side, differences highlighted."""
import pandas as pd
import streamlit as st

from predictor.model.errors import InfeasibleConfig
from predictor.plan.costing import training_estimate
from predictor.step.memory import GIB
from predictor_ui import charts, data, fmt, inputs, urlcheck, views

views.page_setup()

st.title("Compare setups")
st.caption("Each column is one setup; rows that differ from setup A are highlighted. Change anything: "
           "the address bar keeps every input, so the comparison is shareable.")

LETTERS = "abcd"
# Setup defaults: A = the Predict default, then one change each (TP/PP, schedule, platform).
SETUP_DEFAULTS = {
    "a": {},
    "b": {"tp": 4, "pp": 8},
    "c": {"schedule": "interleaved", "vpp": 2},
    "d": {"platform": "dgx-a100-80gb"},
}

n = urlcheck.guard().segmented_control("Setups", [2, 3, 4], default=3, key="n", bind="query-params", required=True,
                         help="How many setups to compare")
n = int(n or 3)
sb = urlcheck.guard(st.sidebar)
sb.subheader("Training run")
target = inputs.target_inputs(container=sb)
sb.caption("The token target and price apply to every setup.")

results_area = st.container()  # filled below, shown above the inputs
st.subheader("The setups")
cols = st.columns(n, border=True)
setups = []
for i in range(n):
    letter = LETTERS[i]
    pre = f"{letter}_"
    d = {**inputs.DEFAULT_SETUP, **SETUP_DEFAULTS[letter]}
    with cols[i]:
        st.markdown(f"##### Setup {letter.upper()}")
        mf = inputs.model_inputs(pre, default=d["model"])
        pf = inputs.platform_inputs(pre, default=d["platform"], allow_custom=False)
        lf = inputs.layout_inputs(pre, defaults=d, more="Sequence, schedule, memory savers", model=mf)
    setups.append((letter.upper(), mf, pf, lf))

results = []
for name, mf, pf, lf in setups:
    key = inputs.platform_key(pf)
    try:
        model, layout = data.build(mf, lf)
        pred = data.predict(key, model, layout, timeline=False)
    except InfeasibleConfig as e:
        with results_area:
            views.infeasible(e, where=f"Setup {name}: ")
        results.append(None)
        continue
    except Exception as e:  # noqa: BLE001 - e.g. model files from another predictor version
        with results_area:
            views.failed(e, f"Setup {name}: the prediction", data.resolve_platform(key).op_models)
        results.append(None)
        continue
    cost = training_estimate(pred.step_time_s, layout.num_gpus, layout.tokens_per_step, target["tokens"],
                             target["price"]).scalar()
    results.append({"name": name, "key": key, "model": model, "layout": layout, "pred": pred, "mem": pred.memory,
                    "cost": cost, "mf": mf, "pf": pf, "lf": lf, "host": pred.host_overhead_modelled})

ok = [r for r in results if r is not None]
if not ok:
    st.stop()

with results_area:
    # the predictions' warnings (e.g. short kernels on a platform without a fitted host overhead), once each
    notes: dict[str, list[str]] = {}
    for r in ok:
        for w in r["pred"].warnings:
            notes.setdefault(w, []).append(r["name"])
    for w, names in notes.items():
        st.warning(f"**Setup {', '.join(names)}**: {w}", icon=":material/info:")
    base = ok[0]["pred"].step_time_s
    rows = {}
    for r in ok:
        p, L, mem, cost = r["pred"], r["layout"], r["mem"], r["cost"]
        rows[f"Setup {r['name']}"] = {
            "model": r["mf"].get("model", "custom"), "platform": p.platform_id, "GPUs": L.num_gpus,
            "TP × PP × CP × DP": f"{L.tp} × {L.pp} × {L.cp} × {L.dp}", "EP (expert parallel)": L.ep,
            "micro-batch / global batch": f"{L.micro_batch} / {L.global_batch}",
            "sequence length": L.seq_len, "schedule": L.schedule + (f" (vpp {L.vpp})" if L.vpp > 1 else ""),
            "recomputation": L.recompute, "sequence parallel": "on" if L.sequence_parallel else "off",
            "ZeRO stage": L.zero_stage, "precision": L.precision, "framework": L.framework,
            "step time": f"{fmt.seconds(p.step_time_s)} ± {fmt.pct(p.expected_error)}",
            "vs setup A": "–" if r is ok[0] else f"{p.step_time_s / base:.2f}×",
            "host / framework overhead": (fmt.seconds(p.breakdown_s.get("host_overhead", 0.0)) if r["host"]
                                          else "not modelled"),
            "tokens / s": fmt.count(p.tokens_per_s), "MFU": fmt.pct(p.mfu, 1),
            "memory / GPU": f"{mem.peak_gib:.3g} GiB "
                            f"({'does NOT fit' if not mem.fits else 'tight' if mem.tight else 'fits'})",
            f"time to {fmt.count(target['tokens']).replace(' ', '')} tokens": fmt.duration(cost.seconds),
            "GPU-hours": fmt.count(cost.gpu_hours), "cost": fmt.money(cost.cost),
            "rests on": views.short_prov(p.provenance_share, families=4),
        }
    table = pd.DataFrame(rows).astype(str)
    first = table.columns[0]


    def _highlight(col: pd.Series) -> list[str]:
        if col.name == first:
            return [""] * len(col)
        return ["background-color: rgba(255, 193, 7, 0.28); font-weight: 600" if v != a else ""
                for v, a in zip(col, table[first])]

    def _oom(col: pd.Series) -> list[str]:
        return ["color: #c62828; font-weight: 600" if "NOT fit" in str(v) else "" for v in col]


    st.subheader("Side by side")
    def _fits(r) -> bool:
        return r["mem"].fits

    fitting = [r for r in ok if _fits(r)]
    best = min(fitting or ok, key=lambda r: r["pred"].step_time_s)
    msg = (f"Fastest{' that fits in memory' if len(fitting) < len(ok) else ''}: **Setup {best['name']}** at "
           f"**{fmt.seconds(best['pred'].step_time_s)}** per step ({fmt.count(best['pred'].tokens_per_s)} tokens/s).")
    oom = [r["name"] for r in ok if not _fits(r)]
    if oom:
        msg += f" Setup {', '.join(oom)} would run out of memory."
    st.markdown(msg)
    st.table(table.style.apply(_highlight, axis=0).apply(_oom, axis=0))
    flat = table.reset_index(names="field")
    views.export(flat, "comparison", "cmp_x")

    st.subheader("Where the time goes")
    st.altair_chart(charts.breakdown_chart({f"Setup {r['name']}": charts.visible_breakdown(r["pred"].breakdown_s,
                                                                                          r["host"]) for r in ok}),
                    width="stretch")
    if not all(r["host"] for r in ok):
        st.caption("Host / framework overhead: not modelled for setup "
                   + ", ".join(r["name"] for r in ok if not r["host"])
                   + " (its platform has no fitted host overhead), so it is left out there rather than drawn as 0.")
    bds = pd.concat([charts.breakdown_table(r["pred"].breakdown_s, r["pred"].step_time_s, r["host"])
                     .assign(setup=f"Setup {r['name']}") for r in ok])
    with st.expander("Breakdown per setup (table)"):
        wide = bds.pivot_table(index="category", columns="setup", values="seconds", aggfunc="first", dropna=False,
                               sort=False)
        st.dataframe(wide, column_config={c: st.column_config.NumberColumn(format="%.4g") for c in wide.columns})
        views.export(bds[["setup", "category_id", "category", "seconds", "share", "note"]], "breakdown_per_setup",
                     "cmp_bd_x")
    st.subheader("Memory per GPU (fullest stage)")
    mem_frames = [charts.memory_frame(charts.memory_parts_gib(r["mem"].peak), f"Setup {r['name']}") for r in ok]
    caps = {r["mem"].capacity_bytes / GIB for r in ok}
    usable = min(r["mem"].usable_bytes / GIB for r in ok)
    st.altair_chart(charts.memory_chart(pd.concat(mem_frames), max(caps), usable), width="stretch")
    if len(caps) > 1:
        st.caption("The setups run on devices of different memory sizes; the lines show the largest device.")

    st.caption("Open a setup on its own:")
    links = st.columns(len(ok))
    for c, r in zip(links, ok):
        qp = {k: inputs.query_value(k, v)
              for k, v in {**r["mf"], **r["pf"], **r["lf"]}.items() if v is not None and k != "name"}
        c.page_link("pages/predict.py", label=f"Setup {r['name']} in Predict", icon=":material/open_in_new:",
                    query_params=qp)

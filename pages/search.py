"""Search: the ranked layouts for a model, platform, GPU count and batch."""
import streamlit as st

from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import model_from_fields
from predictor.model.specs import SCHEDULES
from predictor.plan.search import SearchSpace
from predictor.step.memory import TIGHT_MEANS
from predictor_ui import charts, data, fmt, inputs, urlcheck, views
from predictor_ui.search_view import OBJECTIVE_LABELS

views.page_setup()

BIND = "query-params"
# Own key prefix: a row click hands plain names (model, tp, ...) to Predict through st.switch_page, which
# cannot set query parameters that a widget on this page is bound to.
PRE = "sr_"
sb = urlcheck.guard(st.sidebar)
sb.subheader("Model")
model_fields = inputs.model_inputs(PRE, container=sb)
sb.subheader("Platform")
plat_fields = inputs.platform_inputs(PRE, container=sb)
key = inputs.platform_key(plat_fields)
sb.subheader("Job")
d = inputs.DEFAULT_SETUP
num_gpus = sb.number_input("GPUs", 1, 1_000_000, d["num_gpus"], key=PRE + "num_gpus", bind=BIND)
a, b = sb.columns(2)
global_batch = a.number_input("Global batch", 1, 10_000_000, d["global_batch"], key=PRE + "global_batch", bind=BIND,
                              help="Sequences per optimizer step")
seqs = list(inputs.SEQ_LENS)
seq_len = b.selectbox("Sequence length", seqs, index=seqs.index(d["seq_len"]), key=PRE + "seq_len", bind=BIND)
try:
    _precisions = inputs.precision_choices(data.resolve_platform(key))
except Exception:  # noqa: BLE001 - an unknown / half-entered platform: the search below says why
    _precisions = None
precision = inputs.precision_picker(a, PRE + "precision", d["precision"], _precisions)
objective = b.selectbox("Rank by", list(OBJECTIVE_LABELS), key="objective", bind=BIND,
                        help="time: step time · tokens: tokens/s · mfu: model FLOPs utilisation · "
                             "cost: GPU-hours per token")
with sb.expander("Search space") as ex:
    tp_across = ex.toggle("Allow TP across nodes", False, key="tp_across", bind=BIND,
                          help="Tensor parallelism normally stays within a node (NVLink)")
    schedules = ex.multiselect("Schedules", list(SCHEDULES), ["1f1b", "interleaved"],
                               key="schedules", bind=BIND,
                               help="zb-h1 / zb-v: zero-bubble (Qi et al. 2024); dualpipe / dualpipe-v: DeepSeek-V3's "
                                    "bidirectional schedules (2x / 1x parameters). Off by default: each adds layouts "
                                    "to rank (docs/schedules.md)")
    recomputes = ex.multiselect("Recomputation", ["none", "selective", "full"], ["none", "selective", "full"],
                                key="recomputes", bind=BIND)
    zeros = ex.multiselect("ZeRO stages", [0, 1, 2, 3], [0, 1, 2, 3], key="zeros", bind=BIND)
    max_mb = ex.number_input("Max micro-batch", 1, 1024, 16, key="max_mb", bind=BIND)
    uneven = ex.toggle("Try uneven layer splits", True, key="uneven", bind=BIND,
                       help="First and last stage one layer lighter (they hold the embedding and the LM head)")
    fw = inputs.framework_inputs(PRE, ex)   # the TP overlap applies to the layouts with TP > 1 and SP
    fw.update(inputs.precision_memory_inputs(PRE, ex, precision))
    # all-to-all context parallelism and activation offloading: off unless asked for
    cp_comms = ex.multiselect("CP communication", list(inputs.CP_COMM_CHOICES), ["p2p"], key="cp_comms", bind=BIND,
                              help="Where CP > 1: p2p = Megatron-Core's ring; a2a = DeepSpeed-Ulysses; a2a+p2p = "
                                   "a2a inside a node, the ring across")
    offload = ex.multiselect("Offloaded layers", [0, 4, 8, 16, 20, 32, 40, 64], [0], key="offload", bind=BIND,
                             help="Activation offloading to host memory, tried on the layouts with PP 1 and no "
                                  "recomputation; the table's needs_offload marks a layout that fits only with it")
    fw.update(cp_comm=tuple(cp_comms or ["p2p"]), offload_activations=tuple(int(x) for x in (offload or [0])))
sb.subheader("Training run")
target = inputs.target_inputs(PRE, container=sb)

st.title("Search layouts")
space = SearchSpace(tp_within_node=not tp_across, schedules=tuple(schedules or ["1f1b"]),
                    recompute=tuple(recomputes or ["none"]), zero_stage=tuple(zeros or [0]),
                    max_micro_batch=int(max_mb), uneven_splits=bool(uneven), precision=precision, **fw)
try:
    model = model_from_fields(model_fields)
    platform = data.resolve_platform(key)
    with st.spinner(f"Ranking every layout of {model.name} on {num_gpus} GPUs..."):
        rep = data.search(key, model, space, num_gpus=int(num_gpus), global_batch=int(global_batch),
                          seq_len=int(seq_len), tokens=target["tokens"], price=target["price"], objective=objective)
except InfeasibleConfig as e:
    views.infeasible(e)
    st.stop()
except Exception as e:  # noqa: BLE001 - e.g. model files from another predictor version
    views.failed(e, "The search", data.resolve_platform(key).op_models)
    st.stop()

res = rep.table
st.caption(f"**{model.name}** on **{platform.platform_id}**, {num_gpus} GPUs, global batch {global_batch}, "
           f"sequence {seq_len}, {precision}: {rep.enumerated:,} layouts enumerated, {rep.feasible:,} fit in "
           f"memory, ranked by {OBJECTIVE_LABELS[objective]} in {rep.elapsed_s:.2f} s. "
           "**Click a row to open it in Predict.**")
if res.empty or rep.feasible == 0:
    st.warning(f"No layout of {model.name} fits on {num_gpus} GPUs with global batch {global_batch}"
               + (" (none could be enumerated)." if res.empty else " in memory.")
               + " **How to fix:** use more GPUs, a global batch with more divisors (a power of two), allow "
                 "recomputation / higher ZeRO stages / TP across nodes in the search space, or a shorter sequence.",
               icon=":material/search_off:")
    if len(rep.rejections):
        views.table(rep.rejections, "search_rejections", "rej_empty")
    st.stop()

# ---- filters on the ranked table
f0, f2, f3, f4 = urlcheck.guard().columns([1.4, 1, 1, 1])   # the two switches one above the other: full labels
fits_only = f0.toggle("Only layouts that fit", True, key="fits_only", bind=BIND)
no_tight = f0.toggle("Leave out tight layouts", True, key="no_tight", bind=BIND,
                     help=f"Tight: {TIGHT_MEANS}. Off: they are listed, marked in the 'tight' column and in the "
                          "chart. Ranks count every layout that fits, so a left-out tight layout leaves a gap in them.")
tps = sorted(int(x) for x in res["tp"].dropna().unique())
max_tp = f2.select_slider("Max TP", tps, value=tps[-1], key="max_tp", bind=BIND) if len(tps) > 1 else tps[0]
pps = sorted(int(x) for x in res["pp"].dropna().unique())
max_pp = f3.select_slider("Max PP", pps, value=pps[-1], key="max_pp", bind=BIND) if len(pps) > 1 else pps[0]
top = f4.number_input("Show top", 5, 5000, 50, step=5, key="top", bind=BIND)

view = res
if fits_only:
    view = view[view["fits"].astype(bool)]
if no_tight and "memory_tight" in view:
    view = view[~view["memory_tight"].astype(bool)]
view = view[(view["tp"] <= max_tp) & (view["pp"] <= max_pp)]
view = view.head(int(top)).reset_index(drop=True)
if view.empty:
    st.warning("No layout passes these filters. **How to fix:** raise Max TP / Max PP, turn off 'Leave out tight "
               "layouts', or turn off 'Only layouts that fit' to see why layouts run out of memory.",
               icon=":material/filter_alt_off:")
    st.stop()

best = view.iloc[0]
best_tight = bool(best.get("memory_tight", False))
if best_tight:
    st.warning(f"**The best layout here is tight**: {TIGHT_MEANS}. Leave headroom, or turn on 'Leave out tight "
               "layouts' for the best layout with the typical reserve.",
               icon=":material/memory:")
c = st.columns(4)
c[0].metric("Best step time (tight)" if best_tight else "Best step time", fmt.seconds(float(best["step_time_s"])),
            charts._layout_label(best),
            delta_color="off", delta_arrow="off", border=True)
c[1].metric("Tokens / s", fmt.count(float(best["tokens_per_s"])), f"MFU {fmt.pct(float(best['mfu']), 1)}",
            delta_color="off", delta_arrow="off", border=True)
c[2].metric("Memory / GPU", fmt.gib(float(best["peak_mem_gib"])), f"of {platform.device.hbm_gib:g} GiB",
            delta_color="off", delta_arrow="off", border=True)
if "days" in view:
    tok = fmt.count(target["tokens"]).replace(" ", "")
    c[3].metric(f"Time to {tok} tokens", fmt.duration(float(best["days"]) * 86400),
                (fmt.money(float(best["cost"])) if "cost" in view and best["cost"] == best["cost"]
                 else f"{fmt.count(float(best['gpu_hours']))} GPU-hours"), delta_color="off", delta_arrow="off",
                border=True)

if isinstance(best.get("warnings"), str) and best["warnings"]:
    st.warning(f"**Best layout**: {best['warnings']}", icon=":material/info:")
host_on = rep.host_modelled
shown = [col for col in ["rank", "tp", "pp", "cp", "ep", "dp", "micro_batch", "vpp", "schedule", "stage_layers",
                         "recompute",
                         "sequence_parallel", "zero_stage", "step_time_s", "tokens_per_s", "mfu", "peak_mem_gib",
                         "fits", "memory_tight", "days", "cost", "expected_error", "compute_s"]
         + (["host_overhead_s"] if host_on else [])
         + ["tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s", "reason"] if col in view]
if not host_on:
    st.caption("Host / framework overhead is not modelled on this platform (no fitted host overhead): the "
               "table leaves it out, and its `host_overhead_s` column in the exports is empty, not 0.")
ev = st.dataframe(
    view[shown], hide_index=True, key="search_table", on_select="rerun", selection_mode="single-row",
    height=min(460, 35 * (len(view) + 1) + 3), width="stretch",
    column_config={"step_time_s": st.column_config.NumberColumn("step time (s)", format="%.4g"),
                   "tokens_per_s": st.column_config.NumberColumn("tokens/s", format="%.4g"),
                   "mfu": st.column_config.NumberColumn("MFU", format="percent"),
                   "peak_mem_gib": st.column_config.NumberColumn("memory/GPU (GiB)", format="%.3g"),
                   "memory_tight": st.column_config.CheckboxColumn(
                       "tight", help=f"Tight: {TIGHT_MEANS}"),
                   "days": st.column_config.NumberColumn("days", format="%.4g"),
                   "cost": st.column_config.NumberColumn("cost ($)", format="%.4g"),
                   "expected_error": st.column_config.NumberColumn("± error", format="percent"),
                   **{f"{c}_s": st.column_config.NumberColumn(f"{charts.CATEGORY_LABELS[c]} (s)", format="%.3g")
                      for c in ("compute", "host_overhead", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm",
                                "bubble")},
                   "stage_layers": st.column_config.TextColumn("layers/stage")})
views.export(view, "search_results", "search_x")

sel = ev.selection.rows if ev is not None and hasattr(ev, "selection") else []
if sel:
    views.open_in_predict(model_fields, plat_fields, view.iloc[sel[0]], target)

st.subheader("Step time vs memory")
st.altair_chart(charts.search_scatter(view, capacity_gib=float(platform.device.hbm_gib)), width="stretch")
st.caption("Each dot is a layout of the table above; the dashed line is the device memory. Lower is faster.")

with st.expander(f"Why layouts are missing ({rep.enumerated - rep.feasible:,} do not fit)"):
    if len(rep.rejections):
        views.table(rep.rejections, "search_rejections", "rej")
    else:
        st.write("Every enumerated layout fits.")

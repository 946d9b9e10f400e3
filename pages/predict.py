"""Predict: one model on one platform under one layout."""
import streamlit as st

from predictor.model.errors import InfeasibleConfig
from predictor.model.specs import ZB_SCHEDULES
from predictor.plan.costing import training_estimate
from predictor.plan.memory_verdict import largest_parts
from predictor.step.memory import GIB
from predictor_ui import data, fmt, inputs, urlcheck, views

views.page_setup()

sb = urlcheck.guard(st.sidebar)
sb.subheader("Model")
model_fields = inputs.model_inputs(container=sb)
sb.subheader("Platform")
plat_fields = inputs.platform_inputs(container=sb)
key = inputs.platform_key(plat_fields)
sb.subheader("Layout")
try:
    _precisions = inputs.precision_choices(data.resolve_platform(key))
except Exception:  # noqa: BLE001 - an unknown / half-entered platform: the prediction below says why
    _precisions = None
layout_fields = inputs.layout_inputs(container=sb, stage_layers=True, model=model_fields, precisions=_precisions)
sb.subheader("Training run")
target = inputs.target_inputs(container=sb)

st.title("Predict a training step")
try:
    model, layout = data.build(model_fields, layout_fields)
    pred = data.predict(key, model, layout)
except InfeasibleConfig as e:
    views.infeasible(e)
    st.stop()
except Exception as e:  # noqa: BLE001 - e.g. model files from another predictor version
    views.failed(e, "The prediction", data.resolve_platform(key).op_models)
    st.stop()

st.markdown(inputs.setup_caption(model_fields, plat_fields, layout))
host_modelled = pred.host_overhead_modelled
mem = pred.memory  # the engine's per-stage memory of this layout (always set by Predictor.predict)
assert mem is not None
cost = training_estimate(pred.step_time_s, layout.num_gpus, layout.tokens_per_step, target["tokens"],
                         target["price"]).scalar()
wall_lo, wall_hi = cost.seconds * (1 - pred.expected_error), cost.seconds * (1 + pred.expected_error)
usable_gib, capacity_gib = mem.usable_bytes / GIB, mem.capacity_bytes / GIB

tokens_lbl = fmt.count(target["tokens"]).replace(" ", "")
if not mem.fits:
    # A layout that cannot run gets no headline numbers in full size: the verdict first, the times small
    # one number format for every GiB figure (the verdict's: one decimal), the fullest stage's largest parts,
    # and the usable memory said once (the HBM beside it only where a margin is kept back)
    of_hbm = "" if abs(capacity_gib - usable_gib) < 0.05 else f" of the device's {capacity_gib:,.1f} GiB"
    st.error(f"**Does not fit:** this layout needs {mem.peak_gib:,.1f} GiB per GPU on stage {mem.peak.stage}, the "
             f"fullest ({largest_parts(pred)}), but {usable_gib:,.1f} GiB{of_hbm} are usable. Try more "
             "pipeline or tensor parallelism, a smaller micro-batch, recomputation or a higher ZeRO stage "
             "(the Memory tab shows where the bytes go).", icon=":material/memory:")
    st.caption(f"If it fitted: step time {fmt.seconds(pred.step_time_s)} ({views.step_band(pred)}), "
               f"{fmt.count(pred.tokens_per_s)} tokens/s, MFU {fmt.pct(pred.mfu, 1)}, "
               f"{fmt.duration(cost.seconds)} to {tokens_lbl} tokens. Not a plan: it cannot run as set.")
if mem.fits:
    c = st.columns(4)
    c[0].metric("Step time", fmt.seconds(pred.step_time_s), views.step_band(pred), delta_color="off",
                delta_arrow="off", border=True, help=f"Expected range: {pred.error_basis}")
    c[1].metric("Tokens / s", fmt.count(pred.tokens_per_s),
                f"{fmt.count(pred.tokens_per_s / layout.num_gpus)} per GPU", delta_color="off", delta_arrow="off",
                border=True)
    c[2].metric("MFU", fmt.pct(pred.mfu, 1), f"{pred.model_tflops_per_gpu:.0f} TFLOP/s per GPU", delta_color="off",
                delta_arrow="off", border=True, help="Model FLOPs utilisation: model FLOPs (no recomputation) / "
                                                      "time / dense peak of the device at this precision")
    tight = bool(pred.memory_tight)
    c[3].metric("Memory / GPU", f"{mem.peak_gib:.3g} GiB",
                f"tight in {usable_gib:.3g} GiB" if tight else f"fits in {usable_gib:.3g} GiB",
                delta_color="off" if tight else "normal", delta_arrow="off", border=True,
                help=f"Fullest pipeline stage (stage {mem.peak.stage}) against the usable device memory"
                     + (f"; tight: {mem.low_peak_bytes / GIB:.3g} GiB with the least allocator reserve published "
                        "runs show, so it fits only if the allocator fragments that little" if tight else ""))
    c = st.columns(4)
    c[0].metric(f"Time to {tokens_lbl} tokens", fmt.duration(cost.seconds),
                f"{fmt.duration(wall_lo)} – {fmt.duration(wall_hi)}", delta_color="off", delta_arrow="off",
                border=True, help=f"{fmt.count(cost.steps)} steps × step time, with the step time's expected range")
    c[1].metric("GPU-hours", fmt.count(cost.gpu_hours), f"{layout.num_gpus} GPUs", delta_color="off",
                delta_arrow="off", border=True)
    c[2].metric("Cost", fmt.money(cost.cost),
                f"at ${target['price']:.2f}/GPU-h" if target["price"] is not None
                else "set a price in the sidebar", delta_color="off", delta_arrow="off", border=True)
    fams = views.family_shares(pred.provenance_share)
    c[3].metric("Data behind it", views.prov_word(pred.provenance_share),
                f"{next(iter(fams.values())):.0%} of the time" if fams else "-", delta_color="off", delta_arrow="off",
                border=True, help=views.PROVENANCE_HELP + " " + views.short_prov(pred.provenance_share, families=4)
                + ".")
# Charts only now: on a cold start the numbers above reach the browser first. Above the fold
# and on the first tab the bars are plain HTML, so the first paint needs no chart library.
from predictor_ui import charts  # noqa: E402

p1, p2 = st.columns([3, 2], vertical_alignment="center")
with p1:
    st.html(charts.provenance_html(pred.provenance_share))
p2.caption(f"**Expected error** ± {fmt.pct(pred.expected_error)}: {pred.error_basis}.")
for w in pred.warnings:
    if not mem.fits and w.startswith("Does not fit in memory"):
        continue   # the red verdict above says it, with the same figures
    st.warning(w, icon=":material/info:")

# Lazy tabs: only the open one runs (light first paint); the open tab is part of the URL.
t_break, t_ops, t_time, t_mem, t_data, t_export = urlcheck.guard().tabs(
    ["Where the time goes", "Operators", "Pipeline timeline", "Memory", "Data basis", "Export"],
    key="view", on_change="rerun", bind="query-params")

if t_break.open:
    with t_break:
        st.html(charts.breakdown_html(charts.visible_breakdown(pred.breakdown_s, host_modelled)))
        bd = charts.breakdown_table(pred.breakdown_s, pred.step_time_s, host_modelled, cp=layout.cp,
                                    ep=layout.ep, offload=layout.offload_activations)
        detail = ", ".join(f"{k.replace('_', ' ')} {fmt.seconds(v)}" for k, v in pred.detail_s.items())
        st.caption(f"Along the critical path (stage {pred.critical_stage}); compute splits into {detail}."
                   + ("" if host_modelled else " Host / framework overhead is not modelled on this platform "
                      "(no fitted host overhead), so it is left out rather than shown as 0."))
        st.html(charts.html_table(bd.drop(columns=["category_id"]),
                                  {"seconds": fmt.seconds, "share": lambda v: fmt.pct(v, 1)}))
        views.export(bd, "breakdown", "t_breakdown")

if t_ops.open:
    with t_ops:
        stages = sorted(pred.ops["stage"].unique())
        stage = st.selectbox("Pipeline stage", stages, index=stages.index(pred.critical_stage),
                             format_func=lambda s: f"stage {s}" + (" (critical)" if s == pred.critical_stage else ""),
                             key="ops_stage")
        top = st.slider("Operators shown", 5, 40, 15, key="ops_top")
        st.altair_chart(charts.ops_chart(pred.ops, stage, top), width="stretch")
        st.caption("Seconds per micro-batch on this stage, summed over its layers; forward, backward and "
                   "recomputation separately. Hover for the data behind each bar.")
        views.table(charts.ops_frame(pred.ops, stage, 1000).drop(columns=["rank"]), "operators", "t_ops",
                    column_config={"seconds": st.column_config.NumberColumn(format="%.4g"),
                                   "total": st.column_config.NumberColumn(format="%.4g")})
        per_step = charts.ops_frame(pred.ops, stage, 1000, per="step")
        if len(per_step):
            st.markdown("**Once per step on this stage** (the data-parallel gradient / parameter traffic, the "
                        "optimizer, the embedding all-reduce: not per micro-batch)")
            st.altair_chart(charts.ops_chart(pred.ops, stage, top, per="step"), width="stretch")
            views.table(per_step.drop(columns=["rank"]), "operators_per_step", "t_ops_step",
                        column_config={"seconds": st.column_config.NumberColumn(format="%.4g"),
                                       "total": st.column_config.NumberColumn(format="%.4g")})

if t_time.open:
    with t_time:
        chart_tl = charts.timeline_chart(pred.timeline)
        st.altair_chart(chart_tl, width="stretch")
        L = layout
        st.caption(f"{L.pp} stages × {L.num_micro_batches} micro-batches ({L.schedule}"
                   f"{f', {L.vpp} virtual stages' if L.vpp > 1 else ''}); grey = idle (pipeline bubble, "
                   f"{fmt.seconds(pred.breakdown_s.get('bubble', 0.0))} on the critical path). The optimizer step and "
                   "the data-parallel gradient reduction follow the last backward"
                   + ("; green = weight-gradient passes W, split off the backward, which fill the bubbles (a DualPipe "
                      "forward-backward pair is drawn as its forward, then its backward)" if L.schedule in ZB_SCHEDULES
                      else "") + ".")
        if not pred.timeline:
            st.info("This schedule has no simulated timeline.")

if t_mem.open:
    with t_mem:
        stages = charts.memory_stages_frame(mem)
        st.altair_chart(charts.memory_chart(stages, capacity_gib, usable_gib), width="stretch")
        pk = mem.peak
        st.caption(f"Peak memory per GPU on each pipeline stage, as nvidia-smi would show it. Dashed: device "
                   f"memory {capacity_gib:.3g} GiB; solid: usable {usable_gib:.3g} GiB. Stage {pk.stage} is the "
                   f"fullest: {pk.allocated_bytes / GIB:.3g} GiB allocated by tensors (what "
                   "torch.cuda.max_memory_allocated reports), + the caching allocator's reserve "
                   f"({pk.allocator_bytes / GIB:.3g} GiB, {mem.options.allocator_overhead:.1%} of the allocated "
                   "peak: the median of published Megatron logs), + NCCL communicator buffers "
                   f"({pk.nccl_bytes / GIB:.3g} GiB, from NCCL's buffer sizes per communicator the layout uses) "
                   f"+ CUDA context and workspaces ({pk.framework_bytes / GIB:.3g} GiB). Checked against "
                   "published per-GPU memory of Megatron runs on the Accuracy page."
                   + (f" {mem.reason[:1].upper()}{mem.reason[1:]}." if mem.reason else ""))
        # the three figures a user compares with their logs, side by side (as predict-batch's memory columns)
        m1, m2, m3 = st.columns(3)
        m1.metric("Allocated", f"{pk.allocated_bytes / GIB:,.1f} GiB", "torch max_memory_allocated", delta_color="off",
                  delta_arrow="off", help="Tensors alive at the fullest stage's peak")
        m2.metric("Reserved", f"{pk.reserved_bytes / GIB:,.1f} GiB",
                  "torch max_memory_reserved", delta_color="off", delta_arrow="off",
                  help="Allocated plus the caching allocator's reserve")
        m3.metric("Total", f"{pk.total_bytes / GIB:,.1f} GiB", "as nvidia-smi shows", delta_color="off",
                  delta_arrow="off", help="Reserved plus NCCL buffers and the CUDA context")
        if pk.offloaded_bytes:   # activation offloading: the bytes held in host memory, not in any bar above
            st.caption(f"Offloaded to host memory: {pk.offloaded_bytes / GIB:.3g} GiB, the saved activations of "
                       f"{layout.offload_activations} layers per stage (one layer's stays on the GPU as the copy in "
                       "flight, in buffers); they cross the host link after each forward and back before the "
                       "backward (breakdown: offload_comm, the part the neighbouring layer's compute does not hide).")
        wide = stages.pivot_table(index="stage", columns="part", values="gib", aggfunc="sum")
        wide = wide[[p for p in charts.MEMORY_ORDER if p in wide.columns]]
        wide["total"] = wide.sum(axis=1)
        views.table(wide.reset_index(), "memory_per_stage", "t_mem",
                    column_config={c: st.column_config.NumberColumn(format="%.3g") for c in wide.columns})

if t_data.open:
    with t_data:
        st.markdown(views.PROVENANCE_HELP)
        for k, v in data.backing(key).items():
            st.markdown(f"- **{k.replace('_', ' ')}**: {v}")
        by = (pred.ops[pred.ops["seconds_total"] > 0].groupby(["op", "pass", "provenance"], as_index=False)
              .agg(seconds=("seconds_total", "sum"), cv_mape=("cv_mape", "first"))
              .sort_values("seconds", ascending=False))
        views.table(by, "provenance_by_op", "t_prov",
                    column_config={"cv_mape": st.column_config.NumberColumn("CV MAPE", format="percent"),
                                   "seconds": st.column_config.NumberColumn(format="%.4g")})

if t_export.open:
    with t_export:
        views.share_hint()
        st.download_button("Prediction (JSON)", views.to_json(pred.to_dict()).encode(), "prediction.json",
                           "application/json", key="x_pred", icon=":material/download:", on_click="ignore")
        st.caption("Every operator and collective call behind the prediction:")
        views.table(pred.ops, "operator_calls", "t_calls", height=300)

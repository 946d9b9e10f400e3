"""Samples: the measured operator / collective samples in the store, with the regressor's curve over them."""
import pandas as pd
import streamlit as st

from predictor.hardware.platforms import load_platforms
from predictor.model.ops import COLLECTIVES, OPS, SHAPE_COLUMNS
from predictor_ui import charts, config, data, fmt, urlcheck, views
from predictor_ui.curves import regressor_over_samples

views.page_setup()

st.title("Samples")
ok, msg = data.store_status()
if not ok:
    views.store_missing(msg)
    st.stop()
try:
    summary = data.store_summary()
except data.StoreMissing as e:
    views.store_missing(str(e))
    st.stop()

samples = summary[summary["kind"].isin(["op", "collective"])]
if samples.empty:
    st.info("The store has no operator or collective samples yet: ingest some on **Calibrate**, or run\n\n"
            f"```bash\n{config.STORE_HINT}\n```", icon=":material/database:")
    st.stop()

c1, c2, c3 = urlcheck.guard().columns(3)
plats = sorted(samples["platform"].unique())
# start on a platform with operator samples (the Predict default when it has some)
with_ops = sorted(samples[samples["kind"] == "op"]["platform"].unique())
first = "perlmutter-a100" if "perlmutter-a100" in with_ops else (with_ops[0] if with_ops else plats[0])
platform = c1.selectbox("Platform", plats, index=plats.index(first), key="s_platform", bind="query-params")
ps = samples[samples["platform"] == platform]
names = sorted(ps["op"].unique(), key=lambda n: (n in COLLECTIVES, n))
name = c2.selectbox("Operator or collective", names, key="s_op", bind="query-params",
                    help=f"Collectives: {', '.join(c for c in names if c in COLLECTIVES) or 'none'}")
is_coll = name in COLLECTIVES
if not is_coll:
    passes = sorted(ps[ps["op"] == name]["pass"].dropna().unique())
    pass_ = c3.selectbox("Pass", passes, key="s_pass", bind="query-params")
    df = data.op_samples(platform, name, pass_)
    shape_cols = [c for c in SHAPE_COLUMNS if c in df and df[c].notna().any()]
    if name in OPS:
        st.caption(OPS[name].description.replace("*", "·"))
else:
    pass_ = None
    df = data.collective_samples(platform, name)
    shape_cols = [c for c in ("message_bytes", "ranks", "nodes", "gpus_per_node") if c in df and df[c].notna().any()]

if df.empty:
    st.info("No samples for this choice.")
    st.stop()

# ---- slice: fix the other shape columns, choose the x axis
varying = [c for c in shape_cols if df[c].nunique() > 1]
default_x = "message_bytes" if is_coll else next((c for c in ("seq", "batch", "hidden") if c in varying),
                                                 varying[0] if varying else shape_cols[0])
x_opts = varying or shape_cols
x = st.segmented_control("x axis", x_opts, default=default_x if default_x in x_opts else x_opts[0], key="s_x",
                         required=True)
others = [c for c in varying if c != x]
fixed: dict[str, object] = {}
if others:
    st.caption("The regressor's curve is drawn for one slice: the value of every other shape column (by default "
               "the most common one). Samples on the slice are drawn solid, the rest faint.")
    fcols = st.columns(min(6, len(others)))
    mask = pd.Series(True, index=df.index)
    for i, col in enumerate(others):
        vals = sorted(df.loc[mask, col].dropna().unique().tolist())
        if not vals:
            continue
        mode = df.loc[mask, col].mode()
        default = mode.iloc[0] if len(mode) else vals[0]
        opts = vals
        v = fcols[i % len(fcols)].selectbox(col, opts, index=opts.index(default), key=f"s_fix_{col}")
        fixed[col] = v
        mask &= df[col] == v
    on_slice = mask
else:
    on_slice = pd.Series(True, index=df.index)

plot = df.copy()
plot["on_slice"] = on_slice.values
x_vals = plot.loc[plot["on_slice"], x] if plot["on_slice"].any() else plot[x]
xs = charts.sweep(float(x_vals.min()), float(x_vals.max()), integer=True)

# ---- the regressor's curve over the slice
curve = None
plat_obj = data.resolve_platform(platform) if platform in load_platforms(config.clusters_file_arg()) else None
bank = data.bank(platform) if plat_obj is not None else None
precision = str(df["dtype"].mode().iloc[0]) if "dtype" in df and df["dtype"].notna().any() else "fp16"
note = ""
if plat_obj is None:
    note = f"Platform '{platform}' is not in the catalog, so there is no regressor to draw."
elif bank is None:
    note = (f"No trained regressors for {platform} yet: run `{config.TRAIN_HINT.format(platform=platform)}` "
            "or retrain on **Calibrate**.")
elif len(xs):
    try:
        curve, per_sample, note = regressor_over_samples(
            bank, plat_obj, name, pass_, df, x=x, xs=xs, fixed=fixed, precision=precision)
    except Exception as e:  # noqa: BLE001 - e.g. model files from another predictor version
        views.failed(e, "The regressor's curve", platform)
        curve, per_sample = None, None
    if per_sample is not None:
        plot["predicted_s"] = per_sample.values

st.altair_chart(charts.samples_chart(plot, x, curve=curve, highlight="on_slice"), width="stretch")
if note:
    st.info(note, icon=":material/info:")

m = st.columns(4)
m[0].metric("Samples", f"{len(df):,}", f"{int(on_slice.sum()):,} on the slice", delta_color="off", delta_arrow="off")
m[1].metric("Duration range", f"{fmt.seconds(df['duration_s'].min())} – {fmt.seconds(df['duration_s'].max())}")
if "predicted_s" in plot and plot["predicted_s"].notna().any():
    ape = (plot["predicted_s"] - plot["duration_s"]).abs() / plot["duration_s"]
    m[2].metric("Regressor error, all samples", fmt.pct(float(ape.mean()), 1), "mean absolute % error (in-sample)",
                delta_color="off", delta_arrow="off")
    if on_slice.any():
        m[3].metric("… on the slice", fmt.pct(float(ape[on_slice.values].mean()), 1))
meta = (data.model_metadata(platform).get(f"collective.{name}" if is_coll else f"{name}.{pass_}")
        if plat_obj is not None else None)
if meta:
    st.caption(f"Regressor: {meta.get('n_samples', '?')} samples, {meta.get('n_outliers_removed', 0)} removed as "
               f"outliers; cross-validated MAPE {fmt.pct(meta.get('cv_mape'), 1)} (see **Accuracy**).")

with st.expander(f"The {len(df):,} samples", expanded=False):
    cols = [c for c in [*shape_cols, "variant", "dtype", "duration_s", "predicted_s", "source"] if c in plot]
    views.table(plot[cols].head(5000), f"samples_{platform}_{name}{'_' + pass_ if pass_ else ''}", "s_table",
                height=320)
    if len(plot) > 5000:
        st.caption(f"First 5,000 of {len(plot):,} rows shown; the downloads hold them too (first 5,000).")

"""Calibrate: upload samples from bench (Parquet / CSV), validate, ingest, retrain, see the platform appear."""
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd
import streamlit as st

from predictor.hardware.platforms import load_devices, load_platforms, save_cluster
from predictor.model.errors import InfeasibleConfig
from predictor.regress.lgb_import import import_lightgbm
from predictor.samples.formats.files import preview_path
from predictor_ui import config, data, views
from predictor_ui.clusters import DASHBOARD_SOURCE, custom_platform

views.page_setup()

st.title("Calibrate a platform")
st.caption("Bring your own measurements: a few measured training steps calibrate a new platform at once (the first "
           "section below); the Parquet / CSV files `bench/` writes (operator samples, collective samples, or "
           "measured runs) are checked, ingested into the sample store, and the platform's regressors retrained, "
           "after which every page predicts from them.")


def own_runs_section() -> None:
    """Calibrate on your own measured runs (predictor.calibrate.runs): each run before / after, then save as a new
    user platform; the shipped platform is never changed."""
    from predictor.calibrate.runs import calibrate_runs, choice_words, terms_table
    up = st.file_uploader("Measured runs (CSV: the predict-batch columns plus `step_time_s`, `source` optional)",
                          type=["csv"], key="own_runs_file")
    plats = sorted(load_platforms(config.clusters_file_arg()))
    a, b = st.columns(2)
    base = a.selectbox("Measured on (the platform the runs start from)", plats, key="own_base",
                       index=plats.index("dgx-a100-80gb") if "dgx-a100-80gb" in plats else 0)
    new = b.text_input("Save as (a new platform name)", key="own_new", placeholder="e.g. my-a100-cluster")
    if up is None:
        st.caption("One row per measured run; a few runs are enough to move the terms they can tell (the table "
                   "below says which), the rest stay at the base platform's.")
        return
    kw = {"models_dir": config.models_dir_arg(), "clusters": config.clusters_file()}
    sig = (up.name, up.size, base)
    if st.button("Fit on these runs (nothing saved)", key="own_fit", icon=":material/tune:") or (
            st.session_state.get("own_sig") == sig and st.session_state.get("own_cal") is not None):
        if st.session_state.get("own_sig") != sig or st.session_state.get("own_cal") is None:
            try:
                with st.spinner("fitting and scoring leave-one-run-out..."):
                    st.session_state["own_cal"] = calibrate_runs(up.getvalue(), base, None, save=False, **kw)
                st.session_state["own_sig"] = sig
            except InfeasibleConfig as e:
                st.session_state["own_cal"] = None
                views.infeasible(e)
                return
        cal = st.session_state["own_cal"]
        rec = cal.record
        t = cal.table[["line", "source", "model", "gpus", "layout", "measured_s", "before_s", "after_s", "held_out_s",
                       "before_error", "after_error", "held_out_error"]]
        st.markdown(f"**Each run**: measured, predicted by **{base}** as it is (before), by the calibrated terms "
                    "(after) and by terms fitted without that run (held out: what to expect on a run you did not "
                    "give).")
        seconds = {"measured_s": "measured s", "before_s": f"{base} s", "after_s": "after s",
                   "held_out_s": "held out s"}
        errors = {"before_error": "before", "after_error": "after", "held_out_error": "held out"}
        views.table(t, "own_runs", "own_table",
                    column_config={**{c: st.column_config.NumberColumn(label, format="%.4g")
                                      for c, label in seconds.items()},
                                   **{c: st.column_config.NumberColumn(label, format="%+.1f%%")
                                      for c, label in errors.items()}},
                    shown=t.assign(**{c: 100.0 * t[c] for c in errors}))
        chose = choice_words(rec, base)
        st.markdown("**The terms**: the base's value (prior), the fitted one, and whether the runs identified it "
                    "(halved its prior uncertainty; sd in log units)." + (f" {chose[0].upper()}{chose[1:]}." if chose
                                                                          else ""))
        tt = terms_table(cal.fits)
        views.table(tt, "own_terms", "own_terms_table",
                    shown=tt.assign(prior=tt["prior"].map("{:.4g}".format), fitted=tt["fitted"].map("{:.4g}".format),
                                    prior_sd=tt["prior_sd"].map("{:.2f}".format),
                                    posterior_sd=tt["posterior_sd"].map("{:.2f}".format)))
        held = rec["held_out_mape"]
        st.markdown(f"MAPE before {rec['before_mape']:.1%} (mean signed {rec['before_mean_signed']:+.1%}), after "
                    f"{rec['in_sample_mape']:.1%} in-sample; "
                    + (f"**held out {held:.1%}** (each run predicted by terms fitted without it)" if held is not None
                       else "one run: no held-out error"))
        if st.button(f"Save as {new or '...'}", key="own_save", type="primary", disabled=not new.strip(),
                     icon=":material/save:"):
            try:
                saved = calibrate_runs(up.getvalue(), base, new.strip(), save=True, **kw)
            except InfeasibleConfig as e:
                views.infeasible(e)
                return
            data.clear_all()
            st.success(f"Saved **{saved.new}** (calibrated on {rec['runs']} of your runs; {base} is unchanged): "
                       f"`{saved.clusters_path}`, `{saved.terms_path}`.", icon=":material/check_circle:")
            st.page_link("pages/predict.py", label=f"Predict on {saved.new}", icon=":material/speed:",
                         query_params={"platform": saved.new})


with st.expander("Calibrate on your own runs: a new platform, the shipped one unchanged",
                 expanded=st.session_state.get("own_runs_file") is not None):
    own_runs_section()

store = config.store_path()
exists = store.exists()
st.markdown(f"Sample store: `{store}`" + ("" if exists else " (does not exist yet: the first ingest creates it)"))
if not exists:
    st.caption(f"To start from the published samples instead: `{config.STORE_HINT}`")

# ---------------------------------------------------------------- 1. upload
st.subheader("1 · Upload")
files = st.file_uploader("Sample files (Parquet or CSV)", type=["parquet", "csv"], accept_multiple_files=True,
                         key="cal_files")
platform_override = st.text_input("Platform id for files that do not name one (optional)", key="cal_platform",
                                  placeholder="e.g. my-h100-cluster")
if not files:
    st.info("Drop one or more files above. Operator samples need the columns "
            "`platform, op, pass, tp, batch, seq, hidden, heads, ..., duration_s` (see docs/architecture.md); "
            "collective samples `platform, collective, message_bytes, ranks, nodes, gpus_per_node, duration_s`; "
            "measured runs the predict-batch columns plus `step_time_s`.", icon=":material/upload_file:")
    st.stop()

upload_sig = tuple((f.name, f.size) for f in files) + (platform_override,)
if st.session_state.get("cal_sig") != upload_sig:
    # a new selection of files: fresh temp dir, forget the previous steps
    old = st.session_state.get("cal_dir")
    if old:
        shutil.rmtree(old, ignore_errors=True)
    d = Path(tempfile.mkdtemp(prefix="planner-upload-"))
    for f in files:
        (d / Path(f.name).name).write_bytes(f.getvalue())
    st.session_state.update(cal_sig=upload_sig, cal_dir=str(d), cal_ingested=None, cal_trained=None)
updir = Path(st.session_state["cal_dir"])

# ---------------------------------------------------------------- 2. validate
st.subheader("2 · Validate")
preview = preview_path(updir, platform_override.strip() or None)
views.table(preview, "upload_check", "cal_preview")
good = preview[preview["status"] == "ok"] if "status" in preview else preview.iloc[0:0]
bad = preview[preview["status"] != "ok"] if "status" in preview else preview
for r in bad.itertuples():
    st.warning(f"**{r.file}** will not be ingested: {r.message or r.status}", icon=":material/warning:")
if good.empty:
    st.stop()
platforms_in = sorted({p.strip() for v in good["platform"] for p in str(v).split(",") if p.strip()})
if not platforms_in:
    st.warning("These files do not say which platform they were measured on. **How to fix:** enter the platform "
               "id above.", icon=":material/warning:")
    st.stop()
st.success(f"{int(good['rows'].sum()):,} rows ready for platform(s) {', '.join(platforms_in)} "
           f"({int(good['rows_rejected'].sum()):,} rows rejected).", icon=":material/check_circle:")

# ---------------------------------------------------------------- 3. ingest
st.subheader("3 · Ingest")
if st.button("Ingest into the store", type="primary", key="cal_ingest", icon=":material/database:"):
    bar = st.progress(0.0, text="ingesting...")

    def prog(done: int, total: int, msg: str) -> None:
        bar.progress(min(1.0, done / max(total, 1)), text=msg)
    try:
        from predictor.samples.store import ingest_path
        rep = ingest_path(updir, platform=platform_override.strip() or None, progress=prog)
    except Exception as e:  # noqa: BLE001 - the store's own message (locked, unreadable) is the answer
        st.error(f"Ingest failed: {e}", icon=":material/error:")
        st.stop()
    st.session_state["cal_ingested"] = rep.to_text()
    data.clear_all()
if st.session_state.get("cal_ingested"):
    st.code(st.session_state["cal_ingested"], language=None)
else:
    st.stop()

# ---------------------------------------------------------------- 4. retrain
st.subheader("4 · Retrain")
catalog = load_platforms(config.clusters_file_arg())
known = [p for p in platforms_in if p in catalog]
unknown = [p for p in platforms_in if p not in catalog]
for pid in unknown:
    with st.form(f"cluster_{pid}"):
        st.markdown(f"**{pid}** is not in the platform catalog yet. Describe its cluster so the planner can "
                    "predict for it (saved to your clusters file "
                    f"`{config.clusters_file()}`):")
        devs = load_devices()
        ids = sorted(devs)
        a, b, c = st.columns(3)
        dev = a.selectbox("Device", ids, format_func=lambda x, devs=devs: devs[x].name, key=f"cal_dev_{pid}")
        gpn = b.number_input("GPUs per node", 1, 72, 8, key=f"cal_gpn_{pid}")
        intra = c.number_input("Intra-node GB/s per GPU", 0.0, 5000.0, 450.0, key=f"cal_intra_{pid}")
        inter = a.number_input("Inter-node GB/s per GPU", 0.1, 1000.0, 50.0, key=f"cal_inter_{pid}")
        if st.form_submit_button("Save cluster", icon=":material/save:"):
            try:
                p = custom_platform({"c_name": pid, "c_device": dev, "c_gpn": gpn, "c_intra_bw": intra,
                                     "c_inter_bw": inter, "c_models": pid})
            except InfeasibleConfig as e:
                views.infeasible(e)
            else:  # its own samples back its collectives too
                save_cluster(config.clusters_file(), replace(p, collective_models=pid), DASHBOARD_SOURCE)
                data.clear_all()
                st.rerun()
if not known:
    st.info("Save the cluster description above, then retrain.", icon=":material/info:")
    st.stop()

folds = st.select_slider("Cross-validation folds", [0, 2, 3, 5], value=3, key="cal_folds",
                         help="0 skips cross-validation (faster; no error estimate per operator)")
if st.button(f"Retrain {', '.join(known)}", type="primary", key="cal_train", icon=":material/model_training:"):
    results = []
    for pid in known:
        bar = st.progress(0.0, text=f"training {pid}...")

        def prog(done: int, total: int, msg: str, _bar=bar) -> None:
            _bar.progress(min(1.0, done / max(total, 1)), text=msg)
        try:
            import_lightgbm()
            from predictor.calibrate.training import train_platform
            rep = train_platform(pid, models_dir=config.models_dir_arg(), progress=prog, cv_folds=int(folds))
        except (InfeasibleConfig, ValueError) as e:
            hint = ""
            if pid not in load_platforms(None):
                hint = (f" **{pid}** is only in your clusters file (`{config.clusters_file()}`), and training in "
                        "this build looks platforms up in the built-in catalog only: add the entry to "
                        "`predictor/catalog/clusters.json`, then retrain.")
            st.error(f"Training {pid} failed: {e}.{hint}", icon=":material/error:")
            continue
        bar.progress(1.0, text=f"{pid}: trained {len(rep)} models")
        results.append(rep.assign(platform=pid))
    if results:
        st.session_state["cal_trained"] = pd.concat(results, ignore_index=True)
    data.clear_all()
trained = st.session_state.get("cal_trained")
if trained is None:
    st.stop()
views.table(trained, "training_report", "cal_report",
            column_config={c: st.column_config.NumberColumn(format="percent")
                           for c in ("cv_mape", "cv_median_ape", "cv_mape_clean", "mape_all_rows", "paper_best_error")})

# ---------------------------------------------------------------- 5. result
st.subheader("5 · The platform now")
rows = []
for pid in known:
    try:
        b = data.backing(pid)
    except InfeasibleConfig as e:
        views.infeasible(e)
        continue
    rows.append({"platform": pid, **b})
    st.page_link("pages/predict.py", label=f"Predict on {pid}", icon=":material/speed:",
                 query_params={"platform": pid})
if rows:
    views.table(pd.DataFrame(rows), "platform_backing", "cal_now")

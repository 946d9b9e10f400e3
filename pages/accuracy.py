"""Accuracy: how far to trust each platform, per operator (cross-validation) and end to end."""
import io

import pandas as pd
import streamlit as st

from predictor import paths
from predictor.checks.validate import mark_unmodelled_host, save_validation, summarize_validation
from predictor.model.layout_io import BATCH_COLUMNS
from predictor.paths import ArtifactError
from predictor.step.terms import contention_words, spread_in_words
from predictor_ui import charts, config, data, fmt, urlcheck, views

views.page_setup()

st.title("Accuracy")
st.caption("How far to trust each platform: the operator regressors' cross-validated error, every measured "
           "training run in the store predicted against its measured step time, the network calibration "
           "against measured NCCL sweeps, and your own runs.")

t_e2e, t_ops, t_net, t_mine = urlcheck.guard().tabs(["End to end (measured runs)", "Operators", "Network", "Your runs"],
                                      key="acc_view", on_change="rerun", bind="query-params")

COLS_CFG = {"mape": st.column_config.NumberColumn("MAPE", format="percent"),
            "median_ape": st.column_config.NumberColumn("median error", format="percent"),
            "p90_ape": st.column_config.NumberColumn("p90 error", format="percent"),
            "worst_ape": st.column_config.NumberColumn("worst error", format="percent"),
            "mean_signed": st.column_config.NumberColumn("mean signed", format="percent"),
            "within_10pct": st.column_config.NumberColumn("within 10 %", format="percent"),
            "ape": st.column_config.NumberColumn("error", format="percent"),
            "signed_error": st.column_config.NumberColumn("signed", format="percent"),
            "measured_s": st.column_config.NumberColumn("measured s", format="%.4g"),
            "predicted_s": st.column_config.NumberColumn("predicted s", format="%.4g"),
            "pred_host_overhead_s": st.column_config.NumberColumn("host overhead s", format="%.3g")}
RUN_COLS = ["run_id", "case_id", "platform", "arch", "layers", "hidden", "heads", "seq_len", "num_gpus", "tp", "pp",
            "dp", "micro_batch", "global_batch", "schedule", "recompute", "measured_s", "predicted_s", "ape",
            "signed_error", "provenance", "error"]


def show_results(res: pd.DataFrame, name: str, key: str) -> None:
    summ = summarize_validation(res)
    if not summ.empty:
        views.table(summ, f"{name}_summary", f"{key}_summary", column_config=COLS_CFG)
    a, b = st.columns([3, 2])
    with a:
        st.altair_chart(charts.accuracy_scatter(res), width="stretch")
        st.caption("Each dot is one run; on the line = exact; the green band is ± 20 %.")
    with b:
        st.altair_chart(charts.error_hist(res), width="stretch")
        st.caption("Below zero: the prediction is faster than the measurement.")
    st.markdown("**Per run** (worst first)")
    shown = mark_unmodelled_host(res).sort_values("ape", ascending=False, na_position="first")
    cols = [c for c in RUN_COLS if c in shown]
    if "pred_host_overhead_s" in shown and shown["pred_host_overhead_s"].notna().any():
        cols.insert(cols.index("predicted_s") + 1, "pred_host_overhead_s")
        st.caption("*host overhead s*: the fitted host / framework overhead within the predicted step time "
                   "(empty where the platform has no fitted host overhead: not modelled).")
    views.table(shown[cols], f"{name}_runs", f"{key}_runs", height=320, column_config=COLS_CFG)


SOURCE_COLS_CFG = {
    "runs": st.column_config.NumberColumn("runs"),
    **{f"{w}_{k}": st.column_config.NumberColumn(f"{label} {what}", format="percent")
       for w, label in (("in_sample", "in-sample"), ("held_out", "held-out"))
       for k, what in (("mape", "MAPE"), ("median_ape", "median"), ("worst_ape", "worst"),
                       ("mean_signed", "signed"))},
    "measured_mfu": st.column_config.NumberColumn("measured MFU", format="percent"),
    "held_out_mfu_gap_points": st.column_config.NumberColumn("held-out MFU gap (points)", format="%.1f"),
    "held_out_mfu_signed_points": st.column_config.NumberColumn("held-out MFU signed (points)", format="%.1f"),
    "runs_shape_flagged": st.column_config.NumberColumn(
        "runs with unaligned GEMMs", help="GEMM dimensions not in multiples of 8 elements: outside the sampled "
                                          "shapes; predictions with such shapes charge those GEMMs at no more than "
                                          "the FP32 peak, warn and widen their error band"),
    "held_out_mape_unflagged": st.column_config.NumberColumn("held-out MAPE, aligned runs", format="percent"),
    "held_out_mean_signed_unflagged": st.column_config.NumberColumn("held-out signed, aligned runs",
                                                                    format="percent"),
    "skipped_at_fit": st.column_config.NumberColumn("runs not composed"),
    "skipped_at_ingest": st.column_config.NumberColumn("rows skipped at ingest"),
    "skipped_why": st.column_config.TextColumn("why skipped at ingest"),
}


def terms_by_source(table: pd.DataFrame, pooled: dict, warning: str | None) -> None:
    """The end-to-end terms' leave-one-source-out validation (framework_terms.json), one row per source."""
    if warning:
        st.warning(warning, icon=":material/warning:")
    if table.empty:
        return
    st.subheader("End-to-end accuracy per source: in-sample vs source-held-out")
    runs = sum(int(v) for v in (pooled.get("fitted_on") or {}).values())
    held = (f" Pooled over the sources (each weighted equally): held-out MAPE {fmt.pct(pooled['held_out_mape'], 1)}, "
            f"in-sample {fmt.pct(pooled.get('in_sample_mape'), 1)}." if pooled.get("held_out_mape") is not None
            else "")
    beta = float(pooled.get("power_factor") or 0.0)
    form = (f"no tensor-core kernel faster than the achievable matmul rate / {1 + beta:.2f} over a sustained step"
            if pooled.get("power_form") == "cap"
            else f"{beta:.3f} x tensor-core FLOPs / achievable matmul rate added to each kernel")
    contention = contention_words(float(pooled.get("contention") or 0.0))
    spread = spread_in_words(float(pooled.get("speed_spread") or 0.0),
                             fitted=bool(pooled.get("speed_spread_fitted", True)))
    st.markdown(f"The end-to-end terms (compute factor; power factor: {form}; {contention}; {spread}; host time per "
                "framework) "
                f"were fitted on {runs:,} measured GPU runs of {len(table)} sources (runs with GEMM dimensions not in "
                "multiples of 8 are scored, not fitted on); each **held-out** number comes "
                "from a refit without that source, so it is how far to trust the terms on a framework or cluster "
                f"they have not seen. *Signed*: below zero, the prediction is faster than the measurement.{held}")
    views.table(table, "end_to_end_per_source", "e2e_sources", column_config=SOURCE_COLS_CFG)
    notes = []
    shape = pooled.get("shape_flagged")
    if isinstance(shape, dict) and shape.get("runs"):
        notes.append(f"{int(shape['runs'])} runs have GEMM dimensions not in multiples of 8 (outside the sampled "
                     "shapes; those GEMMs are charged at no more than the GPU's FP32 non-tensor-core peak, a "
                     f"spec-sheet bound): held out they were {fmt.pct(shape['held_out_mape'], 1)} off (signed "
                     f"{shape['held_out_mean_signed']:+.1%}); a prediction with such shapes warns and carries that "
                     "error in its band.")
    bins = [b for b in (pooled.get("by_host_share") or []) if isinstance(b, dict) and b.get("runs")]
    if bins:
        notes.append("Held out by the share of a run's work that is framework host time (a prediction's band takes "
                     "its own share's figure): " + "; ".join(
                         f"{b['from']:.0%}-{b['to']:.0%}: {fmt.pct(b['held_out_mape'], 1)} (signed "
                         f"{b['held_out_mean_signed']:+.1%}) over {int(b['runs']):,} runs" for b in bins) + ".")
    floor, floor_warning = data.host_floor_words()
    if floor_warning:
        st.warning(floor_warning, icon=":material/warning:")
    if floor:
        notes.append(f"Host time per layer pass of every eager framework is bounded below by a floor measured on a "
                     f"CPU ({floor}; `python -m bench host-floor`): where no run identifies the host (long kernels "
                     "hide it) the fit rests there, not at zero.")
    if notes:
        st.caption(" ".join(notes))


IND_COLS_CFG = {
    **{k: st.column_config.NumberColumn(label, format="percent") for k, label in (
        ("mape", "MAPE"), ("median_ape", "median"), ("worst_ape", "worst"), ("mean_signed", "mean signed"),
        ("published_mfu", "published MFU"), ("predicted_mfu", "predicted MFU"))},
    "not_fitting": st.column_config.NumberColumn("our memory model: does not fit"),
    "tight": st.column_config.NumberColumn("our memory model: tight", help="Fits only with the least allocator "
                                           "reserve published runs show"),
    "signed_error": st.column_config.NumberColumn("signed", format="percent"),
    "measured_s": st.column_config.NumberColumn("published s", format="%.4g"),
    "predicted_s": st.column_config.NumberColumn("predicted s", format="%.4g"),
    "memory_gib": st.column_config.NumberColumn("memory GiB", format="%.1f"),
}


def independent_check() -> None:
    """Published runs never ingested nor fitted to (predictor/catalog/independent_runs.json)."""
    st.subheader("Independent check: published runs never fitted to")
    try:
        sources = data.independent_sources()
    except Exception as e:  # noqa: BLE001 - a bad catalog: the rest of the page stays up
        views.failed(e, "The independent check", "dgx-h100")
        return
    for source_id in sources:
        independent_source(source_id)


# what the platform's operator times rest on (predictor.plan.backing.describe_backing's kind), in the page's words
BACKING_WORDS = {
    "measured + transferred": "whose GEMMs and attention are measured on this GPU (published kernel tables) and whose "
                              "other operators are transferred from another GPU's samples",
    "measured": "whose operators were sampled on this GPU",
    "transferred": "whose operators were never sampled on it (transferred from another GPU's samples)",
    "analytical": "whose operators are analytical (no samples)",
}


def independent_source(source_id: str) -> None:
    try:
        runs, overall, by_nodes, src = data.independent_check(source_id)
    except Exception as e:  # noqa: BLE001 - a bad catalog or models: the rest of the page stays up
        views.failed(e, f"The independent check {source_id}", "dgx-h100")
        return
    mfu_basis = {"fp8": " MFU here is against the FP8 peak, as the source computes it."}.get(
        str(src.get("peak_flops_basis", "")), "")
    dropped = "; ".join(f"{n} dropped: {why}" for why, n in src["dropped"].items()) or "none dropped"
    plat = str(runs["platform"].iloc[0])
    try:
        backed = BACKING_WORDS.get(data.backing_kind(plat), "whose operator backing is not known")
    except Exception:  # noqa: BLE001 - the words only; the check itself is already computed
        backed = "whose operator backing could not be read"
    st.markdown(f"{src['description']} ({len(runs)} runs; {dropped}), predicted on **{plat}**, "
                f"{backed}. "
                "These runs are never ingested and no term is fitted on them: this is how far the planner holds on "
                "runs it has never seen. "
                f"Source: {src['document']} ({src['licence']}). *Signed*: below zero, the prediction is faster "
                f"than the published step.{mfu_basis}")
    table = pd.concat([overall, by_nodes], ignore_index=True)
    views.table(table, f"independent_{source_id}_summary", f"ind_summary_{source_id}", column_config=IND_COLS_CFG)
    with st.expander(f"Every run ({source_id})"):
        cols = ["model", "seq_len", "gpus", "micro_batch", "global_batch", "activation_checkpointing",
                "measured_s", "predicted_s", "signed_error", "published_mfu", "predicted_mfu", "memory_gib", "fits"]
        views.table(runs[cols], f"independent_{source_id}_runs", f"ind_runs_{source_id}", height=320,
                    column_config=IND_COLS_CFG)
    if src.get("reference"):
        independent_speedups(source_id, src["reference"])


SPEEDUP_COLS_CFG = {
    "measured_speedup": st.column_config.NumberColumn("measured speed-up", format="%.2f x"),
    "predicted_speedup": st.column_config.NumberColumn("predicted speed-up", format="%.2f x"),
    "speedup_error": st.column_config.NumberColumn("speed-up error", format="percent"),
    "reference_signed_error": st.column_config.NumberColumn("reference run, signed", format="percent"),
    "signed_error": st.column_config.NumberColumn("this run, signed", format="percent"),
}


def independent_speedups(source_id: str, ref: dict) -> None:
    """How much of the independent error is the transfer: speed-up over the reference GPU, measured vs predicted."""
    try:
        pairs, overall, by_seq = data.independent_speedups(source_id)
    except Exception as e:  # noqa: BLE001 - no store or models: the rest of the page stays up
        views.failed(e, f"The speed-up check {source_id}", ref["platform"])
        return
    if pairs.empty:
        st.caption(f"No speed-up check: the store holds no {ref['source_id']} runs on {ref['platform']}.")
        return
    with st.expander(f"Where the error comes from: speed-up over {ref['platform']} ({len(pairs)} runs)"):
        o = overall.iloc[0]
        where = ("the transfer to the unsampled GPU, not what the product gets wrong on the sampled one"
                 if abs(o["speedup_error"]) > abs(o["reference_signed_error"]) else
                 "what the product gets wrong on the sampled GPU too, not the transfer")
        st.markdown(
            f"Each run beside the run of the same model, sequence length, GPU count, micro-batch and checkpointing "
            f"on **{ref['platform']}** (store source `{ref['source_id']}`, fitted on). A run's error is the "
            "reference run's error times the speed-up's: (1 + error) = (1 + reference error) x measured / predicted "
            f"speed-up. Measured speed-up {o['measured_speedup']:.2f}x, predicted {o['predicted_speedup']:.2f}x "
            f"({o['speedup_error']:+.1%}); the reference runs' mean signed error is {o['reference_signed_error']:+.1%}"
            f", so the error here is mostly {where}.")
        cfg = {**SPEEDUP_COLS_CFG, "group": st.column_config.TextColumn("sequence length")}
        views.table(by_seq, f"independent_{source_id}_speedups", f"ind_speedup_{source_id}", column_config=cfg)


def nemo_check() -> None:
    """NVIDIA's published NeMo / Megatron-Core runs (predictor/catalog/independent_nemo.json), never fitted to."""
    st.subheader("Independent check: NVIDIA NeMo / Megatron-Core published runs")
    try:
        runs, groups, dropped = data.nemo_check()
    except Exception as e:  # noqa: BLE001 - a bad catalog or models: the rest of the page stays up
        views.failed(e, "The NeMo / Megatron-Core check", "dgx-h100")
        return
    why = "; ".join(f"{n} {r}" for r, n in dropped.items()) or "none"
    st.markdown(f"{len(runs)} published runs of Llama 3 / 3.1, GPT-3, Qwen3 (dense and MoE) and Mixtral on H100, "
                "B200 and GB200 (FP8 and BF16, with tensor, pipeline, virtual-pipeline, context and expert "
                "parallelism), from NVIDIA's NeMo performance summaries and Megatron-Bridge tables "
                "(`predictor/catalog/independent_nemo.json`, each source with its document). Never ingested, "
                "nothing fitted on them; the layout details the tables do not print are assumed (no "
                "recomputation, distributed optimizer, NeMo's overlap of the data- and tensor-parallel traffic "
                "(NeMo's communication-overlap document), bf16 gradient reduction and FP8 primary weights where "
                "the recipes' scripts set them, NCCL NVLS off as their launchers set it, modelled expert "
                f"imbalance). Rows dropped before predicting: {why}. *Signed*: below zero, the prediction is "
                "faster than the published step.")
    table = pd.concat([g.assign(by=k) for k, g in groups.items()], ignore_index=True)
    cols = ["by", "group", "runs", "predicted", "mape", "median_ape", "worst_ape", "mean_signed", "not_fitting",
            "tight"]
    views.table(table[cols], "independent_nemo_summary", "ind_summary_nemo", column_config=IND_COLS_CFG)
    with st.expander("Every run (NeMo / Megatron-Core)"):
        rcols = [c for c in ("source", "system", "model", "gpus", "precision", "tp", "pp", "cp", "vp", "ep",
                             "measured_s", "predicted_s", "signed_error", "memory_gib", "fits", "error")
                 if c in runs.columns]
        views.table(runs[rcols], "independent_nemo_runs", "ind_runs_nemo", height=320, column_config=IND_COLS_CFG)


def memory_check() -> None:
    """Published per-GPU memory (predictor/catalog/published_memory.json) against the memory model, never fitted."""
    st.subheader("Memory: published per-GPU figures against the memory model")
    try:
        d = data.memory_check()
    except Exception as e:  # noqa: BLE001 - a bad catalog: the rest of the page stays up
        views.failed(e, "The memory check", "dgx-h100")
        return
    ok = d[d["ours_gib"].notna()]
    if len(ok):
        e = ok["error"].astype(float)
        st.markdown(f"{len(ok)} published figures of Megatron-Core runs (FlagPerf's Llama-3-8B BF16 / FP8 on H100 and "
                    "A800 and an 8-expert MoE on A800; Megatron-Bridge's Qwen3-30B-A3B with EP 16 on H100) compared "
                    "with the memory model for the quantity each one counts "
                    "(*device*: memory in use as nvidia-smi shows it, so our allocated peak + the caching "
                    "allocator's reserve + NCCL buffers + CUDA context; *reserved*; *allocated*): mean |error| "
                    f"{e.abs().mean():.1%}, mean signed {e.mean():+.1%}, worst {e.abs().max():.1%}. Never fitted "
                    "to; the overhead terms come from other documents (NCCL's buffer sizes, published Megatron "
                    "logs' reserved / allocated ratios), cited in `predictor/step/memory.py`.")
    cols = ["id", "platform", "precision", "measures", "published_gib", "ours_gib", "error", "note"]
    d = pd.concat([ok, d[d["ours_gib"].isna()]])   # the compared figures first, then those that cannot be
    views.table(d[cols], "memory_published", "mem_published",
                column_config={"error": st.column_config.NumberColumn(format="percent"),
                               "published_gib": st.column_config.NumberColumn(format="%.1f"),
                               "ours_gib": st.column_config.NumberColumn(format="%.1f")})


AUTO_PREDICT_MAX = 150  # measured runs predicted on load when nothing is saved (about 1 s); more on request
SECONDS_PER_RUN = 0.008  # rough, for the button's estimate


def _progress(bar):
    def prog(done: int, total: int, msg: str) -> None:
        bar.progress(min(1.0, done / max(total, 1)), text=f"{done:,} of {total:,} {msg}")
    return prog


def _predict_runs(plat: str, n: int, recompute: bool) -> pd.DataFrame | None:
    bar = st.progress(0.0, text=f"Predicting {n:,} measured runs on {plat} with the current models...")
    try:
        res = data.validation(plat, progress=_progress(bar), recompute=recompute)
    except Exception as e:  # noqa: BLE001 - e.g. model files from another predictor version
        bar.empty()
        views.failed(e, "Predicting the measured runs", plat)
        return None
    bar.empty()
    return res


if t_e2e.open:
    with t_e2e:
        ok, msg = data.store_status()
        runs = None
        if ok:
            try:
                runs = data.measured_runs()
            except data.StoreMissing as e:
                msg, ok = str(e), False
        counts = runs.groupby("platform").size() if runs is not None and len(runs) else pd.Series(dtype=int)
        saved_plats = data.saved_validation_platforms()
        plats = sorted(set(counts.index) | set(saved_plats))
        if not paths.SHARED_DATASETS.exists():
            st.info(f"The shared datasets ({paths.SHARED_DATASETS}) are not on this machine, so the store holds "
                    "only the project's own CPU samples and runs: the platforms here are the CPU ones (the page "
                    "opens on the one with the most measured runs) and GPU platforms appear only where a saved "
                    "validation ships. Put the datasets at ../shared/datasets and run `bash scripts/setup.sh` to "
                    "validate the GPU platforms against their measured runs.", icon=":material/database:")
        if not plats and not ok:
            views.store_missing(msg)
        elif not plats:
            st.info("No measured runs in the store yet. Ingest some, e.g.\n\n```bash\n.venv/bin/python -m "
                    "predictor ingest ../shared/datasets/vtrain/ground_truth_single.csv\n```\n\nor upload your "
                    "own under **Your runs**.", icon=":material/database:")
        else:
            c1, c2 = urlcheck.guard().columns([3, 2], vertical_alignment="bottom")
            # opens on the platform with the most measured runs (a saved validation breaks ties), not the
            # alphabetically first one; the address bar's ?acc_platform= wins
            first = max(plats, key=lambda p: (int(counts.get(p, 0)), p in saved_plats))
            plat = c1.selectbox("Platform", plats, index=plats.index(first), key="acc_platform",
                                bind="query-params",
                                help="Platforms with measured runs in the store or a saved validation; opens on the "
                                     "one with the most")
            n_store = int(counts.get(plat, 0))
            try:
                saved = data.saved_validation(plat)
            except ArtifactError as e:
                st.warning(str(e), icon=":material/warning:")
                saved = None
            if saved is not None and saved.warning:
                st.warning(saved.warning, icon=":material/warning:")
            go = c2.button("Recompute with the current models", key="acc_recompute", icon=":material/refresh:",
                           disabled=n_store == 0,
                           help=(f"Predict the {n_store:,} measured runs of {plat} again (about "
                                 f"{max(1, round(n_store * SECONDS_PER_RUN))} s)" if n_store else
                                 "Needs the measured runs in the sample store"))
            res, origin = None, ""
            if go:
                res, origin = _predict_runs(plat, n_store, recompute=True), "now"
            elif data.validation_cached(plat):
                res, origin = data.validation(plat), "now"
            elif saved is not None:
                res, origin = saved.runs, "saved"
            elif n_store and n_store <= AUTO_PREDICT_MAX:
                res, origin = _predict_runs(plat, n_store, recompute=False), "now"
            elif n_store:
                st.info(f"No saved validation for **{plat}** yet. **Recompute** predicts its {n_store:,} measured "
                        f"runs (about {max(1, round(n_store * SECONDS_PER_RUN))} s); "
                        f"`.venv/bin/python -m predictor validate --platform {plat} --save` saves them for every "
                        "visitor.", icon=":material/info:")
            if res is not None:
                meta = saved.meta if saved is not None else {}
                if origin == "saved":
                    st.caption(f":material/save: The saved end-to-end validation of **{plat}** "
                               f"({meta.get('validated_at', 'date unknown')}"
                               + (f", {meta['source']}" if meta.get("source") else "")
                               + "), written by `python -m predictor validate --save`. **Recompute** predicts the "
                               "runs again with the current models.")
                    if n_store and n_store != len(res):
                        st.info(f"The store now has {n_store:,} measured runs on {plat}; the saved validation "
                                f"has {len(res):,}. **Recompute** to include them all.", icon=":material/info:")
                else:
                    ok_now = res[res["ape"].notna()] if "ape" in res else res.iloc[0:0]
                    line = f":material/refresh: Predicted now with the current models ({len(res):,} runs)."
                    if meta.get("mape") is not None and len(ok_now):
                        line += (f" Saved validation ({meta.get('validated_at', '?')}): MAPE "
                                 f"{fmt.pct(meta['mape'], 1)}; now {fmt.pct(ok_now['ape'].mean(), 1)}.")
                    st.caption(line)
                    if st.button(f"Save as the validation of {plat}", key="acc_save", icon=":material/save:",
                                 help="Writes validation.json (the expected-error band of its predictions) and "
                                      "validation_runs.csv next to its models, as `predictor validate --save`"):
                        save_validation(plat, res, config.models_dir_arg())
                        config.forget_versions()
                        st.success(f"Saved under `{config.models_dir() / plat}`.", icon=":material/save:")
                ok_res = res[res["ape"].notna()] if "ape" in res else res.iloc[0:0]
                if len(ok_res):
                    m = st.columns(4)
                    m[0].metric("Runs predicted", f"{len(ok_res):,}", f"{len(res) - len(ok_res)} infeasible",
                                delta_color="off", delta_arrow="off", border=True)
                    m[1].metric("Mean abs. error (MAPE)", fmt.pct(ok_res["ape"].mean(), 1), border=True)
                    m[2].metric("Median error", fmt.pct(ok_res["ape"].median(), 1), border=True)
                    m[3].metric("Within 10 %", fmt.pct((ok_res["ape"] <= 0.10).mean()), border=True)
                show_results(res, f"validation_{plat}", "e2e")
        terms_by_source(*data.terms_by_source())
        independent_check()
        nemo_check()
        memory_check()

if t_ops.open:
    with t_ops:
        summ = data.models_summary()
        if not summ.empty and "kind" in summ:  # network calibrations etc. are not regressors
            summ = summ[summ["kind"].isin(["op", "collective"])]
        if summ.empty:
            st.info(f"No trained regressors under `{config.models_dir()}` yet, so every prediction is analytical. "
                    "Train them with\n\n```bash\n.venv/bin/python -m predictor train\n```\n\nor on **Calibrate**.",
                    icon=":material/model_training:")
        else:
            plats = sorted(summ["platform"].unique())
            # default: the platforms sampled on GPUs by the paper (and any other GPU platform), not every CPU set
            gpu_default = [p for p in plats if not p.startswith("cpu-")][:3] or plats[:3]
            sel = st.multiselect("Platforms", plats, default=gpu_default, key="acc_ops_platforms")
            s = summ[summ["platform"].isin(sel)]
            st.altair_chart(charts.op_error_chart(s[s["kind"] == "op"]), width="stretch")
            st.caption("Bars: K-fold cross-validated MAPE of each operator regressor (held-out samples). Black "
                       "ticks: the paper's best published error for the same operator where known.")
            rows = []
            for pid in sel:
                for stem, md in data.model_metadata(pid).items():
                    ext = md.get("extrapolation") or {}
                    rng = md.get("train_ratio_range") or [None, None]
                    rows.append({"platform": pid, "model": stem, "n_samples": md.get("n_samples"),
                                 "n_outliers_removed": md.get("n_outliers_removed"), "cv_mape": md.get("cv_mape"),
                                 "cv_median_ape": md.get("cv_median_ape"), "cv_p90_ape": md.get("cv_p90_ape"),
                                 "cv_mape_clean": md.get("cv_mape_clean"),
                                 "extrapolation_mape": ext.get("mape") if isinstance(ext, dict) else None,
                                 "paper_best_error": md.get("paper_best_error"),
                                 "efficiency_range": (f"{rng[0]:.2g}–{rng[1]:.2g}× roofline"
                                                      if rng and rng[0] is not None else ""),
                                 "warnings": "; ".join(md.get("warnings") or []), "trained_at": md.get("trained_at")})
            detail = pd.DataFrame(rows, columns=["platform", "model", "n_samples", "n_outliers_removed", "cv_mape",
                                                 "cv_median_ape", "cv_p90_ape", "cv_mape_clean", "extrapolation_mape",
                                                 "paper_best_error", "efficiency_range", "warnings", "trained_at"])
            detail = detail.drop(columns=[c for c in ("extrapolation_mape", "paper_best_error", "warnings")
                                          if c in detail and detail[c].replace("", None).isna().all()])
            pct = {c: st.column_config.NumberColumn(c.replace("_", " "), format="percent")
                   for c in ("cv_mape", "cv_median_ape", "cv_p90_ape", "cv_mape_clean", "extrapolation_mape",
                             "paper_best_error")}
            views.table(detail, "operator_accuracy", "ops_acc", height=360, column_config=pct)
            st.markdown("**Extrapolation**: how the regressors do on shapes larger than any they were trained on "
                        "(train on hidden ≤ 6144, seq ≤ 4096, TP < 16; test beyond, per axis and all together).")
            ok_store, _ = data.store_status()
            op_names = sorted({str(m).split(".")[0] for m in detail["model"] if not str(m).startswith("collective")})
            e1, e2, e3 = st.columns([2, 2, 1], vertical_alignment="bottom")
            ext_plat = e1.selectbox("Platform", sel or plats, key="ext_platform")
            ext_op = e2.selectbox("Operator", op_names or ["-"], key="ext_op")
            go = e3.button("Check", key="ext_go", icon=":material/science:", disabled=not (ok_store and op_names),
                           help="Refits this operator's regressors on the small shapes (several seconds)")
            if go:
                try:
                    with st.spinner(f"Refitting {ext_op} on small shapes of {ext_plat}..."):
                        ext = data.extrapolation(ext_plat, ext_op)
                except Exception as e:  # noqa: BLE001 - a failed check must not take the page down
                    views.failed(e, "The extrapolation check", ext_plat)
                else:
                    if ext.empty or not any(c in ext for c in ("hidden", "seq", "tp", "all")):
                        st.info(f"Not enough samples of {ext_op} on {ext_plat} on both sides of the limits.")
                    else:
                        views.table(ext, f"extrapolation_{ext_plat}_{ext_op}", "ext_table",
                                    column_config={c: st.column_config.NumberColumn(c, format="percent")
                                                   for c in ("hidden", "seq", "tp", "all") if c in ext})

NET_COLS_CFG = {"rows": st.column_config.NumberColumn("timings"),
                "dropped": st.column_config.NumberColumn("dropped", help="Rows the calibration drops as physically "
                                                         "impossible or interference (clean_paper)"),
                "median_ape": st.column_config.NumberColumn("median error", format="percent"),
                "mape": st.column_config.NumberColumn("MAPE", format="percent"),
                "mean_signed": st.column_config.NumberColumn("mean signed", format="percent",
                                                             help="(predicted − measured) / measured, averaged: "
                                                                  "below zero the model is faster than measured")}
SWEEPS = ("vTrain's all-reduce lookup table (DGX A100, 2-8 GPUs), the paper's NCCL samples (Perlmutter, Vista) "
          "and stas00/ml-engineering's sweeps (A100 8 GPUs; H200 and B200, incl. B200 on 1 node vs 4 nodes)")


def network_tab() -> None:
    chk = data.network_check()
    for w in chk.warnings:
        st.warning(w, icon=":material/warning:")
    if chk.empty:
        if not chk.shared.is_dir():
            where = (f"They are read from `{chk.shared}`, which is not on this machine. Put the published datasets "
                     "there (`../shared/datasets` next to the checkout) or point `PREDICTOR_SHARED_DATASETS` at them.")
        else:
            where = (f"`{chk.shared}` holds no sweeps of a platform with a saved calibration under "
                     f"`{config.models_dir()}` (`python -m predictor.hardware.network_fit` writes them).")
        st.info(f"The network calibrations (`<models>/<platform>/network.json`) are fitted on measured NCCL "
                f"sweeps: {SWEEPS}. {where}", icon=":material/lan:")
        return
    plats = chk.platform_ids()  # the one with the most measured timings first
    c1, c2 = urlcheck.guard().columns([3, 2], vertical_alignment="bottom")
    plat = c1.selectbox("Platform", sorted(plats), index=sorted(plats).index(plats[0]), key="acc_net_platform",
                        bind="query-params", help="Platforms with a saved network calibration and measured "
                                                  "sweeps; opens on the one with the most timings")
    y = c2.segmented_control("Show", ["busbw", "time"], default="busbw", key="acc_net_y", bind="query-params",
                             format_func=lambda v: {"busbw": "Bus bandwidth", "time": "Time"}[v]) or "busbw"
    row = chk.platforms.set_index("platform").loc[plat]
    pts = chk.points[chk.points["platform"] == plat]
    m = st.columns(4)
    m[0].metric("Measured timings", f"{int(row['points']):,}", border=True)
    m[1].metric("Median error", fmt.pct(row["median_ape"], 1), border=True)
    m[2].metric("MAPE", fmt.pct(row["mape"], 1), border=True)
    m[3].metric("Mean signed error", fmt.pct(row["mean_signed"], 1), border=True,
                help="Positive: the model predicts slower collectives than measured")
    st.altair_chart(charts.network_fit_chart(pts, chk.curves[chk.curves["platform"] == plat], y), width="stretch")
    binned = len(pts) > charts.NETWORK_MAX_POINTS
    st.caption(f"Dots: measured timings of {row['datasets']}"
               + (" (each dot the median of its data set's timings within 1/16 octave of message size)" if binned
                  else "") + f". Lines: the saved calibration `{row['network_file']}` (what predictions use), "
               "NCCL's fastest algorithm/protocol unless the sweep forced one, over each group's measured message "
               "sizes. Colour: collective and nodes x GPUs per node. Bus bandwidth as nccl-tests reports it "
               "(p2p: bytes / time).")
    from predictor.checks.network_check import fabric_note
    note = fabric_note(chk, data.resolve_platform(plat))
    if note:
        st.markdown(f":material/lightbulb: {note}")
    views.table(chk.summary[chk.summary["platform"] == plat].drop(columns="platform"), f"network_fit_{plat}",
                "net_summary", column_config=NET_COLS_CFG)


if t_net.open:
    with t_net:
        network_tab()

if t_mine.open:
    with t_mine:
        st.markdown("Upload measured runs (the `predict-batch` columns plus `step_time_s`, one row per run) and see "
                    "the prediction error at once. Nothing is stored.")
        template = pd.DataFrame([dict.fromkeys(BATCH_COLUMNS, "") | {
            "case_id": "run-1", "platform": "perlmutter-a100", "arch": "llama", "layers": 32, "hidden": 4096,
            "heads": 32, "kv_heads": 32, "ffn_hidden": 11008, "vocab": 32016, "seq_len": 4096, "num_gpus": 16,
            "tp": 2, "pp": 4, "dp": 2, "micro_batch": 4, "global_batch": 64, "schedule": "gpipe",
            "recompute": "full", "precision": "fp16", "step_time_s": 12.5}])
        st.download_button("CSV template", template.to_csv(index=False).encode(), "measured_runs_template.csv",
                           "text/csv", key="tmpl", icon=":material/download:", on_click="ignore")
        up = st.file_uploader("Measured runs (CSV)", type=["csv"], key="runs_upload")
        if up is not None:
            try:
                runs = pd.read_csv(io.BytesIO(up.getvalue()), dtype=str, keep_default_na=False)
            except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
                st.warning(f"Cannot read {up.name} as CSV: {e}", icon=":material/warning:")
                runs = None
            if runs is not None:
                need = ["platform", "step_time_s"]
                missing = [c for c in need if c not in runs]
                if missing or not ({"model"} <= set(runs) or {"arch", "layers", "hidden", "heads"} <= set(runs)):
                    st.warning(f"{up.name} lacks columns {missing or ['arch, layers, hidden, heads (or model)']}. "
                               "**How to fix:** use the template's header (the predict-batch columns plus "
                               "step_time_s).", icon=":material/warning:")
                else:
                    bad = pd.to_numeric(runs["step_time_s"], errors="coerce")
                    if bad.isna().any() or (bad <= 0).any():
                        st.warning(f"{int((bad.isna() | (bad <= 0)).sum())} rows have no positive step_time_s; "
                                   "they are skipped.", icon=":material/warning:")
                    runs = runs[bad.notna() & (bad > 0)]
                    try:
                        with st.spinner(f"Predicting {len(runs)} runs..."):
                            res = data.validate_runs(runs)
                    except Exception as e:  # noqa: BLE001 - e.g. model files from another predictor version
                        views.failed(e, "Predicting your runs")
                        st.stop()
                    n_bad = int(res["ape"].isna().sum()) if "ape" in res else len(res)
                    if n_bad:
                        st.warning(f"{n_bad} of {len(res)} runs could not be predicted; their `error` column says "
                                   "what is wrong and how to fix it.", icon=":material/warning:")
                    if "ape" in res and res["ape"].notna().any():
                        okr = res[res["ape"].notna()]
                        m = st.columns(3)
                        m[0].metric("Your runs", f"{len(okr)}", border=True)
                        m[1].metric("MAPE", fmt.pct(okr["ape"].mean(), 1), border=True)
                        m[2].metric("Mean signed error", fmt.pct(okr["signed_error"].mean(), 1), border=True,
                                    help="Positive: the planner predicts slower than you measured")
                    show_results(res, "my_runs_validation", "mine")

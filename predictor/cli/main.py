"""`python -m predictor ...`: ingest, train, platforms, models, predict, predict-batch, validate."""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from predictor.cli.args import (
    add_cp_offload_args,
    add_ep_arg,
    add_head_dim_arg,
    add_memory_model_args,
    add_mla_args,
    add_moe_args,
    add_moe_parallel_args,
    add_precision_memory_args,
    add_recompute_modules_arg,
    memory_options_from_args,
    model_fields,
)
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import DEFAULTS_DOC, layout_from_fields, model_from_fields
from predictor.model.model_summary import param_summary, routing_summary
from predictor.model.specs import PRECISIONS, SCHEDULE_HELP, SCHEDULES, ZB_SCHEDULES
from predictor.paths import clusters_file_arg
from predictor.plan.batch import predict_rows  # noqa: F401  (re-exported: tests.benchmarks.end_to_end imports it from here)


def _console():
    """Rich console; not on a terminal (a pipe, a file) 200 columns wide, so no line breaks inside a word."""
    from rich.console import Console
    return Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 200)


def _progress_printer(quiet: bool):
    if quiet:
        return None

    def report(done: int, total: int, message: str) -> None:
        print(f"  [{done}/{total}] {message}", file=sys.stderr, flush=True)
    return report


# ---- ingest / train -------------------------------------------------------------------------
def cmd_ingest(a: argparse.Namespace) -> int:
    """All paths in one transaction. Exit 0 when everything found was ingested (or was already
    there), 2 when a file or a row was rejected, when nothing ingestible was found, or when the
    project's own definitions are wrong (then nothing is committed); Ctrl-C exits 130 (main)."""
    import duckdb

    from predictor.samples.formats.common import KINDS, SourceDefinitionError
    from predictor.samples.store import ingest_path
    if a.kind is not None and a.kind not in KINDS:
        print(f"error: unknown --kind {a.kind!r}; use one of {', '.join(KINDS)}", file=sys.stderr)
        return 2
    try:
        rep = ingest_path(a.paths, store_path=a.store, platform=a.platform, kind=a.kind,
                          progress=_progress_printer(a.quiet))
    except duckdb.InterruptException:  # Ctrl-C inside a DuckDB statement: the transaction was rolled back
        raise KeyboardInterrupt from None
    except (SourceDefinitionError, InfeasibleConfig) as e:
        print(f"error: {e}\nnothing was ingested (the store is as it was).", file=sys.stderr)
        return 2
    print(json.dumps(rep.to_dict(), indent=2, default=str) if a.json else rep.to_text())
    return 0 if rep.clean else 2


def cmd_train(a: argparse.Namespace) -> int:
    """Train, then check what was written: every model is saved atomically (.txt, then its .json with
    the .txt's sha256), and the platform's folder is verified as the predictor will load it. Exit 1
    when a model of a trained platform fails that check (each named with the reason)."""
    from predictor.calibrate.training import train_platform
    from predictor.paths import models_dir
    from predictor.regress.regressors import check_models
    from predictor.samples.store import list_platforms
    platforms = a.platform or list_platforms(store_path=a.store)
    out = models_dir(a.models_dir)  # where predict reads: --models-dir, else $PREDICTOR_MODELS_DIR, else models_store/
    rc = 0
    for pid in platforms:
        t0 = time.perf_counter()
        report = train_platform(pid, store_path=a.store, models_dir=out, progress=_progress_printer(a.quiet))
        print(f"\n{pid}: trained {len(report)} models in {time.perf_counter() - t0:.1f} s")
        print(report.to_string(index=False))
        pdir = out / pid
        good, problems = check_models(pdir, pid) if pdir.is_dir() else ({}, [])
        for p in problems:
            print(f"{pid}: model {p.stem} FAILS its check: {p.reason}", file=sys.stderr)
        if problems:
            rc = 1
        else:
            print(f"{pid}: {len(good)} models on disk verified (sha256, structure, identity)")
    return rc


# ---- platforms / models ---------------------------------------------------------------------
def cmd_platforms(a: argparse.Namespace) -> int:
    from rich.table import Table

    from predictor.hardware.platforms import load_platforms
    from predictor.plan.backing import describe_backing
    from predictor.plan.predict import Predictor
    rows: list[tuple[dict[str, Any], dict[str, str]]] = []
    for pid, p in sorted(load_platforms(clusters_file_arg(a.clusters)).items()):
        b = describe_backing(Predictor(p))
        rows.append(({"platform": pid, "device": p.device.name, "gpus_per_node": p.gpus_per_node,
                      "intra": f"{p.intra_node.kind} {p.intra_node.bandwidth_gbps:g} GB/s",
                      "inter": f"{p.inter_node.kind} {p.inter_node.bandwidth_gbps:g} GB/s", **b.to_dict()}, b.short))
    if a.json:
        print(json.dumps([r for r, _ in rows], indent=2))
        return 0
    t = Table(title="Platforms: what each prediction rests on (full sentences: --json)")
    t.add_column("platform", no_wrap=True)  # the id one types: never cut
    t.add_column("GPUs/node", justify="right")
    for k in ("operators", "collectives", "host overhead", "end to end"):
        t.add_column(k, overflow="fold")
    for r, sh in rows:
        t.add_row(r["platform"], str(r["gpus_per_node"]), sh["operators"], sh["collectives"], sh["host_overhead"],
                  sh["end_to_end"])
    _console().print(t)
    return 0


def cmd_models(a: argparse.Namespace) -> int:
    from predictor.model.presets import PRESET_NOTES, get_preset, list_presets
    rows = []
    for n in list_presets():
        m = get_preset(n)
        rows.append({"model": n, "arch": m.arch, "layers": m.num_layers, "hidden": m.hidden_size, "heads": m.num_heads,
                     "kv_heads": m.kv_heads,
                     # MLA: the query / key and the value head dimensions, 'qk/v'
                     "head_dim": f"{m.qk_head_size}/{m.v_head_size}" if m.is_mla else m.head_size,
                     "ffn_hidden": m.ffn, "vocab": m.vocab_size,
                     "num_experts": m.num_experts, "top_k": m.top_k,
                     "moe_ffn_hidden": m.expert_ffn if m.is_moe else None,
                     "params_b": round(m.total_params() / 1e9, 2),
                     "active_params_b": round(m.active_params() / 1e9, 2),
                     # multi-head latent attention / what a preset approximates (docs/mla.md)
                     "attention_kind": m.attention_kind, "note": PRESET_NOTES.get(n)})
    if a.json:
        print(json.dumps(rows, indent=2))
    else:
        import pandas as pd
        shown = [{**{k: v for k, v in r.items() if k not in ("note", "attention_kind")},
                  **(dict.fromkeys(("num_experts", "top_k", "moe_ffn_hidden", "active_params_b"), "-")
                     if not r["num_experts"] else {})} for r in rows]   # dense: "-", not 0 / NaN; MLA, notes: --json
        print(pd.DataFrame(shown).rename(columns={"num_experts": "experts", "moe_ffn_hidden": "expert_ffn",
                                                  "active_params_b": "active_b"}).to_string(index=False))
    return 0


# ---- predict --------------------------------------------------------------------------------
def _fields_from_args(a: argparse.Namespace) -> dict:
    keys = ("model", "arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "num_gpus",
            "tp", "pp", "dp", "micro_batch", "global_batch", "vpp", "schedule", "recompute", "sequence_parallel",
            "zero_stage", "precision", "attention", "stage_layers", "framework", "overlap_grad_reduce",
            "overlap_param_gather", "cp", "ep", "overlap_tp_comm", "grad_reduce_in_fp32", "fp8_param_gather",
            "cp_comm", "cp_a2a_size", "offload_activations", "overlap_p2p_comm",
            "etp", "moe_overlap", "moe_dispatcher", "cuda_graphs", "recompute_modules")
    return model_fields(a, keys)


def print_prediction(pred, console=None) -> None:
    from rich.table import Table
    c = console or _console()
    L, m = pred.layout, pred.model
    cps = f" cp{L.cp}" if L.cp > 1 else ""
    if L.cp > 1 and L.cp_comm != "p2p":   # all-to-all context parallelism
        cps += f" ({L.cp_comm}{f', groups of {L.cp_a2a_size}' if L.cp_a2a_size else ''})"
    eps = f" ep{L.ep}" if L.ep > 1 else ""
    if m.is_moe:
        c.print(f"[bold]{m.name}[/bold]: {routing_summary(m)}; {param_summary(m)} per token")
    c.print(f"[bold]{m.name}[/bold] on [bold]{pred.platform_id}[/bold]: {L.num_gpus} GPUs, "
            f"tp{L.tp} pp{L.pp}{cps} dp{L.dp}{eps}"
            f"{f' vpp{L.vpp}' if L.vpp > 1 else ''}, micro-batch {L.micro_batch}, global batch {L.global_batch} "
            f"({L.num_micro_batches} micro-batches), seq {L.seq_len}, {L.schedule}, recompute {L.recompute}"
            f"{' (' + (','.join(L.selective_modules) or 'no modules') + ')' if L.recompute == 'selective' else ''}"
            f"{', SP' if L.sequence_parallel else ''}{f', ZeRO-{L.zero_stage}' if L.zero_stage else ''}, {L.precision}"
            f"{f', {L.offload_activations} layers offloaded' if L.offload_activations else ''}")
    lo, hi = pred.step_time_s * (1 - pred.expected_error), pred.step_time_s * (1 + pred.expected_error)
    c.print(f"[bold green]step time {pred.step_time_s:.4g} s[/bold green]  (expected range {lo:.4g}-{hi:.4g} s, "
            f"+/-{pred.expected_error:.0%}: {pred.error_basis})")
    c.print(f"tokens/s {pred.tokens_per_s:,.0f}   model TFLOP/s per GPU {pred.model_tflops_per_gpu:.1f}   "
            f"MFU {pred.mfu:.1%}")
    c.print(f"rests on: {pred.provenance}")
    from predictor.plan.memory_verdict import OOM_WARNING, verdict_line
    c.print(verdict_line(pred), style=None if pred.fits_memory else "bold red", markup=False)
    if not pred.fits_memory:
        c.print(f"WARNING: {OOM_WARNING}", style="bold red", markup=False)
    t = Table(title="Breakdown along the critical path")
    t.add_column("category")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    for k, v in pred.breakdown_s.items():
        if k == "host_overhead" and v == 0:
            continue  # not modelled on this platform (see the warnings)
        if (k == "cp_comm" and L.cp == 1) or (k == "ep_comm" and L.ep == 1) or (k == "offload_comm"
                                                                               and not L.offload_activations):
            continue  # no context parallelism: no ring
        t.add_row(k, f"{v:.4g}", f"{v / pred.step_time_s:.1%}")
    c.print(t)
    from rich.markup import escape

    from predictor.plan.predict import PER_MICRO_BATCH, PER_STEP
    for per, title, n in ((PER_MICRO_BATCH, "Top operators on the critical stage {} (per micro-batch)", 12),
                          (PER_STEP, "Once per step on the critical stage {} (gradient / parameter traffic, "
                                     "optimizer)", 6)):
        agg: dict[tuple[str, str, str], float] = {}
        for r in pred.op_rows:  # (stage, chunk, part, phase, op, pass, category, count, each, total, provenance,
            if r[0] == pred.critical_stage and r[12] == per:   # cv, per)
                k = (r[4], r[3], r[10])
                agg[k] = agg.get(k, 0.0) + r[9]
        top = sorted(agg.items(), key=lambda kv: -kv[1])[:n]
        if not top:
            continue
        t2 = Table(title=title.format(pred.critical_stage))
        for col in ("op", "phase", "seconds", "provenance"):
            t2.add_column(col)
        for (op, phase, prov), secs in top:   # escaped: "reducescatter[dp]" is not a style tag
            t2.add_row(escape(op), phase, f"{secs:.4g}", escape(prov))
        c.print(t2)
    for w in pred.warnings:  # once, after the tables (markup off: a warning may contain [brackets])
        c.print("warning: ", style="yellow", end="")
        c.print(w, markup=False)


def _defaults_line(used: dict[str, Any]) -> str:
    """'defaults taken ...: seq_len 2048, recompute none, ...' and the flags that set them."""
    def word(v: Any) -> str:
        return ("on" if v else "off") if isinstance(v, bool) else str(v)
    flags = ", ".join(f"--{k.replace('_', '-')}" for k in used)
    return (f"defaults taken (the dashboard opens on them too): {', '.join(f'{k} {word(v)}' for k, v in used.items())}"
            f"; to change them give {flags}")


def _training_line(est, tokens: float, price: float | None) -> str:
    from predictor.plan.costing import SUFFIX
    unit = next(((k.upper(), v) for k, v in sorted(SUFFIX.items(), key=lambda kv: -kv[1]) if tokens >= v and k != "g"),
                ("", 1.0))
    cost = f", cost {est.cost:,.0f} at {price:g} per GPU-hour" if est.cost is not None else ""
    return (f"to {tokens / unit[1]:g}{unit[0]} tokens: {est.steps:,.0f} steps, {est.days:.3g} days, "
            f"{est.gpu_hours:,.0f} GPU-hours{cost}")


def cmd_predict(a: argparse.Namespace) -> int:
    from predictor.model.layout_io import defaults_used
    from predictor.plan.costing import training_estimate, training_inputs
    from predictor.plan.predict import get_predictor
    f = _fields_from_args(a)
    tokens, price = training_inputs(a.tokens, a.price_per_gpu_hour)
    model = model_from_fields(f)
    layout = layout_from_fields(f)
    t0 = time.perf_counter()
    P = get_predictor(a.platform, a.models_dir, clusters_file_arg(a.clusters), memory_options_from_args(a))
    layout.validate(model)   # then the checks predict-batch makes, in its order: ranks, the precision asked for
    P.check_runs(layout)     # (named as asked: fp8 on V100 is "no FP8 tensor cores", not its missing bf16)
    P.platform.device.check_precision(layout.precision)
    pred = P.predict(model, layout)
    elapsed = time.perf_counter() - t0
    if not pred.fits_memory and not a.allow_oom:
        from predictor.plan.memory_verdict import oom_error
        raise oom_error(pred)
    est = (training_estimate(pred.step_time_s, layout.num_gpus, layout.tokens_per_step, tokens, price).scalar()
           if tokens is not None else None)
    used = defaults_used(f)
    if a.json:
        d = pred.to_dict(with_ops=a.ops)
        d["elapsed_s"] = elapsed
        d["defaults_used"] = used
        if est is not None:
            d["training"] = est.to_dict()
        print(json.dumps(d, indent=2, default=float))
    else:
        print_prediction(pred)
        c = _console()
        if est is not None:
            assert tokens is not None
            c.print(_training_line(est, tokens, price), markup=False)
        if used:
            c.print(_defaults_line(used), markup=False)
    return 0


def cmd_predict_batch(a: argparse.Namespace) -> int:
    """Stream the input in chunks, predict each, write them to a temporary file renamed onto --output at
    the end. Whole-file problems (checked before computing where they can be) exit 2 with nothing
    written; row problems are reported in the row's `error` and the batch goes on (exit 0)."""
    from predictor.plan.batch import output_columns, predict_records
    from predictor.plan.batch_io import AtomicCsvWriter, check_output, chunks, open_input
    from predictor.plan.costing import training_inputs
    mopt = memory_options_from_args(a)
    tokens, price = training_inputs(a.tokens, a.price_per_gpu_hour)
    inp, handle = open_input(a.input)
    with handle:
        out = check_output(a.output, inp.path)
        columns = output_columns(inp.header, tokens is not None)
        t0 = time.perf_counter()
        ok = bad = oom = 0
        with AtomicCsvWriter(out, columns) as w:
            for records, errors in chunks(inp, a.chunk_rows):
                rows = predict_records(records, a.models_dir, allow_oom=a.allow_oom, errors=errors,
                                       clusters=clusters_file_arg(a.clusters), memory_options=mopt,
                                       tokens=tokens, price_per_gpu_hour=price)
                w.write(rows)
                ok += sum(r["error"] == "" for r in rows)
                bad += sum(r["error"] != "" for r in rows)
                oom += sum(r["fits"] is False for r in rows)
                if not a.quiet:
                    print(f"  {ok + bad:,} rows done", file=sys.stderr, flush=True)
    how = "predicted anyway: --allow-oom" if a.allow_oom else "errors"
    note = f", {oom} do not fit in memory ({how})" if oom else ""
    print(f"wrote {out}: {ok} predicted, {bad} with errors{note}, {time.perf_counter() - t0:.2f} s", file=sys.stderr)
    return 0


# ---- validate -------------------------------------------------------------------------------
def cmd_validate(a: argparse.Namespace) -> int:
    from predictor.checks.validate import save_validation, summarize_validation, validate_runs
    res = validate_runs(platform=a.platform, store_path=a.store, models_dir=a.models_dir,
                        progress=_progress_printer(a.quiet))
    if res.empty:
        print("no measured runs in the store: ingest some (e.g. ../shared/datasets/vtrain/ground_truth_single.csv)",
              file=sys.stderr)
        return 2
    summary = summarize_validation(res, by=("source_id", "platform") if a.by_source else ("platform",))
    if a.output:
        res.to_csv(a.output, index=False)
    if a.save:
        for pid, g in res.groupby("platform"):
            save_validation(pid, g, a.models_dir)
    from predictor.checks.validate import skipped_at_ingest
    skipped = skipped_at_ingest(a.store)
    if "source_id" in res and len(skipped):   # only the sources validated here
        skipped = skipped[skipped["source_id"].isin(set(res["source_id"].dropna().astype(str)))]
    if a.json:
        print(json.dumps({"summary": summary.to_dict(orient="records"),
                          "skipped_at_ingest": skipped.to_dict(orient="records")}, indent=2, default=float))
    else:
        print(summary.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        if len(skipped):
            print("\nrows left out at ingest (never filled with a guess):")
            print(skipped.to_string(index=False))
    return 0


def cmd_calibrate_host(a: argparse.Namespace) -> int:
    from predictor.calibrate.host import calibrate_host
    log = (lambda m: None) if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    ho, report, path = calibrate_host(a.platform, store_path=a.store, models_dir=a.models_dir, folds=a.folds,
                                      progress=log, save=not a.dry_run)
    out = {"platform": a.platform, "host_s_per_layer_pass": ho.host_s_per_layer_pass, "blend_p": ho.blend_p,
           **report, "written": str(path) if path else None}
    if a.json:
        print(json.dumps(out, indent=2, default=float))
    else:
        print(f"{a.platform}: host {ho.host_s_per_layer_pass * 1e3:.3f} ms per layer-pass, blend p = {ho.blend_p:g}\n"
              f"  end-to-end MAPE without host term {report['no_host_mape']:.1%}, fitted {report['fit_mape']:.1%}, "
              f"cross-validated on held-out models ({report['folds']} folds, {report['groups']} models) "
              f"{report['cv_mape']:.1%}" + (f"\n  written: {path}" if path else ""))
    return 0


# ---- parser ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from predictor.cli.search import clusters_arg

    p = argparse.ArgumentParser(prog="python -m predictor",
                                description="Predict LLM training step time from measured operator samples.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp, store=True, models=True):
        if store:
            sp.add_argument("--store", help="DuckDB sample store (default: $PREDICTOR_STORE or data/samples.duckdb)")
        if models:
            sp.add_argument("--models-dir", help="trained models (default: models_store/)")
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.add_argument("--quiet", action="store_true", help="no progress messages")

    sp = sub.add_parser("ingest", help="load samples / measured runs into the store (idempotent, all or nothing)",
                        description="Load sample and measured-run files (CSV / Parquet; folders recursively) into "
                                    "the store, every path in one transaction. Files already ingested and rows "
                                    "already in the store (in any format or order) add nothing. Exit status: 0 all "
                                    "good, 2 something was rejected (listed with the reason) or nothing ingestible "
                                    "was found, 130 interrupted (nothing committed).")
    sp.add_argument("paths", nargs="+")
    sp.add_argument("--platform", help="platform id for files that do not name one")
    sp.add_argument("--kind", help="force the format of every file (see predictor/samples/formats/ KINDS)")
    common(sp, models=False)
    sp.set_defaults(func=cmd_ingest)

    sp = sub.add_parser("train", help="fit the regressors of one or all platforms in the store")
    sp.add_argument("--platform", action="append", help="platform id (repeatable); default: all in the store")
    common(sp)
    sp.set_defaults(func=cmd_train)

    sp = sub.add_parser("platforms", help="list platforms and what backs each")
    clusters_arg(sp)
    common(sp, store=False, models=False)
    sp.set_defaults(func=cmd_platforms)

    sp = sub.add_parser("models", help="list the model presets")
    common(sp, store=False, models=False)
    sp.set_defaults(func=cmd_models)

    sp = sub.add_parser("predict", help="predict one training step", epilog=DEFAULTS_DOC,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("--platform", required=True)
    sp.add_argument("--model", help="preset name, e.g. llama3-70b (fields below override it)")
    sp.add_argument("--arch", choices=["gpt", "llama"])
    for name in ("layers", "hidden", "heads", "kv-heads", "ffn-hidden", "vocab", "seq-len", "num-gpus", "tp", "pp",
                 "dp", "micro-batch", "global-batch", "vpp", "zero-stage"):
        sp.add_argument(f"--{name}", type=int)
    add_head_dim_arg(sp)
    sp.add_argument("--cp", type=int, help="context-parallel degree: each micro-batch's sequence split over cp "
                                           "ranks, Megatron-Core ring attention (default 1; num_gpus = tp*pp*cp*dp)")
    add_ep_arg(sp)
    add_cp_offload_args(sp)
    # --- zero-bubble and bidirectional pipeline schedules (docs/schedules.md) ---
    sp.add_argument("--schedule", choices=list(SCHEDULES),
                    help="pipeline schedule (default 1f1b; interleaved when --vpp > 1); zb-h1 / zb-v (zero bubble, "
                         "Qi et al. 2024), dualpipe / dualpipe-v (DeepSeek-V3): " + "; ".join(
                             f"{k}: {v}" for k, v in SCHEDULE_HELP.items() if k in ZB_SCHEDULES))
    sp.add_argument("--recompute", choices=["none", "selective", "full"])
    sp.add_argument("--sequence-parallel", action="store_true", default=None)
    sp.add_argument("--precision", choices=list(PRECISIONS))
    sp.add_argument("--attention", choices=["flash", "unfused"], help="attention kernels (default flash)")
    sp.add_argument("--framework", help="megatron (default), megatron-deepspeed, deepspeed, fsdp or ddp: when the "
                                        "data-parallel traffic runs and whether it overlaps compute")
    sp.add_argument("--overlap-grad-reduce", dest="overlap_grad_reduce", action=argparse.BooleanOptionalAction,
                    default=None, help="override the framework's default (e.g. Megatron's --overlap-grad-reduce)")
    sp.add_argument("--overlap-param-gather", dest="overlap_param_gather", action=argparse.BooleanOptionalAction,
                    default=None, help="override the framework's default (Megatron's --overlap-param-gather)")
    sp.add_argument("--overlap-p2p-comm", dest="overlap_p2p_comm", action=argparse.BooleanOptionalAction,
                    default=None, help="the pipeline's point-to-point overlap (Megatron-Core overlap_p2p_comm): "
                                       "default on for the interleaved schedule (Megatron-LM "
                                       "--no-overlap-p2p-communication turns it off)")
    sp.add_argument("--overlap-tp-comm", dest="overlap_tp_comm", action="store_true", default=None,
                    help="Transformer Engine's tensor-parallel communication overlap (Megatron-Core --tp-comm-overlap, "
                         "NeMo tp_comm_overlap): needs tp > 1 with --sequence-parallel")
    sp.add_argument("--stage-layers", help="uneven split, e.g. 7,9,9,7 (pp*vpp entries)")
    add_precision_memory_args(sp)
    add_moe_args(sp)
    add_mla_args(sp)
    add_moe_parallel_args(sp)
    add_recompute_modules_arg(sp)
    add_memory_model_args(sp)
    sp.add_argument("--ops", action="store_true", help="with --json: include every operator call")
    sp.add_argument("--tokens", help="tokens to train (e.g. 2T, 300B): adds steps, days and GPU-hours to them")
    sp.add_argument("--price-per-gpu-hour", "--price", dest="price_per_gpu_hour",
                    help="price of one GPU-hour (any currency): adds the cost (with --tokens)")
    sp.add_argument("--allow-oom", action="store_true",
                    help="print the time of a layout that does not fit in memory (with a loud warning) instead of "
                         "exiting with status 2")
    clusters_arg(sp)
    common(sp, store=False)
    sp.set_defaults(func=cmd_predict)

    sp = sub.add_parser("predict-batch", help="predict every row of a CSV", epilog=DEFAULTS_DOC,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("--input", required=True, help="CSV (UTF-8), one case per row, the header as below")
    sp.add_argument("--output", required=True, help="CSV to write (replaced only when the batch completes)")
    sp.add_argument("--allow-oom", action="store_true",
                    help="fill the time of rows that do not fit in memory (fits=False, a DOES NOT FIT warning); "
                         "without it such a row's time columns stay empty and `error` says why and what to change")
    sp.add_argument("--chunk-rows", type=int, default=5000, help=argparse.SUPPRESS)
    sp.add_argument("--tokens", help="tokens to train for every row without a `tokens` cell (e.g. 2T): adds the "
                                     "days, gpu_hours and cost columns")
    sp.add_argument("--price-per-gpu-hour", "--price", dest="price_per_gpu_hour",
                    help="price of one GPU-hour for every row without a `price_per_gpu_hour` cell: fills `cost`")
    add_memory_model_args(sp)
    clusters_arg(sp)
    common(sp, store=False)
    sp.set_defaults(func=cmd_predict_batch)

    sp = sub.add_parser("calibrate-host", help="fit a platform's host (framework) overhead on its measured runs")
    sp.add_argument("--platform", required=True)
    sp.add_argument("--folds", type=int, default=5, help="cross-validation folds over held-out models")
    sp.add_argument("--dry-run", action="store_true", help="fit and report, write nothing")
    common(sp)
    sp.set_defaults(func=cmd_calibrate_host)

    sp = sub.add_parser("validate", help="predict every measured run in the store and print the error table")
    sp.add_argument("--platform")
    sp.add_argument("--output", help="write per-run results to this CSV")
    sp.add_argument("--save", action="store_true", help="record the error in models_store/<platform>/validation.json")
    sp.add_argument("--by-source", action="store_true", help="one row per source and platform")
    common(sp)
    sp.set_defaults(func=cmd_validate)
    from predictor.cli.search import add_search_parser
    add_search_parser(sub)
    from predictor.cli.calibrate import add_calibrate_framework_parser
    add_calibrate_framework_parser(sub, common)
    from predictor.cli.calibrate import add_check_independent_parser
    add_check_independent_parser(sub, common)
    from predictor.cli.calibrate import add_calibrate_runs_parser
    add_calibrate_runs_parser(sub, common)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        what = {"ingest": "; nothing was committed (the store is as it was)",
                "predict-batch": f"; {getattr(args, 'output', '')} was not written"}.get(args.command, "")
        print(f"interrupted{what}", file=sys.stderr)
        return 130
    except InfeasibleConfig as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # domain errors from the store and friends, shown without a traceback
        name = type(e).__name__
        if name in ("StoreError", "FileNotFoundError", "ModelMissingError", "PermissionError", "ArtifactError"):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise

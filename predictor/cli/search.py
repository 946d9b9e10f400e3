"""`python -m predictor search ...`: the fastest layouts that fit, as a table, JSON or CSV.

    python -m predictor search --model llama3-70b --platform dgx-a100-80gb --num-gpus 1024 \\
        --global-batch 1024 --seq-len 4096 --top 10 --objective time --tokens 15T --price-per-gpu-hour 2

--num-gpus takes one number, a list (512,1024) or a range (512-2048: doubling from the lower end,
i.e. 512, 1024, 2048).
--csv prints one header line and one row per layout (the top K; --top 0: every feasible layout;
--all: every enumerated layout, rejected ones with their reason).
"""
from __future__ import annotations

import argparse
import json
import sys

from predictor.model.errors import InfeasibleConfig
from predictor.model.specs import SCHEDULES, normalize_cuda_graphs
from predictor.paths import clusters_file_arg, json_default
from predictor.step.compose import CATEGORIES
from predictor.step.memory import TIGHT_MEANS

TABLE_COLUMNS = ["rank", "num_gpus", "tp", "pp", "cp", "ep", "dp", "micro_batch", "num_micro_batches", "vpp",
                 "schedule", "stage_layers", "recompute", "sequence_parallel", "zero_stage", "step_time_s",
                 "tokens_per_s", "tflops_per_gpu", "mfu", "peak_mem_gib", "compute_s", "tp_comm_s", "cp_comm_s",
                 "ep_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s", "optimizer_s", "gpu_hours_per_mtok",
                 "cp_comm", "offload_activations", "offload_comm_s", "needs_offload"]
COST_COLUMNS = ["steps", "days", "gpu_hours", "cost", "cost_per_mtok"]


def parse_gpus(text: str, gpus_per_node: int = 8) -> list[int]:
    """'1024' -> [1024]; '512,1024' -> [512, 1024]; '512-2048' -> node multiples doubling from 512."""
    s = str(text).replace(" ", "")
    try:
        if "-" in s and "," not in s:
            lo, hi = (int(x) for x in s.split("-", 1))
            if lo <= 0 or hi < lo:
                raise ValueError
            out, n = [], lo
            while n <= hi:
                out.append(n)
                n *= 2
            return out
        vals = [int(x) for x in s.split(",") if x]
        if not vals or min(vals) <= 0:
            raise ValueError
        return vals
    except ValueError:
        raise InfeasibleConfig("num_gpus", f"cannot read '{text}'.",
                               "give a number (1024), a list (512,1024) or a range (256-2048).") from None


def _ints(text: str | None, name: str) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InfeasibleConfig(name, f"must be comma-separated integers, got {text!r}.") from None


def cmd_search(a: argparse.Namespace) -> int:
    from predictor.cli.args import memory_options_from_args, model_fields
    from predictor.model.frameworks import DEFAULT_FRAMEWORK, get_framework
    from predictor.model.layout_io import model_from_fields, parse_recompute_modules
    from predictor.plan.costing import parse_count
    from predictor.plan.predict import get_predictor
    from predictor.plan.search import RC, SearchSpace, search

    model = model_from_fields(model_fields(a, ("model", "arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden",
                                              "vocab", "attention")))
    P = get_predictor(a.platform, a.models_dir, clusters_file_arg(a.clusters))
    gpus = parse_gpus(a.num_gpus, P.platform.gpus_per_node)
    rc = tuple(x.strip() for x in a.recompute.split(",")) if a.recompute else RC
    bad = [x for x in rc if x not in RC]
    if bad:
        raise InfeasibleConfig("recompute", f"unknown {bad}.", f"use a subset of {','.join(RC)}.")
    sp = {"both": (False, True), "on": (True,), "off": (False,)}[a.sequence_parallel]
    schedules = tuple(x.strip() for x in a.schedules.split(","))
    bad_s = [x for x in schedules if x not in SCHEDULES]
    if bad_s:
        raise InfeasibleConfig("schedules", f"unknown schedule(s) {bad_s}.", f"use a subset of {','.join(SCHEDULES)}.")
    space = SearchSpace(tp=_ints(a.tp, "tp"), pp=_ints(a.pp, "pp"), cp=_ints(a.cp, "cp"),
                        ep=_ints(a.ep, "ep"), micro_batch=_ints(a.micro_batch, "micro_batch"),
                        max_micro_batch=a.max_micro_batch, vpp=_ints(a.vpp, "vpp"), max_vpp=a.max_vpp,
                        recompute=rc, sequence_parallel=sp,
                        zero_stage=_ints(a.zero_stage, "zero_stage") or (0, 1, 2, 3), schedules=schedules,
                        uneven_splits=not a.no_uneven, tp_within_node=not a.tp_across_nodes, precision=a.precision,
                        leave_out_tight=a.leave_out_tight,
                        framework=get_framework(a.framework or DEFAULT_FRAMEWORK).name,
                        overlap_grad_reduce=a.overlap_grad_reduce, overlap_tp_comm=bool(a.overlap_tp_comm),
                        overlap_p2p_comm=a.overlap_p2p_comm,
                        grad_reduce_in_fp32=a.grad_reduce_in_fp32, fp8_param_gather=bool(a.fp8_param_gather),
                        cp_comm=(tuple(x.strip() for x in a.cp_comm.split(",")) if a.cp_comm else ("p2p",)),
                        offload_activations=_ints(a.offload_activations, "offload_activations") or (0,),
                        etp=_ints(a.etp, "etp"), moe_overlap=(False, True) if a.moe_overlap else (False,),
                        moe_dispatcher=a.moe_dispatcher or "alltoall",
                        cuda_graphs=normalize_cuda_graphs(a.cuda_graphs),
                        recompute_modules=parse_recompute_modules(a.recompute_modules))
    mopt = memory_options_from_args(a)
    try:
        tokens = parse_count(a.tokens)
    except ValueError as e:
        raise InfeasibleConfig("tokens", str(e)) from None
    rep = search(model, P, gpus, a.global_batch, a.seq_len, top_k=a.top, objective=a.objective, space=space,
                 memory_options=mopt, tokens_to_train=tokens, price_per_gpu_hour=a.price_per_gpu_hour,
                 refine=not a.no_refine)
    if rep.n_enumerated == 0:
        raise _nothing_enumerated(rep, model, P, gpus, a.global_batch, a.seq_len, space)
    if rep.n_feasible == 0 and not (a.csv or a.json):
        _print_none_fit(rep, gpus, a)
        return 3
    table = rep.table if a.all else rep.feasible
    if a.top > 0:
        table = table.head(a.top)
    cols = [c for c in TABLE_COLUMNS + COST_COLUMNS if c in table.columns]
    if a.all:
        cols += ["fits", "reason"]
    if a.csv:
        out = table[cols].copy()
        out["stage_layers"] = out["stage_layers"].str.replace(",", ";")
        if "reason" in out:
            out["reason"] = out["reason"].str.replace(",", ";")
        sys.stdout.write(out.to_csv(index=False, lineterminator="\n"))
        return 0 if rep.n_feasible else 3
    if a.json:
        d = rep.to_dict(all_rows=False)
        d["layouts"] = table[cols].to_dict(orient="records")
        print(json.dumps(d, indent=2, default=json_default))
        return 0 if rep.n_feasible else 3
    _print_report(rep, table, cols, a)
    return 0 if rep.n_feasible else 3


def _nothing_enumerated(rep, model, P, gpus, global_batch, seq_len, space) -> InfeasibleConfig:
    """No tp*pp*dp split of the GPU count(s) is valid for this model and batch: say why (the first
    reasons) and which nearby GPU counts have valid splits."""
    from predictor.plan.search import enumerate_layouts
    reasons = [d.get("reason") or d.get("option", "") for d in rep.exclusions if d.get("option", "").startswith("tp=")]
    reasons = reasons or [d.get("reason") or d.get("option", "") for d in rep.exclusions]
    gpn = P.platform.gpus_per_node
    near: list[int] = []
    for N in gpus:
        cands = sorted({max(gpn, N // gpn * gpn), -(-N // gpn) * gpn, 1 << max(0, N.bit_length() - 1),
                        1 << N.bit_length()} - {N}, key=lambda c: (abs(c - N), c))
        for c in cands:
            if P.platform.ranks_problem(c) is None and enumerate_layouts(model, P.platform, c, global_batch, seq_len,
                                                                         space)[0]:
                near.append(c)
            if len(near) >= 2:
                break
    uniq = list(dict.fromkeys(r.rstrip(".") for r in reasons if r))
    why = "; ".join(uniq[:3]) + (f"; and {len(uniq) - 3} more" if len(uniq) > 3 else "")
    return InfeasibleConfig(
        "num_gpus", f"no layout of {model.name} on {','.join(map(str, gpus))} GPUs of {rep.platform_id} can be "
                    f"enumerated: no split into tp*pp*dp is valid for global batch {global_batch}"
                    + (f" ({why})." if why else "."),
        (f"try {' or '.join(map(str, sorted(set(near))))} GPUs, " if near else "")
        + "or a global batch divisible by more data-parallel degrees, or widen the search space (--tp, --pp).")


def _print_none_fit(rep, gpus, a) -> None:
    from rich.console import Console
    c = Console(highlight=False, soft_wrap=False, width=200)
    c.print(f"[bold red]No layout fits[/bold red]: {rep.model.name} on {','.join(map(str, gpus))} GPUs of "
            f"{rep.platform_id}, global batch {a.global_batch}, seq {a.seq_len}: {rep.n_enumerated} layouts "
            f"enumerated, none fits in memory (every tp/pp/ZeRO/recompute the search space allowed was tried; the "
            f"reasons below). Fix: more GPUs, a device with more memory, or a wider search space (--tp, --pp, "
            f"--recompute, --zero-stage).")
    for _, r in rep.rejection_summary().iterrows():
        n = f"{r['layouts']} layouts: " if r["layouts"] else ""
        c.print(f"  {r['reason']}: {n}{r['example']}")




# The breakdown column's short names, one per compose.CATEGORIES entry (the header is built from the same list
# as the numbers under it, so the two cannot drift apart).
_SHORT_CATEGORY = {"host_overhead": "host", "optimizer": "opt"}


def breakdown_header() -> str:
    """'compute / host / tp / cp / ep / pp / dp / bubble / opt (%)': the share column's header."""
    return " / ".join(_SHORT_CATEGORY.get(x, x.removesuffix("_comm")) for x in CATEGORIES) + " (%)"


def _print_report(rep, table, cols, a) -> None:
    from rich.console import Console
    from rich.table import Table
    c = Console(highlight=False, soft_wrap=False, width=200)
    m = rep.model
    gpus = sorted(set(rep.table["num_gpus"])) if len(rep.table) else []
    c.print(f"[bold]{m.name}[/bold] on [bold]{rep.platform_id}[/bold], {','.join(map(str, gpus))} GPUs, global batch "
            f"{a.global_batch}, seq {a.seq_len}: {rep.n_enumerated} layouts enumerated, {rep.n_feasible} fit, "
            f"ranked by {rep.objective} in {rep.elapsed_s:.2f} s")
    t = Table(title=f"Top {len(table)} layouts")
    show = [("rank", "#"), ("num_gpus", "GPUs"), ("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("ep", "ep"),
            ("dp", "dp"), ("micro_batch", "mb"),
            ("vpp", "vpp"), ("stage_layers", "split"), ("recompute", "recomp"), ("sequence_parallel", "SP"),
            ("zero_stage", "ZeRO"), ("step_time_s", "step s"), ("tokens_per_s", "tok/s"),
            ("tflops_per_gpu", "TFLOP/s/GPU"), ("mfu", "MFU"), ("peak_mem_gib", "mem GiB")]
    extra = [(k, lbl) for k, lbl in (("days", "days"), ("gpu_hours", "GPU-h"), ("cost", "cost"),
                                     ("cost_per_mtok", "cost/Mtok")) if k in table.columns]
    show += extra + [("_bd", breakdown_header())]
    if a.all:
        show.append(("reason", "reason"))
    for _, lbl in show:
        t.add_column(lbl, justify="left" if lbl in ("split", "recomp", "reason") else "right")
    for _, r in table.iterrows():
        cells = []
        for k, _ in show:
            if k == "_bd":
                st = r["step_time_s"]
                parts = [r[f"{x}_s"] for x in CATEGORIES]
                cells.append(" / ".join(f"{max(0.0, p) / st * 100:.0f}" for p in parts) if st == st else "-")
                continue
            v = r[k]
            if k == "mfu":
                cells.append(f"{v:.1%}")
            elif k == "tokens_per_s":
                cells.append(f"{v:,.0f}")
            elif k == "peak_mem_gib":   # "!" marks a layout that fits only with little allocator fragmentation
                cells.append((f"{v:.4g}" if v == v else "-") + (" !" if r.get("memory_tight", False) else ""))
            elif k in ("step_time_s", "tflops_per_gpu", "days"):
                cells.append(f"{v:.4g}" if v == v else "-")
            elif k in ("gpu_hours", "cost"):
                cells.append(f"{v:,.0f}")
            elif k == "cost_per_mtok":
                cells.append(f"{v:.3g}")
            elif k == "sequence_parallel":
                cells.append("y" if v else "")
            elif k == "vpp":
                cells.append(str(v) if r["schedule"] == "interleaved" else "")
            elif k == "stage_layers":
                cells.append(str(v) if v else "even")
            else:
                cells.append(str(v))
        t.add_row(*cells)
    c.print(t)
    if "memory_tight" in table.columns and table["memory_tight"].any():
        c.print(f"mem GiB '!': tight, {TIGHT_MEANS}. Leave headroom.", markup=False)
    if rep.top and rep.top[0].prediction is not None:
        p = rep.top[0].prediction
        c.print(f"best: expected error +/-{p.expected_error:.0%} ({p.error_basis}); rests on: {p.provenance}")
        mr = rep.top[0].memory
        pk = mr.peak
        c.print(f"best: memory peak {mr.peak_gib:.1f} of {mr.usable_bytes / 2**30:.1f} GiB usable on stage {pk.stage}: "
                f"weights {pk.weights_bytes / 2**30:.1f}, gradients {pk.grads_bytes / 2**30:.1f}, optimizer "
                f"{pk.optimizer_bytes / 2**30:.1f}, activations {pk.activations_bytes / 2**30:.1f} "
                f"({pk.in_flight:g} in flight), buffers {pk.buffers_bytes / 2**30:.1f}, framework "
                f"{pk.framework_bytes / 2**30:.1f}, NCCL buffers {pk.nccl_bytes / 2**30:.1f}, allocator reserve "
                f"{pk.allocator_bytes / 2**30:.1f} GiB (allocated {pk.allocated_bytes / 2**30:.1f} GiB)"
                + (f"; tight: {mr.low_peak_bytes / 2**30:.1f} GiB with the least reserve" if mr.tight else "")
                + (f"; offloaded to host memory {pk.offloaded_bytes / 2**30:.1f} GiB" if pk.offloaded_bytes else ""))
    summ = rep.rejection_summary()
    if len(summ):
        c.print("[bold]Not ranked[/bold] (see --all / --explain):")
        for _, r in summ.iterrows():
            n = f"{r['layouts']} layouts: " if r["layouts"] else ""
            c.print(f"  {r['reason']}: {n}{r['example']}")
    if a.explain:
        filters = {}
        for kv in a.explain.split(","):
            if "=" not in kv:
                raise InfeasibleConfig("explain", f"expected field=value pairs, got {kv!r}.")
            k, v = kv.split("=", 1)
            k = k.strip().replace("-", "_")
            v = v.strip()
            filters[k] = (v.lower() in ("1", "true", "yes", "y")) if k == "sequence_parallel" else (
                int(v) if v.lstrip("-").isdigit() else v)
        hits = rep.why_absent(**filters)
        feas = rep.feasible
        for k, v in filters.items():
            feas = feas[feas[k] == v]
        c.print(f"[bold]--explain {a.explain}[/bold]: {len(feas)} such layouts fit (best rank "
                f"{int(feas['rank'].min()) if len(feas) else '-'}); {len(hits)} rejected or never enumerated")
        for _, r in hits.head(15).iterrows():
            if r.get("tp") == r.get("tp") and r.get("tp") is not None:
                desc = (f"tp{int(r['tp'])} pp{int(r['pp'])} dp{int(r['dp'])} mb{int(r['micro_batch'])} "
                        f"{r['schedule']}{' vpp' + str(int(r['vpp'])) if r['schedule'] == 'interleaved' else ''} "
                        f"recompute={r['recompute']}{' SP' if r['sequence_parallel'] else ''} "
                        f"ZeRO-{int(r['zero_stage'])}: ")
            else:
                desc = ""
            c.print(f"  {desc}{r['reason']}")


def clusters_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--clusters", metavar="FILE",
                    help="your cluster definitions (JSON or YAML, the format of predictor/catalog/clusters.json; "
                         "`platforms --clusters FILE` lists and checks them); their ids work as --platform / the "
                         "platform column. Default: $PREDICTOR_CLUSTERS, else data/clusters.local.json (the "
                         "clusters saved on the dashboard) when it exists")


def add_search_parser(subparsers) -> None:
    """Register `search` on the CLI's subparsers."""
    from predictor.cli.args import (
        add_cuda_graphs_arg,
        add_head_dim_arg,
        add_memory_model_args,
        add_mla_args,
        add_moe_args,
        add_moe_dispatcher_arg,
        add_precision_memory_args,
        add_recompute_modules_arg,
    )
    from predictor.model.specs import PRECISIONS
    sp = subparsers.add_parser("search", help="rank every layout that fits by step time, tokens/s, MFU or cost",
                               description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("--platform", required=True)
    sp.add_argument("--model", help="preset name, e.g. llama3-70b (fields below override it)")
    sp.add_argument("--arch", choices=["gpt", "llama"])
    for name in ("layers", "hidden", "heads", "kv-heads", "ffn-hidden", "vocab"):
        sp.add_argument(f"--{name}", type=int)
    add_head_dim_arg(sp)
    sp.add_argument("--attention", choices=["flash", "unfused"])
    sp.add_argument("--num-gpus", required=True, help="N, a list N1,N2 or a range A-B (doubling from A)")
    sp.add_argument("--global-batch", type=int, required=True, help="sequences per step")
    sp.add_argument("--seq-len", type=int, required=True)
    sp.add_argument("--top", type=int, default=10, help="how many layouts to print (0 = all that fit)")
    sp.add_argument("--objective", choices=["time", "tokens", "mfu", "cost"], default="time")
    sp.add_argument("--tokens", help="tokens to train (e.g. 15T, 300B): adds steps, days, GPU-hours, cost")
    sp.add_argument("--price-per-gpu-hour", type=float, help="price per GPU-hour (any currency)")
    sp.add_argument("--precision", choices=list(PRECISIONS), default="bf16",
                    help="fp8 needs FP8 tensor cores (refused by name on A100 / V100 / MI250X / CPU platforms)")
    sp.add_argument("--framework", help="megatron (default), megatron-deepspeed, deepspeed, fsdp or ddp")
    sp.add_argument("--overlap-grad-reduce", dest="overlap_grad_reduce", action=argparse.BooleanOptionalAction,
                    default=None, help="override the framework's default")
    sp.add_argument("--overlap-tp-comm", dest="overlap_tp_comm", action="store_true",
                    help="Transformer Engine's tensor-parallel communication overlap on every layout with tp > 1 and "
                         "sequence parallelism")
    sp.add_argument("--overlap-p2p-comm", dest="overlap_p2p_comm", action=argparse.BooleanOptionalAction,
                    default=None, help="the pipeline's point-to-point overlap on the interleaved layouts (default on "
                                       "for Megatron-Core; --no-overlap-p2p-comm turns it off)")
    add_precision_memory_args(sp, every_layout=True)
    g = sp.add_argument_group("search space (default: everything valid)")
    g.add_argument("--tp", help="tensor-parallel degrees to try, e.g. 4,8")
    g.add_argument("--pp", help="pipeline degrees, e.g. 1,2,4")
    g.add_argument("--cp", help="context-parallel degrees, e.g. 1 (none) or 1,2,4 (default: every power of two that "
                                "divides the GPUs with seq_len / cp a multiple of 2*cp)")
    g.add_argument("--ep", help="expert-parallel degrees for a MoE model, e.g. 1,8 (default: every divisor of "
                                "num_experts that divides tp x cp x dp)")
    # MoE expert tensor parallelism and the dispatch / combine overlap
    g.add_argument("--etp", help="expert tensor-parallel degrees for a MoE model, e.g. 1 (default: 1 and tp, those "
                                 "dividing moe_ffn_hidden whose product with ep divides tp x cp x dp)")
    g.add_argument("--moe-overlap", dest="moe_overlap", action="store_true",
                   help="also try the expert-parallel dispatch / combine overlapped with compute (Megatron-Core "
                        "overlap_moe_expert_parallel_comm) where it runs (ep > 1; pp 1 or interleaved; no full "
                        "recomputation)")
    add_moe_dispatcher_arg(g, every_layout=True)
    add_cuda_graphs_arg(g, every_layout=True)
    g.add_argument("--micro-batch", help="micro-batch sizes, e.g. 1,2")
    g.add_argument("--max-micro-batch", type=int, default=16)
    g.add_argument("--vpp", help="virtual stages for the interleaved schedule, e.g. 2,4")
    g.add_argument("--max-vpp", type=int, default=8)
    g.add_argument("--recompute", help="subset of none,selective,full")
    add_recompute_modules_arg(g, every_layout=True)
    g.add_argument("--sequence-parallel", choices=["both", "on", "off"], default="both")
    g.add_argument("--zero-stage", help="subset of 0,1,2,3 (2 = FSDP SHARD_GRAD_OP, 3 = FULL_SHARD)")
    g.add_argument("--schedules", default="1f1b,interleaved",
                   help="subset of 1f1b,interleaved,gpipe,zb-h1,zb-v,dualpipe,dualpipe-v (the zero-bubble and "
                        "DualPipe schedules only when named: docs/schedules.md)")
    g.add_argument("--no-uneven", action="store_true", help="do not try edge-light uneven layer splits")
    g.add_argument("--tp-across-nodes", action="store_true", help="allow tensor parallelism across nodes")
    g.add_argument("--leave-out-tight", action="store_true",
                   help="rank only layouts that fit with the caching allocator's typical reserve (tight ones stay "
                        "in --all, unranked)")
    # all-to-all context parallelism and activation offloading (off by default)
    g.add_argument("--cp-comm", help="context-parallel communication kinds to try where cp > 1, a subset of "
                                     "p2p,a2a,a2a+p2p (default p2p: Megatron-Core's ring)")
    g.add_argument("--offload-activations", help="offloaded layers per stage to try, e.g. 0,20,40 (default 0; only "
                                                 "on layouts with pp 1 and recompute none)")
    add_memory_model_args(sp)
    add_moe_args(sp)
    add_mla_args(sp)
    sp.add_argument("--no-refine", action="store_true", help="skip the exact re-prediction of the top K")
    sp.add_argument("--all", action="store_true", help="also list rejected layouts with their reason")
    sp.add_argument("--explain", help="why layouts with these values are absent, e.g. tp=8,pp=1,zero_stage=0")
    sp.add_argument("--csv", action="store_true", help="one header line, one row per layout")
    sp.add_argument("--models-dir", help="trained models (default: models_store/)")
    clusters_arg(sp)
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.add_argument("--quiet", action="store_true", help="no progress messages")
    sp.set_defaults(func=cmd_search)

"""`python -m bench ...`: info, device, ops, collectives, grouped-gemm, gpu-quick, ring, context, curve, fit-network,
cpu-platform, speed-check, sampled-on, host-floor.

Sample sets belong to one machine (predictor.hardware.machine): without --out a platform's set is
bench/samples/<platform> when that folder is free or this machine's, else
bench/samples/machine-<id>/<platform>; an --out holding another machine's samples is refused."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bench.cpu.cpu_clusters import fit_network
from bench.launch import REPO, quiet_check, relaunch
from bench.launch import log as _log
from bench.sampling import design as D

SAMPLES = REPO / "bench" / "samples"


# --------------------------------------------------------------------------- commands
def cmd_info(a) -> int:
    from bench.env import facts
    if a.threads:
        import torch
        torch.set_num_threads(a.threads)
    print(json.dumps(facts(a.device), indent=2, default=str))
    return 0


def cmd_device(a) -> int:
    from bench.sampling.device import CATALOG, cpu_device_entry, measure, upsert_catalog_entry
    q = quiet_check(a)
    m = measure(a.device, a.threads, a.dtype)
    m["quiet"] = q
    entry = cpu_device_entry(m) if a.device == "cpu" else None
    print(json.dumps({"gemm": m["gemm"], "stream": m["stream"], "quiet": q, "entry": entry}, indent=2))
    if a.write and entry:
        upsert_catalog_entry(CATALOG / "devices.json", a.write, entry)
        _log(f"wrote device '{a.write}' into {CATALOG / 'devices.json'}")
    return 0


def sample_dir(a, platform: str, folder: str | None = None) -> Path | None:
    """The sample set of `platform` for this command: --out (refused when it holds another machine's
    samples: None, after saying why), else this machine's default (bench.sampling.store_io.sample_set_dir) named
    `folder` (default the platform: sets kept apart from the platform's own, e.g. FP8, get their own name)."""
    from bench.env import this_machine
    here = this_machine()
    platform = folder or platform
    default = store_io_mod().sample_set_dir(SAMPLES, platform, here)
    if not getattr(a, "out", None):
        if default != SAMPLES / platform and int(os.environ.get("RANK", "0")) == 0:
            _log(f"{SAMPLES / platform} holds another machine's samples: this machine's go to {default}")
        return default
    try:
        store_io_mod().check_same_machine(Path(a.out), here, hint=f"Leave out --out to sample into {default} "
                                                                f"(this machine's folder), or name an empty folder.")
    except store_io_mod().ForeignSamples as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return None
    return Path(a.out)


def store_io_mod():
    from bench.sampling import store_io
    return store_io


def cmd_ops(a) -> int:
    from bench.sampling.sampler import run_ops
    ws = int(os.environ.get("WORLD_SIZE", "1"))
    if a.dtype == "fp8":  # FP8 GEMMs: a CUDA device with FP8 tensor cores, or a clear refusal
        from bench.kernels.opbench import fp8_supported
        ok, why = fp8_supported(a.device)
        if not ok:
            print(f"bench ops --dtype fp8: {why}; nothing sampled", file=sys.stderr)
            return 2
    out = sample_dir(a, a.platform, f"{a.platform}-fp8" if a.dtype == "fp8" else None)
    if out is None:
        return 2
    if a.ranks and a.ranks > 1 and ws == 1:  # launch ourselves under torchrun, every rank on the same set
        if not a.out:
            a._argv = [*a._argv, "--out", str(out)]
        return relaunch(a, "--ranks", a.ranks)
    q = quiet_check(a) if int(os.environ.get("RANK", "0")) == 0 else None
    if a.ops:
        ops = tuple(a.ops)
    elif a.dtype == "fp8":
        from bench.sampling.gpu_ops import FP8_OPS
        ops = FP8_OPS
    else:
        ops = D.DEFAULT_OPS + (D.UNFUSED_ATTENTION_OPS if a.unfused else ())
    run_ops(a.platform, out, ops=ops, device=a.device, dtype=a.dtype,
            threads=a.threads or (1 if ws > 1 else None), budget_s=a.budget_s, n_per_op=a.n_per_op,
            profile=a.profile, tps=tuple(a.tp), seed=a.seed, quiet_info=q, show_progress=not a.no_progress,
            guard_interference=not a.no_guard, log=_log)
    _end_process_group()
    return 0


def _end_process_group() -> None:
    """Leave torch.distributed cleanly under torchrun: a rank that exits with its gloo group still up can abort
    ("terminate called without an active exception"), and torchrun then fails the whole job."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def cmd_collectives(a) -> int:
    from bench.sampling.collectives import run_collectives
    if "RANK" not in os.environ:
        if not a.launch_local:
            print("run under torchrun (e.g. torchrun --standalone --nproc_per_node 2 -m bench collectives ...) "
                  "or pass --launch-local N", file=sys.stderr)
            return 2
        out = sample_dir(a, a.platform)
        if out is None:
            return 2
        if not a.out:
            a._argv = [*a._argv, "--out", str(out)]
        return relaunch(a, "--launch-local", a.launch_local)
    out = sample_dir(a, a.platform)
    if out is None:
        return 2
    q = quiet_check(a) if os.environ.get("RANK") == "0" else None
    run_collectives(a.platform, out, device=a.device, dtype=a.dtype,
                    collectives=tuple(a.collectives), n_sizes=a.sizes, min_bytes=a.min_bytes,
                    max_bytes=a.max_bytes, budget_s=a.budget_s, threads=a.threads, quiet_info=q,
                    show_progress=not a.no_progress, guard_interference=not a.no_guard, log=_log)
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def cmd_grouped_gemm(a) -> int:
    """Grouped expert GEMMs (mlp_up / mlp_down of E experts in one call) on a GPU: bench/sampling/gpu_ops.py."""
    from bench.sampling.gpu_ops import run_grouped
    out = sample_dir(a, a.platform, f"{a.platform}-grouped-gemm")
    if out is None:
        return 2
    if a.device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            print("bench grouped-gemm: torch.cuda.is_available() is False; nothing sampled", file=sys.stderr)
            return 2
    run_grouped(a.platform, out, device=a.device, dtype=a.dtype, n_per_op=a.n_per_op, profile=a.profile,
                seed=a.seed, impl=a.impl, budget_s=a.budget_s, show_progress=not a.no_progress,
                guard_interference=not a.no_guard, log=_log)
    return 0


def cmd_ring(a) -> int:
    """One ring-attention step (context parallelism) over the job's ranks: bench/sampling/ring.py (run under
    torchrun)."""
    from bench.sampling.ring import run_ring
    if "RANK" not in os.environ:
        if not a.launch_local:
            print("run under torchrun (e.g. torchrun --standalone --nproc_per_node 8 -m bench ring ...) "
                  "or pass --launch-local N", file=sys.stderr)
            return 2
        out = sample_dir(a, a.platform, f"{a.platform}-ring")
        if out is None:
            return 2
        if not a.out:
            a._argv = [*a._argv, "--out", str(out)]
        return relaunch(a, "--launch-local", a.launch_local, wait_quiet=False)
    out = sample_dir(a, a.platform, f"{a.platform}-ring")
    if out is None:
        return 2
    run_ring(a.platform, out, device=a.device, dtype=a.dtype, n_points=a.n_points, profile=a.profile, seed=a.seed,
             budget_s=a.budget_s, reps=a.reps, threads=a.threads, log=_log)
    _end_process_group()
    return 0


def cmd_gpu_quick(a) -> int:
    """One unattended pass over a lent GPU within --budget-s (bench/sampling/gpu_quick.py)."""
    from bench.sampling.gpu_quick import default_platform, describe, process_age_s, run_quick
    if a.device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            print("bench gpu-quick: torch.cuda.is_available() is False; nothing sampled (--device cpu --profile "
                  "tiny tries it without a GPU)", file=sys.stderr)
            return 2
        platform = a.platform or default_platform(torch.cuda.get_device_name(torch.device(a.device)))
    else:
        platform = a.platform or "quick-cpu"
    out = sample_dir(a, platform)
    if out is None:
        return 2
    run = run_quick(out, platform=platform, device=a.device, dtype=a.dtype, profile=a.profile,
                    budget_s=a.budget_s, sustained_s=a.sustained_s, phases=tuple(a.phases), seed=a.seed, log=_log,
                    already_spent_s=process_age_s())
    print(describe(run))
    return 0 if run["stopped"] == "all phases finished" else 3


def cmd_speed_check(a) -> int:
    """Re-time a few of the platform's sampled shapes; print (and with --save store) the speed factor."""
    from dataclasses import asdict

    from bench.sampling.speed import run_speed_check
    from predictor.hardware.speed import save_speed_check
    from predictor.plan.predict import default_models_dir
    ws = int(os.environ.get("WORLD_SIZE", "1"))
    if a.ranks and a.ranks > 1 and ws == 1:  # launch ourselves under torchrun
        return relaunch(a, "--ranks", a.ranks, wait_quiet=False)
    try:
        samples = Path(a.samples) if a.samples else speed_check_samples(a.platform, a.models_dir)
        from bench.env import this_machine
        from bench.sampling.store_io import check_same_machine
        check_same_machine(samples, this_machine(), hint="The speed check compares this machine with its own "
                           "samples: sample it first (`python -m bench cpu-platform`).")
        sc = run_speed_check(a.platform, samples, threads=a.threads, per_op=a.per_op, log=_log)
    except ValueError as exc:
        print(f"speed-check: {exc}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    print(json.dumps(asdict(sc), indent=2, default=str))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(asdict(sc), indent=2, default=str) + "\n")
    if a.save:
        try:
            path = save_speed_check(a.models_dir or default_models_dir(), sc)
        except ValueError as exc:
            print(f"speed-check: not saved: {exc}", file=sys.stderr)
            return 2
        _log(f"saved {path}: {sc.describe()}")
    return 0


def speed_check_samples(platform: str, models_dir: str | None) -> Path:
    """The sample set the platform's models were trained on (their sampled_on.json), else this machine's
    default set of the platform."""
    from bench.env import this_machine
    from bench.sampling.store_io import sample_set_dir
    from predictor.hardware.machine import read_sampled_on
    from predictor.paths import models_dir as mdir
    try:
        rec = read_sampled_on(platform, models_dir or mdir())
    except ValueError:
        rec = None
    if rec and rec.get("samples_dir"):
        d = Path(rec["samples_dir"])
        d = d if d.is_absolute() else REPO / d
        if d.is_dir():
            return d
    return sample_set_dir(SAMPLES, platform, this_machine())


def cmd_context(a) -> int:
    from bench.cpu.context import run_context
    ws = int(os.environ.get("WORLD_SIZE", "1"))
    out = sample_dir(a, a.platform)
    if out is None:
        return 2
    if a.ranks and a.ranks > 1 and ws == 1:
        if not a.out:
            a._argv = [*a._argv, "--out", str(out)]
        return relaunch(a, "--ranks", a.ranks)
    if int(os.environ.get("RANK", "0")) == 0 and not a.no_wait:
        quiet_check(a)
    run_context(a.platform, out, threads=a.threads or (1 if ws > 1 else None), budget_s=a.budget_s, log=_log)
    return 0


def cmd_sampled_on(a) -> int:
    """Record which machine (and sample set) a platform's models come from, after a manual
    `python -m predictor train`: models_store/<platform>/sampled_on.json."""
    from bench.cpu.loop import record_sampled_on
    from predictor.paths import models_dir as mdir
    samples = Path(a.samples) if a.samples else SAMPLES / a.platform
    try:
        path = record_sampled_on(a.platform, samples, a.models_dir or mdir(), "python -m bench sampled-on")
    except ValueError as exc:
        print(f"sampled-on: {exc}", file=sys.stderr)
        return 2
    print(path.read_text(), end="")
    return 0


def cmd_host_floor(a) -> int:
    """Measure the host floor per layer pass on this CPU; print it; with --save write models_store/host_floor.json
    unless the saved floor of another machine is the tighter (higher) lower bound (--replace: write anyway)."""
    from bench.sampling.host_floor import measure_cuda_graph_shares, measure_host_floor, measure_moe_host_passes
    from predictor.step.host_floor import save_cuda_graph_shares, save_moe_passes, save_tighter_floor
    if not a.no_wait:
        quiet_check(a)
    if a.cuda_graphs:
        cg = measure_cuda_graph_shares(rounds=a.rounds, iters=a.iters, log=_log)
        print(json.dumps({k: cg[k] for k in ("scope_host_passes", "scope_host_passes_iqr", "replay_host_passes",
                                             "replay_host_passes_iqr", "measured_at")}, indent=2))
        if a.save:
            print(f"saved under 'cuda_graphs' in {save_cuda_graph_shares(cg, a.models_dir)}")
        return 0
    if a.moe:
        moe = measure_moe_host_passes(rounds=a.rounds, iters=a.iters, log=_log)
        print(json.dumps({k: moe[k] for k in ("moe_layer_host_passes", "moe_layer_host_passes_iqr",
                                              "moe_host_passes_per_local_expert",
                                              "moe_host_passes_per_local_expert_iqr",
                                              "dense_kernels_per_layer_pass", "moe_kernels_per_layer_pass",
                                              "measured_at")}, indent=2))
        if a.save:
            print(f"saved under 'moe' in {save_moe_passes(moe, a.models_dir)}")
        return 0
    rec = measure_host_floor(rounds=a.rounds, iters=a.iters, log=_log)
    print(json.dumps({k: rec[k] for k in ("host_s_per_layer_pass", "fwd_bwd_s_per_layer_iqr",
                                          "kernels_per_layer_pass", "measured_at")}, indent=2))
    print(f"machine: {rec['machine']['short']}")
    if a.save:
        path, why = save_tighter_floor(rec, a.models_dir, replace=a.replace)
        print(f"wrote {path}" if path is not None else f"not written: {why} (--replace writes this one anyway)")
    return 0


def cmd_curve(a) -> int:
    from bench.sampling.curve import print_curve
    for s in a.samples or [speed_check_samples(p, None) for p in ("cpu-2t", "cpu-1t")]:
        print_curve(s, a.platform)
    return 0


def cmd_fit_network(a) -> int:
    net = fit_network(Path(a.samples), a.platform)
    print(net.to_json())
    if a.write:
        from predictor.hardware.network import save_network
        from predictor.regress.regressors import MODELS_DIR
        path = Path(a.models_dir or MODELS_DIR) / a.platform / "network.json"
        save_network(net, path)
        _log(f"wrote {path}")
    return 0


def cmd_cpu_platform(a) -> int:
    """Everything for this machine's CPU, phase by phase with budgets, resumable on the same machine
    (bench/cpu/loop.py): device facts, samples for cpu-2t and cpu-1t, collectives, per-op and in-context
    timings, ingest + training, the end-to-end calibration and a speed check."""
    from bench.cpu.loop import run
    return run(a, log=_log)


def drop_platform_samples(platform: str, store: str | None) -> int:
    """Delete a platform's op / collective samples (and the batches left without rows) from the store,
    so that re-sampled directories replace, rather than add to, earlier measurements."""
    from bench.sampling.store_io import drop_platform_rows
    return drop_platform_rows(platform, store)


# --------------------------------------------------------------------------- parser
def _common(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--quiet-load", type=float, default=0.5, help="wait until the 1-min load average is below this")
    sp.add_argument("--max-wait-s", type=float, default=1200, help="longest wait for a quiet machine")
    sp.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine (development)")
    sp.add_argument("--no-guard", action="store_true",
                    help="keep measurements during which other processes took CPU time (default: redo them)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("info", help="hardware and software facts")
    sp.add_argument("--device", default="cpu")
    sp.add_argument("--threads", type=int)
    sp.set_defaults(fn=cmd_info)

    sp = sub.add_parser("device", help="measure peak GEMM TFLOP/s and STREAM-like copy bandwidth")
    sp.add_argument("--device", default="cpu")
    sp.add_argument("--threads", type=int, default=None)
    sp.add_argument("--dtype", default="fp32")
    sp.add_argument("--write", metavar="DEVICE_ID", help="upsert the entry into predictor/catalog/devices.json")
    _common(sp)
    sp.set_defaults(fn=cmd_device)

    sp = sub.add_parser("ops", help="sample operators (space-filling plan, resumable)")
    sp.add_argument("--platform", required=True)
    sp.add_argument("--out", help="sample directory (default bench/samples/<platform>, or "
                                  "bench/samples/machine-<id>/<platform> when that holds another machine's samples)")
    sp.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    sp.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16", "fp8"],
                    help="fp8: FP8 GEMMs (torch._scaled_mm) of qkv_proj / attn_out_proj / mlp_up / mlp_down on a "
                         "GPU with compute capability >= 8.9, into <platform>-fp8 by default")
    sp.add_argument("--threads", type=int, help="torch CPU threads per process")
    sp.add_argument("--budget-s", type=float, help="stop after this many seconds of sampling")
    sp.add_argument("--n-per-op", type=int, default=64, help="design points per op (each gives fwd + bwd rows)")
    sp.add_argument("--ops", nargs="+", choices=sorted(D._DIMS), help="default: the ops GPT/Llama with flash use")
    sp.add_argument("--unfused", action="store_true", help="also the unfused attention ops")
    sp.add_argument("--profile", default="cpu", choices=sorted(D.PROFILES))
    sp.add_argument("--tp", type=int, nargs="+", default=[1], help="tensor-parallel degrees to sample shapes for")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--ranks", type=int, help="launch N concurrent ranks under torchrun (contended sampling)")
    sp.add_argument("--no-progress", action="store_true")
    _common(sp)
    sp.set_defaults(fn=cmd_ops)

    sp = sub.add_parser("collectives", help="sample collectives (run under torchrun)")
    sp.add_argument("--platform", required=True)
    sp.add_argument("--out")
    sp.add_argument("--device", default="cpu")
    sp.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16"])
    from bench.sampling.collectives import COLLECTIVES
    sp.add_argument("--collectives", nargs="+", default=list(COLLECTIVES), choices=list(COLLECTIVES))
    sp.add_argument("--sizes", type=int, default=24, help="message sizes per collective")
    sp.add_argument("--min-bytes", type=int, default=1024)
    sp.add_argument("--max-bytes", type=int, default=256 * 2**20)
    sp.add_argument("--budget-s", type=float)
    sp.add_argument("--threads", type=int, default=1)
    sp.add_argument("--launch-local", type=int, metavar="N", help="launch N local ranks with torchrun")
    sp.add_argument("--no-progress", action="store_true")
    _common(sp)
    sp.set_defaults(fn=cmd_collectives)

    sp = sub.add_parser("grouped-gemm", help="grouped expert GEMMs on a GPU (torch._grouped_mm, else a per-expert "
                                             "loop), recorded as per-expert mlp_up / mlp_down samples")
    sp.add_argument("--platform", required=True)
    sp.add_argument("--out", help="default bench/samples/<platform>-grouped-gemm (kept apart from dense GEMMs)")
    sp.add_argument("--device", default="cuda")
    sp.add_argument("--dtype", default="bf16", choices=["fp32", "fp16", "bf16"])
    sp.add_argument("--impl", default="auto", choices=["auto", "grouped_mm", "loop"])
    sp.add_argument("--n-per-op", type=int, default=48)
    sp.add_argument("--profile", default="gpu", choices=sorted(D.PROFILES))
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--budget-s", type=float)
    sp.add_argument("--no-progress", action="store_true")
    _common(sp)
    sp.set_defaults(fn=cmd_grouped_gemm)

    from bench.sampling import gpu_quick as GQ
    sp = sub.add_parser("gpu-quick", help="one unattended pass over a lent GPU in --budget-s (default 480 s): "
                                          "training GEMMs (fwd, dgrad, wgrad), flash attention, RMSNorm / SwiGLU "
                                          "/ cross-entropy, a 60 s sustained GEMM with clocks, power, temperature")
    sp.add_argument("--platform", help="default quick-<device name>")
    sp.add_argument("--out", help="default bench/samples/<platform>")
    sp.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (with --profile tiny: a try-out)")
    sp.add_argument("--dtype", default="bf16", choices=["fp32", "fp16", "bf16"])
    sp.add_argument("--profile", default="gpu", choices=sorted(GQ.PROFILES))
    sp.add_argument("--budget-s", type=float, default=GQ.DEFAULT_BUDGET_S,
                    help="the whole command stops by then, start-up included (default %(default)s)")
    sp.add_argument("--sustained-s", type=float, help=f"sustained GEMM seconds (default {GQ.DEFAULT_SUSTAINED_S:g}, "
                                                      f"at most {GQ.SUSTAINED_MAX_SHARE:.0%} of the budget)")
    sp.add_argument("--phases", nargs="+", default=list(GQ.PHASES), choices=list(GQ.PHASES))
    sp.add_argument("--seed", type=int, default=0)
    sp.set_defaults(fn=cmd_gpu_quick)

    sp = sub.add_parser("ring", help="one ring-attention step (context parallelism) over the job's ranks: attention "
                                     "blocks, the K/V exchange and both overlapped (run under torchrun)")
    sp.add_argument("--platform", required=True)
    sp.add_argument("--out", help="default bench/samples/<platform>-ring")
    sp.add_argument("--device", default="cuda")
    sp.add_argument("--dtype", default="bf16", choices=["fp32", "fp16", "bf16"])
    sp.add_argument("--n-points", type=int, default=32, help="flash_attn design points (seq = one rank's block)")
    sp.add_argument("--profile", default="gpu", choices=sorted(D.PROFILES))
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--reps", type=int, default=10, help="timed repeats per measurement (the same on every rank)")
    sp.add_argument("--budget-s", type=float)
    sp.add_argument("--threads", type=int, default=1)
    sp.add_argument("--launch-local", type=int, metavar="N", help="launch N local ranks with torchrun")
    _common(sp)
    sp.set_defaults(fn=cmd_ring)

    sp = sub.add_parser("curve", help="regressor error vs number of samples")
    sp.add_argument("--samples", nargs="+", help="default: this machine's cpu-2t and cpu-1t sets")
    sp.add_argument("--platform")
    sp.set_defaults(fn=cmd_curve)

    sp = sub.add_parser("fit-network", help="calibrate a platform's link from its collective samples")
    sp.add_argument("--samples", required=True)
    sp.add_argument("--platform", required=True)
    sp.add_argument("--write", action="store_true", help="save it as models_store/<platform>/network.json")
    sp.add_argument("--models-dir")
    sp.set_defaults(fn=cmd_fit_network)

    sp = sub.add_parser("speed-check", help="re-time a few sampled shapes: how fast is the machine now vs its samples")
    sp.add_argument("--platform", required=True)
    sp.add_argument("--samples", help="sample directory (default: the set the platform's models were trained on, "
                                      "from its sampled_on.json; else this machine's set of the platform)")
    sp.add_argument("--threads", type=int, help="default: the threads of the sampling run")
    sp.add_argument("--per-op", type=int, default=2, help="sampled shapes re-timed per op")
    sp.add_argument("--ranks", type=int, help="launch N concurrent ranks under torchrun (as the platform was sampled)")
    sp.add_argument("--save", action="store_true",
                    help="write models_store/<platform>/speed_check.json: predictions scale measured op times by it")
    sp.add_argument("--models-dir")
    sp.add_argument("--json-out", help="also write the result to this file")
    sp.set_defaults(fn=cmd_speed_check)

    sp = sub.add_parser("context",
                        help="per-op framework cost and whole HF layers vs their operators (bench/cpu/context.py)")
    sp.add_argument("--platform", required=True)
    sp.add_argument("--out", help="sample set to add context.json to (default: this machine's set of the platform)")
    sp.add_argument("--threads", type=int)
    sp.add_argument("--budget-s", type=float, default=60.0)
    sp.add_argument("--ranks", type=int, help="launch N concurrent ranks under torchrun (as cpu-1t was sampled)")
    _common(sp)
    sp.set_defaults(fn=cmd_context)

    sp = sub.add_parser("sampled-on", help="write models_store/<platform>/sampled_on.json from a sample set's machine "
                                           "(after a manual `python -m predictor train`)")
    sp.add_argument("--platform", required=True)
    sp.add_argument("--samples", help="the sample set the models were trained on (default bench/samples/<platform>)")
    sp.add_argument("--models-dir")
    sp.set_defaults(fn=cmd_sampled_on)

    sp = sub.add_parser("host-floor", help="host time an eager framework needs per transformer layer pass, measured "
                                           "on this CPU (a lower bound for calibrate-framework's host term)")
    from bench.sampling.host_floor import DEFAULT_ROUNDS
    sp.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                    help=f"rounds of the short and long stacks (default {DEFAULT_ROUNDS}); the floor is their median")
    sp.add_argument("--iters", type=int, default=40, help="forward + backward steps per stack and round")
    sp.add_argument("--save", action="store_true", help="write models_store/host_floor.json (or under --models-dir) "
                                                        "unless another machine's saved floor is higher (the tighter "
                                                        "lower bound)")
    sp.add_argument("--replace", action="store_true", help="with --save: write even a lower floor")
    sp.add_argument("--moe", action="store_true", help="measure instead how many dense layer passes of host time a "
                                                       "Megatron-Core MoE layer pass takes (with --save: kept under "
                                                       "'moe' in host_floor.json, the dense floor untouched)")
    sp.add_argument("--cuda-graphs", dest="cuda_graphs", action="store_true",
                    help="measure instead the host time of the parts Megatron-Core's per-layer CUDA graphs capture "
                         "(attn, mlp, moe_router, moe_preprocess) and of one replay, in dense layer passes (with "
                         "--save: kept under 'cuda_graphs' in host_floor.json)")
    sp.add_argument("--models-dir")
    _common(sp)
    sp.set_defaults(fn=cmd_host_floor)

    from bench.cpu.loop import DEFAULT_PHASES, OLD_NAMES, PHASES
    sp = sub.add_parser("cpu-platform", help="the whole loop for this machine's CPU (cpu-2t, cpu-1t): sample, train, "
                                             "calibrate end to end, speed check; --plan shows it without measuring")
    sp.add_argument("--plan", "--dry-run", action="store_true", dest="plan",
                    help="print the phases, their budgets and where everything goes; measure nothing")
    sp.add_argument("--fresh", action="store_true",
                    help="sample from scratch: this machine's earlier sets and loop record move to previous/<time>/")
    sp.add_argument("--phases", nargs="+", choices=list(PHASES), metavar="PHASE",
                    help=f"run only these ({', '.join(PHASES)}; default: {' '.join(DEFAULT_PHASES)})")
    sp.add_argument("--steps", nargs="+", choices=list(PHASES) + list(OLD_NAMES), help=argparse.SUPPRESS)
    sp.add_argument("--budget", action="append", metavar="PHASE=SECONDS", help="a phase's budget (repeatable)")
    sp.add_argument("--out-root", default=str(SAMPLES))
    sp.add_argument("--no-catalog", action="store_true",
                    help="leave predictor/catalog/*.json alone (default: cpu-host, cpu-2t, cpu-1t get this machine's "
                         "measured device and loopback figures); only where the catalog's cpu-host is this machine "
                         "within 25 %%, else the loop stops at the device phase (the models are judged against it)")
    sp.add_argument("--store", help="sample store (default: the project's store)")
    sp.add_argument("--models-dir")
    sp.add_argument("--budget-2t", type=float, help="seconds of cpu-2t op sampling (same as --budget ops-2t=S)")
    sp.add_argument("--budget-1t", type=float, help="seconds of cpu-1t op sampling (same as --budget ops-1t=S)")
    sp.add_argument("--budget-coll", type=float, help="seconds of gloo collective sampling (--budget coll-1t=S)")
    sp.add_argument("--no-progress", action="store_true")
    sp.add_argument("--coll-sizes", type=int, default=20)
    sp.add_argument("--n-per-op", type=int, default=96)
    sp.add_argument("--profile", default="cpu", choices=["cpu", "cpu-wide"],
                    help="operator shape domain (bench/sampling/design.py); cpu-wide also samples 4096-token heads, "
                         "hidden-1024 MLPs and large optimizers instead of extrapolating to them (slower points)")
    _common(sp)
    sp.set_defaults(fn=cmd_cpu_platform)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    from bench.allocator import use_caching_malloc
    use_caching_malloc()  # every sampler, every torchrun rank (each runs main); see bench/allocator.py
    a._argv = argv
    return int(a.fn(a) or 0)

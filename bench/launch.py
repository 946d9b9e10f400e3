"""Launching bench commands: the quiet-machine gate before a sampling phase, and torchrun of `python -m bench`
on this machine (used by the CLI and by the CPU loop)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


QUIET_ENV = "BENCH_QUIET_INFO"  # the quiet-machine check a parent process made, passed to its torchrun ranks


def quiet_check(a) -> dict | None:
    from bench.env import wait_quiet
    if getattr(a, "no_wait", False):
        from bench.env import loadavg
        parent = os.environ.get(QUIET_ENV)
        if parent:
            return {**json.loads(parent), "loadavg_at_rank_start": list(loadavg())}
        return {"quiet": None, "waited_s": 0, "loadavg_end": list(loadavg()), "note": "--no-wait"}
    return wait_quiet(a.quiet_load, a.max_wait_s, log=log)


def gate(a, first: bool) -> dict:
    """The check before a sampling phase of `cpu-platform`. The first phase waits for a quiet machine
    (1-min load average below --quiet-load). Later phases follow our own work, which holds the load
    average up for minutes (it decays with a 1-minute time constant), so they instead wait until
    other processes use under OTHERS_MAX_SHARE of a core (/proc/stat, bench.env.wait_calm)."""
    from bench.env import OTHERS_MAX_SHARE, loadavg, wait_calm
    if first or getattr(a, "no_wait", False):
        return quiet_check(a)
    w = wait_calm(a.max_wait_s, log=log)
    return {"quiet": "calm", "waited_s": round(w, 1), "loadavg_end": list(loadavg()),
            "note": f"follows this run's own previous phase: other processes used < {OTHERS_MAX_SHARE} core "
                    f"for 3 s (/proc/stat) before it started"}


def torchrun(nproc: int, args: list[str], timeout: float | None = None, quiet: dict | None = None) -> int:
    """Run `python -m bench <args>` under torchrun (torch.distributed.run) on this machine."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "bench", *args]
    log("launch: torchrun " + " ".join(cmd[3:]))
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if quiet:
        env[QUIET_ENV] = json.dumps(quiet, default=str)
    return subprocess.run(cmd, cwd=REPO, env=env, timeout=timeout, check=False).returncode


def relaunch(a, flag: str, nproc: int, wait_quiet: bool = True) -> int:
    """Run this same command again under torchrun with `nproc` ranks, `flag N` removed from its
    arguments. With `wait_quiet` the launcher waits for a quiet machine once (unless --no-wait) and
    the ranks skip their own wait."""
    args = list(a._argv)
    i = args.index(flag)
    del args[i:i + 2]
    if not wait_quiet:
        return torchrun(nproc, args)
    q = None if a.no_wait else quiet_check(a)
    return torchrun(nproc, args + ([] if "--no-wait" in args else ["--no-wait"]), quiet=q)

"""Hardware and software facts recorded with every run, and the quiet-machine rule.

Timing on a loaded machine is wrong, so every phase that produces numbers we keep starts with
`wait_quiet()`: it waits (up to a limit) until the 1-minute load average is below a threshold and
returns what it saw, which the caller writes into the manifest.
"""
from __future__ import annotations

import os
import platform as _platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from predictor.hardware.machine import cpu_caches

QUIET_LOAD = 0.5
MAX_WAIT_S = 1200.0


def loadavg() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:  # not available (Windows)
        return (float("nan"),) * 3


def wait_quiet(threshold: float = QUIET_LOAD, max_wait_s: float = MAX_WAIT_S, poll_s: float = 10.0,
               log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Sleep until the 1-minute load average is below `threshold` (at most `max_wait_s`).
    Returns {'quiet', 'waited_s', 'loadavg_start', 'loadavg_end', 'threshold'}."""
    t0 = time.monotonic()
    start = loadavg()
    last_log = -1e9
    while True:
        la = loadavg()
        waited = time.monotonic() - t0
        if not (la[0] >= threshold):  # NaN counts as quiet: nothing to wait for
            return {"quiet": True, "waited_s": round(waited, 1), "loadavg_start": list(start),
                    "loadavg_end": list(la), "threshold": threshold}
        if waited >= max_wait_s:
            if log:
                log(f"machine never got quiet (1-min load {la[0]:.2f} >= {threshold} after {waited:.0f} s): "
                    "measuring anyway, recorded in the manifest")
            return {"quiet": False, "waited_s": round(waited, 1), "loadavg_start": list(start),
                    "loadavg_end": list(la), "threshold": threshold}
        if log and waited - last_log >= 60:
            log(f"waiting for a quiet machine: 1-min load {la[0]:.2f} (need < {threshold}), waited {waited:.0f} s")
            last_log = waited
        time.sleep(poll_s)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine()


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 2)
    except OSError:
        pass
    return None


def _nvidia_smi() -> dict[str, str]:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=10,
                           check=False)
        if r.returncode == 0 and r.stdout.strip():
            name, drv, mem, clk = [s.strip() for s in r.stdout.strip().splitlines()[0].split(",")]
            return {"nvidia_smi_name": name, "driver": drv, "nvidia_smi_memory": mem, "max_sm_clock": clk}
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return {}


def _git_commit() -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                           cwd=Path(__file__).resolve().parent, check=False)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def this_machine(threads: int | None = None):
    """This machine's fingerprint (predictor.hardware.machine) with the sampler's settings recorded beside it."""
    from bench.allocator import describe
    from predictor.hardware.machine import current
    m = current()
    m.threads = threads
    m.allocator = describe()["allocator"]
    return m


def facts(device: str = "cpu") -> dict[str, Any]:
    """What ran the measurement: device, memory, driver / CUDA, torch, threads, host, load."""
    import torch
    f: dict[str, Any] = {
        "host": socket.gethostname(), "os": _platform.platform(), "python": sys.version.split()[0],
        "torch": torch.__version__, "device_type": device.split(":")[0],
        "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
        "cpu_count": os.cpu_count(), "cpu_model": _cpu_model(), "ram_gib": _ram_gib(), "cpu_caches": cpu_caches(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "mkldnn": bool(torch.backends.mkldnn.is_available()),
        "loadavg": list(loadavg()), "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "repo_commit": _git_commit(),
    }
    from bench.allocator import describe
    f["host_allocator"] = describe()["allocator"]
    f["machine"] = this_machine(f["torch_threads"]).to_dict()  # predictor.hardware.machine: the CPU's fingerprint
    f["machine_id"] = f["machine"]["id"]
    try:
        import numpy
        f["numpy"] = numpy.__version__
    except ImportError:
        pass
    if device.startswith("cuda") and torch.cuda.is_available():
        idx = torch.device(device).index or 0
        p = torch.cuda.get_device_properties(idx)
        f.update({"device_name": p.name, "device_memory_gib": round(p.total_memory / 2**30, 2),
                  "sm_count": p.multi_processor_count, "compute_capability": f"{p.major}.{p.minor}",
                  "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                  "nccl": ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None})
        f.update(_nvidia_smi())
    else:
        f.update({"device_name": f["cpu_model"], "device_memory_gib": f["ram_gib"]})
    return f


# --------------------------------------------------------------------------- interference meter
# The 1-minute load average reacts too slowly to catch another process that runs for a few seconds
# in the middle of a measurement. /proc/stat counts the CPU time of the whole machine and
# /proc/self/stat that of this process (all its threads), so their difference over a measurement is
# the CPU time other processes took meanwhile: a measurement during which others used more than a
# small share of a core is thrown away and repeated once the machine is calm again.
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
OTHERS_MAX_SHARE = 0.08   # other processes' CPU, in cores averaged over the measurement
OTHERS_SLACK_S = 0.02     # plus this much CPU time in absolute terms (jiffy resolution, kernel threads)


def _machine_busy_jiffies() -> int | None:
    try:
        f = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        user, nice, system, _idle, _iowait, _irq, _softirq, steal = (int(x) for x in f[1:9])
        return user + nice + system + steal  # irq/softirq left out: our own loopback traffic lands there
    except (OSError, ValueError):
        return None


def _self_jiffies() -> int:
    try:
        s = Path("/proc/self/stat").read_text()
        fields = s[s.rindex(")") + 2:].split()
        return int(fields[11]) + int(fields[12])  # utime, stime (all threads)
    except (OSError, ValueError, IndexError):
        return 0


class Interference:
    """CPU time other processes use while we measure.

        m = Interference(); s = m.snap(); ...measure...; cores = m.others_cores(s)

    In a job with several ranks on one machine, pass the ranks' summed own jiffies (`own_jiffies`) so
    the sibling ranks do not count as interference."""

    available = _machine_busy_jiffies() is not None

    def snap(self) -> tuple[float, int, int]:
        return time.monotonic(), _machine_busy_jiffies() or 0, _self_jiffies()

    def delta(self, s0: tuple[float, int, int]) -> tuple[float, int, int]:
        t, tot, own = self.snap()
        return t - s0[0], tot - s0[1], own - s0[2]

    @staticmethod
    def others(wall_s: float, total_j: int, own_j: int) -> tuple[float, bool]:
        """(other processes' cores on average, disturbed?) from a delta."""
        other_s = max(0, total_j - own_j) / CLK_TCK
        cores = other_s / max(wall_s, 1e-3)
        return cores, other_s > OTHERS_SLACK_S + OTHERS_MAX_SHARE * wall_s


def wait_calm(max_wait_s: float = 600.0, slice_s: float = 1.0, calm_slices: int = 3,
              allreduce_max: Callable[[float], float] | None = None,
              log: Callable[[str], None] | None = None) -> float:
    """Sleep until other processes used under OTHERS_MAX_SHARE of a core for `calm_slices`
    consecutive slices (every rank agrees when `allreduce_max` is given). Returns seconds waited."""
    m = Interference()
    t0 = time.monotonic()
    calm = 0
    last_log = t0  # first message after a minute of waiting
    while calm < calm_slices and time.monotonic() - t0 < max_wait_s:
        s = m.snap()
        time.sleep(slice_s)
        wall, tot, own = m.delta(s)
        cores = max(0, tot - own) / CLK_TCK / wall
        if allreduce_max:
            cores = allreduce_max(cores)
        calm = calm + 1 if cores < OTHERS_MAX_SHARE else 0
        if log and time.monotonic() - last_log > 60:
            log(f"other processes use {cores:.2f} cores: waiting for calm ({time.monotonic() - t0:.0f} s)")
            last_log = time.monotonic()
    return time.monotonic() - t0

"""Timing one callable robustly.

CPU: warm-up calls (one for ops longer than 25 ms), then repeats timed one by one with `time.perf_counter_ns`; the
statistic is the median (robust to the odd preemption on a shared machine). The number of repeats adapts to
the op: enough to fill `target_s` of measured time, between `min_reps` and `max_reps`.

CUDA: the same protocol with a pair of CUDA events around each repeat (kernel time on the GPU
timeline, launch gaps included when the CPU cannot keep up, as in training); one synchronize at
the end. `setup()` (untimed) prepares each repeat's inputs, e.g. the forward graph whose backward
is timed.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LONG_OP_S = 0.025  # ops longer than this get one warm-up call instead of `warmup`


@dataclass
class Timing:
    median_s: float
    mean_s: float
    min_s: float
    iqr_s: float
    reps: int

    def as_dict(self) -> dict[str, float | int]:
        return {"median_s": self.median_s, "mean_s": self.mean_s, "min_s": self.min_s, "iqr_s": self.iqr_s,
                "reps": self.reps}


def _summary(xs: list[float]) -> Timing:
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return Timing(statistics.median(xs), statistics.fmean(xs), xs[0], q[2] - q[0], len(xs))


def time_call(run: Callable[[Any], Any], setup: Callable[[], Any] | None = None, *, device: str = "cpu",
              warmup: int = 2, min_reps: int = 3, max_reps: int = 30, target_s: float = 0.15,
              max_total_s: float = 5.0) -> Timing:
    """Time `run(setup())`: `warmup` untimed calls, then `min_reps..max_reps` timed repeats."""
    setup = setup or (lambda: None)
    if device.startswith("cuda"):
        return _time_cuda(run, setup, device, warmup, min_reps, max_reps, target_s, max_total_s)
    first = None
    for i in range(max(1, warmup)):
        a = setup()
        t0 = time.perf_counter_ns()
        run(a)
        dt = (time.perf_counter_ns() - t0) * 1e-9
        first = dt if first is None else min(first, dt)
        del a
        if i == 0 and dt > LONG_OP_S:  # a long op: one warm-up is enough (allocations amortised)
            break
    reps = int(min(max_reps, max(min_reps, math.ceil(target_s / max(first, 1e-7)))))
    reps = max(1, min(reps, max(min_reps, int(max_total_s / max(first, 1e-7)))))
    xs = []
    for _ in range(reps):
        a = setup()
        t0 = time.perf_counter_ns()
        run(a)
        xs.append((time.perf_counter_ns() - t0) * 1e-9)
        del a
    return _summary(xs)


def _time_cuda(run, setup, device, warmup, min_reps, max_reps, target_s, max_total_s) -> Timing:
    import torch
    dev = torch.device(device)
    with torch.cuda.device(dev):
        for _ in range(max(1, warmup)):
            a = setup()
            run(a)
            del a
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a = setup()
        s.record()
        run(a)
        e.record()
        torch.cuda.synchronize()
        first = max(s.elapsed_time(e) * 1e-3, 1e-7)
        del a
        reps = int(min(max_reps, max(min_reps, math.ceil(target_s / first))))
        reps = max(1, min(reps, max(min_reps, int(max_total_s / first))))
        pairs = []
        for _ in range(reps):
            a = setup()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            run(a)
            e.record()
            pairs.append((s, e, a))  # keep inputs alive until the events complete
        torch.cuda.synchronize()
        xs = [s.elapsed_time(e) * 1e-3 for s, e, _ in pairs]
    return _summary(xs)

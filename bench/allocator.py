"""The host allocator a CPU measurement runs with.

On a GPU, PyTorch's caching allocator keeps freed device memory for the next tensor, so neither the
operator samples nor a training step pay the operating system for fresh memory. On a CPU torch takes
its memory from the C library's malloc. glibc's defaults hand large blocks back to the kernel when
they are freed (mmap for blocks above a *dynamic* threshold, heap trimming), so the next step's
activations, gradients and AdamW temporaries page-fault their memory in again. On this VM a first
touch costs about 3 µs per 4 KiB page: in a Llama training step (hidden 1024, 64 M parameters) the
optimizer took 0.31-0.37 s instead of 0.16 s, the whole step 1.16-1.37 s instead of 0.98 s, and
because the dynamic threshold follows the history of the process, step times moved by 25 % from one
run to the next, and isolated operator samples did not match the same operators inside a step.

`use_caching_malloc()` makes glibc behave like a caching allocator: no mmap for large blocks and no
trimming (`mallopt(M_MMAP_MAX, 0)`, `mallopt(M_TRIM_THRESHOLD, INT_MAX)`), so freed memory stays in
the process for reuse, as jemalloc / tcmalloc (the usual advice for PyTorch on CPU) and PyTorch's
GPU allocator do. bench applies it to every sampler and to the end-to-end benchmark, and records it
in the facts of every run; the CPU platforms' predictions are for training under that setting.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from typing import Any

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
INT_MAX = 2**31 - 1
SYSTEM_ENV = "BENCH_SYSTEM_MALLOC"  # =1: leave the C library's defaults (to measure what they cost)

_STATE: dict[str, Any] = {"allocator": "system default (not changed by bench)", "caching": False}


def use_caching_malloc() -> dict[str, Any]:
    """Keep freed host memory in the process (glibc only); a no-op, with the reason, elsewhere or
    when $BENCH_SYSTEM_MALLOC=1. Returns the record that `describe()` gives later."""
    if os.environ.get(SYSTEM_ENV) == "1":
        _STATE.update(allocator="system default ($BENCH_SYSTEM_MALLOC=1)", caching=False)
        return dict(_STATE)
    if not sys.platform.startswith("linux"):
        _STATE.update(allocator=f"system default (caching setting needs glibc; this is {sys.platform})",
                      caching=False)
        return dict(_STATE)
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as e:  # musl and others have no mallopt
        _STATE.update(allocator=f"system default (no glibc mallopt: {e})", caching=False)
        return dict(_STATE)
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1
    _STATE.update(allocator="glibc malloc keeping freed memory (M_MMAP_MAX=0, M_TRIM_THRESHOLD=INT_MAX)"
                  if ok else "system default (mallopt refused the caching setting)", caching=ok)
    return dict(_STATE)


def describe() -> dict[str, Any]:
    """What this process runs with (for the facts recorded beside every measurement)."""
    return dict(_STATE)

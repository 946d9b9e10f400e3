"""Device facts the roofline needs, measured: peak GEMM throughput and a STREAM-like copy bandwidth,
and a small, targeted writer for `predictor/catalog/*.json` entries.

    python -m bench device --threads 2                  # print the measured entry
    python -m bench device --threads 2 --write cpu-host # upsert it into predictor/catalog/devices.json
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from bench import env
from bench.sampling.timing import time_call
from predictor import paths

CATALOG = paths.CATALOG_DIR


def peak_gemm_tflops(device: str = "cpu", dtype: str = "fp32", sizes: tuple[int, ...] = (1024, 1536, 2048, 3072)
                     ) -> dict[str, Any]:
    """Best square-GEMM throughput over a few sizes (best repeat per size: a peak is a maximum, and the best
    repeat is the one least disturbed by other processes)."""
    import torch
    dt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    per = {}
    for n in sizes:
        a = torch.randn(n, n, dtype=dt, device=device)
        b = torch.randn(n, n, dtype=dt, device=device)
        c = torch.empty(n, n, dtype=dt, device=device)
        t = time_call(lambda _, a=a, b=b, c=c: torch.mm(a, b, out=c), device=device, warmup=2, min_reps=3, max_reps=10,
                      target_s=1.0)
        per[n] = 2.0 * n ** 3 / t.min_s / 1e12
    best = max(per, key=per.get)
    return {"tflops": per[best], "best_size": best, "by_size": {str(k): round(v, 4) for k, v in per.items()}}


def stream_copy_gbps(device: str = "cpu", mib: int = 512) -> dict[str, Any]:
    """STREAM 'copy' (b[:] = a[:]) on fp32 arrays far larger than the last-level cache; counts
    read + write bytes and the best repeat, as STREAM does."""
    import torch
    n = mib * 2**20 // 4
    a = torch.ones(n, device=device)
    b = torch.empty(n, device=device)
    t = time_call(lambda _: b.copy_(a), device=device, warmup=2, min_reps=5, max_reps=10, target_s=1.0)
    return {"gbps": 2.0 * n * 4 / t.min_s / 1e9, "array_mib": mib, "best_s": t.min_s, "median_s": t.median_s}


def measure(device: str = "cpu", threads: int | None = None, dtype: str = "fp32") -> dict[str, Any]:
    import torch
    if threads:
        torch.set_num_threads(int(threads))
    f = env.facts(device)
    g = peak_gemm_tflops(device, dtype)
    s = stream_copy_gbps(device)
    return {"facts": f, "gemm": g, "stream": s, "threads": torch.get_num_threads(), "dtype": dtype}


def cpu_device_entry(m: dict[str, Any]) -> dict[str, Any]:
    f = m["facts"]
    l3 = f.get("cpu_caches", {}).get("L3", "0K")
    l3_mib = float(re.sub(r"[^0-9.]", "", l3) or 0) / (1024 if l3.upper().endswith("K") else 1)
    when = f["recorded_at"][:10]
    return {
        "name": f"{f['cpu_model']} ({f['cpu_count']} cores, host {f['host']})",
        "vendor": "cpu",
        "peak_tflops": {m["dtype"]: round(m["gemm"]["tflops"], 4)},
        "hbm_gib": f.get("ram_gib") or 0,
        "hbm_bandwidth_gbps": round(m["stream"]["gbps"], 2),
        "sm_count": f["cpu_count"],
        "l2_mib": round(l3_mib, 1),
        "sources": [f"measured on this machine by bench/sampling/device.py ({when}): peak = best torch.mm "
                    f"{m['dtype']} square GEMM with {m['threads']} threads (sizes {list(m['gemm']['by_size'])}); "
                    f"hbm_bandwidth_gbps = STREAM-like copy of {m['stream']['array_mib']} MiB fp32 arrays "
                    f"(read + write bytes, best repeat as STREAM reports); hbm_gib = RAM; sm_count = cores; "
                    f"l2_mib = last-level cache "
                    f"(1-min load average at measurement {f['loadavg'][0]:.2f}); torch {f['torch']}"],
    }


# How far this machine's measured peak GEMM rate or copy bandwidth may differ from the catalog's `cpu-host` before
# models trained with --no-catalog stop being about this machine: the regressors' physical bound (predictor/regress/
# regressors.py: a sample faster than 0.5 x roofline for compute-bound ops, 0.25 x for memory-bound ones, is dropped)
# is computed against the catalog's device, so on a CPU twice as fast as the catalog's most of its GEMM samples are
# dropped as impossible and those operators fall back to a transfer (an Intel Xeon family 6 model 167 at 0.346
# TFLOP/s against the catalog's EPYC at 0.147: cpu-2t predicted +40 % slow, 42 % MAPE, on 2026-12-01).
CATALOG_DEVICE_TOLERANCE = 0.25


def catalog_device_mismatch(measured: dict[str, Any], catalog: dict[str, Any] | None,
                            tolerance: float = CATALOG_DEVICE_TOLERANCE) -> str | None:
    """Why a device entry measured on this machine (`cpu_device_entry`) is not the catalog's entry the models will
    be trained and judged against, or None where they agree within `tolerance` (relative) on every peak and on the
    bandwidth. A catalog without the entry is a mismatch."""
    if not catalog:
        return "the catalog has no entry for this device"
    out = []
    for dtype, v in (measured.get("peak_tflops") or {}).items():
        c = (catalog.get("peak_tflops") or {}).get(dtype)
        if not c or abs(float(v) / float(c) - 1.0) > tolerance:
            out.append(f"peak {dtype} GEMM {float(v):g} TFLOP/s measured, {c if c else 'none'} in the catalog")
    bw, cbw = measured.get("hbm_bandwidth_gbps"), catalog.get("hbm_bandwidth_gbps")
    if bw and (not cbw or abs(float(bw) / float(cbw) - 1.0) > tolerance):
        out.append(f"copy bandwidth {float(bw):g} GB/s measured, {cbw if cbw else 'none'} in the catalog")
    return "; ".join(out) or None


def upsert_catalog_entry(file: str | Path, key: str, entry: dict[str, Any]) -> None:
    """Insert or replace one top-level entry of a catalog JSON file with a small textual edit (the
    rest of the file, its formatting included, is left as it is), then check the file still parses.
    Other people edit these files concurrently: read, edit and write in one short step."""
    path = Path(file)
    text = path.read_text()
    body = json.dumps(entry, indent=2).replace("\n", "\n  ")
    block = f'"{key}": {body}'
    data = json.loads(text)
    if key in data:
        start = text.index(f'"{key}":')
        i = text.index("{", start)
        depth, j, in_str, esc = 0, i, False, False
        while True:
            ch = text[j]
            if in_str:
                esc = (ch == "\\") and not esc
                if ch == '"' and not esc:
                    in_str = False
                elif ch != "\\":
                    esc = False
            elif ch == '"':
                in_str = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        new = text[:start] + block + text[j + 1:]
    else:
        end = text.rstrip().rfind("}")
        head = text[:end].rstrip()
        sep = "," if not head.endswith("{") else ""
        new = head + sep + "\n  " + block + "\n" + text[end:].lstrip("\n")
        if not new.endswith("\n"):
            new += "\n"
    parsed = json.loads(new)
    assert parsed[key] == entry
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(new)
    os.replace(tmp, path)
    from predictor.hardware import platforms  # the registry caches the catalog
    platforms.load_devices.cache_clear()
    platforms.load_platforms.cache_clear()

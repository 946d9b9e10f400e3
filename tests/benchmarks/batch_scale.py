"""predict-batch at scale: rows/s and peak memory for growing batches (memory must stay flat: the input
is streamed in chunks and the output written as it goes).

    python -m tests.benchmarks.batch_scale [--rows 100000] [--sizes 10000,100000] [--chunk-rows 5000]

Each size runs `python -m predictor predict-batch` in a fresh process on a generated file (Llama-3-8B
shapes over 3 platforms, 4 tp x 3 pp x 3 micro-batch x 3 sequence lengths, 1 % broken rows, 1 %
formula-looking case ids) and reports wall time, rows/s, the process's peak RSS (getrusage
ru_maxrss) and its RSS sampled every 0.25 s (first and last quarter of the run: flat means equal).
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from predictor.model.layout_io import BATCH_COLUMNS

REPO = Path(__file__).resolve().parents[2]


def generate(path: Path, n: int) -> None:
    combos = itertools.cycle(itertools.product(["dgx-a100-80gb", "perlmutter-a100", "dgx-h100"], [1, 2, 4, 8],
                                               [1, 2, 4], [1, 2, 4], [1024, 2048, 4096]))
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(BATCH_COLUMNS)
        for i in range(n):
            plat, tp, pp, mb, seq = next(combos)
            r = {"case_id": f"=c{i}" if i % 100 == 7 else str(i), "platform": plat, "arch": "llama", "layers": 32,
                 "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336, "vocab": 128256, "seq_len": seq,
                 "num_gpus": tp * pp * 8, "tp": tp, "pp": pp, "dp": 8, "micro_batch": mb, "global_batch": mb * 64,
                 "vpp": "", "schedule": "", "recompute": "selective", "sequence_parallel": str(tp > 1).lower(),
                 "zero_stage": 1, "precision": "bf16"}
            if i % 100 == 3:
                r["tp"] = 3  # a broken row: rejected with its message, the batch goes on
            w.writerow([r[c] for c in BATCH_COLUMNS])


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(inp: str, out: str, chunk_rows: int) -> None:
    """Run predict-batch in this process; print one JSON line with the timings and memory."""
    from predictor.cli.main import main
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.perf_counter(), _rss_mib()))
            stop.wait(0.25)
    t = threading.Thread(target=sample, daemon=True)
    t0 = time.perf_counter()
    t.start()
    rc = main(["predict-batch", "--input", inp, "--output", out, "--quiet", "--chunk-rows", str(chunk_rows)])
    wall = time.perf_counter() - t0
    stop.set()
    t.join()
    q = max(1, len(samples) // 4)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rc": rc, "wall_s": wall, "peak_rss_mib": rss_mib,
                      "rss_first_quarter_mib": statistics.median(v for _, v in samples[:q]),
                      "rss_last_quarter_mib": statistics.median(v for _, v in samples[-q:])}))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--sizes", help="comma-separated batch sizes (default: rows/10 and rows)")
    ap.add_argument("--chunk-rows", type=int, default=5000)
    ap.add_argument("--worker", nargs=2, metavar=("INPUT", "OUTPUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(*a.worker, a.chunk_rows)
        return
    sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else [a.rows // 10, a.rows]
    print(f"predict-batch scale (chunks of {a.chunk_rows:,} rows), {os.cpu_count()} CPUs")
    print(f"{'rows':>9} {'wall s':>8} {'rows/s':>9} {'peak RSS MiB':>13} {'RSS 1st/last quarter MiB':>25} "
          f"{'ok':>8} {'errors':>7} {'escaped':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            inp, out = Path(tmp) / f"in{n}.csv", Path(tmp) / f"out{n}.csv"
            generate(inp, n)
            p = subprocess.run([sys.executable, "-m", "tests.benchmarks.batch_scale", "--chunk-rows", str(a.chunk_rows),
                                "--worker", str(inp), str(out)], cwd=REPO, capture_output=True, text=True, check=True)
            r = json.loads(p.stdout.strip().splitlines()[-1])
            with open(out, newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
            ok = sum(x["error"] == "" for x in rows)
            escaped = sum(x["case_id"].startswith("'=") for x in rows)
            assert r["rc"] == 0 and len(rows) == n
            print(f"{n:>9,} {r['wall_s']:>8.1f} {n / r['wall_s']:>9,.0f} {r['peak_rss_mib']:>13.0f} "
                  f"{r['rss_first_quarter_mib']:>12.0f} / {r['rss_last_quarter_mib']:<10.0f} {ok:>8,} {n - ok:>7,} "
                  f"{escaped:>8,}")


if __name__ == "__main__":
    main()

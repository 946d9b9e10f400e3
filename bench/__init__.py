"""bench: lightweight samplers that measure operators and collectives on real hardware.

    python -m bench info                                   # hardware / software facts
    python -m bench device --threads 2                     # peak GEMM + STREAM-like copy -> devices.json entry
    python -m bench ops --platform cpu-2t --out bench/samples/cpu-2t --budget-s 600
    torchrun --nproc_per_node 2 -m bench collectives --platform cpu-1t --out bench/samples/cpu-1t
    python -m bench curve --samples bench/samples/cpu-2t   # regressor error vs number of samples
    python -m bench context --platform cpu-2t --threads 2  # per-op framework cost, HF layers vs their ops
    python -m bench cpu-platform --plan                    # the whole loop for this machine's CPU, planned
    python -m bench cpu-platform                           # ... and run (about 19 min on 2 cores)

Samples are written as Parquet shards plus a `manifest.json` in the project's own sample schema
(`docs/architecture.md`), so `python -m predictor ingest DIR` loads them; an interrupted run keeps
every finished shard and a rerun skips the shapes already measured, on the same machine only: the
manifest records the machine's fingerprint (predictor.machine), another machine's set is never
resumed, and without --out a machine whose default folder holds another machine's samples samples
into bench/samples/machine-<id>/<platform>.
"""

__all__ = ["env", "timing", "opbench", "design", "sampler", "collectives", "device", "curve", "context", "e2e",
           "loop", "store_io", "speed"]

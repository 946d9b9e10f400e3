"""bench: lightweight samplers that measure operators and collectives on real hardware.

    python -m bench info                                   # hardware / software facts
    python -m bench device --threads 2                     # peak GEMM + STREAM-like copy -> devices.json entry
    python -m bench ops --platform cpu-2t --out bench/samples/cpu-2t --budget-s 600
    torchrun --nproc_per_node 2 -m bench collectives --platform cpu-1t --out bench/samples/cpu-1t
    python -m bench curve --samples bench/samples/cpu-2t   # regressor error vs number of samples
    python -m bench context --platform cpu-2t --threads 2  # per-op framework cost, HF layers vs their ops
    python -m bench cpu-platform --plan                    # the whole loop for this machine's CPU, planned
    python -m bench cpu-platform                           # ... and run (about 19.5 min on 2 cores)

Samplers, and where they have run:
- `ops` (opbench, moe, design, sampler): the default plan, GEMMs, attention, norms, ... and the MoE token
  routing moe_router / moe_permute / moe_unpermute (top-k 2, variant "top2"). Ran on cpu-2t / cpu-1t of both
  CPUs; the MoE ops on machine-721472c952 only (bench/samples/machine-721472c952/).
- `collectives`: all-reduce, all-gather, reduce-scatter, p2p and all-to-all (message = one rank's send
  buffer). Ran over gloo on cpu-1t; all-to-all on machine-721472c952 only.
- `grouped-gemm` (gpu_ops, moe): E experts' mlp_up / mlp_down in one call (torch._grouped_mm, else a loop of
  per-expert GEMMs), a row = one expert's share. GPU only; not run yet.
- `ops --dtype fp8` (opbench.build_fp8_gemm): FP8 projection GEMMs with torch._scaled_mm, e4m3 forward / e5m2
  gradients, per-tensor scales; compute capability >= 8.9 only, refused with the reason elsewhere. Not run yet.
- `ring` (ring): one ring-attention step over the job's ranks (cp): causal and full SDPA blocks, the K/V
  exchange, and both overlapped. Run only by the tests (CPU, gloo, 2 ranks).

On a GPU node (one node of 8 GPUs; add srun / --nnodes for several, as for `collectives`):

    python -m bench ops --platform P --device cuda --dtype bf16 --profile gpu --ops moe_router moe_permute moe_unpermute
    python -m bench grouped-gemm --platform P --dtype bf16                       # -> bench/samples/P-grouped-gemm
    python -m bench ops --platform P --device cuda --dtype fp8 --profile gpu     # -> bench/samples/P-fp8
    torchrun --standalone --nproc_per_node 8 -m bench collectives --platform P --device cuda --dtype bf16 \
        --collectives alltoall
    torchrun --standalone --nproc_per_node 8 -m bench ring --platform P --device cuda --dtype bf16  # -> P-ring

The grouped-GEMM, FP8 and ring sets go to folders of their own: the store pools an op's samples over
variants and dtypes when it trains, and a grouped call's per-expert share, an FP8 GEMM or a non-causal
attention block is not the dense BF16 kernel of the same shape.

Samples are written as Parquet shards plus a `manifest.json` in the project's own sample schema
(`docs/architecture.md`), so `python -m predictor ingest DIR` loads them; an interrupted run keeps
every finished shard and a rerun skips the shapes already measured, on the same machine only: the
manifest records the machine's fingerprint (predictor.hardware.machine), another machine's set is never
resumed, and without --out a machine whose default folder holds another machine's samples samples
into bench/samples/machine-<id>/<platform>.
"""

__all__ = ["env", "timing", "opbench", "design", "sampler", "collectives", "device", "curve", "context", "e2e",
           "loop", "store_io", "speed", "moe", "gpu_ops", "ring"]

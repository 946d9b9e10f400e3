"""The CPU platforms' cluster entries (clusters.json) and the loopback network fit of cpu-1t (used by the CLI's
fit-network and by the CPU loop)."""
from __future__ import annotations

from pathlib import Path


def fit_network(samples_dir: Path, platform: str):
    """Calibrate the loopback 'link' of a platform from its collective samples (predictor.hardware.network)."""
    import pandas as pd

    from bench.sampling.store_io import read_shards
    from predictor.hardware.network import calibrate
    from predictor.hardware.platforms import get_platform
    df = read_shards(samples_dir, "coll")
    if df.empty:
        raise FileNotFoundError(f"no coll-*.parquet under {samples_dir}")
    df = df[df["collective"].isin(["allreduce", "allgather", "reducescatter"])]
    return calibrate(get_platform(platform), pd.DataFrame(df))


def cluster_entry_2t() -> dict:
    return {"description": "This machine's CPU as one training process with 2 threads (torch CPU, fp32); "
                           "no collectives (one process)",
            "device": "cpu-host", "gpus_per_node": 1,
            "intra_node": {"kind": "none", "bandwidth_gbps": 0, "latency_us": 0},
            "inter_node": {"kind": "none", "bandwidth_gbps": 0, "latency_us": 0},
            "op_models": "cpu-2t", "collective_models": None,
            "sources": ["bench/samples/cpu-2t (bench/ ops sampler, 2 threads)",
                        "host allocator: glibc malloc keeping freed memory (bench/allocator.py), for samples and "
                        "for the training runs it predicts"]}


def cluster_entry_1t(net) -> dict:
    bw = round(net.intra.bandwidth_gbps, 3) if net else 1.0
    lat = round(net.intra.latency_us, 1) if net else 50.0
    src = (f"intra_node fitted by predictor.hardware.network.calibrate on bench/samples/cpu-1t gloo all-reduce / "
           f"all-gather / reduce-scatter samples ({net.intra.n_samples} sizes, fit MAPE "
           f"{(net.intra.fit_mape or 0):.1%})" if net else "placeholder until the collectives are sampled")
    return {"description": "This machine's CPU as 2 data-parallel ranks on one node, one process of 1 thread "
                           "each, gloo collectives over loopback (torch CPU, fp32)",
            "device": "cpu-host", "gpus_per_node": 2,
            "intra_node": {"kind": "loopback-gloo", "bandwidth_gbps": bw, "latency_us": lat},
            "inter_node": {"kind": "none", "bandwidth_gbps": bw, "latency_us": lat},
            "op_models": "cpu-1t", "collective_models": "cpu-1t",
            # every core runs a rank's compute, so gloo's reduction cannot hide behind the backward
            "overlaps_comm_with_compute": False,
            "sources": ["bench/samples/cpu-1t (bench/ ops sampler, 2 concurrent ranks x 1 thread; "
                        "bench/ collective sampler, gloo)", src,
                        "host allocator: glibc malloc keeping freed memory (bench/allocator.py), for samples and "
                        "for the training runs it predicts"]}

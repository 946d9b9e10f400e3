"""Analytic collective times, calibrated on measured samples where a platform has them.

Model: hierarchical ring. A collective over `nodes` x `gpus_per_node` ranks runs its
intra-node phases over the node link and its inter-node phase over each GPU's share
of the node's network bandwidth:

    allreduce      = RS_intra + AR_inter(bytes / k) + AG_intra
    allgather / RS = (k-1)/k * B / bw_intra + (N-1)/N * B / bw_inter
    p2p            = latency + B / bw (intra if both ends share a node, else inter)

with k = gpus per node in the group, N = nodes, plus a per-step latency. Effective
bandwidths and latencies start from the link specs times a default efficiency and are
replaced by a least-squares fit (`calibrate`) on measured samples where they exist.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .platforms import Platform

DEFAULT_EFFICIENCY = 0.75  # achieved bus bandwidth / link spec, typical of NCCL rings (nccl-tests)


@dataclass(frozen=True)
class TierParams:
    bandwidth_gbps: float  # effective per-GPU bus bandwidth, GB/s
    latency_us: float      # per ring step
    source: str            # "link spec" or the samples it was fitted on
    n_samples: int = 0
    fit_mape: float | None = None


@dataclass(frozen=True)
class NetworkModel:
    intra: TierParams
    inter: TierParams

    def to_json(self) -> str:
        return json.dumps({"intra": asdict(self.intra), "inter": asdict(self.inter)}, indent=2)

    @staticmethod
    def from_json(text: str) -> "NetworkModel":
        d = json.loads(text)
        return NetworkModel(TierParams(**d["intra"]), TierParams(**d["inter"]))


def spec_network(platform: Platform) -> NetworkModel:
    """Uncalibrated: link specs times a default efficiency."""
    intra_bw = platform.intra_node.bandwidth_gbps or platform.inter_node.bandwidth_gbps
    return NetworkModel(
        TierParams(intra_bw * DEFAULT_EFFICIENCY, platform.intra_node.latency_us or 5.0, "link spec"),
        TierParams(platform.inter_node.bandwidth_gbps * DEFAULT_EFFICIENCY, platform.inter_node.latency_us or 10.0,
                   "link spec"),
    )


def _ring_terms(collective: str, message_bytes: np.ndarray, nodes: np.ndarray, gpn: np.ndarray):
    """(intra_bytes, intra_steps, inter_bytes, inter_steps): bytes each GPU moves per tier."""
    b = np.asarray(message_bytes, dtype=float)
    N = np.asarray(nodes, dtype=float)
    k = np.asarray(gpn, dtype=float)
    zeros = np.zeros_like(b)
    if collective == "p2p":
        inter = N > 1
        return np.where(inter, 0, b), np.where(inter, 0, 1), np.where(inter, b, 0), np.where(inter, 1, 0)
    intra_f = (k - 1) / np.maximum(k, 1)
    inter_f = (N - 1) / np.maximum(N, 1)
    if collective == "allreduce":
        # reduce-scatter + all-gather inside the node, all-reduce of the 1/k shard across nodes
        return 2 * intra_f * b, 2 * (k - 1), 2 * inter_f * b / np.maximum(k, 1), 2 * (N - 1)
    if collective in ("allgather", "reducescatter", "alltoall"):
        return intra_f * b, (k - 1), inter_f * b / np.maximum(k, 1) * 1.0, (N - 1)
    raise ValueError(f"unknown collective {collective!r}")


def analytic_time_s(net: NetworkModel, collective: str, message_bytes, nodes, gpus_per_node) -> np.ndarray:
    ib, isteps, xb, xsteps = _ring_terms(collective, message_bytes, nodes, gpus_per_node)
    t = (ib / (net.intra.bandwidth_gbps * 1e9) + isteps * net.intra.latency_us * 1e-6
         + xb / (net.inter.bandwidth_gbps * 1e9) + xsteps * net.inter.latency_us * 1e-6)
    ranks = np.asarray(nodes) * np.asarray(gpus_per_node)
    return np.where(ranks <= 1, 0.0, t)


def _fit_tier(samples: pd.DataFrame, tier: str, start: TierParams) -> TierParams:
    """Fit (bandwidth, latency) of one tier by non-negative least squares on relative error."""
    if samples.empty:
        return start
    rows = []
    for coll, g in samples.groupby("collective"):
        ib, isteps, xb, xsteps = _ring_terms(coll, g["message_bytes"].to_numpy(), g["nodes"].to_numpy(),
                                             g["gpus_per_node"].to_numpy())
        byt, steps = (ib, isteps) if tier == "intra" else (xb, xsteps)
        rows.append(pd.DataFrame({"bytes": byt, "steps": steps, "t": g["duration_s"].to_numpy()}))
    d = pd.concat(rows)
    d = d[(d["bytes"] > 0) & (d["t"] > 0)]
    if len(d) < 3:
        return start
    # robust: per (bytes, steps) median of repeated measurements, relative-error weights
    d = d.groupby(["bytes", "steps"], as_index=False)["t"].median()
    from scipy.optimize import nnls
    A = np.column_stack([d["bytes"] / d["t"], d["steps"] / d["t"]])
    coef, _ = nnls(A, np.ones(len(d)))
    inv_bw, lat = coef
    if inv_bw <= 0:
        return start
    pred = d["bytes"] * inv_bw + d["steps"] * lat
    mape = float(np.mean(np.abs(pred - d["t"]) / d["t"]))
    return TierParams(1.0 / inv_bw / 1e9, lat * 1e6, "fitted on measured samples", int(len(d)), mape)


def calibrate(platform: Platform, samples: pd.DataFrame) -> NetworkModel:
    """Fit the intra tier on single-node samples, then the inter tier on multi-node samples
    (with the intra tier fixed: its share is subtracted first)."""
    net = spec_network(platform)
    if samples is None or samples.empty:
        return net
    s = samples[samples["duration_s"] > 0]
    single = s[(s["nodes"] == 1) & (s["gpus_per_node"] > 1)]
    intra = _fit_tier(single, "intra", net.intra)
    net = NetworkModel(intra, net.inter)
    multi = s[s["nodes"] > 1].copy()
    if not multi.empty:
        parts = []
        for coll, g in multi.groupby("collective"):
            ib, isteps, _, _ = _ring_terms(coll, g["message_bytes"].to_numpy(), g["nodes"].to_numpy(),
                                           g["gpus_per_node"].to_numpy())
            g = g.copy()
            g["duration_s"] = g["duration_s"] - (ib / (intra.bandwidth_gbps * 1e9) + isteps * intra.latency_us * 1e-6)
            parts.append(g)
        multi = pd.concat(parts)
        net = NetworkModel(intra, _fit_tier(multi[multi["duration_s"] > 0], "inter", net.inter))
    return net


def save_network(net: NetworkModel, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(net.to_json())


def load_network(platform: Platform, models_dir: Path) -> NetworkModel:
    """The calibrated model of this platform if one was saved, else the spec model."""
    path = Path(models_dir) / platform.platform_id / "network.json"
    if path.exists():
        return NetworkModel.from_json(path.read_text())
    return spec_network(platform)

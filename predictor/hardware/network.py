"""Analytic collective times: NCCL-style ring / tree / NVLS algorithms with two protocols, over a
two-tier (intra-node, inter-node) network, calibrated on measured sweeps where a platform has them.

Message convention (as `decompose.CommCall`): `message_bytes` is the full buffer: the all-reduce
buffer, the all-gather OUTPUT, the reduce-scatter INPUT, the tensor a p2p sends. (The sample store
keeps the paper's convention, all-gather = per-rank input; `calibrate` converts.)

For a group of n = N nodes x k GPUs per node, each algorithm a and protocol p costs

    t(a, p) = base_p + (steps - xsteps) * lat_intra_p + xsteps * lat_inter_p + wire_a / bw_a_p

and, like NCCL's tuner (src/graph/tuning.cc), the fastest (a, p) is taken:

  ring    all-reduce wire 2(n-1)/n * S in 2(n-1) steps, 2(N-1) of them crossing nodes; all-gather /
          reduce-scatter (n-1)/n * S in n-1 steps. The ring is pipelined, so its bus bandwidth is
          that of its slowest hop: bw = intra(k) inside one node, min(intra(k), k * inter) across
          nodes (k rings, one NIC each), inter for one GPU per node.
  tree    (all-reduce across nodes) NCCL's double binary tree: chain inside the node, tree between
          nodes: 2 * ((k-1) * lat_intra + log2(N) * lat_inter) latency, wire 2 * S at 0.92 * bw.
  nvls    (all-reduce inside one NVSwitch node of Hopper/Blackwell with >= nvls_min_gpus GPUs)
          NVLink SHARP: every GPU sends S to the switch and receives the reduced S:
          wire S at the NVLS algorithm bandwidth.
  p2p     latency + S / p2p bandwidth (the link inside a node, the NIC across nodes).
  alltoall  (n-1) steps; max((k-1)/n * S / intra, (n-k)/n * S / inter). Where the platform's all-to-all was
          measured (`NetworkModel.alltoall`, fitted on its own all-to-all rows), inside one switch domain:
          base + (n-1) * peer latency + max((n-1)/n * S / bus, S / alg), see `AlltoallParams`.

Protocols: "simple" (full bandwidth, higher latency) and "ll" (low-latency: a fraction of the
bandwidth, lower latency), which is what bends measured bus-bandwidth curves at small sizes.

Intra-node bandwidth of k GPUs: on a switch (NVSwitch) it does not depend on k; on a direct mesh
(Perlmutter's NVLink all-to-all, AMD xGMI) each peer has its own links, so k GPUs get
(k-1)/(gpus_per_node-1) of the node's aggregate.

Parameters come from, in order: a calibration fitted on measured samples of this platform (saved
as `models_store/<platform>/network.json` by `predictor.hardware.network_fit`), else the link specs
times efficiencies measured on the calibrated platforms (`DEFAULTS`, see calibrate_network.py).
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from predictor.hardware.platforms import Platform
from predictor.paths import (
    ArtifactError,
    check_error_record,
    check_number,
    load_checked,
    platform_dir,
    write_text_atomic,
)

log = logging.getLogger(__name__)

# Efficiencies and latencies of uncalibrated platforms: medians (rounded) of the per-platform fits of
# `python -m predictor.hardware.network_fit` over the measured sweeps (fabrics: A100 NVSwitch, A100 NVLink
# mesh, H200 NVSwitch, B200 NVSwitch; networks: InfiniBand NDR (paper, Vista), EFA (B200); Perlmutter's
# paper network, at ~5 % of its spec, is left out of the inter-node efficiency). Per platform:
#   intra efficiency  A100 0.73, A100 mesh 0.63, H200 0.81, B200 0.76   inter  Vista 0.96, B200 1.0
#   NVLS efficiency   H200 0.59, B200 0.52                              LL fraction  A100 0.12, H200 0.53, B200 0.28
# `tests/benchmarks/collective_accuracy.py` reports the leave-one-platform-out error of this fallback.
DEFAULTS = {
    "intra_efficiency": 0.74,       # ring bus bandwidth / link bandwidth
    "inter_efficiency": 0.95,       # per-GPU network bandwidth achieved / NIC bandwidth
    "nvls_efficiency": 0.56,        # NVLS algorithm bandwidth / NVLink bandwidth
    "ll_fraction": 0.28,            # LL protocol bandwidth / Simple
    "intra_latency_us": 1.4,        # per ring step inside a node, Simple
    "intra_base_us": 30.0,          # fixed cost of one collective inside a node, Simple
    "inter_latency_us": 6.0,        # per step crossing nodes, Simple (not identified by the sweeps)
    "inter_base_us": 160.0,         # fixed cost across nodes (Vista 160, Perlmutter 47, B200/EFA 357)
    "ll_latency_us": 0.66,          # per step, LL
    "ll_base_us": 28.0,
    "nvls_base_us": 94.0,
    "p2p_fraction": 1.0,            # p2p bandwidth / tier bandwidth
}
TREE_BW_FACTOR = 0.92               # NCCL: tree all-reduce busBw * 0.92
MIN_BW_GBPS = 1e-3
DEFAULT_EFFICIENCY = DEFAULTS["intra_efficiency"]  # kept for callers of the old module
ALGORITHMS = ("ring", "tree", "nvls")
TOPOLOGIES = ("switch", "mesh")
MAX_EFFICIENCY = 1.5                # collective_efficiency above this is no measurement (see check_network_dict)
NETWORK_FILE = "network.json"


@dataclass(frozen=True)
class TierParams:
    bandwidth_gbps: float          # effective per-GPU bus bandwidth of the Simple protocol, GB/s
    latency_us: float              # per ring step, Simple
    source: str                    # "link spec" or the samples it was fitted on
    n_samples: int = 0
    fit_mape: float | None = None  # median relative error of the fit on its samples
    base_latency_us: float = 0.0   # fixed cost of one collective, Simple
    ll_bandwidth_gbps: float | None = None   # LL protocol bus bandwidth (None: ll_fraction * bandwidth)
    ll_latency_us: float | None = None       # per step, LL
    ll_base_latency_us: float | None = None  # fixed cost, LL
    p2p_bandwidth_gbps: float | None = None  # point-to-point bandwidth (None: p2p_fraction * bandwidth)
    p2p_latency_us: float | None = None

    def ll_bw(self) -> float:
        return self.ll_bandwidth_gbps if self.ll_bandwidth_gbps else DEFAULTS["ll_fraction"] * self.bandwidth_gbps

    def ll_lat(self) -> float:
        return self.ll_latency_us if self.ll_latency_us is not None else DEFAULTS["ll_latency_us"]

    def ll_base(self) -> float:
        return self.ll_base_latency_us if self.ll_base_latency_us is not None else DEFAULTS["ll_base_us"]

    def p2p_bw(self) -> float:
        return self.p2p_bandwidth_gbps if self.p2p_bandwidth_gbps else DEFAULTS["p2p_fraction"] * self.bandwidth_gbps

    def p2p_lat(self) -> float:
        return self.p2p_latency_us if self.p2p_latency_us is not None else self.base_latency_us + self.latency_us


@dataclass(frozen=True)
class AlltoallParams:
    """All-to-all inside one non-blocking switch domain (NVSwitch), fitted on measured all-to-all sweeps.

    Rule (docs/accuracy.md, "All-to-all inside an NVLink switch domain"): each GPU sends (n-1)/n of its buffer S to
    its peers through its own switch ports, and a non-blocking switch gives every GPU its full port bandwidth
    whatever the group size, so the link-bound part, (n-1)/n * S / bus_bandwidth, has a bus bandwidth that does not
    depend on n. NCCL's all-to-all is a grouped send / receive to every rank, itself included, so each GPU's copy
    engine also handles all of S: a second bound, S / alg_bandwidth, also independent of n. The time is
    base + (n-1) * peer latency + the larger of the two. Measured (aiconfigurator's nccl-tests tables, 1 MiB -
    1 GiB): H100 / H200 are link-bound (bus ~280-290 GB/s), B200 / B300 bound by S / alg (~630-650 GB/s) at 2-4
    GPUs and near the link bound at 8. A platform whose sweeps span fewer than ALLTOALL_MIN_GROUP_SIZES group sizes
    (GB200 / GB300: 2 and 4 GPUs of one tray) cannot pin the link bound; it takes the bus bandwidth of the platform
    whose calibration it borrows (same NVLink generation; `bus_source` says which)."""
    bus_bandwidth_gbps: float      # link-bound bus bandwidth ((n-1)/n * S / t), GB/s
    alg_bandwidth_gbps: float      # per-GPU bound on S / t, GB/s
    base_latency_us: float         # fixed cost of one all-to-all
    peer_latency_us: float         # added per peer
    source: str                    # the samples it was fitted on
    bus_source: str = ""           # where the bus bandwidth comes from when the samples do not pin it ('' = fitted)
    n_samples: int = 0
    fit_mape: float | None = None  # median relative error on its samples


ALLTOALL_MIN_GROUP_SIZES = 3       # group sizes a sweep needs to pin the link-bound all-to-all bus bandwidth


@dataclass(frozen=True)
class NetworkModel:
    intra: TierParams
    inter: TierParams
    nvls: TierParams | None = None      # NVLink SHARP all-reduce (bandwidth = algorithm bandwidth)
    nvls_min_gpus: int = 0
    algorithms: tuple[str, ...] = ("ring", "tree")
    intra_topology: str = "switch"      # "switch" (NVSwitch, PCIe switch) or "mesh" (direct links per peer)
    node_gpus: int = 8                  # GPUs per node of the platform (mesh scaling)
    platform_id: str = ""
    validation: dict[str, Any] = field(default_factory=dict)  # fit / leave-one-out errors
    # bandwidth efficiency of a collective relative to all-reduce (1.0 unless samples say otherwise;
    # e.g. the paper's all-gather, timed through torch's list API, reaches ~0.7 of all-reduce's bus bandwidth)
    collective_efficiency: dict[str, float] = field(default_factory=dict)
    alltoall: AlltoallParams | None = None   # measured all-to-all inside the switch domain (None: the ring tiers)

    @property
    def calibrated(self) -> bool:
        return any(t is not None and t.source != "link spec" for t in (self.intra, self.inter, self.nvls))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["algorithms"] = list(self.algorithms)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=float)

    @staticmethod
    def from_dict(d: dict[str, Any], source: str | Path = NETWORK_FILE) -> NetworkModel:
        """The model of a parsed network.json, its values checked (`check_network_dict`): ArtifactError
        (a ValueError) naming `source` and the field when one is missing or out of range."""
        check_network_dict(d, source)
        names = {f.name for f in fields(TierParams)}

        def tier(x):
            return None if x is None else TierParams(**{k: v for k, v in x.items() if k in names})
        return NetworkModel(
            intra=tier(d["intra"]), inter=tier(d["inter"]), nvls=tier(d.get("nvls")),
            nvls_min_gpus=int(d.get("nvls_min_gpus", 0)), algorithms=tuple(d.get("algorithms", ("ring", "tree"))),
            intra_topology=d.get("intra_topology", "switch"), node_gpus=int(d.get("node_gpus", 8)),
            platform_id=d.get("platform_id", ""), validation=dict(d.get("validation", {})),
            collective_efficiency={k: float(v) for k, v in (d.get("collective_efficiency") or {}).items()},
            alltoall=AlltoallParams(**d["alltoall"]) if d.get("alltoall") is not None else None)

    @staticmethod
    def from_json(text: str, source: str | Path = NETWORK_FILE) -> NetworkModel:
        try:
            d = json.loads(text)
        except ValueError as e:
            raise ArtifactError(source, None, f"is not valid JSON ({e})") from None
        return NetworkModel.from_dict(d, source)


def _check_tier(path: str | Path, name: str, t: Any) -> None:
    if not isinstance(t, dict):
        raise ArtifactError(path, name, f"must be an object, not {type(t).__name__}")
    for k in ("bandwidth_gbps", "latency_us"):
        if k not in t:
            raise ArtifactError(path, f"{name}.{k}", "is missing")
    check_number(path, f"{name}.bandwidth_gbps", t["bandwidth_gbps"], gt=0)
    for k in ("ll_bandwidth_gbps", "p2p_bandwidth_gbps"):
        check_number(path, f"{name}.{k}", t.get(k), gt=0, optional=True)
    check_number(path, f"{name}.latency_us", t["latency_us"], ge=0)
    check_number(path, f"{name}.base_latency_us", t.get("base_latency_us", 0.0), ge=0)
    for k in ("ll_latency_us", "ll_base_latency_us", "p2p_latency_us", "fit_mape"):
        check_number(path, f"{name}.{k}", t.get(k), ge=0, optional=True)
    check_number(path, f"{name}.n_samples", t.get("n_samples", 0), ge=0, integer=True)
    if not isinstance(t.get("source", ""), str):
        raise ArtifactError(path, f"{name}.source", "must be a string")


def check_network_dict(d: Any, path: str | Path = NETWORK_FILE) -> dict[str, Any]:
    """`d` (a parsed network.json) if it can be used, else ArtifactError naming `path` and the field:
    tiers intra / inter (and nvls or null) with bandwidths > 0, latencies >= 0, all finite;
    collective efficiencies in (0, MAX_EFFICIENCY]; algorithms among ALGORITHMS; intra_topology among
    TOPOLOGIES; node_gpus >= 1 and nvls_min_gpus >= 0 whole numbers; fit errors finite >= 0."""
    if not isinstance(d, dict):
        raise ArtifactError(path, None, f"must be a JSON object, not {type(d).__name__}")
    for name in ("intra", "inter"):
        if name not in d:
            raise ArtifactError(path, name, "is missing")
        _check_tier(path, name, d[name])
    if d.get("nvls") is not None:
        _check_tier(path, "nvls", d["nvls"])
    algos = d.get("algorithms", ["ring", "tree"])
    if not isinstance(algos, list) or not all(isinstance(a, str) and a in ALGORITHMS for a in algos):
        raise ArtifactError(path, "algorithms", f"{algos!r}: must be a list drawn from {', '.join(ALGORITHMS)}")
    if d.get("intra_topology", "switch") not in TOPOLOGIES:
        raise ArtifactError(path, "intra_topology",
                            f"{d.get('intra_topology')!r}: must be one of {', '.join(TOPOLOGIES)}")
    check_number(path, "node_gpus", d.get("node_gpus", 8), ge=1, integer=True)
    check_number(path, "nvls_min_gpus", d.get("nvls_min_gpus", 0), ge=0, integer=True)
    eff = d.get("collective_efficiency") or {}
    if not isinstance(eff, dict):
        raise ArtifactError(path, "collective_efficiency", "must be an object")
    for k, v in eff.items():
        check_number(path, f"collective_efficiency.{k}", v, gt=0, le=MAX_EFFICIENCY)
    if not isinstance(d.get("platform_id", ""), str):
        raise ArtifactError(path, "platform_id", "must be a string")
    a2a = d.get("alltoall")
    if a2a is not None:
        if not isinstance(a2a, dict):
            raise ArtifactError(path, "alltoall", f"must be an object or null, not {type(a2a).__name__}")
        known = {f.name for f in fields(AlltoallParams)}
        for k in a2a:
            if k not in known:
                raise ArtifactError(path, f"alltoall.{k}", "is not a field of the all-to-all model")
        for k in ("bus_bandwidth_gbps", "alg_bandwidth_gbps", "base_latency_us", "peer_latency_us", "source"):
            if k not in a2a:
                raise ArtifactError(path, f"alltoall.{k}", "is missing")
        for k in ("bus_bandwidth_gbps", "alg_bandwidth_gbps"):
            check_number(path, f"alltoall.{k}", a2a[k], gt=0)
        for k in ("base_latency_us", "peer_latency_us"):
            check_number(path, f"alltoall.{k}", a2a[k], ge=0)
        check_number(path, "alltoall.fit_mape", a2a.get("fit_mape"), ge=0, optional=True)
        check_number(path, "alltoall.n_samples", a2a.get("n_samples", 0), ge=0, integer=True)
        for k in ("source", "bus_source"):
            if not isinstance(a2a.get(k, ""), str):
                raise ArtifactError(path, f"alltoall.{k}", "must be a string")
    val = d.get("validation", {})
    if not isinstance(val, dict):
        raise ArtifactError(path, "validation", "must be an object")
    check_error_record(path, {f"validation.{k}": v for k, v in val.items()})
    return d


# --------------------------------------------------------------------------- spec model
def intra_topology(platform: Platform) -> str:
    kind = (platform.intra_node.kind or "").lower()
    return "mesh" if kind in ("nvlink", "xgmi", "nvlink-mesh") else "switch"


def spec_network(platform: Platform, defaults: dict[str, float] | None = None) -> NetworkModel:
    """Uncalibrated: link specs times the efficiencies measured on calibrated platforms."""
    D = {**DEFAULTS, **(defaults or {})}
    intra_link = platform.intra_node.bandwidth_gbps or platform.inter_node.bandwidth_gbps or 1.0
    inter_link = platform.inter_node.bandwidth_gbps or platform.intra_node.bandwidth_gbps or 1.0
    intra = TierParams(intra_link * D["intra_efficiency"], D["intra_latency_us"], "link spec",
                       base_latency_us=D["intra_base_us"], ll_latency_us=D["ll_latency_us"],
                       ll_base_latency_us=D["ll_base_us"])
    inter = TierParams(inter_link * D["inter_efficiency"],
                       max(D["inter_latency_us"], platform.inter_node.latency_us * 0.5),
                       "link spec", base_latency_us=D["inter_base_us"], ll_latency_us=D["ll_latency_us"] * 4,
                       ll_base_latency_us=D["ll_base_us"] * 2)
    nvls = None
    if platform.has_nvls:
        nvls = TierParams(intra_link * D["nvls_efficiency"], 0.0, "link spec", base_latency_us=D["nvls_base_us"])
    return NetworkModel(intra, inter, nvls, platform.nvls_min_gpus if nvls else 0,
                        tuple(a for a in platform.collective_algorithms if a != "nvls" or nvls is not None),
                        intra_topology(platform), max(1, platform.gpus_per_node), platform.platform_id)


# --------------------------------------------------------------------------- the model
def _intra_bw(net: NetworkModel, k: np.ndarray, bw: float) -> np.ndarray:
    if net.intra_topology == "mesh" and net.node_gpus > 2:
        return bw * np.clip((k - 1.0) / (net.node_gpus - 1.0), 1.0 / (net.node_gpus - 1.0), 1.0)
    return np.full_like(k, bw, dtype=float)


SOFTMIN_Q = 6.0  # a smooth minimum keeps the fit's gradient alive on the tier that is not (yet) the bottleneck


def _softmin(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    m = np.minimum(a, b)
    return m * ((m / a) ** SOFTMIN_Q + (m / b) ** SOFTMIN_Q) ** (-1.0 / SOFTMIN_Q)


def _bus_bw(net: NetworkModel, N: np.ndarray, k: np.ndarray, intra_bw: float, inter_bw: float) -> np.ndarray:
    """Ring bus bandwidth in B/s: its slowest hop (a smooth minimum of the two tiers)."""
    ib = _intra_bw(net, k, intra_bw)
    multi = N > 1
    across = np.where(k > 1, _softmin(np.maximum(ib, 1e-9), np.maximum(k * inter_bw, 1e-9)), inter_bw)
    return np.maximum(np.where(multi, across, ib), MIN_BW_GBPS) * 1e9


def algorithm_times(net: NetworkModel, collective: str, message_bytes, nodes, gpus_per_node
                    ) -> dict[str, np.ndarray]:
    """Seconds per (algorithm/protocol) candidate; +inf where the candidate does not apply."""
    S, N, k = np.broadcast_arrays(np.atleast_1d(np.asarray(message_bytes, dtype=float)),
                                  np.atleast_1d(np.asarray(nodes, dtype=float)),
                                  np.atleast_1d(np.asarray(gpus_per_node, dtype=float)))
    S, N, k = S.astype(float), np.maximum(N.astype(float), 1.0), np.maximum(k.astype(float), 1.0)
    n = N * k
    multi = N > 1
    I, X = net.intra, net.inter
    out: dict[str, np.ndarray] = {}
    inf = np.full_like(S, np.inf)

    def base(simple: bool) -> np.ndarray:
        if simple:
            return np.where(multi, X.base_latency_us, I.base_latency_us) * 1e-6
        return np.where(multi, X.ll_base(), I.ll_base()) * 1e-6

    if collective == "p2p":
        # S crosses one link: the NIC if the two ranks sit on different nodes
        bw_in = _intra_bw(net, np.full_like(k, 2.0), I.p2p_bw()) * 1e9
        t_in = I.p2p_lat() * 1e-6 + S / np.maximum(bw_in, 1.0)
        t_x = X.p2p_lat() * 1e-6 + S / (max(X.p2p_bw(), MIN_BW_GBPS) * 1e9)
        out["p2p"] = np.where(multi, t_x, t_in)
        return out
    if collective == "allreduce":
        wire, steps, xsteps = 2.0 * (n - 1.0) / n * S, 2.0 * (n - 1.0), 2.0 * (N - 1.0)
    elif collective in ("allgather", "reducescatter"):
        wire, steps, xsteps = (n - 1.0) / n * S, n - 1.0, N - 1.0
        wire = wire / max(net.collective_efficiency.get(collective, 1.0), 1e-3)
    elif collective == "alltoall":
        t_x = np.where(multi, (n - k) / n * S / (max(X.bandwidth_gbps, MIN_BW_GBPS) * 1e9), 0.0)
        A = net.alltoall
        if A is not None and net.intra_topology == "switch":
            # measured all-to-all (AlltoallParams): the intra-domain share at the link-bound bus bandwidth, the whole
            # buffer at the per-GPU bound; across nodes the inter-node share and latency as below
            t_in = np.maximum((k - 1.0) / n * S / (A.bus_bandwidth_gbps * 1e9), S / (A.alg_bandwidth_gbps * 1e9))
            lat = np.where(multi, base(True) + (n - 1.0) * X.latency_us * 1e-6,
                           (A.base_latency_us + (n - 1.0) * A.peer_latency_us) * 1e-6)
            out["alltoall/simple"] = lat + np.maximum(t_in, t_x)
            return out
        ib = _intra_bw(net, k, I.bandwidth_gbps) * 1e9
        t_bw = np.maximum((k - 1.0) / n * S / np.maximum(ib, 1.0), t_x)
        lat = base(True) + (n - 1.0) * np.where(multi, X.latency_us, I.latency_us) * 1e-6
        out["alltoall/simple"] = lat + t_bw
        return out
    else:
        raise ValueError(f"unknown collective {collective!r}")

    for proto, simple in (("simple", True), ("ll", False)):
        ilat = (I.latency_us if simple else I.ll_lat()) * 1e-6
        xlat = (X.latency_us if simple else X.ll_lat()) * 1e-6
        bw = _bus_bw(net, N, k, I.bandwidth_gbps if simple else I.ll_bw(), X.bandwidth_gbps if simple else X.ll_bw())
        if "ring" in net.algorithms or not net.algorithms:
            out[f"ring/{proto}"] = base(simple) + (steps - xsteps) * ilat + xsteps * xlat + wire / bw
        if collective == "allreduce" and "tree" in net.algorithms:
            lat_t = 2.0 * ((k - 1.0) * ilat + np.ceil(np.log2(np.maximum(N, 1.0))) * xlat)
            out[f"tree/{proto}"] = np.where(multi, base(simple) + lat_t + 2.0 * S / (TREE_BW_FACTOR * bw), inf)
    if collective == "allreduce" and net.nvls is not None and "nvls" in net.algorithms and net.nvls_min_gpus > 0:
        ok = (~multi) & (k >= net.nvls_min_gpus)
        bw_n = max(net.nvls.bandwidth_gbps, MIN_BW_GBPS) * 1e9
        out["nvls/simple"] = np.where(ok, net.nvls.base_latency_us * 1e-6 + net.nvls.latency_us * 1e-6 * k + S / bw_n,
                                      inf)
    return out


def analytic_choice(net: NetworkModel, collective: str, message_bytes, nodes, gpus_per_node,
                    force: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, chosen 'algorithm/protocol') per row; `force` restricts to one algorithm ('ring', 'nvls', ...)."""
    cands = algorithm_times(net, collective, message_bytes, nodes, gpus_per_node)
    if force:
        sel = {k: v for k, v in cands.items() if k.split("/")[0] == force}
        cands = sel or cands
    names = list(cands)
    M = np.vstack([cands[c] for c in names])
    idx = np.argmin(M, axis=0)
    t = M[idx, np.arange(M.shape[1])]
    return t, np.array(names, dtype=object)[idx]


def analytic_time_s(net: NetworkModel, collective: str, message_bytes, nodes, gpus_per_node) -> np.ndarray:
    """Seconds of one collective (fastest algorithm/protocol); 0 for a single rank."""
    t, _ = analytic_choice(net, collective, message_bytes, nodes, gpus_per_node)
    ranks = np.broadcast_arrays(np.atleast_1d(np.asarray(nodes)), np.atleast_1d(np.asarray(gpus_per_node)))
    n = ranks[0].astype(float) * ranks[1].astype(float)
    return np.where(n <= 1, 0.0, t)


def bus_bandwidth_gbps(collective: str, message_bytes, ranks, seconds) -> np.ndarray:
    """nccl-tests bus bandwidth (GB/s) of a measured or predicted time (full-buffer convention)."""
    S = np.asarray(message_bytes, float)
    n = np.asarray(ranks, float)
    t = np.asarray(seconds, float)
    factor = {"allreduce": 2.0 * (n - 1) / n, "allgather": (n - 1) / n, "reducescatter": (n - 1) / n,
              "alltoall": (n - 1) / n}.get(collective, np.ones_like(n))
    return S * factor / t / 1e9


# --------------------------------------------------------------------------- calibration
def store_to_full_buffer(samples: pd.DataFrame) -> pd.DataFrame:
    """Store/paper convention (all-gather message = per-rank input) -> full-buffer convention."""
    s = samples.copy()
    ag = s["collective"] == "allgather"
    ranks = s["nodes"].astype(float) * s["gpus_per_node"].astype(float)
    if "ranks" in s:
        ranks = s["ranks"].fillna(ranks).astype(float)
    s.loc[ag, "message_bytes"] = s.loc[ag, "message_bytes"].astype(float) * ranks[ag]
    return s


# parameter vector layout: name -> (getter path, lower, upper); all fitted in log space
_PARAMS = [
    ("intra.bandwidth_gbps", 0.5, 5000.0), ("intra.latency_us", 0.01, 200.0), ("intra.base_latency_us", 0.5, 2000.0),
    ("intra.ll_bandwidth_gbps", 0.05, 5000.0), ("intra.ll_latency_us", 0.01, 100.0),
    ("intra.ll_base_latency_us", 0.5, 500.0),
    ("inter.bandwidth_gbps", 0.05, 1000.0), ("inter.latency_us", 0.01, 2000.0), ("inter.base_latency_us", 0.5, 20000.0),
    ("inter.ll_bandwidth_gbps", 0.01, 1000.0), ("inter.ll_latency_us", 0.01, 2000.0),
    ("inter.ll_base_latency_us", 0.5, 5000.0),
    ("nvls.bandwidth_gbps", 0.5, 5000.0), ("nvls.base_latency_us", 0.5, 2000.0),
    ("intra.p2p_bandwidth_gbps", 0.05, 5000.0), ("intra.p2p_latency_us", 0.5, 5000.0),
    ("inter.p2p_bandwidth_gbps", 0.01, 1000.0), ("inter.p2p_latency_us", 0.5, 20000.0),
    ("eff.allgather", 0.1, 2.0), ("eff.reducescatter", 0.1, 2.0),
]


def _get(net: NetworkModel, path: str) -> float:
    tier, name = path.split(".")
    if tier == "eff":
        return float(net.collective_efficiency.get(name, 1.0))
    t = getattr(net, tier)
    if t is None:
        return float("nan")
    v = getattr(t, name)
    if v is None:
        v = {"ll_bandwidth_gbps": t.ll_bw, "ll_latency_us": t.ll_lat, "ll_base_latency_us": t.ll_base,
             "p2p_bandwidth_gbps": t.p2p_bw, "p2p_latency_us": t.p2p_lat}[name]()
    return float(v)


def _with(net: NetworkModel, values: dict[str, float]) -> NetworkModel:
    by_tier: dict[str, dict[str, float]] = {}
    for path, v in values.items():
        tier, name = path.split(".")
        by_tier.setdefault(tier, {})[name] = float(v)
    kw: dict[str, Any] = {}
    for tier, ch in by_tier.items():
        if tier == "eff":
            kw["collective_efficiency"] = {**net.collective_efficiency, **ch}
            continue
        t = getattr(net, tier)
        if t is not None:
            kw[tier] = replace(t, **ch)
    return replace(net, **kw)


def _relevant(samples: pd.DataFrame, net: NetworkModel) -> list[str]:
    """Parameters the samples can inform: tiers they touch, LL only where messages are small."""
    multi = samples["nodes"] > 1
    single = (samples["nodes"] == 1) & (samples["gpus_per_node"] > 1)
    small = samples["message_bytes"] < 64 * 2**20
    p2p = samples["collective"] == "p2p"
    coll = ~p2p
    keep = []
    for path, _, _ in _PARAMS:
        tier, name = path.split(".")
        if tier == "eff":
            # only when the same samples also pin all-reduce (else it trades off with the bandwidth)
            if (samples["collective"] == name).any() and (samples["collective"] == "allreduce").any():
                keep.append(path)
            continue
        if tier == "nvls":
            if net.nvls is None or not (single & (samples["collective"] == "allreduce")
                                        & (samples["gpus_per_node"] >= max(net.nvls_min_gpus, 1))).any():
                continue
            if name == "base_latency_us" and not (single & small).any():
                continue
            keep.append(path)
            continue
        rows = single if tier == "intra" else multi
        if name.startswith("p2p"):
            if (rows & p2p).any() and (name != "p2p_latency_us" or (rows & p2p & small).any()):
                keep.append(path)
            continue
        r = rows & coll
        if not r.any():
            continue
        if name.startswith("ll"):
            if (r & (samples["message_bytes"] < 8 * 2**20)).sum() >= 3:
                keep.append(path)
            continue
        if name == "latency_us" and tier == "intra" and not (r & small).any():
            # large messages only: latencies are weakly identified; keep the base, drop the step term
            continue
        keep.append(path)
    return keep


def _predict_rows(net: NetworkModel, s: pd.DataFrame) -> np.ndarray:
    import pandas as pd
    out = np.empty(len(s))
    algo = s["algorithm"] if "algorithm" in s else pd.Series([None] * len(s), index=s.index)
    keys = pd.DataFrame({"c": s["collective"].to_numpy(), "a": algo.fillna("").to_numpy()})
    for (c, a), idx in keys.groupby(["c", "a"]).indices.items():
        g = s.iloc[idx]
        t, _ = analytic_choice(net, c, g["message_bytes"].to_numpy(float), g["nodes"].to_numpy(float),
                               g["gpus_per_node"].to_numpy(float), force=a or None)
        out[idx] = t
    return out


def fit_network(net: NetworkModel, samples: pd.DataFrame, source: str, prior_weight: float = 0.03,
                max_nfev: int = 400) -> NetworkModel:
    """Least squares on log(time) over `samples` (full-buffer convention; optional column `algorithm`
    forces 'ring'/'nvls'/...), each (source, collective, topology) curve weighted equally, with a weak
    prior pulling parameters the samples cannot pin towards their starting values."""
    import pandas as pd
    from scipy.optimize import least_squares
    s = samples[(samples["duration_s"] > 0) & (samples["message_bytes"] > 0)].copy()
    if s.empty:
        return net
    if net.nvls is None and net.nvls_min_gpus == 0 and "algorithm" in s and (s["algorithm"] == "nvls").any():
        s = s[s["algorithm"] != "nvls"]
    params = _relevant(s, net)
    if not params:
        return net
    bounds = {p: (lo, hi) for p, lo, hi in _PARAMS}
    x0 = np.array([math.log(min(max(_get(net, p), bounds[p][0] * 1.01), bounds[p][1] * 0.99)) for p in params])
    lo = np.array([math.log(bounds[p][0]) for p in params])
    hi = np.array([math.log(bounds[p][1]) for p in params])
    grp = (s.get("source", pd.Series("", index=s.index)).astype(str) + "|" + s["collective"] + "|"
           + s["nodes"].astype(int).astype(str) + "x" + s["gpus_per_node"].astype(int).astype(str))
    w = 1.0 / np.sqrt(grp.map(grp.value_counts()).to_numpy(float))
    y = np.log(s["duration_s"].to_numpy(float))

    def resid(x):
        cand = _with(net, {p: math.exp(v) for p, v in zip(params, x)})
        pred = _predict_rows(cand, s)
        r = (np.log(np.maximum(pred, 1e-12)) - y) * w
        return np.concatenate([r, prior_weight * (x - x0)])
    # soft-L1 in log space: points off by more than ~30 % (a sweep's warm-up sizes, interference) count
    # linearly, not quadratically
    res = least_squares(resid, x0, bounds=(lo, hi), method="trf", x_scale=1.0, max_nfev=max_nfev, diff_step=1e-3,
                        loss="soft_l1", f_scale=0.3)
    fitted = _with(net, {p: math.exp(v) for p, v in zip(params, res.x)})
    pred = _predict_rows(fitted, s)
    ape = np.abs(pred - s["duration_s"].to_numpy(float)) / s["duration_s"].to_numpy(float)
    single = ((s["nodes"] == 1).to_numpy())
    kw: dict[str, Any] = {}
    for tier, m in (("intra", single), ("inter", ~single)):
        touched = any(p.startswith(tier + ".") for p in params)
        if touched and m.any():
            kw[tier] = replace(getattr(fitted, tier), source=f"fitted on {source}", n_samples=int(m.sum()),
                               fit_mape=float(np.median(ape[m])))
    if fitted.nvls is not None and any(p.startswith("nvls.") for p in params):
        m = single & (s["gpus_per_node"].to_numpy() >= max(fitted.nvls_min_gpus, 1))
        kw["nvls"] = replace(fitted.nvls, source=f"fitted on {source}", n_samples=int(m.sum()),
                             fit_mape=float(np.median(ape[m])) if m.any() else None)
    fitted = replace(fitted, **kw)
    val = dict(fitted.validation)
    val["fit"] = {"median_ape": float(np.median(ape)), "mape": float(np.mean(ape)), "n": int(len(ape)),
                  "source": source}
    return replace(fitted, validation=val)


def calibrate(platform: Platform, samples: pd.DataFrame, source: str = "measured samples",
              start: NetworkModel | None = None) -> NetworkModel:
    """Fit the network of `platform` on collective samples in the store's schema
    (collective, message_bytes, nodes, gpus_per_node, duration_s[, ranks, source, algorithm]; all-gather
    message = per-rank input). Parameters the samples cannot inform keep their spec values."""
    net = start or spec_network(platform)
    if samples is None or len(samples) == 0:
        return net
    s = store_to_full_buffer(samples)
    s = s[s["collective"].isin(["allreduce", "allgather", "reducescatter", "p2p", "alltoall"])]
    s = s[(s["nodes"] * s["gpus_per_node"]) > 1]
    return fit_network(net, s, source)


# --------------------------------------------------------------------------- persistence
def save_network(net: NetworkModel, path: Path) -> None:
    """Write `net` to `path` atomically; refuses (ArtifactError) a model that would not load."""
    text = net.to_json() + "\n"
    check_network_dict(json.loads(text), path)
    write_text_atomic(path, text)


def load_network_file_checked(path: str | Path) -> tuple[NetworkModel | None, str | None]:
    """(model, None) from a network.json; (None, None) without the file; (None, warning naming the file
    and field) when it is unreadable or a value is out of range."""
    return load_checked(path, lambda d: NetworkModel.from_dict(d, path))


def load_network_checked(platform: Platform, models_dir: str | Path) -> tuple[NetworkModel, str | None]:
    """(network model, warning or None). The calibrated model of this platform if one was saved
    (models_store/<platform>/network.json), else the model of the platform named in its
    `collective_calibration` (same network hardware), else the spec model. A calibration borrowed
    from another platform keeps its fitted efficiencies but rescales bandwidths by this platform's
    link specs. A network.json that is unreadable or holds an out-of-range value (a bandwidth <= 0,
    a negative latency, ...) is not used: the spec model is, and the warning names the file, the
    field and the fallback."""
    d = Path(models_dir)
    spec = spec_network(platform)
    own = platform_dir(platform.platform_id, d) / NETWORK_FILE   # the id checked before the path is built
    borrow = platform.collective_calibration
    path = own if own.exists() or not borrow else platform_dir(borrow, d) / NETWORK_FILE
    net, warn = load_network_file_checked(path)
    if warn:
        return spec, f"Network calibration not used, link specs instead: {warn}"
    if net is None:
        return spec, None
    if path == own:
        return replace(net, algorithms=spec.algorithms if net.nvls is not None or spec.nvls is None
                       else tuple(a for a in spec.algorithms if a != "nvls")), None
    assert borrow is not None  # path is another platform's only when this one borrows a calibration
    try:
        return borrowed_network(platform, net, borrow), None
    except (ValueError, KeyError, TypeError) as e:
        return spec, f"Network calibration of {borrow} not usable for {platform.platform_id} ({e}): link specs instead"


def load_network(platform: Platform, models_dir: Path) -> NetworkModel:
    """`load_network_checked` without the warning (it is logged)."""
    net, warn = load_network_checked(platform, models_dir)
    if warn:
        log.warning(warn)
    return net


def borrowed_network(platform: Platform, other: NetworkModel, other_id: str, other_platform: Platform | None = None
                     ) -> NetworkModel:
    """`other`'s calibration applied to `platform` (same fabric family): latencies as fitted, bandwidths
    scaled by the ratio of link specs."""
    from predictor.hardware.platforms import get_platform
    try:
        op = other_platform or get_platform(other_id)
    except Exception:  # noqa: BLE001
        op = None
    spec = spec_network(platform)

    def scale(mine: float, theirs: float) -> float:
        return mine / theirs if mine > 0 and theirs > 0 else 1.0
    ri = scale(platform.intra_node.bandwidth_gbps, op.intra_node.bandwidth_gbps) if op else 1.0
    rx = scale(platform.inter_node.bandwidth_gbps, op.inter_node.bandwidth_gbps) if op else 1.0

    def tier(t: TierParams, r: float) -> TierParams:
        return replace(t, bandwidth_gbps=t.bandwidth_gbps * r,
                       ll_bandwidth_gbps=t.ll_bandwidth_gbps * r if t.ll_bandwidth_gbps else None,
                       p2p_bandwidth_gbps=t.p2p_bandwidth_gbps * r if t.p2p_bandwidth_gbps else None,
                       source=f"{t.source} (borrowed from {other_id}, bandwidth x{r:.2g})"
                       if t.source != "link spec" else t.source)
    intra = tier(other.intra, ri) if other.intra.source != "link spec" else spec.intra
    inter = tier(other.inter, rx) if other.inter.source != "link spec" else spec.inter
    nvls = (tier(other.nvls, ri) if other.nvls is not None else spec.nvls) if spec.nvls is not None else None
    # the measured all-to-all of a switch fabric: the link-bound bus bandwidth scaled like the links, the per-GPU
    # bound as measured
    a2a = (replace(other.alltoall, bus_bandwidth_gbps=other.alltoall.bus_bandwidth_gbps * ri,
                   source=f"{other.alltoall.source} (borrowed from {other_id}, bus bandwidth x{ri:.2g})")
           if other.alltoall is not None and spec.intra_topology == "switch" else None)
    return replace(spec, intra=intra, inter=inter, nvls=nvls, alltoall=a2a,
                   validation={"borrowed_from": other_id, **other.validation})


# --------------------------------------------------------------------------- expected error
NETWORK_VALIDATION_FILE = "network_validation.json"


def load_network_validation_checked(models_dir: str | Path | None) -> tuple[dict[str, Any], str | None]:
    """(record, None) from `models_store/network_validation.json` (written by
    tests/benchmarks/collective_accuracy.py), every error finite and >= 0; ({}, None) without it;
    ({}, warning naming the file and field) when it is unreadable or a value is out of range."""
    if models_dir is None:
        return {}, None
    p = Path(models_dir) / NETWORK_VALIDATION_FILE
    rec, warn = load_checked(p, lambda d: check_error_record(p, d))
    return rec or {}, warn


def load_network_validation(models_dir: str | Path | None) -> dict[str, Any]:
    """`load_network_validation_checked` without the warning (it is logged)."""
    rec, warn = load_network_validation_checked(models_dir)
    if warn:
        log.warning(warn)
    return rec


def expected_error(net: NetworkModel, models_dir: str | Path | None = None) -> tuple[float, str]:
    """(expected relative error, basis) of this network model's collective times:
    calibrated on its own platform's sweeps -> the fit's median error (at least 3 %);
    borrowed from a platform with the same fabric -> the measured error of that transfer;
    link specs only -> the leave-one-platform-out error of the spec fallback."""
    v = net.validation or {}
    rec = load_network_validation(models_dir)
    if net.calibrated and not v.get("borrowed_from"):
        fit = (v.get("fit") or {}).get("median_ape")
        if fit is not None:
            n = (v.get("fit") or {}).get("n", "?")
            return max(float(fit), 0.03), f"network fitted on {n} measured timings (median error {float(fit):.1%})"
    if v.get("borrowed_from"):
        e = rec.get("borrowed_median_ape")
        return (float(e) if e is not None else 0.15,
                f"network calibration borrowed from {v['borrowed_from']}"
                + (f" (measured borrow error {float(e):.1%})" if e is not None else " (15 % assumed)"))
    e = rec.get("spec_loo_median_ape")
    return (float(e) if e is not None else 0.30,
            "network from link specs x efficiencies of other platforms"
            + (f" (leave-one-platform-out error {float(e):.1%})" if e is not None else " (30 % assumed)"))

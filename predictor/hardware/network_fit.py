"""Calibrate the analytic collective model (`predictor.hardware.network`) on measured sweeps and write
`models_store/<platform>/network.json`, which `Predictor` loads through `network.load_network`.

    python -m predictor.hardware.network_fit [--shared ../shared/datasets] [--models-dir models_store] [--dry-run]

Measured data (read by path, never copied):
  dgx-a100-80gb    vTrain allreduce_lut/a100 (nccl-tests, 2-8 GPUs of one DGX A100 node, 1 MB-1 GB) and
                   ml-engineering a100_8gpu_nccltests_allreduce.csv (32 KB-16 GB, 8 GPUs)
  perlmutter-a100  paper NCCL samples (all-reduce, all-gather, p2p; 1x2 .. 8x1 and 2x4)
  vista-gh200      paper NCCL samples (2x1, 4x1, 8x1; all-reduce, all-gather, p2p)
  dgx-h200         ml-engineering H200 8-GPU all-reduce sweep, 16 GiB collectives (NVLS on/off, all-gather,
                   reduce-scatter), NVLS-vs-GPU-count sweep
  dgx-b200         ml-engineering B200 1 node vs 4 nodes all-reduce sweep (AWS P6-B200, 8 x 400 Gb/s EFA per
                   node: the same 50 GB/s per GPU as DGX B200's ConnectX-7) and NVLS-vs-GPU-count sweep
  dgx-h100, dgx-h200, dgx-b200, gb200-nvl72, dgx-b300, gb300-nvl72
                   NVIDIA aiconfigurator's NCCL tables (nccl-tests all-reduce, all-gather, reduce-scatter,
                   all-to-all, 512 B-512 MB, 2 / 4 / 8 GPUs of one node; GB200 / GB300 2 / 4 of one tray):
                   the intra-node tier only
Platforms without sweeps of their own borrow the calibration named in their `collective_calibration`
(load_network does that at run time) or fall back to link specs x `network.DEFAULTS`. A platform with one-node
tables of its own and a `collective_calibration` elsewhere starts its fit from the borrowed model: its intra-node
tier is its own, the inter-node tier stays the borrowed one.

The all_reduce_bench_example_4nodes.csv sweep names no hardware, so it calibrates nothing.
"""
from __future__ import annotations

import argparse
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from predictor import paths
from predictor.hardware.network import (
    ALLTOALL_MIN_GROUP_SIZES,
    DEFAULTS,
    AlltoallParams,
    NetworkModel,
    analytic_choice,
    borrowed_network,
    bus_bandwidth_gbps,
    fit_network,
    save_network,
    spec_network,
)
from predictor.hardware.platforms import get_platform

SHARED = paths.SHARED_DATASETS
MODELS_DIR = paths.PACKAGED_MODELS_DIR
ML_ENG = "stas00/ml-engineering (CC-BY-SA 4.0)"
_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "B": 1}
CALIBRATED_PLATFORMS = ("dgx-a100-80gb", "perlmutter-a100", "vista-gh200", "dgx-h100", "dgx-h200", "dgx-b200",
                        "gb200-nvl72", "dgx-b300", "gb300-nvl72")
PAPER_DIRS = {"perlmutter-a100": "Perlmutter", "vista-gh200": "Vista"}
_PAPER_NCCL = re.compile(r"_(allreduce_large|allreduce|allgather_large|p2p)_fp16_(\d+)_(\d+)\.csv$")
_PAPER_COLL = {"allreduce": "allreduce", "allreduce_large": "allreduce", "allgather_large": "allgather", "p2p": "p2p"}
COLUMNS = ["platform", "dataset", "collective", "message_bytes", "nodes", "gpus_per_node", "duration_s",
           "algorithm", "source"]


def _payload(s: str) -> int:
    m = re.fullmatch(r"\s*([\d.]+)\s*(KiB|MiB|GiB|B)\s*", str(s))
    if not m:
        raise ValueError(f"cannot parse payload {s!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _gbps(s) -> float:
    return float(str(s).replace("GBps", "").strip())


def _frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    for c in COLUMNS:
        if c not in df:
            df[c] = None
    return df[COLUMNS]


def _time_from_busbw(coll: str, S: float, n: int, busbw: float) -> float:
    f = {"allreduce": 2.0 * (n - 1) / n, "allgather": (n - 1) / n, "reducescatter": (n - 1) / n}[coll]
    return S * f / (busbw * 1e9)


# --------------------------------------------------------------------------- loaders (full-buffer convention)
def load_ml_engineering(shared: Path = SHARED) -> pd.DataFrame:
    d = Path(shared) / "ml-engineering"
    rows: list[dict] = []
    f = d / "a100_8gpu_nccltests_allreduce.csv"
    if f.exists():
        for r in pd.read_csv(f, comment="#").itertuples():
            rows.append(dict(platform="dgx-a100-80gb", dataset="ml-eng A100 8-GPU nccl-tests", collective="allreduce",
                             message_bytes=float(r.size_B), nodes=1, gpus_per_node=8, duration_s=r.time_us * 1e-6,
                             algorithm=None, source=f"{ML_ENG}: {f.name}"))
    f = d / "h200_allreduce_sweep_8gpu.csv"
    if f.exists():
        for r in pd.read_csv(f, comment="#").itertuples():
            S = _payload(r.payload)
            rows.append(dict(platform="dgx-h200", dataset="ml-eng H200 8-GPU all_reduce_bench", collective="allreduce",
                             message_bytes=float(S), nodes=1, gpus_per_node=8, duration_s=S / (_gbps(r.algbw) * 1e9),
                             algorithm=None, source=f"{ML_ENG}: {f.name}"))
    f = d / "h200_collectives_16GiB.csv"
    if f.exists():
        for r in pd.read_csv(f, comment="#").itertuples():
            name = str(r.collective)
            coll = "allreduce" if "all-reduce" in name else "allgather" if "all-gather" in name else "reducescatter"
            algo = "nvls" if str(r.algo).upper() == "NVLS" else "ring"
            S = 16 * 2**30
            rows.append(dict(platform="dgx-h200", dataset="ml-eng H200 8-GPU collectives 16 GiB", collective=coll,
                             message_bytes=float(S), nodes=1, gpus_per_node=8,
                             duration_s=_time_from_busbw(coll, S, 8, _gbps(r.busbw)), algorithm=algo,
                             source=f"{ML_ENG}: {f.name}"))
    for fname, plat, label in (("h200_nvls_sweep_8GiB.csv", "dgx-h200", "ml-eng H200 NVLS vs GPUs 8 GiB"),
                               ("b200_nvls_sweep_8GiB.csv", "dgx-b200", "ml-eng B200 NVLS vs GPUs 8 GiB")):
        f = d / fname
        if not f.exists():
            continue
        df = pd.read_csv(f, comment="#")
        S = 8 * 2**30
        for _, r in df.iterrows():
            n = int(r["GPUs"])
            picked = "nvls" if str(r["algo NCCL picks"]).strip().upper() == "NVLS" else "ring"
            rows.append(dict(platform=plat, dataset=label, collective="allreduce", message_bytes=float(S), nodes=1,
                             gpus_per_node=n, duration_s=_time_from_busbw("allreduce", S, n, _gbps(r["busbw"])),
                             algorithm=picked, source=f"{ML_ENG}: {f.name}"))
            if picked != "ring":
                rows.append(dict(platform=plat, dataset=label + " (NVLS off)", collective="allreduce",
                                 message_bytes=float(S), nodes=1, gpus_per_node=n,
                                 duration_s=_time_from_busbw("allreduce", S, n, _gbps(r["busbw, NVLS off"])),
                                 algorithm="ring", source=f"{ML_ENG}: {f.name}"))
    f = d / "b200_allreduce_1node_vs_4nodes.csv"
    if f.exists():
        for _, r in pd.read_csv(f, comment="#").iterrows():
            S = _payload(r["payload"])
            for col, nodes in (("1 node", 1), ("4 nodes", 4)):
                n = 8 * nodes
                rows.append(dict(platform="dgx-b200", dataset=f"ml-eng B200 all_reduce_bench {col}",
                                 collective="allreduce", message_bytes=float(S), nodes=nodes, gpus_per_node=8,
                                 duration_s=_time_from_busbw("allreduce", S, n, _gbps(r[col])), algorithm=None,
                                 source=f"{ML_ENG}: {f.name}"))
    return _frame(rows)


def load_vtrain_lut(shared: Path = SHARED) -> pd.DataFrame:
    d = Path(shared) / "vtrain" / "allreduce_lut" / "a100"
    rows: list[dict] = []
    for f in sorted(d.glob("AR_GPU*_LUT")):
        m = re.search(r"AR_GPU(\d+)_", f.name)
        if m is None:  # not an N-GPU table (AR_GPU<n>_LUT)
            continue
        n = int(m.group(1))
        df = pd.read_csv(f)
        size = df.iloc[:, 0].astype(float)
        for j in (3, 5):
            if j < df.shape[1]:
                t = pd.to_numeric(df.iloc[:, j], errors="coerce") * 1e-9
                for S, ti in zip(size, t):
                    if np.isfinite(ti) and ti > 0:
                        rows.append(dict(platform="dgx-a100-80gb", dataset=f"vTrain LUT A100 {n} GPUs",
                                         collective="allreduce", message_bytes=S, nodes=1, gpus_per_node=n,
                                         duration_s=ti, algorithm=None,
                                         source=f"VIA-Research/vTrain (MIT): allreduce_lut/a100/{f.name}"))
    return _frame(rows)


def load_paper_nccl(platform_id: str, shared: Path = SHARED) -> pd.DataFrame:
    """The paper's per-topology NCCL files (the pooled files repeat them). All-gather `shape` is the
    per-rank input (converted here to the full output buffer)."""
    d = Path(shared) / "paper-samples" / PAPER_DIRS[platform_id] / "nccl"
    rows = []
    for f in sorted(d.glob("*.csv")):
        m = _PAPER_NCCL.search(f.name)
        if not m:
            continue
        coll = _PAPER_COLL[m.group(1)]
        nodes, gpn = int(m.group(2)), int(m.group(3))
        df = pd.read_csv(f)
        S = df["shape"].astype(float) * 2.0  # fp16 elements -> bytes
        if coll == "allgather":
            S = S * nodes * gpn
        t = df["dur(us)"].astype(float) * 1e-6
        rows.append(pd.DataFrame({"platform": platform_id, "dataset": f"paper {m.group(1)} {nodes}x{gpn}",
                                  "collective": coll, "message_bytes": S, "nodes": nodes, "gpus_per_node": gpn,
                                  "duration_s": t, "algorithm": None,
                                  "source": f"DebarghaG/estimate-train-time (MIT): {f.name}"}))
    return pd.concat(rows, ignore_index=True)[COLUMNS] if rows else _frame([])


# NVIDIA aiconfigurator's intra-node NCCL tables (nccl-tests' all_reduce_perf / all_gather_perf / reduce_scatter_perf
# / alltoall_perf, out-of-place time; `message_size` is nccl-tests' size in elements, the full buffer)
AIC = "ai-dynamo/aiconfigurator (Apache-2.0)"
AIC_GPU_PLATFORMS = {"h100_sxm": "dgx-h100", "h200_sxm": "dgx-h200", "b200_sxm": "dgx-b200", "gb200": "gb200-nvl72",
                     "b300_sxm": "dgx-b300", "gb300": "gb300-nvl72"}
_AIC_COLL = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
             "alltoall": "alltoall"}
# The sizes a training step's collectives move (TP / SP activations, DP buckets, EP dispatch, PP sends: >= 1 MiB at
# the scales planned here). The analytic model's two regimes cannot follow the tables from 512 B to 512 MB at once:
# fitted on every size it errs -7 to -21 % on 1-32 MB and up to +23 % above, fitted on >= 1 MiB within about
# +/-10 % there, and the smaller messages are then +27 to +87 % too slow (docs/accuracy.md, "Network")
AIC_MIN_MESSAGE_BYTES = 2**20


def load_aiconfigurator_nccl(shared: Path = SHARED) -> pd.DataFrame:
    """The collector's NCCL tables of the Hopper / Blackwell GPUs (one node, 2-8 GPUs; GB200 / GB300 trays 2-4),
    half-precision rows (the int8 rows time the same bytes again) of at least AIC_MIN_MESSAGE_BYTES. The A100 table
    is left out: dgx-a100-80gb is calibrated on vTrain's and ml-engineering's sweeps, which its end-to-end terms were
    fitted with."""
    rows: list[dict] = []
    for folder, pid in AIC_GPU_PLATFORMS.items():
        for f in sorted((Path(shared) / "aiconfigurator" / folder / "comm" / "nccl").glob("*/nccl_perf.parquet")):
            d = pd.read_parquet(f)
            d = d[(d["nccl_dtype"] == "half") & d["op_name"].isin(list(_AIC_COLL))
                  & (2.0 * d["message_size"] >= AIC_MIN_MESSAGE_BYTES)]
            for r in d.itertuples():
                rows.append(dict(platform=pid, dataset=f"aiconfigurator NCCL {f.parent.name} {folder}",
                                 collective=_AIC_COLL[str(r.op_name)], message_bytes=2.0 * float(r.message_size),
                                 nodes=1, gpus_per_node=int(r.num_gpus), duration_s=float(r.latency) * 1e-3,
                                 algorithm=None, source=f"{AIC}: {folder}/comm/nccl/{f.parent.name}"))
    return _frame(rows)


def measured_sweeps(shared: Path = SHARED) -> pd.DataFrame:
    """Every measured collective timing known for a platform of the catalog, full-buffer convention. The
    collector's NCCL tables calibrate the platforms no other sweep measures (dgx-h100, gb200-nvl72, dgx-b300,
    gb300-nvl72): on dgx-b200 the two harnesses disagree beyond what one analytic model can follow (fitted on both,
    the median error is 14 % on the collector's rows and 20 % on ml-engineering's one-node sweep, against 12 % alone),
    so a platform keeps its own sweeps (python -m tests.benchmarks.collective_accuracy prints both)."""
    parts = [load_ml_engineering(shared), load_vtrain_lut(shared)]
    for pid in PAPER_DIRS:
        parts.append(load_paper_nccl(pid, shared))
    have = set().union(*(set(p["platform"]) for p in parts if len(p)))
    aic = load_aiconfigurator_nccl(shared)
    parts.append(aic[~aic["platform"].isin(have)])
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else _frame([])


def clean_paper(df: pd.DataFrame, platform=None) -> pd.DataFrame:
    """Drop physically impossible rows (the corrupt rows the datasets README names, e.g. the bimodal
    paper all-gather files): an implied ring bus bandwidth above 1.3x the link spec (2x inside an
    NVSwitch node, where NVLS legitimately beats the link), or a p2p faster than 1.3x its link; and,
    per data set, rows below half its 90th-percentile bandwidth (interference, see below)."""
    if df.empty:
        return df
    out = []
    for pid, g in df.groupby("platform"):
        try:
            plat = platform if platform is not None else get_platform(pid)
        except Exception:  # noqa: BLE001 - unknown platform: keep its rows
            out.append(g)
            continue
        n = (g["nodes"] * g["gpus_per_node"]).astype(float)
        multi = g["nodes"] > 1
        intra = plat.intra_node.bandwidth_gbps or plat.inter_node.bandwidth_gbps
        inter = plat.inter_node.bandwidth_gbps or intra
        link = np.where(multi, np.minimum(intra, g["gpus_per_node"] * inter) if intra else inter, intra)
        link = np.where(multi & (g["gpus_per_node"] == 1), inter, link)
        factor = np.where((~multi) & (plat.intra_node.kind == "nvswitch"), 2.0, 1.3)
        f = np.select([g["collective"] == "allreduce", g["collective"].isin(["allgather", "reducescatter"])],
                      [2.0 * (n - 1) / n, (n - 1) / n], 1.0)
        busbw = g["message_bytes"] * f / g["duration_s"] / 1e9
        g = g[busbw <= factor * link]
        # interference: noise only slows a collective down; in a file whose rows split into a fast and
        # a slow mode (paper all-gather 1x4: 4-7 GB/s rows among ~45 GB/s ones), keep the fast mode
        # (only large-message data sets, the paper's: small messages are slow for a reason)
        if "dataset" in g and len(g) >= 20:
            bw = g["message_bytes"] / g["duration_s"]
            p90 = bw.groupby(g["dataset"]).transform(lambda x: x.quantile(0.9))
            paper = g["dataset"].astype(str).str.startswith("paper").to_numpy()
            g = g[~paper | (bw >= 0.5 * p90).to_numpy()]
        out.append(g)
    return pd.concat(out) if out else df


# --------------------------------------------------------------------------- all-to-all (network.AlltoallParams)
def aiconfigurator_alltoall(shared: Path = SHARED) -> pd.DataFrame:
    """The collector's one-node all-to-all rows of every Hopper / Blackwell platform (also those whose other
    collectives are calibrated on other sweeps: no other sweep here measures an all-to-all)."""
    d = load_aiconfigurator_nccl(shared)
    return d[d["collective"] == "alltoall"].reset_index(drop=True)


def alltoall_times(a: AlltoallParams, message_bytes, ranks) -> np.ndarray:
    """Seconds of one all-to-all of `ranks` GPUs inside one switch domain under `a` (network.AlltoallParams)."""
    S = np.asarray(message_bytes, float)
    n = np.asarray(ranks, float)
    return ((a.base_latency_us + (n - 1.0) * a.peer_latency_us) * 1e-6
            + np.maximum((n - 1.0) / n * S / (a.bus_bandwidth_gbps * 1e9), S / (a.alg_bandwidth_gbps * 1e9)))


def fit_alltoall(rows: pd.DataFrame, source: str, bus_gbps: float | None = None, bus_source: str = "",
                 min_group_sizes: int = ALLTOALL_MIN_GROUP_SIZES) -> AlltoallParams | None:
    """Fit network.AlltoallParams on one-node all-to-all rows (full-buffer convention, >= 2 GPUs): least squares on
    log(time), soft-L1 like `network.fit_network`. The link-bound bus bandwidth is fitted only where the rows span
    ALLTOALL_MIN_GROUP_SIZES group sizes (2, 4, 8 GPUs); with fewer it must be given (`bus_gbps`, from the platform
    whose calibration this one borrows: `bus_source`), else None (no all-to-all model: the ring tiers time it)."""
    from scipy.optimize import least_squares
    r = rows[(rows["collective"] == "alltoall") & (rows["nodes"] == 1) & (rows["gpus_per_node"] > 1)
             & (rows["duration_s"] > 0)]
    if r.empty:
        return None
    free_bus = r["gpus_per_node"].nunique() >= min_group_sizes
    if not free_bus and bus_gbps is None:
        return None
    S = r["message_bytes"].to_numpy(float)
    n = r["gpus_per_node"].to_numpy(float)
    y = np.log(r["duration_s"].to_numpy(float))
    w = 1.0 / np.sqrt(pd.Series(n).map(pd.Series(n).value_counts()).to_numpy(float))  # each group size equally

    fixed_bus = float(bus_gbps) if bus_gbps is not None else 0.0

    def params(x: np.ndarray) -> AlltoallParams:
        v = np.exp(x)
        return AlltoallParams(float(v[2]) if free_bus else fixed_bus, float(v[-1]), float(v[0]), float(v[1]), source)
    lo = np.log([0.5, 1e-3] + ([1.0] if free_bus else []) + [1.0])
    hi = np.log([500.0, 50.0] + ([5000.0] if free_bus else []) + [5000.0])
    # the larger of two bounds has two basins (link-bound or per-GPU-bound at the measured sizes): start from both
    # and keep the better fit
    best = None
    for bus0, alg0 in ((300.0, 3000.0), (3000.0, 300.0), (400.0, 500.0)):
        x0 = np.log([15.0, 0.5] + ([bus0] if free_bus else []) + [alg0])
        res = least_squares(lambda x: (np.log(alltoall_times(params(x), S, n)) - y) * w, x0, bounds=(lo, hi),
                            loss="soft_l1", f_scale=0.3, max_nfev=400)
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    a = params(best.x)
    ape = np.abs(alltoall_times(a, S, n) / r["duration_s"].to_numpy(float) - 1.0)
    return replace(a, bus_source="" if free_bus else bus_source, n_samples=int(len(r)),
                   fit_mape=float(np.median(ape)))


def alltoall_holdout(rows: pd.DataFrame, held_out_gpus: int = 8) -> pd.DataFrame:
    """The group-size extrapolation checked where it can be: fit (`fit_alltoall`, bus bandwidth free) on the rows
    below `held_out_gpus` GPUs, predict the `held_out_gpus` rows. One row per message size."""
    train = rows[rows["gpus_per_node"] < held_out_gpus]
    test = rows[rows["gpus_per_node"] == held_out_gpus]
    a = fit_alltoall(train, "held-out fit", min_group_sizes=2) if not test.empty else None
    if a is None:
        return pd.DataFrame(columns=["message_bytes", "measured_s", "predicted_s", "signed_error"])
    pred = alltoall_times(a, test["message_bytes"].to_numpy(float), test["gpus_per_node"].to_numpy(float))
    meas = test["duration_s"].to_numpy(float)
    return pd.DataFrame({"message_bytes": test["message_bytes"].to_numpy(float), "measured_s": meas,
                         "predicted_s": pred, "signed_error": pred / meas - 1.0})


# --------------------------------------------------------------------------- calibration
def calibrate_platform(platform_id: str, data: pd.DataFrame, exclude: tuple[str, ...] = (),
                       start: NetworkModel | None = None) -> NetworkModel:
    """Fit `platform_id`'s network on its rows of `data`, starting from `start` (default: its link specs): the
    parameters its rows cannot inform (e.g. the inter-node tier, for single-node tables) keep the start's values."""
    plat = get_platform(platform_id)
    d = data[(data["platform"] == platform_id) & ~data["dataset"].isin(exclude)]
    d = clean_paper(d, plat)
    net = start or spec_network(plat)
    if net.alltoall is not None and net.intra_topology == "switch":
        d = d[d["collective"] != "alltoall"]   # timed by its own measured model (network.AlltoallParams)
    if d.empty:
        return net
    return fit_network(net, d, describe_datasets(d["dataset"]))


def describe_datasets(names) -> str:
    """A short label for a set of data sets: 'paper NCCL samples (21 sets); vTrain LUT A100 (7 sets)'."""
    groups: dict[str, int] = {}
    for n in sorted(set(map(str, names))):
        key = re.sub(r"\s*(\d+x\d+|\d+ GPUs|\d+ nodes?|\(NVLS off\))$", "", n)
        key = "paper NCCL samples" if key.startswith("paper ") else key
        groups[key] = groups.get(key, 0) + 1
    return "; ".join(f"{k} ({v} sets)" if v > 1 else k for k, v in groups.items())


def efficiencies(net: NetworkModel, platform_id: str) -> dict[str, float]:
    """The link-relative efficiencies and latencies of a calibrated model (what DEFAULTS summarises)."""
    p = get_platform(platform_id)
    out: dict[str, float] = {}
    if net.intra.source != "link spec" and p.intra_node.bandwidth_gbps > 0:
        out["intra_efficiency"] = net.intra.bandwidth_gbps / p.intra_node.bandwidth_gbps
        out["intra_latency_us"] = net.intra.latency_us
        out["intra_base_us"] = net.intra.base_latency_us
        if net.intra.ll_bandwidth_gbps:
            out["ll_fraction"] = net.intra.ll_bandwidth_gbps / net.intra.bandwidth_gbps
            out["ll_latency_us"] = net.intra.ll_lat()
            out["ll_base_us"] = net.intra.ll_base()
    if net.inter.source != "link spec" and p.inter_node.bandwidth_gbps > 0:
        out["inter_efficiency"] = net.inter.bandwidth_gbps / p.inter_node.bandwidth_gbps
        out["inter_base_us"] = net.inter.base_latency_us
    if net.nvls is not None and net.nvls.source != "link spec" and p.intra_node.bandwidth_gbps > 0:
        out["nvls_efficiency"] = net.nvls.bandwidth_gbps / p.intra_node.bandwidth_gbps
        out["nvls_base_us"] = net.nvls.base_latency_us
    return out


def pooled_defaults(fits: dict[str, NetworkModel], exclude: str | None = None) -> dict[str, float]:
    """Median of the per-platform efficiencies, leaving out `exclude` (for leave-one-platform-out).
    Platforms whose network is far below its link spec (Perlmutter's paper runs: ~5 % of Slingshot) do
    not inform the inter-node efficiency default."""
    vals: dict[str, list[float]] = {}
    for pid, net in fits.items():
        if pid == exclude:
            continue
        for k, v in efficiencies(net, pid).items():
            if k == "inter_efficiency" and v < 0.3:
                continue
            vals.setdefault(k, []).append(v)
    return {k: float(np.median(v)) for k, v in vals.items()}


def evaluate(net: NetworkModel, data: pd.DataFrame) -> pd.DataFrame:
    """Per-row prediction, error and bus bandwidths (measured and predicted)."""
    d = data.copy()
    pred = np.empty(len(d))
    algo = np.empty(len(d), dtype=object)
    groups = d.reset_index(drop=True).groupby(["collective", d["algorithm"].fillna("").to_numpy()]).indices
    for (c, a), idx in groups.items():
        g = d.iloc[idx]
        t, ch = analytic_choice(net, c, g["message_bytes"].to_numpy(float), g["nodes"].to_numpy(float),
                                g["gpus_per_node"].to_numpy(float), force=a or None)
        pred[idx], algo[idx] = t, ch
    d["predicted_s"] = pred
    d["chosen"] = algo
    d["ape"] = np.abs(pred - d["duration_s"]) / d["duration_s"]
    n = d["nodes"] * d["gpus_per_node"]
    ar = (d["collective"] == "allreduce").to_numpy()
    d["busbw_measured"] = np.where(ar, bus_bandwidth_gbps("allreduce", d["message_bytes"], n, d["duration_s"]), np.nan)
    d["busbw_predicted"] = np.where(ar, bus_bandwidth_gbps("allreduce", d["message_bytes"], n, d["predicted_s"]),
                                    np.nan)
    return d


def platform_alltoall(platform_id: str, rows: pd.DataFrame, fits: dict[str, NetworkModel]) -> AlltoallParams | None:
    """`platform_id`'s all-to-all model (network.AlltoallParams) from its rows of `rows` (aiconfigurator_alltoall);
    where they span too few group sizes, the bus bandwidth of the platform its calibration borrows (in `fits`), scaled
    by the two link specs; None without rows or without such a bus bandwidth."""
    plat = get_platform(platform_id)
    if spec_network(plat).intra_topology != "switch":
        return None
    r = rows[rows["platform"] == platform_id]
    if r.empty:
        return None
    borrow = plat.collective_calibration
    other = fits.get(borrow) if borrow and borrow != platform_id else None
    bus, bus_source = None, ""
    if borrow and other is not None and other.alltoall is not None:
        op = get_platform(borrow)
        ratio = (plat.intra_node.bandwidth_gbps / op.intra_node.bandwidth_gbps
                 if plat.intra_node.bandwidth_gbps and op.intra_node.bandwidth_gbps else 1.0)
        bus = other.alltoall.bus_bandwidth_gbps * ratio
        bus_source = (f"{borrow}'s all-to-all bus bandwidth ({other.alltoall.bus_bandwidth_gbps:.0f} GB/s, 2-8 GPUs)"
                      + (f" x{ratio:.2g} (link specs)" if ratio != 1.0 else "")
                      + ": this platform's sweeps do not pin the link bound")
    return fit_alltoall(r, describe_datasets(r["dataset"]) + " all-to-all", bus, bus_source)


def calibrate_platforms(data: pd.DataFrame, alltoall_rows: pd.DataFrame) -> dict[str, NetworkModel]:
    """Every CALIBRATED_PLATFORMS model with rows in `data`, in that order: its all-to-all model first
    (`platform_alltoall` on `alltoall_rows`), then the other collectives (`calibrate_platform`; its all-to-all rows
    are then left to the all-to-all model), with the per-dataset median errors in `validation`."""
    fits: dict[str, NetworkModel] = {}
    for pid in CALIBRATED_PLATFORMS:
        if not (data["platform"] == pid).any():
            continue
        # a platform that borrows another's calibration (same fabric family) takes its inter-node tier from it
        # (one-node tables do not reach that tier, which would otherwise fall back to the link spec)
        plat = get_platform(pid)
        borrow = plat.collective_calibration
        start = (replace(spec_network(plat), inter=borrowed_network(plat, fits[borrow], borrow).inter)
                 if borrow is not None and borrow in fits and borrow != pid else None)
        start = replace(start or spec_network(plat), alltoall=platform_alltoall(pid, alltoall_rows, fits))
        net = calibrate_platform(pid, data, start=start)
        ev = evaluate(net, clean_paper(data[data["platform"] == pid]))
        fits[pid] = replace(net, validation={**net.validation, "median_ape_by_dataset":
                                             {k: float(v) for k, v in ev.groupby("dataset")["ape"].median().items()}})
    return fits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m predictor.hardware.network_fit", description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(SHARED))
    ap.add_argument("--models-dir", default=str(MODELS_DIR))
    ap.add_argument("--dry-run", action="store_true", help="fit and print, write nothing")
    a = ap.parse_args(argv)
    data = measured_sweeps(Path(a.shared))
    if data.empty:
        print(f"no measured sweeps under {a.shared}")
        return 1
    fits = calibrate_platforms(data, aiconfigurator_alltoall(Path(a.shared)))
    rc = 0
    for pid, net in fits.items():
        print(f"{pid}: intra {net.intra.bandwidth_gbps:.1f} GB/s ({net.intra.source}), "
              f"inter {net.inter.bandwidth_gbps:.2f} GB/s, nvls {net.nvls.bandwidth_gbps if net.nvls else '-'}; "
              f"fit median error {net.validation['fit']['median_ape']:.1%}")
        if not a.dry_run:
            try:  # atomic; refuses a model with a value network.json may not hold (ArtifactError)
                save_network(net, Path(a.models_dir) / pid / "network.json")
            except ValueError as e:
                print(f"{pid}: not saved: {e}")
                rc = 1
    pooled = pooled_defaults(fits)
    print("pooled efficiencies (compare network.DEFAULTS):", json.dumps({k: round(v, 3) for k, v in pooled.items()}))
    print("network.DEFAULTS:", json.dumps(DEFAULTS))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())

"""How the saved network calibrations fit the measured NCCL sweeps they were fitted on.

`network_check(shared, models_dir)` takes every platform that has both a saved calibration
(`<models_dir>/<platform>/network.json`, read with `network.load_network_checked`, i.e. exactly the
model predictions use) and measured sweeps under `shared` (`calibrate_network.measured_sweeps`: vTrain's
all-reduce LUT, the paper's NCCL samples, the ml-engineering sweeps) and returns

  points   every measured timing the calibration keeps (`calibrate_network.clean_paper`) with the saved
           model's prediction (`calibrate_network.evaluate`), its error and both bus bandwidths;
  curves   per (platform, collective, nodes, GPUs per node, forced algorithm) group, the saved model's
           time and bus bandwidth on a log-spaced message-size grid spanning the group's measured range;
  summary  per (platform, dataset, collective): rows kept (and dropped by the cleaning), median and
           mean absolute error, mean signed error ((predicted - measured) / measured);
  platforms  one row per platform: points, errors over all its points, the fit error saved in
           network.json, the fitted per-GPU bandwidths.

Without the datasets folder (or without a saved calibration) the frames are empty, with their columns.
No printing and no Streamlit: the dashboard's Accuracy page and the tests call it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from predictor import paths
from predictor.hardware.network import NETWORK_FILE, analytic_choice, bus_bandwidth_gbps, load_network_checked
from predictor.hardware.network_fit import SHARED, clean_paper, describe_datasets, evaluate, measured_sweeps
from predictor.hardware.platforms import Platform, get_platform

GRID_PER_DECADE = 40      # curve points per decade of message size (a protocol switch between two stays within 1 %)
MIN_SPAN = 4.0            # a group measured at one size (or a narrow range) gets a curve over at least 4x
POINT_COLUMNS = ["platform", "group", "dataset", "collective", "nodes", "gpus_per_node", "algorithm",
                 "message_bytes", "duration_s", "predicted_s", "chosen", "ape", "signed_error",
                 "busbw_measured", "busbw_predicted", "source"]
CURVE_COLUMNS = ["platform", "group", "collective", "nodes", "gpus_per_node", "algorithm", "message_bytes",
                 "predicted_s", "busbw_predicted", "chosen"]
SUMMARY_COLUMNS = ["platform", "dataset", "collective", "rows", "dropped", "median_ape", "mape", "mean_signed",
                   "source"]
PLATFORM_COLUMNS = ["platform", "points", "median_ape", "mape", "mean_signed", "saved_fit_median_ape",
                    "intra_gbps", "inter_gbps", "datasets", "network_file"]


@dataclass(frozen=True)
class NetworkCheck:
    points: pd.DataFrame
    curves: pd.DataFrame
    summary: pd.DataFrame
    platforms: pd.DataFrame
    shared: Path
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def empty(self) -> bool:
        return self.points.empty

    def platform_ids(self) -> list[str]:
        """Platforms with points, the one with the most first."""
        if self.platforms.empty:
            return []
        return list(self.platforms.sort_values(["points", "platform"], ascending=[False, True])["platform"])


def group_label(collective: str, nodes: int, gpus_per_node: int, algorithm: str | None = None) -> str:
    """'allreduce 4x8' (nodes x GPUs per node), with the algorithm when the sweep forced one."""
    return f"{collective} {int(nodes)}x{int(gpus_per_node)}" + (f" {algorithm}" if algorithm else "")


def _labels(df: pd.DataFrame) -> pd.Series:
    algo = df["algorithm"].where(df["algorithm"].notna(), "")
    return pd.Series([group_label(c, n, k, a or None) for c, n, k, a in
                      zip(df["collective"], df["nodes"], df["gpus_per_node"], algo)], index=df.index, dtype=object)


def _busbw(df: pd.DataFrame, seconds: str) -> np.ndarray:
    """nccl-tests bus bandwidth of every row (p2p: message / time)."""
    out = np.full(len(df), np.nan)
    n = (df["nodes"] * df["gpus_per_node"]).to_numpy(float)
    for c in df["collective"].unique():
        m = (df["collective"] == c).to_numpy()
        out[m] = bus_bandwidth_gbps(str(c), df["message_bytes"].to_numpy(float)[m], n[m],
                                    df[seconds].to_numpy(float)[m])
    return out


def message_grid(lo: float, hi: float, per_decade: int = GRID_PER_DECADE, min_span: float = MIN_SPAN) -> np.ndarray:
    """Log-spaced message sizes from lo to hi, widened about their geometric centre to at least `min_span`."""
    lo, hi = float(lo), float(hi)
    if hi / lo < min_span:
        c = math.sqrt(lo * hi)
        lo, hi = min(lo, c / math.sqrt(min_span)), max(hi, c * math.sqrt(min_span))
    n = max(2, math.ceil(math.log10(hi / lo) * per_decade) + 1)
    return np.geomspace(lo, hi, n)


def _empty(shared: Path, warnings: tuple[str, ...] = ()) -> NetworkCheck:
    return NetworkCheck(pd.DataFrame(columns=POINT_COLUMNS), pd.DataFrame(columns=CURVE_COLUMNS),
                        pd.DataFrame(columns=SUMMARY_COLUMNS), pd.DataFrame(columns=PLATFORM_COLUMNS), shared,
                        warnings)


def network_check(shared: str | Path | None = None, models_dir: str | Path | None = None,
                  platforms: dict[str, Platform] | None = None) -> NetworkCheck:
    """The saved network calibrations against the measured sweeps (see the module docstring).

    `shared` is the datasets folder (default ../shared/datasets next to the checkout); `models_dir` the
    models folder (default $PREDICTOR_MODELS_DIR, else models_store/); `platforms` overrides the catalog
    lookup (tests). A platform whose network.json is unusable is skipped with a warning."""
    shared = Path(shared) if shared is not None else SHARED
    models = paths.models_dir(models_dir)
    if not shared.is_dir():
        return _empty(shared)
    data = measured_sweeps(shared)
    if data.empty:
        return _empty(shared)
    warnings: list[str] = []
    pts, crv, summ, plats = [], [], [], []
    for pid in sorted(data["platform"].unique()):
        if not (models / pid / NETWORK_FILE).is_file():
            continue  # no calibration of its own: nothing saved to check
        try:
            plat = (platforms or {}).get(pid) or get_platform(pid)
        except Exception as e:  # noqa: BLE001 - a sweep of a platform the catalog lacks
            warnings.append(f"{pid}: not in the platform catalog ({e})")
            continue
        net, warn = load_network_checked(plat, models)
        if warn:
            warnings.append(warn)
            continue
        raw = data[data["platform"] == pid]
        kept = clean_paper(raw, plat)
        if kept.empty:
            continue
        ev = evaluate(net, kept).reset_index(drop=True)
        ev["group"] = _labels(ev)
        ev["signed_error"] = (ev["predicted_s"] - ev["duration_s"]) / ev["duration_s"]
        ev["busbw_measured"] = _busbw(ev, "duration_s")
        ev["busbw_predicted"] = _busbw(ev, "predicted_s")
        pts.append(ev[POINT_COLUMNS])
        algo = ev["algorithm"].fillna("").astype(str)
        for (c, nodes, k, a), g in ev.groupby([ev["collective"], ev["nodes"], ev["gpus_per_node"], algo], sort=True):
            S = message_grid(g["message_bytes"].min(), g["message_bytes"].max())
            t, chosen = analytic_choice(net, c, S, nodes, k, force=a or None)
            crv.append(pd.DataFrame({
                "platform": pid, "group": group_label(c, nodes, k, a or None), "collective": c, "nodes": int(nodes),
                "gpus_per_node": int(k), "algorithm": a or None, "message_bytes": S, "predicted_s": t,
                "busbw_predicted": bus_bandwidth_gbps(c, S, np.full_like(S, nodes * k), t), "chosen": chosen}))
        raw_n = raw.groupby(["dataset", "collective"]).size()
        for (ds, c), g in ev.groupby(["dataset", "collective"], sort=True):
            summ.append({"platform": pid, "dataset": ds, "collective": c, "rows": len(g),
                         "dropped": int(raw_n.get((ds, c), len(g))) - len(g),
                         "median_ape": float(g["ape"].median()), "mape": float(g["ape"].mean()),
                         "mean_signed": float(g["signed_error"].mean()),
                         "source": "; ".join(sorted({str(s).split(": ")[0] for s in g["source"]}))})
        fit = (net.validation or {}).get("fit") or {}
        plats.append({"platform": pid, "points": len(ev), "median_ape": float(ev["ape"].median()),
                      "mape": float(ev["ape"].mean()), "mean_signed": float(ev["signed_error"].mean()),
                      "saved_fit_median_ape": fit.get("median_ape"), "intra_gbps": net.intra.bandwidth_gbps,
                      "inter_gbps": net.inter.bandwidth_gbps, "datasets": describe_datasets(ev["dataset"]),
                      "network_file": str(models / pid / NETWORK_FILE)})
    if not pts:
        return _empty(shared, tuple(warnings))
    return NetworkCheck(pd.concat(pts, ignore_index=True), pd.concat(crv, ignore_index=True),
                        pd.DataFrame(summ, columns=SUMMARY_COLUMNS), pd.DataFrame(plats, columns=PLATFORM_COLUMNS),
                        shared, tuple(warnings))


def fabric_note(check: NetworkCheck, platform: Platform) -> str | None:
    """One sentence on what bounds the largest multi-node all-reduce measured on `platform`: its bus
    bandwidth at large messages (95th percentile of the group) against the NICs it crosses (GPUs per node
    x the per-GPU NIC bandwidth of the platform spec), and the per-GPU inter-node bandwidth the saved
    calibration fitted; None without a multi-node all-reduce."""
    points = check.points
    p = points[(points["platform"] == platform.platform_id) & (points["collective"] == "allreduce")
               & (points["nodes"] > 1) & points["algorithm"].isna()]
    nic = platform.inter_node.bandwidth_gbps
    if p.empty or not nic or nic <= 0:
        return None
    size = p["nodes"] * p["gpus_per_node"]
    g = p[size == size.max()]
    nodes, k = int(g["nodes"].iloc[0]), int(g["gpus_per_node"].iloc[0])
    peak = float(g["busbw_measured"].quantile(0.95))
    ceiling = k * nic
    ratio = peak / ceiling
    where = (f"the node's aggregate NIC bandwidth ({k} × {nic:g} GB/s = {ceiling:g} GB/s)" if k > 1
             else f"one GPU's NIC bandwidth ({nic:g} GB/s)")
    one = points[(points["platform"] == platform.platform_id) & (points["collective"] == "allreduce")
                 & (points["nodes"] == 1) & (points["gpus_per_node"] == k) & points["algorithm"].isna()]
    inside = (f", against {float(one['busbw_measured'].quantile(0.95)):,.0f} GB/s inside one node"
              if k > 1 and len(one) else "")
    fitted = check.platforms.loc[check.platforms["platform"] == platform.platform_id, "inter_gbps"]
    per_gpu = float(fitted.iloc[0]) if len(fitted) else float("nan")
    fit = "" if not len(fitted) else (f" ({per_gpu:.3g} GB/s per GPU, {k * per_gpu:.3g} GB/s per node)" if k > 1
                                      else f" ({per_gpu:.3g} GB/s)")
    lead = (f"All-reduce across {nodes} nodes × {k} GPU{'s' if k > 1 else ''} levels off at {peak:,.0f} GB/s "
            f"bus bandwidth, {ratio:.0%} of {where}{inside}")
    if ratio >= 0.7:
        return lead + (f": across nodes NCCL runs one ring per NIC, so the network, not NVLink, sets the ceiling, "
                       f"and the fitted inter-node bandwidth{fit} follows it." if k > 1 else
                       f": the network sets the ceiling, and the fitted inter-node bandwidth{fit} follows it.")
    return lead + (f": the measured network runs far below its spec, and the fitted inter-node bandwidth{fit} "
                   "follows the measurements, not the spec.")

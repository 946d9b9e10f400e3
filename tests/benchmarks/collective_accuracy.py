"""Collective benchmark: the analytic network model (ring / tree / NVLS, two protocols, two tiers)
against every measured sweep in ../shared/datasets. Prints tables.

    python -m tests.benchmarks.collective_accuracy [--no-write] [--curves]

1. Calibrated: each platform's model fitted on its own sweeps (what `predictor.hardware.network_fit` writes
   to models_store/<platform>/network.json): median error of time and of bus bandwidth per sweep.
2. Held out:
   a. the ml-engineering A100 8-GPU nccl-tests curve (32 KB-16 GB) predicted from a calibration on the
      vTrain A100 tables only (1 MB-1 GB, another team's DGX A100): same fabric, other measurement --
      the error of borrowing a calibration between platforms of one fabric (dgx-h100 <- dgx-h200);
   b. leave-one-platform-out: every platform's sweeps predicted from link specs x the efficiencies
      pooled over the OTHER calibrated platforms -- the error of an uncalibrated platform (mi300x-8 ...).
3. Bus-bandwidth curves (--curves): measured vs calibrated vs leave-one-out per payload.
Writes models_store/network_validation.json (read by the Predictor for the error band of analytic
collectives) unless --no-write. Targets: median error <= 15 % on the all-reduce bus-bandwidth curves
(8-GPU node, multi-node).
"""
from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from predictor.hardware import network_fit as C
from predictor.hardware.network import NETWORK_VALIDATION_FILE, spec_network
from predictor.hardware.platforms import get_platform

REPO = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO / "models_store"
CURVES = ("ml-eng A100 8-GPU nccl-tests", "ml-eng H200 8-GPU all_reduce_bench", "ml-eng B200 all_reduce_bench 1 node",
          "ml-eng B200 all_reduce_bench 4 nodes", "vTrain LUT A100 8 GPUs")


def _pct(v) -> str:
    return "-" if v is None or not np.isfinite(v) else f"{100 * v:.1f}%"


def busbw_ape(ev: pd.DataFrame) -> pd.Series:
    """|busbw_pred - busbw_meas| / busbw_meas = |t_meas / t_pred - 1| (any collective)."""
    return (ev["duration_s"] / ev["predicted_s"] - 1.0).abs()


def per_dataset(ev: pd.DataFrame) -> pd.DataFrame:
    ev = ev.assign(bw_ape=busbw_ape(ev))
    g = ev.groupby(["platform", "dataset"], sort=False)
    return g.agg(points=("ape", "size"), time_median=("ape", "median"), busbw_median=("bw_ape", "median"),
                 busbw_p90=("bw_ape", lambda x: x.quantile(0.9)),
                 algorithms=("chosen", lambda x: ",".join(sorted(set(map(str, x)))))).reset_index()


def alltoall_report(fits: dict, a2a: pd.DataFrame) -> None:
    """The all-to-all model (network.AlltoallParams): its fit per platform, the group-size extrapolation held out
    (fit on 2 and 4 GPUs, predict 8) and the B200 model (2-8 GPUs) on the GB200 / GB300 trays' own rows."""
    rows = []
    for pid, net in fits.items():
        a = net.alltoall
        r = a2a[a2a["platform"] == pid]
        if a is None or r.empty:
            continue
        e = C.alltoall_times(a, r["message_bytes"], r["gpus_per_node"]) / r["duration_s"].to_numpy() - 1.0
        by_n = {f"n={n}": _pct(float(np.median(np.abs(e[(r["gpus_per_node"] == n).to_numpy()]))))
                for n in sorted(r["gpus_per_node"].unique())}
        rows.append({"platform": pid, "bus_GBps": round(a.bus_bandwidth_gbps), "alg_GBps": round(a.alg_bandwidth_gbps),
                     "base_us": round(a.base_latency_us, 1), "peer_us": round(a.peer_latency_us, 2),
                     "bus from": "fitted" if not a.bus_source else a.bus_source.split("'")[0], **by_n})
    print("\n== 3. all-to-all inside one NVSwitch domain (aiconfigurator nccl-tests alltoall, >= 1 MiB): fit, "
          "median |time error| per group size ==")
    print(pd.DataFrame(rows).fillna("-").to_string(index=False))
    print("\n-- held out: fitted on 2 and 4 GPUs (bus bandwidth free), 8 GPUs predicted --")
    held = []
    for pid in ("dgx-h100", "dgx-h200", "dgx-b200", "dgx-b300"):
        h = C.alltoall_holdout(a2a[a2a["platform"] == pid])
        if h.empty:
            continue
        big = h["message_bytes"] >= 2**27
        held.append({"platform": pid, "rows": len(h), "median_ape": _pct(h["signed_error"].abs().median()),
                     "mean_signed": f"{100 * h['signed_error'].mean():+.1f}%",
                     ">=128MiB_mean_signed": f"{100 * h.loc[big, 'signed_error'].mean():+.1f}%"})
    print(pd.DataFrame(held).to_string(index=False))
    b200 = fits.get("dgx-b200")
    if b200 is not None and b200.alltoall is not None:
        print("\n-- transferred: dgx-b200's all-to-all model (2-8 GPUs) on the GB200 / GB300 trays' rows "
              "(2, 4 GPUs) --")
        for pid in ("gb200-nvl72", "gb300-nvl72"):
            r = a2a[a2a["platform"] == pid]
            if r.empty:
                continue
            e = C.alltoall_times(b200.alltoall, r["message_bytes"], r["gpus_per_node"]) / r["duration_s"].to_numpy() - 1
            print(f"  {pid:12s} median |error| {_pct(float(np.median(np.abs(e))))}, mean signed {100 * e.mean():+.1f}%")


def run(args) -> dict:
    data = C.measured_sweeps()
    if data.empty:
        print("no measured sweeps found; nothing to do")
        return {}
    a2a = C.aiconfigurator_alltoall()
    fits = C.calibrate_platforms(data, a2a)   # what `python -m predictor.hardware.network_fit` ships
    evs = [C.evaluate(net, C.clean_paper(data[data["platform"] == pid])) for pid, net in fits.items()]
    cal = pd.concat(evs, ignore_index=True)
    t1 = per_dataset(cal)
    print("== 1. calibrated on each platform's own sweeps (in-sample fit) ==")
    print(t1.to_string(index=False, formatters=dict.fromkeys(("time_median", "busbw_median", "busbw_p90"), _pct)))

    # 2a. A100: vTrain-only calibration -> ml-eng curve
    mleng = "ml-eng A100 8-GPU nccl-tests"
    a100_vt = C.calibrate_platform("dgx-a100-80gb", data, exclude=(mleng,))
    ev_a = C.evaluate(a100_vt, data[data["dataset"] == mleng])
    ev_a = ev_a.assign(bw_ape=busbw_ape(ev_a))
    big = ev_a["message_bytes"] >= 2**20
    print(f"\n== 2a. {mleng} predicted from the vTrain-only A100 calibration (held out) ==")
    print(f"all sizes: median busbw error {_pct(ev_a['bw_ape'].median())}; >= 1 MiB (vTrain's range and up): "
          f"{_pct(ev_a.loc[big, 'bw_ape'].median())}")

    # 2b. leave-one-platform-out spec model
    rows, loo_evs = [], []
    for pid in fits:
        defaults = C.pooled_defaults(fits, exclude=pid)
        net = spec_network(get_platform(pid), defaults)
        ev = C.evaluate(net, C.clean_paper(data[data["platform"] == pid]))
        loo_evs.append(ev)
        ev = ev.assign(bw_ape=busbw_ape(ev))
        for ds, g in ev.groupby("dataset", sort=False):
            rows.append({"platform": pid, "dataset": ds, "points": len(g), "busbw_median": g["bw_ape"].median(),
                         "time_median": g["ape"].median()})
    t2 = pd.DataFrame(rows)
    print("\n== 2b. leave-one-platform-out: link specs x efficiencies pooled over the other platforms ==")
    print(t2.to_string(index=False, formatters=dict.fromkeys(("time_median", "busbw_median"), _pct)))
    loo = pd.concat(loo_evs, ignore_index=True)

    # headline: all-reduce bus-bandwidth curves of the measured sweeps (8-GPU nodes and multi-node), each
    # curve weighted once (the vTrain table has 2,048 points, the others 20)
    def curve_medians(ev: pd.DataFrame) -> pd.Series:
        ev = ev[ev["dataset"].isin(CURVES)]
        return ev.assign(bw_ape=busbw_ape(ev)).groupby("dataset")["bw_ape"].median().reindex(
            [c for c in CURVES if c in set(ev["dataset"])])
    cal_c, loo_c = curve_medians(cal), curve_medians(loo)
    print("\n== headline: all-reduce bus-bandwidth curves, median |busbw error| per curve ==")
    print(pd.DataFrame({"calibrated": cal_c.map(_pct), "leave-one-platform-out": loo_c.map(_pct)}).to_string())
    multi = [c for c in cal_c.index if "4 nodes" in c]
    single = [c for c in cal_c.index if c not in multi]
    head = {
        "allreduce_curves_calibrated_median_busbw_ape": float(cal_c.median()),
        "allreduce_curves_8gpu_calibrated": float(cal_c[single].median()),
        "allreduce_curves_multinode_calibrated": float(cal_c[multi].median()) if multi else None,
        "allreduce_curves_loo_median_busbw_ape": float(loo_c.median()),
        "a100_heldout_curve_median_busbw_ape": float(ev_a["bw_ape"].median()),
        "paper_samples_calibrated_median_ape": float(cal.loc[cal["dataset"].str.startswith("paper"), "ape"].median()),
    }
    for k, v in head.items():
        print(f"  {k:48s} {_pct(v) if v is not None else '-'}")
    print("  target: median error <= 15 %")

    alltoall_report(fits, a2a)

    if args.curves:
        for ds in CURVES:
            c = cal[cal["dataset"] == ds]
            if c.empty:
                continue
            lo = loo[loo["dataset"] == ds]
            n = c["nodes"] * c["gpus_per_node"]
            tab = pd.DataFrame({"payload_MiB": c["message_bytes"] / 2**20, "busbw_meas": c["busbw_measured"],
                                "busbw_cal": c["busbw_predicted"], "busbw_loo": lo["busbw_predicted"].to_numpy(),
                                "algo": c["chosen"]})
            if len(tab) > 24:
                tab = tab.iloc[np.linspace(0, len(tab) - 1, 24).astype(int)]
            print(f"\n-- {ds} ({int(n.iloc[0])} ranks): bus bandwidth GB/s")
            print(tab.to_string(index=False, float_format=lambda v: f"{v:.4g}"))

    record = {
        "generated_by": "python -m tests.benchmarks.collective_accuracy",
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "calibrated_median_ape": float(cal["ape"].median()),
        "borrowed_median_ape": head["a100_heldout_curve_median_busbw_ape"],
        "spec_loo_median_ape": float(loo["ape"].median()),
        "headline": head,
        "per_dataset_calibrated": {f"{r.platform}|{r.dataset}": float(r.busbw_median) for r in t1.itertuples()},
        "per_dataset_loo": {f"{r.platform}|{r.dataset}": float(r.busbw_median) for r in t2.itertuples()},
        "notes": "borrowed_median_ape: A100 ml-engineering curve from a vTrain-only calibration (same fabric, other "
                 "measurement); spec_loo_median_ape: every calibrated platform predicted from link specs x the other "
                 "platforms' efficiencies (time APE over all their samples)",
    }
    if not args.no_write:
        out = Path(args.write_dir or MODELS_DIR) / NETWORK_VALIDATION_FILE
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {out}")
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--write-dir")
    ap.add_argument("--curves", action="store_true", help="print the bus-bandwidth curves per payload")
    a = ap.parse_args(argv)
    pd.set_option("display.width", 200)
    run(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

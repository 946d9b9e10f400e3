"""The custom-cluster form (Predict's "custom" platform, Calibrate's unknown platforms) -> a Platform.

Saving one to the user's clusters file is `predictor.hardware.platforms.save_cluster` (the CLI reads that file
with `--clusters`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from predictor.hardware.platforms import Platform, load_devices, make_cluster
from predictor.model.errors import InfeasibleConfig
from predictor.paths import check_id

# The form's fields, in the order the URL / cache key lists them.
CUSTOM_FIELDS = ("c_name", "c_device", "c_gpn", "c_intra_bw", "c_intra_lat", "c_inter_bw", "c_inter_lat", "c_models")
DASHBOARD_SOURCE = ("entered in the dashboard",)


def custom_platform(fields: dict[str, Any]) -> Platform:
    """A Platform from the form's fields; InfeasibleConfig names the field (`c_*`) and the fix.

    `c_models`: "auto" = the device's own transfer source (make_cluster's default), "none" = roofline
    only (analytical), or the id of the platform whose regressors back it.
    """
    devs = load_devices()
    dev_id = fields.get("c_device")
    if dev_id not in devs:
        raise InfeasibleConfig("c_device", f"unknown device '{dev_id}'.", f"use one of {', '.join(sorted(devs))}.")
    gpn = int(fields.get("c_gpn") or 8)
    if gpn <= 0:
        raise InfeasibleConfig("c_gpn", "GPUs per node must be positive.", "use e.g. 8.")
    name = str(fields.get("c_name") or "custom").strip() or "custom"
    check_id(name, "c_name")   # the cluster's name becomes the folder its files are looked up in
    intra_bw = float(fields.get("c_intra_bw") or 0)
    inter_bw = float(fields.get("c_inter_bw") or 0)
    if inter_bw <= 0:
        raise InfeasibleConfig("c_inter_bw", "inter-node bandwidth must be positive.",
                               "give the per-GPU network bandwidth in GB/s (e.g. 50 for 400 Gb/s per GPU).")
    if gpn > 1 and intra_bw <= 0:
        raise InfeasibleConfig("c_intra_bw", "intra-node bandwidth must be positive with more than one GPU per node.",
                               "give the NVLink bandwidth per GPU per direction in GB/s (e.g. 450 for H100 NVLink 4).")
    models = fields.get("c_models") or "auto"
    p = make_cluster(dev_id, gpn, intra_bw if gpn > 1 else None, inter_bw, platform_id=name,
                     inter_latency_us=float(fields.get("c_inter_lat") or 10),
                     op_models=None if models in ("auto", "none") else models,
                     description=f"custom cluster: {gpn}x {devs[dev_id].name} per node")
    return replace(p, op_models=None) if models == "none" else p

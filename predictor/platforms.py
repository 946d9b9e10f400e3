"""Platforms: a device (what backs its operator times) plus a cluster network.

Facts live in `predictor/catalog/*.json`, each entry with its sources; users can
add clusters from their own JSON/YAML file (`load_platforms(extra_file=...)`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .specs import InfeasibleConfig

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"


@dataclass(frozen=True)
class DeviceSpec:
    device_id: str
    name: str
    vendor: str
    peak_tflops: dict[str, float]
    hbm_gib: float
    hbm_bandwidth_gbps: float
    sm_count: int
    l2_mib: float
    nvlink_bandwidth_gbps: float = 0.0
    achievable_matmul_tflops: dict[str, float] = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    def peak_flops(self, precision: str) -> float:
        """Dense peak in FLOP/s for a precision (fp16/bf16 share tensor-core peak)."""
        p = self.peak_tflops.get(precision) or self.peak_tflops.get("bf16") or self.peak_tflops.get("fp16")
        return float(p) * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_gbps * 1e9


@dataclass(frozen=True)
class LinkSpec:
    kind: str
    bandwidth_gbps: float  # per GPU, one direction, GB/s
    latency_us: float


@dataclass(frozen=True)
class Platform:
    platform_id: str
    description: str
    device: DeviceSpec
    gpus_per_node: int
    intra_node: LinkSpec
    inter_node: LinkSpec
    op_models: str | None  # platform id whose operator regressors back this one
    collective_models: str | None
    collective_calibration: str | None = None
    sources: tuple[str, ...] = ()

    def nodes_for(self, ranks: int) -> int:
        return max(1, -(-ranks // self.gpus_per_node))


def _device_from(device_id: str, raw: dict[str, Any]) -> DeviceSpec:
    return DeviceSpec(
        device_id=device_id, name=raw["name"], vendor=raw.get("vendor", ""),
        peak_tflops={k: float(v) for k, v in raw["peak_tflops"].items()},
        hbm_gib=float(raw["hbm_gib"]), hbm_bandwidth_gbps=float(raw["hbm_bandwidth_gbps"]),
        sm_count=int(raw.get("sm_count", 0)), l2_mib=float(raw.get("l2_mib", 0)),
        nvlink_bandwidth_gbps=float(raw.get("nvlink_bandwidth_gbps", 0)),
        achievable_matmul_tflops={k: float(v) for k, v in raw.get("achievable_matmul_tflops", {}).items()},
        sources=tuple(raw.get("sources", ())),
    )


def _link_from(raw: dict[str, Any]) -> LinkSpec:
    return LinkSpec(kind=raw.get("kind", ""), bandwidth_gbps=float(raw.get("bandwidth_gbps", 0)),
                    latency_us=float(raw.get("latency_us", 0)))


def _read_catalog_file(path: Path) -> dict[str, Any]:
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml
        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    return {k: v for k, v in (data or {}).items() if not k.startswith("_")}


@lru_cache(maxsize=8)
def load_devices() -> dict[str, DeviceSpec]:
    raw = _read_catalog_file(CATALOG_DIR / "devices.json")
    return {k: _device_from(k, v) for k, v in raw.items()}


def _platform_from(pid: str, raw: dict[str, Any], devices: dict[str, DeviceSpec]) -> Platform:
    dev_id = raw["device"]
    if dev_id not in devices:
        raise InfeasibleConfig("device", f"platform '{pid}' names unknown device '{dev_id}'.",
                               f"use one of {', '.join(sorted(devices))}.")
    return Platform(
        platform_id=pid, description=raw.get("description", ""), device=devices[dev_id],
        gpus_per_node=int(raw["gpus_per_node"]),
        intra_node=_link_from(raw.get("intra_node", {})), inter_node=_link_from(raw.get("inter_node", {})),
        op_models=raw.get("op_models"), collective_models=raw.get("collective_models"),
        collective_calibration=raw.get("collective_calibration"), sources=tuple(raw.get("sources", ())),
    )


@lru_cache(maxsize=8)
def load_platforms(extra_file: str | None = None) -> dict[str, Platform]:
    devices = load_devices()
    raw = _read_catalog_file(CATALOG_DIR / "clusters.json")
    if extra_file:
        raw.update(_read_catalog_file(Path(extra_file)))
    return {pid: _platform_from(pid, r, devices) for pid, r in raw.items()}


def get_platform(platform_id: str, extra_file: str | None = None) -> Platform:
    platforms = load_platforms(extra_file)
    if platform_id not in platforms:
        raise InfeasibleConfig("platform", f"unknown platform '{platform_id}'.",
                               f"use one of {', '.join(sorted(platforms))} (see `python -m predictor platforms`).")
    return platforms[platform_id]

"""Platforms: a device (what backs its operator times) plus a cluster network.

Facts live in `predictor/catalog/devices.json` (accelerators) and `clusters.json` (presets), each
value with its source. Three ways to get a platform:

* a preset id from the catalog: `get_platform("dgx-h100")`;
* a generic id built on the fly: `get_platform("generic:h100-sxm5-80gb:8:450:50")`
  (device, GPUs per node, intra-node GB/s, inter-node GB/s per GPU; the last two optional), or
  `make_cluster(device_id, gpus_per_node, intra_gbps, inter_gbps, ...)` from Python;
* a user file (JSON or YAML) with `clusters` (and optionally `devices`) sections, or a flat mapping of
  cluster id -> entry: `load_platforms(extra_file="my_clusters.yaml")`. Every entry is validated; a bad
  value raises `InfeasibleConfig` naming the file, the entry and the field.

A platform whose device has no samples of its own names, in `op_models`, the sampled platform whose
operator regressors are transferred to it (the same architecture family where possible: Hopper and
Blackwell parts from `vista-gh200`, Ampere, Ada and Volta parts from `perlmutter-a100`; the device's
`transfer_source` in devices.json). `predictor.regress.transfer` does the transfer.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from predictor import paths
from predictor.model.errors import InfeasibleConfig
from predictor.model.specs import PRECISIONS

CATALOG_DIR = paths.CATALOG_DIR
GENERIC_PREFIX = "generic:"
# Defaults of generic clusters where the caller gives no link numbers.
DEFAULT_INTER_GBPS = 50.0   # one 400 Gb/s NIC per GPU (DGX H100/B200 class)
DEFAULT_INTRA_LATENCY_US = {"nvswitch": 6.0, "nvlink": 6.0, "xgmi": 8.0, "pcie": 10.0, "none": 0.0}
DEFAULT_INTER_LATENCY_US = 10.0
MAX_GPUS_PER_NODE = 2 ** 12  # GPUs in one node / NVLink domain (NVL576 is the largest announced)
LINK_KINDS = ("nvswitch", "nvlink", "xgmi", "pcie", "none", "infiniband", "infiniband-hdr", "infiniband-ndr",
              "infiniband-xdr", "roce", "efa", "slingshot-11", "ethernet")
NVLS_GENERATIONS = ("hopper", "blackwell")   # NVSwitch gen 3+ does in-switch reductions (NVLink SHARP)


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
    generation: str = ""
    form_factor: str = ""
    tdp_w: float = 0.0
    pcie_bandwidth_gbps: float = 0.0
    transfer_source: str | None = None
    unsupported_precisions: dict[str, str] = field(default_factory=dict)
    value_sources: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    kernel_utilization: dict[str, float] = field(default_factory=dict)  # e.g. {"flash_attn": 0.35}
    unsupported_kernels: dict[str, str] = field(default_factory=dict)   # op -> why it cannot run
    # block-scaled GEMM formats the device runs: precision -> how ("blockwise": Hopper's FP8 with per-tile scales
    # applied between MMAs; "mx": Blackwell's block-scaled MMA); predictor.step.fp8
    scaled_formats: dict[str, str] = field(default_factory=dict)
    # --- activation offloading ---
    # GPU <-> host memory bandwidth per direction, GB/s (PCIe x16 to the host CPU, or NVLink-C2C on Grace
    # superchips); 0 = not stated (activation offloading is then refused, never priced at a guessed speed)
    host_link_gbps: float = 0.0

    def peak_flops(self, precision: str) -> float:
        """Dense peak in FLOP/s for a precision (fp16/bf16 share tensor-core peak)."""
        p = (self.peak_tflops.get(precision) or self.peak_tflops.get("bf16") or self.peak_tflops.get("fp16")
             or self.peak_tflops.get("fp32") or max(self.peak_tflops.values(), default=0.0))
        return float(p) * 1e12

    def achievable_flops(self, precision: str) -> float | None:
        """Measured maximum achievable matmul FLOP/s (MAMF) for a precision, None if unpublished.
        fp16 and bf16 share tensor-core throughput, so either stands in for the other."""
        key = {"fp16": ("fp16", "bf16"), "bf16": ("bf16", "fp16")}.get(precision, (precision,))
        for k in key:
            v = self.achievable_matmul_tflops.get(k)
            if v:
                return float(v) * 1e12
        return None

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_gbps * 1e9

    def check_precision(self, precision: str) -> None:
        """Raise InfeasibleConfig if the device cannot run `precision` (e.g. bf16 on V100, fp8 on A100: FP8 needs
        the device's fp8 tensor-core peak in devices.json; never a silent BF16 fallback)."""
        why = self.unsupported_precisions.get(precision)
        if precision == "fp8" and not why and not self.peak_tflops.get("fp8"):
            raise InfeasibleConfig("precision", f"{self.name} has no FP8 tensor cores (no fp8 peak in devices.json).",
                                   "use bf16, or a Hopper/Blackwell/MI300 device (FP8 training needs FP8 tensor "
                                   "cores: H100/H200/GH200, B200/GB200, Ada L40S/L4, MI300X/MI325X).")
        if precision in SCALED_FORMATS and not why:
            what = SCALED_FORMATS[precision]
            if precision not in self.scaled_formats:
                others = [p for p in ("fp8", "bf16") if p == "bf16" or self.peak_tflops.get("fp8")]
                raise InfeasibleConfig("precision", f"{self.name} cannot run {precision} ({what}): no such "
                                                    "tensor-core format on this GPU (scaled_formats in devices.json).",
                                       f"use {' or '.join(others)}, or a GPU that runs {precision}: "
                                       f"{', '.join(devices_with_format(precision)) or 'none in the catalog'}.")
            need = ("fp8", "fp4") if precision == "nvfp4" else ("fp8",)
            missing = [k for k in need if not self.peak_tflops.get(k)]
            if missing:
                raise InfeasibleConfig("precision", f"{self.name} lists {precision} but has no "
                                                    f"{'/'.join(missing)} peak in devices.json.",
                                       f"add peak_tflops.{missing[0]} (dense TFLOP/s, from the datasheet).")
        if why:
            raise InfeasibleConfig("precision", f"{self.name} does not support {precision}: {why}",
                                   "pick a precision the device supports (see devices.json) or another platform.")

    def check_op(self, op: str) -> None:
        """Raise InfeasibleConfig if the device cannot run the kernel of `op` (e.g. flash attention on V100)."""
        why = self.unsupported_kernels.get(op)
        if why:
            raise InfeasibleConfig("attention_impl" if op == "flash_attn" else "platform",
                                   f"{self.name} cannot run {op}: {why}",
                                   "use --attention unfused." if op == "flash_attn" else "pick another platform.")

    def source_of(self, field_name: str) -> str:
        """The citation of one value (from `value_sources`), or the entry's sources."""
        return self.value_sources.get(field_name) or "; ".join(self.sources)


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
    # Collective algorithms NCCL/RCCL can choose on this platform ("ring", "tree", "nvls").
    collective_algorithms: tuple[str, ...] = ("ring", "tree")
    nvls_min_gpus: int = 0          # NVLS (NVLink SHARP) used from this many GPUs in the node; 0 = never
    # Whether collectives run beside the compute (GPUs: copy engines / a few SMs, so gradient reduction hides
    # behind the backward). False where the collectives need the same cores as the compute (CPU ranks with
    # gloo on every core): then nothing overlaps and the reduction adds to the step.
    overlaps_comm_with_compute: bool = True
    user_defined: bool = False
    notes: tuple[str, ...] = ()
    calibrated_from: str | None = None   # a user platform calibrated on its own runs: the platform it started from
    # platform id whose regressors of measured published kernel tables (the generic `gemm` grid, flash-attention
    # forward) time this platform's tensor-core GEMMs and attention; every other operator stays with `op_models`
    kernel_models: str | None = None

    def nodes_for(self, ranks: int) -> int:
        return max(1, -(-ranks // self.gpus_per_node))

    @property
    def max_ranks(self) -> int | None:
        """The most ranks a layout may have here, None for no limit. A platform declares what links its
        ranks: without an inter-node link (kind 'none' or no bandwidth) it is one node, so at most
        `gpus_per_node` ranks; a node without an intra-node link (kind 'none' or no bandwidth, e.g.
        cpu-2t: one process, no collectives) runs one rank."""
        def absent(link: LinkSpec) -> bool:
            return (link.kind or "").lower() == "none" or not link.bandwidth_gbps > 0
        if not absent(self.inter_node):
            return None
        return 1 if self.gpus_per_node <= 1 or absent(self.intra_node) else self.gpus_per_node

    def ranks_problem(self, ranks: int) -> str | None:
        """Why this platform cannot run `ranks` ranks, or None when it can."""
        cap = self.max_ranks
        if cap is None or ranks <= cap:
            return None
        if cap == 1:
            return (f"{self.platform_id} has no link between its ranks (one process, no collectives), so it cannot "
                    f"run {ranks:,} ranks (num_gpus).")
        return (f"{self.platform_id} is a single node of {cap} ranks with no link to other nodes, so it cannot run "
                f"{ranks:,} ranks (num_gpus).")

    @property
    def has_nvls(self) -> bool:
        return "nvls" in self.collective_algorithms and self.nvls_min_gpus > 0


# --------------------------------------------------------------------------- validation helpers
def _where(origin: str, entry: str, fld: str) -> str:
    return f"{origin}:{entry}.{fld}" if origin else f"{entry}.{fld}"


def _number(raw: dict[str, Any], key: str, origin: str, entry: str, *, required: bool = True,
            default: float | None = None, minimum: float = 0.0, strict: bool = False, integer: bool = False):
    v = raw.get(key)
    if v is None:
        if required and default is None:
            raise InfeasibleConfig(_where(origin, entry, key), "is missing.", f"add '{key}' to the entry.")
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise InfeasibleConfig(_where(origin, entry, key), f"must be a number, got {v!r}.") from None
    if not math.isfinite(float(v)):
        raise InfeasibleConfig(_where(origin, entry, key), f"must be finite, got {v!r}.")
    if (strict and v <= minimum) or (not strict and v < minimum):
        raise InfeasibleConfig(_where(origin, entry, key),
                               f"must be {'>' if strict else '>='} {minimum:g}, got {v!r}.")
    if integer:
        if float(v) != int(v):
            raise InfeasibleConfig(_where(origin, entry, key), f"must be an integer, got {v!r}.")
        return int(v)
    return float(v)


def _device_from(device_id: str, raw: dict[str, Any], origin: str = "") -> DeviceSpec:
    if not isinstance(raw, dict):
        raise InfeasibleConfig(_where(origin, device_id, "device"), f"must be a mapping, got {type(raw).__name__}.")
    peaks = raw.get("peak_tflops")
    if not isinstance(peaks, dict) or not peaks:
        raise InfeasibleConfig(_where(origin, device_id, "peak_tflops"), "is missing or empty.",
                               "give dense peaks per precision, e.g. {bf16: 989, fp16: 989, fp32: 67}.")
    clean_peaks: dict[str, float] = {}
    for k, v in peaks.items():
        if v is None:
            continue
        clean_peaks[str(k)] = _number(peaks, k, origin, f"{device_id}.peak_tflops", strict=True)
    if not clean_peaks:
        raise InfeasibleConfig(_where(origin, device_id, "peak_tflops"), "needs at least one positive peak.",
                               "add the dense peak in TFLOP/s per precision (bf16/fp16 tensor-core peak for GPUs).")
    ach = raw.get("achievable_matmul_tflops") or {}
    if not isinstance(ach, dict):
        raise InfeasibleConfig(_where(origin, device_id, "achievable_matmul_tflops"), "must be a mapping.")
    ach_clean = {}
    for k, v in ach.items():
        if v is None:
            continue
        val = _number(ach, k, origin, f"{device_id}.achievable_matmul_tflops", strict=True)
        peak = clean_peaks.get(k) or clean_peaks.get("bf16") or clean_peaks.get("fp16")
        if peak and val > peak * 1.001:
            raise InfeasibleConfig(_where(origin, device_id, f"achievable_matmul_tflops.{k}"),
                                   f"{val:g} TFLOP/s exceeds the peak {peak:g}.", "check the units (dense TFLOP/s).")
        ach_clean[str(k)] = val
    name = raw.get("name") or device_id
    return DeviceSpec(
        device_id=device_id, name=str(name), vendor=str(raw.get("vendor", "")),
        peak_tflops=clean_peaks,
        hbm_gib=_number(raw, "hbm_gib", origin, device_id, strict=True),
        hbm_bandwidth_gbps=_number(raw, "hbm_bandwidth_gbps", origin, device_id, strict=True),
        sm_count=_number(raw, "sm_count", origin, device_id, strict=True, integer=True),
        l2_mib=_number(raw, "l2_mib", origin, device_id, required=False, default=0.0),
        nvlink_bandwidth_gbps=_number(raw, "nvlink_bandwidth_gbps", origin, device_id, required=False, default=0.0),
        achievable_matmul_tflops=ach_clean,
        sources=tuple(raw.get("sources", ())),
        generation=str(raw.get("generation", "")), form_factor=str(raw.get("form_factor", "")),
        tdp_w=_number(raw, "tdp_w", origin, device_id, required=False, default=0.0),
        pcie_bandwidth_gbps=_number(raw, "pcie_bandwidth_gbps", origin, device_id, required=False, default=0.0),
        host_link_gbps=_number(raw, "host_link_gbps", origin, device_id, required=False, default=0.0),
        transfer_source=raw.get("transfer_source"),
        unsupported_precisions=dict(raw.get("unsupported_precisions") or {}),
        value_sources={str(k): str(v) for k, v in (raw.get("value_sources") or {}).items()},
        notes=tuple(raw.get("notes", ())),
        kernel_utilization={str(k): _number(raw.get("kernel_utilization") or {}, k, origin,
                                            f"{device_id}.kernel_utilization", strict=True)
                            for k in (raw.get("kernel_utilization") or {})},
        unsupported_kernels={str(k): str(v) for k, v in (raw.get("unsupported_kernels") or {}).items()},
        scaled_formats=_scaled_formats(raw.get("scaled_formats"), origin, device_id),
    )


# precision -> what it is; the kinds a device's `scaled_formats` may give each (predictor.step.fp8 FORMATS)
SCALED_FORMATS = {"mxfp8": "MXFP8 / blockwise FP8 GEMMs", "nvfp4": "NVFP4 GEMMs"}
SCALED_FORMAT_KINDS = {"mxfp8": ("mx", "blockwise"), "nvfp4": ("mx",)}


def _scaled_formats(raw: Any, origin: str, device_id: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InfeasibleConfig(_where(origin, device_id, "scaled_formats"), "must be a mapping precision -> kind.",
                               'e.g. {"mxfp8": "mx", "nvfp4": "mx"} (Blackwell) or {"mxfp8": "blockwise"} (Hopper).')
    out = {}
    for k, v in raw.items():
        kinds = SCALED_FORMAT_KINDS.get(str(k))
        if kinds is None or str(v) not in kinds:
            raise InfeasibleConfig(_where(origin, device_id, f"scaled_formats.{k}"), f"{k}: {v!r} is not known.",
                                   "use " + "; ".join(f"{p}: {' or '.join(ks)}" for p, ks in
                                                      SCALED_FORMAT_KINDS.items()) + ".")
        out[str(k)] = str(v)
    return out


def devices_with_format(precision: str) -> list[str]:
    """Catalog device ids that run `precision` (mxfp8 / nvfp4)."""
    return [k for k, d in load_devices().items() if precision in d.scaled_formats]


def supported_precisions(device: DeviceSpec) -> list[str]:
    """The training precisions (predictor.model.specs.PRECISIONS) `device` can run, in that order."""
    out = []
    for p in PRECISIONS:
        try:
            device.check_precision(p)
        except InfeasibleConfig:
            continue
        out.append(p)
    return out


def _link_from(raw: dict[str, Any] | None, origin: str = "", entry: str = "", which: str = "") -> LinkSpec:
    raw = raw or {}
    if not isinstance(raw, dict):
        raise InfeasibleConfig(_where(origin, entry, which), "must be a mapping with kind, bandwidth_gbps, latency_us.")
    return LinkSpec(kind=str(raw.get("kind", "")),
                    bandwidth_gbps=_number(raw, "bandwidth_gbps", origin, f"{entry}.{which}", required=False,
                                           default=0.0),
                    latency_us=_number(raw, "latency_us", origin, f"{entry}.{which}", required=False, default=0.0))


def _read_catalog_file(path: Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InfeasibleConfig("clusters", f"cannot read '{path}': {e.strerror or e}.",
                               "pass an existing JSON or YAML file.") from None
    try:
        if Path(path).suffix in (".yaml", ".yml"):
            import yaml
            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001 - parse errors of either format
        fmt = "YAML" if Path(path).suffix in (".yaml", ".yml") else "JSON"
        raise InfeasibleConfig("clusters", f"'{path}' is not valid {fmt}: {e}.",
                               "fix the syntax (see docs/ or predictor/catalog/clusters.json for the shape).") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InfeasibleConfig("clusters", f"'{path}' must hold a mapping of cluster id -> entry.")
    return {k: v for k, v in data.items() if not str(k).startswith("_")}


@lru_cache(maxsize=8)
def load_devices() -> dict[str, DeviceSpec]:
    raw = _read_catalog_file(CATALOG_DIR / "devices.json")
    return {k: _device_from(k, v, "devices.json") for k, v in raw.items()}


def _algorithms(raw: dict[str, Any], device: DeviceSpec, gpus_per_node: int, intra_kind: str,
                origin: str, pid: str) -> tuple[tuple[str, ...], int]:
    """Collective algorithms available and the NVLS threshold, from the entry or the hardware."""
    spec = raw.get("collective_algorithms")
    nvls_min = 0
    if spec is None:
        algs = ["ring", "tree"]
        if intra_kind == "nvswitch" and device.generation in NVLS_GENERATIONS and gpus_per_node >= 4:
            algs.append("nvls")
            nvls_min = 5
        return tuple(algs), nvls_min
    if isinstance(spec, dict):
        algs = [str(a) for a in spec.get("available", ["ring", "tree"])]
        nv = spec.get("nvls_min_gpus")
        nvls_min = int(nv) if nv is not None else (5 if "nvls" in algs else 0)
    elif isinstance(spec, (list, tuple)):
        algs = [str(a) for a in spec]
        nvls_min = 5 if "nvls" in algs else 0
    else:
        raise InfeasibleConfig(_where(origin, pid, "collective_algorithms"), "must be a list or a mapping.")
    for a in algs:
        if a not in ("ring", "tree", "nvls"):
            raise InfeasibleConfig(_where(origin, pid, "collective_algorithms"), f"unknown algorithm '{a}'.",
                                   "use ring, tree and/or nvls.")
    if "nvls" in algs and intra_kind not in ("nvswitch", ""):
        raise InfeasibleConfig(_where(origin, pid, "collective_algorithms"),
                               f"NVLS (NVLink SHARP) needs an NVSwitch node, but intra_node.kind is '{intra_kind}'.",
                               "remove nvls or set intra_node.kind to nvswitch.")
    return tuple(algs), nvls_min


def _platform_from(pid: str, raw: dict[str, Any], devices: dict[str, DeviceSpec], origin: str = "",
                   user: bool = False) -> Platform:
    if not isinstance(raw, dict):
        raise InfeasibleConfig(_where(origin, pid, "entry"), f"must be a mapping, got {type(raw).__name__}.")
    dev_ref = raw.get("device")
    if dev_ref is None:
        raise InfeasibleConfig(_where(origin, pid, "device"), "is missing.",
                               f"name a device id ({', '.join(sorted(devices))}) or give an inline device mapping.")
    if isinstance(dev_ref, dict):
        device = _device_from(str(dev_ref.get("id") or f"{pid}-device"), dev_ref, origin)
    else:
        if dev_ref not in devices:
            raise InfeasibleConfig(_where(origin, pid, "device"), f"platform '{pid}' names unknown device '{dev_ref}'.",
                                   f"use one of {', '.join(sorted(devices))}.")
        device = devices[dev_ref]
    gpn = _number(raw, "gpus_per_node", origin, pid, strict=True, integer=True)
    if gpn > MAX_GPUS_PER_NODE:
        raise InfeasibleConfig(_where(origin, pid, "gpus_per_node"), f"{gpn:,} is above the upper bound "
                               f"{MAX_GPUS_PER_NODE:,} (the largest NVLink domains hold 72-576 GPUs).",
                               "give the GPUs of one node (one NVLink / xGMI domain).")
    intra = _link_from(raw.get("intra_node"), origin, pid, "intra_node")
    inter = _link_from(raw.get("inter_node"), origin, pid, "inter_node")
    if gpn > 1 and intra.bandwidth_gbps <= 0:
        raise InfeasibleConfig(_where(origin, pid, "intra_node.bandwidth_gbps"),
                               f"{gpn} GPUs per node need an intra-node link bandwidth > 0.",
                               "give the per-GPU, one-direction GB/s of the node's GPU fabric (NVLink, xGMI or PCIe).")
    if inter.bandwidth_gbps <= 0 and user and raw.get("calibrated_from") is None:
        raise InfeasibleConfig(_where(origin, pid, "inter_node.bandwidth_gbps"),
                               "is missing or not positive.",
                               "give the per-GPU, one-direction network GB/s (400 Gb/s = 50).")
    for which, link in (("intra_node", intra), ("inter_node", inter)):
        if link.bandwidth_gbps > 5000:
            raise InfeasibleConfig(_where(origin, pid, f"{which}.bandwidth_gbps"),
                                   f"{link.bandwidth_gbps:g} GB/s per GPU is implausible.",
                                   "give GB/s (bytes), per GPU and one direction; e.g. NVLink 4 = 450, "
                                   "400 Gb/s NIC = 50.")
    algs, nvls_min = _algorithms(raw, device, gpn, intra.kind, origin, pid)
    op_models = raw.get("op_models", device.transfer_source if user else None)
    overlap = raw.get("overlaps_comm_with_compute", True)
    if not isinstance(overlap, bool):
        raise InfeasibleConfig(_where(origin, pid, "overlaps_comm_with_compute"),
                               f"must be true or false, got {overlap!r}.",
                               "write true (GPUs: collectives hide behind compute) or false (they share the "
                               "compute's cores).")
    base = raw.get("calibrated_from")
    if base is not None:
        if not user:
            raise InfeasibleConfig(_where(origin, pid, "calibrated_from"), "only a user platform is calibrated on "
                                   "its own runs.", "remove the field from the catalog entry.")
        base = paths.check_id(str(base), _where(origin, pid, "calibrated_from"))
    return Platform(
        calibrated_from=base,
        platform_id=pid, description=str(raw.get("description", "")), device=device,
        gpus_per_node=gpn, intra_node=intra, inter_node=inter,
        op_models=op_models, collective_models=raw.get("collective_models"),
        collective_calibration=raw.get("collective_calibration"), sources=tuple(raw.get("sources", ())),
        collective_algorithms=algs, nvls_min_gpus=nvls_min, overlaps_comm_with_compute=overlap, user_defined=user,
        notes=tuple(raw.get("notes", ())), kernel_models=raw.get("kernel_models"),
    )


def _split_user_file(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(devices, clusters) of a user file: either {devices: {...}, clusters: {...}} or a flat
    mapping of cluster id -> entry."""
    if "clusters" in data or "devices" in data:
        devs = data.get("devices") or {}
        cl = data.get("clusters") or {}
        if not isinstance(devs, dict) or not isinstance(cl, dict):
            raise InfeasibleConfig("clusters", "'devices' and 'clusters' must be mappings of id -> entry.")
        return devs, cl
    return {}, data


def _source_keys(path: Path) -> dict[str, str]:
    try:
        return dict(json.loads(Path(path).read_text()).get("_sources", {}))
    except (OSError, ValueError, AttributeError):
        return {}


def _resolve_sources(p: Platform, cites: dict[str, str]) -> Platform:
    """Expand short source keys (those of the catalog's `_sources`) into full citations."""
    if not cites or not any(s in cites for s in p.sources):
        return p
    from dataclasses import replace
    return replace(p, sources=tuple(cites.get(s, s) for s in p.sources))


def shipped_cluster_entries() -> dict[str, Any]:
    """The catalog's cluster entries (the shipped platforms), id -> raw entry."""
    return _read_catalog_file(CATALOG_DIR / "clusters.json")


def is_shipped(platform_id: str) -> bool:
    """Whether `platform_id` names a platform the project ships (the catalog's clusters, or a generic id)."""
    return str(platform_id).startswith(GENERIC_PREFIX) or str(platform_id) in shipped_cluster_entries()


@lru_cache(maxsize=8)
def load_platforms(extra_file: str | None = None) -> dict[str, Platform]:
    devices = dict(load_devices())
    raw = shipped_cluster_entries()
    cites = _source_keys(CATALOG_DIR / "clusters.json")
    out = {pid: _resolve_sources(_platform_from(pid, r, devices, "clusters.json"), cites) for pid, r in raw.items()}
    if extra_file:
        origin = Path(extra_file).name
        udevs, ucl = _split_user_file(_read_catalog_file(Path(extra_file)))
        for did, d in udevs.items():
            devices[str(did)] = _device_from(str(did), d, origin)
        for pid, r in ucl.items():
            out[str(pid)] = _platform_from(str(pid), r, devices, origin, user=True)
    return out


def make_cluster(device_id: str, gpus_per_node: int, intra_gbps: float | None = None,
                 inter_gbps: float | None = None, *, platform_id: str | None = None,
                 intra_kind: str | None = None, inter_kind: str = "infiniband",
                 intra_latency_us: float | None = None, inter_latency_us: float = DEFAULT_INTER_LATENCY_US,
                 op_models: str | None = None, collective_algorithms: tuple[str, ...] | None = None,
                 nvls_min_gpus: int | None = None, description: str = "") -> Platform:
    """A generic cluster: `gpus_per_node` GPUs of `device_id` per node, `intra_gbps` (per GPU, one
    direction; default the device's NVLink/xGMI bandwidth, else PCIe) inside a node and `inter_gbps`
    (per GPU, one direction; default 50 GB/s = one 400 Gb/s NIC per GPU) between nodes. Operator models
    transfer from the device's `transfer_source` unless `op_models` says otherwise."""
    devices = load_devices()
    if device_id not in devices:
        raise InfeasibleConfig("device", f"unknown device '{device_id}'.", f"use one of {', '.join(sorted(devices))}.")
    dev = devices[device_id]
    if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise InfeasibleConfig("gpus_per_node", f"must be a positive integer, got {gpus_per_node!r}.")
    if gpus_per_node > MAX_GPUS_PER_NODE:
        raise InfeasibleConfig("gpus_per_node", f"{gpus_per_node:,} is above the upper bound {MAX_GPUS_PER_NODE:,} "
                                                "(the largest NVLink domains hold 72-576 GPUs).",
                               "give the GPUs of one node (one NVLink / xGMI domain).")
    if intra_kind is None:
        if gpus_per_node == 1:
            intra_kind = "none"
        elif dev.nvlink_bandwidth_gbps > 0 and (intra_gbps is None or intra_gbps > (dev.pcie_bandwidth_gbps or 64)):
            intra_kind = "xgmi" if dev.vendor == "amd" else ("nvswitch" if gpus_per_node > 2 else "nvlink")
        else:
            intra_kind = "pcie"
    if intra_gbps is None:
        if intra_kind == "none":
            intra_gbps = 0.0
        elif intra_kind == "pcie":
            intra_gbps = dev.pcie_bandwidth_gbps or 32.0
        else:
            intra_gbps = dev.nvlink_bandwidth_gbps or dev.pcie_bandwidth_gbps or 32.0
    if inter_gbps is None:
        inter_gbps = DEFAULT_INTER_GBPS
    pid = platform_id or f"{GENERIC_PREFIX}{device_id}:{gpus_per_node}:{intra_gbps:g}:{inter_gbps:g}"
    raw: dict[str, Any] = {
        "description": description or (f"generic: {gpus_per_node}x {dev.name} per node, {intra_kind} "
                                        f"{intra_gbps:g} GB/s per GPU inside a node, {inter_kind} "
                                        f"{inter_gbps:g} GB/s per GPU between nodes"),
        "device": device_id, "gpus_per_node": gpus_per_node,
        "intra_node": {"kind": intra_kind, "bandwidth_gbps": intra_gbps,
                       "latency_us": intra_latency_us if intra_latency_us is not None
                       else DEFAULT_INTRA_LATENCY_US.get(intra_kind, 8.0)},
        "inter_node": {"kind": inter_kind, "bandwidth_gbps": inter_gbps, "latency_us": inter_latency_us},
        "op_models": op_models or dev.transfer_source, "collective_models": None,
        "sources": [f"generic cluster from make_cluster(); device facts: {'; '.join(dev.sources)}"],
    }
    if collective_algorithms is not None:
        raw["collective_algorithms"] = {"available": list(collective_algorithms),
                                        **({"nvls_min_gpus": nvls_min_gpus} if nvls_min_gpus is not None else {})}
    return _platform_from(pid, raw, {device_id: dev}, "", user=True)


def cluster_entry(p: Platform, sources: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The clusters-file entry of a Platform: what `load_platforms(extra_file=...)` reads back as the same
    platform. `sources`: what the entry rests on (default: the platform's own sources)."""
    entry: dict[str, Any] = {
        "description": p.description, "device": p.device.device_id, "gpus_per_node": p.gpus_per_node,
        "intra_node": asdict(p.intra_node), "inter_node": asdict(p.inter_node),
        "op_models": p.op_models, "collective_models": p.collective_models,
        "sources": list(p.sources if sources is None else sources)}
    if p.kernel_models:
        entry["kernel_models"] = p.kernel_models
    if p.collective_algorithms:
        entry["collective_algorithms"] = {"available": list(p.collective_algorithms),
                                          **({"nvls_min_gpus": p.nvls_min_gpus} if p.nvls_min_gpus else {})}
    if not p.overlaps_comm_with_compute:
        entry["overlaps_comm_with_compute"] = False
    if p.collective_calibration:
        entry["collective_calibration"] = p.collective_calibration
    if p.calibrated_from:
        entry["calibrated_from"] = p.calibrated_from
    return entry


def save_cluster(path: str | Path, p: Platform, sources: tuple[str, ...] | None = None) -> Path:
    """Add or replace one cluster in a user clusters file (JSON; created when missing), keeping the file's
    shape (a flat mapping, or `clusters` / `devices` sections), and drop the cached catalog so the next
    `load_platforms(path)` sees it."""
    from predictor.paths import write_json_atomic
    path = Path(path)
    data: dict[str, Any] = {}
    if path.is_file():
        text = path.read_text()
        try:
            data = json.loads(text) if text.strip() else {}
        except ValueError as e:
            raise InfeasibleConfig("clusters", f"'{path}' is not valid JSON: {e}.",
                                   "fix or remove the file, then save again.") from None
        if not isinstance(data, dict):
            raise InfeasibleConfig("clusters", f"'{path}' must hold a mapping of cluster id -> entry.")
    target = data.setdefault("clusters", {}) if ("clusters" in data or "devices" in data) else data
    target[p.platform_id] = cluster_entry(p, sources)
    write_json_atomic(path, data)
    load_platforms.cache_clear()
    return path


def parse_generic_id(platform_id: str) -> Platform:
    """`generic:<device>:<gpus_per_node>[:<intra GB/s>[:<inter GB/s>]]` -> make_cluster(...)."""
    parts = platform_id[len(GENERIC_PREFIX):].split(":")
    if len(parts) < 2 or not parts[0]:
        raise InfeasibleConfig("platform", f"'{platform_id}' is not a generic platform id.",
                               "use generic:<device>:<gpus_per_node>[:<intra GB/s>[:<inter GB/s>]], "
                               "e.g. generic:h100-sxm5-80gb:8:450:50.")
    try:
        gpn = int(parts[1])
        intra = float(parts[2]) if len(parts) > 2 and parts[2] else None
        inter = float(parts[3]) if len(parts) > 3 and parts[3] else None
    except ValueError:
        raise InfeasibleConfig("platform", f"'{platform_id}': GPUs per node and bandwidths must be numbers.",
                               "e.g. generic:h100-sxm5-80gb:8:450:50.") from None
    return make_cluster(parts[0], gpn, intra, inter, platform_id=platform_id)


def get_platform(platform_id: str, extra_file: str | None = None) -> Platform:
    if isinstance(platform_id, str) and platform_id.startswith(GENERIC_PREFIX):
        return parse_generic_id(platform_id)
    platforms = load_platforms(extra_file)
    if platform_id not in platforms:
        raise InfeasibleConfig("platform", f"unknown platform '{platform_id}'.",
                               f"use one of {', '.join(sorted(platforms))} (see `python -m predictor platforms`), "
                               "generic:<device>:<gpus_per_node>[:<intra GB/s>[:<inter GB/s>]], or define it in a "
                               "clusters file (--clusters FILE).")
    return platforms[platform_id]

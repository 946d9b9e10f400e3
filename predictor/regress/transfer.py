"""Operator times on a GPU with no samples, from the regressors of a sampled GPU plus both specs.

The sampled ("source") regressor predicts the operator on the SOURCE device, where its features are
in the range it was trained on; that time is then rescaled by the ratio of an analytic kernel-time
model evaluated on both devices:

    t_target(shape) = t_source(shape) * T(shape, target) / T(shape, source)

    T(shape, D) = launch + ((F / (C_D * w_D))^p + (B / BW_D)^p)^(1/p)

i.e. the efficiency the source learned as a function of the shape (relative to T) is kept, and what
moves with the hardware is the analytic part:

  C_D   the achievable compute roof of the op's kernel class on D:
          tensor-core GEMMs (linear layers, batched attention GEMMs): the measured maximum achievable
          matmul FLOP/s (MAMF, devices.json); without a published MAMF, the peak times the source's
          MAMF/peak ratio;
          flash attention: peak x the kernel's published utilisation on that GPU generation
          (`kernel_utilization.flash_attn` in devices.json: FlashAttention-2 reaches 50-73 % of peak on
          A100 but only 35 % on H100), else MAMF as for GEMMs;
          other ops: the dense peak (they are memory-bound);
  w_D   tile-wave quantisation with D's SM count: waves / ceil(waves), 128x128 output tiles (GEMMs) or
        one CTA per (batch, head, 128 rows) (flash attention);
  BW_D  HBM bandwidth (the same achievable fraction assumed on both devices, so it cancels);
  p     how compute and memory time combine: 2 (between the additive p=1 and the roofline max p=inf;
        kernels with arithmetic intensity near the ridge overlap the two only partly).

`baseline` (the regressor applied directly to the target spec, features out of the trained range) is
kept for comparison: `python -m tests.benchmarks.transfer_accuracy` reports both, per operator and in
both directions (A100 -> GH200 and GH200 -> A100, from the paper's samples of both GPUs), and writes
the measured error to `models_store/transfer_validation.json`, which the Predictor uses as the error
band of transferred parts.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from predictor.paths import ArtifactError, check_error_record, load_checked
from predictor.regress import features as F

if TYPE_CHECKING:
    import pandas as pd

from predictor.hardware.platforms import DeviceSpec

log = logging.getLogger(__name__)

LAUNCH_S = F.LAUNCH_LATENCY_S
TILE = 128.0
FLASH_OPS = ("flash_attn",)
VALIDATION_FILE = "transfer_validation.json"


@dataclass(frozen=True)
class TransferConfig:
    """Switches of the analytic ratio (the benchmark reports each step's contribution)."""
    method: str = "ratio"          # "ratio" (source device, rescaled) or "baseline" (target spec into the regressor)
    achievable_compute: bool = True   # MAMF / kernel utilisation instead of datasheet peaks
    kernel_utilization: bool = True   # flash attention: published per-generation utilisation
    waves: bool = True                # wave quantisation with each device's SM count
    combine_p: float = 2.0            # compute/memory combination (np.inf = roofline max)

    def label(self) -> str:
        if self.method == "baseline":
            return "baseline"
        parts = ["ratio"]
        parts.append("mamf" if self.achievable_compute else "peak")
        if self.kernel_utilization:
            parts.append("kernel-util")
        if self.waves:
            parts.append("waves")
        parts.append("max" if not np.isfinite(self.combine_p) else f"p{self.combine_p:g}")
        return "+".join(parts)


DEFAULT_CONFIG = TransferConfig()


def compute_roof(op: str, device: DeviceSpec, precision: str, source: DeviceSpec | None = None,
                 cfg: TransferConfig = DEFAULT_CONFIG) -> float:
    """Achievable FLOP/s of `op`'s kernel class on `device` (see the module docstring)."""
    peak = device.peak_flops(precision)
    if not cfg.achievable_compute:
        return peak
    if op in FLASH_OPS and cfg.kernel_utilization:
        u = device_kernel_utilization(device, "flash_attn")
        if u is None and source is not None:
            u = device_kernel_utilization(source, "flash_attn")
        if u is not None:
            return peak * u
    if op in F.COMPUTE_BOUND_OPS:
        ach = device.achievable_flops(precision)
        if ach:
            return ach
        if source is not None:
            s_ach = source.achievable_flops(precision)
            if s_ach:
                return peak * s_ach / source.peak_flops(precision)
        return peak
    return peak


def device_kernel_utilization(device: DeviceSpec, kernel: str) -> float | None:
    v = getattr(device, "kernel_utilization", {}) or {}
    u = v.get(kernel)
    return float(u) if u else None


def _wave_eff(tiles: np.ndarray, sm: int) -> np.ndarray:
    sm = max(int(sm or 1), 1)
    w = np.maximum(tiles, 1.0) / sm
    return w / np.maximum(np.ceil(w), 1.0)


def wave_efficiency(op: str, a: dict[str, np.ndarray], device: DeviceSpec) -> np.ndarray:
    n = len(next(iter(a.values()))) if a else 1
    try:  # per-rank dimensions as features.py derives them (private helper: fall back to no correction)
        d = F._dims(a)
    except AttributeError:
        return np.ones(n)
    if op in F.TENSOR_CORE_GEMM_OPS:
        M, N, _K, B = F.gemm_mnk(op, d)
        return _wave_eff(np.ceil(M / TILE) * np.ceil(N / TILE) * B, device.sm_count)
    if op in FLASH_OPS:
        return _wave_eff(d["b"] * d["Hr"] * np.ceil(d["l"] / TILE), device.sm_count)
    return np.ones(n)


def kernel_time_s(op: str, pass_: str, shapes, device: DeviceSpec, precision: str = "fp16",
                  source: DeviceSpec | None = None, cfg: TransferConfig = DEFAULT_CONFIG) -> np.ndarray:
    """The analytic kernel-time model T(shape, device) of the module docstring, in seconds."""
    a = F.shape_arrays(shapes)
    flops, byts = F.op_work(op, shapes, precision, pass_)
    C = compute_roof(op, device, precision, source, cfg)
    w = wave_efficiency(op, a, device) if cfg.waves else 1.0
    tc = flops / (C * w)
    tm = byts / device.hbm_bytes_per_s
    p = cfg.combine_p
    if not np.isfinite(p):
        t = np.maximum(tc, tm)
    else:
        m = np.maximum(np.maximum(tc, tm), 1e-30)
        t = m * ((tc / m) ** p + (tm / m) ** p) ** (1.0 / p)
    return t + LAUNCH_S


def transfer_ratio(op: str, pass_: str, shapes, source: DeviceSpec, target: DeviceSpec, precision: str = "fp16",
                   cfg: TransferConfig = DEFAULT_CONFIG) -> np.ndarray:
    """T(shape, target) / T(shape, source)."""
    return (kernel_time_s(op, pass_, shapes, target, precision, source, cfg)
            / kernel_time_s(op, pass_, shapes, source, precision, target, cfg))


def predict_transferred(bank, op: str, pass_: str, shapes, source: DeviceSpec, target: DeviceSpec,
                        precision: str = "fp16", cfg: TransferConfig = DEFAULT_CONFIG) -> np.ndarray:
    """Seconds of `op` on `target` from `bank` (a ModelBank trained on `source`)."""
    if cfg.method == "baseline":
        return bank.predict_op(op, pass_, shapes, target, precision)
    t_src = bank.predict_op(op, pass_, shapes, source, precision)
    return t_src * transfer_ratio(op, pass_, shapes, source, target, precision, cfg)


# --------------------------------------------------------------------------- evaluation
PHYSICAL_BOUND = {True: 0.5, False: 0.25}  # as regressors.py: a row faster than this x roofline is not a measurement


def plausible(op: str, pass_: str, shapes, durations: np.ndarray, device: DeviceSpec, precision: str = "fp16"
              ) -> np.ndarray:
    """Rows that could be a measurement of the op's full work (the regressors' physical bound)."""
    roof = F.roofline_s(op, pass_, shapes, device, precision)
    compute_bound = op in F.COMPUTE_BOUND_OPS
    return np.asarray(durations) >= PHYSICAL_BOUND[compute_bound] * roof


def evaluate_transfer(bank, source: DeviceSpec, target: DeviceSpec, target_samples: pd.DataFrame,
                      configs: list[TransferConfig], precision: str = "fp16", max_rows_per_op: int | None = None,
                      seed: int = 0) -> pd.DataFrame:
    """One row per (op, pass, config): target samples predicted from the source bank. Physically
    impossible target rows (faster than the regressors' bound) are counted and left out."""
    import pandas as pd
    rows = []
    for (op, ps), g in target_samples.groupby(["op", "pass"], sort=True):
        if not bank.has_op(op, ps):
            continue
        g = g[g["duration_s"] > 0]
        if max_rows_per_op and len(g) > max_rows_per_op:
            g = g.sample(max_rows_per_op, random_state=seed)
        y = g["duration_s"].to_numpy(float)
        ok = plausible(op, ps, g, y, target, precision)
        for cfg in configs:
            pred = predict_transferred(bank, op, ps, g, source, target, precision, cfg)
            ape = np.abs(pred[ok] - y[ok]) / y[ok]
            sgn = np.log(pred[ok] / y[ok])
            rows.append({"op": op, "pass": ps, "config": cfg.label(), "n": int(ok.sum()), "excluded": int((~ok).sum()),
                         "median_ape": float(np.median(ape)) if len(ape) else np.nan,
                         "mape": float(np.mean(ape)) if len(ape) else np.nan,
                         "p90_ape": float(np.percentile(ape, 90)) if len(ape) else np.nan,
                         "median_log_ratio": float(np.median(sgn)) if len(sgn) else np.nan,
                         "target_seconds": float(y[ok].sum())})
    return pd.DataFrame(rows)


def summarize(res: pd.DataFrame) -> pd.DataFrame:
    """Per config: median over ops of the per-op median APE, row-weighted median, time-weighted MAPE."""
    import pandas as pd
    out = []
    for cfg, g in res.groupby("config", sort=False):
        g = g.dropna(subset=["median_ape"])
        w = g["target_seconds"] / g["target_seconds"].sum()
        out.append({"config": cfg, "ops": len(g), "rows": int(g["n"].sum()),
                    "median_of_op_medians": float(np.median(g["median_ape"])),
                    "mean_of_op_medians": float(np.mean(g["median_ape"])),
                    "time_weighted_mape": float((w * g["mape"]).sum())})
    return pd.DataFrame(out)


# --------------------------------------------------------------------------- validation record
def check_validation_record(d: Any, path: str | Path = VALIDATION_FILE) -> dict[str, Any]:
    """`d` (a parsed transfer_validation.json) if usable: every error / count finite and >= 0 (nulls
    allowed: an op without a measured error), `per_op` an object of objects. ArtifactError naming
    `path` and the field otherwise."""
    check_error_record(path, d)
    per_op = d.get("per_op", {})
    if not isinstance(per_op, dict) or not all(isinstance(v, dict) for v in per_op.values()):
        raise ArtifactError(path, "per_op", "must be an object of {source platform: error} objects")
    return d


def load_validation_checked(models_dir: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """(record, None) from models_store/transfer_validation.json; (None, None) without it; (None,
    warning naming the file and field) when it is unreadable or a value is out of range (transferred
    parts then carry no measured error band)."""
    p = Path(models_dir) / VALIDATION_FILE
    return load_checked(p, lambda d: check_validation_record(d, p))


def load_validation(models_dir: str | Path) -> dict[str, Any] | None:
    """`load_validation_checked` without the warning (it is logged): None when missing or unusable."""
    rec, warn = load_validation_checked(models_dir)
    if warn:
        log.warning(warn)
    return rec


def transfer_error(validation: dict[str, Any] | None, op: str | None = None, pass_: str | None = None,
                   source_platform: str | None = None) -> float | None:
    """Expected relative error of a transferred op: the measured median APE of that op (mean of the
    two directions, or the one from `source_platform`), else the overall median; None without a record."""
    if not validation:
        return None
    per_op = validation.get("per_op", {})
    key = f"{op}.{pass_}"
    if op is not None and key in per_op:
        e = per_op[key]
        if source_platform and e.get(source_platform) is not None:
            return float(e[source_platform])
        vals = [float(v) for v in e.values() if v is not None]
        if vals:
            return float(np.mean(vals))
    ov = validation.get("overall_median_ape")
    return float(ov) if ov is not None else None


def config_to_dict(cfg: TransferConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["combine_p"] = None if not np.isfinite(cfg.combine_p) else cfg.combine_p
    return d


def with_changes(cfg: TransferConfig, **kw: Any) -> TransferConfig:
    return replace(cfg, **kw)


_VALIDATION_CACHE: dict[str, tuple[float, dict[str, Any] | None]] = {}


def cached_validation(models_dir: str | Path) -> dict[str, Any] | None:
    """`load_validation`, re-read only when the file changes."""
    p = Path(models_dir) / VALIDATION_FILE
    try:
        mtime = p.stat().st_mtime
    except OSError:
        return None
    hit = _VALIDATION_CACHE.get(str(p))
    if hit is None or hit[0] != mtime:
        hit = (mtime, load_validation(models_dir))
        _VALIDATION_CACHE[str(p)] = hit
    return hit[1]


def source_device(platform) -> DeviceSpec | None:
    """The device of the sampled platform whose regressors `platform` borrows (its `op_models`)."""
    from predictor.hardware.platforms import get_platform
    from predictor.model.errors import InfeasibleConfig
    if not platform.op_models:
        return None
    try:
        return get_platform(platform.op_models).device
    except InfeasibleConfig:
        return None


# --------------------------------------------------------------------------- untrustworthy sources
SAMPLED_PLATFORMS = ("vista-gh200", "perlmutter-a100")  # platforms with operator samples of their own
CORRUPT_SOURCE_FRACTION = 0.5


def trustworthy(info: dict[str, Any] | None) -> bool:
    """False when most of the samples a regressor was trained on were physically impossible (faster than
    the roofline bound; e.g. the paper's GH200 flash-attention backward: 82 % of rows), so its
    predictions rest on the few rows of a corrupt file."""
    if not info:
        return True
    if info.get("reliable") is not None:  # the regressors' own flag (regressors.UNRELIABLE_FRACTION)
        return bool(info["reliable"])
    frac = ((info.get("outlier_filter") or {}).get("physical_bound") or {}).get("fraction")
    return frac is None or float(frac) <= CORRUPT_SOURCE_FRACTION


def alternative_source(op: str, pass_: str, target: DeviceSpec, models_dir: str | Path,
                       exclude: tuple[str | None, ...] = ()):
    """(platform id, bank, device) of another sampled platform with a trustworthy model of (op, pass),
    the same GPU generation as `target` first; None if there is none."""
    from predictor.hardware.platforms import get_platform
    from predictor.regress.regressors import load_bank
    cands = []
    for pid in SAMPLED_PLATFORMS:
        if pid in exclude:
            continue
        try:
            dev = get_platform(pid).device
        except Exception:  # noqa: BLE001
            continue
        cands.append((0 if dev.generation == target.generation else 1, pid, dev))
    for _, pid, dev in sorted(cands):
        bank = load_bank(pid, models_dir)
        if bank is not None and bank.has_op(op, pass_) and trustworthy(bank.op_info(op, pass_)):
            return pid, bank, dev
    return None

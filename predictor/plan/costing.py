"""Time and money: a step time -> steps, days, GPU-hours and cost of a training run, plus
throughput in model FLOPs (MFU and TFLOP/s per GPU).

    est = training_estimate(step_time_s=14.6, num_gpus=1024, tokens_per_step=4_194_304,
                            tokens_to_train=15e12, price_per_gpu_hour=2.0)
    est.days, est.gpu_hours, est.cost

Every function takes scalars or numpy arrays (the search passes whole columns).
Model FLOPs follow `predict.model_flops_per_step` (Megatron's convention: forward + backward =
3 x forward, every matmul including attention, no recomputation, causal mask not discounted),
so MFU does not reward recomputation.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}


def parse_count(text: str | float | int | None) -> float | None:
    """'15T' -> 1.5e13, '300B' -> 3e11, '2.5e9' -> 2.5e9; None / '' -> None."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text)
    s = str(text).strip().lower().replace(",", "").replace("_", "")
    if not s:
        return None
    mt = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgtp]?)", s)
    if not mt:
        raise ValueError(f"cannot read a count from {text!r} (e.g. 15T, 300B, 2.5e9)")
    return float(mt.group(1)) * SUFFIX[mt.group(2)]


def training_inputs(tokens: Any, price: Any) -> tuple[float | None, float | None]:
    """(tokens to train, price per GPU-hour) from a flag or a cell ('2T', '300B', 2e12; a price >= 0), None where
    empty; InfeasibleConfig naming `tokens` / `price_per_gpu_hour` and the fix otherwise."""
    import math

    from predictor.model.errors import InfeasibleConfig
    empty = lambda v: v is None or (isinstance(v, float) and math.isnan(v)) or str(v).strip() == ""  # noqa: E731
    t = p = None
    if not empty(tokens):
        try:
            t = parse_count(tokens)
        except ValueError as e:
            raise InfeasibleConfig("tokens", str(e), "write the token budget as e.g. 2T, 300B or 2e12.") from None
        if t is None or not math.isfinite(t) or t <= 0:
            raise InfeasibleConfig("tokens", f"must be a positive number of tokens, got {tokens!r}.",
                                   "write the token budget as e.g. 2T, 300B or 2e12.")
    if not empty(price):
        try:
            p = float(price)
        except (TypeError, ValueError):
            p = math.nan
        if not math.isfinite(p) or p < 0:
            raise InfeasibleConfig("price_per_gpu_hour", f"must be a number >= 0, got {price!r}.",
                                   "give the price of one GPU-hour, e.g. 2.5.")
    return t, p


@dataclass
class TrainingEstimate:
    step_time_s: Any
    num_gpus: Any
    tokens_per_step: Any
    tokens_to_train: float | None
    price_per_gpu_hour: float | None
    steps: Any            # None without tokens_to_train
    seconds: Any
    days: Any
    gpu_hours: Any
    cost: Any             # None without a price
    gpu_hours_per_mtok: Any
    cost_per_mtok: Any

    def scalar(self) -> TrainingEstimate:
        """The same estimate with numpy scalars turned into Python numbers."""
        def conv(v):
            if v is None:
                return None
            a = np.asarray(v)
            return a.item() if a.ndim == 0 else a
        return TrainingEstimate(**{k: conv(v) for k, v in self.__dict__.items()})

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for k, v in self.__dict__.items():
            a = np.asarray(v) if v is not None else None
            out[k] = None if a is None else (a.item() if a.ndim == 0 else a.tolist())
        return out


def training_estimate(step_time_s, num_gpus, tokens_per_step, tokens_to_train: float | None = None,
                      price_per_gpu_hour: float | None = None) -> TrainingEstimate:
    """Steps = ceil(tokens / tokens per step); wall time = steps x step time; GPU-hours = wall
    hours x GPUs; cost = GPU-hours x price. Without `tokens_to_train` only the per-token rates
    (GPU-hours and cost per million tokens) are filled."""
    step = np.asarray(step_time_s, float)
    gpus = np.asarray(num_gpus, float)
    tps = np.asarray(tokens_per_step, float)
    if price_per_gpu_hour is not None and price_per_gpu_hour < 0:
        raise ValueError("price per GPU-hour must be >= 0")
    gph_mtok = step * gpus / 3600.0 / tps * 1e6
    cost_mtok = gph_mtok * price_per_gpu_hour if price_per_gpu_hour is not None else None
    steps: np.ndarray | None
    seconds: np.ndarray | None
    gpu_hours: np.ndarray | None
    cost: np.ndarray | None
    days: np.ndarray | None
    if tokens_to_train:
        steps = np.ceil(float(tokens_to_train) / tps)
        seconds = steps * step
        gpu_hours = seconds * gpus / 3600.0
        cost = gpu_hours * price_per_gpu_hour if price_per_gpu_hour is not None else None
        days = seconds / 86400.0
    else:
        steps = seconds = gpu_hours = cost = days = None
    return TrainingEstimate(step_time_s=step, num_gpus=gpus, tokens_per_step=tps, tokens_to_train=tokens_to_train,
                            price_per_gpu_hour=price_per_gpu_hour, steps=steps, seconds=seconds, days=days,
                            gpu_hours=gpu_hours, cost=cost, gpu_hours_per_mtok=gph_mtok, cost_per_mtok=cost_mtok)


def throughput(model_flops_per_step, step_time_s, num_gpus, peak_flops_per_gpu) -> tuple[Any, Any]:
    """(model TFLOP/s per GPU, MFU)."""
    tf = np.asarray(model_flops_per_step, float) / np.asarray(step_time_s, float) / np.asarray(num_gpus, float)
    return tf / 1e12, tf / np.asarray(peak_flops_per_gpu, float)

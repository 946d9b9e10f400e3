"""A model in words for the CLI and the dashboard: its total (and, for Mixture of Experts, active) parameters and
its routing."""
from __future__ import annotations

from predictor.model.specs import ModelSpec


def param_summary(m: ModelSpec) -> str:
    """'46.7 B parameters, 12.9 B active' (MoE: parameters one token passes through); '8.03 B parameters' (dense)."""
    total = f"{m.total_params() / 1e9:.3g} B parameters"
    total = f"{total}, {m.active_params() / 1e9:.3g} B active" if m.is_moe else total
    return f"{total}, multi-head latent attention" if m.is_mla else total


def routing_summary(m: ModelSpec) -> str:
    """'8 experts, top-2, dropless' (+ shared experts, leading dense layers, capacity factor, imbalance); '' dense."""
    if not m.is_moe:
        return ""
    parts = [f"{m.num_experts} experts", f"top-{m.top_k}"]
    if m.shared_experts:
        parts.append(f"{m.shared_experts} shared")
    if m.dense_layers:
        parts.append(f"first {m.dense_layers} layers dense")
    if m.moe_layer_interval != 1:
        parts.append(f"every {m.moe_layer_interval} layers one MoE ({m.moe_layers} of {m.num_layers})")
    parts.append("dropless" if m.capacity_factor is None else f"capacity factor {m.capacity_factor:g}")
    if m.moe_imbalance is not None:
        parts.append(f"imbalance {m.moe_imbalance:g}")
    return ", ".join(parts)

"""Upper bounds on every model and layout field, with the reason for each: one table, checked by
`ModelSpec.validate` / `Layout.validate` (and `search` for its global batch and sequence length),
so the CLI, predict-batch, search and the dashboard refuse the same inputs with the same words.

A bound sits far beyond anything trained so far (so no real plan meets it) and low enough that
the arithmetic behind a prediction stays exact in 64-bit integers and finite in floats: without
it `--hidden 2^40` or `--seq-len 1e9` gave astronomically large "predictions" instead of an error.
"""
from __future__ import annotations

import math
from typing import Any

from predictor.model.errors import InfeasibleConfig

# field (as the CLI flag / batch column spells it) -> (largest accepted value, why)
BOUNDS: dict[str, tuple[int, str]] = {
    "layers": (2 ** 12, "the deepest published LLMs have about 130 layers; 4,096 is 30x that"),
    "hidden": (2 ** 17, "the widest published LLMs have hidden 16,384-25,600; 131,072 is 5x that"),
    "heads": (2 ** 14, "the most attention heads published are a few hundred; 16,384 is far beyond"),
    "kv_heads": (2 ** 14, "kv_heads cannot exceed heads (at most 16,384)"),
    "head_dim": (2 ** 12, "published attention head dimensions are 64-256; 4,096 is 16x that"),
    "ffn_hidden": (2 ** 19, "the MLP width is at most a few times the hidden size (at most 4 x 131,072)"),
    "num_experts": (2 ** 14, "the most routed experts published are a few hundred (DeepSeek-V3 256); 16,384 is 64x"),
    "top_k": (2 ** 10, "published MoE models route each token to at most a few dozen experts"),
    "moe_ffn_hidden": (2 ** 19, "an expert's width is at most a few times the hidden size"),
    "shared_ffn_hidden": (2 ** 19, "a shared expert's width is at most a few times the hidden size"),
    "shared_experts": (2 ** 10, "published MoE models have at most a few shared experts"),
    "dense_layers": (2 ** 12, "dense layers cannot exceed the layers (at most 4,096)"),
    "ep": (2 ** 20, "expert parallelism cannot exceed the number of GPUs (at most 1,048,576)"),
    "etp": (2 ** 20, "expert tensor parallelism cannot exceed the number of GPUs (at most 1,048,576)"),
    "vocab": (2 ** 22, "the largest vocabularies in use hold about 256k tokens; 4,194,304 is 16x that"),
    "seq_len": (2 ** 22, "the longest training contexts published are about 1M tokens; 4,194,304 is 4x that"),
    "num_gpus": (2 ** 20, "the largest training clusters have about 100k-200k GPUs; 1,048,576 is 5x that"),
    "tp": (2 ** 20, "tensor parallelism cannot exceed the number of GPUs (at most 1,048,576)"),
    "pp": (2 ** 12, "pipeline stages cannot exceed the layers (at most 4,096)"),
    "dp": (2 ** 20, "data parallelism cannot exceed the number of GPUs (at most 1,048,576)"),
    "cp": (2 ** 20, "context parallelism cannot exceed the number of GPUs (at most 1,048,576)"),
    "vpp": (2 ** 12, "virtual pipeline stages cannot exceed the layers (at most 4,096)"),
    "micro_batch": (2 ** 16, "a micro-batch of more than 65,536 sequences per GPU has never fitted in any memory"),
    "global_batch": (2 ** 24, "published global batches hold at most a few thousand sequences; "
                              "16,777,216 is far beyond"),
    # all-to-all context parallelism and activation offloading
    "cp_a2a_size": (2 ** 20, "an all-to-all group cannot exceed the context-parallel ranks (at most 1,048,576)"),
    "offload_activations": (2 ** 12, "offloaded layers cannot exceed the layers (at most 4,096)"),
    # --- Multi-head latent attention (docs/mla.md) ---
    "q_lora_rank": (2 ** 17, "a compression rank is below the hidden size, itself at most 131,072"),
    "kv_lora_rank": (2 ** 17, "a compression rank is below the hidden size, itself at most 131,072"),
    "qk_nope_head_dim": (2 ** 12, "published MLA head dimensions are 64-192; 4,096 is 20x that"),
    "qk_rope_head_dim": (2 ** 12, "published MLA RoPE head dimensions are 64; 4,096 is 64x that"),
    "v_head_dim": (2 ** 12, "published MLA value head dimensions are 128-256; 4,096 is 16x that"),
    "moe_layer_interval": (2 ** 12, "an interval cannot exceed the layers (at most 4,096)"),
}
# Tokens one GPU holds per micro-batch (micro_batch * seq_len): activations grow with it; beyond 2^24
# (16M tokens) a single layer's activations exceed any device's memory by orders of magnitude, and
# products like s * b * h * 34 bytes would leave the range where 64-bit arithmetic is exact.
MAX_TOKENS_PER_MICRO_BATCH = 2 ** 24


def bound_problem(name: str, value: Any) -> tuple[str, str] | None:
    """(problem, fix) when `value` breaks the bound of `name`, else None. Non-finite or non-integer
    values are reported too (the callers' positive-integer checks name them first)."""
    hi, why = BOUNDS[name]
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite integer, got {value!r}.", f"give a whole number between 1 and {hi:,}."
    if isinstance(value, (int, float)) and value > hi:
        return (f"{value:,} is above the upper bound {hi:,} ({why}).",
                f"give a value between 1 and {hi:,}; a value this large is a typo or a unit mix-up.")
    return None


def check_bound(name: str, value: Any) -> None:
    """InfeasibleConfig naming `name`, the bound and why, when `value` breaks it."""
    p = bound_problem(name, value)
    if p is not None:
        raise InfeasibleConfig(name, *p)


def check_tokens_per_micro_batch(micro_batch: int, seq_len: int) -> None:
    if micro_batch * seq_len > MAX_TOKENS_PER_MICRO_BATCH:
        raise InfeasibleConfig(
            "micro_batch", f"micro_batch * seq_len = {micro_batch:,} * {seq_len:,} = {micro_batch * seq_len:,} tokens "
                           f"per GPU per micro-batch is above the upper bound {MAX_TOKENS_PER_MICRO_BATCH:,} (one "
                           "layer's activations alone would exceed any device's memory many times over).",
            "lower micro_batch (or seq_len).")


def describe_bounds() -> str:
    """The table as text (for --help epilogs and docs)."""
    rows = [f"  {k} <= {hi:,}: {why}" for k, (hi, why) in BOUNDS.items()]
    rows.append(f"  micro_batch * seq_len <= {MAX_TOKENS_PER_MICRO_BATCH:,} tokens per GPU per micro-batch")
    return "Upper bounds (each with its reason):\n" + "\n".join(rows)

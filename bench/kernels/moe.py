"""Mixture-of-Experts kernels as Megatron-Core runs them, forward and backward (`opbench.build` calls these).

Shapes follow `predictor/model/ops.py` (tp = 1: the MoE ops are not tensor-parallel):

  moe_router     x[T, h] @ W^T, W[E, h] (T = batch * seq tokens, E = params / hidden experts), softmax over the
                 E logits in fp32, top-k, and the routing probabilities / routing map scattered back to [T, E]
                 (Megatron-Core TopKRouter with pre-softmax routing; the auxiliary load-balancing loss is not
                 in the timed op). bwd: through the scatter, top-k gather and softmax into dgrad + wgrad.
  moe_permute    the token-sort permutation of Megatron-Core's `permute(tokens, indices)`: the T * k expert ids
                 sorted (stable argsort), then tokens[T, h].index_select(sorted // k) -> [T * k, h];
                 here seq = T * k, so the routed rows are batch * seq. bwd: index_add of the [T * k, h]
                 gradient rows back into [T, h].
  moe_unpermute  `unpermute(permuted, sorted_indices, probs)`: the [T * k, h] expert outputs index-copied
                 back into token order, weighted by the router probabilities [T, k] and summed over the
                 k choices -> [T, h]. bwd: gradients of the expert outputs and of the probabilities.

k (top-k) is fixed per sample design (`bench.sampling.design.Profile.moe_top_k`, 2 everywhere) and recorded in the
sample's `variant` as "top<k>": the regressors' features do not see k (moe_permute / moe_unpermute take seq =
tokens * k), so one set holds one k. Expert ids of a permutation are the top-k of random scores over
`PERMUTE_ID_EXPERTS` experts (the sort's key range; its cost hardly depends on it).

The grouped expert GEMM (GPU samplers, `bench.sampling.gpu_ops`): E experts' mlp_up / mlp_down GEMMs in one
`torch._grouped_mm` call (Megatron-Core / Transformer Engine grouped GEMM; x[E * t, K] with per-expert
W[E, K, N]), or, where that call does not run on the device / dtype, a loop of per-expert F.linear calls
(Megatron-Core's SequentialMLP). The two are told apart in the samples (`variant`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from bench.kernels.passes import Pass, autograd_passes

MOE_OPS = ("moe_router", "moe_permute", "moe_unpermute")
PERMUTE_ID_EXPERTS = 16


def variant(top_k: int) -> str:
    """The `variant` recorded with a MoE op sample: the top-k its design used."""
    return f"top{int(top_k)}"


def _rand(*size: int, dtype, device, grad: bool = False) -> torch.Tensor:
    return torch.randn(*size, dtype=dtype, device=device).requires_grad_(grad)


def _passes(leaves: list[torch.Tensor], forward: Callable[[], torch.Tensor]) -> dict[str, Pass]:
    return autograd_passes(leaves, forward)


def routing_indices(tokens: int, top_k: int, device, experts: int = PERMUTE_ID_EXPERTS) -> torch.Tensor:
    """[tokens, top_k] distinct expert ids per token (top-k of random scores), int64."""
    scores = torch.rand(tokens, max(experts, top_k), device=device)
    return torch.topk(scores, top_k, dim=-1).indices


def tokens_of(shape: dict[str, int | None], top_k: int) -> int:
    """Tokens T behind a permute / unpermute shape (batch * seq routed rows = T * top_k)."""
    rows = int(shape.get("batch") or 1) * int(shape["seq"])
    if rows % top_k:
        raise ValueError(f"batch * seq = {rows} routed rows is not a multiple of top_k = {top_k}")
    return rows // top_k


def build_router(shape: dict[str, int | None], top_k: int, dt, dev) -> dict[str, Pass]:
    h = int(shape["hidden"])
    experts = max(1, round(int(shape["params"]) / h))
    if top_k > experts:
        raise ValueError(f"top_k {top_k} > {experts} experts")
    T = int(shape.get("batch") or 1) * int(shape["seq"])
    x = _rand(T, h, dtype=dt, device=dev, grad=True)
    w = _rand(experts, h, dtype=dt, device=dev)
    with torch.no_grad():
        w.mul_(1.0 / math.sqrt(h))
    w.requires_grad_(True)

    return _passes([x, w], lambda: route(x, w, top_k)[0])


def route(x: torch.Tensor, w: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Megatron-Core's top-k router (pre-softmax): x [T, h], W [E, h] -> (routing probabilities [T, E], fp32,
    top-k entries per row, else 0; routing map [T, E] bool)."""
    scores = torch.softmax(F.linear(x, w), dim=-1, dtype=torch.float32)
    probs, idx = torch.topk(scores, top_k, dim=-1)
    routing_map = torch.zeros_like(scores, dtype=torch.bool).scatter(1, idx, True)
    return torch.zeros_like(scores).scatter(1, idx, probs), routing_map


def permute(tokens: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Megatron-Core's sort-based `permute`: tokens [T, h], expert ids [T, k] -> (the T * k routed rows in
    expert order [T * k, h], the sort's indices into the flattened [T * k] choices)."""
    top_k = indices.shape[1]
    sorted_indices = torch.argsort(indices.reshape(-1), stable=True)
    return tokens.index_select(0, sorted_indices // top_k), sorted_indices


def unpermute(permuted: torch.Tensor, sorted_indices: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Megatron-Core's `unpermute`: the expert-ordered rows [T * k, h] back in token order, weighted by the
    router probabilities [T, k] and summed over the k choices -> [T, h]."""
    T, top_k = probs.shape
    rows = torch.zeros_like(permuted).index_copy(0, sorted_indices, permuted)
    return (rows.reshape(T, top_k, -1) * probs.unsqueeze(-1)).sum(dim=1)


def build_permute(shape: dict[str, int | None], top_k: int, dt, dev) -> dict[str, Pass]:
    T, h = tokens_of(shape, top_k), int(shape["hidden"])
    tokens = _rand(T, h, dtype=dt, device=dev, grad=True)
    indices = routing_indices(T, top_k, dev)
    return _passes([tokens], lambda: permute(tokens, indices)[0])


def build_unpermute(shape: dict[str, int | None], top_k: int, dt, dev) -> dict[str, Pass]:
    T, h = tokens_of(shape, top_k), int(shape["hidden"])
    permuted = _rand(T * top_k, h, dtype=dt, device=dev, grad=True)
    sorted_indices = torch.argsort(routing_indices(T, top_k, dev).reshape(-1), stable=True)
    probs = torch.softmax(torch.randn(T, top_k, device=dev), -1).to(dt).requires_grad_(True)
    return _passes([permuted, probs], lambda: unpermute(permuted, sorted_indices, probs))


def build(op: str, shape: dict[str, Any], dt, dev) -> dict[str, Pass]:
    """{pass: (setup, run)} of a MoE op; `shape` may carry the build-only `top_k` (default 2)."""
    k = int(shape.get("top_k") or 2)
    if op == "moe_router":
        return build_router(shape, k, dt, dev)
    if op == "moe_permute":
        return build_permute(shape, k, dt, dev)
    if op == "moe_unpermute":
        return build_unpermute(shape, k, dt, dev)
    raise KeyError(op)


# --------------------------------------------------------------------------- grouped expert GEMM
def gemm_kn(op: str, hidden: int, ffn_hidden: int) -> tuple[int, int]:
    """(K, N) of one expert's GEMM: mlp_up [t, hidden] x [hidden, ffn_hidden], mlp_down the reverse."""
    if op == "mlp_up":
        return hidden, ffn_hidden
    if op == "mlp_down":
        return ffn_hidden, hidden
    raise ValueError(f"{op}: grouped expert GEMMs are mlp_up or mlp_down")


def grouped_mm_runs(device: str, dtype) -> tuple[bool, str]:
    """(whether torch._grouped_mm runs for `dtype` on `device`, why not)."""
    if not hasattr(torch, "_grouped_mm"):
        return False, f"this torch ({torch.__version__}) has no torch._grouped_mm"
    dev = torch.device(device)
    try:
        a = torch.randn(32, 16, dtype=dtype, device=dev)
        b = torch.randn(2, 16, 16, dtype=dtype, device=dev)
        torch._grouped_mm(a, b, offs=torch.tensor([16, 32], dtype=torch.int32, device=dev))
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        return False, f"torch._grouped_mm does not run here: {str(exc).splitlines()[0][:160]}"
    return True, ""


def build_grouped(op: str, tokens: int, experts: int, hidden: int, ffn_hidden: int, dt, dev,
                  impl: str = "grouped_mm") -> dict[str, Pass]:
    """{pass: (setup, run)}: `experts` experts' `op` GEMMs on `tokens` tokens each, as one call.
    impl "grouped_mm": torch._grouped_mm(x[E*t, K], W[E, K, N], offs); "loop": per-expert F.linear + cat."""
    K, N = gemm_kn(op, hidden, ffn_hidden)
    x = _rand(experts * tokens, K, dtype=dt, device=dev, grad=True)
    w = _rand(experts, K, N, dtype=dt, device=dev)
    with torch.no_grad():
        w.mul_(1.0 / math.sqrt(K))
    w.requires_grad_(True)
    if impl not in ("grouped_mm", "loop"):
        raise ValueError(f"impl {impl!r}: grouped_mm or loop")
    offs = torch.arange(1, experts + 1, dtype=torch.int32, device=dev) * tokens
    return _passes([x, w], lambda: grouped_forward(x, w, offs, impl))


def grouped_forward(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, impl: str) -> torch.Tensor:
    """x[rows, K] split at the cumulative row offsets `offs` [E], expert i's rows @ w[i] ([K, N]) -> [rows, N]."""
    if impl == "grouped_mm":
        return torch._grouped_mm(x, w, offs=offs)
    sizes = torch.diff(offs, prepend=offs.new_zeros(1)).tolist()
    return torch.cat([xi @ w[i] for i, xi in enumerate(torch.split(x, sizes))])

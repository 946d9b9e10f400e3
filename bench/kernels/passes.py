"""Forward and backward passes of a kernel as timing closures (`timing.time_call` runs them): shared by the
operator, MoE, ring and in-context samplers."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Pass = tuple[Callable[[], Any], Callable[[Any], Any]]   # (setup, run)


def clear_grads(*ts: torch.Tensor) -> None:
    for t in ts:
        t.grad = None


def autograd_passes(leaves: list[torch.Tensor], forward: Callable[[], torch.Tensor]) -> dict[str, Pass]:
    """fwd: forward with the graph recorded; bwd: out.backward(random grad) on a fresh graph."""
    def fwd_run(_):
        return forward()

    probe = None
    with torch.no_grad():
        probe = forward()
    grad = torch.randn_like(probe) if probe.dim() > 0 else torch.ones((), dtype=probe.dtype, device=probe.device)
    del probe

    def bwd_setup():
        clear_grads(*leaves)
        return forward()

    def bwd_run(out):
        out.backward(grad)
    return {"fwd": (lambda: None, fwd_run), "bwd": (bwd_setup, bwd_run)}

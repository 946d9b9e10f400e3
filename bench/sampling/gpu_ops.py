"""GPU-only operator samplers: grouped expert GEMMs and FP8 GEMMs, through the operator sampler's store I/O.

    python -m bench grouped-gemm --platform dgx-h100 --dtype bf16         # -> bench/samples/dgx-h100-grouped-gemm
    python -m bench ops --platform dgx-h100 --device cuda --dtype fp8 --profile gpu   # -> bench/samples/dgx-h100-fp8

Grouped expert GEMM: E local experts' mlp_up (gate+up fused, N = 2 x expert width) or mlp_down GEMMs on t tokens
each, in one call (bench/kernels/moe.py `build_grouped`: torch._grouped_mm where it runs, else a loop of per-expert
GEMMs). A sample is recorded as the op the predictor asks for, one expert's mlp_up / mlp_down (tp = 1,
batch = 1, seq = t, ffn_hidden = that GEMM's width), with duration_s = the call's time / E, the call's own
time in `call_s`, E in `experts_in_call` and the implementation in `variant` ("grouped_mm" | "expert_loop").
These sets are kept apart from the dense ones (their own folder): the store's regressors pool an op's samples
over variants, and a grouped call's per-expert share is not a dense GEMM of that shape.

FP8: `opbench.build_fp8_gemm` (torch._scaled_mm, per-tensor scales, e4m3 forward, e5m2 gradients, BF16
output) on the projection GEMM shapes of the plan, dtype "fp8" (the predictor's precision name); refused
with the reason on a device without FP8 tensor cores (compute capability < 8.9, or a CPU).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.kernels import moe
from bench.sampling import design as D
from predictor.model import ops as P

GROUPED_OPS = ("mlp_up", "mlp_down")
FP8_OPS = ("qkv_proj", "attn_out_proj", "mlp_up", "mlp_down")  # predictor.step.fp8: the layers' linear layers
EXPERTS_IN_CALL = (2, 4, 8, 16, 32, 64, 128)
EXPERT_WIDTH_RATIO = (0.25, 4.0)  # expert ffn width / hidden: Qwen3 / DeepSeek-V3 ~0.3, Mixtral 3.5
TOKEN_MULTIPLE = 16


def grouped_design(op: str, n: int, profile: str | D.Profile = "gpu", seed: int = 0) -> list[D.DesignPoint]:
    """The first `n` feasible points of a scrambled Sobol sequence over (tokens per expert, hidden, expert
    width, experts in the call); shapes as one expert's GEMM, E in `extra`."""
    from scipy.stats import qmc
    if op not in GROUPED_OPS:
        raise ValueError(f"{op}: grouped expert GEMMs are {', '.join(GROUPED_OPS)}")
    prof = D.PROFILES[profile] if isinstance(profile, str) else profile
    sob = qmc.Sobol(d=4, scramble=True, seed=seed * 1009 + 7919 + GROUPED_OPS.index(op))
    pts = sob.random_base2(max(4, math.ceil(math.log2(max(n, 1) * 4))))
    tok_lo, tok_hi = TOKEN_MULTIPLE, max(TOKEN_MULTIPLE * 2, prof.max_tokens // 2)
    out: list[D.DesignPoint] = []
    seen: set[tuple[int, ...]] = set()
    for i, u in enumerate(pts):
        t = D._round_to(D._log_map(u[0], tok_lo, tok_hi), TOKEN_MULTIPLE)
        h = D._round_to(D._log_map(u[1], prof.hidden[0], prof.hidden[1]), prof.ffn_multiple)
        width = D._round_to(h * D._log_map(u[2], *EXPERT_WIDTH_RATIO), prof.ffn_multiple)
        E = D._pick(u[3], EXPERTS_IN_CALL)
        col = 2 * width if op == "mlp_up" else width
        K, N = moe.gemm_kn(op, h, col)
        if 2.0 * E * t * K * N > prof.max_fwd_flops or max(E * K * N, E * t * max(K, N)) > prof.max_elements:
            continue
        if (t, h, col, E) in seen:
            continue
        seen.add((t, h, col, E))
        shape: dict[str, int | None] = dict.fromkeys(P.SHAPE_COLUMNS)
        shape.update(tp=1, batch=1, seq=t, hidden=h, ffn_hidden=col)
        out.append(D.DesignPoint(op, i, shape, {"experts": E, "calls_per_sample": E,
                                                "columns": {"experts_in_call": E}}))
        if len(out) >= n:
            break
    return out


def grouped_plan(n_per_op: int, profile: str | D.Profile = "gpu", seed: int = 0,
                 impl: str = "grouped_mm") -> list[D.DesignPoint]:
    """mlp_up and mlp_down designs interleaved, every point's variant the implementation."""
    designs = [grouped_design(op, n_per_op, profile, seed) for op in GROUPED_OPS]
    out = []
    for i in range(max(len(d) for d in designs)):
        for d in designs:
            if i < len(d):
                p = d[i]
                out.append(D.DesignPoint(p.op, p.index, p.shape, {**p.extra, "variant": _variant(impl)}))
    return out


def _variant(impl: str) -> str:
    return {"grouped_mm": "grouped_mm", "loop": "expert_loop"}[impl]


def choose_impl(device: str, dtype: str, impl: str = "auto") -> tuple[str, str]:
    """(implementation, why): torch._grouped_mm where it runs on device / dtype, else the per-expert loop."""
    import torch

    from bench.kernels.opbench import DTYPES
    if impl in ("grouped_mm", "loop"):
        return impl, "asked for"
    ok, why = moe.grouped_mm_runs(device, DTYPES[dtype])
    if ok:
        return "grouped_mm", f"torch._grouped_mm runs on {device} in {dtype} (torch {torch.__version__})"
    return "loop", why + "; timing a loop of per-expert GEMMs instead"


def build_point(p: D.DesignPoint, dtype: str, device: str) -> dict[str, Any]:
    import torch

    from bench.kernels.opbench import DTYPES
    impl = "grouped_mm" if p.extra["variant"] == "grouped_mm" else "loop"
    s = p.shape
    return moe.build_grouped(p.op, int(s["seq"]), int(p.extra["experts"]), int(s["hidden"]), int(s["ffn_hidden"]),
                             DTYPES[dtype], torch.device(device), impl)


def run_grouped(platform: str, out_dir: str | Path, *, device: str = "cuda", dtype: str = "bf16",
                n_per_op: int = 48, profile: str | D.Profile = "gpu", seed: int = 0, impl: str = "auto",
                log: Callable[[str], None] = print, **kw: Any) -> dict[str, Any]:
    """Sample grouped expert GEMMs into `out_dir` with the operator sampler (bench.sampling.sampler.run_ops)."""
    from bench.sampling.sampler import rank_device, run_ops
    device = rank_device(device)
    chosen, why = choose_impl(device, dtype, impl)
    log(f"grouped expert GEMM: {chosen} ({why})")
    points = grouped_plan(n_per_op, profile, seed, chosen)
    prof = profile if isinstance(profile, str) else profile.name
    note = (f"grouped expert GEMMs, variant {_variant(chosen)} ({chosen}: {why}); "
            f"bench/sampling/gpu_ops.py grouped_design, "
            f"profile {prof}, seed {seed}, {n_per_op} points per op; duration_s = call / experts_in_call")
    return run_ops(platform, out_dir, device=device, dtype=dtype, points=points, build=build_point,
                   kind="grouped-gemm", design_note=note, profile=profile, seed=seed, n_per_op=n_per_op, log=log,
                   **kw)

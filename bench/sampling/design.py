"""Space-filling sampling plans over operator shapes (not a full grid).

Each op gets a scrambled Sobol sequence over its free dimensions (log-scaled where sizes span
orders of magnitude), mapped to realistic integer shapes (hidden = heads x head_dim, kv_heads a
divisor of heads, sequence lengths multiples of 16, ...) and filtered by the profile's bounds and
cost guards. Any prefix of a Sobol sequence is itself space-filling, so the sampler visits the ops
round-robin, point i of every op before point i+1 of any, and a run cut short by its time budget
still covers every op's whole domain evenly.

Profiles: `cpu` (small models that train on a few cores), `cpu-wide` (the same domain with the cost
guards raised, 1.5e11 FLOPs and 2^28 elements per call, 200 M optimizer parameters, so that
4096-token batches of 32k-vocabulary heads and their cross-entropy, hidden-1024 MLPs and larger
optimizers are sampled rather than extrapolated; opt-in: each such point costs 5-15 s on 2 cores and
up to ~4 GiB per process) and `gpu` (Megatron-scale shapes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import qmc

from bench.kernels import opbench
from bench.kernels.moe import MOE_OPS
from predictor.model import ops as P


@dataclass(frozen=True)
class Profile:
    name: str
    batch: tuple[int, int]
    seq: tuple[int, int]
    hidden: tuple[int, int]
    head_dims: tuple[int, ...]
    kv_groups: tuple[int, ...]          # heads / kv_heads
    ffn_ratio: tuple[float, float]      # ffn_hidden / hidden (gelu, swiglu, mlp_down)
    mlp_up_ratio: tuple[float, float]   # the mlp_up column: 4h (GPT) .. 2 * ffn (SwiGLU gate+up fused)
    vocab: tuple[int, int]
    layers: tuple[int, int]             # optimizer
    max_tokens: int                     # b * l
    max_fwd_flops: float                # cost guard per call (opbench.fwd_flops)
    max_elements: int                   # memory guard: largest tensor
    max_params: int                     # optimizer
    seq_multiple: int = 16
    ffn_multiple: int = 8
    attention_max_seq: int | None = None
    experts: tuple[int, int] = (4, 128)  # moe_router: experts behind the router (params = hidden * experts)
    moe_top_k: int = 2                   # MoE ops: top-k of every point (recorded as the variant "top<k>")

    def bounds(self) -> dict[str, tuple[float, float]]:
        return {"batch": self.batch, "seq": self.seq, "hidden": (self.hidden[0], self.hidden[1]),
                "vocab": self.vocab, "layers": self.layers}


PROFILES = {
    "cpu": Profile("cpu", batch=(1, 8), seq=(32, 1024), hidden=(64, 2048), head_dims=(32, 64, 128),
                   kv_groups=(1, 2, 4, 8), ffn_ratio=(1.0, 6.0), mlp_up_ratio=(1.0, 8.0), vocab=(1000, 65536),
                   layers=(1, 24), max_tokens=8192, max_fwd_flops=3e10, max_elements=48 * 2**20,
                   max_params=60_000_000),
    "cpu-wide": Profile("cpu-wide", batch=(1, 8), seq=(32, 1024), hidden=(64, 2048), head_dims=(32, 64, 128),
                        kv_groups=(1, 2, 4, 8), ffn_ratio=(1.0, 6.0), mlp_up_ratio=(1.0, 8.0), vocab=(1000, 65536),
                        layers=(1, 24), max_tokens=8192, max_fwd_flops=1.5e11, max_elements=2**28,
                        max_params=200_000_000),
    "gpu": Profile("gpu", batch=(1, 16), seq=(128, 8192), hidden=(512, 16384), head_dims=(64, 128),
                   kv_groups=(1, 2, 4, 8), ffn_ratio=(2.0, 6.0), mlp_up_ratio=(2.0, 8.0), vocab=(32000, 262144),
                   layers=(1, 32), max_tokens=65536, max_fwd_flops=2e14, max_elements=2**31,
                   max_params=4_000_000_000, seq_multiple=128, ffn_multiple=128, experts=(8, 256)),
}

# free dimensions per op (besides tp, which is a fixed list per run)
_DIMS = {
    "qkv_proj": ("batch", "seq", "hidden", "head_dim", "kv_group"),
    "attn_out_proj": ("batch", "seq", "hidden"),
    "mlp_up": ("batch", "seq", "hidden", "mlp_up_ratio"),
    "mlp_down": ("batch", "seq", "hidden", "ffn_ratio"),
    "lm_head": ("batch", "seq", "hidden", "vocab"),
    "embedding": ("batch", "seq", "hidden", "vocab"),
    "flash_attn": ("batch", "seq", "hidden", "head_dim", "kv_group"),
    "attn_scores": ("batch", "seq", "hidden", "head_dim"),
    "attn_context": ("batch", "seq", "hidden", "head_dim"),
    "attn_mask_fill": ("batch", "seq", "hidden", "head_dim"),
    "softmax": ("batch", "seq", "hidden", "head_dim"),
    "fused_masked_softmax": ("batch", "seq", "hidden", "head_dim"),
    "rope": ("batch", "seq", "hidden", "head_dim"),
    "layernorm": ("batch", "seq", "hidden"),
    "rmsnorm": ("batch", "seq", "hidden"),
    "res_add": ("batch", "seq", "hidden"),
    "gelu": ("batch", "seq", "hidden", "ffn_ratio"),
    "swiglu": ("batch", "seq", "hidden", "ffn_ratio"),
    "cross_entropy": ("batch", "seq", "vocab"),
    "optimizer": ("hidden", "layers", "vocab"),
    "moe_router": ("batch", "seq", "hidden", "experts"),
    "moe_permute": ("batch", "seq", "hidden"),
    "moe_unpermute": ("batch", "seq", "hidden"),
}
# the ops a decomposition of GPT / Llama with flash attention uses, and the Mixture-of-Experts token routing
# (bench/kernels/moe.py; seq of permute / unpermute counts routed rows, tokens * top_k): the default plan
DEFAULT_OPS = ("qkv_proj", "attn_out_proj", "mlp_up", "mlp_down", "lm_head", "embedding", "flash_attn", "rope",
               "layernorm", "rmsnorm", "res_add", "gelu", "swiglu", "cross_entropy", "optimizer", *MOE_OPS)
UNFUSED_ATTENTION_OPS = ("attn_scores", "attn_context", "attn_mask_fill", "softmax", "fused_masked_softmax")


@dataclass
class DesignPoint:
    op: str
    index: int                     # position in the op's Sobol sequence (prefixes are space-filling)
    shape: dict[str, int | None]   # predictor.model.ops.SHAPE_COLUMNS
    extra: dict[str, Any] = field(default_factory=dict)  # build-only parameters (optimizer vocab)

    def key(self, pass_: str, dtype: str) -> str:
        return sample_key(self.op, pass_, dtype, self.shape)

    @property
    def variant(self) -> str | None:
        """The `variant` its samples record: the optimizer's stage, the attention kernel, a MoE op's top-k."""
        if "variant" in self.extra:
            return self.extra["variant"]
        if self.op == "optimizer":
            return "whole"
        if self.op == "flash_attn":
            return "sdpa-causal"
        if self.op in MOE_OPS:
            return f"top{int(self.extra['top_k'])}"
        return None


def sample_key(op: str, pass_: str, dtype: str, shape: dict[str, Any]) -> str:
    vals = []
    for c in P.SHAPE_COLUMNS:
        v = shape.get(c)
        vals.append("" if v is None or (isinstance(v, float) and math.isnan(v)) else str(int(v)))
    return f"{op}|{pass_}|{dtype}|" + ",".join(vals)


def _log_map(u: float, lo: float, hi: float) -> float:
    return math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))


def _pick(u: float, choices: tuple) -> Any:
    return choices[min(len(choices) - 1, int(u * len(choices)))]


def _round_to(x: float, m: int) -> int:
    return max(m, int(round(x / m)) * m)


def map_point(op: str, u: np.ndarray, prof: Profile, tp: int) -> tuple[dict[str, int | None], dict[str, Any]]:
    """Unit-cube point -> (shape columns, build extras). Raises ValueError if it cannot be realised."""
    names = _DIMS[op]
    v = dict(zip(names, u))
    s: dict[str, int | None] = dict.fromkeys(P.SHAPE_COLUMNS)
    extra: dict[str, Any] = {}
    cols = P.OPS[op].shape_columns
    if "batch" in v:
        s["batch"] = int(min(prof.batch[1], math.floor(_log_map(v["batch"], prof.batch[0], prof.batch[1] + 1))))
    if "seq" in v:
        s["seq"] = min(prof.seq[1], _round_to(_log_map(v["seq"], prof.seq[0], prof.seq[1]), prof.seq_multiple))
    hd = _pick(v.get("head_dim", 0.5), prof.head_dims)
    if "hidden" in v:
        raw = _log_map(v["hidden"], prof.hidden[0], prof.hidden[1])
        if "heads" in cols or op == "fused_masked_softmax":
            heads = max(tp, int(round(raw / hd / tp)) * tp)
            s["hidden"] = heads * hd
            s["heads"] = heads
        else:
            s["hidden"] = _round_to(raw, 32 * tp)
    if "kv_heads" in cols and s["heads"]:
        g = _pick(v.get("kv_group", 0.0), prof.kv_groups)
        while s["heads"] % g:
            g //= 2
        kv = s["heads"] // g
        if kv % tp and tp % kv:
            kv = s["heads"]
        s["kv_heads"] = kv
    if "mlp_up_ratio" in v:
        s["ffn_hidden"] = _round_to(s["hidden"] * (prof.mlp_up_ratio[0] + v["mlp_up_ratio"] *
                                                    (prof.mlp_up_ratio[1] - prof.mlp_up_ratio[0])),
                                    prof.ffn_multiple * tp)
    if "ffn_ratio" in v:
        s["ffn_hidden"] = _round_to(s["hidden"] * (prof.ffn_ratio[0] + v["ffn_ratio"] *
                                                    (prof.ffn_ratio[1] - prof.ffn_ratio[0])),
                                    prof.ffn_multiple * tp)
    if "vocab" in v:
        vocab = int(round(_log_map(v["vocab"], prof.vocab[0], prof.vocab[1])))
        if op == "optimizer":
            extra["vocab"] = vocab
        else:
            s["vocab"] = vocab
    if "experts" in v:
        s["params"] = s["hidden"] * int(round(_log_map(v["experts"], prof.experts[0], prof.experts[1])))
    if op in MOE_OPS:
        extra["top_k"] = prof.moe_top_k
    if op == "optimizer":
        s["hidden"] = _round_to(_log_map(v["hidden"], prof.hidden[0], prof.hidden[1]), 64 * tp)
        s["layers"] = int(min(prof.layers[1], math.floor(_log_map(v["layers"], prof.layers[0], prof.layers[1] + 1))))
        s["params"] = opbench.optimizer_params(s["hidden"], s["layers"], tp, extra["vocab"])
    if op == "fused_masked_softmax":
        # sampled per rank (tp = 1, heads already divided), as decompose passes it
        s["heads"] = max(1, s["heads"] // tp)
        s["hidden"] = None
        tp_col = 1
    else:
        tp_col = tp
    if "tp" in cols:
        s["tp"] = tp_col
    # keep only the op's own columns
    s = {c: (s[c] if c in cols else None) for c in P.SHAPE_COLUMNS}
    if op == "fused_masked_softmax":
        extra["head_dim"] = hd
    return s, extra


def feasible(op: str, shape: dict[str, int | None], prof: Profile) -> bool:
    b, l = shape.get("batch") or 1, shape.get("seq") or 1
    if b * l > prof.max_tokens:
        return False
    if op == "optimizer":
        return (shape["params"] or 0) <= prof.max_params
    sh = dict(shape)
    if op == "fused_masked_softmax":
        sh["hidden"] = None
    if opbench.fwd_flops(op, sh) > prof.max_fwd_flops:
        return False
    return opbench.largest_tensor_elements(op, sh) <= prof.max_elements


# The operators whose designs were sampled before the vocabulary grew, in the order that seeded them (sorted): their
# Sobol seeds must not move when operators are added (the speed check and re-runs rebuild the sampled shapes from
# the seed); operators added later take the indices after these, in sorted order.
_SEEDED_OPS = ("attn_context", "attn_mask_fill", "attn_out_proj", "attn_scores", "cross_entropy", "embedding",
               "flash_attn", "fused_masked_softmax", "gelu", "layernorm", "lm_head", "mlp_down", "mlp_up", "optimizer",
               "qkv_proj", "res_add", "rmsnorm", "rope", "softmax", "swiglu")


def op_seed_index(op: str) -> int:
    """A stable per-operator seed offset (see _SEEDED_OPS)."""
    if op in _SEEDED_OPS:
        return _SEEDED_OPS.index(op)
    return len(_SEEDED_OPS) + sorted(o for o in P.OPS if o not in _SEEDED_OPS).index(op)


def op_design(op: str, n: int, profile: str | Profile = "cpu", tps: tuple[int, ...] = (1,), seed: int = 0
              ) -> list[DesignPoint]:
    """The first `n` feasible points of the op's scrambled Sobol sequence (deterministic for a seed)."""
    prof = PROFILES[profile] if isinstance(profile, str) else profile
    names = list(_DIMS[op]) + (["tp"] if len(tps) > 1 else [])
    rng_seed = seed * 1009 + op_seed_index(op)
    sob = qmc.Sobol(d=len(names), scramble=True, seed=rng_seed)
    m = max(4, math.ceil(math.log2(max(n, 1) * 4)))
    pts = sob.random_base2(m)
    out: list[DesignPoint] = []
    seen: set[str] = set()
    for i, u in enumerate(pts):
        tp = _pick(u[-1], tps) if len(tps) > 1 else tps[0]
        try:
            shape, extra = map_point(op, u[: len(_DIMS[op])], prof, tp)
        except (ValueError, ZeroDivisionError):
            continue
        if not feasible(op, shape, prof):
            continue
        k = sample_key(op, "-", "-", shape)
        if k in seen:
            continue
        seen.add(k)
        out.append(DesignPoint(op, i, shape, extra))
        if len(out) >= n:
            break
    return out


def plan(ops: tuple[str, ...] | list[str], n_per_op: int, profile: str | Profile = "cpu",
         tps: tuple[int, ...] = (1,), seed: int = 0) -> list[DesignPoint]:
    """All ops' designs interleaved round-robin: point 0 of every op, then point 1, ..."""
    designs = [op_design(op, n_per_op, profile, tps, seed) for op in ops]
    out = []
    for i in range(max((len(d) for d in designs), default=0)):
        for d in designs:
            if i < len(d):
                out.append(d[i])
    return out


def in_bounds(p: DesignPoint, profile: str | Profile = "cpu") -> bool:
    """Every shape value within the profile's bounds (used by the tests)."""
    prof = PROFILES[profile] if isinstance(profile, str) else profile
    s = p.shape
    checks = [("batch", prof.batch), ("seq", prof.seq), ("layers", prof.layers)]
    for c, (lo, hi) in checks:
        if s.get(c) is not None and not lo <= s[c] <= hi:
            return False
    if s.get("hidden") is not None and not prof.hidden[0] / 2 <= s["hidden"] <= prof.hidden[1] * 1.1:
        return False
    if s.get("vocab") is not None and not prof.vocab[0] <= s["vocab"] <= prof.vocab[1]:
        return False
    return feasible(p.op, s, prof)

"""Operator kernels exactly as `predictor/step/decompose.py` asks for them, forward and backward.

`build(op, shape, dtype, device)` returns {pass: (setup, run)} for `bench.sampling.timing.time_call`.
`shape` holds the op's shape columns (`predictor.model.ops.OPS[op].shape_columns`) with the semantics of
`predictor/model/ops.py`: whole-model heads / kv_heads / ffn_hidden / vocab, divided here by `tp` to the
per-rank tensors one GPU (or CPU process) computes. What each op times:

  qkv_proj        x[b*l, h] @ W^T, W[(H/tp + 2*max(KV/tp,1))*hd, h]     (one fused GEMM, no bias)
  attn_out_proj   x[b*l, h/tp] @ W^T, W[h, h/tp]
  mlp_up          x[b*l, h] @ W^T, W[ffn/tp, h]   (llama: decompose passes ffn_hidden = 2*ffn, gate+up fused)
  mlp_down        x[b*l, ffn/tp] @ W^T, W[h, ffn/tp]
  lm_head         x[b*l, h] @ W^T, W[Vp/tp, h], Vp = vocab padded to a multiple of 128*tp
  embedding       F.embedding(ids[b, l], W[Vp/tp, h]); bwd = dense weight gradient
  flash_attn      F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa) with
                  q[b, H/tp, l, hd], k, v[b, max(KV/tp,1), l, hd] as transposed views of [b, l, heads, hd]
                  (SDPA picks flash / memory-efficient / the CPU flash kernel where available)
  attn_scores     baddbmm(q[b*H/tp, l, hd], k^T) * 1/sqrt(hd)   (unfused attention)
  attn_context    bmm(p[b*H/tp, l, l], v[b*H/tp, l, hd])
  attn_mask_fill  scores.masked_fill(causal, -10000) on [b, H/tp, l, l]
  softmax         softmax over [b, H/tp, l, l]
  fused_masked_softmax  scale + causal mask + softmax over [b, heads, l, l] (heads already per rank)
  rope            q*cos + rotate_half(q)*sin on q and k, each [b, H/tp, l, hd]
  layernorm       F.layer_norm on [b*l, h] (weight + bias)
  rmsnorm         F.rms_norm on [b*l, h] (weight)
  res_add         a + b on [b*l, h]; bwd = the gradient accumulation at the residual fork (one add)
  gelu            F.gelu(approximate='tanh') on [b*l, ffn/tp]
  swiglu          F.silu(gate) * up, gate and up [b*l, ffn/tp]
  cross_entropy   F.cross_entropy(logits[b*l, Vp/tp], targets) (mean)
  optimizer       torch.optim.AdamW(...).step() with torch's default implementation for the device
                  (foreach on CUDA, the per-tensor loop on CPU) over fp32 parameters laid out like a
                  GPT stack: 12 tensors per layer split by tp + the vocab embedding + a final norm
  moe_router, moe_permute, moe_unpermute   Megatron-Core's router / permute / unpermute (bench/kernels/moe.py)

dtype "fp8" times the projection GEMMs in FP8 with torch._scaled_mm (`build_fp8_gemm`, CUDA with compute
capability >= 8.9 only).

Backward passes run through autograd (`out.backward(grad)`), as training does, with the inputs that
need gradients in training marked `requires_grad`; `.grad` is cleared before each repeat (the
first backward after `zero_grad(set_to_none=True)` assigns rather than accumulates). Forward passes
run with grad mode on, so they include building the autograd graph.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from bench.kernels import moe
from bench.kernels.passes import Pass, autograd_passes
from predictor.model.specs import padded_vocab

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def dims(shape: dict[str, int | None]) -> dict[str, int]:
    """Per-rank dimensions from the shape columns (same rules as predictor/regress/features.py)."""
    g = lambda k, d=None: d if shape.get(k) is None else int(shape[k])  # noqa: E731
    tp = max(1, g("tp", 1))
    b, l, h = g("batch", 1), g("seq"), g("hidden")
    H = g("heads")
    kv = g("kv_heads", H)
    ffn = g("ffn_hidden", 4 * h if h else None)
    V = g("vocab", 50257)
    out = dict(tp=tp, b=b, l=l, h=h, H=H, kv=kv, ffn=ffn, V=V, Vp=padded_vocab(V, tp))
    out["Vpr"] = out["Vp"] // tp
    if H:
        out["hd"] = h // H if h else None
        out["Hr"] = max(1, H // tp)
        out["KVr"] = max(1, kv // tp) if kv else out["Hr"]
    return out


def gemm_mnk(op: str, shape: dict[str, int | None]) -> tuple[int, int, int]:
    """(M, N, K) of the projection GEMMs."""
    d = dims(shape)
    M = d["b"] * d["l"]
    if op == "qkv_proj":
        return M, (d["Hr"] + 2 * d["KVr"]) * d["hd"], d["h"]
    if op == "attn_out_proj":
        return M, d["h"], d["h"] // d["tp"]
    if op == "mlp_up":
        return M, d["ffn"] // d["tp"], d["h"]
    if op == "mlp_down":
        return M, d["h"], d["ffn"] // d["tp"]
    if op == "lm_head":
        return M, d["Vpr"], d["h"]
    raise KeyError(op)


def fwd_flops(op: str, shape: dict[str, int | None]) -> float:
    """Forward FLOPs (GEMM-like ops) or elements touched (others): the design's cost guard."""
    d = dims(shape)
    if op in ("qkv_proj", "attn_out_proj", "mlp_up", "mlp_down", "lm_head"):
        M, N, K = gemm_mnk(op, shape)
        return 2.0 * M * N * K
    if op == "flash_attn":
        return 4.0 * d["b"] * d["Hr"] * d["l"] ** 2 * d["hd"] / 2  # causal
    if op in ("attn_scores", "attn_context"):
        return 2.0 * d["b"] * d["Hr"] * d["l"] ** 2 * d["hd"]
    if op in ("attn_mask_fill", "softmax"):
        return 5.0 * d["b"] * d["Hr"] * d["l"] ** 2
    if op == "fused_masked_softmax":
        return 5.0 * d["b"] * d["H"] * d["l"] ** 2
    if op == "cross_entropy":
        return 5.0 * d["b"] * d["l"] * d["Vpr"]
    if op == "optimizer":
        return 12.0 * (shape.get("params") or 0)
    if op == "moe_router":
        experts = max(1, round((shape.get("params") or 0) / d["h"]))
        return 2.0 * d["b"] * d["l"] * d["h"] * experts + 5.0 * d["b"] * d["l"] * experts
    if op in ("gelu", "swiglu"):
        return 8.0 * d["b"] * d["l"] * d["ffn"] // d["tp"]
    return 5.0 * d["b"] * d["l"] * (d["h"] or 1)


def largest_tensor_elements(op: str, shape: dict[str, int | None]) -> int:
    """Elements of the largest tensor the op allocates (memory guard)."""
    d = dims(shape)
    M = (d["b"] or 1) * (d["l"] or 1)
    if op in ("qkv_proj", "attn_out_proj", "mlp_up", "mlp_down", "lm_head"):
        m, n, k = gemm_mnk(op, shape)
        return max(m * n, m * k, n * k)
    if op in ("attn_scores", "attn_context", "attn_mask_fill", "softmax"):
        return d["b"] * d["Hr"] * d["l"] ** 2
    if op == "fused_masked_softmax":
        return d["b"] * d["H"] * d["l"] ** 2
    if op == "cross_entropy":
        return M * d["Vpr"]
    if op == "embedding":
        return max(M * d["h"], d["Vpr"] * d["h"])
    if op in ("gelu", "swiglu"):
        return M * d["ffn"] // d["tp"]
    if op == "optimizer":
        return int(shape.get("params") or 0)
    if op == "moe_router":
        experts = max(1, round((shape.get("params") or 0) / d["h"]))
        return max(M * d["h"], M * experts, d["h"] * experts)
    return M * (d["h"] or 1)


# --------------------------------------------------------------------------- helpers
def _rand(*size: int, dtype, device, grad: bool = False) -> torch.Tensor:
    t = torch.randn(*size, dtype=dtype, device=device)
    return t.requires_grad_(grad)


def _linear(M: int, N: int, K: int, dt, dev) -> dict[str, Pass]:
    x = _rand(M, K, dtype=dt, device=dev, grad=True)
    w = _rand(N, K, dtype=dt, device=dev, grad=True)
    with torch.no_grad():
        w.mul_(1.0 / math.sqrt(K))
    return autograd_passes([x, w], lambda: F.linear(x, w))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


# --------------------------------------------------------------------------- builders
def build(op: str, shape: dict[str, int | None], dtype: str = "fp32", device: str = "cpu") -> dict[str, Pass]:
    """{pass: (setup, run)} timing `op` on `shape`; passes as in `predictor.model.ops.OPS[op].passes`."""
    if dtype == "fp8":
        return build_fp8_gemm(op, shape, device)
    dt = DTYPES[dtype]
    dev = torch.device(device)
    if op in moe.MOE_OPS:
        return moe.build(op, shape, dt, dev)
    d = dims(shape)
    if op in ("qkv_proj", "attn_out_proj", "mlp_up", "mlp_down", "lm_head"):
        M, N, K = gemm_mnk(op, shape)
        return _linear(M, N, K, dt, dev)
    b, l = d["b"], d["l"]
    M = (b or 1) * (l or 1)
    if op == "embedding":
        w = _rand(d["Vpr"], d["h"], dtype=dt, device=dev, grad=True)
        ids = torch.randint(0, d["Vpr"], (b, l), device=dev)
        return autograd_passes([w], lambda: F.embedding(ids, w))
    if op == "flash_attn":
        Hr, KVr, hd = d["Hr"], d["KVr"], d["hd"]
        q = _rand(b, l, Hr, hd, dtype=dt, device=dev, grad=True)
        k = _rand(b, l, KVr, hd, dtype=dt, device=dev, grad=True)
        v = _rand(b, l, KVr, hd, dtype=dt, device=dev, grad=True)
        gqa = KVr != Hr

        def attn():
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True, enable_gqa=gqa)
        return autograd_passes([q, k, v], attn)
    if op in ("attn_scores", "attn_context"):
        Hr, hd = d["Hr"], d["hd"]
        if op == "attn_scores":
            q = _rand(b * Hr, l, hd, dtype=dt, device=dev, grad=True)
            k = _rand(b * Hr, l, hd, dtype=dt, device=dev, grad=True)
            scale = 1.0 / math.sqrt(hd)
            return autograd_passes([q, k], lambda: torch.baddbmm(
                torch.empty(b * Hr, l, l, dtype=dt, device=dev), q, k.transpose(1, 2), beta=0.0, alpha=scale))
        p = torch.softmax(torch.randn(b * Hr, l, l, dtype=dt, device=dev), -1).requires_grad_(True)
        v = _rand(b * Hr, l, hd, dtype=dt, device=dev, grad=True)
        return autograd_passes([p, v], lambda: torch.bmm(p, v))
    if op in ("attn_mask_fill", "softmax", "fused_masked_softmax"):
        heads = d["H"] if op == "fused_masked_softmax" else d["Hr"]
        x = _rand(b, heads, l, l, dtype=dt, device=dev, grad=True)
        mask = torch.ones(l, l, dtype=torch.bool, device=dev).triu_(1)
        if op == "attn_mask_fill":
            return autograd_passes([x], lambda: x.masked_fill(mask, -10000.0))
        if op == "softmax":
            return autograd_passes([x], lambda: torch.softmax(x, dim=-1))
        scale = 1.0 / math.sqrt(max(1, (d["h"] or 64 * heads) // max(1, heads)))
        return autograd_passes([x], lambda: torch.softmax((x * scale).masked_fill(mask, float("-inf")), dim=-1))
    if op == "rope":
        Hr, hd = d["Hr"], d["hd"]
        q = _rand(b, l, Hr, hd, dtype=dt, device=dev, grad=True)
        k = _rand(b, l, Hr, hd, dtype=dt, device=dev, grad=True)
        pos = torch.arange(l, device=dev, dtype=torch.float32)
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))
        emb = torch.cat([torch.outer(pos, inv)] * 2, dim=-1)
        cos = emb.cos().to(dt)[None, None].expand(b, 1, l, hd)
        sin = emb.sin().to(dt)[None, None].expand(b, 1, l, hd)

        def rope():
            qt, kt = q.transpose(1, 2), k.transpose(1, 2)
            return torch.stack([qt * cos + _rotate_half(qt) * sin, kt * cos + _rotate_half(kt) * sin])
        return autograd_passes([q, k], rope)
    if op in ("layernorm", "rmsnorm"):
        h = d["h"]
        x = _rand(M, h, dtype=dt, device=dev, grad=True)
        w = torch.ones(h, dtype=dt, device=dev, requires_grad=True)
        if op == "layernorm":
            bias = torch.zeros(h, dtype=dt, device=dev, requires_grad=True)
            return autograd_passes([x, w, bias], lambda: F.layer_norm(x, (h,), w, bias, 1e-5))
        return autograd_passes([x, w], lambda: F.rms_norm(x, (h,), w, 1e-6))
    if op == "res_add":
        a = _rand(M, d["h"], dtype=dt, device=dev)
        c = _rand(M, d["h"], dtype=dt, device=dev)
        add = (lambda: None, lambda _: torch.add(a, c))
        return {"fwd": add, "bwd": add}
    if op in ("gelu", "swiglu"):
        n = d["ffn"] // d["tp"]
        x = _rand(M, n, dtype=dt, device=dev, grad=True)
        if op == "gelu":
            return autograd_passes([x], lambda: F.gelu(x, approximate="tanh"))
        u = _rand(M, n, dtype=dt, device=dev, grad=True)
        return autograd_passes([x, u], lambda: F.silu(x) * u)
    if op == "cross_entropy":
        logits = _rand(M, d["Vpr"], dtype=dt, device=dev, grad=True)
        target = torch.randint(0, d["Vpr"], (M,), device=dev)
        return autograd_passes([logits], lambda: F.cross_entropy(logits.float(), target))
    if op == "optimizer":
        return {"step": _adamw(shape, dev)}
    raise KeyError(f"no sampler for op '{op}'")


def optimizer_tensor_shapes(hidden: int, layers: int, tp: int = 1, vocab: int = 50257) -> list[tuple[int, ...]]:
    """GPT-style parameter tensors one rank holds: 12 per layer (split by tp where Megatron splits),
    the vocab-parallel embedding and a final LayerNorm."""
    h, t = hidden, tp
    layer = [(3 * h // t, h), (3 * h // t,), (h, h // t), (h,), (h,), (h,), (h,), (h,),
             (4 * h // t, h), (4 * h // t,), (h, 4 * h // t), (h,)]
    return layer * layers + [(padded_vocab(vocab, tp) // tp, h), (h,), (h,)]


def optimizer_params(hidden: int, layers: int, tp: int = 1, vocab: int = 50257) -> int:
    return sum(math.prod(s) for s in optimizer_tensor_shapes(hidden, layers, tp, vocab))


def _adamw(shape: dict[str, int | None], dev) -> Pass:
    h, L, tp = int(shape["hidden"]), int(shape["layers"]), int(shape.get("tp") or 1)
    vocab = int(shape.get("vocab") or 50257)
    params = [torch.nn.Parameter(torch.randn(s, device=dev) * 0.02) for s in optimizer_tensor_shapes(h, L, tp, vocab)]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt = torch.optim.AdamW(params, lr=1e-4)
    return (lambda: None, lambda _: opt.step())


# --------------------------------------------------------------------------- FP8 GEMMs
FP8_MIN_CAPABILITY = (8, 9)  # Ada (sm_89) and Hopper (sm_90) onward have FP8 tensor cores


class Fp8Unsupported(RuntimeError):
    """FP8 GEMM sampling asked for on a device without FP8 tensor cores (a CPU, A100, V100)."""


def fp8_supported(device: str = "cuda") -> tuple[bool, str]:
    """(whether `torch._scaled_mm` FP8 GEMMs can be timed on `device`, why not)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return False, f"FP8 GEMM sampling needs a CUDA GPU with compute capability >= 8.9; {device} is not one"
    if not torch.cuda.is_available():
        return False, "FP8 GEMM sampling needs CUDA; torch.cuda.is_available() is False"
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return False, f"this torch ({torch.__version__}) has no torch._scaled_mm / float8 dtypes"
    cap = torch.cuda.get_device_capability(dev)
    if cap < FP8_MIN_CAPABILITY:
        return False, (f"{torch.cuda.get_device_name(dev)} has compute capability {cap[0]}.{cap[1]} < 8.9: no FP8 "
                       "tensor cores (use an Ada / Hopper / Blackwell GPU)")
    return True, ""


def build_fp8_gemm(op: str, shape: dict[str, int | None], device: str = "cuda") -> dict[str, Pass]:
    """{pass: (setup, run)} timing the FP8 GEMMs of projection `op` as Transformer Engine runs them, with
    `torch._scaled_mm` (per-tensor scales, BF16 output): fwd Y = X W^T (e4m3 x e4m3); bwd dgrad dX = dY W
    (e5m2 x e4m3) + wgrad dW = dY^T X (e5m2 x e4m3). The FP8 cast / transpose kernels are not in these times
    (predictor.step.fp8 models them as memory-bound work). Raises Fp8Unsupported (with the reason) where the device
    has no FP8 tensor cores, e.g. on a CPU: nothing is timed then."""
    ok, why = fp8_supported(device)
    if not ok:
        raise Fp8Unsupported(why)
    if op not in ("qkv_proj", "attn_out_proj", "mlp_up", "mlp_down"):
        raise ValueError(f"{op} does not run in FP8 (predictor.step.fp8.FP8_GEMM_OPS)")
    M, N, K = gemm_mnk(op, shape)
    if any(v % 16 for v in (M, N, K)):
        raise ValueError(f"FP8 GEMMs need M, N, K multiples of 16, got {(M, N, K)}")
    dev = torch.device(device)
    e4, e5, bf = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16
    one = torch.ones((), dtype=torch.float32, device=dev)
    x = torch.randn(M, K, device=dev, dtype=bf).to(e4)
    x_t = x.t().contiguous()                           # TE's cast-transpose output, for wgrad
    w = (torch.randn(N, K, device=dev, dtype=bf) / math.sqrt(K)).to(e4)
    w_t = w.t().contiguous()
    dy = torch.randn(M, N, device=dev, dtype=bf).to(e5)
    dy_t = dy.t().contiguous()

    def fwd(_):
        return torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=bf)

    def bwd(_):
        dx = torch._scaled_mm(dy, w_t.t(), scale_a=one, scale_b=one, out_dtype=bf)
        dw = torch._scaled_mm(dy_t, x_t.t(), scale_a=one, scale_b=one, out_dtype=bf)
        return dx, dw
    return {"fwd": (lambda: None, fwd), "bwd": (lambda: None, bwd)}

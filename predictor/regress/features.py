"""Operator and collective features, and the analytic roofline the regressors normalise by.

One code path for training and prediction: everything here is a pure function of the
shape columns (`ops.SHAPE_COLUMNS`), the device spec and the precision. Nothing depends
on a platform id, so a model trained on one device can be evaluated with another
device's spec (the roofline and the wave counts move with the device).

Shape semantics follow `predictor/model/ops.py`: `tp` is the tensor-parallel degree the shape is
already divided by, `heads` / `kv_heads` / `ffn_hidden` / `vocab` are whole-model values
(NULL = heads / 4*hidden / 50257), and per-rank widths are derived here.

Work model (forward; backward in brackets):
  GEMM [M,K]x[K,N]:   flops 2MNK (4MNK: dgrad + wgrad),
                      bytes e(MK+KN+MN) (2e(MK+KN+MN))
  qkv_proj            M=b*l, K=hidden, N=(heads+2*kv_heads)*head_dim/tp
  attn_out_proj       M=b*l, K=hidden/tp, N=hidden
  mlp_up              M=b*l, K=hidden, N=ffn/tp
  mlp_down            M=b*l, K=ffn/tp, N=hidden
  lm_head             M=b*l, K=hidden, N=Vp/tp (Vp = vocab padded to a multiple of 128*tp)
  gemm                M=b*l (= m), K=hidden (= k), N=ffn_hidden (= n): a generic GEMM grid
  attn_scores         b*heads/tp batched [l,hd]x[hd,l]
  attn_context        b*heads/tp batched [l,l]x[l,hd]
  flash_attn          4*b*(h/tp)*l^2*hd flops, non-causal as the paper sampled (bwd 2.5x:
                      five GEMMs against two), bytes Q,K,V,O (bwd + dO, dQ, dK, dV); a regressor of a
                      causal kernel normalises by its tile work instead (`causal_tile_work`)
  memory-bound ops    bytes = passes * e * elements (see `_ELEMENTWISE_PASSES`)
  optimizer           bytes = params * 28 (read fp32 master/m/v + fp16 grad, write fp32
                      master/m/v + fp16 param), ~12 flops per parameter

Collectives: `message_bytes` is the buffer one rank hands to the collective, as the paper
sampled it: allreduce and reducescatter the full input buffer, allgather the per-rank
INPUT (its output is ranks x larger), p2p the tensor sent.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

from predictor.model import ops
from predictor.model.specs import BYTES_PER_ELEMENT

if TYPE_CHECKING:
    import pandas as pd


def _pandas():
    """pandas, imported on first use (the prediction path passes numpy arrays and never needs it)."""
    import pandas
    return pandas


def _is_frame(x: Any) -> TypeGuard[pd.DataFrame]:
    pdm = sys.modules.get("pandas")
    return pdm is not None and isinstance(x, pdm.DataFrame)


def _is_series(x: Any) -> bool:
    pdm = sys.modules.get("pandas")
    return pdm is not None and isinstance(x, pdm.Series)

LAUNCH_LATENCY_S = 5e-6
DEFAULT_VOCAB = 50257
VOCAB_PAD_MULTIPLE = 128
OPTIMIZER_BYTES_PER_PARAM = 28.0
OPTIMIZER_FLOPS_PER_PARAM = 12.0
OPTIMIZER_VARIANTS = {"whole": 0.0, "first": 1.0, "middle": 2.0, "last": 3.0}
# generic GEMM grids (m = b*l, k = hidden, n = ffn_hidden): BF16 and one per low-precision format (ops.FORMAT_GEMMS)
GRID_GEMM_OPS = ("gemm", *(f.op for f in ops.FORMAT_GEMMS.values()))
GEMM_OPS = ("qkv_proj", "attn_out_proj", "mlp_up", "mlp_down", "lm_head", *GRID_GEMM_OPS)
BMM_OPS = ("attn_scores", "attn_context")
# GEMMs that run on the tensor cores (the linear layers and the batched attention GEMMs), and with flash attention
# the operators whose time is set by tensor-core throughput (floored at FLOPs / achievable matmul rate)
TENSOR_CORE_GEMM_OPS = GEMM_OPS + BMM_OPS
COMPUTE_BOUND_OPS = TENSOR_CORE_GEMM_OPS + ("flash_attn",)

# bytes moved = passes * element_bytes * elements, (fwd, bwd)
_ELEMENTWISE_PASSES = {
    "attn_mask_fill": (2.0, 2.0),        # in-place masked_fill r+w; bwd grad.masked_fill r+w
    "softmax": (2.0, 3.0),               # fwd read x write y; bwd read y, dy write dx
    "fused_masked_softmax": (2.0, 3.0),
    "rope": (4.0, 4.0),                  # q,k read and written (cos/sin tables added separately)
    "layernorm": (2.0, 3.0),             # fwd read x write y; bwd read x, dy write dx
    "rmsnorm": (2.0, 3.0),
    "res_add": (3.0, 3.0),               # the paper reports one value for both passes
    "gelu": (2.0, 3.0),
    "swiglu": (3.0, 5.0),                # gate, up -> out; bwd gate, up, dy -> dgate, dup
    "cross_entropy": (8.0, 3.0),         # max, sub_, exp, sum, div_ (fwd); softmax - onehot, * dy (bwd)
    "embedding": (2.0, 2.0),             # gather rows r+w; bwd dY read + rows written (+ zeroed table)
    "moe_router": (6.0, 6.0),            # on the [b*l, experts] logits: write, softmax r+w, top-k read, probs ...
    "moe_permute": (2.0, 2.0),           # gather the routed rows r+w; bwd scatter-add of the gradient rows
    "moe_unpermute": (3.0, 3.0),         # expert rows read, x prob, summed into the token rows; bwd likewise
}
_FLOPS_PER_ELEMENT = {
    "attn_mask_fill": (1.0, 1.0), "softmax": (5.0, 4.0), "fused_masked_softmax": (6.0, 4.0),
    "rope": (3.0, 3.0), "layernorm": (8.0, 12.0), "rmsnorm": (5.0, 9.0), "res_add": (1.0, 1.0),
    "gelu": (8.0, 16.0), "swiglu": (6.0, 12.0), "cross_entropy": (6.0, 3.0), "embedding": (0.0, 1.0),
    "moe_router": (8.0, 8.0), "moe_permute": (0.0, 1.0), "moe_unpermute": (2.0, 3.0),
}

COLLECTIVE_FEATURES = ("log2_msg", "log2_wire_bytes", "ranks", "nodes", "gpus_per_node",
                       "inter_node", "log2_link_gbps", "log2_roofline", "log2_t_bw", "log2_t_lat",
                       "msg_per_rank_log2")


# --------------------------------------------------------------------------- shapes
_KEY_COLUMNS = (*ops.OP_SHAPE_COLUMNS, "variant")


def _scalar(v: Any) -> float:
    if v is None or isinstance(v, str) or (sys.modules.get("pandas") is not None and v is _pandas().NA):
        return np.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return np.nan


def scalar_row(shapes: pd.DataFrame | Mapping[str, Any]) -> dict[str, Any] | None:
    """The one row of `shapes` as {column: python scalar} (None = NULL), or None if it is not one row.
    Cheap (no pandas per-column work); used for the fast single-row path and as a cache key."""
    row: Mapping[str, Any]
    if _is_frame(shapes):
        if len(shapes) != 1:
            return None
        vals = shapes.to_numpy(dtype=object)[0]
        row = dict(zip(shapes.columns, vals))
    elif isinstance(shapes, Mapping):
        row = shapes
    else:
        return None
    out: dict[str, Any] = {}
    for c in _KEY_COLUMNS:
        v = row.get(c)
        if isinstance(v, (list, tuple, np.ndarray)) or _is_series(v):
            return None
        if c == "variant":
            out[c] = v if isinstance(v, str) else None
        else:
            f = _scalar(v)
            out[c] = None if f != f else f
    return out


def arrays_from_shapes(shapes: list[tuple], variant: str | Sequence[str | None] | None = None
                       ) -> dict[str, np.ndarray]:
    """`shape_arrays` of shape tuples (values in ops.SHAPE_COLUMNS order, None = NULL), all with one
    optimizer `variant` or one per shape (a sequence as long as `shapes`): the fast path of the predictor (no
    pandas)."""
    n_cols = len(ops.OP_SHAPE_COLUMNS)  # a tuple without the trailing head_dim has it NULL
    a = np.array([[np.nan if v is None else v for v in shp] + [np.nan] * (n_cols - len(shp)) for shp in shapes],
                 dtype="float64")
    a = a.reshape(len(shapes), n_cols)
    out = {c: a[:, j] for j, c in enumerate(ops.OP_SHAPE_COLUMNS)}
    if variant is None or isinstance(variant, str):
        out["variant"] = np.full(len(shapes), OPTIMIZER_VARIANTS.get(variant, 0.0) if variant else 0.0)
    else:
        out["variant"] = np.array([OPTIMIZER_VARIANTS.get(v, 0.0) if v else 0.0 for v in variant], dtype="float64")
    return out


def _is_shape_arrays(shapes: Any) -> bool:
    return (isinstance(shapes, dict) and len(shapes) == len(_KEY_COLUMNS)
            and all(isinstance(shapes.get(c), np.ndarray) and shapes[c].dtype == np.float64 for c in _KEY_COLUMNS))


def shape_arrays(shapes: pd.DataFrame | Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Shape columns as float64 arrays (NaN = NULL), from a DataFrame or a mapping of scalars/arrays."""
    if _is_shape_arrays(shapes):  # already arrays (arrays_from_shapes)
        return shapes  # type: ignore[return-value]
    row = scalar_row(shapes) if not _is_frame(shapes) or len(shapes) == 1 else None
    out: dict[str, np.ndarray]
    if row is not None:  # fast path: one row of scalars
        out = {c: np.array([np.nan if row[c] is None else row[c]], dtype="float64") for c in ops.OP_SHAPE_COLUMNS}
        out["variant"] = np.array([OPTIMIZER_VARIANTS.get(row["variant"], 0.0) if row["variant"] else 0.0])
        return out
    if _is_frame(shapes):
        n = len(shapes)
        get = shapes.get
    else:
        vals = [np.atleast_1d(np.asarray(v, dtype=object)) for v in shapes.values()]
        n = max((len(v) for v in vals), default=1)
        get = shapes.get
    out = {}
    for c in (*ops.OP_SHAPE_COLUMNS, "variant"):
        v = get(c)
        if c == "variant":
            if v is None:
                out[c] = np.zeros(n)
            else:
                arr = np.atleast_1d(np.asarray(v, dtype=object))
                arr = np.broadcast_to(arr, (n,)) if arr.shape != (n,) else arr
                out[c] = np.array([OPTIMIZER_VARIANTS.get(x, 0.0) if isinstance(x, str) else 0.0 for x in arr])
            continue
        if v is None:
            out[c] = np.full(n, np.nan)
            continue
        pd = _pandas()
        if isinstance(v, pd.Series):
            arr = pd.to_numeric(v, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
        else:
            arr = np.atleast_1d(np.asarray(pd.to_numeric(pd.Series(np.atleast_1d(v)), errors="coerce"),
                                           dtype="float64"))
        out[c] = np.broadcast_to(arr, (n,)).astype("float64") if arr.shape != (n,) else arr.astype("float64")
    return out


def _fill(x: np.ndarray, default: np.ndarray | float) -> np.ndarray:
    return np.where(np.isnan(x), default, x)


# The last `_dims` answer and the shape arrays it was computed from: the predictor asks the same arrays several times
# in a row (features, FLOPs floor, SIMT floor, FP8 casts); shape arrays are never changed in place, so identity is
# enough. One (arrays, dims) tuple, replaced whole, so concurrent threads see either the old pair or the new one.
_LAST_DIMS: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None] = [None]


def _dims(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Derived per-rank dimensions (all float64 arrays)."""
    last = _LAST_DIMS[0]
    if last is not None and last[0] is a:
        return last[1]
    d = _compute_dims(a)
    _LAST_DIMS[0] = (a, d)
    return d


def _compute_dims(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tp = np.maximum(_fill(a["tp"], 1.0), 1.0)
    b = _fill(a["batch"], 1.0)
    l = a["seq"]
    h = a["hidden"]
    H = a["heads"]
    kv = _fill(a["kv_heads"], H)
    ffn = _fill(a["ffn_hidden"], 4.0 * h)
    V = _fill(a["vocab"], float(DEFAULT_VOCAB))
    m = VOCAB_PAD_MULTIPLE * tp
    Vp = np.ceil(V / m) * m
    # head_dim: NULL (every sample, every model whose heads * head_dim = hidden) = hidden / heads
    hd = _fill(a["head_dim"], h / H) if "head_dim" in a else h / H
    Hr = H / tp
    KVr = np.maximum(kv / tp, 1.0)
    # experts behind a MoE router: its weight is hidden x experts (`params`)
    E = np.maximum(np.round(a["params"] / h), 1.0)
    return dict(tp=tp, b=b, l=l, h=h, H=H, kv=kv, ffn=ffn, V=V, Vp=Vp, Vpr=Vp / tp, hd=hd, Hr=Hr, KVr=KVr, E=E,
                hd_given=a["head_dim"] if "head_dim" in a else np.full_like(h, np.nan))


def derived_dims(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The per-rank dimensions (`gemm_mnk`'s input) of `shape_arrays` output."""
    return _dims(a)


def optimizer_params(a: dict[str, np.ndarray]) -> np.ndarray:
    """Parameters on one GPU for an optimizer sample: `params` when given, else a GPT estimate
    from hidden, layers, tp and the stage variant (first holds the embedding, last the head)."""
    d = _dims(a)
    h, tp = d["h"], d["tp"]
    layers = _fill(a["layers"], 1.0)
    layer = 12.0 * h * h / tp + 13.0 * h  # matrices split by tp, norms/biases not (as the store's ingest)
    est = layers * layer
    var = a["variant"]
    est = est + np.where((var == 1.0) | (var == 3.0) | (var == 0.0), d["Vpr"] * h, 0.0)
    est = est + np.where(var == 3.0, 2.0 * h, 0.0)
    return np.where(np.isnan(a["params"]), est, a["params"])


def gemm_mnk(op: str, d: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(M, N, K, batch_count) of the GEMM an op performs (forward)."""
    one = np.ones_like(d["tp"])
    M = d["b"] * d["l"]
    if op == "qkv_proj":
        qkv_width = np.where(np.isnan(d["H"]), 3.0 * d["h"] / d["tp"], (d["Hr"] + 2.0 * d["KVr"]) * d["hd"])
        return M, qkv_width, d["h"], one
    if op == "attn_out_proj":  # input heads/tp * head_dim wide (hidden/tp unless head_dim is decoupled)
        k_in = np.where(np.isnan(d["hd_given"]), d["h"] / d["tp"], d["Hr"] * d["hd"])
        return M, d["h"], k_in, one
    if op == "mlp_up" or op in GRID_GEMM_OPS:  # a grid GEMM: m = b*l, k = hidden, n = ffn_hidden (tp = 1)
        return M, d["ffn"] / d["tp"], d["h"], one
    if op == "mlp_down":
        return M, d["h"], d["ffn"] / d["tp"], one
    if op == "lm_head":
        return M, d["Vpr"], d["h"], one
    if op == "attn_scores":
        return d["l"], d["l"], d["hd"], d["b"] * d["Hr"]
    if op == "attn_context":
        return d["l"], d["hd"], d["l"], d["b"] * d["Hr"]
    raise KeyError(f"{op} is not a GEMM op")


def elements(op: str, d: dict[str, np.ndarray]) -> np.ndarray:
    """Elements a memory-bound op streams (per tensor)."""
    if op in ("attn_mask_fill", "softmax", "fused_masked_softmax"):
        return d["b"] * d["Hr"] * d["l"] * d["l"]
    if op == "rope":
        return d["b"] * d["l"] * d["Hr"] * d["hd"]
    if op in ("layernorm", "rmsnorm", "res_add", "embedding"):
        return d["b"] * d["l"] * d["h"]
    if op in ("gelu", "swiglu"):
        return d["b"] * d["l"] * d["ffn"] / d["tp"]
    if op == "cross_entropy":
        return d["b"] * d["l"] * d["Vpr"]
    if op == "moe_router":  # the router's logits: one per token and expert
        return d["b"] * d["l"] * d["E"]
    if op in ("moe_permute", "moe_unpermute"):
        return d["b"] * d["l"] * d["h"]
    raise KeyError(f"{op} is not a memory-bound op")


# --------------------------------------------------------------------------- work / roofline
def _work(op: str, pass_: str, a: dict[str, np.ndarray], precision: str,
          d: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    e = float(BYTES_PER_ELEMENT.get(precision, 2))
    d = _dims(a) if d is None else d
    bwd = pass_ == "bwd"
    if op in GEMM_OPS or op in BMM_OPS:
        M, N, K, B = gemm_mnk(op, d)
        flops = 2.0 * M * N * K * B
        byts = e * B * (M * K + K * N + M * N)
        if bwd:
            flops, byts = 2.0 * flops, 2.0 * byts
        return flops, byts
    if op == "flash_attn":
        b, Hr, KVr, l, hd = d["b"], d["Hr"], d["KVr"], d["l"], d["hd"]
        flops = 4.0 * b * Hr * l * l * hd
        if bwd:
            return 2.5 * flops, e * b * l * hd * (4.0 * Hr + 4.0 * KVr)
        return flops, e * b * l * hd * (2.0 * Hr + 2.0 * KVr)
    if op == "optimizer":
        p = optimizer_params(a)
        return OPTIMIZER_FLOPS_PER_PARAM * p, OPTIMIZER_BYTES_PER_PARAM * p
    if op in _ELEMENTWISE_PASSES:
        n = elements(op, d)
        k = 1 if bwd else 0
        byts = _ELEMENTWISE_PASSES[op][k] * e * n
        flops = _FLOPS_PER_ELEMENT[op][k] * n
        if op == "rope":
            byts = byts + 2.0 * 4.0 * d["l"] * d["hd"]  # fp32 cos/sin tables
        elif op == "embedding" and bwd:
            byts = byts + e * d["Vpr"] * d["h"]  # dense weight-grad table zeroed / written
        elif op == "cross_entropy":
            byts = byts + 16.0 * d["b"] * d["l"]  # targets, per-token max/sum/loss
        elif op == "moe_router":  # + the [b*l, hidden] x [hidden, experts] GEMM (bwd: dgrad + wgrad)
            g = 2.0 * d["b"] * d["l"] * d["h"] * d["E"] * (2.0 if bwd else 1.0)
            flops = flops + g
            byts = byts + e * (d["b"] * d["l"] * d["h"] + d["h"] * d["E"]) * (2.0 if bwd else 1.0)
        return flops, byts
    raise KeyError(f"unknown op '{op}' (known: {', '.join(ops.OPS)})")


def op_work(op: str, shapes: pd.DataFrame | Mapping[str, Any], precision: str = "fp16",
            pass_: str = "fwd") -> tuple[np.ndarray, np.ndarray]:
    """(flops, bytes moved) per row for `op` in pass `pass_` ('fwd' default, 'bwd', 'step')."""
    return _work(op, pass_, shape_arrays(shapes), precision)


# The query / key block a FlashAttention kernel tiles the score matrix by (FlashAttention-2 and the Hopper /
# Blackwell FMHA kernels of cuDNN / TensorRT-LLM: 128 query rows per CTA)
ATTENTION_TILE = 128


def causal_tile_work(seq: np.ndarray, overhead_tiles: float) -> np.ndarray:
    """The work of a causal FlashAttention kernel as a share of the non-causal l^2 score work: each of the
    nb = ceil(l / 128) query blocks is one CTA that walks the key blocks on and below the diagonal (i + 1 of
    them, nb(nb+1)/2 in all: FlashAttention-2 skips the blocks above it), plus a fixed cost per query block
    (load Q, the diagonal block's mask, the softmax rescale, write O and the log-sum-exp) worth
    `overhead_tiles` key-block iterations: (nb(nb+1)/2 + c nb) / nb^2. c = 0 is the tile count alone."""
    nb = np.maximum(1.0, np.ceil(np.asarray(seq, dtype="float64") / ATTENTION_TILE))
    return (nb * (nb + 1.0) / 2.0 + float(overhead_tiles) * nb) / (nb * nb)


def _roofline_parts(op, pass_, a, device, precision, d=None):
    flops, byts = _work(op, pass_, a, precision, d)
    t_c = flops / device.peak_flops(precision)
    t_m = byts / device.hbm_bytes_per_s
    return flops, byts, t_c, t_m


# A fused single-pass memory-bound kernel (Transformer Engine / Megatron-Core fusions) moves its bytes at about this
# fraction of the HBM bandwidth: an assumption stated with every such prediction, not fitted to any run
FUSED_BANDWIDTH_EFFICIENCY = 0.8


def fused_kernel_s(op: str, pass_: str, shapes: pd.DataFrame | Mapping[str, Any], device,
                   precision: str = "fp16") -> np.ndarray:
    """Seconds of a memory-bound operator run as one fused kernel: its minimal bytes (`_ELEMENTWISE_PASSES`) at
    FUSED_BANDWIDTH_EFFICIENCY of the HBM bandwidth (its FLOPs at the peak where they dominate), plus one launch."""
    _, _, t_c, t_m = _roofline_parts(op, pass_, shape_arrays(shapes), device, precision)
    return np.maximum(t_c, t_m / FUSED_BANDWIDTH_EFFICIENCY) + LAUNCH_LATENCY_S


def roofline_s(op: str, pass_: str, shapes: pd.DataFrame | Mapping[str, Any], device,
               precision: str = "fp16") -> np.ndarray:
    """max(flops / peak, bytes / HBM bandwidth) + a fixed launch latency, in seconds."""
    _, _, t_c, t_m = _roofline_parts(op, pass_, shape_arrays(shapes), device, precision)
    return np.maximum(t_c, t_m) + LAUNCH_LATENCY_S


# --------------------------------------------------------------------------- op features
def _log2(x: np.ndarray) -> np.ndarray:
    return np.log2(np.maximum(x, 1e-30))  # NaN stays NaN; no errstate context (hot path)


def _align(x: np.ndarray, cap: int = 8) -> np.ndarray:
    """log2 of the largest power of two dividing x (capped): 3 = multiple of 8, 7 = of 128."""
    xi = np.where(np.isfinite(x), x, 0.0).astype(np.int64)
    low = xi & -xi
    out = np.where(xi > 0, np.log2(np.maximum(low, 1)), np.nan)
    return np.minimum(out, cap)


def _waves(tiles: np.ndarray, sm: int) -> tuple[np.ndarray, np.ndarray]:
    sm = max(int(sm or 1), 1)
    waves = tiles / sm
    eff = waves / np.maximum(np.ceil(waves), 1.0)
    return waves, eff


_COMMON = ("log2_flops", "log2_bytes", "log2_ai", "log2_roofline", "log2_t_compute", "log2_t_memory", "bound_ratio",
           "log2_bytes_over_l2")
_GEMM_FEATS = ("log2_M", "log2_N", "log2_K", "align_M", "align_N", "align_K", "log2_tiles", "waves", "wave_eff",
               "wave_eff_256", "tp", "batch", "log2_seq", "log2_hidden")
_BMM_FEATS = _GEMM_FEATS + ("log2_batch_count", "heads_per_rank", "head_dim")
_FLASH_FEATS = ("log2_seq", "head_dim", "heads_per_rank", "kv_heads_per_rank", "batch", "tp", "log2_hidden",
                "log2_ctas", "waves", "wave_eff", "align_seq")
_ELT_FEATS = ("log2_elements", "log2_row_len", "align_row_len", "log2_rows", "tp", "batch", "log2_seq",
              "log2_hidden", "heads_per_rank", "head_dim", "log2_table_over_l2", "log2_vocab_shard",
              "log2_tokens_per_vocab")
_OPT_FEATS = ("log2_params", "layers", "tp", "log2_hidden", "variant", "log2_tensors", "log2_params_per_tensor")


def feature_names(op: str) -> tuple[str, ...]:
    """The feature columns `op_features` returns for `op`, in order."""
    if op in GEMM_OPS:
        return _COMMON + _GEMM_FEATS
    if op in BMM_OPS:
        return _COMMON + _BMM_FEATS
    if op == "flash_attn":
        return _COMMON + _FLASH_FEATS
    if op == "optimizer":
        return _COMMON + _OPT_FEATS
    if op in _ELEMENTWISE_PASSES:
        return _COMMON + _ELT_FEATS
    raise KeyError(f"unknown op '{op}'")


def op_feature_matrix(op: str, pass_: str, a: dict[str, np.ndarray], device, precision: str = "fp16",
                      causal_overhead_tiles: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(X float64 [n, len(feature_names(op))], roofline seconds [n]) from `shape_arrays` output.
    The fast path used by both training and prediction. `causal_overhead_tiles` (flash_attn only): the
    regressor times a causal kernel, whose FLOPs and compute roofline are its tile work
    (`causal_tile_work`); None = the non-causal l^2 work.

    Every `log2_*` feature (and `bound_ratio`) is `_log2` of a positive quantity; they are gathered first and
    taken in one call (a prediction's shapes are a few rows, where each numpy call costs more than its
    arithmetic), with the same numbers as one `_log2` each."""
    d = _dims(a)
    flops, byts, t_c, t_m = _roofline_parts(op, pass_, a, device, precision, d)
    if op == "flash_attn" and causal_overhead_tiles is not None:
        k = causal_tile_work(d["l"], causal_overhead_tiles)
        flops, t_c = flops * k, t_c * k
    roof = np.maximum(t_c, t_m) + LAUNCH_LATENCY_S
    n_rows = len(roof)
    l2 = max(float(getattr(device, "l2_mib", 0.0) or 0.0), 1.0) * 2.0 ** 20
    logs: dict[str, Any] = {   # feature -> the quantity it is the log2 of
        "log2_flops": flops, "log2_bytes": byts, "log2_ai": flops / np.maximum(byts, 1.0), "log2_roofline": roof,
        "log2_t_compute": t_c, "log2_t_memory": t_m,
        "bound_ratio": np.maximum(t_c, 1e-30) / np.maximum(t_m, 1e-30), "log2_bytes_over_l2": byts / l2,
        "log2_seq": d["l"], "log2_hidden": d["h"]}
    plain: dict[str, Any] = {"tp": d["tp"], "batch": d["b"], "heads_per_rank": d["Hr"], "head_dim": d["hd"],
                             "kv_heads_per_rank": d["KVr"]}
    sm = getattr(device, "sm_count", 0)
    if op in GEMM_OPS or op in BMM_OPS:
        M, N, K, B = gemm_mnk(op, d)
        tiles = np.ceil(M / 128.0) * np.ceil(N / 128.0) * B
        waves, eff = _waves(tiles, sm)
        _, eff256 = _waves(np.ceil(M / 256.0) * np.ceil(N / 128.0) * B, sm)
        align = _align(np.array((M, N, K)))
        logs.update(log2_M=M, log2_N=N, log2_K=K, log2_tiles=tiles, log2_batch_count=B)
        plain.update(align_M=align[0], align_N=align[1], align_K=align[2], waves=waves, wave_eff=eff,
                     wave_eff_256=eff256)
    elif op == "flash_attn":
        ctas = d["b"] * d["Hr"] * np.ceil(d["l"] / 128.0)
        waves, eff = _waves(ctas, sm)
        logs.update(log2_ctas=ctas)
        plain.update(waves=waves, wave_eff=eff, align_seq=_align(d["l"]))
    elif op == "optimizer":
        p = optimizer_params(a)
        layers = _fill(a["layers"], 1.0)
        tensors = layers * 12.0 + np.where(a["variant"] == 2.0, 0.0, 2.0)
        logs.update(log2_params=p, log2_tensors=tensors, log2_params_per_tensor=p / tensors)
        plain.update(layers=layers, variant=a["variant"])
    else:
        e = float(BYTES_PER_ELEMENT.get(precision, 2))
        n = elements(op, d)
        if op in ("attn_mask_fill", "softmax", "fused_masked_softmax"):
            row = d["l"]
        elif op == "cross_entropy":
            row = d["Vpr"]
        elif op == "rope":
            row = d["hd"]
        elif op == "moe_router":
            row = d["E"]
        elif op in ("gelu", "swiglu"):
            row = d["ffn"] / d["tp"]
        else:
            row = d["h"]
        # the vocab shard an embedding gathers from (L2-resident when small); NaN for other ops
        nan = np.full(n_rows, np.nan)
        vocab_op = op in ("embedding", "cross_entropy")
        logs.update(log2_elements=n, log2_row_len=row, log2_rows=n / row,
                    log2_table_over_l2=d["Vpr"] * d["h"] * e / l2 if op == "embedding" else nan,
                    log2_vocab_shard=d["Vpr"] if vocab_op else nan,
                    log2_tokens_per_vocab=d["b"] * d["l"] / d["Vpr"] if vocab_op else nan)
        plain.update(align_row_len=_align(row))
    names = feature_names(op)
    X = np.empty((n_rows, len(names)), dtype=np.float64)
    log_cols = [j for j, name in enumerate(names) if name in logs]
    X[:, log_cols] = _log2(np.array([logs[names[j]] for j in log_cols])).T
    for j, name in enumerate(names):
        if name not in logs:
            X[:, j] = plain[name]
    return X, roof


def op_features(op: str, pass_: str, shapes: pd.DataFrame | Mapping[str, Any], device,
                precision: str = "fp16", causal_overhead_tiles: float | None = None) -> pd.DataFrame:
    """Model features for `op` / `pass_` (columns = `feature_names(op)`)."""
    X, _ = op_feature_matrix(op, pass_, shape_arrays(shapes), device, precision, causal_overhead_tiles)
    return _pandas().DataFrame(X, columns=list(feature_names(op)))


# --------------------------------------------------------------------------- collectives
def _collective_parts(collective: str, message_bytes, nodes, gpus_per_node, platform):
    S = np.asarray(message_bytes, dtype="float64")
    nodes = np.asarray(nodes, dtype="float64")
    gpn = np.asarray(gpus_per_node, dtype="float64")
    S, nodes, gpn = np.broadcast_arrays(np.atleast_1d(S), np.atleast_1d(nodes), np.atleast_1d(gpn))
    n = nodes * gpn
    intra, inter = platform.intra_node, platform.inter_node
    intra_bw = (intra.bandwidth_gbps or 0.0) * 1e9
    inter_bw = (inter.bandwidth_gbps or 0.0) * 1e9
    multi = nodes > 1
    # slowest tier dominates a ring spanning nodes
    bw = np.where(multi, inter_bw if inter_bw > 0 else intra_bw,
                  intra_bw if intra_bw > 0 else inter_bw)
    if intra_bw > 0 and inter_bw > 0:
        bw = np.where(multi, min(intra_bw, inter_bw), intra_bw)
    bw = np.maximum(bw, 1e6)
    lat = np.where(multi, inter.latency_us or intra.latency_us, intra.latency_us or inter.latency_us) * 1e-6
    frac = (n - 1.0) / np.maximum(n, 1.0)
    if collective == "allreduce":
        wire, steps = 2.0 * frac * S, 2.0 * (n - 1.0)
    elif collective == "allgather":
        wire, steps = (n - 1.0) * S, n - 1.0          # S = per-rank input
    elif collective in ("reducescatter", "alltoall"):
        wire, steps = frac * S, n - 1.0               # S = full input buffer
    elif collective == "p2p":
        wire, steps = S, np.ones_like(S)
    else:
        raise KeyError(f"unknown collective '{collective}' (known: {', '.join(ops.COLLECTIVES)})")
    t_bw = wire / bw
    t_lat = np.maximum(steps, 1.0) * lat + LAUNCH_LATENCY_S
    return S, nodes, gpn, n, bw, wire, t_bw, t_lat


def collective_roofline_s(collective: str, message_bytes, nodes, gpus_per_node, platform) -> np.ndarray:
    """Ring alpha-beta estimate in seconds: bytes on the wire / slowest-tier bandwidth + steps * latency."""
    *_, t_bw, t_lat = _collective_parts(collective, message_bytes, nodes, gpus_per_node, platform)
    return t_bw + t_lat


def collective_feature_matrix(collective: str, message_bytes, nodes, gpus_per_node, platform
                              ) -> tuple[np.ndarray, np.ndarray]:
    S, nodes, gpn, n, bw, wire, t_bw, t_lat = _collective_parts(collective, message_bytes, nodes,
                                                               gpus_per_node, platform)
    roof = t_bw + t_lat
    f = {"log2_msg": _log2(S), "log2_wire_bytes": _log2(np.maximum(wire, 1.0)), "ranks": n, "nodes": nodes,
         "gpus_per_node": gpn, "inter_node": (nodes > 1).astype("float64"), "log2_link_gbps": _log2(bw / 1e9),
         "log2_roofline": _log2(roof), "log2_t_bw": _log2(np.maximum(t_bw, 1e-12)), "log2_t_lat": _log2(t_lat),
         "msg_per_rank_log2": _log2(S / np.maximum(n, 1.0))}
    X = np.column_stack([f[c] for c in COLLECTIVE_FEATURES]).astype("float64")
    return X, roof


def collective_features(collective: str, message_bytes, nodes, gpus_per_node, platform) -> pd.DataFrame:
    X, _ = collective_feature_matrix(collective, message_bytes, nodes, gpus_per_node, platform)
    return _pandas().DataFrame(X, columns=list(COLLECTIVE_FEATURES))

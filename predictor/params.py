"""Parameter counting, in one place: per layer, per GPU after tensor parallelism, per pipeline chunk.

Conventions (Megatron-LM, which the decomposition and the memory model follow):
  * matrices of a layer are split over `tp`; norm gains (and LayerNorm biases) are replicated;
  * the embedding is vocab-parallel: Vp * h / tp on the first chunk, Vp = vocab padded to a
    multiple of 128 * tp; the LM head holds another copy on the last chunk unless the embeddings
    are tied on a single stage (tied embeddings over pp > 1 keep a copy on both ends and
    all-reduce its gradient);
  * GPT models add a learned position embedding (s * h) on the first chunk and a final LayerNorm
    (gain + bias) on the last; Llama models a final RMSNorm gain.

Pure functions of a `ModelSpec` (typed only; no import of specs at run time, so specs can use them).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .specs import ModelSpec


def padded_vocab(vocab_size: int, tp: int = 1, multiple: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of `multiple * tp`."""
    m = multiple * tp
    return ((vocab_size + m - 1) // m) * m


def qkv_width(model: ModelSpec) -> int:
    """Output width of the fused QKV projection: (heads + 2 * kv_heads) * head_dim."""
    return (model.num_heads + 2 * model.kv_heads) * model.head_size


def layer_norm_params(model: ModelSpec) -> int:
    """Norm parameters of one layer (replicated over tp): two RMSNorm gains, or two LayerNorms (gain + bias)."""
    return 2 * model.hidden_size if model.arch == "llama" else 4 * model.hidden_size


def layer_matmul_params(model: ModelSpec) -> int:
    """Weights of the matrix multiplications of one layer (what model FLOPs count)."""
    h = model.hidden_size
    mlp = (3 if model.arch == "llama" else 2) * h * model.ffn
    return h * qkv_width(model) + model.attn_width * h + mlp  # QKV, output projection (heads*head_dim -> h), MLP


def layer_params(model: ModelSpec) -> int:
    """Parameters of one transformer layer (weights, biases, norm gains)."""
    h = model.hidden_size
    biases = 0 if model.arch == "llama" else qkv_width(model) + h + model.ffn + h
    return layer_matmul_params(model) + layer_norm_params(model) + biases


def layer_params_per_gpu(model: ModelSpec, tp: int) -> int:
    """Parameters of one layer on one GPU: matrices (and their biases) split by tp, norms replicated."""
    norm = layer_norm_params(model)
    return (layer_params(model) - norm) // tp + norm


def embedding_params_per_gpu(model: ModelSpec, tp: int) -> int:
    """The vocab-parallel embedding (or LM head) on one GPU."""
    return padded_vocab(model.vocab_size, tp) * model.hidden_size // tp


def final_norm_params(model: ModelSpec) -> int:
    return model.hidden_size if model.arch == "llama" else 2 * model.hidden_size


def position_params(model: ModelSpec, seq_len: int) -> int:
    """GPT's learned position embedding (s * h); Llama uses RoPE (no parameters)."""
    return seq_len * model.hidden_size if model.arch == "gpt" else 0


def edge_params(model: ModelSpec, tp: int, pp: int, first: bool, last: bool) -> int:
    """Embedding parameters on the first chunk, final norm + LM head on the last (without the
    position embedding, see `chunk_params`)."""
    emb = embedding_params_per_gpu(model, tp)
    n = 0
    if first:
        n += emb
    if last:
        n += final_norm_params(model)
        if not model.tied_embeddings or pp > 1:
            n += emb
    return n


def chunk_params(model: ModelSpec, tp: int, pp: int, layers: int, first: bool, last: bool, seq_len: int) -> int:
    """Parameters of one pipeline chunk on one GPU."""
    n = layers * layer_params_per_gpu(model, tp) + edge_params(model, tp, pp, first, last)
    if first:
        n += position_params(model, seq_len)
    return n


def total_params(model: ModelSpec) -> int:
    """Parameters of the whole model (unpadded vocabulary padding to 128, tied embeddings counted once)."""
    emb = padded_vocab(model.vocab_size) * model.hidden_size
    head = 0 if model.tied_embeddings else emb
    return model.num_layers * layer_params(model) + emb + head + final_norm_params(model)

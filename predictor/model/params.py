"""Parameter counting, in one place: per layer, per GPU after tensor parallelism, per pipeline chunk.

Conventions (Megatron-LM, which the decomposition and the memory model follow):
  * matrices of a layer are split over `tp`; norm gains (and LayerNorm biases) are replicated;
  * the embedding is vocab-parallel: Vp * h / tp on the first chunk, Vp = vocab padded to a
    multiple of 128 * tp; the LM head holds another copy on the last chunk unless the embeddings
    are tied on a single stage (tied embeddings over pp > 1 keep a copy on both ends and
    all-reduce its gradient);
  * GPT models add a learned position embedding (s * h) on the first chunk and a final LayerNorm
    (gain + bias) on the last; Llama models a final RMSNorm gain.

Mixture-of-Experts (Megatron-Core, expert tensor parallelism 1): a MoE layer holds the attention, the norms, a
router (hidden x experts, replicated over tp), the shared experts (split over tp like a dense MLP) and
num_experts routed experts, num_experts / ep of them on each GPU, whole (not split over tp). The leading
`dense_layers` layers keep the dense MLP. Model FLOPs count the *active* parameters (top_k routed experts).

Multi-head latent attention (ModelSpec.attention_kind "mla", docs/mla.md; DeepSeek-V2 arXiv 2405.04434 sec. 2.1,
Megatron-Core MLASelfAttention, HF DeepseekV3Attention): the query down projection W_DQ (hidden x q_lora_rank) and
its RMSNorm, the query up projection W_UQ (q_lora_rank x heads * (qk_nope + qk_rope); hidden x that when the query
is not compressed), the key / value down projection W_DKV (hidden x (kv_lora_rank + qk_rope), the shared RoPE key
included) and its RMSNorm, the key / value up projection W_UKV (kv_lora_rank x heads * (qk_nope + v_head_dim)) and
the output projection W_O (heads * v_head_dim x hidden); no biases. Megatron-Core replicates the two down projections
over tp (TELinear parallel_mode "duplicated") with the latent norms; the up projections are column-parallel and W_O
row-parallel (split over tp).

Pure functions of a `ModelSpec` (typed only; no import of specs at run time, so specs can use them).
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from predictor.model.specs import ModelSpec


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


def attention_matmul_params(model: ModelSpec) -> int:
    """QKV and output projection weights (heads * head_dim -> hidden); MLA: its five projections (`mla_down_params`
    + `mla_split_params`)."""
    if model.is_mla:
        return mla_down_params(model) + mla_split_params(model)
    return model.hidden_size * qkv_width(model) + model.attn_width * model.hidden_size


def mla_down_params(model: ModelSpec) -> int:
    """MLA's down projections, replicated over tp: W_DQ (hidden x q_lora_rank, where the query is compressed) and
    W_DKV (hidden x (kv_lora_rank + qk_rope_head_dim)); 0 for GQA attention."""
    if not model.is_mla:
        return 0
    h = model.hidden_size
    return h * (model.q_lora_rank or 0) + h * ((model.kv_lora_rank or 0) + (model.qk_rope_head_dim or 0))


def mla_split_params(model: ModelSpec) -> int:
    """MLA's projections split over tp: W_UQ (q_lora_rank, or hidden without query compression, x heads * (qk_nope +
    qk_rope)), W_UKV (kv_lora_rank x heads * (qk_nope + v_head_dim)) and W_O (heads * v_head_dim x hidden)."""
    heads, h = model.num_heads, model.hidden_size
    q_in = model.q_lora_rank or h
    return (q_in * heads * model.qk_head_size
            + (model.kv_lora_rank or 0) * heads * ((model.qk_nope_head_dim or 0) + model.v_head_size)
            + heads * model.v_head_size * h)


def mla_norm_params(model: ModelSpec) -> int:
    """MLA's latent RMSNorm gains (q_lora_rank where the query is compressed, kv_lora_rank), replicated over tp."""
    return (model.q_lora_rank or 0) + (model.kv_lora_rank or 0) if model.is_mla else 0


def attention_replicated_params(model: ModelSpec) -> int:
    """What of the attention is replicated over tp besides the layer norms: MLA's down projections and latent norms
    (0 for GQA attention)."""
    return mla_down_params(model) + mla_norm_params(model)


def attention_matmul_params_per_gpu(model: ModelSpec, tp: int) -> float:
    """The attention GEMM weights on one tensor-parallel rank (MLA: the down projections whole, the rest / tp)."""
    down = mla_down_params(model)
    return (attention_matmul_params(model) - down) / tp + down


def mlp_params(model: ModelSpec, width: int) -> int:
    """Weights of one MLP (or expert) of inner width `width`: gate + up + down for SwiGLU, up + down for GeLU."""
    return (3 if model.arch == "llama" else 2) * model.hidden_size * width


def _mlp_biases(model: ModelSpec, width: int) -> int:
    return 0 if model.arch == "llama" else width + model.hidden_size


def _attention_biases(model: ModelSpec) -> int:
    return 0 if model.arch == "llama" or model.is_mla else qkv_width(model) + model.hidden_size


def router_params(model: ModelSpec) -> int:
    return model.hidden_size * model.num_experts if model.is_moe else 0


def expert_params(model: ModelSpec) -> int:
    """One routed expert (weights and biases)."""
    return mlp_params(model, model.expert_ffn) + _mlp_biases(model, model.expert_ffn)


def shared_expert_params(model: ModelSpec) -> int:
    """All shared experts of one MoE layer (weights and biases)."""
    return model.shared_experts * (mlp_params(model, model.shared_ffn) + _mlp_biases(model, model.shared_ffn))


def layer_matmul_params(model: ModelSpec, moe: bool = False) -> int:
    """Weights of the matrix multiplications of one layer that a token passes through (what model FLOPs count): a
    dense layer's MLP, or a MoE layer's router, shared experts and top_k routed experts."""
    if moe and model.is_moe:
        ffn = (router_params(model) + model.shared_experts * mlp_params(model, model.shared_ffn)
               + (model.top_k or 0) * mlp_params(model, model.expert_ffn))
    else:
        ffn = mlp_params(model, model.ffn)
    return attention_matmul_params(model) + ffn


def layer_params(model: ModelSpec, moe: bool = False) -> int:
    """Parameters of one transformer layer (weights, biases, norm gains); `moe`: a MoE layer of a MoE model."""
    base = (attention_matmul_params(model) + _attention_biases(model) + layer_norm_params(model)
            + mla_norm_params(model))
    if moe and model.is_moe:
        return base + router_params(model) + shared_expert_params(model) + model.num_experts * expert_params(model)
    return base + mlp_params(model, model.ffn) + _mlp_biases(model, model.ffn)


@lru_cache(maxsize=4096)
def layer_params_per_gpu(model: ModelSpec, tp: int, moe: bool = False, ep: int = 1, etp: int = 1) -> int:
    """Parameters of one layer on one GPU: matrices (and their biases) split by tp, norms replicated; in a MoE layer
    the router replicated, shared experts split by tp and num_experts / ep routed experts (each split over etp)."""
    return layer_dense_params_per_gpu(model, tp, moe) + layer_expert_params_per_gpu(model, ep, moe, etp)


def layer_dense_params_per_gpu(model: ModelSpec, tp: int, moe: bool = False) -> int:
    """What of one layer on one GPU is not a routed expert (reduced over the data-parallel(-with-CP) group)."""
    norm = layer_norm_params(model) + attention_replicated_params(model)   # MLA: + down projections, latent norms
    if moe and model.is_moe:
        split = (attention_matmul_params(model) - mla_down_params(model) + _attention_biases(model)
                 + shared_expert_params(model))
        return split // tp + norm + router_params(model)
    return (layer_params(model) - norm) // tp + norm


def layer_expert_params_per_gpu(model: ModelSpec, ep: int, moe: bool = True, etp: int = 1) -> int:
    """The routed experts of one MoE layer on one GPU: num_experts / ep experts, each split over the etp ranks of
    expert tensor parallelism (fc1 by columns, fc2 by rows; Megatron-Core expert_tensor_parallel_size); 0 for a
    dense layer."""
    if not (moe and model.is_moe):
        return 0
    return model.num_experts // max(ep, 1) * expert_params(model) // max(etp, 1)


def chunk_dense_layers(model: ModelSpec, counts: list[int] | tuple[int, ...]) -> list[int]:
    """Dense-MLP layers of each chunk (pipeline order): all of a dense model's; of a MoE model the leading
    `dense_layers` layers, which fill the first chunks (and, with moe_layer_interval > 1, the interleaved dense
    layers of each chunk: ModelSpec.is_moe_layer)."""
    if not model.is_moe:
        return [int(n) for n in counts]
    if model.moe_layer_interval != 1:   # interleaved MoE layers (Llama 4 Maverick): layer by layer
        out, first = [], 0
        for n in counts:
            out.append(sum(not model.is_moe_layer(i) for i in range(first, first + int(n))))
            first += int(n)
        return out
    out, left = [], model.dense_layers
    for n in counts:
        k = min(int(n), left)
        out.append(k)
        left -= k
    return out


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


def chunk_params(model: ModelSpec, tp: int, pp: int, layers: int, first: bool, last: bool, seq_len: int,
                 dense: int | None = None, ep: int = 1, etp: int = 1) -> int:
    """Parameters of one pipeline chunk on one GPU; `dense`: how many of its layers have a dense MLP (None = all
    of a dense model's, none of a MoE model's), the rest being MoE layers with num_experts / ep experts here."""
    nd = layers if not model.is_moe else (dense or 0)
    n = (nd * layer_params_per_gpu(model, tp) + (layers - nd) * layer_params_per_gpu(model, tp, True, ep, etp)
         + edge_params(model, tp, pp, first, last))
    if first:
        n += position_params(model, seq_len)
    return n


def total_params(model: ModelSpec) -> int:
    """Parameters of the whole model (unpadded vocabulary padding to 128, tied embeddings counted once)."""
    emb = padded_vocab(model.vocab_size) * model.hidden_size
    head = 0 if model.tied_embeddings else emb
    layers = (model.num_layers - model.moe_layers) * layer_params(model) + model.moe_layers * layer_params(model, True)
    return layers + emb + head + final_norm_params(model)


def active_params(model: ModelSpec) -> int:
    """Parameters a token passes through (MoE: top_k routed experts of each MoE layer); = total for a dense model."""
    if not model.is_moe:
        return total_params(model)
    idle = model.moe_layers * (model.num_experts - (model.top_k or 0)) * expert_params(model)
    return total_params(model) - idle

"""Named model presets (published architecture hyper-parameters)."""
from __future__ import annotations

from predictor.model.errors import InfeasibleConfig
from predictor.model.specs import ModelSpec

_PRESETS: dict[str, ModelSpec] = {m.name: m for m in [
    # GPT family: LayerNorm, GeLU, MHA (Brown et al. 2020; Black et al. 2022)
    ModelSpec("gpt3-175b", "gpt", 96, 12288, 96, vocab_size=50257, tied_embeddings=True),
    ModelSpec("gpt3-13b", "gpt", 40, 5120, 40, vocab_size=50257, tied_embeddings=True),
    ModelSpec("gpt3-6.7b", "gpt", 32, 4096, 32, vocab_size=50257, tied_embeddings=True),
    ModelSpec("gpt3-2.7b", "gpt", 32, 2560, 32, vocab_size=50257, tied_embeddings=True),
    ModelSpec("gpt3-1.3b", "gpt", 24, 2048, 16, vocab_size=50257, tied_embeddings=True),
    ModelSpec("gpt-neox-20b", "gpt", 44, 6144, 64, vocab_size=50432, tied_embeddings=False),
    # Llama family: RMSNorm, RoPE, SwiGLU, GQA (Touvron et al. 2023; Llama 3 model card)
    ModelSpec("llama2-7b", "llama", 32, 4096, 32, 32, 11008, 32000, tied_embeddings=False),
    ModelSpec("llama2-13b", "llama", 40, 5120, 40, 40, 13824, 32000, tied_embeddings=False),
    ModelSpec("llama2-70b", "llama", 80, 8192, 64, 8, 28672, 32000, tied_embeddings=False),
    ModelSpec("llama3-8b", "llama", 32, 4096, 32, 8, 14336, 128256, tied_embeddings=False),
    ModelSpec("llama3-70b", "llama", 80, 8192, 64, 8, 28672, 128256, tied_embeddings=False),
    ModelSpec("llama3-405b", "llama", 126, 16384, 128, 8, 53248, 128256, tied_embeddings=False),
    ModelSpec("mistral-7b", "llama", 32, 4096, 32, 8, 14336, 32000, tied_embeddings=False),
    # Llemma-7B (Azerbayev et al. 2023), the paper's worked example, trained with GPT-NeoX
    ModelSpec("llemma-7b", "llama", 32, 4096, 32, 32, 11008, 32016, tied_embeddings=False),
    # Qwen3 dense (RMSNorm, RoPE, SwiGLU, GQA, QK-norm not counted: 2*128 gains per layer), head_dim 128
    # decoupled from hidden / heads. Qwen3-8B: the Qwen/Qwen3-8B config.json (36 layers, hidden 4096, 32 heads,
    # 8 KV heads, head_dim 128, intermediate 12288, vocab 151936, untied), as copied in
    # huggingface.co/thejaminator/qwen-hook-layer-9 commit 478fb72 ("Copy config.json from Qwen/Qwen3-8B").
    ModelSpec("qwen3-8b", "llama", 36, 4096, 32, 8, 12288, 151936, tied_embeddings=False, head_dim=128),
    # Qwen3-32B: 64 layers, hidden 5120, 64 heads (64 x 128 = 8192 != 5120), 8 KV heads, head_dim 128,
    # intermediate 25600, vocab 151936, untied: Ascend MindSpeed-RL configs/model/qwen3_32b.yaml
    # (num_attention_heads 64, num_query_groups 8, kv_channels 128, ffn_hidden_size 25600, padded_vocab_size
    # 151936, untie_embeddings_and_output_weights) and a Qwen3-32B config.json copy
    # (huggingface.co/ronnywebdevs1/d-m-1). Published size 32.8B (Qwen/Qwen3-32B model card, as quoted in
    # github.com/daniel-p-green/alain-ai-learning-platform out/research-qwen-qwen3-32b/README.md).
    ModelSpec("qwen3-32b", "llama", 64, 5120, 64, 8, 25600, 151936, tied_embeddings=False, head_dim=128),
    # Llama 3.1 405B: the architecture of Llama 3 405B (Llama 3.1 model card / config.json: 126 layers, hidden
    # 16384, 128 heads, 8 KV heads, intermediate 53248, vocab 128256); 3.1 only extends RoPE scaling to 128k.
    ModelSpec("llama3.1-405b", "llama", 126, 16384, 128, 8, 53248, 128256, tied_embeddings=False),
    # Mixture-of-Experts (predictor.model.moe). Mixtral-8x7B: mistralai/Mixtral-8x7B-v0.1 config.json (32 layers, hidden
    # 4096, 32 heads, 8 KV heads, intermediate 14336 per expert, 8 local experts, 2 per token, vocab 32000).
    ModelSpec("mixtral-8x7b", "llama", 32, 4096, 32, 8, 14336, 32000, tied_embeddings=False,
              num_experts=8, top_k=2),
    # Mixtral-8x22B: mistralai/Mixtral-8x22B-v0.1 config.json (56 layers, hidden 6144, 48 heads, 8 KV heads,
    # intermediate 16384 per expert, 8 experts, 2 per token, vocab 32768).
    ModelSpec("mixtral-8x22b", "llama", 56, 6144, 48, 8, 16384, 32768, tied_embeddings=False,
              num_experts=8, top_k=2),
    # Qwen3-30B-A3B: Qwen/Qwen3-30B-A3B config.json (48 layers, hidden 2048, 32 heads, 4 KV heads, head_dim 128,
    # 128 experts of moe_intermediate_size 768, 8 per token, no shared expert, every layer MoE, vocab 151936, untied).
    ModelSpec("qwen3-30b-a3b", "llama", 48, 2048, 32, 4, 6144, 151936, tied_embeddings=False, head_dim=128,
              num_experts=128, top_k=8, moe_ffn_hidden=768),
    # Qwen3-235B-A22B: Qwen/Qwen3-235B-A22B config.json (94 layers, hidden 4096, 64 heads, 4 KV heads, head_dim 128,
    # 128 experts of moe_intermediate_size 1536, 8 per token, no shared expert, vocab 151936, untied).
    ModelSpec("qwen3-235b-a22b", "llama", 94, 4096, 64, 4, 12288, 151936, tied_embeddings=False, head_dim=128,
              num_experts=128, top_k=8, moe_ffn_hidden=1536),
]}

# Presets whose architecture the predictor does not model yet: asked for by name, refused with the reason.
_REFUSED: dict[str, tuple[str, str]] = {
    "deepseek-v3": ("DeepSeek-V3 uses Multi-head Latent Attention (MLA: low-rank compressed keys / values with a "
                    "decoupled RoPE part), which the operator decomposition does not model yet; predicting it as "
                    "grouped-query attention would be a silently wrong number.",
                    "use qwen3-235b-a22b or mixtral-8x22b for a large MoE plan, or give the fields of a GQA "
                    "approximation yourself (61 layers, hidden 7168, 256 experts, top_k 8, moe_ffn_hidden 2048, "
                    "shared_experts 1, dense_layers 3) knowing that its attention differs."),
}


def list_presets() -> list[str]:
    return sorted(_PRESETS)


def get_preset(name: str) -> ModelSpec:
    key = name.strip().lower()
    if key in _REFUSED:
        raise InfeasibleConfig("model", f"'{name}' is not supported yet: {_REFUSED[key][0]}", _REFUSED[key][1])
    if key not in _PRESETS:
        raise InfeasibleConfig("model", f"unknown model preset '{name}'.",
                               f"use one of {', '.join(list_presets())}, or give the fields "
                               "(--arch --layers --hidden --heads ...).")
    return _PRESETS[key]

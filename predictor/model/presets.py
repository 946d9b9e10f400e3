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
    # --- Multi-head latent attention presets (docs/mla.md) ---
    # DeepSeek-V3: deepseek-ai/DeepSeek-V3 config.json (61 layers, hidden 7168, 128 heads, q_lora_rank 1536,
    # kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, intermediate 18432 for the
    # first_k_dense_replace 3 dense layers, 256 routed experts of moe_intermediate_size 2048, 8 per token,
    # n_shared_experts 1, vocab 129280, untied), as the Megatron-Core MLA configs use them (e.g. the shapes quoted in
    # vllm v1/attention/backends/mla/common.py: Lq 1536, Lkv 512, P 128, R 64, V 128). Published size: 671B total,
    # 37B activated per token (DeepSeek-V3 technical report, arXiv 2412.19437, abstract), without the multi-token
    # prediction (MTP) module, which is not modelled (its extra layer is left out); the router's expert-bias terms
    # (256 per layer) are not counted.
    ModelSpec("deepseek-v3", "llama", 61, 7168, 128, None, 18432, 129280, tied_embeddings=False,
              num_experts=256, top_k=8, moe_ffn_hidden=2048, shared_experts=1, dense_layers=3,
              attention_kind="mla", q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
              v_head_dim=128),
    # DeepSeek-V2-Lite: MLA without query compression (q_lora_rank null): deepseek-ai DeepSeek-(Coder-)V2-Lite
    # config.json (27 layers, hidden 2048, 16 heads, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128, intermediate
    # 10944 for first_k_dense_replace 1 dense layer, 64 routed experts of 1408, 6 per token, 2 shared experts, vocab
    # 102400, untied). Published size: 15.7B total, 2.4B activated (DeepSeek-V2 paper, arXiv 2405.04434, appendix B).
    ModelSpec("deepseek-v2-lite", "llama", 27, 2048, 16, None, 10944, 102400, tied_embeddings=False,
              num_experts=64, top_k=6, moe_ffn_hidden=1408, shared_experts=2, dense_layers=1,
              attention_kind="mla", kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    # Moonlight-16B-A3B: MLA without query compression, the DeepSeek-V3 architecture at 2048 hidden: slime's
    # scripts/models/moonlight.sh Megatron-Core arguments (--num-layers 27 --hidden-size 2048 --ffn-hidden-size 11264
    # --num-attention-heads 16 --multi-latent-attention --kv-lora-rank 512 (no --q-lora-rank) --qk-head-dim 128
    # --qk-pos-emb-head-dim 64 --v-head-dim 128 --num-experts 64 --moe-ffn-hidden-size 1408 --moe-router-topk 6
    # --moe-shared-expert-intermediate-size 2816 (2 shared experts of 1408) FIRST_K_DENSE_REPLACE 1 --vocab-size
    # 163840 --untie-embeddings-and-output-weights). Published: 16B total, 3B activated (moonshotai/Moonlight-16B-A3B
    # model card). Trained with Muon; the optimizer is modelled as Adam's.
    ModelSpec("moonlight-16b-a3b", "llama", 27, 2048, 16, None, 11264, 163840, tied_embeddings=False,
              num_experts=64, top_k=6, moe_ffn_hidden=1408, shared_experts=2, dense_layers=1,
              attention_kind="mla", kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    # Kimi K2: the DeepSeek-V3 architecture with 64 heads, 384 experts and 1 leading dense layer: a Megatron-Core
    # Kimi-K2-Instruct training script (--num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432
    # --num-attention-heads 64 --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128
    # --qk-pos-emb-head-dim 64 --v-head-dim 128 --num-experts 384 --moe-layer-freq [0]*1+[1]*60 --moe-ffn-hidden-size
    # 2048 --moe-router-topk 8 --moe-shared-expert-intermediate-size 2048 --padded-vocab-size 163840
    # --untie-embeddings-and-output-weights) and the moonshotai/Kimi-K2-Instruct model card (61 layers incl. 1 dense,
    # hidden 7168, 64 heads, 384 experts, 8 selected, 1 shared, expert width 2048, vocabulary 160K; 1T total, 32B
    # activated). Kimi K2 trains with MuonClip; the optimizer is modelled as Adam's.
    ModelSpec("kimi-k2", "llama", 61, 7168, 64, None, 18432, 163840, tied_embeddings=False,
              num_experts=384, top_k=8, moe_ffn_hidden=2048, shared_experts=1, dense_layers=1,
              attention_kind="mla", q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
              v_head_dim=128),
    # Llama 4 (interleaved MoE layers, moe_layer_interval): RMSNorm, SwiGLU, GQA 40 heads / 8 KV heads of 128, hidden
    # 5120, 48 layers, vocab 202048, untied, one shared expert of the routed width beside top-1 routed experts.
    # Llama-4-Scout-17B-16E text config (as posted in a vLLM issue, 'Llama4ForCausalLM' fine-tune of it): 16 local
    # experts of intermediate_size 8192, interleave_moe_layer_step 1 (moe_layers 0-47), intermediate_size_mlp 16384.
    # Published: 109B total, 17B active (Meta's Llama 4 model card). Approximated (PRESET_NOTES): chunked attention
    # (attention_chunk_size 8192 on three of every four layers) is predicted as full causal attention, identical up
    # to seq 8192 and an overestimate of those layers' attention above it; the NoPE layers' RoPE and the
    # parameter-free QK L2-norm are not told apart.
    ModelSpec("llama4-scout", "llama", 48, 5120, 40, 8, 16384, 202048, tied_embeddings=False, head_dim=128,
              num_experts=16, top_k=1, moe_ffn_hidden=8192, shared_experts=1),
    # Llama-4-Maverick-17B-128E text config (TensorRT-LLM's copy in its Llama 4 tests, "reduced to 2 layers from
    # 48"): 128 local experts of 8192, interleave_moe_layer_step 2 (dense / MoE alternating, the MoE layers the
    # odd ones: HF Llama4TextDecoderLayer), intermediate_size_mlp 16384 for the dense layers. Published: 400B total,
    # 17B active (Meta's Llama 4 model card). Same approximations as Scout.
    ModelSpec("llama4-maverick", "llama", 48, 5120, 40, 8, 16384, 202048, tied_embeddings=False, head_dim=128,
              num_experts=128, top_k=1, moe_ffn_hidden=8192, shared_experts=1, moe_layer_interval=2),
    # GPT-OSS (sliding_window, full_attention_interval): gpt-oss-120b config.json (36 layers, hidden 2880, 64 heads
    # of head_dim 64, 8 KV heads, 128 local experts of intermediate_size 2880, 4 per token, no shared expert,
    # sliding_window 128 with layer_types alternating sliding / full attention from layer 0, vocab 201088, untied)
    # as copied in public config tests (hidden 2880, 36 layers, 64 heads, 8 KV heads, head_dim 64, 128 experts,
    # top-4) and the gpt-oss model card (arXiv 2508.10925 sec. 2: alternating banded window of 128 tokens and dense
    # attention, 36 / 24 layers, 128 / 32 experts, top-4, o200k_harmony tokenizer of 201,088 tokens). Published:
    # 116.8B / 20.9B total, 5.1B / 3.6B active (the card's Table 1, active without the input embedding).
    # Approximated (PRESET_NOTES): the attention sinks (one learned logit per head) and the attention / expert /
    # router biases (~0.05 % of the parameters) are not modelled; MXFP4 expert weights are a post-training format
    # (training is planned in the layout's precision).
    ModelSpec("gpt-oss-120b", "llama", 36, 2880, 64, 8, 2880, 201088, tied_embeddings=False, head_dim=64,
              num_experts=128, top_k=4, moe_ffn_hidden=2880, sliding_window=128, full_attention_interval=2),
    ModelSpec("gpt-oss-20b", "llama", 24, 2880, 64, 8, 2880, 201088, tied_embeddings=False, head_dim=64,
              num_experts=32, top_k=4, moe_ffn_hidden=2880, sliding_window=128, full_attention_interval=2),
]}

# What a preset approximates, in words (the CLI's `models --json` prints it; docs/mla.md has the table).
PRESET_NOTES: dict[str, str] = {
    "deepseek-v3": "without the multi-token-prediction (MTP) module (not modelled); the router's expert-bias terms "
                   "are not counted",
    "kimi-k2": "MuonClip optimizer modelled as Adam",
    "moonlight-16b-a3b": "Muon optimizer modelled as Adam",
    "llama4-scout": "chunked attention (8192-token chunks on 3 of 4 layers) predicted as full causal attention: exact "
                    "up to seq 8192, an overestimate of those layers' attention above; NoPE layers and the QK L2-norm "
                    "not told apart",
    "gpt-oss-120b": "attention sinks and the attention / expert / router biases not modelled (~0.05 % of the "
                    "parameters); sliding-window layers timed as causal attention over 2 x 128-token blocks",
    "gpt-oss-20b": "attention sinks and the attention / expert / router biases not modelled (~0.05 % of the "
                   "parameters); sliding-window layers timed as causal attention over 2 x 128-token blocks",
    "llama4-maverick": "chunked attention (8192-token chunks on 3 of 4 layers) predicted as full causal attention: "
                       "exact up to seq 8192, an overestimate of those layers' attention above; NoPE layers and the "
                       "QK L2-norm not told apart",
}

# Presets whose architecture the predictor does not model yet: asked for by name, refused with the reason.
_REFUSED: dict[str, tuple[str, str]] = {
    "deepseek-v3.2": ("DeepSeek-V3.2 attends through DeepSeek Sparse Attention (a lightning indexer picks 2048 keys "
                      "per query), which the operator decomposition does not model; predicting it as dense multi-head "
                      "latent attention would be a silently wrong number at long sequences.",
                      "use deepseek-v3 (the same shapes with dense MLA) knowing that its attention differs, or "
                      "qwen3-235b-a22b for another large MoE plan."),
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

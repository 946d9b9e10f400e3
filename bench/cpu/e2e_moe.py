"""Hugging Face Mixture-of-Experts models for the CPU training jobs of bench/cpu/e2e.py (MoE validation:
`python -m tests.benchmarks.cpu_moe_end_to_end`).

A MoE config is a dict with bench/cpu/e2e.py's FIELDS (name, arch, layers, hidden, heads, kv_heads, ffn, seq,
batch, vocab) and these (absent = the default after the colon):

  experts      routed experts per MoE layer                     (required)
  top_k        experts each token is routed to                  (required)
  moe_ffn      width of one routed expert: ffn (Mixtral has one width; `ffn` is its expert width)
  shared_ffn   width of the one shared expert: none (qwen2moe only: Qwen2-MoE's always-on expert)
  dense_layers leading layers with a dense MLP of width `ffn`: 0 (qwen3moe / qwen2moe: `mlp_only_layers`)
  head_dim     attention head dimension: hidden / heads (qwen3moe only)
  experts_impl HF's experts implementation: HF's default (`grouped_mm` in transformers 5.x when torch has
               torch.nn.functional.grouped_mm, as torch 2.13 has; "eager" = HF's Python loop over the
               experts that received tokens)

arch `mixtral` (MixtralForCausalLM), `qwen3moe` (Qwen3MoeForCausalLM: QK-RMSNorm, head_dim decoupled) or
`qwen2moe` (Qwen2MoeForCausalLM: q/k/v bias, one shared expert with a sigmoid gate). Random weights (HF's
init, seed 0), fp32, SDPA attention, dropout 0 (attention_dropout 0, HF's default), router jitter 0
(Mixtral's default; the Qwen routers have none), HF's default softmax-then-top-k routing, dropless (HF
computes every routed token). The router's load-balancing auxiliary loss stays OFF, as HF's defaults have
it (`output_router_logits=False`: the loss is the causal-LM loss only and no router logits are kept).

`RoutingRecorder` hooks the router (`*TopKRouter`, the `gate` of each sparse block) and counts the tokens
each expert received in every kept step (counted after the step's timer stopped; the hook only keeps a
reference to the router's top-k index tensor). `moe_row` is the predict-batch row of a measured config.
"""
from __future__ import annotations

import math
from typing import Any

MOE_ARCHS = ("mixtral", "qwen3moe", "qwen2moe")
PLATFORM_DP = {"cpu-2t": 1, "cpu-1t": 2}


def is_moe(c: dict) -> bool:
    return c.get("arch") in MOE_ARCHS


def _check(c: dict) -> None:
    arch = c["arch"]
    if arch not in MOE_ARCHS:
        raise ValueError(f"{c.get('name')}: arch {arch!r} is not one of {MOE_ARCHS}")
    if not (c.get("experts") and c.get("top_k")):
        raise ValueError(f"{c.get('name')}: a MoE config needs experts and top_k")
    if arch == "mixtral" and (c.get("moe_ffn") not in (None, c["ffn"]) or c.get("dense_layers")
                              or c.get("shared_ffn") or c.get("head_dim")):
        raise ValueError(f"{c.get('name')}: Mixtral has one MLP width (ffn), no dense layers, no shared "
                         "expert and head_dim = hidden / heads")
    if c.get("shared_ffn") and arch != "qwen2moe":
        raise ValueError(f"{c.get('name')}: only qwen2moe has a shared expert")
    if c.get("head_dim") and arch != "qwen3moe":
        raise ValueError(f"{c.get('name')}: head_dim is only set for qwen3moe")


def hf_config(c: dict):
    """The transformers config of a MoE config dict."""
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig
    _check(c)
    common = dict(vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
                  num_attention_heads=c["heads"], num_key_value_heads=c.get("kv_heads") or c["heads"],
                  max_position_embeddings=max(2048, c["seq"]), tie_word_embeddings=False, attention_dropout=0.0,
                  num_experts_per_tok=c["top_k"], output_router_logits=False)
    if c["arch"] == "mixtral":
        cfg = MixtralConfig(intermediate_size=c["ffn"], num_local_experts=c["experts"], router_jitter_noise=0.0,
                            **common)
    else:
        qwen = dict(intermediate_size=c["ffn"], moe_intermediate_size=c.get("moe_ffn") or c["ffn"],
                    num_experts=c["experts"], decoder_sparse_step=1,
                    mlp_only_layers=list(range(c.get("dense_layers") or 0)), **common)
        if c["arch"] == "qwen3moe":
            cfg = Qwen3MoeConfig(head_dim=c.get("head_dim") or c["hidden"] // c["heads"], **qwen)
        else:
            if not c.get("shared_ffn"):
                raise ValueError(f"{c.get('name')}: qwen2moe needs shared_ffn (Qwen2-MoE always has a shared "
                                 "expert)")
            cfg = Qwen2MoeConfig(shared_expert_intermediate_size=c["shared_ffn"], **qwen)
    cfg._attn_implementation = "sdpa"
    if c.get("experts_impl"):
        cfg._experts_implementation = c["experts_impl"]
    return cfg


def build_moe_model(c: dict):
    import torch
    from transformers import MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM
    torch.manual_seed(0)
    cls = {"mixtral": MixtralForCausalLM, "qwen3moe": Qwen3MoeForCausalLM, "qwen2moe": Qwen2MoeForCausalLM}
    return cls[c["arch"]](hf_config(c)).float().train()


def describe_model(model) -> dict[str, Any]:
    """What the built model really is: per layer dense / MoE, experts, top_k, shared expert width,
    the experts implementation HF dispatched to, and the parameter counts."""
    cfg = model.config
    layers = model.model.layers
    moe = [hasattr(layer.mlp, "experts") for layer in layers]
    first = next(layer.mlp for layer, m in zip(layers, moe) if m)
    shared = getattr(first, "shared_expert", None)
    return {"moe_layers": sum(moe), "dense_layers": moe.index(True), "layer_kinds": ["moe" if m else "dense"
                                                                                      for m in moe],
            "experts": int(first.experts.gate_up_proj.shape[0]),
            "expert_ffn": int(first.experts.down_proj.shape[2]),
            "top_k": int(first.gate.top_k),
            "shared_ffn": int(shared.intermediate_size) if shared is not None else None,
            "experts_implementation": cfg._experts_implementation,
            "params": sum(p.numel() for p in model.parameters())}


def arch_flags(c: dict) -> dict[str, Any]:
    """What the HF model does beyond the llama arch the predictor is told (recorded with every config)."""
    a = c["arch"]
    return {"family": a, "hf_class": {"mixtral": "MixtralForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM",
                                      "qwen2moe": "Qwen2MoeForCausalLM"}[a],
            "qk_norm": a == "qwen3moe", "qkv_bias": a == "qwen2moe", "shared_expert_gate": a == "qwen2moe",
            "router_topk_renormalised": a == "mixtral",  # Qwen's norm_topk_prob defaults to False
            "router_aux_loss": False, "router_jitter": 0.0, "dropless": True,
            "experts_impl": c.get("experts_impl") or "hf-default"}


# --------------------------------------------------------------------------- routing statistics
class RoutingRecorder:
    """Tokens per expert in every MoE layer of every kept step.

        rec = RoutingRecorder(model)      # hooks every router
        ...one step...; rec.step_done(kept)   # after the timer stopped
        rec.summary()

    Imbalance of a layer in a step = the busiest expert's tokens / the mean per expert (tokens x top_k /
    experts); 1 is perfect balance, `experts / top_k` the worst (every token on the same top_k experts)."""

    def __init__(self, model) -> None:
        self._pending: list[Any] = []
        self.counts: list[list[list[int]]] = []   # [step][moe layer][expert]
        self.num_experts = 0
        self.top_k = 0
        self._handles = []
        for mod in model.modules():
            if type(mod).__name__.endswith("TopKRouter"):
                self.num_experts, self.top_k = int(mod.num_experts), int(mod.top_k)
                self._handles.append(mod.register_forward_hook(self._hook))
        if not self._handles:
            raise ValueError("no *TopKRouter module in the model: not a HF MoE model this recorder knows")

    def _hook(self, _mod, _inp, out) -> None:
        self._pending.append(out[2].detach())  # (tokens, top_k) expert indices

    def step_done(self, kept: bool) -> None:
        import torch
        if kept:
            self.counts.append([torch.bincount(ix.reshape(-1), minlength=self.num_experts).tolist()
                                for ix in self._pending])
        self._pending = []

    def summary(self) -> dict[str, Any]:
        return routing_summary(self.counts, self.num_experts, self.top_k)


def routing_summary(counts: list[list[list[int]]], experts: int, top_k: int) -> dict[str, Any]:
    """Statistics of tokens-per-expert counts [step][layer][expert] (see RoutingRecorder)."""
    ratios = [[max(c) / (sum(c) / experts) for c in step] for step in counts]
    flat = [r for step in ratios for r in step]
    if not flat:
        return {"routing_steps": 0}
    layers = len(ratios[0])
    by_layer = [sum(s[i] for s in ratios) / len(ratios) for i in range(layers)]
    cv = [math.sqrt(sum((x - sum(c) / experts) ** 2 for x in c) / experts) / (sum(c) / experts)
          for step in counts for c in step]
    last = counts[-1]
    return {"imbalance": round(sum(flat) / len(flat), 4), "imbalance_max": round(max(flat), 4),
            "imbalance_min": round(min(flat), 4), "imbalance_by_layer": [round(x, 4) for x in by_layer],
            "imbalance_worst_possible": round(experts / top_k, 4),
            "tokens_cv": round(sum(cv) / len(cv), 4),
            "experts_idle_max": max(sum(1 for x in c if x == 0) for step in counts for c in step),
            "routed_tokens_per_layer": sum(last[0]), "routing_steps": len(counts),
            "tokens_per_expert_last_step": last}


# --------------------------------------------------------------------------- predict-batch rows
MOE_COLUMNS = ("num_experts", "top_k", "moe_ffn_hidden", "shared_experts", "shared_ffn_hidden", "dense_layers", "ep")


def moe_row(c: dict, platform: str) -> dict[str, Any]:
    """The predict-batch row of a measured config (arch llama: all three families are RMSNorm / RoPE /
    SwiGLU / GQA; head_dim only where it differs from hidden / heads; HF's extras are in arch_flags)."""
    dp = PLATFORM_DP[platform]
    hd = c.get("head_dim")
    return {"case_id": f"{platform}:{c['name']}", "platform": platform, "arch": "llama", "name": c["name"],
            "layers": c["layers"], "hidden": c["hidden"], "heads": c["heads"],
            "kv_heads": c.get("kv_heads") or c["heads"], "ffn_hidden": c["ffn"], "vocab": c["vocab"],
            "seq_len": c["seq"], "num_gpus": dp, "tp": 1, "pp": 1, "dp": dp, "micro_batch": c["batch"],
            "global_batch": c["batch"] * dp, "vpp": 1, "schedule": "1f1b", "recompute": "none",
            "sequence_parallel": False, "zero_stage": 0, "precision": "fp32", "attention": "flash",
            "tied_embeddings": False, "head_dim": hd if hd and hd * c["heads"] != c["hidden"] else "",
            "num_experts": c["experts"], "top_k": c["top_k"], "moe_ffn_hidden": c.get("moe_ffn") or c["ffn"],
            "shared_experts": 1 if c.get("shared_ffn") else 0, "shared_ffn_hidden": c.get("shared_ffn") or "",
            "dense_layers": c.get("dense_layers") or 0, "ep": 1}

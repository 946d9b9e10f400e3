"""Independent check on published NVIDIA NeMo / Megatron-Core (Megatron-Bridge) training runs: MoE, FP8, context
parallelism, H100 / B200 / GB200. Never ingested into the store, never fitted to.

`catalog/independent_nemo.json` holds the rows as printed in the cited documents (NeMo performance summaries 24.07,
25.02, 25.04, 25.07; Megatron-Bridge's performance summary for 25.09 / 25.11 / 26.02 / 26.06; Megatron-Bridge
model-verification cards; NeMo's long-sequence table), the models behind the printed names (predictor field names,
each with its citation) and the systems' platforms. This module

1. checks every row before it is used, dropping and counting a row that fails (first failing reason wins):
   a step time must follow from what is printed (global batch, micro-batch, and tokens/s/GPU or a step time);
   num_gpus = tp x pp x cp x dp with an integer dp (and the printed dp, where there is one); the global batch a
   multiple of micro_batch x dp (and the printed GA equal to global_batch / (micro_batch x dp)); a printed step time
   within 1 % of global_batch x seq_len / (tokens/s/GPU x GPUs); the published model TFLOP/s per token within 3 % of
   the same model's other rows of the same release (a typo in a transcribed throughput breaks it);
2. keeps but does not predict a row whose system has no platform (GB300, B300), whose precision is not stated or not
   modelled (NVFP4), or whose model the predictor does not model (DeepSeek-V3 with MTP, GPT-OSS, Llama 4, Nemotron);
3. predicts the rest with `predictor.plan.batch.predict_records(..., allow_oom=True)` and scores the measured step time
   (global_batch x seq_len / (tokens/s/GPU x GPUs), the document's own definition of tokens/s/GPU) per run and per
   group (GPU kind, MoE vs dense, precision, source). Every MoE run is predicted with the modelled imbalance of random
   routing: the forced load balancing the Megatron-Bridge 25.11 / 26.02 / 26.06 tables state is Megatron-Core's
   `moe_router_force_load_balancing`, which replaces the router's logits with random normal ones
   (megatron/core/transformer/moe/moe_utils.py RandomSTE / apply_random_logits: `logits.clone().normal_()`, 'random
   logits of router for load-balanced benchmark'), i.e. uniformly random routing, not an exact balance.

Rows carrying Mixture-of-Experts columns are sent to the predictor only when it accepts those columns
(`layout_io.BATCH_COLUMNS` / `OPTIONAL_BATCH_COLUMNS`); until then each such row reports why it was not predicted
instead of being predicted as a dense model.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from predictor import paths
from predictor.checks.independent import error_stats, summary_groups
from predictor.model.specs import FP8_PARAM_PRECISIONS
from predictor.step.memory import MemoryOptions

CATALOG = paths.CATALOG_DIR / "independent_nemo.json"
STEP_TOLERANCE = 0.01     # printed step time vs the one tokens/s gives
FLOPS_TOLERANCE = 0.03    # published TFLOP/s per token vs the median of the same model and release

# Columns the row builder emits (the predict-batch names); the MoE ones and ep only reach the predictor once it
# accepts them (see predictable_record).
ROW_COLUMNS = ["case_id", "platform", "arch", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden",
               "vocab", "tied_embeddings", "num_experts", "top_k", "moe_ffn_hidden", "shared_experts",
               "dense_layers", "moe_imbalance", "seq_len", "num_gpus", "tp", "pp", "cp", "ep", "dp", "vpp",
               "schedule", "micro_batch", "global_batch", "recompute", "sequence_parallel", "zero_stage",
               "precision", "framework", "overlap_grad_reduce", "overlap_param_gather", "overlap_tp_comm",
               "grad_reduce_in_fp32", "fp8_param_gather", "offload_activations",
               # multi-head latent attention (docs/mla.md)
               "attention_kind", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
               "stage_layers",
               # sliding-window attention (GPT-OSS)
               "sliding_window", "full_attention_interval",
               # MoE expert tensor parallelism and the dispatch / combine overlap, as the recipes state them
               "etp", "moe_overlap",
               # the recipe's per-layer CUDA-graph scopes (`recipe_settings`; empty = none)
               "cuda_graphs",
               # the recipe's MoE token dispatcher (`recipe_settings`; empty = alltoall)
               "moe_dispatcher",
               # selective recomputation by module, as the recipe states it (`recipe_recompute`)
               "recompute_modules"]
# The value of each such column that means "not MoE / no expert parallelism": a cell at its default can be left out.
MOE_DEFAULTS = {"num_experts": {"", "0"}, "top_k": {""}, "moe_ffn_hidden": {""}, "shared_experts": {"", "0"},
                "shared_ffn_hidden": {""}, "dense_layers": {"", "0"}, "capacity_factor": {""},
                "moe_imbalance": {""}, "ep": {"", "1"}, "etp": {""}, "moe_overlap": {"", "false"}}

NO_STEP = "no step time: global batch, micro-batch or throughput not printed"
BAD_GPUS = "GPU count is not tp x pp x cp x dp with an integer dp"
BAD_BATCH = "batch arithmetic does not close (global batch vs micro-batch x dp, or the printed GA)"
BAD_STEP = f"printed step time does not follow from tokens/s (> {STEP_TOLERANCE:.0%})"
BAD_FLOPS = f"published TFLOP/s per token differs from the same model's other rows (> {FLOPS_TOLERANCE:.0%})"
NO_PRECISION = "precision not stated in the document"


def load(path: Path = CATALOG) -> dict[str, Any]:
    return dict(json.loads(Path(path).read_text()))


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)


def _row_problem(r: pd.Series) -> str | None:
    """The first arithmetic check `r` fails (None: it passes); sets nothing."""
    gbs, mbs, tok, step = _num(r["global_batch"]), _num(r["micro_batch"]), _num(r["tokens_per_s_per_gpu"]), \
        _num(r["step_time_ms"])
    if gbs is None or mbs is None or (tok is None and step is None):
        return NO_STEP
    tp, pp, cp = (int(_num(r[k]) or 1) for k in ("tp", "pp", "cp"))
    gpus = int(r["gpus"])
    if gpus % (tp * pp * cp):
        return BAD_GPUS
    dp = gpus // (tp * pp * cp)
    if _num(r["dp"]) is not None and int(r["dp"]) != dp:
        return BAD_GPUS
    if gbs % (mbs * dp):
        return BAD_BATCH
    if _num(r["ga"]) is not None and int(r["ga"]) != gbs // (mbs * dp):
        return BAD_BATCH
    if tok is not None and step is not None:
        derived = gbs * r["seq_len"] / (tok * gpus)
        if abs(step / 1e3 / derived - 1) > STEP_TOLERANCE:
            return BAD_STEP
    return None


def reason_counts(dropped: pd.DataFrame) -> dict[str, int]:
    """Dropped rows per reason, the most frequent first."""
    return dict(Counter(dropped["reason"]).most_common())


@dataclass(frozen=True)
class PublishedRuns:
    """Rows that passed every check (`ok`, with derived columns) and those dropped (`dropped`, with `reason`)."""
    ok: pd.DataFrame
    dropped: pd.DataFrame

    @property
    def dropped_counts(self) -> dict[str, int]:
        return reason_counts(self.dropped)


def published_runs(doc: dict[str, Any], sources: list[str] | None = None) -> PublishedRuns:
    """Every row of `sources` (default: all) checked: the usable ones with their measured step time, the rest
    with the first reason they fail."""
    frames = []
    for sid, src in doc["sources"].items():
        if sources is not None and sid not in sources:
            continue
        d = pd.DataFrame(src["rows"], columns=src["columns"])
        d.insert(0, "source", sid)
        d.insert(1, "row", range(len(d)))
        d["force_balanced"] = d["release"].isin(src.get("force_balanced_releases", []))
        d["recompute_modules"] = [recipe_recompute(src, r) for _, r in d.iterrows()]
        d["recipe_moe_overlap"] = [bool(recipe_settings(src, r).get("moe_overlap")) for _, r in d.iterrows()]
        d["recipe_cuda_graphs"] = [recipe_settings(src, r).get("cuda_graphs") or "" for _, r in d.iterrows()]
        d["recipe_moe_dispatcher"] = [recipe_settings(src, r).get("moe_dispatcher") or "" for _, r in d.iterrows()]
        frames.append(d)
    d = pd.concat(frames, ignore_index=True)
    d["model_key"] = d["model"].map(doc["model_names"])
    d["reason"] = [_row_problem(r) for _, r in d.iterrows()]
    gpus = d["gpus"].astype(float)
    tok = pd.to_numeric(d["tokens_per_s_per_gpu"], errors="coerce")
    step = pd.to_numeric(d["step_time_ms"], errors="coerce") / 1e3
    gbs = pd.to_numeric(d["global_batch"], errors="coerce")
    # the measured step time: the document's tokens/s/GPU (whole-cluster tokens per second / GPUs), else its step time
    d["measured_s"] = (gbs * d["seq_len"] / (tok * gpus)).fillna(step)
    tput = (gbs * d["seq_len"] / d["measured_s"]) / gpus
    d["flops_per_token"] = pd.to_numeric(d["tflops_per_gpu"], errors="coerce") * 1e12 / tput
    # published TFLOP/s against the same printed model and release (one FLOP formula): a transcription typo in a
    # throughput shows as an outlier; a model printed once cannot be checked this way
    clean = d["reason"].isna() & d["flops_per_token"].notna()
    med = d[clean].groupby(["source", "release", "model", "seq_len"])["flops_per_token"].transform("median")
    off = (d.loc[clean, "flops_per_token"] / med - 1).abs() > FLOPS_TOLERANCE
    d.loc[off[off].index, "reason"] = BAD_FLOPS
    # kept as facts but not predicted
    for i, r in d[d["reason"].isna()].iterrows():
        d.at[i, "reason"] = _unpredictable(doc, r)
    ok = d[d["reason"].isna()].copy()
    ok["platform"] = ok["system"].map(doc["systems"])
    ok["pred_precision"] = ok["precision"].map(doc["precisions"])
    ok["moe"] = ok["model_key"].map(lambda k: bool(doc["models"][k].get("num_experts")))
    tpp = ok["tp"].fillna(1) * ok["pp"].fillna(1) * ok["cp"].fillna(1)
    ok["dp_derived"] = (ok["gpus"] // tpp).astype(int)
    return PublishedRuns(ok.drop(columns="reason").reset_index(drop=True),
                         d[d["reason"].notna()].reset_index(drop=True))


def _unpredictable(doc: dict[str, Any], r: pd.Series) -> str | None:
    if doc["systems"].get(r["system"]) is None:
        return f"no platform for {r['system']}"
    if r["precision"] is None or (isinstance(r["precision"], float) and np.isnan(r["precision"])):
        return NO_PRECISION
    if doc["precisions"].get(r["precision"]) is None:
        return f"precision {r['precision']} not modelled"
    key = r["model_key"]
    if not isinstance(key, str) or key not in doc["models"]:
        return f"model {r['model']} has no entry in the catalog"
    why = doc["models"][key].get("unpredictable")
    return f"model not modelled: {why}" if why else None


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


# The memory settings of NVIDIA's performance recipes, where their scripts state them (never fitted; the
# sources are in memory_settings). Every NeMo / Megatron-Bridge performance launcher sets NCCL_NVLS_ENABLE=0
# ("to save memory"), so the check predicts with no NVLS buffers.
RECIPE_SOURCES = ("nemo-24.07-h100", "nemo-25.02", "nemo-25.04", "nemo-25.07", "megatron-bridge")
NO_NVLS_MIB = 0.0


def memory_settings(r: pd.Series) -> tuple[bool | None, bool]:
    """(grad_reduce_in_fp32, fp8_param_gather) of a run as its recipe sets them, None / False where unknown:
    - gradients in bf16 in every performance path: NeMo 24.07 (NeMo-Framework-Launcher examples/training/*/h100/*.sh:
      +training.model.optim.grad_sync_dtype=bf16), NeMo 25.0x FP8 (scripts/performance/utils.py / helpers.py:
      recipe.trainer.plugins.grad_reduce_in_fp32 = False), Megatron-Bridge (scripts/performance/configs/*/
      *_llm_pretrain.py set_*_common_configs: mixed_precision and ddp grad_reduce_in_fp32 = False); the model cards'
      runs are not performance-script runs: the precision's default;
    - FP8 primary weights: Megatron-Bridge's fp8_cs / fp8_mx presets (fp8_param_gather True; mixed_precision.py) and
      NeMo 2.0's delayed / current-scaling FP8 presets (25.02 'fp8' is the scripts' default 'ds'; 25.04 / 25.07
      fp8-cs); not NeMo's MXFP8 preset, and not stated for NeMo 24.07's Llama / GPT-3 scripts (left off)."""
    src, prec = str(r["source"]), str(r["precision"])
    if src not in RECIPE_SOURCES:
        return None, False
    fp8 = str(r["pred_precision"]) in FP8_PARAM_PRECISIONS   # the precisions FP8 primary weights run with
    if src == "megatron-bridge":
        return False, fp8
    if src.startswith("nemo-25"):
        return False, fp8 and prec != "fp8-mx"
    return False, False


# Activation offloading as the recipes behind the published rows set it (Megatron-Core cpu_offloading_num_layers,
# NeMo's activation_offload_layers), keyed (source, release, system, printed model, printed precision); never fitted:
# - Megatron-Bridge 25.11 / 26.02, Llama3 70B FP8-CS on 64 GPUs (FSDP, micro-batch 2, GBS 256):
#   NVIDIA-NeMo/Megatron-Bridge@00919dcf1fe13c0acf65e131f244378f0a6cd2b5
#   scripts/performance/configs/llama/llama3_workload_base_configs.py, LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_CS_V2
#   (cpu_offloading_num_layers=20) and ..._GB200_FP8_CS_V2 (40); the V1 presets (GBS 128) set the same;
# - NeMo 25.07, Llama3.1 405B FP8-CS on 128 GB200 (TP 2, FSDP): NVIDIA/NeMo@06c0e70057f272483a1a33c6bb5a9baf7be48cdc
#   scripts/performance/recommended_model_configs/model_configs_gb200.csv, row pre_train,llama31,405b,gb200,fp8
#   (activation_offload_layers 95; that file prints GBS 256 where the 25.07 table prints 64: the offload, a
#   per-micro-batch setting with pp = 1, is taken from it).
RECIPE_OFFLOAD: dict[tuple[str, str, str, str, str], int] = {
    ("megatron-bridge", "26.02", "DGX-GB300", "LLAMA3_70B", "fp8"): 20,
    ("megatron-bridge", "26.02", "DGX-GB200", "LLAMA3_70B", "fp8"): 40,
    ("megatron-bridge", "25.11", "DGX-GB300", "LLAMA3_70B", "fp8-cs"): 20,
    ("megatron-bridge", "25.11", "DGX-GB200", "LLAMA3_70B", "fp8-cs"): 40,
    ("nemo-25.07", "25.07", "DGX-GB200", "LLAMA3.1-405B", "fp8-cs"): 95,
}


# Memory settings of Megatron-Bridge's performance scripts that the layout does not carry (predicted through
# MemoryOptions, row by row; never fitted, each cited; rows of other sources and releases keep the defaults). Both were
# looked up for the 25.11 rows judged "does not fit" by the memory verdicts (tests/benchmarks/memory_verdicts.py) and
# are applied to every row their scripts cover, whatever its verdict:
# - the loss: the 25.11 scripts run every recipe through set_common_perf_overrides
#   (NVIDIA-NeMo/Megatron-Bridge@013284246bc0714e406c8a519b8686b7e50628ec scripts/performance/utils/helpers.py:
#   recipe.model.cross_entropy_fusion_impl = "te"), with cross_entropy_loss_fusion True by default
#   (src/megatron/bridge/models/gpt_provider.py GPTModelProvider), so Megatron-Core computes the loss with Transformer
#   Engine's parallel_cross_entropy (megatron/core/models/common/language_module/language_module.py
#   compute_language_model_loss), which saves its 16-bit input, the logits, and writes their gradient into it in place
#   (transformer_engine/pytorch/cross_entropy.py CrossEntropyFunction: "the loss and gradient calculation happens in
#   FP32 only", ctx.save_for_backward(_input.detach())): no fp32 copy of the logits (MemoryOptions.logits_fp32 False);
# - DeepSeek-V3's optimizer: the recipe the 25.11 DeepSeek-V3 scripts build on (scripts/performance/configs/deepseek/
#   deepseek_llm_pretrain.py@013284246: deepseek_v3_pretrain_config) sets use_precision_aware_optimizer with
#   exp_avg_dtype = exp_avg_sq_dtype = torch.bfloat16 and main_params_dtype torch.float32
#   (src/megatron/bridge/recipes/deepseek/deepseek_v3.py@05d003fb8985ccde5cc8c33a72f750e38c1e76ff _deepseek_v3_common,
#   "Match old recipe optimizer dtype behavior"): Adam's moments take 2 + 2 bytes per parameter
#   (MemoryOptions.optimizer_bytes_per_param 4), the fp32 master stays.
TE_LOSS_RELEASES = {("megatron-bridge", "25.11")}
BF16_MOMENTS = {("megatron-bridge", "25.11", "deepseek-v3"), ("megatron-bridge", "25.11", "deepseek-v3-mtp"),
                ("megatron-bridge", "25.11", "deepseek-v3-mtp-unstated")}


def recipe_memory_options(r: pd.Series | dict[str, Any]) -> MemoryOptions:
    """The memory options a published run is predicted with: no NVLS buffers (NO_NVLS_MIB, every launcher), and where
    its scripts state them the loss's logits precision and the Adam moments' bytes (TE_LOSS_RELEASES, BF16_MOMENTS)."""
    src, rel, key = str(r.get("source")), str(r.get("release")), str(r.get("model_key"))
    kw: dict[str, Any] = {"nccl_nvls_mib": NO_NVLS_MIB}
    if (src, rel) in TE_LOSS_RELEASES:
        kw["logits_fp32"] = False
    if (src, rel, key) in BF16_MOMENTS:
        kw["optimizer_bytes_per_param"] = 4
    return MemoryOptions(**kw)


def recipe_recompute(src: dict[str, Any], r: pd.Series) -> tuple[str, ...] | None:
    """The modules a row's recipe recomputes selectively (Megatron-Core recompute_modules), from its source's
    `recipe_recompute` list (each entry keyed by release, system, printed model and printed precision, with the
    recipe file it is read from in `cite`); None where the source states none for the row."""
    for e in src.get("recipe_recompute", []):
        if (e["release"], e["system"], e["model"], e["precision"]) == (r["release"], r["system"], r["model"],
                                                                       r["precision"]):
            return tuple(e["recompute_modules"])
    return None


def recipe_settings(src: dict[str, Any], r: pd.Series) -> dict[str, Any]:
    """The per-row settings a row's recipe states, from its source's `recipe_settings` list (each entry keyed by
    release, system, printed model and printed precision, with the recipe file it is read from in `cite`): its
    `moe_overlap` is predicted (moe_recipe_settings), its `cuda_graphs` (the per-layer Transformer Engine scopes) is the
    row's Layout.cuda_graphs; its `cuda_graph_impl` / `cuda_graph_scope` (the 26.06 full-iteration graph) are
    recorded, not modelled by this check. Empty where the source lists none for the row."""
    for e in src.get("recipe_settings", []):
        if (e["release"], e["system"], e["model"], e["precision"]) == (r["release"], r["system"], r["model"],
                                                                       r["precision"]):
            return dict(e)
    return {}


def recipe_offload(r: pd.Series) -> int:
    """Layers whose activations the run's recipe offloads to the host (RECIPE_OFFLOAD; 0 where none is stated)."""
    return RECIPE_OFFLOAD.get((str(r["source"]), str(r["release"]), str(r["system"]), str(r["model"]),
                               str(r["precision"])), 0)


# Megatron-Bridge's Qwen3 MoE performance presets (scripts/performance/configs/qwen3/qwen3_workload_base_configs.py,
# "Parallelism presets for Qwen3 performance configs", V1 / V2): BASE_QWEN3_235B_A22B_CONFIG and
# BASE_QWEN3_30B_A3B_CONFIG set expert_tensor_parallel_size=1; the H100 Qwen3-235B-A22B presets (TP2 PP8 VP4 EP32,
# V1 GBS 2048 / V2 GBS 8192: the 25.11 / 26.02 rows) set moe_a2a_overlap=True, the B200 / B300 and H100 Qwen3-30B-A3B
# ones False, the GB200 / GB300 ones leave it unset (HybridEP dispatcher with CUDA graphs). The same H100 layout with
# A2A_OVERLAP=1 is NVIDIA's Megatron-MoE-ModelZoo best-practice/qwen3/run_235b.sh H100 baseline.
# The 26.06 rows' recipes state the overlap row by row instead (the source's `recipe_settings`, each cited: the Qwen3
# 30B-A3B / 235B-A22B and GPT-OSS 120B MXFP8 recipes on GB200 / GB300 turn it on), read into `recipe_moe_overlap`.
MB_OVERLAP = {("qwen3-235b-a22b", "DGX-H100")}


def moe_recipe_settings(r: pd.Series, model_key: str, moe: bool) -> tuple[int | None, bool]:
    """(etp, moe_overlap) of a MoE run as its row or recipe states them: the printed ETP (the model cards print 1),
    else 1 for a Megatron-Bridge performance row (the Qwen3 presets above); the overlap where the preset turns it
    on (MB_OVERLAP, or the row's own `recipe_moe_overlap` from its source's `recipe_settings`). (None, False) for a
    dense run or where nothing states them (etp then takes the framework's default)."""
    if not moe:
        return None, False
    printed = _num(r.get("etp"))
    src = str(r["source"])
    etp = int(printed) if printed is not None else (1 if src.startswith("megatron-bridge") else None)
    preset = src == "megatron-bridge" and (model_key, str(r["system"])) in MB_OVERLAP
    return etp, preset or bool(r.get("recipe_moe_overlap", False))


def batch_row(r: pd.Series, model: dict[str, Any]) -> dict[str, str]:
    """One predict-batch record (ROW_COLUMNS, all strings) for a checked run `r` of `model` (catalog fields)."""
    tp = int(_num(r["tp"]) or 1)
    vp = int(_num(r["vp"]) or 1)
    fsdp = _num(r["fsdp"])
    moe = bool(model.get("num_experts"))
    fields: dict[str, Any] = {
        "case_id": f"{r['source']}/{r['release']}/{r['system']}/{r['model']}/{r['gpus']}gpu/{r['precision']}",
        "platform": r["platform"], "arch": model.get("arch", "llama"), "layers": model["layers"],
        "hidden": model["hidden"], "heads": model["heads"], "kv_heads": model["kv_heads"],
        "head_dim": model.get("head_dim"), "ffn_hidden": model["ffn_hidden"], "vocab": model["vocab"],
        "tied_embeddings": model.get("tied_embeddings", False),
        "num_experts": model.get("num_experts", 0), "top_k": model.get("top_k") if moe else None,
        "moe_ffn_hidden": model.get("moe_ffn_hidden") if moe else None,
        "shared_experts": model.get("shared_experts", 0), "dense_layers": model.get("dense_layers", 0),
        # the modelled imbalance of random routing for every MoE run: a source's forced balancing is Megatron-Core's
        # random router (moe_router_force_load_balancing: random normal logits), whose busiest expert rank gets the
        # random-routing maximum, not the mean (module docstring); learned routers are approximated by it
        "moe_imbalance": None,
        "seq_len": r["seq_len"], "num_gpus": r["gpus"], "tp": tp, "pp": int(_num(r["pp"]) or 1),
        "cp": int(_num(r["cp"]) or 1), "ep": int(_num(r["ep"]) or 1), "dp": r["dp_derived"], "vpp": vp,
        "schedule": "interleaved" if vp > 1 else "1f1b", "micro_batch": r["micro_batch"],
        "global_batch": r["global_batch"], "sequence_parallel": tp > 1,
        # the recipe's selective recomputation (`recipe_recompute`: a source's `recipe_recompute` rows); else none
        "recompute": "selective" if r.get("recompute_modules") else "none",
        "recompute_modules": ",".join(r.get("recompute_modules") or ()) or None,
        # FSDP > 0: Megatron FSDP (parameters, gradients and optimizer sharded); else the distributed optimizer
        "zero_stage": 3 if fsdp else 1, "precision": r["pred_precision"], "framework": "megatron",
        # NeMo overlaps the distributed optimizer's gradient reduce-scatter and parameter all-gather with compute
        # (NVIDIA/NeMo docs/source/features/optimizations/communication_overlap.rst: "enabled when setting
        # overlap_grad_sync=True and overlap_param_gather=True", the recipes' setting)
        "overlap_grad_reduce": True, "overlap_param_gather": True,
        # and the tensor-parallel exchanges with the GEMMs wherever it applies (tp > 1 with sequence parallelism):
        # assumed on, as the same document's "Tensor-parallel Communication Overlap" says ("The bulk TP communication
        # is enabled by default"; the pipelined one comes with the recipes' MegatronCommOverlapCallback, which the
        # document shows how to remove to turn it off)
        "overlap_tp_comm": tp > 1,
        # the recipe's gradient precision and FP8 primary weights (memory_settings: what its scripts state)
        **dict(zip(("grad_reduce_in_fp32", "fp8_param_gather"), memory_settings(r))),
        # the recipe's activation offloading (RECIPE_OFFLOAD; empty = none)
        "offload_activations": recipe_offload(r) or None,
        # multi-head latent attention (docs/mla.md): the catalog model's, empty for GQA models
        **{k: model.get(k) for k in ("attention_kind", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                     "qk_rope_head_dim", "v_head_dim")},
        # the recipe's uneven pipeline layout for this (pp, vp), where the catalog model states one (DeepSeek-V3:
        # Megatron-Bridge's layout map, `pipeline_layouts_cite`); else Megatron-Core's even split
        "stage_layers": ",".join(map(str, model.get("pipeline_layouts", {}).get(f"{int(_num(r['pp']) or 1)}x{vp}", [])))
        or None,
        # sliding-window attention (GPT-OSS): the catalog model's, empty for full attention
        "sliding_window": model.get("sliding_window"), "full_attention_interval": model.get("full_attention_interval"),
        # expert tensor parallelism and the dispatch / combine overlap as the recipe states them
        **dict(zip(("etp", "moe_overlap"), moe_recipe_settings(r, str(r.get("model_key", "")), moe))),
        # the recipe's per-layer CUDA-graph scopes (`recipe_settings`), empty = none (eager)
        "cuda_graphs": r.get("recipe_cuda_graphs") or None,
        # the recipe's MoE token dispatcher (`recipe_settings`: hybridep where it sets moe_token_dispatcher_type flex
        # with moe_flex_dispatcher_backend hybridep), empty = alltoall
        "moe_dispatcher": (r.get("recipe_moe_dispatcher") or None) if moe else None}
    return {k: _cell(fields[k]) for k in ROW_COLUMNS}


def accepted_columns() -> set[str]:
    from predictor.model.layout_io import BATCH_COLUMNS, OPTIONAL_BATCH_COLUMNS
    return set(BATCH_COLUMNS) | set(OPTIONAL_BATCH_COLUMNS)


def predictable_record(row: dict[str, str], accepted: set[str] | None = None) -> tuple[dict[str, str], str]:
    """(`row` reduced to the columns the predictor accepts, '') or (that, why it must not be predicted): a column
    the predictor does not know may be left out only at its default (a dense model, no expert parallelism);
    leaving out a MoE model's expert fields would predict it as a dense model, silently wrong."""
    accepted = accepted_columns() if accepted is None else accepted
    unknown = [c for c in row if c not in accepted]
    blocking = [c for c in unknown if row[c] not in MOE_DEFAULTS.get(c, {""})]
    kept = {k: v for k, v in row.items() if k in accepted}
    if blocking:
        return kept, (f"not predicted: the predictor does not accept the column(s) {', '.join(blocking)} yet "
                      "(predict-batch rejects them; predicting without them would treat the MoE model as dense)")
    return kept, ""


@dataclass(frozen=True)
class NemoCheck:
    """Per-run table (`runs`: every checked run, predicted or with the predictor's error) and the dropped rows."""
    runs: pd.DataFrame
    dropped: pd.DataFrame

    @property
    def dropped_counts(self) -> dict[str, int]:
        return reason_counts(self.dropped)

    def summary(self, by: str | None = None) -> pd.DataFrame:
        """MAPE, median, worst and mean signed error of the predicted runs, and how many runs were not predicted."""
        rows = []
        for name, g in summary_groups(self.runs, by):
            ok = g[g["predicted_s"].notna()]
            rows.append({"group": name, "runs": len(g), "predicted": len(ok), **error_stats(ok),
                         "not_fitting": int((~ok["fits"].astype(bool)).sum()),
                         "tight": int(ok["memory_tight"].astype(bool).sum()) if "memory_tight" in ok else 0,
                         "not_predicted": int(g["predicted_s"].isna().sum())})
        return pd.DataFrame(rows)


def run_check(sources: list[str] | None = None, *, models_dir: str | None = None, path: Path = CATALOG,
              accepted: set[str] | None = None) -> NemoCheck:
    """Check, predict and score every usable row of `sources` (default: all) with the shipped models."""
    from predictor.plan.batch import predict_records
    doc = load(path)
    pr = published_runs(doc, sources)
    d = pr.ok.copy()
    records, blocked = [], []
    for _, r in d.iterrows():
        rec, why = predictable_record(batch_row(r, doc["models"][r["model_key"]]), accepted)
        records.append(rec)
        blocked.append(why)
    todo = [i for i, why in enumerate(blocked) if not why]
    res: list[dict[str, Any]] = [{"step_time_s": None, "memory_gib": None, "fits": False, "error": why}
                                 for why in blocked]
    # one predict_records call per set of memory options (recipe_memory_options)
    opts = [recipe_memory_options(d.iloc[i]) for i in todo]
    for o_set in dict.fromkeys(opts):
        idx = [i for i, o in zip(todo, opts) if o == o_set]
        for i, o in zip(idx, predict_records([records[i] for i in idx], models_dir, allow_oom=True,
                                             memory_options=o_set)):
            res[i] = o
    d["predicted_s"] = pd.to_numeric(pd.Series([o.get("step_time_s") for o in res], index=d.index), errors="coerce")
    d["memory_gib"] = pd.to_numeric(pd.Series([o.get("memory_gib") for o in res], index=d.index), errors="coerce")
    d["fits"] = [bool(o.get("fits")) for o in res]
    d["memory_tight"] = [bool(o.get("memory_tight")) for o in res]
    d["error"] = [o.get("error") or "" for o in res]
    d["signed_error"] = d["predicted_s"] / d["measured_s"] - 1
    d["ape"] = d["signed_error"].abs()
    d["kind"] = np.where(d["moe"], "MoE", "dense")
    return NemoCheck(d, pr.dropped)

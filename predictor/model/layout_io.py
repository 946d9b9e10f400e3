"""Build ModelSpec / Layout from loose fields (CLI flags, batch CSV rows, query strings),
filling documented defaults and naming the field at fault on bad input."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, overload

from predictor.model.bounds import check_bound
from predictor.model.errors import InfeasibleConfig
from predictor.model.frameworks import DEFAULT_FRAMEWORK
from predictor.model.presets import get_preset
from predictor.model.specs import (
    MLA_FIELDS,
    MOE_DENSE_DEFAULTS,
    MOE_FIELDS,
    V_SCHEDULES,
    Layout,
    ModelSpec,
    normalize_cuda_graphs,
)

# Mixture-of-Experts model fields (ModelSpec names = CLI flags without dashes = batch columns); empty = default.
MOE_FLOAT_FIELDS = ("capacity_factor", "moe_imbalance")
MOE_INT_FIELDS = tuple(n for n in MOE_FIELDS if n not in MOE_FLOAT_FIELDS)
# What a predict-batch output row carries back of the MoE set-up (the resolved values, preset ones included).
MOE_ECHO_COLUMNS = (*MOE_FIELDS, "ep", "etp")   # etp: the expert tensor parallelism used (an unset one resolved)
BATCH_COLUMNS = ("case_id,platform,arch,layers,hidden,heads,kv_heads,ffn_hidden,vocab,seq_len,num_gpus,tp,pp,dp,"
                 "micro_batch,global_batch,vpp,schedule,recompute,sequence_parallel,zero_stage,precision").split(",")
# Columns a batch file may add (empty cells and absent columns take the defaults); any other column is an error.
OPTIONAL_BATCH_COLUMNS = ("framework", "overlap_grad_reduce", "overlap_param_gather", "overlap_tp_comm",
                          "overlap_p2p_comm", "attention",
                          "stage_layers", "model", "name", "tied_embeddings", "cp", "head_dim", *MOE_FIELDS, "ep",
                          "grad_reduce_in_fp32", "fp8_param_gather", "tokens", "price_per_gpu_hour",
                          # all-to-all context parallelism and activation offloading (empty: p2p ring, no offload)
                          "cp_comm", "cp_a2a_size", "offload_activations",
                          # --- multi-head latent attention (docs/mla.md): attention_kind, not `attention` (the kernel)
                          "attention_kind", *MLA_FIELDS,
                          # --- interleaved MoE layers (Llama 4 Maverick)
                          "moe_layer_interval",
                          # --- sliding-window attention (GPT-OSS)
                          "sliding_window", "full_attention_interval",
                          # MoE expert tensor parallelism and the dispatch / combine overlap (Layout.etp, moe_overlap)
                          "etp", "moe_overlap",
                          # the MoE token dispatcher (Layout.moe_dispatcher; empty: alltoall)
                          "moe_dispatcher",
                          # CUDA graphs (Layout.cuda_graphs; empty: none)
                          "cuda_graphs",
                          # selective recomputation by module (Layout.recompute_modules; comma-separated)
                          "recompute_modules")

# The layout's defaults for a field not given: an omitted flag of `predict` / `search`, an empty cell of
# predict-batch, and the dashboard's inputs as they open (predictor_ui.inputs.DEFAULT_SETUP takes them from here), so
# the command line and the dashboard answer the same question the same way. DEFAULTS_DOC says them in words.
LAYOUT_DEFAULTS: dict[str, Any] = {"seq_len": 2048, "tp": 1, "pp": 1, "cp": 1, "micro_batch": 1, "vpp": 1,
                                   "schedule": "1f1b", "recompute": "none", "sequence_parallel": False,
                                   "zero_stage": 0, "precision": "bf16", "attention": "flash", "ep": 1}
# Of those, the ones the step time depends on most, named on the command line when taken by default.
SHOWN_DEFAULTS = ("seq_len", "micro_batch", "recompute", "sequence_parallel", "zero_stage", "precision")


def defaults_used(row: Mapping[str, Any]) -> dict[str, Any]:
    """The SHOWN_DEFAULTS the row leaves empty (so the answer rests on the default), with their values."""
    return {k: LAYOUT_DEFAULTS[k] for k in SHOWN_DEFAULTS if blank(row.get(k))}


DEFAULTS_DOC = """Defaults for empty cells / omitted flags (the dashboard opens on the same ones):
  kv_heads = heads (MHA); ffn_hidden = 4*hidden (gpt) or the Llama rule 256*ceil(8/3*hidden/256) (llama);
  head_dim = hidden/heads (set it where heads*head_dim != hidden, e.g. Qwen3's 128); vocab = 50257;
  seq_len = 2048; tp = pp = cp = 1; dp = num_gpus/(tp*pp*cp); num_gpus = tp*pp*cp*dp;
  micro_batch = 1; global_batch = micro_batch*dp; vpp = 1; schedule = 1f1b (interleaved when vpp > 1);
  recompute = none; sequence_parallel = false; zero_stage = 0; precision = bf16; attention = flash;
  framework = megatron (megatron, megatron-deepspeed, deepspeed, fsdp, ddp: when the data-parallel traffic runs
  and whether it overlaps compute, see predictor/model/frameworks.py); overlap_grad_reduce / overlap_param_gather =
  the framework's default; overlap_p2p_comm = the framework's default (on for Megatron-Core's interleaved schedule:
  the pipeline's sends / receives under compute in the steady 1F1B phase).
  Mixture of Experts: num_experts = 0 (dense; a preset's own count otherwise); top_k required for a MoE model;
  moe_ffn_hidden = ffn_hidden; shared_experts = 0; shared_ffn_hidden = moe_ffn_hidden; dense_layers = 0;
  capacity_factor = empty (dropless); moe_imbalance = empty (modelled from routing statistics); ep = 1
  (expert parallel: divides num_experts and tp*cp*dp); etp = empty (expert tensor parallel: the framework's
  default, tp for megatron, else 1); moe_overlap = false; moe_dispatcher = alltoall (or allgather, Megatron-Core's
  own default; a MoE model only, without moe_overlap or a capacity factor); cuda_graphs = none (Megatron-Core CUDA
  graphs: full_iteration, or per-layer scopes joined by '+' from attn, mlp, moe_router, moe_preprocess, e.g.
  attn+moe_router+moe_preprocess; host time only); recompute_modules = empty (with recompute
  selective: Megatron-Core's default core_attn; a comma-separated subset of core_attn, moe_act, layernorm,
  mla_up_proj, mlp, moe, shared_experts). num_experts = 0 on a MoE preset makes it dense (the
  preset's other MoE fields are dropped; ones you give are still checked); a dense row may write top_k (and the
  expert widths) as 0 beside num_experts 0. predict-batch: with a `model` column the columns a preset fills (arch,
  layers, hidden, heads, kv_heads, ffn_hidden, vocab) may be left out of the header.
  Multi-head latent attention (docs/mla.md): attention_kind = gqa (MHA / GQA / MQA; a preset's own otherwise);
  attention_kind mla needs kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim (q_lora_rank empty = no
  query compression) and no kv_heads / head_dim. attention_kind gqa on an MLA preset drops its MLA fields (then give
  kv_heads / head_dim as needed). moe_layer_interval = 1 (every layer past dense_layers MoE; Llama 4 Maverick 2).
  sliding_window = empty (full attention); full_attention_interval = empty (every layer windowed; GPT-OSS 2)."""


def blank(v: Any) -> bool:
    """An empty cell: None, NaN or whitespace only."""
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and v.strip() == "")


@overload
def _int(row: Mapping[str, Any], name: str) -> int | None: ...
@overload
def _int(row: Mapping[str, Any], name: str, default: int) -> int: ...
def _int(row: Mapping[str, Any], name: str, default: int | None = None) -> int | None:
    v = row.get(name)
    if v is None or blank(v):
        return default
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise InfeasibleConfig(name, f"must be an integer, got {v!r}.") from None
    except OverflowError:   # an integer beyond any float (e.g. a 400-digit one from a link)
        raise InfeasibleConfig(name, f"is far too large ({len(str(v)):,} digits).") from None
    if not f.is_integer():
        raise InfeasibleConfig(name, f"must be an integer, got {v!r}.")
    return int(f)


def _required_int(row: Mapping[str, Any], name: str) -> int:
    v = _int(row, name)
    if v is None:
        raise InfeasibleConfig(name, "is required.", f"give --{name.replace('_', '-')}.")
    return v


@overload
def _str(row: Mapping[str, Any], name: str) -> str | None: ...
@overload
def _str(row: Mapping[str, Any], name: str, default: str) -> str: ...
def _str(row: Mapping[str, Any], name: str, default: str | None = None) -> str | None:
    v = row.get(name)
    return default if blank(v) else str(v).strip().lower()


def _float(row: Mapping[str, Any], name: str) -> float | None:
    """A finite number, or None for an empty cell / an omitted flag."""
    v = row.get(name)
    if v is None or blank(v):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise InfeasibleConfig(name, f"must be a number, got {v!r}.") from None
    if not math.isfinite(f):
        raise InfeasibleConfig(name, f"must be a finite number, got {v!r}.")
    return f


def moe_given(row: Mapping[str, Any]) -> dict[str, Any]:
    """The Mixture-of-Experts fields the row gives (parsed, each named on bad input); absent / empty ones left out."""
    out: dict[str, Any] = {n: _int(row, n) for n in MOE_INT_FIELDS if not blank(row.get(n))}
    out.update({n: _float(row, n) for n in MOE_FLOAT_FIELDS if not blank(row.get(n))})
    # a dense row of a mixed dense / MoE file writes "no experts" as zeros: top_k 0 (and zero expert widths) with
    # num_experts 0, or with no num_experts and no preset, is the same as empty
    if out.get("num_experts") == 0 or ("num_experts" not in out and blank(row.get("model"))):
        for n in ("top_k", "moe_ffn_hidden", "shared_ffn_hidden"):
            if out.get(n) == 0:
                del out[n]
    return out




def mla_given(row: Mapping[str, Any]) -> dict[str, Any]:
    """The multi-head latent attention fields the row gives (attention_kind and the MLA ranks / head dimensions),
    and moe_layer_interval, sliding_window, full_attention_interval, parsed and named on bad input; absent / empty
    ones left out."""
    out: dict[str, Any] = {n: _int(row, n) for n in MLA_FIELDS if not blank(row.get(n))}
    kind = _str(row, "attention_kind")
    if kind is not None:
        out["attention_kind"] = kind.strip().lower()
    # interleaved MoE layers (Llama 4 Maverick), sliding-window attention (GPT-OSS)
    for n in ("moe_layer_interval", "sliding_window", "full_attention_interval"):
        if not blank(row.get(n)):
            out[n] = _int(row, n)
    return out


def moe_echo(model: ModelSpec, layout: Layout) -> dict[str, Any]:
    """The MoE fields, ep and etp a prediction used (None where the model leaves a field to its default; etp resolved
    to the framework's default where unset, None for a dense model)."""
    return {**{n: getattr(model, n) for n in MOE_FIELDS}, "ep": layout.ep,
            "etp": layout.expert_tp if model.is_moe else None}


def _bool(row: Mapping[str, Any], name: str, default: bool = False) -> bool:
    v = row.get(name)
    if blank(v):
        return default
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "y", "on", "1.0"):
        return True
    if s in ("0", "false", "no", "n", "off", "0.0"):
        return False
    raise InfeasibleConfig(name, f"must be true or false, got {v!r}.")


def llama_ffn(hidden: int) -> int:
    return 256 * math.ceil(8 * hidden / 3 / 256)


def model_from_fields(row: Mapping[str, Any]) -> ModelSpec:
    """A preset (`model` key) with optional overrides, or a model from its fields."""
    preset = _str(row, "model")
    attention = _str(row, "attention")
    if preset:
        m = get_preset(preset)
        over: dict[str, Any] = {k: _int(row, f) for k, f in (("num_layers", "layers"), ("hidden_size", "hidden"),
                                              ("num_heads", "heads"), ("num_kv_heads", "kv_heads"),
                                              ("ffn_hidden_size", "ffn_hidden"), ("vocab_size", "vocab"),
                                              ("head_dim", "head_dim"))
                if not blank(row.get(f))}
        if attention:
            over["attention_impl"] = attention
        moe = moe_given(row)
        if moe.get("num_experts") == 0 and m.is_moe:
            # a MoE preset made dense: its routing fields go, ones given stay (checked)
            moe = {**MOE_DENSE_DEFAULTS, **moe}
        over.update(moe)
        mla = mla_given(row)
        if mla.get("attention_kind") == "gqa" and m.is_mla:
            # an MLA preset made GQA: its MLA fields go, ones given stay (checked)
            mla = {**dict.fromkeys(MLA_FIELDS), **mla}
        over.update(mla)
        from dataclasses import replace
        m = replace(m, **over) if over else m
        m.validate()
        return m
    arch = _str(row, "arch")
    if arch is None:
        raise InfeasibleConfig("model", "no model given.",
                               "name a preset (--model llama3-70b) or give --arch and the fields.")
    for req in ("layers", "hidden", "heads"):
        if blank(row.get(req)):
            raise InfeasibleConfig(req, f"is required for a custom {arch} model.",
                                   f"give --{req.replace('_', '-')} (or a preset with --model).")
    hidden = _required_int(row, "hidden")
    ffn = _int(row, "ffn_hidden")
    if ffn is None:
        ffn = 4 * hidden if arch == "gpt" else llama_ffn(hidden)
    m = ModelSpec(name=_str(row, "name", f"custom-{arch}"), arch=arch, num_layers=_required_int(row, "layers"),
                  hidden_size=hidden, num_heads=_required_int(row, "heads"), num_kv_heads=_int(row, "kv_heads"),
                  ffn_hidden_size=ffn, head_dim=_int(row, "head_dim"),
                  vocab_size=_int(row, "vocab", 50257),
                  tied_embeddings=_bool(row, "tied_embeddings", arch == "gpt"),
                  attention_impl=attention or "flash", **moe_given(row), **mla_given(row))
    m.validate()
    return m


def _given_ints_in_range(row: Mapping[str, Any]) -> None:
    """The integer fields the user gave, positive and within their bounds, checked before any is
    derived from another (so `--tp 0` is reported as tp, not as the num_gpus it would give)."""
    for name in ("tp", "pp", "dp", "cp", "ep", "num_gpus", "micro_batch", "global_batch", "seq_len", "vpp",
                 "cp_a2a_size", "etp"):
        v = _int(row, name)
        if v is not None:
            if v <= 0:
                raise InfeasibleConfig(name, f"must be a positive integer, got {v!r}.")
            check_bound(name, v)


def layout_from_fields(row: Mapping[str, Any]) -> Layout:
    _given_ints_in_range(row)
    tp = _int(row, "tp", LAYOUT_DEFAULTS["tp"])
    pp = _int(row, "pp", LAYOUT_DEFAULTS["pp"])
    cp = _int(row, "cp", LAYOUT_DEFAULTS["cp"])   # context parallelism: num_gpus = tp * pp * cp * dp
    num_gpus = _int(row, "num_gpus")
    dp = _int(row, "dp")
    if dp is None:
        if num_gpus is None:
            dp = 1
        elif num_gpus % (tp * pp * cp):
            names, prod = ("tp*pp*cp", f"{tp * pp * cp}") if cp > 1 else ("tp*pp", f"{tp * pp}")
            raise InfeasibleConfig("num_gpus", f"{num_gpus} GPUs cannot be split into {names} = {prod} groups.",
                                   f"use a multiple of {prod} GPUs or change {names.replace('*', '/')}.")
        else:
            dp = num_gpus // (tp * pp * cp)
    if num_gpus is None:
        num_gpus = tp * pp * cp * dp
    mb = _int(row, "micro_batch", LAYOUT_DEFAULTS["micro_batch"])
    vpp = _int(row, "vpp", LAYOUT_DEFAULTS["vpp"])
    schedule = _str(row, "schedule", "interleaved" if vpp > 1 else LAYOUT_DEFAULTS["schedule"])
    if schedule in V_SCHEDULES and blank(row.get("vpp")):
        vpp = 2   # zb-v / dualpipe-v: two chunks per GPU in a V (docs/schedules.md)
    stage_layers = row.get("stage_layers")
    if not blank(stage_layers):
        try:
            stage_layers = tuple(int(x) for x in str(stage_layers).replace(";", ",").split(",") if x.strip())
        except ValueError:
            raise InfeasibleConfig("stage_layers", f"must be comma-separated integers, got {stage_layers!r}.") from None
    else:
        stage_layers = None
    return Layout(num_gpus=num_gpus, tp=tp, pp=pp, dp=dp, micro_batch=mb,
                  global_batch=_int(row, "global_batch", mb * dp),
                  seq_len=_int(row, "seq_len", LAYOUT_DEFAULTS["seq_len"]), vpp=vpp,
                  schedule=schedule, recompute=_str(row, "recompute", LAYOUT_DEFAULTS["recompute"]),
                  sequence_parallel=_bool(row, "sequence_parallel", LAYOUT_DEFAULTS["sequence_parallel"]),
                  zero_stage=_int(row, "zero_stage", LAYOUT_DEFAULTS["zero_stage"]),
                  precision=_str(row, "precision", LAYOUT_DEFAULTS["precision"]), stage_layers=stage_layers,
                  framework=_str(row, "framework", DEFAULT_FRAMEWORK),
                  overlap_grad_reduce=_opt_bool(row, "overlap_grad_reduce"),
                  overlap_param_gather=_opt_bool(row, "overlap_param_gather"), cp=cp,
                  ep=_int(row, "ep", LAYOUT_DEFAULTS["ep"]),
                  overlap_tp_comm=_bool(row, "overlap_tp_comm", False),
                  overlap_p2p_comm=_opt_bool(row, "overlap_p2p_comm"),
                  grad_reduce_in_fp32=_opt_bool(row, "grad_reduce_in_fp32"),
                  fp8_param_gather=_bool(row, "fp8_param_gather", False),
                  cp_comm=_str(row, "cp_comm", "p2p"), cp_a2a_size=_int(row, "cp_a2a_size"),
                  offload_activations=_int(row, "offload_activations", 0),
                  etp=_int(row, "etp"), moe_overlap=_bool(row, "moe_overlap", False),
                  moe_dispatcher=_str(row, "moe_dispatcher", "alltoall"),
                  cuda_graphs=normalize_cuda_graphs(_str(row, "cuda_graphs", "none")),
                  recompute_modules=parse_recompute_modules(row.get("recompute_modules")))


def parse_recompute_modules(v: Any) -> tuple[str, ...] | None:
    """Layout.recompute_modules from a cell / flag: None when empty, else the comma-separated names (checked by
    Layout.validate); 'none' (or '[]') for an explicitly empty list (a recipe's recompute_modules=[])."""
    if blank(v):
        return None
    text = str(v).strip()
    if text.lower() in ("none", "[]"):
        return ()
    return tuple(m.strip() for m in text.replace(";", ",").split(",") if m.strip())


def _opt_bool(row: Mapping[str, Any], name: str) -> bool | None:
    """True / False, or None (the default) for an empty cell."""
    return None if blank(row.get(name)) else _bool(row, name)

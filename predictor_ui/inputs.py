"""Input widgets. Every widget has a key and is bound to the URL query string
(`bind="query-params"`), so the address bar is always a shareable link to what is on screen;
values equal to the default stay out of the URL. Field names are the CLI / predict-batch names
(model, platform, num_gpus, tp, pp, dp, micro_batch, global_batch, seq_len, ...), with a prefix
("a_", "b_", ...) on the Compare page.
"""
from __future__ import annotations

import json
from typing import Any

import streamlit as st

from predictor.hardware.platforms import load_devices, load_platforms, save_cluster, supported_precisions
from predictor.model.errors import InfeasibleConfig
from predictor.model.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, get_framework
from predictor.model.layout_io import LAYOUT_DEFAULTS, llama_ffn, model_from_fields
from predictor.model.presets import get_preset, list_presets
from predictor.model.specs import (
    ATTENTION_KINDS,
    MLA_FIELDS,
    PRECISIONS,
    RECOMPUTES,
    SCHEDULE_HELP,
    SCHEDULES,
    V_SCHEDULES,
)

from . import config, experts, fmt, urlcheck
from .clusters import CUSTOM_FIELDS, DASHBOARD_SOURCE, custom_platform

CUSTOM = "custom"
BIND = "query-params"

# The planner's canonical question: Llama-3 70B on 512 H100s, TP 8 x PP 4, global batch 1024; the rest of the
# layout as `python -m predictor predict` takes it when not given (predictor.model.layout_io.LAYOUT_DEFAULTS), so the
# same question gets the same answer on both.
DEFAULT_SETUP: dict[str, Any] = {
    **LAYOUT_DEFAULTS, "model": "llama3-70b", "platform": "dgx-h100", "num_gpus": 512, "tp": 8, "pp": 4, "dp": None,
    "global_batch": 1024,
}
CUSTOM_MODEL_DEFAULT = {"arch": "llama", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                        "ffn_hidden": 14336, "vocab": 128256, "head_dim": None}
CUSTOM_CLUSTER_DEFAULT = {"c_name": "my-cluster", "c_device": "h100-sxm5-80gb", "c_gpn": 8, "c_intra_bw": 450.0,
                          "c_intra_lat": 8.0, "c_inter_bw": 50.0, "c_inter_lat": 10.0, "c_models": "auto"}
TARGET_DEFAULT = {"tokens_b": 2000.0, "price": None}
# --- Multi-head latent attention (docs/mla.md): a custom MLA model opens on DeepSeek-V3's shapes
CUSTOM_MLA_DEFAULT = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                      "v_head_dim": 128}
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def _k(prefix: str, name: str) -> str:
    return f"{prefix}{name}"


# --------------------------------------------------------------------------- model
def _fill_custom_from_preset(prefix: str) -> None:
    """When the user switches the model to 'custom', start from the preset they had (its experts too); when
    they switch to a MoE preset, its experts replace the ones on screen (keyed widgets keep their value else)."""
    name = st.session_state.get(_k(prefix, "model"))
    if name != CUSTOM:
        if name:
            m = get_preset(name)
            if m.is_moe:
                experts.set_state(prefix, experts.preset_values(m))
        return
    last = st.session_state.get(_k(prefix, "_last_preset"))
    if not last:
        return
    m = get_preset(last)
    vals = {"arch": m.arch, "layers": m.num_layers, "hidden": m.hidden_size, "heads": m.num_heads,
            "kv_heads": m.kv_heads, "ffn_hidden": m.ffn, "vocab": m.vocab_size, "head_dim": m.head_dim,
            "moe": m.is_moe, **experts.preset_values(m), "attention_kind": m.attention_kind,
            **({n: getattr(m, n) for n in MLA_FIELDS} if m.is_mla else {}),
            "moe_layer_interval": m.moe_layer_interval, "sliding_window": m.sliding_window,
            "full_attention_interval": m.full_attention_interval}
    for f, v in vals.items():
        st.session_state[_k(prefix, f)] = v


def model_inputs(prefix: str = "", container=None, default: str | None = None) -> dict[str, Any]:
    """Preset or custom transformer; returns the model fields (layout_io names)."""
    c = urlcheck.guard(container)   # a bound widget's URL value is checked before it is built
    options = list_presets() + [CUSTOM]
    default = default or DEFAULT_SETUP["model"]

    # Bound selectboxes show the raw option (the URL holds it), details go in a caption.
    name = c.selectbox("Model", options, index=options.index(default), key=_k(prefix, "model"),
                       bind=BIND, on_change=_fill_custom_from_preset, args=(prefix,),
                       help="A published architecture, or 'custom' to enter layers, hidden size, heads, ...")
    if name != CUSTOM:
        st.session_state[_k(prefix, "_last_preset")] = name
        return experts.preset_model_inputs(prefix, c, name)   # caption with total / active parameters
    d = CUSTOM_MODEL_DEFAULT
    arch = c.selectbox("Architecture", ["llama", "gpt"], index=0 if d["arch"] == "llama" else 1,
                       key=_k(prefix, "arch"), bind=BIND,
                       help="llama: RMSNorm, RoPE, SwiGLU, GQA. gpt: LayerNorm, GeLU, MHA, learned positions.")
    a, b = c.columns(2)
    layers = a.number_input("Layers", 1, 1000, d["layers"], key=_k(prefix, "layers"), bind=BIND)
    hidden = b.number_input("Hidden size", 64, 131072, d["hidden"], step=128, key=_k(prefix, "hidden"), bind=BIND)
    heads = a.number_input("Heads", 1, 1024, d["heads"], key=_k(prefix, "heads"), bind=BIND)
    kind = b.selectbox("Attention kind", ATTENTION_KINDS, index=0, key=_k(prefix, "attention_kind"), bind=BIND,
                       help="gqa: multi-head / grouped-query / multi-query attention (KV heads, head dim). mla: "
                            "multi-head latent attention (DeepSeek-V2 / V3: low-rank compressed query and key / "
                            "value with a decoupled RoPE part; docs/mla.md).")
    if kind == "mla":   # every head has its own up-projected key and value: no KV heads / head dim
        kv, head_dim = None, None
    else:
        kv = a.number_input("KV heads", 1, 1024, d["kv_heads"], key=_k(prefix, "kv_heads"), bind=BIND,
                            help="Key/value heads: = heads for multi-head attention, fewer for grouped-query "
                                 "attention.")
        head_dim = b.number_input("Head dim", min_value=1, max_value=4096, value=d["head_dim"], step=8,
                                  key=_k(prefix, "head_dim"), bind=BIND, placeholder="hidden / heads",
                                  help="Attention head dimension. Blank = hidden / heads; set it where heads x head "
                                       "dim differs from hidden (Qwen3: 128).")
    ffn = b.number_input("FFN hidden", 0, 1_000_000, d["ffn_hidden"], step=256, key=_k(prefix, "ffn_hidden"),
                         bind=BIND, help="MLP inner width (each of gate and up for SwiGLU). 0 = the architecture's "
                                         f"rule (4·hidden for gpt, {llama_ffn(4096)} for a 4096 llama).")
    vocab = a.number_input("Vocabulary", 1, 2_000_000, d["vocab"], key=_k(prefix, "vocab"), bind=BIND)
    fields = {"arch": arch, "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv,
              "ffn_hidden": ffn or None, "vocab": vocab, "head_dim": head_dim, "name": "custom",
              **(mla_inputs(prefix, c) if kind == "mla" else {}), **window_inputs(prefix, c),
              **experts.custom_moe_inputs(prefix, c)}
    if "num_experts" in fields:   # interleaved MoE layers (Llama 4 Maverick)
        fields["moe_layer_interval"] = c.number_input(
            "MoE every n-th layer", 1, 4096, 1, key=_k(prefix, "moe_layer_interval"), bind=BIND,
            help="1 = every layer after the dense ones is a MoE layer; 2 = dense and MoE alternating (Llama 4 "
                 "Maverick).")
    if "num_experts" in fields:
        try:
            c.caption(experts.moe_summary(model_from_fields(fields)))
        except InfeasibleConfig:
            pass   # the page shows the warning naming the field
    return fields


def window_inputs(prefix: str, c) -> dict[str, Any]:
    """Sliding-window attention of a custom model (docs/mla.md): the window and the full-attention interval, both
    blank by default (full attention in every layer)."""
    a, b = c.columns(2)
    w = a.number_input("Sliding window", min_value=1, max_value=2 ** 22, value=None, step=128,
                       key=_k(prefix, "sliding_window"), bind=BIND, placeholder="full attention",
                       help="Each query attends to this many tokens (GPT-OSS: 128). Blank = full causal attention.")
    k = b.number_input("Full attention every", min_value=1, max_value=4096, value=None,
                       key=_k(prefix, "full_attention_interval"), bind=BIND, placeholder="every layer windowed",
                       help="With a window: every n-th layer keeps full attention (GPT-OSS: 2). Blank = every layer "
                            "windowed.")
    return {"sliding_window": w, "full_attention_interval": k}


def mla_inputs(prefix: str, c) -> dict[str, Any]:
    """The multi-head latent attention fields of a custom model (shown when its attention kind is MLA)."""
    d = CUSTOM_MLA_DEFAULT
    a, b = c.columns(2)
    q = a.number_input("Q LoRA rank", min_value=1, max_value=131072, value=d["q_lora_rank"], step=64,
                       key=_k(prefix, "q_lora_rank"), bind=BIND, placeholder="no query compression",
                       help="Query compression rank (DeepSeek-V3 1536). Blank = the query is projected from the "
                            "hidden state directly (DeepSeek-V2-Lite).")
    kv = b.number_input("KV LoRA rank", 1, 131072, d["kv_lora_rank"], step=64, key=_k(prefix, "kv_lora_rank"),
                        bind=BIND, help="Key / value latent rank (DeepSeek-V2 / V3: 512).")
    nope = a.number_input("QK head dim (no RoPE)", 1, 4096, d["qk_nope_head_dim"], step=8,
                          key=_k(prefix, "qk_nope_head_dim"), bind=BIND, help="DeepSeek-V3: 128.")
    rope = b.number_input("QK RoPE head dim", 1, 4096, d["qk_rope_head_dim"], step=2,
                          key=_k(prefix, "qk_rope_head_dim"), bind=BIND, help="Decoupled RoPE part, even (64).")
    v = a.number_input("V head dim", 1, 4096, d["v_head_dim"], step=8, key=_k(prefix, "v_head_dim"), bind=BIND,
                       help="Value head dimension (DeepSeek-V3: 128).")
    return {"attention_kind": "mla", "q_lora_rank": q, "kv_lora_rank": kv, "qk_nope_head_dim": nope,
            "qk_rope_head_dim": rope, "v_head_dim": v}


# --------------------------------------------------------------------------- platform
def platform_options() -> dict[str, Any]:
    """The platform catalog (+ the user's clusters file); a broken catalog stops the page with its message."""
    try:
        return dict(load_platforms(config.clusters_file_arg()))
    except Exception as e:  # noqa: BLE001 - a catalog / clusters file that does not parse
        fix = f" Fix: {e.fix}" if getattr(e, "fix", "") else ""
        st.error(f"The platform catalog cannot be read: {getattr(e, 'field', '')} {getattr(e, 'problem', e)}{fix}"
                 f" (catalog: predictor/catalog/*.json; your clusters: `{config.clusters_file()}`)",
                 icon=":material/error:")
        st.stop()


def platform_inputs(prefix: str = "", container=None, default: str | None = None,
                    allow_custom: bool = True, describe=None) -> dict[str, Any]:
    """Catalog platform or a custom cluster. Returns {'platform': id} or {'platform': 'custom', c_*...}."""
    c = urlcheck.guard(container)   # a bound widget's URL value is checked before it is built
    plats = platform_options()
    options = sorted(plats) + ([CUSTOM] if allow_custom else [])
    default = default if default in options else (DEFAULT_SETUP["platform"] if DEFAULT_SETUP["platform"] in options
                                                  else options[0])

    pid = c.selectbox("Platform", options, index=options.index(default),
                      key=_k(prefix, "platform"), bind=BIND,
                      help="A cluster from the catalog (device + network), or 'custom' to enter one.")
    if pid != CUSTOM:
        p = plats[pid]
        c.caption(f"{p.gpus_per_node}× {p.device.name.replace('NVIDIA ', '')} per node · "
                  f"{p.intra_node.kind} {p.intra_node.bandwidth_gbps:g} GB/s · "
                  f"{p.inter_node.kind} {p.inter_node.bandwidth_gbps:g} GB/s"
                  + (f" · {describe(pid)}" if describe else ""))
        return {"platform": pid}
    return {"platform": CUSTOM, **custom_cluster_inputs(prefix, c, plats)}


def custom_cluster_inputs(prefix: str, c, plats: dict[str, Any]) -> dict[str, Any]:
    d = CUSTOM_CLUSTER_DEFAULT
    devs = load_devices()
    dev_ids = sorted(devs)
    backed = sorted({p.op_models for p in plats.values() if p.op_models})
    name = c.text_input("Cluster name", d["c_name"], key=_k(prefix, "c_name"), bind=BIND)
    dev = c.selectbox("Device", dev_ids, index=dev_ids.index(d["c_device"]) if d["c_device"] in dev_ids else 0,
                      key=_k(prefix, "c_device"), bind=BIND, help="Catalog device id")
    c.caption(f"{devs[dev].name}: {devs[dev].hbm_gib:g} GiB, {devs[dev].peak_flops('bf16') / 1e12:g} TFLOP/s bf16")
    a, b = c.columns(2)
    gpn = a.number_input("GPUs per node", 1, 72, d["c_gpn"], key=_k(prefix, "c_gpn"), bind=BIND)
    intra = b.number_input("Intra-node GB/s", 0.0, 5000.0, d["c_intra_bw"], key=_k(prefix, "c_intra_bw"), bind=BIND,
                           help="Per GPU, one direction (NVLink 3: 300, NVLink 4: 450).")
    inter = a.number_input("Inter-node GB/s", 0.0, 1000.0, d["c_inter_bw"], key=_k(prefix, "c_inter_bw"), bind=BIND,
                           help="Per GPU, one direction (one 200 Gb/s NIC per GPU = 25, 400 Gb/s = 50).")
    lat = b.number_input("Inter-node latency µs", 0.0, 1000.0, d["c_inter_lat"], key=_k(prefix, "c_inter_lat"),
                         bind=BIND)
    opts = ["auto", "none"] + backed
    src = getattr(devs[dev], "transfer_source", None)
    models = c.selectbox("Operator times from", opts, index=0, key=_k(prefix, "c_models"), bind=BIND,
                         help=f"auto: the device's closest sampled relative ({src or 'none'}), rescaled to this "
                              "device (transferred). none: roofline estimates from the device specs (analytical). "
                              "A platform: its trained regressors, rescaled to this device.")
    fields = {"c_name": name, "c_device": dev, "c_gpn": gpn, "c_intra_bw": intra, "c_intra_lat": d["c_intra_lat"],
              "c_inter_bw": inter, "c_inter_lat": lat, "c_models": models}
    if c.button("Save to my clusters", key=_k(prefix, "c_save"), icon=":material/save:",
                help=f"Adds it to {config.clusters_file()}, so every page (and `python -m predictor ... --clusters`) "
                     "can pick it by name"):
        try:
            p = custom_platform(fields)
        except Exception as e:  # noqa: BLE001 - InfeasibleConfig: shown below the inputs by the page
            c.warning(f"Not saved: {e}")
        else:
            if p.platform_id in plats:
                c.warning(f"'{p.platform_id}' is already a platform; choose another cluster name.")
            else:
                save_cluster(config.clusters_file(), p, DASHBOARD_SOURCE)
                c.success(f"Saved '{p.platform_id}': pick it in the platform list.")
    return fields


def platform_key(fields: dict[str, Any]) -> str:
    """A hashable, cache-friendly name of the platform choice."""
    if fields.get("platform") != CUSTOM:
        return str(fields["platform"])
    return CUSTOM + ":" + json.dumps({k: fields.get(k) for k in CUSTOM_FIELDS}, sort_keys=True)


# --------------------------------------------------------------------------- layout
def layout_inputs(prefix: str = "", container=None, defaults: dict[str, Any] | None = None,
                  show_gpus: bool = True, stage_layers: bool = False, more: str | None = None,
                  model: dict[str, Any] | None = None, precisions: list[str] | None = None) -> dict[str, Any]:
    """TP, PP, CP, DP, EP, micro-batch, global batch, sequence, schedule, virtual stages, recomputation, SP, ZeRO.
    `more`: the label of a collapsed expander that holds everything after the batch sizes. `model`: the model
    fields, for the expert-parallel choices (disabled for a dense model). `precisions`: the precisions the picker
    offers (the selected device's, `precision_choices`); default all."""
    c = urlcheck.guard(container)   # a bound widget's URL value is checked before it is built
    d = {**DEFAULT_SETUP, **(defaults or {})}
    out: dict[str, Any] = {}
    if show_gpus:
        out["num_gpus"] = c.number_input("GPUs", 1, 1_000_000, d["num_gpus"], key=_k(prefix, "num_gpus"), bind=BIND,
                                         help="Total GPUs = TP × PP × CP × DP.")
    # two to a row: four number inputs side by side in the sidebar cut "32" to "3" at 1366 px (#36)
    a, b = c.columns(2)
    f, e = c.columns(2)
    out["tp"] = a.number_input("TP", 1, 512, d["tp"], key=_k(prefix, "tp"), bind=BIND, help="Tensor-parallel degree")
    out["pp"] = b.number_input("PP", 1, 512, d["pp"], key=_k(prefix, "pp"), bind=BIND, help="Pipeline stages")
    out["cp"] = f.number_input("CP", 1, 1024, d.get("cp", 1), key=_k(prefix, "cp"), bind=BIND,
                               help="Context-parallel degree: each sequence split over CP ranks (Megatron-Core ring "
                                    "attention); sequence / CP must be a multiple of 2 × CP")
    if show_gpus:
        out["dp"] = e.number_input("DP", 1, 1_000_000, d["dp"], key=_k(prefix, "dp"), bind=BIND, placeholder="auto",
                                   help="Data-parallel degree; leave empty for GPUs / (TP × PP × CP).")
    out["ep"] = experts.ep_input(prefix, c, experts.num_experts_of(model) if model else 0, _stage_ranks(out))
    # MoE expert tensor parallelism and the dispatch / combine overlap
    a, b = c.columns(2)
    out["etp"] = experts.etp_input(prefix, a, experts.num_experts_of(model) if model else 0, out.get("tp"))
    out["moe_overlap"] = experts.moe_overlap_input(prefix, b, experts.num_experts_of(model) if model else 0,
                                                   int(out["ep"]))
    out["moe_dispatcher"] = experts.moe_dispatcher_input(prefix, c, experts.num_experts_of(model) if model else 0)
    out["cuda_graphs"] = experts.cuda_graphs_input(prefix, c)
    a, b = c.columns(2)
    out["micro_batch"] = a.number_input("Micro-batch", 1, 4096, d["micro_batch"], key=_k(prefix, "micro_batch"),
                                        bind=BIND, help="Sequences per micro-batch per GPU")
    out["global_batch"] = b.number_input("Global batch", 1, 10_000_000, d["global_batch"],
                                         key=_k(prefix, "global_batch"), bind=BIND,
                                         help="Sequences per optimizer step (a multiple of micro-batch × DP)")
    if more is not None:
        # a compact setup column (Compare: four setups at 1366 px are ~230 px wide): half-width pickers there cut
        # "interleaved" to "interleavec", "2048" to "204" and break "Precision" in two, so one input per row
        c = c.expander(more)
        a = b = c
    seqs = list(SEQ_LENS)
    if d["seq_len"] not in seqs:
        seqs = sorted(seqs + [d["seq_len"]])
    out["seq_len"] = a.selectbox("Sequence length", seqs, index=seqs.index(d["seq_len"]), key=_k(prefix, "seq_len"),
                                 bind=BIND)
    out["precision"] = precision_picker(b, _k(prefix, "precision"), d["precision"], precisions)
    out["schedule"] = a.selectbox("Schedule", list(SCHEDULES), index=list(SCHEDULES).index(d["schedule"]),
                                  key=_k(prefix, "schedule"), bind=BIND,
                                  help="  \n".join(f"{k}: {v}" for k, v in SCHEDULE_HELP.items())
                                  + "  \n(interleaved needs virtual stages ≥ 2; zb-v and dualpipe-v run 2 per GPU)")
    out["vpp"] = b.number_input("Virtual stages", 1, 64, d["vpp"], key=_k(prefix, "vpp"), bind=BIND,
                                disabled=out["schedule"] != "interleaved",
                                help="Model chunks per GPU for the interleaved schedule")
    if out["schedule"] in V_SCHEDULES:   # two chunks per GPU in a V (docs/schedules.md)
        out["vpp"] = 2
    elif out["schedule"] != "interleaved":
        out["vpp"] = 1
    out["recompute"] = a.selectbox("Recomputation", list(RECOMPUTES), index=list(RECOMPUTES).index(d["recompute"]),
                                   key=_k(prefix, "recompute"), bind=BIND,
                                   help="Activation recomputation: none, selective (the modules below; Megatron-Core's "
                                        "default: core attention), full (whole layer)")
    out["zero_stage"] = b.selectbox("ZeRO stage", [0, 1, 2, 3], index=int(d["zero_stage"]),
                                    key=_k(prefix, "zero_stage"), bind=BIND,
                                    help="0: replicated optimizer; 1: optimizer states sharded over DP; "
                                         "2: + gradients; 3: + parameters")
    # selective recomputation by module (Layout.recompute_modules; docs/memory.md)
    out["recompute_modules"] = c.text_input(
        "Recomputed modules", "", key=_k(prefix, "recompute_modules"), bind=BIND, placeholder="core_attn",
        disabled=out["recompute"] != "selective",
        help="With selective recomputation, the modules re-run in the backward (Megatron-Core recompute_modules), "
             "comma-separated: core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts; empty = "
             "core_attn (Megatron-Core's default), none = no module") or None
    if out["recompute"] != "selective":
        out["recompute_modules"] = None
    out["sequence_parallel"] = c.toggle("Sequence parallelism", d["sequence_parallel"],
                                        key=_k(prefix, "sequence_parallel"), bind=BIND,
                                        help="Megatron SP: norms/dropout split along the sequence over TP ranks")
    out.update(precision_memory_inputs(prefix, c, out["precision"]))
    out.update(framework_inputs(prefix, c, tp_overlap_possible=out["tp"] > 1 and bool(out["sequence_parallel"])))
    out.update(cp_offload_inputs(prefix, c, int(out["cp"] or 1), int(out["pp"] or 1), str(out["recompute"])))
    if stage_layers:
        out["stage_layers"] = c.text_input("Layers per stage (optional)", "", key=_k(prefix, "stage_layers"),
                                           bind=BIND, placeholder="even split",
                                           help="An uneven split, e.g. 19,21,21,19: PP × virtual-stage entries, "
                                                "first stage first, summing to the layers") or None
    return out


# The tri-state switches' choices; "default": the framework's (overlaps) or the precision's (gradients). Short
# labels fit the sidebar's columns.
TRI_STATE_CHOICES = {"default": None, "on": True, "off": False}


TRI_STATE_FIELDS = ("overlap_grad_reduce", "overlap_param_gather", "grad_reduce_in_fp32", "overlap_p2p_comm")


def query_value(name: str, value: Any) -> str:
    """A layout field as the Predict page's widget reads it from the URL: the on / off selects for the tri-state
    switches (None stays out of the URL), 'true' / 'false' for toggles, the value's text otherwise."""
    if name in TRI_STATE_FIELDS and isinstance(value, bool):
        return next(label for label, v in TRI_STATE_CHOICES.items() if v is value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def precision_picker(container: Any, key: str, default: str, precisions: list[str] | None = None) -> str:
    """The precision selectbox offering `precisions` (the selected device's, `precision_choices`; default all); a
    value left from another device that this one cannot run falls back to `default` (or bf16)."""
    choices = list(precisions) if precisions else list(PRECISIONS)
    first = default if default in choices else ("bf16" if "bf16" in choices else choices[0])
    if key in st.session_state and st.session_state[key] not in choices:
        st.session_state[key] = first
    return container.selectbox("Precision", choices, index=choices.index(first), key=key, bind=BIND,
                               help="fp8: per-tensor scaled FP8 GEMMs; mxfp8: MX FP8 (Blackwell) / blockwise FP8 "
                                    "(Hopper); nvfp4: NVFP4 GEMMs (Blackwell). Only the formats the selected GPU "
                                    "runs are offered.")


def precision_choices(platform: Any) -> list[str] | None:
    """The precisions the platform's device runs (predictor.hardware.platforms.supported_precisions); None (all)
    when the platform cannot be resolved (its own error is shown by the prediction)."""
    try:
        return supported_precisions(platform.device) or None
    except Exception:  # noqa: BLE001 - a half-entered custom platform: offer everything, the prediction says why
        return None


def precision_memory_inputs(prefix: str, container: Any, precision: str) -> dict[str, Any]:
    """The gradient precision and FP8 primary weights (the CLI's --[no-]grad-reduce-in-fp32, --fp8-param-gather):
    {grad_reduce_in_fp32 (None = the precision's default), fp8_param_gather (fp8 only)}."""
    container = urlcheck.guard(container)
    grad = container.selectbox("FP32 gradients", list(TRI_STATE_CHOICES), key=_k(prefix, "grad_reduce_in_fp32"),
                               bind=BIND, disabled=precision == "fp32",
                               help="Gradient buffers and their data-parallel reduction in fp32 (on: Megatron-LM's "
                                    "default for bf16 and fp8) or in bf16 (off: NeMo / Megatron-Bridge performance "
                                    "recipes); default: the precision's")
    fp8p = container.toggle("FP8 primary weights", False, key=_k(prefix, "fp8_param_gather"), bind=BIND,
                    disabled=precision != "fp8",
                    help="Megatron --fp8-param-gather: the GEMM weights kept and all-gathered in FP8 only (no BF16 "
                         "copy); precision fp8")
    return {"grad_reduce_in_fp32": None if precision == "fp32" else TRI_STATE_CHOICES[grad],
            "fp8_param_gather": bool(fp8p) and precision == "fp8"}


def framework_inputs(prefix: str = "", container=None, tp_overlap_possible: bool = True) -> dict[str, Any]:
    """The training framework and its overlap switches (the CLI's --framework, --overlap-grad-reduce,
    --overlap-param-gather, --overlap-tp-comm, --overlap-p2p-comm): {framework, overlap_grad_reduce,
    overlap_param_gather, overlap_p2p_comm (None = the framework's default), overlap_tp_comm}. The TP overlap is off
    and disabled where it cannot apply (tp 1 or no sequence parallelism)."""
    c = urlcheck.guard(container)   # a bound widget's URL value is checked before it is built
    names = list(FRAMEWORKS)
    fw = c.selectbox("Framework", names, index=names.index(DEFAULT_FRAMEWORK), key=_k(prefix, "framework"),
                     bind=BIND, help="What the framework does with the data-parallel traffic and its host time: "
                     + "; ".join(f"{n}: {get_framework(n).description}" for n in names))
    f = get_framework(fw)
    on_off = lambda v: "on" if v else "off"  # noqa: E731
    a, b = c.columns(2)
    grad = a.selectbox("Grad reduce overlap", list(TRI_STATE_CHOICES), key=_k(prefix, "overlap_grad_reduce"), bind=BIND,
                       disabled=not f.overlap_switch,
                       help=f"The data-parallel gradient reduction hidden behind the backward; {fw}'s default: "
                            f"{on_off(f.overlap_grad_reduce)}")
    gather = b.selectbox("Param gather overlap", list(TRI_STATE_CHOICES), key=_k(prefix, "overlap_param_gather"),
                         bind=BIND, disabled=not f.overlap_switch,
                         help=f"The distributed optimizer's parameter all-gather hidden behind the next forward; "
                              f"{fw}'s default: {on_off(f.overlap_param_gather)}")
    p2p = c.selectbox("PP send / receive overlap", list(TRI_STATE_CHOICES), key=_k(prefix, "overlap_p2p_comm"),
                      bind=BIND, disabled=fw != "megatron",
                      help="Megatron-Core overlap_p2p_comm: in the interleaved schedule's steady phase the pipeline's "
                           "sends / receives run under the neighbouring chunk's compute (warm-up and cool-down stay "
                           "exposed); default: on for megatron's interleaved schedule, off otherwise")
    tp_ov = c.toggle("Overlap TP communication", False, key=_k(prefix, "overlap_tp_comm"), bind=BIND,
                     disabled=not tp_overlap_possible,
                     help="Transformer Engine's TP communication overlap (Megatron-Core --tp-comm-overlap, NeMo's "
                          "tp_comm_overlap): each layer's sequence-parallel exchanges hidden under its TP GEMMs; "
                          "needs TP > 1 with sequence parallelism")
    return {"framework": fw, "overlap_grad_reduce": TRI_STATE_CHOICES[grad] if f.overlap_switch else None,
            "overlap_param_gather": TRI_STATE_CHOICES[gather] if f.overlap_switch else None,
            "overlap_tp_comm": bool(tp_ov) and tp_overlap_possible,
            "overlap_p2p_comm": TRI_STATE_CHOICES[p2p] if fw == "megatron" else None}


def _stage_ranks(out: dict[str, Any]) -> int | None:
    """TP × CP × DP (the ranks of a pipeline stage), DP derived from the GPUs when left empty; None if unknown."""
    tp, pp, cp, dp, n = (out.get(k) for k in ("tp", "pp", "cp", "dp", "num_gpus"))
    if dp is None and n and tp and pp and cp and n % (tp * pp * cp) == 0:
        dp = n // (tp * pp * cp)
    return tp * cp * dp if tp and cp and dp else None


def target_inputs(prefix: str = "", container=None) -> dict[str, Any]:
    """The token target and the price per GPU-hour (None when not entered: no cost is shown)."""
    c = urlcheck.guard(container)   # a bound widget's URL value is checked before it is built
    a, b = c.columns(2)
    tokens_b = a.number_input("Token target (billions)", 0.001, 1e6, TARGET_DEFAULT["tokens_b"],
                              key=_k(prefix, "tokens_b"), bind=BIND, help="2000 = 2T tokens")
    price = b.number_input("$ per GPU-hour", 0.0, 1000.0, None, step=0.1, key=_k(prefix, "price"), bind=BIND,
                           placeholder="enter a price", help="Your rate per GPU-hour")
    return {"tokens": float(tokens_b) * 1e9, "price": price}


def setup_caption(model_fields: dict[str, Any], plat_fields: dict[str, Any], layout: Any) -> str:
    name = model_fields.get("model") or "custom model"
    pid = plat_fields.get("c_name") if plat_fields.get("platform") == CUSTOM else plat_fields.get("platform")
    L = layout
    rc = f"recompute {L.recompute}" + (f" ({','.join(L.selective_modules) or 'no modules'})"
                                       if L.recompute == "selective" else "")
    extra = [L.schedule] + ([f"vpp {L.vpp}"] if L.vpp > 1 else []) + [rc] + \
        (["SP"] if L.sequence_parallel else []) + ([f"ZeRO-{L.zero_stage}"] if L.zero_stage else []) + [L.precision] + \
        ([f"layers per stage {','.join(map(str, L.stage_layers))}"] if L.stage_layers else []) + [L.framework] + \
        (["TP overlap"] if L.overlap_tp_comm else []) + (["PP send / receive overlap"] if L.pp_comm_overlap else []) + \
        ([f"gradients in {'fp32' if L.grad_bytes == 4 else 'bf16' if L.precision != 'fp16' else 'fp16'}"]
         if L.grad_reduce_in_fp32 is not None else []) + (["FP8 primary weights"] if L.fp8_param_gather else [])
    return (f"**{name}** on **{pid}** · {L.num_gpus} GPUs = TP {L.tp} × PP {L.pp} × CP {L.cp} × DP {L.dp}"
            + (f", EP {L.ep}" if L.ep > 1 else "") + " · micro-batch "
            f"{L.micro_batch}, global batch {L.global_batch} ({L.num_micro_batches} micro-batches), seq "
            f"{L.seq_len} · {', '.join(extra)} · {fmt.count(L.tokens_per_step)} tokens/step")


# --- all-to-all context parallelism and activation offloading
CP_COMM_CHOICES = ("p2p", "a2a", "a2a+p2p")


def cp_offload_inputs(prefix: str, container: Any, cp: int, pp: int, recompute: str) -> dict[str, Any]:
    """The CP communication picker and the offloaded layers (the CLI's --cp-comm, --cp-a2a-size,
    --offload-activations): {cp_comm, cp_a2a_size (None = a node's cp ranks), offload_activations}. The picker is
    disabled with cp 1, the offload with pp > 1 or recomputation (Megatron-Core refuses both)."""
    c = urlcheck.guard(container)
    a, b = c.columns(2)
    kind = a.selectbox("CP communication", list(CP_COMM_CHOICES), key=_k(prefix, "cp_comm"), bind=BIND,
                       disabled=cp == 1,
                       help="p2p: Megatron-Core's K/V ring, hidden behind the attention blocks; a2a: DeepSpeed-Ulysses "
                            "all-to-alls of Q, K, V and the output (heads split over CP; on the critical path); "
                            "a2a+p2p: a2a inside groups of the A2A size, the ring across them")
    size = b.number_input("A2A group size", 1, 1024, None, key=_k(prefix, "cp_a2a_size"), bind=BIND,
                          placeholder="a node's", disabled=cp == 1 or kind != "a2a+p2p",
                          help="a2a+p2p: CP ranks per all-to-all group (divides CP); empty: the CP ranks of a node")
    off = c.number_input("Offloaded layers", 0, 4096, 0, key=_k(prefix, "offload_activations"), bind=BIND,
                         disabled=pp > 1 or recompute != "none",
                         help="Activation offloading (Megatron-Core cpu_offloading_num_layers, NeMo's "
                              "activation_offload_layers): the saved activations of this many layers go to host "
                              "memory over PCIe / NVLink-C2C; needs PP 1 and no recomputation")
    return {"cp_comm": kind if cp > 1 else "p2p",
            "cp_a2a_size": int(size) if size and cp > 1 and kind == "a2a+p2p" else None,
            "offload_activations": int(off or 0) if pp == 1 and recompute == "none" else 0}

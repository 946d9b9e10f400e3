"""Mixture-of-Experts inputs: the "Experts" section of the model inputs (a MoE preset's fields, editable; a custom
model's after its MoE toggle), the expert-parallel degree of the layout inputs, and the model caption with total
and active parameters. Field names and URL keys are the CLI / predict-batch names (num_experts, top_k, ..., ep)."""
from __future__ import annotations

from typing import Any

import streamlit as st

from predictor.model.bounds import bound_problem
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import MOE_FIELDS, model_from_fields
from predictor.model.model_summary import param_summary, routing_summary
from predictor.model.presets import get_preset
from predictor.model.specs import MOE_DISPATCHERS, ModelSpec, cuda_graphs_mask

BIND = "query-params"
CUSTOM_MOE_DEFAULT: dict[str, Any] = {"num_experts": 8, "top_k": 2, "moe_ffn_hidden": None, "shared_experts": 0,
                                      "shared_ffn_hidden": None, "dense_layers": 0, "capacity_factor": None,
                                      "moe_imbalance": None}


def _k(prefix: str, name: str) -> str:
    return f"{prefix}{name}"


def preset_values(m: ModelSpec) -> dict[str, Any]:
    """The MoE widget values a model starts from (a dense model: the custom MoE defaults)."""
    return {n: getattr(m, n) for n in MOE_FIELDS} if m.is_moe else dict(CUSTOM_MOE_DEFAULT)


def set_state(prefix: str, values: dict[str, Any]) -> None:
    """Put a model's MoE values into the widgets (on a model switch: keyed widgets keep their old value else)."""
    for n, v in values.items():
        st.session_state[_k(prefix, n)] = v


def moe_summary(m: ModelSpec) -> str:
    """'46.7 B parameters, 12.9 B active · 8 experts, top-2, dropless' (a dense model: its parameters)."""
    return " · ".join(p for p in (param_summary(m), routing_summary(m)) if p)


def model_caption(m: ModelSpec) -> str:
    return (f"{moe_summary(m)} · {m.num_layers} layers · hidden {m.hidden_size} · {m.num_heads} heads"
            + (f" ({m.kv_heads} KV)" if m.kv_heads != m.num_heads else "") + f" · {m.arch}")


def experts_inputs(prefix: str, c, start: dict[str, Any], preset: ModelSpec | None = None) -> dict[str, Any]:
    """The MoE fields, starting from `start` (a preset's values or the custom defaults). An emptied optional
    field means the preset's value (`preset`) or the default named in its placeholder."""
    def hint(name: str, default_words: str) -> str:
        v = getattr(preset, name) if preset is not None else None
        return f"preset: {v:g}" if v is not None else default_words

    x = c.expander("Experts", expanded=preset is None)
    a, b = x.columns(2)
    out: dict[str, Any] = {}
    out["num_experts"] = a.number_input("Experts", 1, 16384, start["num_experts"], key=_k(prefix, "num_experts"),
                                        bind=BIND, help="Routed experts per MoE layer")
    out["top_k"] = b.number_input("Top-k", 1, 1024, start["top_k"], key=_k(prefix, "top_k"), bind=BIND,
                                  help="Experts each token is routed to (at most the experts)")
    out["moe_ffn_hidden"] = a.number_input("Expert FFN", 1, 2 ** 19, start["moe_ffn_hidden"], step=128,
                                           key=_k(prefix, "moe_ffn_hidden"), bind=BIND,
                                           placeholder=hint("moe_ffn_hidden", "= FFN hidden"),
                                           help="Width of one routed expert. Blank = the FFN hidden size.")
    out["shared_experts"] = b.number_input("Shared experts", 0, 1024, start["shared_experts"],
                                           key=_k(prefix, "shared_experts"), bind=BIND,
                                           help="Always-on experts every token passes through")
    out["shared_ffn_hidden"] = a.number_input("Shared FFN", 1, 2 ** 19, start["shared_ffn_hidden"], step=128,
                                              key=_k(prefix, "shared_ffn_hidden"), bind=BIND,
                                              placeholder=hint("shared_ffn_hidden", "= expert FFN"),
                                              help="Width of one shared expert. Blank = the expert FFN width.")
    out["dense_layers"] = b.number_input("Dense layers", 0, 4096, start["dense_layers"],
                                         key=_k(prefix, "dense_layers"), bind=BIND,
                                         help="Leading layers that keep the dense MLP (DeepSeek: 3)")
    out["capacity_factor"] = a.number_input("Capacity factor", 0.0, 1024.0, start["capacity_factor"], step=0.05,
                                            key=_k(prefix, "capacity_factor"), bind=BIND,
                                            placeholder=hint("capacity_factor", "dropless"),
                                            help="Tokens an expert takes, over its even share; beyond it tokens "
                                                 "are dropped. Blank = dropless routing.")
    out["moe_imbalance"] = b.number_input("Load imbalance", 1.0, 16384.0, start["moe_imbalance"], step=0.05,
                                          key=_k(prefix, "moe_imbalance"), bind=BIND,
                                          placeholder=hint("moe_imbalance", "modelled"),
                                          help="The busiest expert-parallel rank's tokens over the mean (1 = "
                                               "perfect balance). Blank = modelled from routing statistics.")
    return out


def preset_model_inputs(prefix: str, c, name: str) -> dict[str, Any]:
    """A preset: its caption (total and active parameters), and for a MoE preset its Experts section."""
    m = get_preset(name)
    cap = c.empty()
    fields: dict[str, Any] = {"model": name}
    if m.is_moe:
        fields.update(experts_inputs(prefix, c, preset_values(m), preset=m))
    try:
        shown = model_from_fields(fields)
    except InfeasibleConfig:   # the page shows the warning; the caption keeps the preset's own numbers
        shown = m
    cap.caption(model_caption(shown))
    return fields


def custom_moe_inputs(prefix: str, c) -> dict[str, Any]:
    """A custom model's MoE toggle and, when on, its Experts section."""
    on = c.toggle("Mixture of Experts", False, key=_k(prefix, "moe"), bind=BIND,
                  help="Replace the MLP of each layer by routed experts (Mixtral, Qwen3-MoE, ...)")
    return experts_inputs(prefix, c, CUSTOM_MOE_DEFAULT) if on else {}


def num_experts_of(model_fields: dict[str, Any]) -> int:
    """The expert count of the model the fields describe (0 when dense, or when the fields do not make a model)."""
    try:
        return model_from_fields(model_fields).num_experts
    except InfeasibleConfig:
        return int(model_fields.get("num_experts") or 0)


def ep_choices(num_experts: int, ranks: int | None) -> list[int]:
    """Divisors of num_experts that divide the tp*cp*dp ranks of a stage (all divisors when ranks is unknown)."""
    if num_experts <= 0:
        return [1]
    return [e for e in range(1, num_experts + 1) if num_experts % e == 0 and (ranks is None or ranks % e == 0)]


# --- MoE expert tensor parallelism and the dispatch / combine overlap ---
ETP_DEFAULT = "default"   # the ETP select's entry for Layout.etp None (the framework's default)


def etp_input(prefix: str, c, num_experts: int, tp: int | None) -> int | None:
    """Expert tensor parallelism: the framework's default (None), 1 (experts whole) or TP; a value held now that is
    none of those (from the URL) is kept so that the page can name it (never silently replaced). Disabled for a dense
    model unless it holds a value to undo."""
    key = _k(prefix, "etp")
    opts: list[Any] = [ETP_DEFAULT, *sorted({1, int(tp or 1)})]
    cur = _current(key)
    if cur is not None and cur >= 1 and bound_problem("etp", cur) is None and cur not in opts:
        opts.append(cur)   # (a value beyond the bound stays out: the link check names it)
    v = c.selectbox("ETP", opts, index=0, key=key, bind=BIND, disabled=not num_experts and cur is None,
                    help="Expert tensor-parallel degree (Megatron-Core expert_tensor_parallel_size): each routed "
                         "expert's GEMMs split over ETP ranks; ETP × EP divides TP × CP × DP. default: the "
                         "framework's (Megatron-Core: ETP = TP; NeMo / Megatron-Bridge MoE recipes set 1)")
    return None if v == ETP_DEFAULT else int(v)


def moe_overlap_input(prefix: str, c, num_experts: int, ep: int) -> bool:
    """The dispatch / combine overlap toggle (Layout.moe_overlap): disabled without expert parallelism unless it is
    on (from the URL or left by another layout), which the page then names instead of turning it off silently."""
    key = _k(prefix, "moe_overlap")
    held = str(st.session_state.get(key, st.query_params.get(key, ""))).lower() in ("true", "1", "on")
    on = c.toggle("Overlap EP dispatch / combine", False, key=key, bind=BIND,
                  disabled=(not num_experts or ep <= 1) and not held,
                  help="Megatron-Core overlap_moe_expert_parallel_comm: one micro-batch's all-to-all hidden under "
                       "another's compute (combined 1F1B); needs EP > 1, PP 1 or the interleaved schedule")
    return bool(on)


def moe_dispatcher_input(prefix: str, c, num_experts: int) -> str:
    """The MoE token dispatcher select (Layout.moe_dispatcher): alltoall (the default), allgather or hybridep; disabled
    for a dense model unless it holds allgather (from the URL), which the page then names instead of dropping it."""
    key = _k(prefix, "moe_dispatcher")
    held = str(st.session_state.get(key, st.query_params.get(key, "alltoall")))
    v = c.selectbox("Token dispatcher", list(MOE_DISPATCHERS), index=0, key=key, bind=BIND,
                    disabled=not num_experts and held == "alltoall",
                    help="Megatron-Core moe_token_dispatcher_type: alltoall (all-to-all of the routed rows over EP) "
                         "or allgather (Megatron-Core's own default: every token all-gathered over ETP × EP, the "
                         "expert output reduce-scattered back; not with the overlap or a capacity factor) or hybridep "
                         "(the flex dispatcher with HybridEP: permutations fused into its dispatch / combine, each "
                         "token sent once per EP rank; ETP 1, no capacity factor)")
    return str(v)


# the CUDA graph settings the dashboard offers (Layout.cuda_graphs): none, what recipes capture, full_iteration
CUDA_GRAPH_CHOICES = ("none", "attn", "attn+mlp", "moe_router+moe_preprocess", "attn+moe_router+moe_preprocess",
                      "full_iteration")


def cuda_graphs_input(prefix: str, c) -> str:
    """The CUDA graphs select (Layout.cuda_graphs): the common settings, plus the value held now when it is another
    (from the URL), so that it is kept and checked (a bad one named by the page) rather than silently replaced."""
    key = _k(prefix, "cuda_graphs")
    held = str(st.session_state.get(key, st.query_params.get(key, "none")))
    # a held value that is a valid setting of another form is kept (and checked against the model by the page); one
    # that is not a setting at all is left out, so the page names it as a link parameter it could not take
    opts = list(CUDA_GRAPH_CHOICES) + ([held] if held not in CUDA_GRAPH_CHOICES and _is_cuda_graphs(held) else [])
    v = c.selectbox("CUDA graphs", opts, index=0, key=key, bind=BIND,
                    help="Megatron-Core cuda_graph_impl / cuda_graph_scope: none (eager), per-layer parts captured "
                         "with Transformer Engine (attn, mlp, moe_router, moe_preprocess) or full_iteration; a "
                         "captured part's host time is replaced by a graph replay (GPU time and memory unchanged)")
    return str(v)


def _is_cuda_graphs(value: str) -> bool:
    """Whether `value` is a Layout.cuda_graphs setting at all (specs.cuda_graphs_mask reads it)."""
    try:
        cuda_graphs_mask(value)
    except InfeasibleConfig:
        return False
    return True


def _current(key: str) -> int | None:
    v = st.session_state.get(key)
    if v is None:
        v = st.query_params.get(key)
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def ep_input(prefix: str, c, num_experts: int, ranks: int | None) -> int:
    """Expert parallelism: the valid choices, plus the value held now when it is not one of them (from the URL,
    or left by another model or layout), so that it is never silently replaced; the page then warns naming ep.
    Disabled for a dense model (unless it holds an ep > 1 to undo)."""
    key = _k(prefix, "ep")
    opts = ep_choices(num_experts, ranks)
    cur = _current(key)
    if cur is not None and cur >= 1 and cur not in opts:
        opts = sorted([*opts, cur])
    why = ("Expert-parallel degree: each MoE layer's experts spread over EP ranks taken from TP × CP × DP; "
           f"choices divide the {num_experts} experts and TP × CP × DP" + (f" = {ranks}" if ranks else "")
           if num_experts else "Expert parallelism: only for Mixture-of-Experts models")
    return int(c.selectbox("EP", opts, index=0, key=key, bind=BIND, help=why,
                           disabled=not num_experts and (cur or 1) == 1))

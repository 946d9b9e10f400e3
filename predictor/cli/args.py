"""Model flags shared by `predict` and `search`: the Mixture-of-Experts fields (and `--head-dim`), spelt as the
ModelSpec fields / predict-batch columns with dashes. Parsed and checked by predictor.model.layout_io, which names the
field at fault."""
from __future__ import annotations

import argparse

from predictor.model.layout_io import MOE_FIELDS
from predictor.model.specs import ATTENTION_KINDS, MLA_FIELDS, MOE_DISPATCHERS
from predictor.step.memory import MemoryOptions

MOE_FLAGS: dict[str, str] = {
    "num_experts": "routed experts per MoE layer; 0 = a dense model (default: the preset's, else 0)",
    "top_k": "experts each token is routed to (required for a MoE model: Mixtral 2, Qwen3-MoE 8)",
    "moe_ffn_hidden": "width of one routed expert (default: --ffn-hidden)",
    "shared_experts": "always-on shared experts per MoE layer (default 0)",
    "shared_ffn_hidden": "width of one shared expert (default: --moe-ffn-hidden)",
    "dense_layers": "leading layers that keep the dense MLP (default 0)",
    "capacity_factor": "expert capacity factor (tokens beyond it dropped); default: dropless",
    "moe_imbalance": "busiest expert-parallel rank's load over the mean (>= 1); default: modelled",
}
FLOAT_FLAGS = ("capacity_factor", "moe_imbalance")   # read as text: layout_io refuses nan / inf by name


def add_head_dim_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--head-dim", type=int, dest="head_dim",
                    help="attention head dimension when it is not hidden / heads (Qwen3: 128); default hidden / heads")


def add_moe_args(sp: argparse.ArgumentParser) -> None:
    g = sp.add_argument_group("Mixture of Experts (override a preset's, or describe a custom MoE model)")
    for name in MOE_FIELDS:
        g.add_argument(f"--{name.replace('_', '-')}", dest=name, help=MOE_FLAGS[name],
                       **({"metavar": "X"} if name in FLOAT_FLAGS else {"type": int}))


def add_ep_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--ep", type=int, help="expert-parallel degree (MoE models): each MoE layer's experts spread "
                                           "over ep ranks taken from tp*cp*dp; divides num_experts and tp*cp*dp "
                                           "(default 1)")


def add_moe_parallel_args(sp: argparse.ArgumentParser) -> None:
    """--etp, --moe-overlap and --moe-dispatcher (Layout.etp, Layout.moe_overlap, Layout.moe_dispatcher) for
    predict."""
    sp.add_argument("--etp", type=int, help="expert tensor-parallel degree (MoE models; Megatron-Core "
                                            "expert_tensor_parallel_size): each expert's fc1 / fc2 split over etp "
                                            "ranks; etp x ep divides tp*cp*dp (default: the framework's, tp for "
                                            "megatron)")
    sp.add_argument("--moe-overlap", dest="moe_overlap", action="store_true", default=None,
                    help="overlap the expert-parallel dispatch / combine with another micro-batch's compute "
                         "(Megatron-Core overlap_moe_expert_parallel_comm); needs ep > 1, pp 1 or interleaved")
    add_moe_dispatcher_arg(sp)
    add_cuda_graphs_arg(sp)


def add_cuda_graphs_arg(sp: argparse.ArgumentParser, every_layout: bool = False) -> None:
    """--cuda-graphs (Layout.cuda_graphs) for predict and search."""
    sp.add_argument("--cuda-graphs", dest="cuda_graphs", default=None,
                    help="Megatron-Core CUDA graphs" + (" of every layout" if every_layout else "")
                         + ": none (default), full_iteration, or per-layer scopes joined by '+' from attn, mlp, "
                           "moe_router, moe_preprocess (e.g. attn+moe_router+moe_preprocess); a captured part's host "
                           "time is replaced by a graph replay")


def add_moe_dispatcher_arg(sp: argparse.ArgumentParser, every_layout: bool = False) -> None:
    """--moe-dispatcher (Layout.moe_dispatcher) for predict and search."""
    sp.add_argument("--moe-dispatcher", dest="moe_dispatcher", choices=MOE_DISPATCHERS, default=None,
                    help="MoE token dispatcher (Megatron-Core moe_token_dispatcher_type)"
                         + (" of every layout" if every_layout else "")
                         + ": alltoall (default) or allgather (Megatron-Core's own default: every token all-gathered "
                           "over the etp x ep ranks, the expert output reduce-scattered back; not with moe_overlap "
                           "or a capacity factor) or hybridep (Megatron-Core's flex dispatcher with the HybridEP "
                           "backend: permutations inside its dispatch / combine kernels, each token sent once per ep "
                           "rank; etp 1, no capacity factor)")


def add_recompute_modules_arg(sp: argparse.ArgumentParser, every_layout: bool = False) -> None:
    """--recompute-modules (Layout.recompute_modules) for predict and search."""
    where = " of every selective layout" if every_layout else ""
    sp.add_argument("--recompute-modules", dest="recompute_modules",
                    help=f"the modules selective recomputation re-runs{where} (Megatron-Core recompute_modules; needs "
                         "--recompute selective): comma-separated from core_attn, moe_act, layernorm, mla_up_proj, "
                         "mlp, moe, shared_experts; default core_attn (Megatron-Core's); 'none' for an empty list")


def add_precision_memory_args(sp: argparse.ArgumentParser, every_layout: bool = False) -> None:
    """--grad-reduce-in-fp32 / --no-grad-reduce-in-fp32 and --fp8-param-gather (Layout fields of those names)."""
    where = " on every layout" if every_layout else ""
    sp.add_argument("--grad-reduce-in-fp32", dest="grad_reduce_in_fp32", action=argparse.BooleanOptionalAction,
                    default=None,
                    help=f"gradient buffers and their data-parallel reduction in fp32{where} (Megatron-LM's default "
                         "for bf16) or, with --no-grad-reduce-in-fp32, in bf16 (NeMo / Megatron-Bridge performance "
                         "recipes); default: the precision's")
    sp.add_argument("--fp8-param-gather", dest="fp8_param_gather", action="store_true", default=None,
                    help=f"FP8 primary weights{where} (Megatron --fp8-param-gather): GEMM weights kept and "
                         "all-gathered in FP8 only; needs --precision fp8")


def add_memory_model_args(sp: argparse.ArgumentParser) -> None:
    """The memory model's settings (predictor.step.memory.MemoryOptions) beyond the layout: what surrounds the
    allocated tensors on the device (docs/memory_overheads.md)."""
    m = MemoryOptions()
    g = sp.add_argument_group("memory model (docs/memory_overheads.md)")
    g.add_argument("--nvls-mib", type=float, default=m.nccl_nvls_mib,
                   help="NCCL NVLink SHARP buffers per communicator on NVLS nodes, MiB (NCCL 2.17-2.21: 1536; 2.22+: "
                        "256; NCCL_NVLS_ENABLE=0, as NeMo's launchers set it: 0)")
    g.add_argument("--allocator-overhead", type=float, default=m.allocator_overhead,
                   help="the caching allocator's reserve beyond the allocated peak, a share of it (0.145; PyTorch's "
                        "expandable_segments: about 0.02)")
    g.add_argument("--framework-gib", type=float, default=m.framework_gib,
                   help="outside the allocator: the CUDA context, GiB (0.4; the cuBLAS / Transformer Engine "
                        "workspaces are torch tensors, counted in the allocated peak)")
    g.add_argument("--allocator-reserve", type=float, default=m.allocator_reserve,
                   help="share of the device memory kept free as a safety margin")


def memory_options_from_args(a: argparse.Namespace) -> MemoryOptions:
    """The MemoryOptions of `add_memory_model_args`' flags (each checked: finite and >= 0, a share below 1)."""
    import math

    from predictor.model.errors import InfeasibleConfig
    for name in ("nvls_mib", "allocator_overhead", "framework_gib", "allocator_reserve"):
        v = getattr(a, name)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise InfeasibleConfig(name, f"must be a finite number >= 0, got {v!r}.")
    if a.allocator_reserve >= 1:
        raise InfeasibleConfig("allocator_reserve", f"is a share of the device memory, got {a.allocator_reserve}.",
                               "use a value below 1 (0.05 keeps 5 % free).")
    return MemoryOptions(framework_gib=a.framework_gib, allocator_overhead=a.allocator_overhead,
                         allocator_reserve=a.allocator_reserve, nccl_nvls_mib=a.nvls_mib)


def model_fields(a: argparse.Namespace, keys: tuple[str, ...]) -> dict:
    """The model's loose fields from parsed flags (layout_io.model_from_fields reads them)."""
    return {k: getattr(a, k, None) for k in (*keys, "head_dim", *MOE_FIELDS, "attention_kind", *MLA_FIELDS,
                                             "moe_layer_interval", "sliding_window", "full_attention_interval")}


def add_cp_offload_args(sp: argparse.ArgumentParser) -> None:
    """--cp-comm, --cp-a2a-size and --offload-activations of predict (Layout fields of those names)."""
    g = sp.add_argument_group("all-to-all context parallelism and activation offloading")
    g.add_argument("--cp-comm", choices=["p2p", "a2a", "a2a+p2p"],
                   help="how the cp ranks exchange the sequence (Megatron-Core cp_comm_type): p2p = K/V ring "
                        "(default), a2a = DeepSpeed-Ulysses all-to-all of Q/K/V/O, a2a+p2p = a2a inside groups of "
                        "--cp-a2a-size, the ring across them")
    g.add_argument("--cp-a2a-size", type=int,
                   help="a2a+p2p: cp ranks per all-to-all group (divides cp; default the cp ranks of one node)")
    g.add_argument("--offload-activations", type=int,
                   help="layers per pipeline stage whose saved activations go to host memory (Megatron-Core "
                        "cpu_offloading_num_layers; needs pp = 1 and recompute none; default 0 = off)")



# --- Multi-head latent attention (docs/mla.md) ---
MLA_FLAGS: dict[str, str] = {
    "q_lora_rank": "MLA query compression rank (DeepSeek-V3 1536); empty = the query is not compressed",
    "kv_lora_rank": "MLA key / value latent rank (DeepSeek-V2 / V3 512)",
    "qk_nope_head_dim": "MLA query / key head dimension without RoPE (DeepSeek-V3 128)",
    "qk_rope_head_dim": "MLA decoupled RoPE head dimension, even (DeepSeek-V3 64)",
    "v_head_dim": "MLA value head dimension (DeepSeek-V3 128)",
}


def add_mla_args(sp: argparse.ArgumentParser) -> None:
    """--attention-kind and the MLA fields (ModelSpec names with dashes; `--attention` is the kernel), and
    --moe-layer-interval (interleaved MoE layers)."""
    g = sp.add_argument_group("multi-head latent attention (override a preset's, or describe a custom MLA model)")
    g.add_argument("--attention-kind", dest="attention_kind",
                   help=f"attention kind, one of {', '.join(ATTENTION_KINDS)}: gqa (MHA / GQA / MQA) or mla "
                        "(multi-head latent attention, DeepSeek-V2 / V3); default: the preset's, else gqa")
    for name in MLA_FIELDS:
        g.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, help=MLA_FLAGS[name])
    sp.add_argument("--moe-layer-interval", dest="moe_layer_interval", type=int,
                    help="MoE models: every n-th layer after --dense-layers is a MoE layer, the others dense (Llama 4 "
                         "Maverick 2); default: the preset's, else 1 (every layer)")
    sp.add_argument("--sliding-window", dest="sliding_window", type=int,
                    help="sliding-window attention: each query sees this many tokens (GPT-OSS 128); default: the "
                         "preset's, else full attention")
    sp.add_argument("--full-attention-interval", dest="full_attention_interval", type=int,
                    help="with --sliding-window: every n-th layer keeps full attention (GPT-OSS 2); default: the "
                         "preset's, else every layer windowed")

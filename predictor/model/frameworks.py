"""What each training framework really does with the data-parallel traffic of a step.

The same layout runs differently under different frameworks: when the gradient reduction runs and
whether it hides behind the backward pass, when ZeRO parameters are gathered, which ZeRO stages exist.
`Layout.framework` names one of FRAMEWORKS (default DEFAULT_FRAMEWORK); `Layout.overlap_grad_reduce` /
`overlap_param_gather` override the framework's default where the framework has the switch.

  megatron            Megatron-LM / Megatron-Core. Distributed optimizer = ZeRO-1. The gradient
                      reduce(-scatter) runs after the last backward unless --overlap-grad-reduce, the
                      parameter all-gather after the optimizer unless --overlap-param-gather (both off by
                      default in Megatron-LM's arguments; NeMo recipes switch them on). Stages 2/3 are
                      Megatron-Core's own FSDP (per micro-batch gathers, overlapped like PyTorch FSDP).
  megatron-deepspeed  Megatron-DeepSpeed (BLOOM, vTrain): DeepSpeed's engine, ZeRO-1 at most with pipeline
                      parallelism; stage 1 installs no backward hooks, so the gradient reduction follows the
                      backward (DeepSpeed PR #1246: "overlap ... meaningless in stage 1").
  deepspeed           DeepSpeed ZeRO without pipeline: stage 0/1 reduce after the backward; stage 2
                      reduce-scatters bucketed gradients during every micro-batch's backward (overlap_comm) and
                      all-gathers the updated parameters once per step; stage 3 gathers per layer in forward
                      and backward with prefetch.
  fsdp                PyTorch FSDP (llm-foundry, torchtitan): NO_SHARD (0) all-reduces in backward hooks,
                      overlapped; SHARD_GRAD_OP (2) gathers once per micro-batch before the forward and
                      reduce-scatters in the backward; FULL_SHARD (3) gathers in forward and again in backward
                      (backward prefetch), reduce-scatter in backward, all overlapped with compute.
  ddp                 PyTorch DistributedDataParallel: bucketed all-reduce overlapped with the backward
                      (ZeroRedundancyOptimizer for stage 1).

Gradient accumulation (`fused_grad_accumulation`): with more than one micro-batch per step, every micro-batch
after the first adds its weight gradients into those of the earlier ones. Megatron-LM / Megatron-Core fuse that
add into the weight-gradient GEMM (gradient_accumulation_fusion: the GEMM accumulates into the fp32 main_grad with
beta = 1), so it costs nothing on its own. The other frameworks run it as a separate memory-bound pass over the
gradients the rank holds (read the accumulated and the new gradient, write the sum), after every micro-batch but
the first: PyTorch autograd's AccumulateGrad (DDP; DeepSpeed ZeRO-0/1, Megatron-DeepSpeed's fp16 engine: in the
gradient precision), DeepSpeed's BF16 optimizer (the bf16 gradient added into fp32 accumulation buffers), and
FSDP / ZeRO-2/3 (the reduce-scattered shard added into the accumulated shard: 1/dp of the gradients).
`predictor.step.decompose.grad_accumulation_calls` sizes the pass; it is timed as the sampled elementwise add (res_add)
over as many bytes. On a CPU platform Megatron's fused GEMM does not exist, so every framework runs the pass.

Kernels (`fused_kernels`): Megatron-Core runs the memory-bound operators of a layer as fused kernels (Transformer
Engine's fused RMSNorm / LayerNorm inside LayerNormLinear, the fused RoPE kernel, the fused bias-SwiGLU / GeLU,
the fused bias-dropout-add residual). The sampled regressors of those operators (the paper's Megatron-LM kernels,
PyTorch kernels in the other frameworks) take several passes over memory; for a framework with fused kernels they
are timed as one pass at the device's HBM bandwidth (`predictor.regress.features.fused_kernel_s`, provenance
"analytical (fused kernel)").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from predictor.model.errors import InfeasibleConfig

FRAMEWORKS = ("megatron", "megatron-deepspeed", "deepspeed", "fsdp", "ddp")
DEFAULT_FRAMEWORK = "megatron"


@dataclass(frozen=True)
class Framework:
    name: str
    overlap_grad_reduce: bool        # default: DP gradient reduction (ZeRO 0/1) hidden behind the backward
    overlap_param_gather: bool       # default: ZeRO-1 parameter all-gather hidden behind the next forward
    zero_stages: tuple[int, ...]     # ZeRO stages the framework implements
    zero2_gather: str                # "per_micro_batch" (FSDP SHARD_GRAD_OP) or "per_step" (DeepSpeed ZeRO-2)
    zero_needs_no_pp: bool           # ZeRO-2/3 cannot be combined with pipeline parallelism
    overlap_switch: bool             # the user can switch the overlap of the gradient reduction
    description: str
    fused_kernels: bool = False      # norms, RoPE, activation and residual run as fused single-pass kernels
    fused_grad_accumulation: bool = False   # the weight-gradient GEMM accumulates over micro-batches itself
    # --- MoE expert tensor parallelism (Layout.etp) ---
    # what an unset Layout.etp means: True = the tensor-parallel degree (Megatron-Core: expert_tensor_parallel_size
    # None is set to tensor_model_parallel_size, megatron/core/transformer/transformer_config.py and
    # megatron/training/arguments.py), False = 1 (experts whole on every rank: DeepSpeed-MoE's default)
    expert_tp_follows_tp: bool = False


FRAMEWORK_SPECS: dict[str, Framework] = {f.name: f for f in [
    Framework("megatron", False, False, (0, 1, 2, 3), "per_micro_batch", False, True,
              "Megatron-LM / Megatron-Core (distributed optimizer = ZeRO-1, Megatron FSDP = 2/3)", fused_kernels=True,
              fused_grad_accumulation=True, expert_tp_follows_tp=True),
    Framework("megatron-deepspeed", False, False, (0, 1, 2, 3), "per_step", True, False,
              "Megatron-DeepSpeed (DeepSpeed engine; ZeRO-2/3 only without pipeline parallelism)"),
    Framework("deepspeed", False, False, (0, 1, 2, 3), "per_step", True, False,
              "DeepSpeed ZeRO"),
    Framework("fsdp", True, False, (0, 2, 3), "per_micro_batch", False, False,
              "PyTorch FSDP (NO_SHARD = 0, SHARD_GRAD_OP = 2, FULL_SHARD = 3)"),
    Framework("ddp", True, False, (0, 1), "per_step", False, False,
              "PyTorch DDP (ZeroRedundancyOptimizer = 1)"),
]}
assert tuple(FRAMEWORK_SPECS) == FRAMEWORKS


def fused_kernels_on(name: str, platform: Any) -> bool:
    """Whether framework `name` runs its fused memory-bound kernels on `platform`: they are GPU kernels, so a CPU
    platform runs the sampled PyTorch kernels whatever the framework."""
    return get_framework(name).fused_kernels and platform.device.vendor != "cpu"


def separate_grad_accumulation(name: str, platform: Any) -> bool:
    """Whether framework `name` adds each micro-batch's gradients in a pass of its own on `platform` (see the module
    docstring): all but Megatron's fused weight-gradient GEMM, which is a GPU kernel."""
    return not (get_framework(name).fused_grad_accumulation and platform.device.vendor != "cpu")


def get_framework(name: str) -> Framework:
    spec = FRAMEWORK_SPECS.get(str(name).strip().lower())
    if spec is None:
        raise InfeasibleConfig("framework", f"unknown framework '{name}'.", f"use one of {', '.join(FRAMEWORKS)}.")
    return spec

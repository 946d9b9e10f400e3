"""Whether a predicted layout fits in memory, said in words: the line every prediction prints, the
error a layout that does not fit becomes (unless the user asks for the time anyway with
`--allow-oom`), and the fix, drawn from what fills the fullest stage and what the layout has left
to turn (tensor / pipeline parallelism, ZeRO, recomputation, a smaller micro-batch)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from predictor.model.errors import InfeasibleConfig

if TYPE_CHECKING:
    from predictor.plan.predict import StepPrediction

ALLOW_OOM_HINT = "--allow-oom prints the time anyway"
OOM_WARNING = ("DOES NOT FIT IN MEMORY: this step time is for a layout that would stop with an out-of-memory "
               "error on this hardware (shown because of --allow-oom).")


def verdict_line(pred: StepPrediction) -> str:
    """'memory: 41.2 GiB per GPU (fullest stage) of 76.0 GiB usable (80 GiB HBM): fits'."""
    where = f" (stage {pred.memory.peak.stage}, the fullest)" if pred.memory is not None else " (the fullest stage)"
    verdict = ("DOES NOT FIT" if not pred.fits_memory else
               "fits only if the allocator fragments little (tight: see the warning)" if pred.memory_tight else "fits")
    parts = ""
    if pred.memory is not None and pred.memory.peak.nccl_bytes + pred.memory.peak.allocator_bytes > 0:
        pk = pred.memory.peak
        parts = (f" [{pk.allocated_bytes / 2 ** 30:,.1f} allocated + {pk.allocator_bytes / 2 ** 30:,.1f} allocator "
                 f"reserve + {pk.nccl_bytes / 2 ** 30:,.1f} NCCL + {pk.framework_bytes / 2 ** 30:,.1f} CUDA context]")
    margin = " less the safety margin" if pred.memory is not None and pred.memory.options.allocator_reserve else ""
    return (f"memory: {pred.memory_gib:,.1f} GiB per GPU{where}{parts} of {pred.usable_gib:,.1f} GiB usable "
            f"({pred.hbm_gib:g} GiB HBM{margin}): {verdict}" + offload_line(pred))


def offload_line(pred: StepPrediction) -> str:
    """'; offloaded to host memory: 67.6 GiB (20 layers' activations)' where the layout offloads activations."""
    if pred.memory is None or not pred.memory.peak.offloaded_bytes:
        return ""
    return (f"; offloaded to host memory: {pred.memory.peak.offloaded_bytes / 2 ** 30:,.1f} GiB "
            f"({pred.layout.offload_activations} layers' activations, not counted above)")


def oom_fix(pred: StepPrediction) -> str:
    """What would make the layout fit: the levers it has left, those for the largest part first."""
    L, m = pred.layout, pred.model
    states, acts = 1.0, 0.0
    if pred.memory is not None:
        pk = pred.memory.peak
        states, acts = pk.states_bytes + pk.buffers_bytes, pk.activations_bytes
    state_levers, act_levers = [], []
    if L.tp < 8 and m.num_heads % (2 * L.tp) == 0:
        state_levers.append(f"more tensor parallelism (tp {L.tp} -> {2 * L.tp})")
    if L.pp * 2 <= m.num_layers:
        state_levers.append(f"more pipeline stages (pp {L.pp} -> {2 * L.pp})")
    if L.zero_stage < 3:
        state_levers.append(f"a higher ZeRO stage (zero_stage {L.zero_stage} -> {L.zero_stage + 1}, where the "
                            f"framework allows it)")
    if L.recompute != "full":
        # selective by module first where Megatron-Core offers modules the layout does not recompute yet: the
        # largest activations of MoE / MLA layers (docs/memory.md)
        more = [x for x in (("moe_act", "moe") if m.is_moe else ()) + (("mla_up_proj",) if m.is_mla else ())
                if x not in L.selective_modules]
        if L.framework == "megatron" and more:
            act_levers.append(f"selective recomputation of {' or '.join(more)} (--recompute selective "
                              f"--recompute-modules)")
        act_levers.append(f"activation recomputation (recompute {L.recompute} -> full)")
    if L.micro_batch > 1:
        act_levers.append(f"a smaller micro-batch (micro_batch {L.micro_batch} -> {max(1, L.micro_batch // 2)})")
    if L.tp > 1 and not L.sequence_parallel:
        act_levers.append("sequence parallelism")
    levers = act_levers + state_levers if acts > states else state_levers + act_levers
    levers.append("more GPUs or a device with more memory")
    return "use " + "; or ".join(levers) + f" ({ALLOW_OOM_HINT})."


def largest_parts(pred: StepPrediction, n: int = 3) -> str:
    """'optimizer 788.5, gradients 262.8, weights 131.4 GiB': the n largest allocated parts of the fullest stage,
    in the one number format of the verdict (GiB, one decimal); '' without a memory report."""
    if pred.memory is None:
        return ""
    pk = pred.memory.peak
    top = sorted({"weights": pk.weights_bytes, "gradients": pk.grads_bytes, "optimizer": pk.optimizer_bytes,
                  "activations": pk.activations_bytes, "buffers": pk.buffers_bytes}.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v / 2 ** 30:,.1f}" for k, v in top[:n]) + " GiB"


def oom_error(pred: StepPrediction) -> InfeasibleConfig:
    """The error a layout that does not fit becomes: field 'memory', the GiB needed and usable, the fix."""
    parts = ""
    if pred.memory is not None:
        parts = f" on stage {pred.memory.peak.stage} ({largest_parts(pred)})"
    problem = (f"the layout does not fit: {pred.memory_gib:,.1f} GiB per GPU needed{parts}, "
               f"{pred.usable_gib:,.1f} GiB usable on {pred.platform_id} ({pred.hbm_gib:g} GiB HBM).")
    return InfeasibleConfig("memory", problem, oom_fix(pred))

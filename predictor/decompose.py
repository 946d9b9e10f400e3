"""One training step of a decoder-only transformer as operator and collective calls.

`decompose(model, layout, platform)` returns one `StagePlan` per pipeline chunk
(pp * vpp of them, in pipeline order). Each plan lists, for ONE micro-batch on ONE
GPU of that chunk, the operator calls of the forward pass, the backward pass and the
recomputation, and the collectives on the critical path; plus, once per step, the
optimizer and the data-parallel gradient traffic.

Conventions follow Megatron-LM: column-parallel QKV / MLP-up, row-parallel
attention-out / MLP-down (two all-reduces per layer in forward and two in backward,
or all-gather + reduce-scatter with sequence parallelism), vocab-parallel embedding,
LM head and cross-entropy, vocabulary padded to a multiple of 128*tp.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .ops import SHAPE_COLUMNS
from .platforms import Platform
from .specs import BYTES_PER_ELEMENT, Layout, ModelSpec, padded_vocab

Shape = tuple  # values in ops.SHAPE_COLUMNS order, None where unused


def make_shape(**kw: int | None) -> Shape:
    unknown = set(kw) - set(SHAPE_COLUMNS)
    if unknown:
        raise KeyError(f"unknown shape columns {sorted(unknown)}")
    return tuple(kw.get(c) for c in SHAPE_COLUMNS)


@dataclass(frozen=True)
class OpCall:
    op: str
    pass_: str          # regressor pass: fwd | bwd | step
    shape: Shape
    count: float        # calls per micro-batch (per step for the optimizer)
    phase: str          # fwd | bwd | recompute | step
    part: str           # layer | embedding | head | loss | optimizer
    scale: float = 1.0  # multiplier on the predicted time (e.g. a stand-in's work ratio)
    variant: str | None = None  # optimizer: which pipeline stage it updates (first | middle | last)

    @property
    def key(self) -> tuple:
        """What the predicted time depends on (the predictor caches by it, with the precision)."""
        return (self.op, self.pass_, self.shape, self.variant)


@dataclass(frozen=True)
class CommCall:
    collective: str     # allreduce | allgather | reducescatter | p2p
    message_bytes: int  # the full buffer: all-gather output, reduce-scatter input, all-reduce buffer
    group: str          # tp | pp | dp | embedding
    phase: str          # fwd | bwd | recompute | step
    count: float        # calls per micro-batch (per step for dp / embedding)
    ranks: int
    nodes: int
    gpus_per_node: int


@dataclass
class StagePlan:
    stage: int            # physical pipeline rank
    chunk: int            # virtual chunk index on that rank (0 unless interleaved)
    layers: int
    is_first: bool
    is_last: bool
    params_per_gpu: int
    ops: list[OpCall] = field(default_factory=list)
    comms: list[CommCall] = field(default_factory=list)       # per micro-batch, on the critical path
    step_ops: list[OpCall] = field(default_factory=list)      # once per step (optimizer)
    step_comms: list[CommCall] = field(default_factory=list)  # once per step (dp grads, zero gathers)


def split_layers(num_layers: int, chunks: int) -> list[int]:
    """As even as possible; the remainder goes to the middle chunks, since the first and
    last carry the embedding and the LM head + loss."""
    base, rem = divmod(num_layers, chunks)
    counts = [base] * chunks
    order = sorted(range(chunks), key=lambda i: (i in (0, chunks - 1), abs(i - (chunks - 1) / 2)))
    for i in order[:rem]:
        counts[i] += 1
    return counts


def group_topology(platform: Platform, layout: Layout, group: str) -> tuple[int, int, int]:
    """(ranks, nodes, gpus_per_node) of a communication group under Megatron's rank order
    (tp fastest, then dp, then pp), with ranks packed onto nodes of `platform.gpus_per_node`."""
    g = platform.gpus_per_node
    if group == "tp":
        size, stride = layout.tp, 1
    elif group == "dp":
        size, stride = layout.dp, layout.tp
    elif group in ("pp", "embedding"):
        size, stride = (layout.pp if group == "pp" else 2), layout.tp * layout.dp
    else:
        raise ValueError(group)
    if size <= 1:
        return 1, 1, 1
    per_node = max(1, min(size, g // stride)) if stride < g else 1
    nodes = -(-size // per_node)
    return size, nodes, per_node


def _layer_params_per_gpu(model: ModelSpec, tp: int) -> int:
    h = model.hidden_size
    norm = 2 * h if model.arch == "llama" else 4 * h
    return (model.params_per_layer() - norm) // tp + norm


def decompose(model: ModelSpec, layout: Layout, platform: Platform) -> list[StagePlan]:
    layout.validate(model)
    chunks = layout.pp * layout.vpp
    layer_counts = list(layout.stage_layers) if layout.stage_layers else split_layers(model.num_layers, chunks)
    tp, b, s, h = layout.tp, layout.micro_batch, layout.seq_len, model.hidden_size
    elem = BYTES_PER_ELEMENT[layout.precision]
    sp = layout.sequence_parallel
    s_sp = s // tp if sp else s
    vp = padded_vocab(model.vocab_size, tp)
    act_bytes = b * s * h * elem

    tp_topo = group_topology(platform, layout, "tp")
    pp_topo = group_topology(platform, layout, "pp")
    dp_topo = group_topology(platform, layout, "dp")

    def tp_comm(kind: str, phase: str, count: float = 1.0) -> list[CommCall]:
        """A tensor-parallel exchange of one [b, s, h] activation."""
        if tp == 1:
            return []
        return [CommCall(kind, act_bytes, "tp", phase, count, *tp_topo)]

    def layer_fwd(phase: str) -> tuple[list[OpCall], list[CommCall]]:
        norm = "rmsnorm" if model.arch == "llama" else "layernorm"
        shp_norm = make_shape(batch=b, seq=s_sp, hidden=h)
        ops: list[OpCall] = []
        p = "fwd"
        ops.append(OpCall(norm, p, shp_norm, 2, phase, "layer"))
        ops.append(OpCall("qkv_proj", p, make_shape(tp=tp, batch=b, seq=s, hidden=h, heads=model.num_heads,
                                                     kv_heads=model.kv_heads), 1, phase, "layer"))
        if model.arch == "llama":
            ops.append(OpCall("rope", p, make_shape(tp=tp, batch=b, seq=s, hidden=h, heads=model.num_heads), 1, phase, "layer"))
        ops += attention_core(p, phase)
        ops.append(OpCall("attn_out_proj", p, make_shape(tp=tp, batch=b, seq=s, hidden=h), 1, phase, "layer"))
        ops.append(OpCall("res_add", p, shp_norm, 2, phase, "layer"))
        if model.arch == "llama":
            ops.append(OpCall("mlp_up", p, make_shape(tp=tp, batch=b, seq=s, hidden=h, ffn_hidden=2 * model.ffn), 1, phase, "layer"))
            ops.append(OpCall("swiglu", p, make_shape(tp=tp, batch=b, seq=s, hidden=h, ffn_hidden=model.ffn), 1, phase, "layer"))
        else:
            ops.append(OpCall("mlp_up", p, make_shape(tp=tp, batch=b, seq=s, hidden=h, ffn_hidden=model.ffn), 1, phase, "layer"))
            ops.append(OpCall("gelu", p, make_shape(tp=tp, batch=b, seq=s, hidden=h, ffn_hidden=model.ffn), 1, phase, "layer"))
        ops.append(OpCall("mlp_down", p, make_shape(tp=tp, batch=b, seq=s, hidden=h, ffn_hidden=model.ffn), 1, phase, "layer"))
        if sp:
            comms = tp_comm("allgather", phase, 2) + tp_comm("reducescatter", phase, 2)
        else:
            comms = tp_comm("allreduce", phase, 2)
        return ops, comms

    def attention_core(p: str, phase: str) -> list[OpCall]:
        if model.attention_impl == "flash":
            return [OpCall("flash_attn", p, make_shape(tp=tp, batch=b, seq=s, hidden=h, heads=model.num_heads,
                                                        kv_heads=model.kv_heads), 1, phase, "layer")]
        shp = make_shape(tp=tp, batch=b, seq=s, hidden=h, heads=model.num_heads)
        # the fused softmax kernel was sampled per rank (tp = 1, heads already divided)
        shp_sm = make_shape(tp=1, batch=b, seq=s, heads=model.num_heads // tp)
        return [OpCall("attn_scores", p, shp, 1, phase, "layer"),
                OpCall("fused_masked_softmax", p, shp_sm, 1, phase, "layer"),
                OpCall("attn_context", p, shp, 1, phase, "layer")]

    def as_bwd(calls: list[OpCall]) -> list[OpCall]:
        return [OpCall(c.op, "bwd", c.shape, c.count, "bwd", c.part, c.scale) for c in calls]

    def with_phase(calls: list, phase: str) -> list:
        out = []
        for c in calls:
            out.append(CommCall(c.collective, c.message_bytes, c.group, phase, c.count, c.ranks, c.nodes, c.gpus_per_node)
                       if isinstance(c, CommCall) else
                       OpCall(c.op, c.pass_, c.shape, c.count, phase, c.part, c.scale))
        return out

    lf_ops, lf_comms = layer_fwd("fwd")
    lb_ops = as_bwd(lf_ops)
    # backward of column/row parallel layers mirrors the forward exchanges
    lb_comms = with_phase(lf_comms, "bwd")
    if layout.recompute == "full":
        lr_ops, lr_comms = with_phase(lf_ops, "recompute"), with_phase(lf_comms, "recompute")
    elif layout.recompute == "selective" and model.attention_impl != "flash":
        lr_ops, lr_comms = with_phase(attention_core("fwd", "recompute"), "recompute"), []
    else:  # none, or selective with flash attention (which recomputes inside its own kernel)
        lr_ops, lr_comms = [], []

    emb_params = vp * h // tp
    final_norm_params = h if model.arch == "llama" else 2 * h
    plans: list[StagePlan] = []
    for chunk_idx, n_layers in enumerate(layer_counts):
        stage = chunk_idx % layout.pp
        virt = chunk_idx // layout.pp
        first, last = chunk_idx == 0, chunk_idx == chunks - 1
        plan = StagePlan(stage=stage, chunk=virt, layers=n_layers, is_first=first, is_last=last, params_per_gpu=0)
        scale = float(n_layers)
        plan.ops += [_times(c, scale) for c in lf_ops + lb_ops + lr_ops]
        plan.comms += [_ctimes(c, scale) for c in lf_comms + lb_comms + lr_comms]
        params = n_layers * _layer_params_per_gpu(model, tp)
        if first:
            shp = make_shape(tp=tp, batch=b, seq=s, hidden=h, vocab=model.vocab_size)
            plan.ops += [OpCall("embedding", "fwd", shp, 1, "fwd", "embedding"),
                         OpCall("embedding", "bwd", shp, 1, "bwd", "embedding")]
            if model.arch == "gpt":  # learned position embedding added to the token embedding
                shp_add = make_shape(batch=b, seq=s_sp, hidden=h)
                plan.ops += [OpCall("res_add", "fwd", shp_add, 1, "fwd", "embedding"),
                             OpCall("res_add", "bwd", shp_add, 1, "bwd", "embedding")]
            plan.comms += tp_comm("reducescatter" if sp else "allreduce", "fwd")
            params += emb_params + (s * h if model.arch == "gpt" else 0)
        if last:
            norm = "rmsnorm" if model.arch == "llama" else "layernorm"
            shp_norm = make_shape(batch=b, seq=s_sp, hidden=h)
            shp_head = make_shape(tp=tp, batch=b, seq=s, hidden=h, vocab=model.vocab_size)
            shp_ce = make_shape(tp=tp, batch=b, seq=s, vocab=model.vocab_size)
            for p in ("fwd", "bwd"):
                plan.ops += [OpCall(norm, p, shp_norm, 1, p, "head"),
                             OpCall("lm_head", p, shp_head, 1, p, "head"),
                             OpCall("cross_entropy", p, shp_ce, 1, p, "loss")]
            if sp:
                plan.comms += tp_comm("allgather", "fwd") + tp_comm("reducescatter", "bwd")
            else:
                plan.comms += tp_comm("allreduce", "bwd")
            if tp > 1:  # vocab-parallel cross-entropy: max, sum-exp and target-logit all-reduces of [b, s] fp32
                plan.comms.append(CommCall("allreduce", b * s * 4, "tp", "fwd", 3, *tp_topo))
            params += final_norm_params
            if not model.tied_embeddings or layout.pp > 1:
                params += emb_params
        # pipeline send/recv of one activation (scatter-gather optimisation splits it over tp with SP)
        p2p_bytes = act_bytes // tp if sp else act_bytes
        if layout.pp > 1:
            n_recv = 0 if (first and virt == 0 and stage == 0) else 1
            n_send = 0 if last else 1
            count = n_recv + n_send
            if count:
                plan.comms.append(CommCall("p2p", p2p_bytes, "pp", "fwd", count, *pp_topo))
                plan.comms.append(CommCall("p2p", p2p_bytes, "pp", "bwd", count, *pp_topo))
        plan.params_per_gpu = params
        _add_step_work(plan, model, layout, dp_topo, platform)
        plans.append(plan)
    if model.tied_embeddings and layout.pp > 1:
        emb_topo = group_topology(platform, layout, "embedding")
        for plan in plans:
            if plan.is_first or plan.is_last:
                plan.step_comms.append(CommCall("allreduce", emb_params * elem, "embedding", "step", 1, *emb_topo))
    return plans


def _add_step_work(plan: StagePlan, model: ModelSpec, layout: Layout, dp_topo: tuple[int, int, int],
                   platform: Platform) -> None:
    """The optimizer of one chunk and its data-parallel traffic, by ZeRO stage:

    zero_stage  as frameworks name it                         data-parallel traffic of this chunk
    0           DDP; Megatron without distributed optimizer   gradient all-reduce once per step
    1           Megatron distributed optimizer; ZeRO-1         gradient reduce-scatter once per step, then
                                                               parameter all-gather after the optimizer
    2           FSDP SHARD_GRAD_OP; ZeRO-2                     per micro-batch: parameter all-gather before
                                                               forward, gradient reduce-scatter in backward
    3           FSDP FULL_SHARD; ZeRO-3                        per micro-batch: parameter all-gather in forward
                                                               and again in backward, gradient reduce-scatter
    (DeepSpeed ZeRO-2 gathers parameters once per step instead of per micro-batch; with one micro-batch
    per step the two coincide.) Stages 2-3 move one unit at a time (each transformer layer; the
    embedding / head parameters of the edge chunks), one call per unit, prefetched under compute by
    `Predictor.predict`; stages 0-1 are bucketed and overlapped with the last backward by `compose`.
    Gradients travel in `memory.grad_comm_bytes(precision)` bytes per element (fp32 for bf16, as
    Megatron-LM and torchtitan / llm-foundry FSDP reduce them), parameters in the compute precision.
    FSDP x TP: the dp group holds the tp-sharded parameters of this GPU (`dp_topo` strides over tp).
    """
    from .memory import grad_comm_bytes, layer_params_per_gpu
    elem = BYTES_PER_ELEMENT[layout.precision]
    gelem = grad_comm_bytes(layout.precision)
    params = plan.params_per_gpu
    shard = layout.dp if layout.zero_stage >= 1 else 1
    # the paper samples the optimizer per pipeline-stage kind; a single stage (pp = 1) holds the
    # embedding like a first stage
    variant = "first" if plan.is_first else "last" if plan.is_last else "middle"
    plan.step_ops.append(OpCall("optimizer", "step",
                                make_shape(tp=layout.tp, hidden=model.hidden_size, layers=plan.layers,
                                           params=max(1, params // shard)), 1, "step", "optimizer",
                                variant=variant))
    if layout.dp == 1:
        return
    if layout.zero_stage == 0:
        plan.step_comms.append(CommCall("allreduce", params * gelem, "dp", "step", 1, *dp_topo))
        return
    if layout.zero_stage == 1:
        plan.step_comms.append(CommCall("reducescatter", params * gelem, "dp", "step", 1, *dp_topo))
        plan.step_comms.append(CommCall("allgather", params * elem, "dp", "step", 1, *dp_topo))
        return
    # ZeRO-2/3 (FSDP): per micro-batch, unit by unit
    layer_unit = layer_params_per_gpu(model, layout.tp)
    units = [(layer_unit, plan.layers)] if plan.layers else []
    edge = params - plan.layers * layer_unit
    if edge > 0:
        units.append((edge, 1))
    for n_params, count in units:
        plan.comms.append(CommCall("allgather", n_params * elem, "dp", "fwd", count, *dp_topo))
        if layout.zero_stage == 3:
            plan.comms.append(CommCall("allgather", n_params * elem, "dp", "bwd", count, *dp_topo))
        plan.comms.append(CommCall("reducescatter", n_params * gelem, "dp", "bwd", count, *dp_topo))


def _times(c: OpCall, k: float) -> OpCall:
    return OpCall(c.op, c.pass_, c.shape, c.count * k, c.phase, c.part, c.scale, c.variant)


def _ctimes(c: CommCall, k: float) -> CommCall:
    return CommCall(c.collective, c.message_bytes, c.group, c.phase, c.count * k, c.ranks, c.nodes, c.gpus_per_node)

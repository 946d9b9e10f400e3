"""`python -m bench host-floor`: the host time an eager framework needs to issue one transformer layer pass.

A GPT layer with Megatron-LM / Megatron-DeepSpeed's Python structure at TP 1 and without fused kernels
beyond the layer norm (layer norm as a Python autograd function, QKV projection with its bias kept
apart, split into heads, baddbmm scores, causal mask, softmax, dropout, bmm, output projection,
bias-dropout-add, layer norm, GeLU MLP, bias-dropout-add; the tensor-parallel region functions each
parallel linear calls, identities at TP 1) runs forward and
backward on this CPU at tiny shapes (hidden 16, 2 heads, 4 tokens), where the time no longer falls
with the shape (at hidden 64 / 16 tokens it is 70 % higher, at 128 / 32 tokens 2.8x): what remains
is what Python, the dispatcher and autograd spend issuing the operators.
The time per layer is the slope between a short and a long stack of layers (the loss, the backward
call and the optimizer-free step's fixed cost drop out), taken as the median over rounds; a layer pass
is half of a layer's forward + backward. The same stacks under full activation recomputation (reentrant
checkpoint per layer, as Megatron recomputes) give what recomputation adds, in layer passes. The
profiler counts the operators that would launch a kernel on a GPU. See predictor.step.host_floor for how the
fit uses it (a lower bound).
"""
from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

# operators that only re-describe a tensor (no kernel on a GPU)
VIEW_OPS = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::transpose", "aten::t",
    "aten::permute", "aten::expand", "aten::as_strided", "aten::slice", "aten::select", "aten::split",
    "aten::chunk", "aten::unbind", "aten::detach", "aten::alias", "aten::squeeze", "aten::unsqueeze",
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::resolve_conj", "aten::resolve_neg",
    "aten::lift_fresh", "aten::result_type", "aten::contiguous", "aten::to", "aten::_to_copy", "aten::lift",
    "aten::expand_as", "aten::view_as", "aten::narrow", "aten::numpy_T", "aten::matrix_H", "aten::split_with_sizes",
    "aten::unflatten", "aten::flatten", "aten::zeros_like", "aten::ones_like",
})
# rounds of the measurement by default: 9-round runs on one VM spread 0.64-0.91 ms per layer pass, 27 agree closer
DEFAULT_ROUNDS = 27
FRAMEWORKS_EAGER = ["megatron", "megatron-deepspeed", "deepspeed", "fsdp", "ddp"]


@functools.cache
def _identity_function() -> Any:
    """An identity as a Python autograd function: Megatron's copy-to / reduce-from tensor-parallel region (each
    column / row parallel linear calls one even at TP 1; an all-reduce in one direction at TP > 1) and the MoE
    dispatcher's all-to-all functions; their Python calls are counted, the collectives' launches are not."""
    import torch

    class _Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return g
    return _Identity


class _StaticBuffers:
    """The host side of a captured part's replay as Transformer Engine's make_graphed_callables issues it
    (NVIDIA/TransformerEngine transformer_engine/pytorch/graph.py, Graphed.forward / backward: the inputs copied into
    the graph's static input buffers, the forward graph replayed, the static outputs returned detached; in the
    backward the incoming gradients copied into static buffers, the backward graph replayed, the static input
    gradients returned): one autograd function call per replay, forward and backward. The replay itself
    (cudaGraphLaunch, one driver call) has no CPU stand-in and is not counted, as the eager floor leaves out each
    kernel's launch call."""

    def __init__(self, inputs: tuple[Any, ...], outputs: tuple[Any, ...] | None = None) -> None:
        import torch
        self.static_in = tuple(torch.zeros_like(t) for t in inputs)
        self.static_out = (tuple(torch.zeros_like(t) for t in inputs) if outputs is None
                           else tuple(o.detach().clone() for o in outputs))
        self.static_grad_out = tuple(torch.zeros_like(o) if o.is_floating_point() else None for o in self.static_out)
        self.static_grad_in = tuple(torch.zeros_like(t) for t in inputs)
        buffers = self

        class _Graphed(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, *xs: Any) -> Any:
                for s_, x in zip(buffers.static_in, xs, strict=True):
                    s_.copy_(x)
                out = tuple(o.detach() for o in buffers.static_out)
                for o in out:
                    if not o.is_floating_point():
                        ctx.mark_non_differentiable(o)
                return out

            @staticmethod
            def backward(ctx: Any, *grads: Any) -> Any:
                for s_, g in zip(buffers.static_grad_out, grads, strict=True):
                    if s_ is not None and g is not None:
                        s_.copy_(g)
                return tuple(g.detach() for g in buffers.static_grad_in)

        self._fn = _Graphed

    def replay(self, *inputs: Any) -> Any:
        out = self._fn.apply(*inputs)
        return out[0] if len(out) == 1 else out


def _layer_class() -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    _Identity = _identity_function()

    class _LayerNorm(torch.autograd.Function):
        """A fused layer norm as apex / Megatron wrap it: a Python autograd function around the kernel."""

        @staticmethod
        def forward(ctx: Any, x: Any, w: Any, b: Any) -> Any:
            y, mean, rstd = torch.native_layer_norm(x, (x.shape[-1],), w, b, 1e-5)
            ctx.save_for_backward(x, w, b, mean, rstd)
            return y

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            x, w, b, mean, rstd = ctx.saved_tensors
            return torch.ops.aten.native_layer_norm_backward(g.contiguous(), x, (x.shape[-1],), mean, rstd, w, b,
                                                             [True, True, True])

    class ParallelLinear(nn.Module):
        """Megatron's column / row parallel linear at TP 1: region function, matmul, bias returned apart."""

        def __init__(self, n_in: int, n_out: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(n_out, n_in) * 0.02)
            self.bias = nn.Parameter(torch.zeros(n_out))

        def forward(self, x: Any) -> tuple[Any, Any]:
            return F.linear(_Identity.apply(x), self.weight), self.bias

    class MegatronStyleLayer(nn.Module):
        """Megatron's ParallelTransformerLayer at TP 1, [seq, batch, hidden] layout, no fused kernels
        beyond a layer norm: its Python structure (region functions, bias kept apart and added in the
        bias-dropout-add, masked softmax) and its operators."""

        def __init__(self, hidden: int, heads: int, dropout: float) -> None:
            super().__init__()
            self.ln1_w, self.ln1_b = nn.Parameter(torch.ones(hidden)), nn.Parameter(torch.zeros(hidden))
            self.ln2_w, self.ln2_b = nn.Parameter(torch.ones(hidden)), nn.Parameter(torch.zeros(hidden))
            self.qkv, self.proj = ParallelLinear(hidden, 3 * hidden), ParallelLinear(hidden, hidden)
            self.fc1, self.fc2 = ParallelLinear(hidden, 4 * hidden), ParallelLinear(4 * hidden, hidden)
            self.heads, self.p = heads, dropout
            # the parts replaced by a CUDA graph replay stand-in (`measure_cuda_graph_shares`): "attn", "mlp"
            self.graphed: frozenset[str] = frozenset()
            self._replays: dict[str, Any] = {}

        def _replay(self, part: str, *inputs: Any) -> Any:
            """The host side of replaying a captured part (`_graphed_replay`), its static buffers made once."""
            if part not in self._replays:
                self._replays[part] = _StaticBuffers(inputs)
            return self._replays[part].replay(*inputs)

        def _bias_dropout_add(self, out: Any, bias: Any, residual: Any) -> Any:
            return residual + F.dropout(out + bias, self.p, self.training)

        def _ln(self, x: Any, which: int) -> Any:
            """The layer's first or second layer norm (the MoE variant's forward calls it)."""
            w, b = (self.ln1_w, self.ln1_b) if which == 1 else (self.ln2_w, self.ln2_b)
            return _LayerNorm.apply(x, w, b)

        def _attention(self, x: Any) -> Any:
            """The attention half: layer norm through the bias-dropout-add (Megatron-Core's attn scope)."""
            if "attn" in self.graphed:
                return self._replay("attn", x)
            s, b, h = x.shape
            d = h // self.heads
            qkv, qkv_bias = self.qkv(_LayerNorm.apply(x, self.ln1_w, self.ln1_b))
            q, k, v = (qkv + qkv_bias).view(s, b * self.heads, 3 * d).chunk(3, dim=-1)
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
            scores = torch.baddbmm(torch.empty(b * self.heads, s, s), q, k.transpose(1, 2), beta=0.0,
                                   alpha=d ** -0.5)
            mask = torch.ones(s, s, dtype=torch.bool).triu(1)
            probs = F.dropout(torch.softmax(scores.masked_fill(mask, -10000.0), dim=-1), self.p, self.training)
            ctx = torch.bmm(probs, v).transpose(0, 1).contiguous().view(s, b, h)
            out, bias = self.proj(ctx)
            return self._bias_dropout_add(out, bias, x)

        def forward(self, x: Any) -> Any:
            x = self._attention(x)
            if "mlp" in self.graphed:   # the MLP half, its tensor-parallel region function inside (the mlp scope)
                return self._replay("mlp", x)
            up, up_bias = self.fc1(_LayerNorm.apply(x, self.ln2_w, self.ln2_b))
            out, bias = self.fc2(F.gelu(up + up_bias))
            return _Identity.apply(self._bias_dropout_add(out, bias, x))

    return MegatronStyleLayer


@contextlib.contextmanager
def _one_host_thread() -> Any:
    """What every measurement here runs under: torch on one thread (a framework issues kernels from one host
    thread) and a fixed seed; the caller's thread count restored afterwards."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        yield
    finally:
        torch.set_num_threads(threads)


def _iqr(xs: list[float]) -> list[float]:
    """[first, third] quartile of `xs` (its [min, max] with fewer than 4 values)."""
    q = statistics.quantiles(xs, n=4) if len(xs) >= 4 else [min(xs), max(xs)]
    return [q[0], q[-1]]


def _measured_on() -> dict[str, Any]:
    """The provenance every host-floor record carries: the measuring machine, torch's version and the time."""
    import torch

    from predictor.hardware.machine import current
    mach = current()
    return {"machine": {**mach.to_dict(), "short": mach.short()}, "torch": torch.__version__,
            "measured_at": datetime.now(UTC).isoformat(timespec="seconds")}


def _stack(layers: int, hidden: int, heads: int, dropout: float, checkpointed: bool = False) -> Any:
    from torch import nn
    cls = _layer_class()
    if not checkpointed:
        return nn.Sequential(*[cls(hidden, heads, dropout) for _ in range(layers)])
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        """Full activation recomputation as Megatron runs it: each layer's forward without autograd, its
        input kept, re-run with autograd in the backward (reentrant checkpoint, RNG state saved and restored)."""

        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([cls(hidden, heads, dropout) for _ in range(layers)])

        def forward(self, x: Any) -> Any:
            for layer in self.layers:
                x = checkpoint(layer, x, use_reentrant=True, preserve_rng_state=True)
            return x

    return Checkpointed()


def _time_step(model: Any, x: Any, iters: int) -> float:
    t = time.perf_counter()
    for _ in range(iters):
        model(x).sum().backward()
    return (time.perf_counter() - t) / iters


def count_kernels(model: Any, x: Any) -> int:
    """Operators of one forward + backward that would launch a GPU kernel: leaf aten calls, views left out."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(x).sum().backward()
    n = 0
    for e in prof.events():
        if not e.name.startswith("aten::") or e.name in VIEW_OPS:
            continue
        if any(c.name.startswith("aten::") for c in e.cpu_children):
            continue
        n += 1
    return n


def measure_host_floor(*, hidden: int = 16, heads: int = 2, seq: int = 4, short: int = 2, long: int = 10,
                       rounds: int = DEFAULT_ROUNDS, iters: int = 40, warmup: int = 20, dropout: float = 0.1,
                       log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The record `models_store/host_floor.json` holds (see predictor.step.host_floor)."""
    import torch
    say = log or (lambda _m: None)
    with _one_host_thread():
        x = torch.randn(seq, 1, hidden, requires_grad=True)
        a, b = _stack(short, hidden, heads, dropout), _stack(long, hidden, heads, dropout)
        ca, cb = (_stack(short, hidden, heads, dropout, True), _stack(long, hidden, heads, dropout, True))
        for m in (a, b, ca, cb):
            _time_step(m, x, warmup)
        slopes, ck_slopes = [], []
        for r in range(rounds):   # plain and checkpointed stacks interleaved: both see the same machine state
            ta, tb = _time_step(a, x, iters), _time_step(b, x, iters)
            slopes.append((tb - ta) / (long - short))
            ta, tb = _time_step(ca, x, iters), _time_step(cb, x, iters)
            ck_slopes.append((tb - ta) / (long - short))
            say(f"round {r + 1}/{rounds}: {slopes[-1] * 1e6:.0f} us per layer forward + backward, "
                f"{ck_slopes[-1] * 1e6:.0f} us with full recomputation")
        kernels = (count_kernels(b, x) - count_kernels(a, x)) / (long - short)
    per_layer = statistics.median(slopes)
    per_layer_ck = statistics.median(ck_slopes)
    return {
        "host_s_per_layer_pass": per_layer / 2.0,
        "fwd_bwd_s_per_layer": per_layer,
        "fwd_bwd_s_per_layer_iqr": _iqr(slopes),
        "kernels_per_layer_pass": kernels / 2.0,
        "fwd_bwd_s_per_layer_recomputed": per_layer_ck,
        # what full recomputation adds to a layer (its no-grad forward, the checkpoint machinery and the
        # forward re-run), in plain layer passes: the host passes the backward carries for recomputation
        "recompute_host_passes": max(0.0, per_layer_ck - per_layer) / (per_layer / 2.0),
        "applies_to": FRAMEWORKS_EAGER,
        "layer": {"style": "Megatron-style GPT layer, unfused, [seq, batch, hidden], TP 1", "hidden": hidden,
                  "heads": heads, "seq_len": seq, "micro_batch": 1, "dropout": dropout,
                  "stacks": [short, long], "rounds": rounds, "iters_per_round": iters, "torch_threads": 1},
        **_measured_on(),
        "source": ("python -m bench host-floor: slope of eager forward + backward time over layers at tiny shapes "
                   "on this CPU (what Python, the dispatcher and autograd spend issuing one layer's operators); "
                   "a lower bound of a GPU host's time: CUDA launch calls, the caching allocator, collectives' "
                   "calls and framework wrappers come on top"),
    }


# ---- a Mixture-of-Experts layer's host time, relative to a dense layer's -----------------------------------------

def _moe_layer_class() -> Any:
    """The dense layer above with its MLP replaced by a Megatron-Core MoE block (megatron/core/transformer/moe/:
    router.py TopKRouter, moe_utils.py topk_softmax_with_capacity / switch_load_balancing_loss_func / permute /
    unpermute / sort_chunks_by_idxs (the unfused paths), token_dispatcher.py MoEAlltoAllTokenDispatcher, experts.py
    TEGroupedMLP), at TP 1 on one process. What each step issues on the host, in order:

    router      fp32 gating linear, top-k of the logits, softmax of the top-k, the scattered probabilities and the
                boolean routing map, tokens per expert; the aux loss (softmax of all logits, sum, product, scale),
                its tracker copy and MoEAuxLossAutoScaler (a Python autograd function)
    preprocess  tokens per expert (sum over the routing map) and their device-to-host copy (`tolist`: the
                dispatcher's cuda sync point, here a host read)
    permute     routing map transposed, token indices expanded and masked-selected, probabilities likewise,
                rows gathered
    all-to-all  the dispatcher's _AllToAll autograd functions (tokens and probabilities; the combine's one),
                identities here: their Python call is counted, the collective's launch is not (as the dense
                floor leaves out the tensor-parallel collectives)
    sort        sort_chunks_by_idxs: split by the host-side counts and concatenated in local-expert order (and
                back after the experts)
    experts     fc1 and fc2 each one grouped GEMM call (torch._grouped_mm), SwiGLU in fp32 with the router
                probabilities applied; with `per_expert_gemms` (what the measurement uses) instead one GEMM per
                local expert (the inputs split by the host-side counts, the outputs concatenated), as Transformer
                Engine's GroupedLinear issues them: general_grouped_gemm runs one cuBLAS GEMM per expert in its
                forward and one data-gradient and one weight-gradient GEMM per expert in its backward, with
                per-expert Python loops around them (weight casts / FP8 workspaces forward, the weight-gradient
                list backward) (NVIDIA/TransformerEngine@0069563f606859d4fb5d663e1c92509a30e99f35
                transformer_engine/pytorch/module/grouped_linear.py _GroupedLinear.forward / backward), which
                Megatron-Core's TEGroupedMLP calls for fc1 and fc2. (torch's grouped GEMM on a CPU loops the same
                per-group GEMMs inside one call; on a GPU it is one kernel)
    unpermute   rows scatter-added back to token order
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    dense = _layer_class()
    _Identity = _identity_function()

    class _AuxLossAutoScaler(torch.autograd.Function):
        """MoEAuxLossAutoScaler: attaches the aux loss to the probabilities; its backward seeds the loss's
        gradient."""

        @staticmethod
        def forward(ctx: Any, output: Any, aux_loss: Any) -> Any:
            ctx.save_for_backward(aux_loss)
            return output

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            (aux_loss,) = ctx.saved_tensors
            return g, torch.ones_like(aux_loss)

    class _GroupedLinear(torch.autograd.Function):
        """Transformer Engine's _GroupedLinear as the host sees it: one autograd function whose forward splits the
        rows by the host-side counts and issues one GEMM per local expert, and whose backward issues a data-gradient
        and a weight-gradient GEMM per expert (general_grouped_gemm's per-expert cuBLAS calls; here torch.mm calls
        from a Python loop, with no autograd node per expert)."""

        @staticmethod
        def forward(ctx: Any, x: Any, w: Any, counts: list[int]) -> Any:
            xs = torch.split(x, counts)
            ctx.save_for_backward(x, w)
            ctx.counts = counts
            return torch.cat([torch.mm(xs[i], w[i].t()) for i in range(len(counts))])

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            x, w = ctx.saved_tensors
            counts = ctx.counts
            xs, gs = torch.split(x, counts), torch.split(g, counts)
            dx = torch.cat([torch.mm(gs[i], w[i]) for i in range(len(counts))])
            dw = torch.stack([torch.mm(gs[i].t(), xs[i]) for i in range(len(counts))])
            return dx, dw, None

    class MoEBlock(nn.Module):
        def __init__(self, hidden: int, experts: int, top_k: int, ffn: int, per_expert_gemms: bool = False) -> None:
            super().__init__()
            self.per_expert_gemms = per_expert_gemms
            self.router = nn.Parameter(torch.randn(experts, hidden) * 0.02)
            self.fc1 = nn.Parameter(torch.randn(experts, 2 * ffn, hidden).to(torch.bfloat16) * 0.02)
            self.fc2 = nn.Parameter(torch.randn(experts, hidden, ffn).to(torch.bfloat16) * 0.02)
            self.experts, self.k = experts, top_k
            self.aux_tracker = torch.zeros(())
            self.graphed: frozenset[str] = frozenset()   # "moe_router", "moe_preprocess" (`measure_cuda_graph_shares`)
            self._replays: dict[str, Any] = {}

        def _router(self, tokens: Any, n: int, e: int) -> tuple[Any, Any]:
            """TopKRouter: fp32 gating, top-k of the logits then softmax, scattered probabilities and map; the aux
            loss (switch load balancing) and its tracker, attached to the probabilities by the auto-scaler."""
            logits = F.linear(tokens.float(), self.router.float())
            top, idx = torch.topk(logits, self.k, dim=1)
            probs = torch.softmax(top, dim=-1, dtype=torch.float32)
            gates = torch.zeros_like(logits).scatter(1, idx, probs)
            rmap = torch.zeros_like(logits).int().scatter(1, idx, 1).bool()
            per_expert = rmap.sum(dim=0)
            scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
            aux = torch.sum(scores.sum(dim=0) * per_expert) * (e * 1e-3 / (self.k * n * n))
            self.aux_tracker = self.aux_tracker + aux.detach()
            return _AuxLossAutoScaler.apply(gates, aux), rmap

        def _router_replay(self, tokens: Any) -> tuple[Any, Any, Any]:
            """The router captured (Megatron-Core's moe_router scope; with moe_preprocess the tokens per expert too):
            one replay, its outputs (probabilities, routing map, tokens per expert) read from static buffers."""
            if "router" not in self._replays:
                n, e = tokens.shape[0], self.experts
                with torch.no_grad():
                    gates, rmap = self._router(tokens.detach(), n, e)
                self._replays["router"] = _StaticBuffers((tokens,), (gates.detach(), rmap, rmap.sum(dim=0).long()))
            return self._replays["router"].replay(tokens)

        def forward(self, x: Any) -> Any:
            shape = x.shape
            tokens = x.reshape(-1, shape[-1])
            n, e = tokens.shape[0], self.experts
            if "moe_router" in self.graphed:   # router (and preprocess) replayed: its outputs from static buffers
                gates, rmap, per_expert = self._router_replay(tokens)
            else:
                gates, rmap = self._router(tokens, n, e)
            # dispatcher preprocess: tokens per expert (captured with moe_preprocess), then their host read (the
            # sync point, outside any graph: the dispatcher sizes its all-to-all with it)
            if "moe_preprocess" not in self.graphed:
                per_expert = rmap.sum(dim=0).long()
            counts = per_expert.tolist()
            # permute (unfused)
            rmap_t = rmap.T.contiguous()
            tok_idx = torch.arange(n).unsqueeze(0).expand(e, -1)
            sorted_idx = tok_idx.masked_select(rmap_t)
            pprobs = gates.T.contiguous().masked_select(rmap_t)
            rows = tokens.index_select(0, sorted_idx)
            rows, pprobs = _Identity.apply(rows), _Identity.apply(pprobs)        # dispatch all-to-alls
            chunks = torch.split(rows, counts)                                     # sort by local expert
            rows = torch.cat([chunks[i] for i in range(e)])
            if self.per_expert_gemms:   # one GEMM per local expert (TE GroupedLinear's general_grouped_gemm)
                h = _GroupedLinear.apply(rows.to(torch.bfloat16), self.fc1, counts)
            else:
                offs = torch.tensor(counts).cumsum(0).to(torch.int32)
                h = torch._grouped_mm(rows.to(torch.bfloat16), self.fc1.transpose(-2, -1), offs=offs)
            g1, g2 = h.float().chunk(2, dim=-1)
            act = (F.silu(g1) * g2 * pprobs.unsqueeze(-1)).to(torch.bfloat16)
            if self.per_expert_gemms:
                out = _GroupedLinear.apply(act, self.fc2, counts).to(tokens.dtype)
            else:
                out = torch._grouped_mm(act, self.fc2.transpose(-2, -1), offs=offs).to(tokens.dtype)
            chunks = torch.split(out, counts)                                      # unsort
            out = _Identity.apply(torch.cat([chunks[i] for i in range(e)]))       # combine all-to-all
            y = torch.zeros_like(tokens).scatter_add_(0, sorted_idx.unsqueeze(1).expand(-1, shape[-1]), out)
            return y.view(shape)

    class MoELayer(dense):   # type: ignore[misc, valid-type]
        """The dense Megatron-style layer with the MoE block in place of its MLP (layer norm and residual kept)."""

        def __init__(self, hidden: int, heads: int, dropout: float, experts: int = 8, top_k: int = 2,
                     per_expert_gemms: bool = False) -> None:
            super().__init__(hidden, heads, dropout)
            del self.fc1, self.fc2
            self.moe = MoEBlock(hidden, experts, top_k, hidden, per_expert_gemms)

        def forward(self, x: Any) -> Any:
            x = self._attention(x)   # the dense layer's attention half (a replay stand-in where "attn" is graphed)
            self.moe.graphed = self.graphed
            return x + self.moe(self._ln(x, 2))

    return MoELayer


def measure_moe_host_passes(*, hidden: int = 16, heads: int = 2, seq: int = 4, experts: int = 8, top_k: int = 2,
                            short: int = 2, long: int = 10, rounds: int = DEFAULT_ROUNDS, iters: int = 40,
                            warmup: int = 20, dropout: float = 0.1, expert_counts: tuple[int, int] = (4, 16),
                            log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """How many dense layer passes of host time a Megatron-Core MoE layer pass issues (`_moe_layer_class` with
    `experts` local experts, its grouped GEMMs issued as one GEMM per expert as Transformer Engine's GroupedLinear
    does): the slope of MoE-layer stacks over the slope of dense-layer stacks at the same tiny shapes (fp32; the
    expert GEMMs in bf16, the casts around them a few of its operators), interleaved round by round on this CPU (a
    ratio, so the CPU's speed and its load at the time cancel); the median over rounds. And what each further local
    expert adds: the slope of the same MoE layers between `expert_counts` local experts, per expert, in dense layer
    passes (`moe_host_passes_per_local_expert`). The record `host_floor.json` keeps under "moe"
    (predictor.step.host_floor)."""
    import torch
    from torch import nn
    say = log or (lambda _m: None)
    with _one_host_thread():
        dense, moe = _layer_class(), _moe_layer_class()

        def stack(cls: Any, n: int, **kw: Any) -> Any:
            return nn.Sequential(*[cls(hidden, heads, dropout, **kw) for _ in range(n)])
        x = torch.randn(seq, 1, hidden, requires_grad=True)
        a, b = stack(dense, short), stack(dense, long)
        # the MoE layer as Megatron-Core's TEGroupedMLP issues it: one GEMM per local expert (TE GroupedLinear)
        ma, mb = (stack(moe, n, experts=experts, top_k=top_k, per_expert_gemms=True) for n in (short, long))
        e_lo, e_hi = expert_counts
        pe = {n: (stack(moe, short, experts=n, top_k=top_k, per_expert_gemms=True),
                  stack(moe, long, experts=n, top_k=top_k, per_expert_gemms=True)) for n in (e_lo, e_hi)}
        for m in (a, b, ma, mb, *pe[e_lo], *pe[e_hi]):
            _time_step(m, x, warmup)
        ratios, dense_s, moe_s, per_expert = [], [], [], []
        for r in range(rounds):
            ta, tb = _time_step(a, x, iters), _time_step(b, x, iters)
            d = (tb - ta) / (long - short)
            ta, tb = _time_step(ma, x, iters), _time_step(mb, x, iters)
            m_ = (tb - ta) / (long - short)
            dense_s.append(d)
            moe_s.append(m_)
            ratios.append(m_ / d)
            s_lo, s_hi = ((_time_step(pe[n][1], x, iters) - _time_step(pe[n][0], x, iters)) / (long - short)
                          for n in (e_lo, e_hi))
            per_expert.append((s_hi - s_lo) / (e_hi - e_lo) / d)
            say(f"round {r + 1}/{rounds}: dense {d * 1e6:.0f} us, MoE {m_ * 1e6:.0f} us per layer forward + "
                f"backward ({ratios[-1]:.2f}x); one GEMM per expert: {e_lo} experts {s_lo * 1e6:.0f} us, {e_hi} "
                f"{s_hi * 1e6:.0f} us ({per_expert[-1]:.3f} dense passes per expert)")
        k_dense = (count_kernels(b, x) - count_kernels(a, x)) / (long - short)
        k_moe = (count_kernels(mb, x) - count_kernels(ma, x)) / (long - short)
    return {
        "moe_layer_host_passes": statistics.median(ratios),
        "moe_layer_host_passes_iqr": _iqr(ratios),
        # what each local expert adds to a MoE layer pass where its grouped GEMMs issue one GEMM per expert
        # (Transformer Engine's GroupedLinear), in dense layer passes; never below 0 (a slope lost in the noise)
        "moe_host_passes_per_local_expert": max(0.0, statistics.median(per_expert)),
        "moe_host_passes_per_local_expert_iqr": _iqr(per_expert),
        "per_expert_gemm_expert_counts": [e_lo, e_hi],
        "dense_fwd_bwd_s_per_layer": statistics.median(dense_s),
        "moe_fwd_bwd_s_per_layer": statistics.median(moe_s),
        "dense_kernels_per_layer_pass": k_dense / 2.0,
        "moe_kernels_per_layer_pass": k_moe / 2.0,
        "applies_to": ["megatron"],
        "layer": {"style": "the Megatron-style dense layer with a Megatron-Core MoE block in place of its MLP "
                           "(TopKRouter with aux loss, alltoall dispatcher with its host read of the token counts, "
                           "unfused permute / sort / unpermute, grouped GEMMs issued as one GEMM per local expert "
                           "as TE GroupedLinear does), bf16, TP 1, EP 1",
                  "hidden": hidden, "heads": heads, "seq_len": seq, "experts": experts, "top_k": top_k,
                  "stacks": [short, long], "rounds": rounds, "iters_per_round": iters, "torch_threads": 1},
        **_measured_on(),
        "source": ("python -m bench host-floor --moe: slope of eager forward + backward time over MoE layers at tiny "
                   f"shapes ({experts} local experts, one GEMM per expert as Transformer Engine's GroupedLinear "
                   "issues them) over the same slope of dense layers, on this CPU; per local expert: the slope of "
                   f"the same MoE layers between {e_lo} and {e_hi} experts over the dense slope; the collectives' "
                   "launches and FP8's per-expert weight quantization are not counted; each expert GEMM is a "
                   "torch.mm called from a Python loop inside one autograd function (as TE's _GroupedLinear is "
                   "one), a stand-in for the cuBLAS launches TE issues per expert from C++ (not a strict bound)"),
    }


# ---- the host time CUDA graphs of parts of a layer remove (Layout.cuda_graphs) --------------------------------------

def measure_cuda_graph_shares(*, hidden: int = 16, heads: int = 2, seq: int = 4, experts: int = 8, top_k: int = 2,
                              short: int = 2, long: int = 10, rounds: int = DEFAULT_ROUNDS, iters: int = 40,
                              warmup: int = 20, dropout: float = 0.1,
                              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The host time of each part of a layer Megatron-Core's per-layer CUDA graphs capture (cuda_graph_impl
    transformer_engine, cuda_graph_scope attn / mlp / moe_router / moe_preprocess), in dense layer passes, and the
    host time of one replay, measured on this CPU with the layers `measure_host_floor` and `measure_moe_host_passes`
    time: each part in turn replaced by the host side of a replay (`_StaticBuffers`: the static-buffer copies and the
    autograd function Transformer Engine's graphed callable runs, forward and backward), the drop in the stack's slope
    over the dense layer's slope. Replay: the dense layer with both halves replaced (two replays), halved.

    share(part) = (slope(layer) - slope(layer with part replayed)) / slope(dense) + replay, so that
    host passes left = passes - sum of the captured parts' shares + replays (`predictor.step.host_floor`).
    moe_preprocess is measured with moe_router captured (Megatron-Core requires it with moe_router): its share is the
    further drop. Interleaved round by round (ratios, so the CPU's speed and load cancel); medians over rounds. The
    record `host_floor.json` keeps under "cuda_graphs"."""
    import torch
    from torch import nn
    say = log or (lambda _m: None)
    with _one_host_thread():
        dense, moe = _layer_class(), _moe_layer_class()

        def stack(cls: Any, n: int, graphed: frozenset[str], **kw: Any) -> Any:
            layers = [cls(hidden, heads, dropout, **kw) for _ in range(n)]
            for layer in layers:
                layer.graphed = graphed
            return nn.Sequential(*layers)
        x = torch.randn(seq, 1, hidden, requires_grad=True)
        moe_kw = dict(experts=experts, top_k=top_k, per_expert_gemms=True)
        variants = {
            "dense": (dense, frozenset(), {}), "dense_attn": (dense, frozenset({"attn"}), {}),
            "dense_mlp": (dense, frozenset({"mlp"}), {}), "dense_both": (dense, frozenset({"attn", "mlp"}), {}),
            "moe": (moe, frozenset(), moe_kw), "moe_router": (moe, frozenset({"moe_router"}), moe_kw),
            "moe_router_pre": (moe, frozenset({"moe_router", "moe_preprocess"}), moe_kw),
        }
        stacks = {k: (stack(c, short, g, **kw), stack(c, long, g, **kw)) for k, (c, g, kw) in variants.items()}
        for a, b in stacks.values():
            _time_step(a, x, warmup)
            _time_step(b, x, warmup)
        got: dict[str, list[float]] = {k: [] for k in ("replay", "attn", "mlp", "moe_router", "moe_preprocess",
                                                          "dense_s")}
        for r in range(rounds):
            sl = {k: (_time_step(b, x, iters) - _time_step(a, x, iters)) / (long - short) for k, (a, b) in
                  stacks.items()}
            d = sl["dense"]
            rep = sl["dense_both"] / 2.0 / d
            got["dense_s"].append(d)
            got["replay"].append(rep)
            got["attn"].append((d - sl["dense_attn"]) / d + rep)
            got["mlp"].append((d - sl["dense_mlp"]) / d + rep)
            got["moe_router"].append((sl["moe"] - sl["moe_router"]) / d + rep)
            got["moe_preprocess"].append((sl["moe_router"] - sl["moe_router_pre"]) / d)
            say(f"round {r + 1}/{rounds}: dense {d * 1e6:.0f} us per layer forward + backward; in dense layer "
                f"passes: replay {rep:.3f}, attn {got['attn'][-1]:.3f}, mlp {got['mlp'][-1]:.3f}, moe_router "
                f"{got['moe_router'][-1]:.3f}, moe_preprocess {got['moe_preprocess'][-1]:.3f}")

    def med(k: str) -> float:
        return statistics.median(got[k])

    return {
        # dense layer passes of host time each captured part takes (fwd + bwd over 2 x a dense pass), never below 0
        "scope_host_passes": {k: max(0.0, med(k)) for k in ("attn", "mlp", "moe_router", "moe_preprocess")},
        "scope_host_passes_iqr": {k: _iqr(got[k]) for k in ("attn", "mlp", "moe_router", "moe_preprocess")},
        # dense layer passes of host time one replay (forward or backward) takes
        "replay_host_passes": max(0.0, med("replay")),
        "replay_host_passes_iqr": _iqr(got["replay"]),
        "dense_fwd_bwd_s_per_layer": med("dense_s"),
        "applies_to": ["megatron"],
        "layer": {"style": "the dense Megatron-style layer and the Megatron-Core MoE layer of `bench host-floor` / "
                           "`--moe`, each captured part replaced by the host side of a Transformer Engine graphed "
                           "callable's replay (static input / gradient copies and one autograd function)",
                  "hidden": hidden, "heads": heads, "seq_len": seq, "experts": experts, "top_k": top_k,
                  "stacks": [short, long], "rounds": rounds, "iters_per_round": iters, "torch_threads": 1},
        **_measured_on(),
        "source": ("python -m bench host-floor --cuda-graphs: slope of eager forward + backward time over layers at "
                   "tiny shapes with each part Megatron-Core's per-layer CUDA graphs capture (attn, mlp, moe_router, "
                   "moe_preprocess) replaced by the host side of a replay, the drop over the dense layer's slope plus "
                   "one replay, on this CPU; replay: the dense layer with both halves replayed, halved. The replay's "
                   "cudaGraphLaunch driver call is not counted (as the eager floor leaves out kernel launch calls); "
                   "the token counts' host read stays outside the graph"),
    }

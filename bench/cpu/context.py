"""What separately timed operators miss: the framework's per-op cost, and whole layers in context.

    python -m bench context --platform cpu-2t --threads 2 [--budget-s 60]
    python -m bench context --platform cpu-1t --threads 1 --ranks 2        # as cpu-1t was sampled

The operator samples time each op alone: one op, its inputs hot in the caches, and for a backward
pass one `out.backward(grad)` call per op. A training step differs at both ends:

* per-op framework cost: Hugging Face issues many more (and smaller) aten ops than the decomposition
  names (views, transposes, splits, adds; 33 forward and 65 backward aten ops per GPT-2 layer, 77 and
  142 per Llama layer, against 10 and 11 decomposed ops), while every sampled backward carries the
  fixed cost of a whole `backward()` call that a step pays once;
* memory traffic: in a step the activations saved for the backward pass come back from DRAM, the
  weights and gradients of the whole model stream through the caches, the allocator reuses blocks.

This sampler measures both, on the machine and at the moment it runs, so nothing needs to be
extrapolated from another machine:

`dispatch` (µs): one tiny eager op; the same recorded for autograd; the fixed cost of one
`backward()` call; the cost per autograd node inside one backward; a small element-wise op with 1
thread and with the run's threads (OpenMP start-up).

`layers`: for a fixed set of shapes (tiny to 8-16 MiB activations), one Hugging Face decoder layer
(GPT2Block / LlamaDecoderLayer, SDPA, dropout 0, fp32) timed forward and backward exactly as the
operator sampler times an op (bench.sampling.timing, same warm-up and statistic), its aten ops counted
(TorchDispatchMode), and right after, the decomposition's operators of that layer
(predictor.step.decompose, the same shapes) each built by bench.kernels.opbench and timed the same way. The two
numbers are taken minutes apart on one machine, so their ratio is the composition's own error,
free of regressor error and of the machine's drift: `context - sum(ops)` per layer, against the
number of aten ops (the per-op host term) and the activation bytes (the memory-traffic term).

Results are appended to `<sample set>/context.json` (ignored by `predictor ingest`); the set must be
this machine's (store_io.check_same_machine).
"""
from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import env
from bench.sampling import store_io

# arch, layers (1), hidden, heads, kv_heads, ffn (llama), seq, batch: cheapest first, so a budget cut
# short keeps the small shapes (per-op cost) and as many large ones (memory traffic) as fit
LAYER_SHAPES = [
    ("gpt", 128, 2, None, None, 128, 4),
    ("llama", 128, 4, 2, 352, 256, 2),
    ("gpt", 256, 4, None, None, 256, 4),
    ("llama", 512, 8, 4, 1376, 256, 2),
    ("gpt", 1024, 16, None, None, 128, 2),
    ("gpt", 512, 8, None, None, 512, 8),
    ("llama", 512, 8, 8, 1376, 512, 8),
    ("gpt", 1024, 16, None, None, 512, 8),
]
CONTEXT_FILE = "context.json"


# --------------------------------------------------------------------------- per-op framework cost
def dispatch_costs(threads: int, n: int = 2000) -> dict[str, float]:
    """Microseconds per call of the framework's fixed costs (medians of repeated loops)."""
    import statistics

    import torch

    def per_call(fn: Callable[[], Any], calls: int, reps: int = 5) -> float:
        xs = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            xs.append((time.perf_counter_ns() - t0) / calls / 1e3)
        return statistics.median(xs)

    x = torch.ones(8)
    xg = torch.ones(8, requires_grad=True)
    out: dict[str, float] = {}
    out["eager_op_us"] = per_call(lambda: torch.add(x, x), n)
    out["autograd_op_us"] = per_call(lambda: torch.add(xg, xg), n)

    def backward_once() -> float:
        xs = []
        for _ in range(200):
            y = (xg * 2.0).sum()
            t0 = time.perf_counter_ns()
            y.backward()
            xs.append((time.perf_counter_ns() - t0) / 1e3)
            xg.grad = None
        return statistics.median(xs)
    out["backward_call_us"] = backward_once()  # one backward() over a 2-node graph

    def backward_chain(k: int) -> float:
        xs = []
        for _ in range(20):
            y = xg
            for _ in range(k):
                y = y * 1.0
            y = y.sum()
            t0 = time.perf_counter_ns()
            y.backward()
            xs.append((time.perf_counter_ns() - t0) / 1e3)
            xg.grad = None
        return statistics.median(xs)
    short, long = backward_chain(2), backward_chain(202)
    out["backward_per_node_us"] = (long - short) / 200
    out["backward_call_fixed_us"] = max(0.0, short - 2 * out["backward_per_node_us"])
    big = torch.ones(16384)
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        out["add_16k_1thread_us"] = per_call(lambda: torch.add(big, big), n // 4)
        torch.set_num_threads(max(1, threads))
        out["add_16k_run_threads_us"] = per_call(lambda: torch.add(big, big), n // 4)  # OpenMP start-up
    finally:
        torch.set_num_threads(prev)
    return {k: round(v, 3) for k, v in out.items()}


# --------------------------------------------------------------------------- a layer in context
def layer_config(arch: str, hidden: int, heads: int, kv: int | None, ffn: int | None) -> Any:
    from transformers import GPT2Config, LlamaConfig
    if arch == "gpt":
        cfg = GPT2Config(n_embd=hidden, n_head=heads, n_layer=1, vocab_size=1024, resid_pdrop=0.0, embd_pdrop=0.0,
                         attn_pdrop=0.0, activation_function="gelu_pytorch_tanh")
    else:
        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads,
                          num_key_value_heads=kv, num_hidden_layers=1, vocab_size=1024)
    cfg._attn_implementation = "sdpa"
    return cfg


def build_layer(arch: str, hidden: int, heads: int, kv: int | None, ffn: int | None, seq: int, batch: int):
    """(leaves, forward) of one HF decoder layer on a random [batch, seq, hidden] input."""
    import torch
    torch.manual_seed(0)
    cfg = layer_config(arch, hidden, heads, kv, ffn)
    x = torch.randn(batch, seq, hidden, requires_grad=True)
    if arch == "gpt":
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block
        layer = GPT2Block(cfg, layer_idx=0).float().train()

        def forward():
            o = layer(x)
            return o[0] if isinstance(o, tuple) else o
    else:
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRotaryEmbedding,
        )
        layer = LlamaDecoderLayer(cfg, layer_idx=0).float().train()
        rot = LlamaRotaryEmbedding(config=cfg)
        pos = torch.arange(seq)[None].expand(batch, seq)

        def forward():  # the RoPE tables are computed per step in HF's model, so they are timed here too
            cos, sin = rot(x, pos)
            o = layer(x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))
            return o[0] if isinstance(o, tuple) else o
    return [x, *layer.parameters()], forward


def count_aten_ops(leaves, forward) -> tuple[int, int]:
    """(forward, backward) aten ops of one pass (TorchDispatchMode)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))
    for t in leaves:
        t.grad = None
    with Count():
        out = forward()
    nf, Count.n = Count.n, 0
    grad = torch.randn_like(out)
    with Count():
        out.backward(grad)
    for t in leaves:
        t.grad = None
    return nf, Count.n


def decomposed_layer_ops(arch: str, hidden: int, heads: int, kv: int | None, ffn: int | None, seq: int,
                         batch: int) -> list[tuple[str, str, dict[str, int | None], float]]:
    """The decomposition's (op, pass, shape columns, count) of one layer (predictor.step.decompose)."""
    from bench.cpu.e2e import spec_and_layout
    from predictor.hardware.platforms import get_platform
    from predictor.model import ops as P
    from predictor.step.decompose import decompose
    c = {"name": "layer", "arch": arch, "layers": 1, "hidden": hidden, "heads": heads, "kv_heads": kv,
         "ffn": ffn, "seq": seq, "batch": batch, "vocab": 1024}
    m, L = spec_and_layout(c, 1)
    plan = decompose(m, L, get_platform("cpu-2t"))[0]
    return [(o.op, o.pass_, dict(zip(P.SHAPE_COLUMNS, o.shape, strict=True)), o.count)
            for o in plan.ops if o.part == "layer"]


def time_layer_and_ops(shape: tuple, target_s: float = 0.2, time_fn=None) -> dict[str, Any]:
    """One entry of `layers`: the HF layer in context vs the sum of its decomposed operators."""
    from bench.kernels import opbench
    from bench.kernels.passes import autograd_passes
    from bench.sampling.sampler import time_on_every_rank
    time_fn = time_fn or (lambda fn, setup: time_on_every_rank(fn, setup, device="cpu", target_s=target_s)[0])
    arch, hidden, heads, kv, ffn, seq, batch = shape
    leaves, forward = build_layer(arch, hidden, heads, kv, ffn, seq, batch)
    n_fwd, n_bwd = count_aten_ops(leaves, forward)
    layer_passes = autograd_passes(leaves, forward)
    t0 = time.monotonic()
    layer = {ps: time_fn(fn, setup) for ps, (setup, fn) in layer_passes.items()}
    del layer_passes, leaves, forward
    ops: dict[str, float] = {}
    total = {"fwd": 0.0, "bwd": 0.0}
    n_ops = {"fwd": 0.0, "bwd": 0.0}
    for op, ps, shp, count in decomposed_layer_ops(arch, hidden, heads, kv, ffn, seq, batch):
        kernels = opbench.build(op, shp)
        setup, fn = kernels[ps]
        t = time_fn(fn, setup)
        ops[f"{op}.{ps}"] = ops.get(f"{op}.{ps}", 0.0) + t * count
        total[ps] += t * count
        n_ops[ps] += count
        del kernels
    act = batch * seq * hidden * 4
    return {"arch": arch, "hidden": hidden, "heads": heads, "kv_heads": kv, "ffn": ffn, "seq": seq, "batch": batch,
            "activation_mib": round(act / 2**20, 3),
            "layer_fwd_s": layer["fwd"], "layer_bwd_s": layer["bwd"],
            "ops_fwd_s": total["fwd"], "ops_bwd_s": total["bwd"],
            "ratio_fwd": layer["fwd"] / total["fwd"], "ratio_bwd": layer["bwd"] / total["bwd"],
            "residual_ms": (layer["fwd"] + layer["bwd"] - total["fwd"] - total["bwd"]) * 1e3,
            "aten_ops_fwd": n_fwd, "aten_ops_bwd": n_bwd, "decomposed_ops_fwd": n_ops["fwd"],
            "decomposed_ops_bwd": n_ops["bwd"], "ops_s": ops, "seconds": round(time.monotonic() - t0, 2)}


def run_context(platform: str, out_dir: str | Path, *, threads: int | None = None, budget_s: float | None = 60.0,
                shapes: list[tuple] | None = None, target_s: float = 0.2, machine=None,
                log: Callable[[str], None] = print, time_fn=None) -> dict[str, Any]:
    """Measure the dispatch costs and the layer shapes (until `budget_s` is spent) into
    `<out_dir>/context.json`. Under torchrun every rank measures (as the operator sampler does);
    rank 0 writes."""
    import torch

    from bench.sampling.sampler import _dist
    dist = _dist()
    rank = dist.get_rank() if dist else 0
    if threads:
        torch.set_num_threads(int(threads))
    out = Path(out_dir)
    facts = env.facts("cpu")
    if machine is not None:
        machine.threads = torch.get_num_threads()
        facts["machine"], facts["machine_id"] = machine.to_dict(), machine.id
    from predictor.hardware.machine import from_dict
    here = from_dict(facts["machine"])
    store_io.check_same_machine(out, here)
    t0 = time.monotonic()
    run = {"run_id": time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:4], "kind": "context",
           "platform": platform, "started_at": store_io.now_iso(), "threads": torch.get_num_threads(),
           "ranks_concurrent": dist.get_world_size() if dist else 1, "budget_s": budget_s, "machine_id": here.id,
           "loadavg_start": list(env.loadavg()),
           "timing": f"bench.sampling.timing: warm-up, median of 3..30 repeats (target {target_s} s per pass), "
                     "as the sampler",
           "dispatch": dispatch_costs(torch.get_num_threads()), "layers": []}
    stopped = "all shapes measured"
    for shape in shapes or LAYER_SHAPES:
        go = budget_s is None or time.monotonic() - t0 < budget_s
        if dist:
            t = torch.tensor([int(go)])
            dist.broadcast(t, 0)
            go = bool(t.item())
        if not go:
            stopped = f"time budget {budget_s:g} s spent"
            break
        entry = time_layer_and_ops(shape, target_s, time_fn)
        run["layers"].append(entry)
        if rank == 0:
            log(f"context {platform}: {shape[0]} h{shape[1]} b{shape[6]} s{shape[5]}: layer fwd+bwd "
                f"{(entry['layer_fwd_s'] + entry['layer_bwd_s']) * 1e3:.1f} ms vs its ops "
                f"{(entry['ops_fwd_s'] + entry['ops_bwd_s']) * 1e3:.1f} ms "
                f"(x{entry['ratio_fwd']:.2f} fwd, x{entry['ratio_bwd']:.2f} bwd; "
                f"{entry['aten_ops_fwd']}+{entry['aten_ops_bwd']} aten ops)")
    run.update(stopped=stopped, elapsed_s=round(time.monotonic() - t0, 1), finished_at=store_io.now_iso(),
               loadavg_end=list(env.loadavg()), facts=facts)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        path = out / CONTEXT_FILE
        rec = json.loads(path.read_text()) if path.exists() else {
            "description": "bench/cpu/context.py: per-op framework costs and HF decoder layers timed in context "
                           "vs their decomposed operators timed alone, on the machine of this sample set",
            "platform": platform, "runs": []}
        rec["runs"].append(run)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rec, indent=1, default=str) + "\n")
        os.replace(tmp, path)
        d = run["dispatch"]
        log(f"context {platform}: eager op {d['eager_op_us']:.1f} us, with autograd {d['autograd_op_us']:.1f} us, "
            f"backward() call {d['backward_call_fixed_us']:.1f} us + {d['backward_per_node_us']:.1f} us per node; "
            f"{len(run['layers'])} layer shapes in {run['elapsed_s']} s ({stopped}) -> {path}")
    return run

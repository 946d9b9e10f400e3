"""The routed experts of a MoE layer as the predictor times them, against published measured MoE layers (never
fitted to):

    python -m tests.benchmarks.measured_moe

1. NVIDIA aiconfigurator's `moe_perf.parquet` (../shared/datasets/aiconfigurator/<gpu>/moe/trtllm/1.3.0rc20/,
   Apache-2.0): a whole MoE layer's routed-expert compute (grouped GEMMs, activation, routing scatter / gather),
   TensorRT-LLM inference kernels, FORWARD only, by num_tokens, expert shape, top_k, experts, moe_tp / moe_ep and
   routing distribution. Used here: the bf16 rows with `balanced` routing and moe_tp 1 of the three MoE models the
   NeMo check runs (Mixtral-8x7B, Qwen3-30B-A3B, Qwen3-235B-A22B), num_tokens >= 1024; each rank's local experts
   (num_experts / ep) get num_tokens x top_k / num_experts rows each. The fp8 / fp8_block / nvfp4 rows are
   inference quantisation recipes (weights pre-quantised, no per-step casts), not Transformer Engine's FP8
   training, and are left out.
2. Liger-Kernel's fused MoE benchmark (../shared/datasets/liger-kernel/all_benchmark_data.csv, BSD-2-Clause):
   H100, the Qwen3-30B-A3B expert shape (128 experts, hidden 2048, width 768, top-8, bf16) on one GPU (ep 1),
   forward and backward, T = 128..32768 tokens. Liger's Triton kernel is not the grouped GEMM Megatron-Core runs, so
   it is shown as a bound on the backward / forward ratio, not as a target.

Ours: one GEMM per local expert on its rows (mlp_up with gate + up, swiglu, mlp_down; predictor.model.moe), each
timed by the platform's regressors (the measured GEMM tables on these platforms). Ratio = ours / measured, per GPU
and model and per block of rows per expert.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from predictor.model.presets import get_preset
from predictor.plan.predict import get_predictor
from predictor.step import decompose as D

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "datasets"
GPUS = {"h100_sxm": "dgx-h100", "h200_sxm": "dgx-h200", "b200_sxm": "dgx-b200", "gb200": "gb200-nvl72",
        "b300_sxm": "dgx-b300", "gb300": "gb300-nvl72"}
MODELS = ("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b")
ROW_BLOCKS = (0, 128, 512, 2048, 10 ** 9)   # rows per expert: [1, 128], (128, 512], (512, 2048], > 2048


def expert_forward_s(P, model, local: int, rows_per_expert: int, pass_: str = "fwd") -> float:
    """Our time of `local` experts' MLPs on `rows_per_expert` rows each (one pass)."""
    ops = D._mlp_ops(model, 1, 1, rows_per_expert, model.expert_ffn, pass_, "experts", local)
    if pass_ != "fwd":
        ops = [D.OpCall(c.op, pass_, c.shape, c.count, pass_, c.part) for c in ops]
    return float(sum(t[0] * c.count * c.scale for c, t in zip(ops, P.op_times(ops, "bf16"))))


def aiconfigurator_rows(root: Path = DATA) -> pd.DataFrame:
    out = []
    for gpu, pid in GPUS.items():
        path = root / "aiconfigurator" / gpu / "moe" / "trtllm" / "1.3.0rc20" / "moe_perf.parquet"
        if not path.exists():
            continue
        d = pd.read_parquet(path)
        P = get_predictor(pid)
        for name in MODELS:
            m = get_preset(name)
            q = d[(d.hidden_size == m.hidden_size) & (d.inter_size == m.expert_ffn) & (d.num_experts == m.num_experts)
                  & (d.topk == m.top_k) & (d.moe_tp_size == 1) & (d.distribution == "balanced")
                  & (d.moe_dtype == "bfloat16") & (d.num_tokens >= 1024)]
            for _, r in q.iterrows():
                ep = int(r.moe_ep_size)
                rpe = max(1, int(np.ceil(r.num_tokens * m.top_k / m.num_experts)))
                ours = expert_forward_s(P, m, m.num_experts // ep, rpe)
                out.append({"gpu": pid, "model": name, "ep": ep, "tokens": int(r.num_tokens), "rows_per_expert": rpe,
                            "measured_ms": float(r.latency), "ours_ms": ours * 1e3})
    d = pd.DataFrame(out)
    if len(d):
        d["ratio"] = d["ours_ms"] / d["measured_ms"]
        d["rows_block"] = pd.cut(d["rows_per_expert"], ROW_BLOCKS, labels=["<=128", "129-512", "513-2048", ">2048"])
    return d


def liger_rows(root: Path = DATA) -> pd.DataFrame:
    path = root / "liger-kernel" / "all_benchmark_data.csv"
    if not path.exists():
        return pd.DataFrame()
    d = pd.read_csv(path)
    d = d[(d.kernel_name == "fused_moe") & (d.x_name == "T") & (d.kernel_provider == "liger")
          & (d.metric_name == "speed")]
    P, m = get_predictor("dgx-h100"), get_preset("qwen3-30b-a3b")
    out = []
    for t in sorted(d.x_value.unique()):
        g = d[d.x_value == t].set_index("kernel_operation_mode")["y_value_50"]
        rpe = max(1, int(np.ceil(t * m.top_k / m.num_experts)))
        f, b = (expert_forward_s(P, m, m.num_experts, rpe, p) * 1e3 for p in ("fwd", "bwd"))
        out.append({"tokens": int(t), "liger_fwd_ms": g.get("forward"), "liger_bwd_ms": g.get("backward"),
                    "ours_fwd_ms": f, "ours_bwd_ms": b})
    x = pd.DataFrame(out)
    x["liger_bwd/fwd"] = x["liger_bwd_ms"] / x["liger_fwd_ms"]
    x["ours_bwd/fwd"] = x["ours_bwd_ms"] / x["ours_fwd_ms"]
    return x


def _stats(g: pd.DataFrame) -> pd.Series:
    r = g["ratio"]
    return pd.Series({"rows": len(g), "median": r.median(), "p10": r.quantile(0.1), "p90": r.quantile(0.9),
                      "mape": (r - 1).abs().mean()})


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    pd.set_option("display.width", 200)
    d = aiconfigurator_rows()
    print("== routed experts, forward: ours / aiconfigurator's measured bf16 MoE layer (balanced routing) ==")
    if not len(d):
        print("no aiconfigurator MoE tables found under", DATA)
    else:
        print(d.groupby(["gpu", "model"]).apply(_stats, include_groups=False).round(3).to_string())
        print("\nby rows per expert (all GPUs and models):")
        print(d.groupby("rows_block", observed=True).apply(_stats, include_groups=False).round(3).to_string())
        nemo = d[d["rows_per_expert"] >= 512]
        print(f"\nrows per expert >= 512 (the NeMo runs' loads: 2,048 rows per local expert at micro-batch 1): "
              f"median ratio {nemo['ratio'].median():.3f}, MAPE {(nemo['ratio'] - 1).abs().mean():.1%}, "
              f"{len(nemo)} rows")
    x = liger_rows()
    print("\n== Liger-Kernel fused MoE on H100 (Triton, Qwen3-30B-A3B experts on one GPU), p50 ms ==")
    print(x.round(3).to_string(index=False) if len(x) else "no Liger-Kernel benchmark data found")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Pipeline schedules against the Zero Bubble paper's measured throughput: prints tables.

    python -m tests.benchmarks.schedules

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024, arXiv 2401.10241), section 5: GPT models of Table 3
(1.5B / 6.2B / 14.6B / 28.3B: layers, heads, hidden, sequence 1,024, micro-batch 6 / 3 / 1 / 1) as pure pipelines
(pp = the GPUs: 8 / 8 / 16 / 32 A100 SXM 80G, tp = dp = 1), the first and last stages one transformer layer
lighter than the others ("to compensate for the extra embedding lookup and loss computations"), 24-256
micro-batches. Table 4 gives samples per GPU per second of 1F1B and of ZB-1p (the automatically searched schedule
with 1F1B's memory; its bubble rate equals the handcrafted ZB-H1's in Table 5), which this project models as zb-h1.

1. Per setup: predicted step time of 1f1b and zb-h1 on dgx-a100-80gb, predicted speed-up against the published
   ZB-1p / 1F1B throughput ratio, and the predicted bubble rate (bubble / pipeline time) against Table 5's
   calculated one (1F1B, ZB-H1).
2. Search: the layouts of each setup's GPUs and global batch with pp fixed to the paper's, schedules 1f1b and zb-h1
   (and the others): which ranks first (the paper: ZB-1p beats 1F1B in every setup).
These runs are never fitted to (the predictor knows nothing of them); they are an independent check.
"""
from __future__ import annotations

from predictor.model.specs import Layout, ModelSpec
from predictor.model.stages import split_layers
from predictor.plan.predict import get_predictor
from predictor.plan.search import SearchSpace, search

PLATFORM = "dgx-a100-80gb"
# name: (layers, heads, hidden, GPUs = pp, micro-batch): Table 3; vocab 50,257 (Megatron-LM's GPT-2 tokenizer)
MODELS = {"1.5B": (22, 24, 2304, 8, 6), "6.2B": (30, 32, 4096, 8, 3), "14.6B": (46, 40, 5120, 16, 1),
          "28.3B": (62, 48, 6144, 32, 1)}
MICRO_BATCHES = {"1.5B": (24, 32, 64), "6.2B": (24, 32, 64), "14.6B": (48, 64, 128), "28.3B": (96, 128, 256)}
# Table 4, samples per GPU per second: (1F1B, ZB-1p) per micro-batch count
PUBLISHED = {"1.5B": ((11.8, 12.9), (12.5, 13.4), (13.6, 14.2)), "6.2B": ((3.50, 3.88), (3.70, 4.00), (4.03, 4.20)),
             "14.6B": ((1.40, 1.61), (1.49, 1.67), (1.64, 1.76)), "28.3B": ((0.76, 0.87), (0.80, 0.90), (0.88, 0.96))}
# Table 5, bubble rates calculated from profiled T_F, T_B, T_W, T_comm: (1F1B, ZB-H1)
BUBBLE = {"1.5B": ((0.2431, 0.1585), (0.1985, 0.1242), (0.1240, 0.0674)),
          "6.2B": ((0.2347, 0.1323), (0.1898, 0.1045), (0.1091, 0.0554)),
          "14.6B": ((0.2552, 0.1397), (0.2082, 0.1088), (0.1251, 0.0576)),
          "28.3B": ((0.2646, 0.1421), (0.2168, 0.1106), (0.1352, 0.0594))}


def model_of(name: str) -> ModelSpec:
    layers, heads, hidden, _, _ = MODELS[name]
    return ModelSpec(f"zb-{name}", "gpt", layers, hidden, heads, vocab_size=50257, tied_embeddings=True)


def edge_light(layers: int, pp: int) -> tuple[int, ...]:
    c = split_layers(layers + 2, pp)
    c[0] -= 1
    c[-1] -= 1
    return tuple(c)


def layout_of(name: str, m: int, schedule: str) -> Layout:
    layers, _, _, pp, mb = MODELS[name]
    return Layout(num_gpus=pp, tp=1, pp=pp, dp=1, micro_batch=mb, global_batch=mb * m, seq_len=1024,
                  schedule=schedule, stage_layers=edge_light(layers, pp))


def main() -> None:
    P = get_predictor(PLATFORM)
    print(f"1. Predicted (on {PLATFORM}) vs the Zero Bubble paper's A100 runs (Tables 4, 5)")
    print(f"{'model':>6} {'m':>4} | {'1f1b s':>7} {'zb-h1 s':>7} | {'speed-up pred':>13} {'published':>9} | "
          f"{'bubble 1f1b pred / T5':>21} {'bubble zb-h1 pred / T5':>22} | {'samples/GPU/s 1f1b pred / pub':>29}")
    ratios = []
    for name in MODELS:
        model = model_of(name)
        for k, m in enumerate(MICRO_BATCHES[name]):
            a = P.predict(model, layout_of(name, m, "1f1b"), timeline=False)
            z = P.predict(model, layout_of(name, m, "zb-h1"), timeline=False)
            pub = PUBLISHED[name][k][1] / PUBLISHED[name][k][0]
            pred = a.step_time_s / z.step_time_s
            ratios.append((pred, pub))
            ba, bz = (p.breakdown_s["bubble"] / p.pipeline_s for p in (a, z))
            pp, mb = MODELS[name][3], MODELS[name][4]
            sps = mb * m / a.step_time_s / pp
            print(f"{name:>6} {m:>4} | {a.step_time_s:7.3f} {z.step_time_s:7.3f} | {pred:13.3f} {pub:9.3f} | "
                  f"{ba:10.4f} / {BUBBLE[name][k][0]:.4f} {bz:11.4f} / {BUBBLE[name][k][1]:.4f} | "
                  f"{sps:14.2f} / {PUBLISHED[name][k][0]:.2f}")
    err = [p / q - 1 for p, q in ratios]
    print(f"speed-up: predicted / published - 1: mean {sum(err) / len(err):+.1%}, worst "
          f"{max(err, key=abs):+.1%}; zb-h1 predicted faster in {sum(p > 1 for p, _ in ratios)} of {len(ratios)} "
          "(published: ZB-1p faster in every setup)")

    print("\n2. Search over the paper's GPUs and global batch (pp fixed, tp = 1), schedules 1f1b,interleaved,zb-h1")
    for name in MODELS:
        _, _, _, pp, mb = MODELS[name]
        m = MICRO_BATCHES[name][0]
        rep = search(model_of(name), PLATFORM, pp, global_batch=mb * m, seq_len=1024,
                     space=SearchSpace(tp=(1,), pp=(pp,), micro_batch=(mb,), recompute=("none",), zero_stage=(0,),
                                       schedules=("1f1b", "interleaved", "zb-h1")), top_k=3)
        best = rep.top[0]
        others = ", ".join(f"{r.layout.schedule} {r.step_time_s:.3f} s" for r in rep.top[1:3])
        print(f"{name:>6} m={m}: first {best.layout.schedule} ({best.step_time_s:.3f} s); then {others}")


if __name__ == "__main__":
    main()

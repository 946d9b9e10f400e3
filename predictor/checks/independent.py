"""The independent check: published end-to-end runs on GPUs the project never sampled, never fitted to.

`catalog/independent_runs.json` holds them as facts from the cited documents (today: MosaicML's
llm-foundry H100 80GB BF16 table, 52 runs, source `llm-foundry-h100`, and its H100 80GB FP8 table,
10 runs, source `llm-foundry-h100-fp8`, predicted with precision fp8). The store never ingests them
and no term is fitted on them; this module predicts each with the product as shipped and scores it:
per run, per group (one node / several nodes, model size) and overall, with the mean *signed* error and
the predicted vs published MFU.

Each row is checked before it is used: gradient accumulation x micro-batch x GPUs must be its global batch, and
the published MFU must follow from its throughput with the README's own FLOP formula over the source's
`peak_flops_basis` (bf16: 989 TFLOP/s; fp8: 1978.9 TFLOP/s) within 3 % (a typo in
a transcribed row would break one of the two); a row that fails is dropped and counted, never predicted.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from predictor import paths
from predictor.samples.formats.sources import MEMORY_FACTS
from predictor.step.memory import MemoryOptions

CATALOG = paths.CATALOG_DIR / "independent_runs.json"
MFU_TOLERANCE = 0.03
H100_BF16_PEAK_FLOPS = 989e12  # dense BF16 tensor-core peak of H100 SXM (the README's GPU_AVAILABLE_FLOPS)
H100_FP8_PEAK_FLOPS = 1978.9e12  # dense FP8 tensor-core peak of H100 SXM (the FP8 table's MFU denominator)
# The peak each source's published MFU is computed against (its `peak_flops_basis`): the BF16 table against the BF16
# peak, the FP8 table against the FP8 peak (its MFU follows from its throughput only over 1978.9 TFLOP/s).
PEAK_FLOPS = {"bf16": H100_BF16_PEAK_FLOPS, "fp8": H100_FP8_PEAK_FLOPS}


def summary_groups(runs: pd.DataFrame, by: str | None) -> list[tuple[str, pd.DataFrame]]:
    """("all runs", every run), or one (name, runs) per value of column `by`, in order of appearance."""
    return [("all runs", runs)] if by is None else [(str(k), g) for k, g in runs.groupby(by, sort=False)]


def error_stats(predicted: pd.DataFrame) -> dict[str, float]:
    """MAPE, median, worst and mean signed error of predicted runs (columns `ape`, `signed_error`)."""
    return {"mape": predicted["ape"].mean(), "median_ape": predicted["ape"].median(),
            "worst_ape": predicted["ape"].max(), "mean_signed": predicted["signed_error"].mean()}


@dataclass(frozen=True)
class IndependentCheck:
    """Per-run table (`runs`), summaries, and what the rows rest on."""
    source_id: str
    source: dict[str, Any]
    runs: pd.DataFrame
    dropped: dict[str, int]

    def summary(self, by: str | None = None) -> pd.DataFrame:
        """MAPE, median, worst, mean signed error, published vs predicted MFU; one row per group."""
        rows = []
        for name, g in summary_groups(self.runs, by):
            ok = g[g["predicted_s"].notna()]
            rows.append({"group": name, "runs": len(g), **error_stats(ok),
                         "published_mfu": ok["published_mfu"].mean(), "predicted_mfu": ok["predicted_mfu"].mean(),
                         "not_fitting": int((~ok["fits"].astype(bool)).sum()),
                         "tight": int(ok["memory_tight"].astype(bool).sum()) if "memory_tight" in ok else 0})
        return pd.DataFrame(rows)


def memory_options_of(src: dict[str, Any]) -> MemoryOptions:
    """The memory options a source's cited `memory` facts set (e.g. `dropout` false: MPT trains without dropout),
    the defaults for the rest."""
    facts = src.get("memory") or {}
    opts: dict[str, Any] = {name: bool(f["value"]) for name, f in facts.items() if name in MEMORY_FACTS}
    return MemoryOptions(**opts)


def load_sources(path: Path = CATALOG) -> dict[str, dict[str, Any]]:
    return dict(json.loads(Path(path).read_text())["sources"])


def _mpt_flops_per_token(m: dict[str, int], seq_len: int) -> float:
    """The README's MFU numerator per token: 3 x (2 N + attention), N counted as the README's NumParams would be
    (12 L d^2 + vocab x d for these GPT blocks without biases), attention 2 x 2 L d seq per token."""
    L, d, v = m["layers"], m["hidden"], m["vocab"]
    n_params = 12 * L * d * d + v * d
    return 3 * (2 * n_params + 4 * L * d * seq_len)


def published_runs(src: dict[str, Any]) -> tuple[pd.DataFrame, dict[str, int]]:
    d = pd.DataFrame(src["rows"], columns=src["columns"])
    dropped: dict[str, int] = {}
    ok = d["grad_accum"] * d["micro_batch"] * d["gpus"] == d["global_batch"]
    dropped["batch arithmetic does not close"] = int((~ok).sum())
    d = d[ok].reset_index(drop=True)
    flops = np.array([_mpt_flops_per_token(src["models"][r.model], r.seq_len) for r in d.itertuples()])
    peak = PEAK_FLOPS[src.get("peak_flops_basis", "bf16")]
    mfu_from_tput = flops * d["tokens_per_s"] / (d["gpus"] * peak)
    agree = (mfu_from_tput / (d["mfu_pct"] / 100) - 1).abs() <= MFU_TOLERANCE
    dropped[f"published MFU does not follow from the throughput (> {MFU_TOLERANCE:.0%})"] = int((~agree).sum())
    d = d[agree].reset_index(drop=True)
    d["measured_s"] = d["global_batch"] * d["seq_len"] / d["tokens_per_s"]
    d["published_mfu"] = d["mfu_pct"] / 100
    return d, {k: v for k, v in dropped.items() if v}


def batch_rows(d: pd.DataFrame, src: dict[str, Any], platform: str) -> list[dict[str, str]]:
    rows = []
    for r in d.itertuples():
        m = src["models"][r.model]
        fields: dict[str, Any] = {
            "case_id": f"{r.model}/seq{r.seq_len}/gpus{r.gpus}/mb{r.micro_batch}", "platform": platform,
            "arch": "gpt", "layers": m["layers"], "hidden": m["hidden"], "heads": m["heads"], "kv_heads": m["heads"],
            "ffn_hidden": m["ffn_hidden"], "vocab": m["vocab"], "seq_len": r.seq_len, "num_gpus": r.gpus, "tp": 1,
            "pp": 1, "dp": r.gpus, "micro_batch": r.micro_batch, "global_batch": r.global_batch, "vpp": 1,
            "schedule": "1f1b", "recompute": "full" if r.activation_checkpointing else "none",
            "sequence_parallel": "false", "zero_stage": src["zero_stage"], "precision": src["precision"],
            "framework": src["framework"], "attention": src["attention"]}
        rows.append({k: str(v) for k, v in fields.items()})
    return rows


def run_check(source_id: str = "llm-foundry-h100", *, platform: str | None = None, models_dir: str | None = None,
              path: Path = CATALOG) -> IndependentCheck:
    """Predict every usable run of `source_id` on its platform (or `platform`) with the shipped models."""
    from predictor.plan.batch import predict_records
    src = load_sources(path)[source_id]
    d, dropped = published_runs(src)
    plat = platform or src["platform"]
    out = pd.DataFrame(predict_records(batch_rows(d, src, plat), models_dir, allow_oom=True,
                                       memory_options=memory_options_of(src)))
    d["platform"] = plat
    d["predicted_s"] = pd.to_numeric(out["step_time_s"], errors="coerce")
    d["memory_gib"] = pd.to_numeric(out["memory_gib"], errors="coerce")
    d["fits"] = out["fits"].fillna(False).astype(bool)
    d["memory_tight"] = out["memory_tight"].fillna(False).astype(bool)
    d["provenance"] = out["provenance"]
    d["error"] = out["error"]
    d["signed_error"] = d["predicted_s"] / d["measured_s"] - 1
    d["ape"] = d["signed_error"].abs()
    # same FLOP count and peak as published (the FP8 table: against the FP8 peak, not the predictor's BF16-peak MFU)
    d["predicted_mfu"] = d["published_mfu"] * d["measured_s"] / d["predicted_s"]
    d["nodes"] = np.where(d["gpus"] > 8, "several nodes (network not stated)", "one node")
    return IndependentCheck(source_id, src, d, dropped)


# --------------------------------------------------------------------------- the transfer alone: speed-up over the A100
def _reference_key(layers: int, hidden: int, seq_len: int, gpus: int, micro_batch: int, recompute: str
                   ) -> tuple[int, int, int, int, int, str]:
    return int(layers), int(hidden), int(seq_len), int(gpus), int(micro_batch), str(recompute)


def reference_runs(check: IndependentCheck, store_path: str | Path | None = None,
                   models_dir: str | None = None) -> pd.DataFrame:
    """The store's measured runs of the check's `reference` (source and platform), each predicted with the
    product as shipped (`validate.validate_runs`: `predicted_s`, `measured_s`, `signed_error`); empty when the source
    names no reference or the store lacks it."""
    from predictor.checks.validate import validate_runs
    from predictor.samples.store import read_measured_runs
    ref = check.source.get("reference")
    if not ref:
        return pd.DataFrame()
    runs = read_measured_runs(ref["platform"], source_id=ref["source_id"], store_path=store_path)
    if runs.empty:
        return runs
    res = validate_runs(runs=runs, models_dir=models_dir)
    return res[res["predicted_s"].notna()].reset_index(drop=True)


def speedup_pairs(check: IndependentCheck, reference: pd.DataFrame) -> pd.DataFrame:
    """Each independent run beside the reference run of the same model, sequence length, GPU count, micro-batch and
    checkpointing: measured and predicted speed-up (tokens per second per GPU over the reference's) and both signed
    errors. Per pair, 1 + signed_error = (1 + reference_signed_error) x measured_speedup / predicted_speedup: the
    independent run's error is the reference's error (what the product gets wrong on the sampled GPU too) times the
    speed-up's (what the transfer to the unsampled GPU gets wrong)."""
    cols = ["model", "seq_len", "gpus", "micro_batch", "activation_checkpointing", "measured_speedup",
            "predicted_speedup", "speedup_error", "reference_signed_error", "signed_error"]
    if reference.empty:
        return pd.DataFrame(columns=cols)
    by_key: dict[tuple[int, int, int, int, int, str], Any] = {}
    for r in reference.itertuples(index=False):
        key = _reference_key(r.layers, r.hidden, r.seq_len, r.num_gpus, r.micro_batch,
                             "full" if str(r.recompute) == "full" else "none")
        by_key.setdefault(key, r)
    rows = []
    for r in check.runs[check.runs["predicted_s"].notna()].itertuples(index=False):
        m = check.source["models"][r.model]
        ref = by_key.get(_reference_key(m["layers"], m["hidden"], r.seq_len, r.gpus, r.micro_batch,
                                        "full" if r.activation_checkpointing else "none"))
        if ref is None:
            continue
        tokens_ref = float(ref.global_batch) * float(ref.seq_len) / float(ref.num_gpus)
        tokens = float(r.global_batch) * float(r.seq_len) / float(r.gpus)
        measured_speedup = (tokens / float(r.measured_s)) / (tokens_ref / float(ref.measured_s))
        predicted_speedup = (tokens / float(r.predicted_s)) / (tokens_ref / float(ref.predicted_s))
        rows.append({"model": r.model, "seq_len": r.seq_len, "gpus": r.gpus, "micro_batch": r.micro_batch,
                     "activation_checkpointing": r.activation_checkpointing, "measured_speedup": measured_speedup,
                     "predicted_speedup": predicted_speedup, "speedup_error": predicted_speedup / measured_speedup - 1,
                     "reference_signed_error": float(ref.signed_error),
                     "signed_error": r.signed_error})
    return pd.DataFrame(rows, columns=cols)


SPEEDUP_COLUMNS = ("measured_speedup", "predicted_speedup", "speedup_error", "reference_signed_error", "signed_error")


def speedup_summary(pairs: pd.DataFrame, by: str | None = None) -> pd.DataFrame:
    """Mean measured and predicted speed-up and the three signed errors of `speedup_pairs`, overall (`by` None) or
    per value of column `by` (in its sorted order), with the number of pairs."""
    ordered = pairs if by is None else pairs.sort_values(by, kind="stable")
    rows = [{"group": name, "runs": len(g), **g[list(SPEEDUP_COLUMNS)].mean().to_dict()}
            for name, g in summary_groups(ordered, by)]
    return pd.DataFrame(rows, columns=["group", "runs", *SPEEDUP_COLUMNS])

"""vTrain's single-node A100 runs and its all-reduce look-up tables."""
from __future__ import annotations

import pandas as pd

from predictor.samples.formats.common import (
    PAPER_VOCAB,
    PUBLISHED_LICENCE,
    VTRAIN_COLUMNS,
    VTRAIN_PLATFORM,
    VTRAIN_REPO,
    FilePlan,
    FormatError,
    ParsedFile,
    _finish,
    _platform_entry,
    _ReadInfo,
    read_frame,
    relative_source,
    require_columns,
    row_lines,
    start_checks,
)
from predictor.samples.formats.project import _check_layout, _run_rejections
from predictor.samples.formats.sources import load_source_definitions, match_source


def parse_vtrain(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    """vTrain ground truth: Megatron-DeepSpeed GPT, full recompute, 1F1B, fp16, ZeRO-0."""
    df = read_frame(data, plan.path)
    require_columns(df, VTRAIN_COLUMNS, plan.path, VTRAIN_COLUMNS)
    defn = match_source(load_source_definitions(), kind="vtrain")
    platform = plan.platform or VTRAIN_PLATFORM
    checks = start_checks(df, plan)
    v = {new: checks.positive_int(old, df[old]) for old, new in VTRAIN_COLUMNS.items() if new != "step_time_ms"}
    step = checks.positive_float("iteration time (ms)", df["iteration time (ms)"], 1e-3)
    out = pd.DataFrame({"run_id": [f"{plan.path.stem}:{n}" for n in row_lines(df)], "platform": platform,
                        "arch": "gpt", "layers": v["layers"], "hidden": v["hidden"], "heads": v["heads"],
                        "kv_heads": v["heads"], "ffn_hidden": 4 * v["hidden"], "vocab": PAPER_VOCAB,
                        "seq_len": v["seq_len"], "num_gpus": v["num_gpus"], "tp": v["tp"], "pp": v["pp"],
                        "dp": v["dp"], "micro_batch": v["micro_batch"], "global_batch": v["global_batch"],
                        "vpp": 1, "schedule": "1f1b", "recompute": "full", "sequence_parallel": False,
                        "zero_stage": 0, "precision": "fp16", "step_time_s": step,
                        # Megatron-DeepSpeed without --use-flash-attn: baddbmm + fused masked softmax + bmm
                        "attention": "unfused",
                        "framework": defn["framework"] if defn else "megatron-deepspeed",
                        "source_id": defn["source_id"] if defn else "vtrain", "notes": None})
    _check_layout(checks, out)
    good = _finish(out, checks)
    source = f"{VTRAIN_REPO}:{relative_source(plan.path, plan.root)}"
    good["source"] = source
    return ParsedFile(tables={"measured_runs": good}, platforms=_platform_entry(platform), source=source,
                      licence=plan.licence or PUBLISHED_LICENCE, notes=f"vTrain measured runs on {platform}",
                      run_rejections=_run_rejections(df, checks, out["source_id"]), **checks.summary(limit))


VTRAIN_LUT_PLATFORMS = {"a100": VTRAIN_PLATFORM}


def parse_vtrain_allreduce_lut(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    """vTrain's nccl-tests all-reduce table on n GPUs of one node: size(B), count, type, then
    (time(ns), busbw) for two runs; each run becomes one sample."""
    family = plan.info.get("gpu_family", "")
    platform = plan.platform or VTRAIN_LUT_PLATFORMS.get(family)
    if platform is None:
        raise FormatError(f"{plan.path}: no platform is known for '{family}' all-reduce tables; "
                          f"pass --platform to say which cluster they were measured on")
    n = int(plan.info["gpus"])
    text = data.decode("utf-8-sig").splitlines()
    rows = [(i + 1, ln.split(",")) for i, ln in enumerate(text) if i > 0 and ln.strip()]
    if not rows or len(rows[0][1]) < 5:
        raise FormatError(f"{plan.path}: expected columns "
                          "size(B),count,type,time(ns),busbw(GB/s)[,time(ns),busbw(GB/s)]")
    recs, lines = [], []
    for line, r in rows:
        for j in (3, 5):
            if j < len(r):
                recs.append({"size": r[0], "time_ns": r[j]})
                lines.append(line)
    df = pd.DataFrame(recs)
    df.attrs["read"] = _ReadInfo(lines, [])
    checks = start_checks(df, plan)
    size = checks.positive_int("size(B)", df["size"])
    dur = checks.positive_float("time(ns)", df["time_ns"], 1e-9)
    out = pd.DataFrame({"platform": platform, "collective": "allreduce", "message_bytes": size, "ranks": n,
                        "nodes": 1, "gpus_per_node": n, "dtype": "fp32", "duration_s": dur})
    good = _finish(out, checks)
    source = f"{VTRAIN_REPO}:{relative_source(plan.path, plan.root)}"
    good["source"] = source
    return ParsedFile(tables={"collective_samples": good}, platforms=_platform_entry(platform), source=source,
                      licence=plan.licence or PUBLISHED_LICENCE,
                      notes=f"vTrain nccl-tests all-reduce on {n} GPUs of one node ({platform})",
                      **checks.summary(limit))

"""The speed check (predictor.hardware.speed): re-time a fixed handful of a platform's own sampled shapes.

    python -m bench speed-check --platform cpu-2t                 # print the factor
    python -m bench speed-check --platform cpu-2t --save          # predictions use it from now on
    python -m bench speed-check --platform cpu-1t --ranks 2       # a platform sampled with 2 concurrent ranks

The shapes are chosen from the stored samples, deterministically: per op, the `per_op` longest
design points whose stored forward + backward time lies in [min_s, max_s] (undisturbed rows only),
so the check is short (30-40 s on this 2-core CPU) and dominated by the same long operators that
dominate a step.
Each is rebuilt exactly as the sampler built it (same plan, same design index) and timed the same
way (same threads, same concurrent ranks, the same timer and statistic).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from bench import env
from bench.kernels import opbench
from bench.sampling import design as D
from bench.sampling import store_io
from bench.sampling.sampler import _dist, rank_device, time_on_every_rank
from predictor.hardware.speed import SpeedCheck, speed_factor
from predictor.model import ops as P


def sampling_runs(samples_dir: Path) -> list[dict]:
    runs = [r for r in store_io.read_manifest(samples_dir).get("runs", []) if r.get("kind") == "ops"]
    if not runs:
        raise ValueError(f"{samples_dir}: no operator sampling run in manifest.json; sample the platform first "
                         f"(`python -m bench ops --platform ... --out {samples_dir}`)")
    return runs


def reference_points(samples_dir: str | Path, per_op: int = 2, min_s: float = 1e-3,
                     max_s: float = 0.2) -> list[tuple[D.DesignPoint, dict[str, float]]]:
    """[(design point, {pass: stored seconds})], the same list on every call for the same samples."""
    samples_dir = Path(samples_dir)
    df = store_io.read_shards(samples_dir, "ops")
    if df.empty:
        raise ValueError(f"{samples_dir}: no operator samples (ops-*.parquet)")
    if "disturbed" in df:
        df = df[~df["disturbed"].fillna(False).astype(bool)]
    points: dict[tuple[str, int], D.DesignPoint] = {}
    for r in sampling_runs(samples_dir):
        for p in D.plan(r["ops"], r["n_per_op"], r["profile"], tuple(r.get("tp") or (1,)), r.get("seed", 0)):
            points.setdefault((p.op, p.index), p)
    out = []
    for op, g in sorted(df.groupby("op"), key=lambda kv: kv[0]):
        cands = []
        for idx, gi in g.groupby("design_index"):
            p = points.get((op, int(idx)))
            passes = dict(zip(gi["pass"], gi["duration_s"].astype(float)))
            if p is None or set(passes) != set(P.OPS[op].passes):
                continue
            row = gi.iloc[0]
            key = D.sample_key(op, gi["pass"].iloc[0], row["dtype"],
                               {c: (None if pd.isna(row.get(c)) else row.get(c)) for c in P.SHAPE_COLUMNS})
            if key != p.key(gi["pass"].iloc[0], row["dtype"]):
                continue  # the plan no longer produces this shape (changed design code): not comparable
            total = sum(passes.values())
            if min_s <= total <= max_s:
                cands.append((total, int(idx), p, passes))
        for _total, _idx, p, passes in sorted(cands, key=lambda t: (-t[0], t[1]))[:per_op]:
            out.append((p, passes))
    if not out:
        raise ValueError(f"{samples_dir}: no sampled shape between {min_s * 1e3:g} ms and {max_s:g} s to re-time")
    return out


def run_speed_check(platform: str, samples_dir: str | Path, *, device: str | None = None,
                    dtype: str | None = None, threads: int | None = None, per_op: int = 2,
                    target_s: float = 0.12, log: Callable[[str], None] | None = None) -> SpeedCheck:
    """Re-time the reference points now (every rank together under torchrun) and compare."""
    import torch
    samples_dir = Path(samples_dir)
    runs = sampling_runs(samples_dir)
    last = runs[-1]
    device = device or last.get("device") or "cpu"
    dtype = dtype or last.get("dtype") or "fp32"
    dist = _dist()
    world = dist.get_world_size() if dist else 1
    sampled_world = int(last.get("ranks_concurrent") or 1)
    if world != sampled_world:
        raise ValueError(f"{platform} was sampled with {sampled_world} concurrent rank(s); run the speed check "
                         f"with the same number (--ranks {sampled_world})")
    torch.set_num_threads(int(threads or last.get("threads") or torch.get_num_threads()))
    device = rank_device(device)
    refs = reference_points(samples_dir, per_op)
    t0 = time.monotonic()
    load0 = env.loadavg()
    for p, stored in refs:  # one untimed pass over everything first: the heap grows to the size the
        kernels = opbench.build(p.op, {**p.shape, **p.extra}, dtype, device)  # sampler's had by then
        for ps in stored:
            setup, fn = kernels[ps]
            fn(setup())
        del kernels
    then, now, ops = [], [], []
    for p, stored in refs:
        kernels = opbench.build(p.op, {**p.shape, **p.extra}, dtype, device)
        for ps, old in stored.items():
            setup, fn = kernels[ps]
            med = time_on_every_rank(fn, setup, device=device, target_s=target_s)[0]
            then.append(old)
            now.append(med)
            ops.append(p.op)
        del kernels
    ratios = np.array(now) / np.array(then)
    per = {}
    for op in sorted(set(ops)):
        sel = [i for i, o in enumerate(ops) if o == op]
        per[op] = round(speed_factor([then[i] for i in sel], [now[i] for i in sel]), 4)
    facts = env.facts(device)
    facts.update({"loadavg_start": list(load0), "loadavg_end": list(env.loadavg()), "ranks_concurrent": world,
                  "threads": torch.get_num_threads()})
    sc = SpeedCheck(platform=platform, speed_factor=round(speed_factor(then, now), 4), points=len(now),
                    measured_at=store_io.now_iso(), ratio_p25=round(float(np.percentile(ratios, 25)), 4),
                    ratio_p75=round(float(np.percentile(ratios, 75)), 4), check_s=round(time.monotonic() - t0, 2),
                    samples_from=", ".join(f"{r['run_id']} ({r.get('started_at', '')[:16]})" for r in runs),
                    per_op=per, facts=facts)
    if log and (not dist or dist.get_rank() == 0):
        log(f"speed check {platform}: x{sc.speed_factor:.3f} over {sc.points} timings "
            f"(ratios p25..p75 {sc.ratio_p25:.3f}..{sc.ratio_p75:.3f}) in {sc.check_s:.1f} s")
    return sc

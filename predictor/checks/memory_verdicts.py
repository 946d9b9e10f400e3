"""Every published run the project knows is a memory test: a layout that really trained must not be judged
"does not fit".

The runs: the measured runs in the store (vTrain, llm-foundry A100, BLOOM, CPU runs), the independent checks'
published runs (llm-foundry H100 BF16 / FP8, NVIDIA's NeMo / Megatron-Bridge tables: never fitted to) and the
layouts of the published memory figures (catalog/published_memory.json). Each is predicted as predict-batch would
(`--allow-oom`, so a refused layout still has its memory), and for one judged "does not fit" the parts of its
fullest stage are kept, largest first, with how far the total is over the usable memory.

    python -m tests.benchmarks.memory_verdicts
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from predictor.checks import independent, independent_nemo, published_memory
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import layout_from_fields, model_from_fields
from predictor.plan.batch import predict_records
from predictor.plan.predict import get_predictor
from predictor.samples.formats.sources import load_source_definitions
from predictor.samples.store import StoreError, read_measured_runs
from predictor.step.memory import GIB, MEMORY_PART_LABELS, MemoryOptions

VERDICTS = ("fits", "tight", "does not fit", "not predicted")
COLUMNS = ("source", "run", "platform", "memory_allocated_gib", "memory_reserved_gib", "memory_gib", "usable_gib",
           "verdict", "over_gib", "parts", "error")


@dataclass(frozen=True)
class RunSet:
    """One source's runs as predict-batch records, with the memory options its check predicts them with."""
    source: str
    records: list[dict[str, Any]]
    labels: list[str]
    memory_options: MemoryOptions | None = None


def _store_runs(store_path: str | Path | None) -> list[RunSet]:
    try:
        runs = read_measured_runs(store_path=store_path)
    except StoreError:   # no store yet (set-up without ../shared/datasets): the catalogued runs still count
        return []
    if runs.empty:
        return []
    defs = load_source_definitions()
    out = []
    for src, g in runs.groupby(runs["source_id"].fillna(runs["source"]).astype(str), sort=True):
        recs = g.to_dict(orient="records")
        out.append(RunSet(f"store: {src}", recs, [str(r.get("run_id", i)) for i, r in enumerate(recs)],
                          independent.memory_options_of(defs.get(str(src), {}))))
    return out


def _independent_runs() -> list[RunSet]:
    out = []
    for sid, src in independent.load_sources().items():
        d, _dropped = independent.published_runs(src)
        rows: list[dict[str, Any]] = list(independent.batch_rows(d, src, str(src["platform"])))
        out.append(RunSet(f"independent: {sid}", rows, [str(r.get("case_id", i)) for i, r in enumerate(rows)],
                          independent.memory_options_of(src)))
    doc = independent_nemo.load()
    pr = independent_nemo.published_runs(doc)
    # one run set per set of memory options the recipes state (independent_nemo.recipe_memory_options), one source
    groups: dict[MemoryOptions, tuple[list[dict[str, Any]], list[str]]] = {}
    for _, r in pr.ok.iterrows():
        rec, why = independent_nemo.predictable_record(independent_nemo.batch_row(r, doc["models"][r["model_key"]]))
        if not why:
            recs, labels = groups.setdefault(independent_nemo.recipe_memory_options(r), ([], []))
            recs.append(rec)
            labels.append(str(rec.get("case_id", len(labels))))
    out += [RunSet("independent: NeMo / Megatron-Bridge", recs, labels, opts)
            for opts, (recs, labels) in groups.items()]
    return out


def _published_memory_runs() -> list[RunSet]:
    doc = published_memory.load()
    recs: list[dict[str, Any]] = []
    labels: list[str] = []
    for e in doc["entries"]:
        if e.get("unpredictable"):
            continue
        cells = {**published_memory.model_fields(str(e["model"]), doc["models"][e["model"]]),
                 **published_memory.layout_fields(e["layout"]), "platform": e["platform"], "case_id": e["id"]}
        # as a predict-batch file holds them: text cells, booleans as true / false, nothing where unstated
        rec = {k: "" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for k, v in cells.items()}
        recs.append(rec)
        labels.append(str(e["id"]))
    return [RunSet("published memory figures", recs, labels)]


def _over_parts(row: dict[str, Any], models_dir: str | None, options: MemoryOptions | None) -> tuple[float, str]:
    """How far the fullest stage is over the usable memory, and its parts largest first."""
    model, layout = model_from_fields(row), layout_from_fields(row)
    pred = get_predictor(str(row["platform"]), models_dir, None, options).predict(model, layout, timeline=False)
    if pred.memory is None:
        return float("nan"), ""
    pk = pred.memory.peak
    parts = {MEMORY_PART_LABELS[k]: getattr(pk, f"{k}_bytes") for k in MEMORY_PART_LABELS}
    top = sorted(parts.items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{k} {v / GIB:.1f}" for k, v in top if v > 0)
    return (pk.low_total_bytes - pred.memory.usable_bytes) / GIB, text


def judge_runs(run_sets: list[RunSet], models_dir: str | None = None,
               progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """One row per run: its memory as torch and nvidia-smi count it, the verdict, and for "does not fit" how far
    over and the parts of its fullest stage."""
    say = progress or (lambda _m: None)
    rows = []
    for rs in run_sets:
        say(f"memory verdicts: {rs.source} ({len(rs.records)} runs)")
        if not rs.records:
            continue
        res = predict_records(rs.records, models_dir, allow_oom=True, memory_options=rs.memory_options)
        for rec, label, o in zip(rs.records, rs.labels, res):
            row: dict[str, Any] = {"source": rs.source, "run": label, "platform": rec.get("platform"),
                                   "error": o.get("error") or "", "over_gib": float("nan"), "parts": ""}
            for k in ("memory_allocated_gib", "memory_reserved_gib", "memory_gib"):
                row[k] = pd.to_numeric(o.get(k), errors="coerce")
            if o.get("fits") is None or row["error"]:
                row["verdict"] = "not predicted"
            elif not o["fits"]:
                row["verdict"] = "does not fit"
                try:
                    row["over_gib"], row["parts"] = _over_parts(rec, models_dir, rs.memory_options)
                except InfeasibleConfig as e:
                    row["parts"] = f"({e})"
            else:
                row["verdict"] = "tight" if o.get("memory_tight") else "fits"
            rows.append(row)
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "usable_gib"])
    return df


def every_known_run(store_path: str | Path | None = None) -> list[RunSet]:
    """The store's measured runs, the independent checks' runs and the published memory figures' layouts."""
    return _store_runs(store_path) + _independent_runs() + _published_memory_runs()


def verdict_counts(judged: pd.DataFrame) -> pd.DataFrame:
    """Per source: runs, and how many of them each verdict."""
    t = judged.pivot_table(index="source", columns="verdict", values="run", aggfunc="count", fill_value=0)
    for v in VERDICTS:
        if v not in t.columns:
            t[v] = 0
    t = t[list(VERDICTS)]
    t.insert(0, "runs", t.sum(axis=1))
    return t.reset_index()

"""Every call from the dashboard into predictor modules whose API may still change.

Pages never import predictor.memory / search / costing / training / regressors / ingest_formats
directly: they call these functions, which find the module with importlib, call it, and turn
its answer into plain dicts / DataFrames the pages and charts use. When a module is missing
(still being written) the function says so with `Unavailable(reason)` instead of failing.
No streamlit here: these are plain functions, tested without a browser.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from predictor.specs import InfeasibleConfig, Layout, ModelSpec, as_dict

Progress = Callable[[int, int, str], None]


def import_lightgbm_fast() -> None:
    """predictor.lgb_import (kept for the pages that call it)."""
    from predictor.lgb_import import import_lightgbm
    import_lightgbm()


class Unavailable(RuntimeError):
    """A predictor capability the dashboard wants is not there (yet); the message says what."""


def _module(name: str):
    try:
        return importlib.import_module(f"predictor.{name}")
    except ModuleNotFoundError as e:
        if e.name in (f"predictor.{name}", "predictor"):
            return None
        raise


def _first(mod, *names: str):
    for n in names:
        f = getattr(mod, n, None)
        if callable(f):
            return f
    return None


def _call(f: Callable, **kwargs: Any) -> Any:
    """Call f with the keyword arguments it accepts (APIs differ in optional extras)."""
    sig = inspect.signature(f)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return f(**kwargs)
    return f(**{k: v for k, v in kwargs.items() if k in sig.parameters})


def _as_dict(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return dict(obj)
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        d = obj.to_dict()
        if isinstance(d, dict):
            return d
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return {k: v for k, v in vars(obj).items() if not k.startswith("_")}


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


# --------------------------------------------------------------------------- platforms
def platforms(extra_file: str | None = None) -> dict[str, Any]:
    """Catalog platforms plus the user's clusters file."""
    from predictor.platforms import load_platforms
    return dict(load_platforms(extra_file))


def devices() -> dict[str, Any]:
    from predictor.platforms import load_devices
    return dict(load_devices())


CUSTOM_FIELDS = ("c_name", "c_device", "c_gpn", "c_intra_bw", "c_intra_lat", "c_inter_bw", "c_inter_lat", "c_models")


def custom_platform(fields: dict[str, Any]):
    """A Platform from the dashboard's custom-cluster fields (see inputs.custom_cluster_inputs).

    `c_models`: "auto" = the device's own transfer source (predictor.platforms.make_cluster's default),
    "none" = roofline only (analytical), or the id of the platform whose regressors back it.
    """
    from dataclasses import replace

    from predictor import platforms as P
    devs = devices()
    dev_id = fields.get("c_device")
    if dev_id not in devs:
        raise InfeasibleConfig("c_device", f"unknown device '{dev_id}'.", f"use one of {', '.join(sorted(devs))}.")
    gpn = int(fields.get("c_gpn") or 8)
    if gpn <= 0:
        raise InfeasibleConfig("c_gpn", "GPUs per node must be positive.", "use e.g. 8.")
    name = str(fields.get("c_name") or "custom").strip() or "custom"
    intra_bw = float(fields.get("c_intra_bw") or 0)
    inter_bw = float(fields.get("c_inter_bw") or 0)
    if inter_bw <= 0:
        raise InfeasibleConfig("c_inter_bw", "inter-node bandwidth must be positive.",
                               "give the per-GPU network bandwidth in GB/s (e.g. 50 for 400 Gb/s per GPU).")
    if gpn > 1 and intra_bw <= 0:
        raise InfeasibleConfig("c_intra_bw", "intra-node bandwidth must be positive with more than one GPU per node.",
                               "give the NVLink bandwidth per GPU per direction in GB/s (e.g. 450 for H100 NVLink 4).")
    models = fields.get("c_models") or "auto"
    inter_lat = float(fields.get("c_inter_lat") or 10)
    make = getattr(P, "make_cluster", None)
    if make is not None:
        p = make(dev_id, gpn, intra_bw if gpn > 1 else None, inter_bw, platform_id=name,
                 inter_latency_us=inter_lat, op_models=None if models in ("auto", "none") else models,
                 description=f"custom cluster: {gpn}x {devs[dev_id].name} per node")
        return replace(p, op_models=None) if models == "none" else p
    return P.Platform(
        platform_id=name, description=f"custom cluster: {gpn}x {devs[dev_id].name} per node",
        device=devs[dev_id], gpus_per_node=gpn,
        intra_node=P.LinkSpec("nvlink" if gpn > 1 else "none", intra_bw if gpn > 1 else 0.0, 8.0),
        inter_node=P.LinkSpec("infiniband", inter_bw, inter_lat),
        op_models=None if models in ("auto", "none") else models, collective_models=None)


def platform_to_catalog_entry(p) -> dict[str, Any]:
    """The clusters-file entry for a Platform (what `load_platforms(extra_file=...)` reads back)."""
    entry = {"description": p.description, "device": p.device.device_id, "gpus_per_node": p.gpus_per_node,
             "intra_node": dataclasses.asdict(p.intra_node), "inter_node": dataclasses.asdict(p.inter_node),
             "op_models": p.op_models, "collective_models": p.collective_models,
             "sources": ["entered in the dashboard"]}
    algs = getattr(p, "collective_algorithms", None)
    if algs:
        entry["collective_algorithms"] = {"available": list(algs),
                                          **({"nvls_min_gpus": p.nvls_min_gpus} if getattr(p, "nvls_min_gpus", 0)
                                             else {})}
    if not getattr(p, "overlaps_comm_with_compute", True):
        entry["overlaps_comm_with_compute"] = False
    return entry


def save_cluster(path: Path, platform_id: str, entry: dict[str, Any]) -> Path:
    """Add or replace one cluster in the user's clusters file (JSON)."""
    path = Path(path)
    data: dict[str, Any] = {}
    if path.is_file():
        data = json.loads(path.read_text() or "{}")
    data[platform_id] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    from predictor.platforms import load_platforms
    load_platforms.cache_clear()
    return path


def make_predictor(platform, models_dir: str | None):
    """A fresh Predictor (callers cache it)."""
    import_lightgbm_fast()
    from predictor.predict import Predictor, get_predictor
    if isinstance(platform, str):
        return get_predictor(platform, models_dir)
    return Predictor(platform, models_dir)


def platform_backing(pr) -> dict[str, str]:
    """What backs a predictor's numbers, in words (the same description as `python -m predictor platforms`)."""
    from predictor.backing import describe_backing
    d = describe_backing(pr).to_dict()
    d.pop("kind", None)
    return d


def host_modelled(pr) -> bool:
    """Whether a predictor adds a fitted host (framework) overhead; without one the `host_overhead`
    category is an unmodelled 0, not a measured zero."""
    return bool(getattr(pr, "host_modelled", False))


def prediction_dict(pred, host_is_modelled: bool) -> dict[str, Any]:
    """StepPrediction.to_dict for exports, with `host_overhead` = None (not 0) where it is not modelled."""
    return pred.to_dict()


# --------------------------------------------------------------------------- memory
def memory_available() -> bool:
    mod = _module("memory")
    return mod is not None and _first(mod, "estimate_memory", "memory_per_gpu") is not None


MEMORY_PARTS = (("weights", "weights_bytes"), ("gradients", "grads_bytes"), ("optimizer", "optimizer_bytes"),
                ("activations", "activations_bytes"), ("buffers", "buffers_bytes"), ("framework", "framework_bytes"))


def memory(model: ModelSpec, layout: Layout, platform) -> dict[str, Any]:
    """Memory per GPU of the fullest stage and of every stage:
    {'total_gib', 'capacity_gib', 'usable_gib', 'fits', 'parts_gib': {part: GiB}, 'stage', 'note',
     'stages': DataFrame(stage, part, gib)}.

    Raises Unavailable when predictor.memory is not there yet.
    """
    mod = _module("memory")
    f = _first(mod, "estimate_memory", "memory_per_gpu") if mod else None
    if f is None:
        raise Unavailable("the memory model (predictor.memory) is not available yet")
    res = _call(f, model=model, layout=layout, device=platform.device, platform=platform)
    stages = getattr(res, "stages", None)
    if stages and hasattr(stages[0], "total_bytes"):
        gib = 2.0 ** 30
        rows = [{"stage": int(s.stage), "part": name, "gib": float(getattr(s, attr, 0.0)) / gib}
                for s in stages for name, attr in MEMORY_PARTS]
        peak = max(stages, key=lambda s: s.total_bytes)
        cap = float(getattr(res, "capacity_bytes", platform.device.hbm_gib * gib)) / gib
        usable = float(getattr(res, "usable_bytes", cap * gib)) / gib
        return {"total_gib": float(peak.total_bytes) / gib, "capacity_gib": cap, "usable_gib": usable,
                "fits": bool(getattr(res, "fits", peak.total_bytes / gib <= usable)),
                "parts_gib": {name: float(getattr(peak, attr, 0.0)) / gib for name, attr in MEMORY_PARTS},
                "stage": int(peak.stage), "note": str(getattr(res, "reason", "") or ""),
                "stages": pd.DataFrame(rows, columns=["stage", "part", "gib"]), "warnings": []}
    view = _memory_view(res, platform)
    view.setdefault("usable_gib", view["capacity_gib"])
    view.setdefault("stages", pd.DataFrame(columns=["stage", "part", "gib"]))
    return view


_MEM_TOTAL_KEYS = ("total_gib", "peak_gib", "total_bytes", "peak_bytes", "total")
_MEM_SKIP = {"total_gib", "peak_gib", "total_bytes", "peak_bytes", "total", "capacity_gib", "capacity_bytes",
             "fits", "stage", "critical_stage", "headroom_gib", "note", "notes", "warnings", "per_stage",
             "stages", "usable_gib", "utilisation", "utilization"}


def _memory_view(res: Any, platform) -> dict[str, Any]:
    d = _as_dict(res)
    scale_bytes = lambda k, v: v / 2 ** 30 if k.endswith("_bytes") else v  # noqa: E731
    total = None
    for k in _MEM_TOTAL_KEYS:
        if _num(d.get(k)) is not None:
            total = scale_bytes(k, float(d[k]))
            break
    parts_src = d.get("parts_gib") or d.get("breakdown_gib") or d.get("parts") or d.get("breakdown") or {}
    if isinstance(parts_src, dict) and parts_src:
        parts = {str(k).removesuffix("_gib").removesuffix("_bytes"): scale_bytes(str(k), float(v))
                 for k, v in parts_src.items() if _num(v) is not None}
        if parts_src is d.get("breakdown") or parts_src is d.get("parts"):
            # values in bytes when they are large
            if parts and max(parts.values()) > 1e6:
                parts = {k: v / 2 ** 30 for k, v in parts.items()}
    else:
        parts = {k.removesuffix("_gib").removesuffix("_bytes"): scale_bytes(k, float(v)) for k, v in d.items()
                 if k not in _MEM_SKIP and (k.endswith("_gib") or k.endswith("_bytes")) and _num(v) is not None}
    if total is None and parts:
        total = sum(parts.values())
    cap = None
    for k in ("capacity_gib", "usable_gib", "capacity_bytes"):
        if _num(d.get(k)) is not None:
            cap = scale_bytes(k, float(d[k]))
            break
    if cap is None:
        cap = float(platform.device.hbm_gib)
    fits = d.get("fits")
    if fits is None and total is not None:
        fits = total <= cap
    note = d.get("note") or d.get("notes") or ""
    if isinstance(note, (list, tuple)):
        note = "; ".join(map(str, note))
    return {"total_gib": total, "capacity_gib": cap, "fits": bool(fits) if fits is not None else None,
            "parts_gib": parts, "stage": d.get("stage", d.get("critical_stage")), "note": str(note),
            "warnings": list(d.get("warnings") or [])}


# --------------------------------------------------------------------------- cost
def cost(pred, tokens: float, price_per_gpu_hour: float | None) -> dict[str, Any]:
    """Time and money to train on `tokens` tokens at this step time:
    {'steps', 'wall_time_s', 'wall_time_range_s', 'gpu_hours', 'cost' (None without a price), 'source'}.

    predictor.costing.training_estimate when it is there; the same arithmetic otherwise
    (steps = ceil(tokens / tokens per step), wall = steps x step time, GPU-hours = wall x GPUs).
    """
    L = pred.layout
    mod = _module("costing")
    f = _first(mod, "training_estimate") if mod else None
    if f is not None:
        te = f(pred.step_time_s, L.num_gpus, L.tokens_per_step, tokens, price_per_gpu_hour)
        te = te.scalar() if hasattr(te, "scalar") else te
        out = {"steps": _num(te.steps), "wall_time_s": _num(te.seconds), "gpu_hours": _num(te.gpu_hours),
               "cost": _num(te.cost) if te.cost is not None else None, "source": "predictor.costing"}
    else:
        steps = math.ceil(tokens / L.tokens_per_step)
        wall = steps * pred.step_time_s
        gh = wall * L.num_gpus / 3600
        out = {"steps": steps, "wall_time_s": wall, "gpu_hours": gh,
               "cost": None if price_per_gpu_hour is None else gh * price_per_gpu_hour, "source": "step time x steps"}
    e = pred.expected_error
    out["wall_time_range_s"] = (out["wall_time_s"] * (1 - e), out["wall_time_s"] * (1 + e))
    return out


def default_price(platform) -> float | None:
    """A list price per GPU-hour for the platform's device, if the catalog / costing knows one."""
    mod = _module("costing")
    f = _first(mod, "price_per_gpu_hour", "default_price", "list_price") if mod else None
    if f is None:
        return None
    try:
        return _num(_call(f, platform=platform, device=platform.device, device_id=platform.device.device_id))
    except (KeyError, ValueError, TypeError, InfeasibleConfig):
        return None


# --------------------------------------------------------------------------- search
def search_available() -> bool:
    mod = _module("search")
    return mod is not None and _first(mod, "search") is not None


SEARCH_OBJECTIVES = {"time": "step time", "tokens": "tokens / s", "mfu": "MFU", "cost": "GPU-hours per token"}


def search(model: ModelSpec, platform, *, num_gpus: int, global_batch: int, seq_len: int, precision: str,
           predictor=None, constraints: dict[str, Any] | None = None, top_k: int = 10,
           tokens: float | None = None, price_per_gpu_hour: float | None = None,
           objective: str = "time") -> dict[str, Any]:
    """Every layout of `model` on `num_gpus` GPUs, ranked; feasible ones first.

    Returns {'table': DataFrame (one row per enumerated layout: rank (0 = does not fit), the layout
    fields, step_time_s, tokens_per_s, mfu, memory_gib, fits, reason, ...), 'rejections': DataFrame,
    'exclusions': [..], 'elapsed_s': float, 'enumerated': int, 'feasible': int}. The `top_k` best
    carry the exact prediction's expected_error and provenance.
    `constraints`: SearchSpace fields (tp, pp, micro_batch: tuples; max_micro_batch, max_vpp; recompute,
    schedules, zero_stage, sequence_parallel: tuples; tp_within_node, uneven_splits: bool).
    Raises Unavailable while predictor.search does not exist.
    """
    mod = _module("search")
    f = _first(mod, "search") if mod else None
    if f is None:
        raise Unavailable("layout search (predictor.search) is not available yet")
    c = {k: (tuple(v) if isinstance(v, list) else v) for k, v in (constraints or {}).items()}
    space_cls = getattr(mod, "SearchSpace", None)
    kwargs: dict[str, Any] = {"top_k": top_k, "objective": objective, "tokens_to_train": tokens,
                              "price_per_gpu_hour": price_per_gpu_hour}
    if space_cls is not None:
        fields_ = {f_.name for f_ in dataclasses.fields(space_cls)}
        kwargs["space"] = space_cls(**{k: v for k, v in {**c, "precision": precision}.items() if k in fields_})
    rep = f(model, predictor if predictor is not None else platform, num_gpus, global_batch, seq_len, **kwargs)
    table = rep.table.copy()
    if "peak_mem_gib" in table and "memory_gib" not in table:
        table["memory_gib"] = table["peak_mem_gib"]
    table["expected_error"] = np.nan
    table["provenance"] = ""
    table["warnings"] = ""
    table["exact_step_time_s"] = np.nan
    for r in getattr(rep, "top", []) or []:
        i = getattr(r, "table_index", -1)
        if i is None or i < 0 or i >= len(table):
            continue
        table.loc[i, "exact_step_time_s"] = r.step_time_s
        if r.prediction is not None:
            table.loc[i, "expected_error"] = r.prediction.expected_error
            table.loc[i, "provenance"] = r.prediction.provenance
            table.loc[i, "warnings"] = " ".join(getattr(r.prediction, "warnings", None) or [])
    if predictor is not None:
        modelled = host_modelled(predictor)
    else:
        from predictor.overhead import load_host_overhead
        from predictor.predict import default_models_dir
        modelled = load_host_overhead(default_models_dir(), platform.platform_id) is not None
    if not modelled and "host_overhead_s" in table:
        table["host_overhead_s"] = np.nan  # not modelled on this platform: empty, not a measured 0
    rej = rep.rejection_summary() if hasattr(rep, "rejection_summary") else pd.DataFrame()
    return {"table": table, "rejections": rej, "exclusions": list(getattr(rep, "exclusions", [])),
            "host_modelled": modelled,
            "elapsed_s": float(getattr(rep, "elapsed_s", 0.0)), "enumerated": int(len(table)),
            "feasible": int(table["fits"].sum()) if "fits" in table else len(table)}


def search_row_fields(row: Any) -> dict[str, str]:
    """The Predict page's query parameters for one search-table row."""
    out: dict[str, str] = {}
    for f_ in ("num_gpus", "tp", "pp", "dp", "micro_batch", "global_batch", "seq_len", "vpp", "zero_stage"):
        if f_ in row and row[f_] == row[f_]:
            out[f_] = str(int(row[f_]))
    for f_ in ("schedule", "recompute", "precision"):
        if f_ in row and isinstance(row[f_], str) and row[f_]:
            out[f_] = row[f_]
    if "sequence_parallel" in row:
        out["sequence_parallel"] = "true" if bool(row["sequence_parallel"]) else "false"
    sl = row.get("stage_layers") if hasattr(row, "get") else None
    if isinstance(sl, str) and sl:
        out["stage_layers"] = sl
    return out


# --------------------------------------------------------------------------- models (regressors)
def models_summary(models_dir: str | None) -> pd.DataFrame:
    """One row per trained model (platform, kind, model, pass, n_samples, cv_mape, ...)."""
    import_lightgbm_fast()
    mod = _module("training")
    f = _first(mod, "models_summary") if mod else None
    if f is None:
        return pd.DataFrame()
    try:
        return f(models_dir)
    except (OSError, ValueError):
        return pd.DataFrame()


def model_metadata(models_dir: Path, platform_id: str) -> dict[str, dict[str, Any]]:
    """stem -> the JSON metadata of each trained model of a platform (for extrapolation / CV detail)."""
    d = Path(models_dir) / platform_id
    out = {}
    for p in sorted(d.glob("*.json")):
        if p.with_suffix(".txt").exists():
            try:
                out[p.stem] = json.loads(p.read_text())
            except ValueError:
                continue
    return out


def bank(platform_id: str, models_dir: str | None):
    """The ModelBank of a platform, or None when it has no trained models."""
    import_lightgbm_fast()
    from predictor.regressors import load_bank
    try:
        return load_bank(platform_id, models_dir)
    except (FileNotFoundError, OSError):
        return None


def op_curve(bank_, op: str, pass_: str, shapes: pd.DataFrame, device, precision: str) -> pd.Series:
    """The regressor's seconds for each row of shape columns (NaN when the bank has no such model)."""
    import numpy as np
    if bank_ is None or not bank_.has_op(op, pass_):
        return pd.Series(np.nan, index=shapes.index)
    return pd.Series(np.asarray(bank_.predict_op(op, pass_, shapes, device, precision), dtype=float),
                     index=shapes.index)


def collective_curve(bank_, collective: str, message_bytes, nodes, gpus_per_node, platform) -> pd.Series:
    import numpy as np
    mb = np.asarray(message_bytes, dtype=float)
    if bank_ is None or not bank_.has_collective(collective):
        return pd.Series(np.full(len(mb), np.nan))
    n = np.broadcast_to(np.asarray(nodes), mb.shape)
    g = np.broadcast_to(np.asarray(gpus_per_node), mb.shape)
    return pd.Series(np.asarray(bank_.predict_collective(collective, mb, n, g, platform), dtype=float))


def regressor_over_samples(bank_, platform, name: str, pass_: str | None, samples: pd.DataFrame, *, x: str,
                           xs: np.ndarray, fixed: dict[str, Any], precision: str
                           ) -> tuple[pd.DataFrame | None, pd.Series | None, str]:
    """The regressor's curve along `x` (other shape columns at `fixed`, else their most common value)
    and its prediction for every sample (operators only). Returns (curve, per_sample, note)."""
    from predictor.ops import COLLECTIVES, SHAPE_COLUMNS
    if name in COLLECTIVES:
        if x != "message_bytes":
            return None, None, "The regressor's curve is drawn against message_bytes."

        def mode(c: str, default: int = 1) -> int:
            return int(fixed.get(c, samples[c].mode().iloc[0] if c in samples and samples[c].notna().any()
                                 else default))
        pred = collective_curve(bank_, name, xs, mode("nodes"), mode("gpus_per_node"), platform)
        note = "" if bank_.has_collective(name) else f"No regressor for collective {name} on {platform.platform_id}."
        return pd.DataFrame({x: xs, "predicted_s": pred.values}), None, note
    base = {c: (fixed[c] if c in fixed else (samples[c].mode().iloc[0] if c in samples and samples[c].notna().any()
                                             else None)) for c in SHAPE_COLUMNS}
    shapes = pd.DataFrame([{**base, x: v} for v in xs], columns=list(SHAPE_COLUMNS)).astype("float64")
    curve = pd.DataFrame({x: xs, "predicted_s": op_curve(bank_, name, pass_, shapes, platform.device,
                                                          precision).values})
    if not bank_.has_op(name, pass_):
        return curve, None, f"No regressor for {name}/{pass_} on {platform.platform_id} (too few samples?)."
    cols = [c for c in SHAPE_COLUMNS if c in samples]
    per = op_curve(bank_, name, pass_, samples[cols].astype("float64"), platform.device, precision)
    return curve, per, ""


def roofline(op: str, pass_: str, shapes: pd.DataFrame, device, precision: str) -> pd.Series:
    from predictor import features
    return pd.Series(features.roofline_s(op, pass_, shapes, device, precision), index=shapes.index)


def extrapolation(platform_id: str, op_names: set[str], store_path: str) -> pd.DataFrame:
    """Extrapolation error of the operator regressors: train on small shapes (hidden <= 6144, seq <= 4096,
    tp < 16), test on larger ones, per axis and all together (MAPE; `n_<axis>` test rows).

    The protocol lives in tests/benchmarks/op_accuracy.py (`extrapolation_table`) for now; raises
    Unavailable when that module is not importable.
    """
    try:
        from tests.benchmarks.op_accuracy import extrapolation_table
    except ImportError as e:
        raise Unavailable(f"the extrapolation check (tests/benchmarks/op_accuracy.py) cannot be imported: {e}") from None
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        return extrapolation_table(platform_id, str(store_path), set(op_names))


def train(platform_id: str, *, store_path: str | None, models_dir: str | None, progress: Progress | None,
          cv_folds: int = 5) -> pd.DataFrame:
    import_lightgbm_fast()
    mod = _module("training")
    f = _first(mod, "train_platform") if mod else None
    if f is None:
        raise Unavailable("training (predictor.training) is not available yet")
    return _call(f, platform_id=platform_id, store_path=store_path, models_dir=models_dir, progress=progress,
                 cv_folds=cv_folds)


# --------------------------------------------------------------------------- ingest / validate
def preview_file(path: Path, platform: str | None) -> list[dict[str, Any]]:
    """Dry run of an ingest: what each file would add, without touching the store."""
    from predictor import ingest_formats as fmt
    out = []
    for plan in fmt.plan_files(Path(path), platform=platform):
        row = {"file": plan.path.name, "kind": plan.kind or "-", "platform": plan.platform or "", "rows": 0,
               "rows_rejected": 0, "status": "ok", "message": ""}
        if plan.kind is None:
            row.update(status="rejected" if plan.skip_reason.startswith("rejected") else "skipped",
                       message=plan.skip_reason)
        else:
            try:
                parsed = fmt.parse_file(plan.path.read_bytes(), plan, 5)
                row["rows"] = int(sum(len(df) for df in parsed.tables.values()))
                row["rows_rejected"] = int(parsed.rows_rejected)
                row["platform"] = ", ".join(parsed.platforms) or row["platform"]
                row["tables"] = ", ".join(f"{t} {len(df)}" for t, df in parsed.tables.items() if len(df))
                row["message"] = "; ".join(parsed.examples[:3])
                if not row["rows"]:
                    row["status"] = "rejected"
            except fmt.FormatError as e:
                row.update(status="rejected", message=str(e))
        out.append(row)
    return out


def ingest(path: Path, *, platform: str | None, store_path: str | None, progress: Progress | None):
    from predictor.store import ingest_path
    return ingest_path(path, store_path=store_path, platform=platform, progress=progress)


def validate(runs: pd.DataFrame, models_dir: str | None, progress: Progress | None = None) -> pd.DataFrame:
    import_lightgbm_fast()
    from predictor.validate import validate_runs
    return _call(validate_runs, runs=runs, models_dir=models_dir, progress=progress)


VALIDATION_JSON = "validation.json"
VALIDATION_RUNS = "validation_runs.csv"  # predictor.validate.VALIDATION_RUNS_FILE


def saved_validation_platforms(models_dir: Path) -> list[str]:
    """Platforms with a saved per-run end-to-end validation (`python -m predictor validate --save`)."""
    d = Path(models_dir)
    return sorted(p.parent.name for p in d.glob(f"*/{VALIDATION_RUNS}")) if d.is_dir() else []


def saved_validation(models_dir: Path, platform_id: str) -> dict[str, Any] | None:
    """{'runs': DataFrame (validate_runs' columns), 'meta': validation.json, 'path': str} or None.
    Reading it is milliseconds; predicting every run again is seconds to minutes."""
    d = Path(models_dir) / platform_id
    path = d / VALIDATION_RUNS
    if not path.is_file():
        return None
    try:
        runs = pd.read_csv(path, keep_default_na=True)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise Unavailable(f"{path} cannot be read ({e}); recompute it") from None
    for c in ("error", "provenance"):  # empty cells read back as NaN (float when all are empty)
        if c in runs:
            runs[c] = runs[c].astype(object).where(runs[c].notna(), "").astype(str)
    meta: dict[str, Any] = {}
    try:
        meta = json.loads((d / VALIDATION_JSON).read_text())
    except (OSError, ValueError):
        pass
    return {"runs": runs, "meta": meta, "path": str(path)}


def save_validation(platform_id: str, res: pd.DataFrame, models_dir: str | None) -> Path:
    """validation.json + validation_runs.csv of a platform (what `python -m predictor validate --save` writes)."""
    from predictor.validate import save_validation as save
    return save(platform_id, res, models_dir)


def mark_unmodelled_host(res: pd.DataFrame) -> pd.DataFrame:
    """`pred_host_overhead_s` empty (NaN) for platforms whose runs never got a host term (no fitted host
    overhead there), so tables and exports do not show an unmodelled 0 as a measured zero."""
    col = "pred_host_overhead_s"
    if col not in res or "platform" not in res or res.empty:
        return res
    res = res.copy()
    h = pd.to_numeric(res[col], errors="coerce")
    none = h.fillna(0.0).groupby(res["platform"]).transform(lambda s: bool((s == 0).all())).astype(bool)
    res[col] = h.mask(none)
    return res


def summarize_validation(res: pd.DataFrame) -> pd.DataFrame:
    from predictor.validate import summarize_validation as s
    if res.empty or "ape" not in res:
        return pd.DataFrame()
    return s(res)


def model_row(model: ModelSpec) -> dict[str, Any]:
    """A ModelSpec in the predict-batch column names."""
    return {"arch": model.arch, "layers": model.num_layers, "hidden": model.hidden_size, "heads": model.num_heads,
            "kv_heads": model.kv_heads, "ffn_hidden": model.ffn, "vocab": model.vocab_size}


def layout_row(layout: Layout) -> dict[str, Any]:
    d = as_dict(layout)
    d.pop("stage_layers", None)
    return d

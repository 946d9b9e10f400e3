"""Predict a batch of loose rows (predict-batch's CSV rows, as dicts of strings): each row is parsed
and validated on its own, the valid ones predicted per platform through the engine in a few
vectorised groups (`Predictor.predict_many`). A row that cannot be predicted keeps its cells and
gets its message in `error`; the batch goes on.

Memory: every predicted row carries `memory_gib` and `fits`. A row that does not fit is an error
unless `allow_oom` is set: its time columns stay empty and `error` names the GiB needed, the GiB
usable and the fix. With `allow_oom` its time is filled, `fits` is False and `warnings` starts with
DOES NOT FIT IN MEMORY. Never a silent number.

Mixture of Experts: when a row can be a MoE model (the header has `model` or a MoE / `ep` column) the output
carries MOE_ECHO_COLUMNS, each predicted row's empty or absent ones filled with the value used (a preset's expert
count and top_k, ep 1, ...), so the file says what was predicted.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import MOE_ECHO_COLUMNS, blank, layout_from_fields, model_from_fields, moe_echo
from predictor.step.compose import CATEGORIES

RESULT_COLUMNS = ["step_time_s", *[f"{c}_s" for c in CATEGORIES], "tokens_per_s", "mfu", "memory_gib",
                  "memory_allocated_gib", "memory_reserved_gib", "fits",
                  "memory_tight", "expected_error", "provenance", "warnings", "error"]


# With a token budget (a `tokens` column or predict-batch --tokens): the training run to it, as `predict --tokens`.
TRAINING_COLUMNS = ["days", "gpu_hours", "cost"]


def output_columns(header: Iterable[str], tokens: bool = False) -> list[str]:
    """The output header: the input's columns, MOE_ECHO_COLUMNS where a row can be a MoE model, RESULT_COLUMNS,
    TRAINING_COLUMNS where the input has a `tokens` column or `tokens` (a budget for every row) is set."""
    cols = list(header)
    if "model" in cols or any(c in cols for c in MOE_ECHO_COLUMNS):
        cols += [c for c in MOE_ECHO_COLUMNS if c not in cols]
    extra = TRAINING_COLUMNS if tokens or "tokens" in cols else []
    return cols + [c for c in [*RESULT_COLUMNS, *extra] if c not in cols]


def _echo(out: dict[str, Any], model, layout) -> None:
    for k, v in moe_echo(model, layout).items():
        if blank(out.get(k)):
            out[k] = v


def _platform_of(row: Mapping[str, Any]) -> str:
    plat = row.get("platform")
    if plat is None or isinstance(plat, float) or not str(plat).strip():
        raise InfeasibleConfig("platform", "is empty.", "name a platform id (see `python -m predictor platforms`).")
    return str(plat).strip()


def _result(pred, allow_oom: bool) -> dict[str, Any]:
    from predictor.plan.memory_verdict import OOM_WARNING, oom_error
    mem = {"memory_gib": pred.memory_gib, "memory_allocated_gib": pred.memory_allocated_gib,
           "memory_reserved_gib": pred.memory_reserved_gib, "fits": pred.fits_memory, "memory_tight": pred.memory_tight}
    if not pred.fits_memory and not allow_oom:
        return {**mem, "step_time_s": None, "error": str(oom_error(pred))}
    bd = {f"{k}_s": v for k, v in pred.breakdown_s.items()}
    if not pred.host_overhead_modelled:
        bd["host_overhead_s"] = None  # not modelled: empty, never a measured-looking 0
    warnings = ([OOM_WARNING] if not pred.fits_memory else []) + list(pred.warnings)
    return {"step_time_s": pred.step_time_s, **bd, "tokens_per_s": pred.tokens_per_s, "mfu": pred.mfu, **mem,
            "expected_error": pred.expected_error, "provenance": pred.provenance, "warnings": " ".join(warnings),
            "error": ""}


def predict_records(records: Iterable[Mapping[str, Any]], models_dir: str | None = None, *, allow_oom: bool = False,
                    progress: Callable[[int, int, str], None] | None = None,
                    errors: Mapping[int, str] | None = None, clusters: str | None = None,
                    memory_options: Any = None, tokens: float | None = None,
                    price_per_gpu_hour: float | None = None) -> list[dict[str, Any]]:
    """One output dict per input record: the record's cells, then RESULT_COLUMNS (None where empty).
    `errors` maps record indexes to a message decided before parsing (e.g. a CSV line with too many
    cells): those rows are not parsed and get that message. `memory_options`: a memory.MemoryOptions for every
    row (default MemoryOptions()). `tokens` / `price_per_gpu_hour`: the token budget and price of every row whose
    `tokens` / `price_per_gpu_hour` cell is empty; with a budget the row gets days, GPU-hours and (with a price)
    cost of the training run (TRAINING_COLUMNS)."""
    from predictor.plan.costing import training_estimate, training_inputs
    from predictor.plan.predict import get_predictor
    records = list(records)
    errors = errors or {}
    n = len(records)
    out: list[dict[str, Any]] = [{**dict(r), **dict.fromkeys(RESULT_COLUMNS)} for r in records]
    by_platform: dict[str, list[tuple[int, Any, Any]]] = {}
    budget: dict[int, tuple[float | None, float | None]] = {}
    for i, row in enumerate(records):
        if i in errors:
            out[i]["error"] = errors[i]
            continue
        try:
            t, cost = training_inputs(row.get("tokens"), row.get("price_per_gpu_hour"))
            budget[i] = (tokens if t is None else t, price_per_gpu_hour if cost is None else cost)
            plat = _platform_of(row)
            model = model_from_fields(row)
            layout = layout_from_fields(row)
            layout.validate(model)
            _echo(out[i], model, layout)
            by_platform.setdefault(plat, []).append((i, model, layout))
        except InfeasibleConfig as e:
            out[i]["error"] = str(e)
    done = 0
    for plat, items in by_platform.items():
        try:
            P = get_predictor(plat, models_dir, clusters, memory_options)
        except InfeasibleConfig as e:
            for i, _, _ in items:
                out[i]["error"] = str(e)
            continue
        ok = []
        for i, model, layout in items:
            try:
                P.check_runs(layout)
                P.platform.device.check_precision(layout.precision)
                ok.append((i, model, layout))
            except InfeasibleConfig as e:
                out[i]["error"] = str(e)
        try:
            preds = P.predict_many([(m, L) for _, m, L in ok])
        except InfeasibleConfig as e:
            for i, _, _ in ok:
                out[i]["error"] = str(e)
            continue
        for (i, _m, L), p in zip(ok, preds):
            out[i].update(_result(p, allow_oom))
            t, price = budget.get(i, (None, None))
            if t is not None and out[i]["step_time_s"] is not None:
                est = training_estimate(p.step_time_s, L.num_gpus, L.tokens_per_step, t, price).scalar()
                out[i].update(days=est.days, gpu_hours=est.gpu_hours, cost=est.cost)
        done += len(items)
        if progress:
            progress(done, n, "rows predicted")
    for o in out:
        if o["error"] is None:
            o["error"] = ""
    return out


def predict_rows(df, models_dir=None, progress=None, *, allow_oom: bool = False):
    """A DataFrame of rows in, a DataFrame out (the library form of predict-batch, same rules)."""
    import pandas as pd
    rows = predict_records(df.to_dict(orient="records"), models_dir, allow_oom=allow_oom, progress=progress)
    return pd.DataFrame(rows, columns=output_columns(df.columns))

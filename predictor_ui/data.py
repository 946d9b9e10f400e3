"""Cached access to the predictor and the store.

Predictors (regressors loaded, operator caches) live in st.cache_resource, keyed by the platform
and a stamp of the models directory, so a retrain shows at once. Predictions and store reads are
st.cache_data, keyed by plain strings (JSON of the fields) and the store's stamp.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pandas as pd
import streamlit as st

from predictor.layout_io import layout_from_fields, model_from_fields
from predictor.specs import InfeasibleConfig, Layout, ModelSpec

from . import adapters, config, inputs


# --------------------------------------------------------------------------- platforms / predictors
def resolve_platform(key: str):
    """Platform object from inputs.platform_key()."""
    if key.startswith(inputs.CUSTOM + ":"):
        return adapters.custom_platform(json.loads(key[len(inputs.CUSTOM) + 1:]))
    plats = adapters.platforms(config.clusters_file_arg())
    if key not in plats:
        raise InfeasibleConfig("platform", f"unknown platform '{key}'.", f"use one of {', '.join(sorted(plats))}.")
    return plats[key]


_LAST_MODELS: dict[str, str] = {}


def _refresh_model_caches(models_version: str) -> None:
    """The predictor keeps lru caches of loaded regressors; drop them when the files changed."""
    if _LAST_MODELS.get("v") not in (None, models_version):
        from predictor import predict as P
        from predictor import regressors as R
        for f in (R._cached_bank, P.get_predictor):
            f.cache_clear()
    _LAST_MODELS["v"] = models_version


@st.cache_resource(show_spinner=False, max_entries=32)
def _predictor(key: str, models_version: str, clusters_version: str):
    _refresh_model_caches(models_version)
    return adapters.make_predictor(resolve_platform(key), config.models_dir_arg())


def predictor(key: str):
    return _predictor(key, config.models_version(), config.clusters_version())


def backing(key: str) -> dict[str, str]:
    return adapters.platform_backing(predictor(key))


# --------------------------------------------------------------------------- building specs
def build(model_fields: dict[str, Any], layout_fields: dict[str, Any]) -> tuple[ModelSpec, Layout]:
    """ModelSpec + validated Layout; raises InfeasibleConfig naming the field and the fix."""
    model = model_from_fields(model_fields)
    layout = layout_from_fields(layout_fields)
    layout.validate(model)
    return model, layout


def _spec_json(model: ModelSpec, layout: Layout) -> tuple[str, str]:
    return json.dumps(asdict(model), sort_keys=True), json.dumps(asdict(layout), sort_keys=True, default=list)


def _specs_from_json(mj: str, lj: str) -> tuple[ModelSpec, Layout]:
    m = ModelSpec(**json.loads(mj))
    ld = json.loads(lj)
    if ld.get("stage_layers") is not None:
        ld["stage_layers"] = tuple(ld["stage_layers"])
    return m, Layout(**ld)


@st.cache_data(show_spinner=False, max_entries=512)
def _predict(key: str, mj: str, lj: str, timeline: bool, models_version: str, clusters_version: str):
    m, L = _specs_from_json(mj, lj)
    return predictor(key).predict(m, L, timeline=timeline)


def predict(key: str, model: ModelSpec, layout: Layout, timeline: bool = True):
    mj, lj = _spec_json(model, layout)
    return _predict(key, mj, lj, timeline, config.models_version(), config.clusters_version())


@st.cache_data(show_spinner=False, max_entries=512)
def _memory(key: str, mj: str, lj: str, clusters_version: str) -> dict[str, Any]:
    m, L = _specs_from_json(mj, lj)
    try:
        return adapters.memory(m, L, resolve_platform(key))
    except adapters.Unavailable as e:
        return {"unavailable": str(e)}


def memory(key: str, model: ModelSpec, layout: Layout) -> dict[str, Any]:
    """adapters.memory view, or {'unavailable': reason}."""
    mj, lj = _spec_json(model, layout)
    return _memory(key, mj, lj, config.clusters_version())


@st.cache_data(show_spinner=False, max_entries=64)
def default_price(key: str) -> float | None:
    try:
        return adapters.default_price(resolve_platform(key))
    except InfeasibleConfig:
        return None


@st.cache_data(show_spinner=False, max_entries=32)
def _search(key: str, mj: str, num_gpus: int, global_batch: int, seq_len: int, precision: str, cj: str,
            tokens: float | None, price: float | None, objective: str, models_version: str,
            clusters_version: str) -> dict[str, Any]:
    model = ModelSpec(**json.loads(mj))
    return adapters.search(model, resolve_platform(key), num_gpus=num_gpus, global_batch=global_batch,
                           seq_len=seq_len, precision=precision, predictor=predictor(key),
                           constraints=json.loads(cj), tokens=tokens, price_per_gpu_hour=price, objective=objective)


def search(key: str, model: ModelSpec, *, num_gpus: int, global_batch: int, seq_len: int, precision: str,
           constraints: dict[str, Any], tokens: float | None = None, price: float | None = None,
           objective: str = "time") -> dict[str, Any]:
    """adapters.search, cached per inputs (raises adapters.Unavailable / InfeasibleConfig)."""
    return _search(key, json.dumps(asdict(model), sort_keys=True), num_gpus, global_batch, seq_len, precision,
                   json.dumps(constraints, sort_keys=True), tokens, price, objective, config.models_version(),
                   config.clusters_version())


# --------------------------------------------------------------------------- store
class StoreMissing(RuntimeError):
    pass


def _store_call(fn, *args, **kwargs):
    from predictor.store import StoreError
    try:
        return fn(*args, **kwargs)
    except StoreError as e:
        raise StoreMissing(str(e)) from None


def store_status() -> tuple[bool, str]:
    """(exists, message)."""
    p = config.store_path()
    if not p.exists():
        return False, (f"No sample store at `{p}` yet. Create it from the published samples with\n\n"
                       f"```bash\n{config.STORE_HINT}\n```\n\nor upload your own on the **Calibrate** page "
                       f"(set `PREDICTOR_STORE` to use a store elsewhere).")
    return True, str(p)


@st.cache_data(show_spinner=False, max_entries=8)
def _summary(version: str) -> pd.DataFrame:
    from predictor.store import summarize
    return _store_call(summarize)


def store_summary() -> pd.DataFrame:
    return _summary(config.store_version())


@st.cache_data(show_spinner=False, max_entries=64)
def _op_samples(platform: str, op: str, pass_: str, version: str) -> pd.DataFrame:
    from predictor.store import read_op_samples
    return _store_call(read_op_samples, platform=platform, op=op, pass_=pass_)


def op_samples(platform: str, op: str, pass_: str) -> pd.DataFrame:
    return _op_samples(platform, op, pass_, config.store_version())


@st.cache_data(show_spinner=False, max_entries=32)
def _collective_samples(platform: str, collective: str, version: str) -> pd.DataFrame:
    from predictor.store import read_collective_samples
    return _store_call(read_collective_samples, platform=platform, collective=collective)


def collective_samples(platform: str, collective: str) -> pd.DataFrame:
    return _collective_samples(platform, collective, config.store_version())


@st.cache_data(show_spinner=False, max_entries=8)
def _measured_runs(version: str) -> pd.DataFrame:
    from predictor.store import read_measured_runs
    return _store_call(read_measured_runs)


def measured_runs() -> pd.DataFrame:
    return _measured_runs(config.store_version())


_VALIDATION: dict[tuple[str, str, str], pd.DataFrame] = {}


def validation_cached(platform: str) -> bool:
    return (platform, config.store_version(), config.models_version()) in _VALIDATION


def validation(platform: str, progress=None, recompute: bool = False) -> pd.DataFrame:
    """Every measured run of a platform predicted; kept for the whole server process until the store or
    the models change (a plain dict rather than st.cache_data, so the first computation can report progress).
    The Accuracy page shows the saved validation (`saved_validation`) and calls this on request."""
    key = (platform, config.store_version(), config.models_version())
    hit = None if recompute else _VALIDATION.get(key)
    if hit is None:
        runs = measured_runs()
        runs = runs[runs["platform"] == platform]
        hit = adapters.validate(runs, config.models_dir_arg(), progress=progress)
        for k in [k for k in _VALIDATION if k[0] == platform]:
            _VALIDATION.pop(k, None)
        _VALIDATION[key] = hit
    return hit


@st.cache_data(show_spinner=False, max_entries=16)
def _saved_validation(platform: str, models_version: str) -> dict | None:
    return adapters.saved_validation(config.models_dir(), platform)


def saved_validation(platform: str) -> dict | None:
    """The platform's saved end-to-end validation (models_store/<platform>/validation_runs.csv +
    validation.json), or None. Raises adapters.Unavailable when the file is unreadable."""
    return _saved_validation(platform, config.models_version())


def saved_validation_platforms() -> list[str]:
    return adapters.saved_validation_platforms(config.models_dir())


@st.cache_data(show_spinner=False, max_entries=8)
def _models_summary(models_version: str) -> pd.DataFrame:
    return adapters.models_summary(config.models_dir_arg())


def models_summary() -> pd.DataFrame:
    return _models_summary(config.models_version())


@st.cache_data(show_spinner=False, max_entries=16)
def _model_metadata(platform: str, models_version: str) -> dict:
    return adapters.model_metadata(config.models_dir(), platform)


def model_metadata(platform: str) -> dict:
    return _model_metadata(platform, config.models_version())


@st.cache_data(show_spinner=False, max_entries=64)
def _extrapolation(platform: str, op: str, version: str) -> pd.DataFrame:
    return adapters.extrapolation(platform, {op}, str(config.store_path()))


def extrapolation(platform: str, op: str) -> pd.DataFrame:
    return _extrapolation(platform, op, config.store_version())


def bank(platform: str):
    """The ModelBank behind a platform's own regressors (None when untrained)."""
    _refresh_model_caches(config.models_version())
    return adapters.bank(platform, config.models_dir_arg())


def clear_all() -> None:
    """After an ingest or a retrain."""
    config.forget_versions()
    st.cache_data.clear()
    st.cache_resource.clear()
    _VALIDATION.clear()
    from predictor.platforms import load_platforms
    load_platforms.cache_clear()
    _refresh_model_caches("force-" + config.models_version())

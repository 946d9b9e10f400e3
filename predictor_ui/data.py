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

from predictor.hardware.platforms import Platform, load_platforms
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import layout_from_fields, model_from_fields
from predictor.model.specs import Layout, ModelSpec
from predictor.regress.lgb_import import import_lightgbm

from . import config, inputs
from .clusters import custom_platform
from .search_view import SearchView, search_view


# --------------------------------------------------------------------------- platforms / predictors
def resolve_platform(key: str) -> Platform:
    """Platform object from inputs.platform_key()."""
    if key.startswith(inputs.CUSTOM + ":"):
        return custom_platform(json.loads(key[len(inputs.CUSTOM) + 1:]))
    plats = load_platforms(config.clusters_file_arg())
    if key not in plats:
        raise InfeasibleConfig("platform", f"unknown platform '{key}'.", f"use one of {', '.join(sorted(plats))}.")
    return plats[key]


_LAST_MODELS: dict[str, str] = {}


def _refresh_model_caches(models_version: str) -> None:
    """The predictor keeps lru caches of loaded regressors; drop them when the files changed."""
    if _LAST_MODELS.get("v") not in (None, models_version):
        from predictor.plan import predict as P
        from predictor.regress import regressors as R
        for f in (R._cached_bank, P.get_predictor):
            f.cache_clear()
    _LAST_MODELS["v"] = models_version


@st.cache_resource(show_spinner=False, max_entries=32)
def _predictor(key: str, models_version: str, clusters_version: str):
    _refresh_model_caches(models_version)
    import_lightgbm()
    from predictor.plan.predict import Predictor
    return Predictor(resolve_platform(key), config.models_dir_arg())


def predictor(key: str):
    return _predictor(key, config.models_version(), config.clusters_version())


def backing(key: str) -> dict[str, str]:
    """What backs a platform's numbers, in words (as `python -m predictor platforms` says it)."""
    from predictor.plan.backing import describe_backing
    d = describe_backing(predictor(key)).to_dict()
    d.pop("kind")
    return d


def backing_kind(key: str) -> str:
    """measured | measured + transferred | transferred | analytical: what a platform's operator times rest on."""
    from predictor.plan.backing import describe_backing
    return describe_backing(predictor(key)).kind


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
    if ld.get("recompute_modules") is not None:
        ld["recompute_modules"] = tuple(ld["recompute_modules"])
    return m, Layout(**ld)


@st.cache_data(show_spinner=False, max_entries=512)
def _predict(key: str, mj: str, lj: str, timeline: bool, models_version: str, clusters_version: str):
    m, L = _specs_from_json(mj, lj)
    return predictor(key).predict(m, L, timeline=timeline)


def predict(key: str, model: ModelSpec, layout: Layout, timeline: bool = True):
    # the precision asked for, named as asked (fp8 on V100: no FP8 tensor cores), as the CLI and predict-batch do
    predictor(key).platform.device.check_precision(layout.precision)
    mj, lj = _spec_json(model, layout)
    return _predict(key, mj, lj, timeline, config.models_version(), config.clusters_version())


@st.cache_data(show_spinner=False, max_entries=32)
def _search(key: str, mj: str, num_gpus: int, global_batch: int, seq_len: int, space_json: str,
            tokens: float | None, price: float | None, objective: str, models_version: str,
            clusters_version: str) -> SearchView:
    from predictor.plan.search import SearchSpace, search
    model = ModelSpec(**json.loads(mj))
    space = SearchSpace(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(space_json).items()})
    pr = predictor(key)
    rep = search(model, pr, num_gpus, global_batch, seq_len, space=space, objective=objective,
                 tokens_to_train=tokens, price_per_gpu_hour=price)
    return search_view(rep, pr.host_modelled)


def search(key: str, model: ModelSpec, space: Any, *, num_gpus: int, global_batch: int, seq_len: int,
           tokens: float | None = None, price: float | None = None, objective: str = "time") -> SearchView:
    """predictor.plan.search.search over `space` (a SearchSpace), cached per inputs (raises InfeasibleConfig)."""
    return _search(key, json.dumps(asdict(model), sort_keys=True), num_gpus, global_batch, seq_len,
                   json.dumps(asdict(space), sort_keys=True), tokens, price, objective, config.models_version(),
                   config.clusters_version())


# --------------------------------------------------------------------------- store
class StoreMissing(RuntimeError):
    pass


def _store_call(fn, *args, **kwargs):
    from predictor.samples.store import StoreError
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
    from predictor.samples.store import summarize
    return _store_call(summarize)


def store_summary() -> pd.DataFrame:
    return _summary(config.store_version())


@st.cache_data(show_spinner=False, max_entries=64)
def _op_samples(platform: str, op: str, pass_: str, version: str) -> pd.DataFrame:
    from predictor.samples.store import read_op_samples
    return _store_call(read_op_samples, platform=platform, op=op, pass_=pass_)


def op_samples(platform: str, op: str, pass_: str) -> pd.DataFrame:
    return _op_samples(platform, op, pass_, config.store_version())


@st.cache_data(show_spinner=False, max_entries=32)
def _collective_samples(platform: str, collective: str, version: str) -> pd.DataFrame:
    from predictor.samples.store import read_collective_samples
    return _store_call(read_collective_samples, platform=platform, collective=collective)


def collective_samples(platform: str, collective: str) -> pd.DataFrame:
    return _collective_samples(platform, collective, config.store_version())


@st.cache_data(show_spinner=False, max_entries=8)
def _measured_runs(version: str) -> pd.DataFrame:
    from predictor.samples.store import read_measured_runs
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
        hit = validate_runs(runs[runs["platform"] == platform], progress)
        for k in [k for k in _VALIDATION if k[0] == platform]:
            _VALIDATION.pop(k, None)
        _VALIDATION[key] = hit
    return hit


def validate_runs(runs: pd.DataFrame, progress=None) -> pd.DataFrame:
    """predictor.checks.validate.validate_runs on these runs with the dashboard's models."""
    import_lightgbm()
    from predictor.checks.validate import validate_runs as validate
    return validate(runs=runs, models_dir=config.models_dir_arg(), progress=progress)


@st.cache_data(show_spinner=False, max_entries=16)
def _saved_validation(platform: str, models_version: str):
    from predictor.checks.validate import read_saved_validation
    return read_saved_validation(config.models_dir_arg(), platform)


def saved_validation(platform: str):
    """The platform's saved end-to-end validation (predictor.checks.validate.SavedValidation: models_store/<platform>/
    validation_runs.csv + validation.json), or None. Raises predictor.paths.ArtifactError when unreadable."""
    return _saved_validation(platform, config.models_version())


def saved_validation_platforms() -> list[str]:
    from predictor.checks.validate import saved_validation_platforms as platforms
    return platforms(config.models_dir_arg())


@st.cache_data(show_spinner=False, max_entries=8)
def _terms_by_source(models_version: str) -> tuple[pd.DataFrame, dict[str, Any], str | None]:
    from predictor.step.terms import NONE, load_terms_checked, spread_was_fitted, validation_by_source
    terms, warning = load_terms_checked(config.models_dir_arg())
    terms = terms or NONE
    pooled = {k: v for k, v in terms.validation.items() if k != "per_source"}
    return validation_by_source(terms), {**pooled, "fitted_on": terms.fitted_on, "power_form": terms.power_form,
                                         "power_factor": terms.power_factor,
                                         "contention": terms.contention,
                                         "speed_spread": terms.speed_spread,
                                         "speed_spread_fitted": spread_was_fitted(terms.source)}, warning


@st.cache_data(show_spinner=False, max_entries=8)
def _host_floor_words(models_version: str) -> tuple[str | None, str | None]:
    from predictor.step.host_floor import load_host_floor
    floor, warning = load_host_floor(config.models_dir_arg())
    return (floor.in_words() if floor is not None else None), warning


def host_floor_words() -> tuple[str | None, str | None]:
    """(the measured host floor of models_store/host_floor.json in words, or None without a usable file;
    a warning naming the file and field when it is broken)."""
    return _host_floor_words(config.models_version())


def terms_by_source() -> tuple[pd.DataFrame, dict[str, Any], str | None]:
    """The end-to-end terms' leave-one-source-out validation (predictor.step.terms.validation_by_source), the
    pooled figures of framework_terms.json (held-out MAPE, scheme, the runs per source) and a warning when
    the file is unusable."""
    return _terms_by_source(config.models_version())


@st.cache_data(show_spinner=False, max_entries=8)
def _models_summary(models_version: str) -> pd.DataFrame:
    from predictor.calibrate.training import models_summary
    return models_summary(config.models_dir_arg())


def models_summary() -> pd.DataFrame:
    return _models_summary(config.models_version())


@st.cache_data(show_spinner=False, max_entries=16)
def _model_metadata(platform: str, models_version: str) -> dict:
    from predictor.calibrate.training import model_metadata
    return model_metadata(platform, config.models_dir_arg())


def model_metadata(platform: str) -> dict:
    return _model_metadata(platform, config.models_version())


@st.cache_data(show_spinner=False, max_entries=64)
def _extrapolation(platform: str, op: str, version: str) -> pd.DataFrame:
    import_lightgbm()
    from predictor.checks.extrapolation import extrapolation_table
    return extrapolation_table(platform, config.store_path(), {op})


def extrapolation(platform: str, op: str) -> pd.DataFrame:
    """predictor.checks.extrapolation.extrapolation_table for one operator of a platform (refits: seconds)."""
    return _extrapolation(platform, op, config.store_version())


@st.cache_data(show_spinner=False, max_entries=4)
def _network_check(shared: str, shared_version: str, models_version: str):
    from predictor.checks.network_check import network_check as check
    return check(shared, config.models_dir_arg())


def network_check():
    """predictor.checks.network_check.network_check: the saved network calibrations against the measured NCCL
    sweeps of config.shared_datasets(); refreshed when the datasets folder or the models change."""
    return _network_check(str(config.shared_datasets()), config.shared_version(), config.models_version())


def independent_sources() -> list[str]:
    """The source ids of predictor/catalog/independent_runs.json, in file order."""
    from predictor.checks.independent import load_sources
    return list(load_sources())


@st.cache_data(show_spinner=False, max_entries=8)
def _independent_check(source_id: str, models_version: str
                       ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    from predictor.checks.independent import run_check
    c = run_check(source_id, models_dir=config.models_dir_arg())
    return c.runs, c.summary(), c.summary("nodes"), {**c.source, "dropped": c.dropped}


def independent_check(source_id: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """predictor.checks.independent.run_check: published runs never fitted to, predicted with the current models
    (per run, overall, by node count, and the source's description)."""
    return _independent_check(source_id, config.models_version())


@st.cache_data(show_spinner=False, max_entries=8)
def _independent_speedups(source_id: str, store_version: str, models_version: str
                          ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    from predictor.checks.independent import IndependentCheck, reference_runs, speedup_pairs, speedup_summary
    runs, _overall, _by_nodes, src = _independent_check(source_id, models_version)   # the check's cached predictions
    c = IndependentCheck(source_id, src, runs, src["dropped"])
    pairs = speedup_pairs(c, reference_runs(c, config.store_path(), config.models_dir_arg()))
    return pairs, speedup_summary(pairs), speedup_summary(pairs, "seq_len")


def independent_speedups(source_id: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """predictor.checks.independent.speedup_pairs: each independent run beside the store's run of the same
    configuration on
    the source's reference GPU, measured vs predicted speed-up (pairs, overall, by sequence length); empty frames
    when the source names no reference or the store lacks its runs."""
    return _independent_speedups(source_id, config.store_version(), config.models_version())


@st.cache_data(show_spinner=False, max_entries=4)
def _nemo_check(models_version: str) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, int]]:
    from predictor.checks.independent_nemo import run_check
    c = run_check(models_dir=config.models_dir_arg())
    groups = {"all runs": c.summary(), "GPU": c.summary("platform"), "MoE / dense": c.summary("kind"),
              "source": c.summary("source")}
    return c.runs, groups, c.dropped_counts


def nemo_check() -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, int]]:
    """predictor.checks.independent_nemo.run_check: NVIDIA's published NeMo / Megatron-Core runs (H100, B200, GB200;
    MoE,
    FP8, CP), never fitted to, predicted with the current models (per run, summaries by group, rows dropped)."""
    return _nemo_check(config.models_version())


@st.cache_data(show_spinner=False)
def memory_check() -> pd.DataFrame:
    """predictor.checks.published_memory.compare: published per-GPU memory of Megatron-Core runs against the memory
    model, one row per figure (ours for the quantity it counts, or why it is not comparable)."""
    from predictor.checks.published_memory import compare
    return compare()


def bank(platform: str):
    """The ModelBank behind a platform's own regressors (None when untrained)."""
    _refresh_model_caches(config.models_version())
    import_lightgbm()
    from predictor.regress.regressors import load_bank
    return load_bank(platform, config.models_dir_arg())


def clear_all() -> None:
    """After an ingest or a retrain."""
    config.forget_versions()
    st.cache_data.clear()
    st.cache_resource.clear()
    _VALIDATION.clear()
    load_platforms.cache_clear()
    _refresh_model_caches("force-" + config.models_version())

"""Train every regressor of a platform from the sample store and write them to `models_store/`.

`train_platform("perlmutter-a100")` trains one `OpRegressor` per (op, pass) with samples and one
`CollectiveRegressor` per collective, runs the K-fold CV, writes `<models_dir>/<platform>/*.txt/.json`
(removing models of that platform that no longer have samples) and regenerates
`<models_dir>/README.md` from the metadata of everything there.

    python -m predictor.calibrate.training perlmutter-a100 [--store PATH] [--models-dir DIR] [--folds 5]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from predictor.hardware.platforms import get_platform
from predictor.model import ops
from predictor.paths import ArtifactError, read_json_checked, write_bytes_atomic, write_text_atomic
from predictor.regress import features as F
from predictor.regress import transfer
from predictor.regress.regressors import (
    MODEL_FILE_KEY,
    MODELS_DIR,
    PAPER_LICENCE,
    PAPER_SOURCE,
    CollectiveRegressor,
    OpRegressor,
    check_model_metadata,
    check_model_text,
    model_file_record,
)
from predictor.samples import store

Progress = Callable[[int, int, str], None]
_PAPER_NCCL_RE = re.compile(r"_(allreduce_large|allreduce|allgather_large|p2p)_fp16(?:_\d+_\d+)?\.csv$")
_PAPER_OPT_GROUP = dict(ops.PAPER_OPTIMIZER_FILES)  # paper function -> variant
_SAME_ROOFLINE = {"fp16": "half", "bf16": "half", "fp32": "fp32"}
# Operators a platform's published kernel tables measure (`Platform.kernel_models`): a platform that holds only
# those trains only those (its other samples, e.g. a few Liger-Kernel rows of one swept dimension, stay in the store)
KERNEL_TABLE_OPS = (*F.GRID_GEMM_OPS, "flash_attn")
# a grid regressor per low-precision format, trained on the gemm rows of that dtype (ops.FORMAT_GEMMS)
_FORMAT_BY_OP = {f.op: f for f in ops.FORMAT_GEMMS.values()}
# variant suffix of a power-monitored collection (formats.aiconfigurator): left out of a fit when a short-run
# collection of the same op exists, since the two differ in software and kernel choice as well as in power
POWER_MONITORED = ":power-monitored"


def _training_dtype(dtypes: pd.Series) -> str:
    """The dtype a regressor is fitted on: half precision (fp16 / bf16, what training runs) when the samples have
    it, else the most common one."""
    counts = dtypes.value_counts()
    return next((str(d) for d in counts.index if _SAME_ROOFLINE.get(str(d)) == "half"), str(counts.index[0]))


def _drop_power_monitored(g: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    pm = g["variant"].fillna("").astype(str).str.endswith(POWER_MONITORED).to_numpy()
    if pm.any() and not pm.all():
        return g[~pm], int(pm.sum())
    return g, 0


# --------------------------------------------------------------------------- provenance
CAUSAL_VARIANT = ":causal"  # variant suffix of causal attention samples (formats.aiconfigurator: prefill)


def op_regressor_for(op: str, pass_: str, samples: pd.DataFrame) -> OpRegressor:
    """The regressor `train_platform` fits on `samples` of (op, pass): a flash_attn model whose every row is a
    causal kernel's (variant ending ':causal') normalises by the causal tile work (`OpRegressor(causal=True)`)."""
    variants = samples["variant"].fillna("").astype(str) if "variant" in samples else pd.Series([], dtype=str)
    causal = op == "flash_attn" and len(variants) > 0 and bool(variants.str.endswith(CAUSAL_VARIANT).all())
    return OpRegressor(op, pass_, causal=causal)


# GEMMs of at most this many FLOPs time the format grids' fixed per-call latency (`grid_fixed_overhead_s`)
FIXED_OVERHEAD_MAX_FLOPS = 1e9


def grid_fixed_overhead_s(grid: pd.DataFrame, table_dtype: str) -> float | None:
    """The fixed latency a low-precision grid pays per call over the BF16 grid: the median of (format - bf16)
    seconds over the shapes both timed with at most 1 GFLOP, where neither GEMM's work counts. In the published
    tables this is the input-quantize pipeline TensorRT-LLM's `Linear` runs before the GEMM (per-tensor FP8 with
    dynamic input scaling: about 10 us; blockwise FP8 1.5-3 us; NVFP4 about 5 us), none of which Transformer
    Engine's fused cast kernels pay as separate launches. None without such shapes."""
    g, _ = _drop_power_monitored(grid)
    key = ["seq", "hidden", "ffn_hidden"]
    fmt = g[g["dtype"] == table_dtype].groupby(key)["duration_s"].median()
    bf = g[g["dtype"] == "bf16"].groupby(key)["duration_s"].median()
    j = pd.concat({"fmt": fmt, "bf16": bf}, axis=1, join="inner").reset_index()
    if not len(j):
        return None
    flops = 2.0 * j["seq"].astype(float) * j["hidden"].astype(float) * j["ffn_hidden"].astype(float)
    small = (flops <= FIXED_OVERHEAD_MAX_FLOPS).to_numpy()
    if small.sum() < 20:
        return None
    return max(float(np.median((j["fmt"] - j["bf16"]).to_numpy()[small])), 0.0)


# Whole ranges of the swept dimension held out at once (a grid's dense neighbours flatter a random split): the m
# (tokens) ranges of a GEMM grid, the sequence ranges of an attention table; scored on the shapes a training step
# runs (GEMMs of m >= 512 and >= 1 GFLOP, attention of >= 1024 tokens) that pass the physical bound
HELD_OUT_BLOCKS = {"gemm": ("seq", ((1, 64), (65, 512), (513, 4096), (4097, 32768))),
                   "flash_attn": ("seq", ((1, 512), (513, 2048), (2049, 8192), (8193, 16384)))}


def block_heldout_error(op: str, g: pd.DataFrame, device, precision: str) -> dict[str, Any] | None:
    """The regressor of `op` refitted without each whole block of its swept dimension and scored on that block
    (`HELD_OUT_BLOCKS`; the format grids as `gemm`): mean and median relative error over the train-sized rows, or
    None where no block leaves enough to fit. What a prediction on a measured platform carries as its operator
    error (predict._measured_error), beside the random-split CV."""
    col, blocks = HELD_OUT_BLOCKS["flash_attn" if op == "flash_attn" else "gemm"]
    g = g.reset_index(drop=True)
    errs: list[np.ndarray] = []
    for lo, hi in blocks:
        te = g[col].between(lo, hi).to_numpy()
        if not te.any() or (~te).sum() < 50:
            continue
        train, test = g[~te], g[te]
        m = op_regressor_for(op, "fwd", train).fit(train, train["duration_s"].to_numpy(), device, precision)
        y = test["duration_s"].to_numpy(float)
        ape = np.abs(m.predict(test, device, precision) - y) / y
        if op == "flash_attn":
            big = (test["seq"] >= 1024).to_numpy()
        else:
            big = ((test["seq"] >= 512) & (2.0 * test["seq"].astype(float) * test["hidden"].astype(float)
                                           * test["ffn_hidden"].astype(float) >= 1e9)).to_numpy()
        ok = transfer.plausible(op, "fwd", test, y, device, precision) & big
        errs.append(ape[ok])
    e = np.concatenate(errs) if errs else np.array([])
    if not len(e):
        return None
    return {"mape": float(np.mean(e)), "median_ape": float(np.median(e)), "rows": int(len(e)),
            "scheme": f"whole {col} ranges held out ({', '.join(f'{a}-{b}' for a, b in blocks)}), refitted without "
                      "each, train-sized rows (training.block_heldout_error)"}


def grid_best_flops(g: pd.DataFrame) -> float | None:
    """The highest throughput a GEMM grid measured: max over its rows of 2 m n k / seconds (FLOP/s); what no
    predicted GEMM on its platform may exceed (predict.achievable_flops). None for an empty grid."""
    if not len(g):
        return None
    flops = 2.0 * g["seq"].astype(float) * g["hidden"].astype(float) * g["ffn_hidden"].astype(float)
    t = (flops / g["duration_s"].astype(float)).to_numpy()
    t = t[np.isfinite(t)]
    return float(t.max()) if len(t) else None


def _licences(batch_ids: pd.Series, store_path) -> dict[str, str]:
    try:
        b = store.list_batches(store_path=store_path)
    except Exception:  # noqa: BLE001 - provenance is best effort
        return {}
    b = b[b["batch_id"].isin(set(batch_ids.dropna().unique()))]
    return {str(r.source): str(r.licence) for r in b.itertuples()}


def _provenance(df: pd.DataFrame, store_path) -> dict[str, Any]:
    sources = sorted(set(df["source"].dropna().astype(str))) if "source" in df else []
    lic = _licences(df["batch_id"], store_path) if "batch_id" in df else {}
    paper = bool(sources) and all(s.startswith("DebarghaG/estimate-train-time") for s in sources)
    licences = sorted(set(lic.values())) or ([PAPER_LICENCE] if paper else ["unknown"])
    prefixes = sorted({s.split(":")[0] for s in sources})
    return {"source": PAPER_SOURCE if paper else ", ".join(prefixes) or "unknown",
            "licence": ", ".join(licences), "source_files": len(sources)}


def _weighted_paper_error(by_group: dict[str, float], counts: dict[str, int]) -> float | None:
    keys = [k for k in by_group if counts.get(k)]
    if not keys:
        vals = list(by_group.values())
        return float(np.mean(vals)) if vals else None
    w = np.array([counts[k] for k in keys], float)
    return float(np.sum(w * np.array([by_group[k] for k in keys])) / w.sum())


def _mape_over_groups(cv: dict[str, Any], keys, which: str = "scored") -> float | None:
    """Row-weighted CV MAPE over the CV groups in `keys` (those the paper also scored)."""
    by = cv.get("by_group") or {}
    tot = n = 0.0
    for k in keys:
        e = (by.get(k) or {}).get(which) or {}
        if e.get("n") and e.get("mape") is not None:
            tot += e["mape"] * e["n"]
            n += e["n"]
    return tot / n if n else None


def _collective_group(source: Any, collective: str, nodes: int, gpn: int) -> str:
    m = _PAPER_NCCL_RE.search(str(source or ""))
    func = m.group(1) if m else collective
    return f"{func}@{int(nodes)}x{int(gpn)}"


# --------------------------------------------------------------------------- training
def train_platform(platform_id: str, *, store_path=None, models_dir=None, progress: Progress | None = None,
                   cv_folds: int = 5, ops_only: tuple[str, ...] | None = None,
                   write_readme: bool = True) -> pd.DataFrame:
    """Train and save every (op, pass) and collective model of `platform_id`; one summary row per model."""
    plat = get_platform(platform_id)
    device = plat.device
    out_dir = Path(models_dir) if models_dir is not None else MODELS_DIR
    pdir = out_dir / platform_id
    opdf = store.read_op_samples(platform_id, store_path=store_path)
    coll = store.read_collective_samples(platform_id, store_path=store_path)
    try:
        perr = store.read_paper_errors(platform_id, store_path=store_path)
    except Exception:  # noqa: BLE001
        perr = pd.DataFrame(columns=["kind", "op", "paper_function", "pass", "nodes", "gpus_per_node",
                                     "best_model", "best_error"])
    try:
        fp_all = store.store_fingerprint(platform_id, store_path=store_path)
    except Exception:  # noqa: BLE001
        fp_all = None

    kernel_platform = plat.kernel_models == platform_id and plat.op_models != platform_id
    if ops_only is None and kernel_platform:
        ops_only = KERNEL_TABLE_OPS
    jobs: list[tuple[str, str, str | None]] = []
    for (op, ps), _ in opdf.groupby(["op", "pass"], sort=True):
        if op in ops.OPS and ps in ops.OPS[op].passes and (ops_only is None or op in ops_only):
            jobs.append(("op", op, ps))
    grid = opdf[(opdf["op"] == "gemm") & (opdf["pass"] == "fwd")]
    for f in ops.FORMAT_GEMMS.values():
        if (grid["dtype"] == f.table_dtype).any() and (ops_only is None or f.op in ops_only):
            jobs.append(("op", f.op, "fwd"))
    if ops_only is None:
        for c in sorted(coll["collective"].unique()) if len(coll) else []:
            if c in ops.COLLECTIVES:
                jobs.append(("collective", c, None))
    total = len(jobs)
    rows: list[dict[str, Any]] = []
    written: set[str] = set()
    for i, (kind, name, ps) in enumerate(jobs):
        t0 = time.time()
        label = f"{name}.{ps}" if kind == "op" else f"collective.{name}"
        if progress:
            progress(i, total, f"training {platform_id} {label}")

        def sub(msg: str, _i=i) -> None:
            if progress:
                progress(_i, total, msg)
        model: OpRegressor | CollectiveRegressor
        if kind == "op":
            assert ps is not None  # op jobs name their pass
            fmt = _FORMAT_BY_OP.get(name)
            if fmt is not None:  # the gemm grid's rows of one low-precision dtype, under the format's peak
                g, n_power = _drop_power_monitored(grid[grid["dtype"] == fmt.table_dtype])
                main, same = fmt.roofline_precision, pd.Series(True, index=g.index)
            else:
                g, n_power = _drop_power_monitored(opdf[(opdf["op"] == name) & (opdf["pass"] == ps)])
                dtypes = g["dtype"].fillna("fp16").astype(str)
                main = _training_dtype(dtypes)
                same = dtypes.map(_SAME_ROOFLINE).fillna(dtypes) == _SAME_ROOFLINE.get(main, main)
                g = g[same.to_numpy()]
            groups = g["variant"].fillna("-").astype(str).to_numpy() if name == "optimizer" else None
            model = op_regressor_for(name, ps, g).fit(g, g["duration_s"].to_numpy(), device, main,
                                                      cv_folds=cv_folds, groups=groups, progress=sub)
            pe = perr[(perr["kind"] == "operator") & (perr["op"] == name) & (perr["pass"] == ps)]
            if name == "optimizer":
                by = {_PAPER_OPT_GROUP.get(r.paper_function, r.paper_function): float(r.best_error)
                      for r in pe.itertuples()}
                counts = {k: int(v) for k, v in pd.Series(groups).value_counts().items()}
            else:
                by = {r.paper_function: float(r.best_error) for r in pe.itertuples()}
                counts = {k: len(g) for k in by}
            paper_err = _weighted_paper_error(by, counts) if by else None
            cmp_ = _mape_over_groups(model.cv_, by) if name == "optimizer" else model.cv_mape_
            best = {"grid_best_flops": grid_best_flops(g),
                    "grid_best_note": "max 2mnk / seconds over the grid's rows: the throughput cap of every GEMM "
                                      "it times (training.grid_best_flops)"} if name in F.GRID_GEMM_OPS else {}
            fixed = {} if fmt is None else {
                "grid_fixed_overhead_s": grid_fixed_overhead_s(grid, fmt.table_dtype),
                "grid_fixed_overhead_note": "median (format - bf16) seconds of the shapes both grids timed with "
                                            "<= 1 GFLOP: the grid's per-call input-quantize latency, taken out of "
                                            "each GEMM it times (training.grid_fixed_overhead_s)"}
            held = {"block_heldout": block_heldout_error(name, g, device, main)} if kernel_platform else {}
            extra = {"platform": platform_id, "cv_mape_paper_groups": cmp_, **_provenance(g, store_path), **fixed,
                     **best, **held,
                     "dtype_excluded": int((~same).sum()), "power_monitored_excluded": n_power,
                     "paper_best_error": paper_err, "paper_errors_by_group": by,
                     "paper_best_model": sorted(set(pe["best_model"].dropna().astype(str))) or None,
                     "paper_error_note": "paper Best_error% (a fraction): MAPE of its best regressor on a random "
                                         "hold-out split; for pooled models the row-weighted mean over groups",
                     "store_fingerprint": fp_all}
            model.save(pdir, **extra)
            n_samples, stem = len(g), f"{name}.{ps}"
        else:
            g = coll[coll["collective"] == name]
            groups = np.array([_collective_group(s, name, n, k) for s, n, k in
                               zip(g["source"], g["nodes"], g["gpus_per_node"])], dtype=object)
            model = CollectiveRegressor(name).fit(g["message_bytes"].to_numpy(), g["nodes"].to_numpy(),
                                                  g["gpus_per_node"].to_numpy(), g["duration_s"].to_numpy(), plat,
                                                  cv_folds=cv_folds, groups=groups, progress=sub)
            pe = perr[(perr["kind"] == "nccl") & (perr["op"] == name)]
            by, pooled = {}, {}
            for r in pe.itertuples():
                if pd.isna(r.nodes) or pd.isna(r.gpus_per_node):
                    pooled[r.paper_function] = float(r.best_error)
                else:
                    by[f"{r.paper_function}@{int(r.nodes)}x{int(r.gpus_per_node)}"] = float(r.best_error)
            counts = {k: int(v) for k, v in pd.Series(groups).value_counts().items()}
            paper_err = _weighted_paper_error(by, counts) if by else None
            cmp_ = _mape_over_groups(model.cv_, by)
            extra = {**_provenance(g, store_path), "cv_mape_paper_groups": cmp_, "paper_best_error": paper_err,
                     "paper_errors_by_group": by,
                     "paper_pooled_errors": pooled,
                     "paper_error_note": "paper Best_error% per (function, topology); paper_best_error is the "
                                         "row-weighted mean over the topologies this model covers",
                     "store_fingerprint": fp_all}
            model.save(pdir, **extra)
            n_samples, stem = len(g), f"collective.{name}"
        written.add(stem)
        rows.append({"kind": kind, "op": name, "pass": ps, "n_samples": n_samples,
                     "n_outliers_removed": model.n_outliers_removed_, "cv_mape": model.cv_mape_,
                     "cv_median_ape": model.cv_median_ape_, "cv_mape_clean": model.cv_mape_clean_,
                     "mape_all_rows": model.mape_all_rows_, "cv_mape_paper_groups": cmp_,
                     "paper_best_error": paper_err, "reliable": model.reliable_,
                     "seconds": round(time.time() - t0, 2), "warnings": "; ".join(model.warnings_)})
    if ops_only is None and pdir.is_dir():
        # remove stale regressors of this platform only (other modules keep files here, e.g. network.json)
        ours = {f"{o}.{ps}" for o, i in ops.OPS.items() for ps in i.passes} | \
            {f"collective.{c}" for c in ops.COLLECTIVES}
        # the .txt first: a removal cut short leaves a .json alone, which the model check reports
        for p in list(pdir.glob("*.txt")) + list(pdir.glob("*.json")):
            if p.stem in ours and p.stem not in written:
                p.unlink()
    if progress:
        progress(total, total, f"trained {total} models for {platform_id}")
    if write_readme:
        write_models_readme(out_dir)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- README
def _pct(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else f"{100 * float(v):.1f}%"


def models_summary(models_dir=None) -> pd.DataFrame:
    """One row per saved model (from the JSON metadata)."""
    d = Path(models_dir) if models_dir is not None else MODELS_DIR
    rows = []
    for p in sorted(d.glob("*/*.json")):
        try:
            m = read_json_checked(p)
        except ArtifactError:
            continue  # unreadable: the model check reports it (ModelBank.problems, check_models_store)
        if not isinstance(m, dict) or m.get("kind") not in ("op", "collective") or not p.with_suffix(".txt").exists():
            continue  # not a regressor (e.g. network.json of the network model)
        rows.append({"platform": p.parent.name, "kind": m.get("kind"),
                     "model": m.get("op") or m.get("collective"), "pass": m.get("pass") or "",
                     "n_samples": m.get("n_samples"), "n_outliers_removed": m.get("n_outliers_removed"),
                     "cv_mape": m.get("cv_mape"), "cv_median_ape": m.get("cv_median_ape"),
                     "cv_mape_clean": m.get("cv_mape_clean"), "mape_all_rows": m.get("mape_all_rows"),
                     "cv_mape_paper_groups": m.get("cv_mape_paper_groups"),
                     "paper_best_error": m.get("paper_best_error"), "reliable": m.get("reliable", True),
                     "licence": m.get("licence"),
                     "source": m.get("source"), "warnings": len(m.get("warnings") or []),
                     "trained_at": m.get("trained_at"), "data_hash": m.get("data_hash")})
    return pd.DataFrame(rows)


def model_metadata(platform_id: str, models_dir=None) -> dict[str, dict[str, Any]]:
    """stem -> the JSON metadata of each trained model of a platform (a sidecar whose .txt exists; an
    unreadable one is left out: the model check reports it)."""
    d = Path(models_dir) if models_dir is not None else MODELS_DIR
    out: dict[str, dict[str, Any]] = {}
    for p in sorted((d / platform_id).glob("*.json")):
        if not p.with_suffix(".txt").exists():
            continue
        try:
            m = read_json_checked(p)
        except ArtifactError:
            continue
        if isinstance(m, dict):
            out[p.stem] = m
    return out


def write_models_readme(models_dir=None) -> Path:
    """(Re)generate `<models_dir>/README.md` from the saved metadata, so it always matches the files."""
    d = Path(models_dir) if models_dir is not None else MODELS_DIR
    d.mkdir(parents=True, exist_ok=True)
    s = models_summary(d)
    regressors = {(r.platform, f"{r.model}.{r._4}" if r.kind == "op" else f"collective.{r.model}")
                  for r in s.itertuples()} if len(s) else set()
    size = sum(p.stat().st_size for p in d.glob("*/*") if p.is_file() and p.suffix in (".txt", ".json")
               and (p.parent.name, p.stem) in regressors)
    lines = ["# models_store", "",
             "Generated by `predictor.calibrate.training.write_models_readme()` from the `*.json` metadata; "
             "do not edit by hand.",
             "", "Each model is a LightGBM text file `<op>.<pass>.txt` (or `collective.<name>.txt`) plus a JSON",
             "metadata file: features, target (`log(duration / roofline)`), sample counts, outlier filtering,",
             "data hash, K-fold CV error, library versions, provenance and licence of the samples, and the",
             "sha256, size and tree count of the `.txt` (`model_file`), checked before LightGBM reads it. No pickle.",
             "", f"Regressors: {len(s)} models, {size / 1e6:.2f} MB (other files here, e.g. `<platform>/network.json`,",
             "belong to other modules and are not listed).", ""]
    if len(s):
        for (pid,), grp in s.groupby(["platform"]):
            srcs = sorted(set(grp["source"].dropna()))
            lics = sorted(set(grp["licence"].dropna()))
            lines += [f"## {pid}", "", f"- samples: {int(grp['n_samples'].sum()):,} rows; "
                      f"source: {'; '.join(srcs)}; licence: {', '.join(lics)}",
                      f"- trained: {min(grp['trained_at'].dropna(), default='?')} .. "
                      f"{max(grp['trained_at'].dropna(), default='?')}", "",
                      "| model | pass | samples | outliers removed | CV MAPE | CV MAPE (clean) | MAPE all rows | "
                      "CV MAPE (paper's groups) | paper Best_error | reliable |",
                      "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
            for r in grp.sort_values(["kind", "model", "pass"], ascending=[False, True, True]).itertuples():
                name = r.model if r.kind == "op" else f"collective {r.model}"
                lines.append(f"| {name} | {r._4} | {r.n_samples} | {r.n_outliers_removed} | {_pct(r.cv_mape)} | "
                             f"{_pct(r.cv_mape_clean)} | {_pct(r.mape_all_rows)} | {_pct(r.cv_mape_paper_groups)} | "
                             f"{_pct(r.paper_best_error)} | {'yes' if r.reliable else 'NO (see warnings)'} |")
            lines.append("")
        lines += ["CV MAPE: 5-fold shuffled KFold on the rows kept after deduplication and the physical bound, the",
                  "residual filter fit inside each training fold, scored on all held-out rows. CV MAPE (clean)",
                  "leaves out the rows the residual filter flags; MAPE all rows adds the physically impossible rows",
                  "(predicted by the final model). CV MAPE (paper's groups) scores only the groups the paper reports",
                  "(optimizer: first/middle/last stage, not `whole`; collectives: the sampled topologies) and is the",
                  "number to compare with the paper's Best_error (its row-weighted mean over those groups).",
                  "A model is marked unreliable when more than 20% of its samples are faster than physically",
                  "possible (see each JSON's `outlier_filter` and `warnings`).", ""]
    return write_text_atomic(d / "README.md", "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m predictor.calibrate.training", description=__doc__.splitlines()[0])
    ap.add_argument("platforms", nargs="+")
    ap.add_argument("--store", default=None)
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--folds", type=int, default=5)
    a = ap.parse_args(argv)

    def prog(done: int, total: int, msg: str) -> None:
        print(f"[{done}/{total}] {msg}", file=sys.stderr, flush=True)
    for pid in a.platforms:
        df = train_platform(pid, store_path=a.store, models_dir=a.models_dir, progress=prog, cv_folds=a.folds)
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(df.drop(columns=["warnings"]).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# --------------------------------------------------------------------------- integrity
def _platform_dirs(models_dir, platforms) -> list[Path]:
    d = Path(models_dir) if models_dir is not None else MODELS_DIR
    if platforms:
        return [d / p for p in platforms]
    return sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")) if d.is_dir() else []


def seal_model_sidecars(models_dir=None, platforms: tuple[str, ...] | list[str] | None = None) -> list[str]:
    """Add the `model_file` record (sha256, size and tree count of the .txt as it is on disk) to every
    regressor sidecar that has none, WITHOUT retraining: models written before sidecars carried a hash
    then get the full check (hash included) instead of the structural one. Deterministic (no
    timestamp; the JSON is rewritten with the layout `save` uses, keys in order, the record last) and
    atomic per file. A pair whose sidecar or text fails its check is refused with ArtifactError and
    nothing of it is written: a hash must never bless a broken file. Returns 'platform/stem' sealed.

        python -c "from predictor.calibrate.training import seal_model_sidecars as s; print(s())"
    """
    sealed = []
    for pdir in _platform_dirs(models_dir, platforms):
        for txt in sorted(pdir.glob("*.txt")):
            meta = txt.with_suffix(".json")
            md = read_json_checked(meta)
            if not isinstance(md, dict) or md.get("kind") not in ("op", "collective") or MODEL_FILE_KEY in md:
                continue
            check_model_metadata(meta, md, txt.stem, pdir.name)
            data = txt.read_bytes()
            try:
                n, names = check_model_text(data.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                raise ArtifactError(txt, None, f"not sealed: not a complete LightGBM model ({e})") from None
            if names != md["feature_names"]:
                raise ArtifactError(txt, "feature_names", "not sealed: the model's features differ from its sidecar's")
            md[MODEL_FILE_KEY] = model_file_record(txt.stem, data, n)
            write_bytes_atomic(meta, (json.dumps(md, indent=1) + "\n").encode())
            sealed.append(f"{pdir.name}/{txt.stem}")
    return sealed


def check_models_store(models_dir=None) -> list[str]:
    """Every problem of every file the predictor reads from the models folder, one line each naming
    the file (and field): each platform's regressors (`regressors.check_models`), host_overhead.json,
    network.json, speed_check.json and validation.json, and the folder's transfer_validation.json and
    network_validation.json. Empty when everything passes (models without a hash count as passing;
    `ModelBank.unhashed` lists them)."""
    from predictor.hardware.network import load_network_file_checked, load_network_validation_checked
    from predictor.hardware.speed import load_speed_check_checked
    from predictor.model.errors import InfeasibleConfig
    from predictor.paths import load_platform_validation_checked
    from predictor.regress.regressors import check_models
    from predictor.regress.transfer import load_validation_checked
    from predictor.step.overhead import load_host_overhead_checked

    d = Path(models_dir) if models_dir is not None else MODELS_DIR
    out: list[str] = []
    for pdir in _platform_dirs(d, None):
        pid = pdir.name
        _, problems = check_models(pdir, pid)
        out += [p.reason for p in problems]
        try:
            vwarn = load_platform_validation_checked(pid, d)[1]
        except InfeasibleConfig as e:  # a folder whose name is no platform id
            vwarn = f"{pdir}: not a platform folder ({e})"
        for warn in (load_host_overhead_checked(d, pid)[1], load_network_file_checked(pdir / "network.json")[1],
                     load_speed_check_checked(d, pid)[1], vwarn):
            if warn:
                out.append(warn)
    for warn in (load_validation_checked(d)[1], load_network_validation_checked(d)[1]):
        if warn:
            out.append(warn)
    return out

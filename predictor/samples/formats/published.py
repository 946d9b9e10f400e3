"""Published multi-node runs (llm-foundry, BLOOM / Megatron-DeepSpeed): the per-source rules that turn a
published row into a measured run."""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pandas as pd

from predictor.model.errors import InfeasibleConfig
from predictor.model.specs import (
    ModelSpec,
)
from predictor.samples.formats.common import (
    MEASURED_RUN_COLUMNS,
    MEASURED_RUN_INT_COLUMNS,
    PUBLISHED_COLUMNS,
    PUBLISHED_RULE_NAMES,
    FilePlan,
    ParsedFile,
    _finish,
    read_frame,
    relative_source,
    require_columns,
    row_lines,
    row_problems,
    start_checks,
)
from predictor.samples.formats.project import _run_rejections
from predictor.samples.formats.sources import load_source_definitions, match_source


class _Skip(Exception):
    """A published row that lacks a field the predictor needs (counted, never guessed)."""

    def __init__(self, fields: list[str], reason: str | None = None):
        self.reason = reason or f"{', '.join(fields)} not stated"
        super().__init__(self.reason)


class _Reject(Exception):
    """A published row that contradicts itself or its source definition."""

    def __init__(self, reason: str, detail: str):
        self.reason, self.detail = reason, detail
        super().__init__(detail)


def _cell_num(row: dict[str, Any], name: str) -> float | None:
    v = row.get(name)
    if v is None:
        return None
    try:
        f = float(str(v).replace(",", "")) if not isinstance(v, (int, float)) else float(v)
    except ValueError:
        raise _Reject(f"{name} not a number", f"{name}={v!r} is not a number") from None
    return f if math.isfinite(f) else None


def _cell_int(row: dict[str, Any], name: str) -> int | None:
    f = _cell_num(row, name)
    if f is None:
        return None
    if f != int(f) or f <= 0 or f > 2 ** 31 - 1:  # the store's INTEGER columns
        raise _Reject(f"{name} not a positive integer", f"{name}={row.get(name)!r} is not a positive integer "
                                                        f"<= {2 ** 31 - 1:,}")
    return int(f)


def _note(notes: str, key: str) -> str | None:
    """The value of `key=value` in a row's notes ('; '-separated)."""
    m = re.search(rf"(?:^|;\s*){re.escape(key)}=([^;]*)", notes or "")
    return m.group(1).strip() if m else None


def _fact(defn: dict[str, Any], name: str) -> Any:
    return defn["facts"][name]["value"]


def _section(source: str) -> str | None:
    m = re.search(r"section '([^']+)'", source or "") or re.search(r"(#+ [^#]+)$", source or "")
    return m.group(1).strip() if m else None


def _published_platform(defn: dict[str, Any], gpu: str | None, checked: dict[str, Any]) -> Any:
    from predictor.hardware.platforms import get_platform
    pid = (defn.get("platform_by_gpu") or {}).get(gpu or "")
    if pid is None:
        raise _Reject("gpu without a platform", f"gpu {gpu!r} is not mapped to a platform in "
                                                 f"published_sources.json sources.{defn['source_id']}.platform_by_gpu "
                                                 f"(known: {', '.join(defn.get('platform_by_gpu') or {}) or 'none'})")
    if pid not in checked:
        checked[pid] = get_platform(pid)  # a bad cluster entry raises InfeasibleConfig naming the field
    return checked[pid]


def _layout_checks(platform: Any, rec: dict[str, Any], gpn_row: int | None) -> None:
    """A published run must fit the platform it names and be a valid predictor layout."""
    if gpn_row is not None and gpn_row != platform.gpus_per_node:
        raise _Reject("contradictory layout: gpus_per_node",
                      f"gpus_per_node={gpn_row} but platform {platform.platform_id} has {platform.gpus_per_node}")
    if rec["num_gpus"] > platform.gpus_per_node and platform.inter_node.bandwidth_gbps <= 0:
        raise InfeasibleConfig(f"clusters.json:{platform.platform_id}.inter_node.bandwidth_gbps",
                               f"is missing or not positive, but measured runs on {platform.platform_id} span "
                               f"{-(-rec['num_gpus'] // platform.gpus_per_node)} nodes.",
                               "give the per-GPU, one-direction network GB/s of the cluster (400 Gb/s = 50).")
    m = ModelSpec(name="published", arch=rec["arch"], num_layers=rec["layers"], hidden_size=rec["hidden"],
                  num_heads=rec["heads"], num_kv_heads=rec["kv_heads"], ffn_hidden_size=rec["ffn_hidden"],
                  vocab_size=rec["vocab"], attention_impl=rec["attention"])
    from predictor.model.specs import Layout
    L = Layout(num_gpus=rec["num_gpus"], tp=rec["tp"], pp=rec["pp"], dp=rec["dp"], micro_batch=rec["micro_batch"],
               global_batch=rec["global_batch"], seq_len=rec["seq_len"], vpp=rec["vpp"], schedule=rec["schedule"],
               recompute=rec["recompute"], sequence_parallel=rec["sequence_parallel"], zero_stage=rec["zero_stage"],
               precision=rec["precision"])
    try:
        L.validate(m)
    except InfeasibleConfig as e:
        raise _Reject(f"contradictory layout: {e.field}", str(e)) from None


def _common_fields(row: dict[str, Any], required: dict[str, Any]) -> dict[str, Any]:
    missing = [name for name, v in required.items() if v is None]
    if missing:
        raise _Skip(missing)
    return required


def _step_time(defn: dict[str, Any], row: dict[str, Any], gb: int, seq: int) -> tuple[float, str]:
    metric = str(row.get("measured_metric") or "").strip()
    spec = (defn.get("metrics") or {}).get(metric)
    if spec is None:
        raise _Reject("unknown measured_metric", f"measured_metric={metric!r}; this source defines "
                                                  f"{', '.join(defn.get('metrics') or {}) or 'none'}")
    unit = str(row.get("unit") or "").strip()
    if spec.get("unit") and unit != spec["unit"]:
        raise _Reject("unexpected unit", f"unit={unit!r} for {metric}; expected {spec['unit']!r}")
    value = _cell_num(row, "measured_value")
    if value is None:
        raise _Skip(["measured_value"])
    if value <= 0:
        raise _Reject("measured_value not positive", f"measured_value={value:g} is not positive")
    if metric == "tokens_per_sec":
        return gb * seq / value, f"step time = global_batch*seq_len/tokens_per_sec = {gb}*{seq}/{value:g}"
    if metric == "iteration_time":
        return value, "step time = iteration_time as reported"
    raise _Reject("unknown measured_metric", f"no step-time rule for measured_metric={metric!r}")


def _rules_llm_foundry(row: dict[str, Any], defn: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """MosaicML llm-foundry benchmark rows: PyTorch FSDP FULL_SHARD, MPT (GPT-style) models."""
    notes = str(row.get("notes") or "")
    f = _common_fields(row, {
        "layers": _cell_int(row, "layers"), "hidden": _cell_int(row, "hidden"), "heads": _cell_int(row, "heads"),
        "ffn_hidden": _cell_int(row, "ffn_hidden"), "seq_len": _cell_int(row, "seq_len"),
        "vocab": _cell_int(row, "vocab"), "num_gpus": _cell_int(row, "num_gpus"),
        "micro_batch": _cell_int(row, "micro_batch"), "global_batch": _cell_int(row, "global_batch"),
        "precision": row.get("precision"), "recompute": row.get("recompute"), "gpu": row.get("gpu")})
    out = []
    precision = (defn.get("precision") or {}).get(str(f["precision"]).strip())
    if precision is None:
        raise _Reject("unknown precision", f"precision={f['precision']!r}; this source maps "
                                            f"{', '.join(defn.get('precision') or {})}")
    recompute = (defn.get("recompute") or {}).get(str(f["recompute"]).strip())
    if recompute is None:
        raise _Reject("unknown recompute", f"recompute={f['recompute']!r}; this source maps "
                                            f"{', '.join(defn.get('recompute') or {})}")
    n = f["num_gpus"]
    tp, pp = _cell_int(row, "tp") or 1, _cell_int(row, "pp") or 1
    dp_row = _cell_int(row, "dp")
    if (tp, pp) != (1, 1):
        raise _Reject("contradictory layout: tp/pp", f"tp={tp}, pp={pp}, but FSDP FULL_SHARD runs are pure data "
                                                      f"parallel (tp = pp = 1)")
    dp = n  # FSDP: every rank is a data-parallel replica holding a shard
    if dp_row is not None and dp_row != dp:
        raise _Reject("contradictory layout: dp", f"dp={dp_row} but FSDP FULL_SHARD over {n} GPUs has dp = num_gpus")
    sharding = _note(notes, "FSDP sharding")
    if sharding is not None and sharding != "FULL_SHARD":
        raise _Reject("unexpected FSDP sharding", f"notes say FSDP sharding={sharding}; this source definition "
                                                  f"covers FULL_SHARD (zero_stage 3) only")
    gb, mb = f["global_batch"], f["micro_batch"]
    ga = _note(notes, "GradAccum")
    if ga is not None:
        if not ga.isdigit() or int(ga) * mb * dp != gb:
            raise _Reject("contradictory: GradAccum",
                          f"GradAccum={ga} but global_batch/(micro_batch*dp) = {gb}/({mb}*{dp}) = {gb / (mb * dp):g}")
        out.append(f"GradAccum={ga} = global_batch/(micro_batch*dp) checked")
    mfu, hfu = _note(notes, "MFU"), _note(notes, "HFU")
    chk = defn.get("checks", {}).get("hfu_over_mfu")
    if chk and mfu and hfu:
        ratio = float(hfu) / float(mfu)
        want = chk[recompute]
        if abs(ratio / want - 1) > chk["tolerance"]:
            raise _Reject("contradictory: recompute vs HFU/MFU",
                          f"recompute={recompute} expects HFU/MFU = {want:.4g} but HFU/MFU = {hfu}/{mfu} = {ratio:.4g}")
        out.append(f"HFU/MFU = {ratio:.4f} agrees with recompute={recompute}")
    step, how = _step_time(defn, row, gb, f["seq_len"])
    derived = _note(notes, "derived_step_time_s")
    tol = defn.get("checks", {}).get("derived_step_time", {}).get("tolerance")
    if derived is not None and tol is not None and abs(step / float(derived) - 1) > tol:
        raise _Reject("contradictory: step time", f"{how} = {step:.6g} s but the notes derive {derived} s")
    out.append(how)
    rec = {"arch": _fact(defn, "arch"), "layers": f["layers"], "hidden": f["hidden"], "heads": f["heads"],
           "kv_heads": f["heads"], "ffn_hidden": f["ffn_hidden"], "vocab": f["vocab"], "seq_len": f["seq_len"],
           "num_gpus": n, "tp": 1, "pp": 1, "dp": dp, "micro_batch": mb, "global_batch": gb,
           "vpp": _fact(defn, "vpp"), "schedule": _fact(defn, "schedule"), "recompute": recompute,
           "sequence_parallel": _fact(defn, "sequence_parallel"), "zero_stage": _fact(defn, "zero_stage"),
           "precision": precision, "attention": _fact(defn, "attention"), "step_time_s": step}
    return rec, out


def megatron_tflops(gb: int, seq: int, layers: int, hidden: int, vocab: int, time_s: float, gpus: int,
                    ckpt_factor: int, corrected: bool = True) -> float:
    """Megatron-DeepSpeed's reported TFLOPs per GPU. `corrected`: the formula of
    bigscience-workshop/Megatron-DeepSpeed PR 251 (24*ckpt*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h)));
    False: the estimate used before it (without the attention / logit term), which reproduces the
    TFLOPs the BLOOM chronicles report before its section 'TFLOPs calculation improved'."""
    flops: float = 24 * ckpt_factor * gb * seq * layers * hidden ** 2
    if corrected:
        flops *= 1 + seq / (6 * hidden) + vocab / (16 * layers * hidden)
    return flops / (time_s * gpus * 1e12)


def _rules_megatron_deepspeed(row: dict[str, Any], defn: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """BigScience BLOOM-176B prequel rows: Megatron-DeepSpeed, ZeRO-1, 3D parallelism."""
    notes = str(row.get("notes") or "")
    source = str(row.get("source") or "")
    precision_raw = str(row.get("precision") or "").strip()
    precision, precision_how = None, ""
    if precision_raw:
        precision = (defn.get("precision") or {}).get(precision_raw)
        if precision is None:
            raise _Reject("unknown precision", f"precision={precision_raw!r}; this source maps "
                                                f"{', '.join(defn.get('precision') or {})}")
        precision_how = f"precision={precision} (row: {precision_raw!r})"
    else:
        stated = (defn.get("precision_by_section") or {}).get(_section(source) or "")
        if stated:
            precision = stated["value"]
            precision_how = f"precision={precision} (document: {stated['cite']})"
    vocab = _fact(defn, "vocab")
    padded = re.search(r"\(([\d,]+) padded\)", notes)
    if padded is None:
        raise _Skip(["padded vocab"])
    if int(padded.group(1).replace(",", "")) != vocab:
        raise _Reject("contradictory: vocab", f"notes say the vocab is padded to {padded.group(1)}, the source "
                                               f"definition says {vocab}")
    f = _common_fields(row, {
        "layers": _cell_int(row, "layers"), "hidden": _cell_int(row, "hidden"), "heads": _cell_int(row, "heads"),
        "seq_len": _cell_int(row, "seq_len"), "num_gpus": _cell_int(row, "num_gpus"), "tp": _cell_int(row, "tp"),
        "pp": _cell_int(row, "pp"), "dp": _cell_int(row, "dp"), "micro_batch": _cell_int(row, "micro_batch"),
        "global_batch": _cell_int(row, "global_batch"), "precision": precision})
    out = [precision_how]
    ffn = _cell_int(row, "ffn_hidden")
    if ffn is not None and ffn != 4 * f["hidden"]:
        raise _Reject("contradictory: ffn_hidden", f"ffn_hidden={ffn} but this source's MLP is 4*hidden")
    zero = _fact(defn, "zero_stage")
    zs = _note(notes, "ZeRO_stage")
    if zs is not None:
        if zs not in ("0", "1"):
            raise _Reject("unexpected ZeRO stage", f"notes say ZeRO_stage={zs}")
        zero = int(zs)
        out.append(f"zero_stage={zero} (notes)")
    gb, seq, n = f["global_batch"], f["seq_len"], f["num_gpus"]
    step, how = _step_time(defn, row, gb, seq)
    out.append(how)
    # recompute: the notes say the reported TFLOPs count activation recompute (factor 4); verify it
    tf = _note(notes, "TFLOPs")
    chk = defn["checks"]["tflops"]
    if tf is None:
        raise _Skip([], "recompute not verifiable (TFLOPs not stated)")
    reported = float(tf)
    fits = {}
    for factor, label in ((chk["ckpt_factor_recompute"], "full"), (chk["ckpt_factor_none"], "none")):
        for corrected in (True, False):
            t = megatron_tflops(gb, seq, f["layers"], f["hidden"], vocab, step, n, factor, corrected)
            fits[(label, corrected)] = t
    ok = [(k, t) for k, t in fits.items() if abs(reported / t - 1) <= chk["tolerance"]]
    if not any(k[0] == "full" for k, _ in ok):
        best = min(fits.items(), key=lambda kv: abs(reported / kv[1] - 1))
        if best[0][0] == "none" and abs(reported / best[1] - 1) <= chk["tolerance"]:
            raise _Reject("contradictory: recompute vs TFLOPs",
                          f"reported TFLOPs={reported:g} matches no recompute (factor 3: {best[1]:.2f}), "
                          f"but the notes say the TFLOPs count activation recompute")
        full_pr, full_old = fits[("full", True)], fits[("full", False)]
        raise _Reject("recompute not verified by the reported TFLOPs",
                      f"reported TFLOPs={reported:g}; recomputed with factor 4: {full_pr:.2f} (PR-251 formula), "
                      f"{full_old:.2f} (earlier estimate); factor 3: {fits[('none', True)]:.2f}; "
                      f"tolerance {chk['tolerance']:.0%}")
    (label, corrected), t = next((k, t) for k, t in ok if k[0] == "full")
    out.append(f"recompute=full: reported TFLOPs {reported:g} = {t:.2f} recomputed with ckpt factor "
               f"{chk['ckpt_factor_recompute']} ({'PR-251 formula' if corrected else 'pre-PR-251 estimate'}, "
               f"vocab {vocab})")
    rec = {"arch": _fact(defn, "arch"), "layers": f["layers"], "hidden": f["hidden"], "heads": f["heads"],
           "kv_heads": f["heads"], "ffn_hidden": 4 * f["hidden"], "vocab": vocab, "seq_len": seq,
           "num_gpus": n, "tp": f["tp"], "pp": f["pp"], "dp": f["dp"], "micro_batch": f["micro_batch"],
           "global_batch": gb, "vpp": _fact(defn, "vpp"), "schedule": _fact(defn, "schedule"),
           "recompute": "full", "sequence_parallel": _fact(defn, "sequence_parallel"), "zero_stage": zero,
           "precision": precision, "attention": _fact(defn, "attention"), "step_time_s": step}
    return rec, out


PUBLISHED_RULES: dict[str, Callable[[dict[str, Any], dict[str, Any]], tuple[dict[str, Any], list[str]]]] = {
    "llm-foundry": _rules_llm_foundry, "megatron-deepspeed": _rules_megatron_deepspeed}
assert tuple(PUBLISHED_RULES) == PUBLISHED_RULE_NAMES


def parse_published_runs(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    """Published end-to-end runs (../shared/datasets/published-runs) as measured runs. Each row's
    `source` picks its definition in published_sources.json (framework, platform by gpu, facts
    with citations, the checks that apply). Rows lacking a needed field are skipped with the reason;
    rows that contradict themselves are rejected; a wrong definition or cluster entry stops the
    whole ingest (SourceDefinitionError / InfeasibleConfig)."""
    df = read_frame(data, plan.path)
    require_columns(df, ("source", "gpu", "num_gpus", "measured_metric", "measured_value", "unit", "notes"),
                    plan.path, PUBLISHED_COLUMNS)
    defs = load_source_definitions()
    checks = start_checks(df, plan)
    broken = {i for i, _r, _m in row_problems(df)}
    lines = row_lines(df)
    platforms_checked: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    problems: list[tuple[int, str, str, str]] = []
    sids: list[str | None] = []
    for i, row in enumerate(df.to_dict(orient="records")):
        src = str(row.get("source") or "")
        defn = match_source(defs, row_source=src)
        sids.append(defn["source_id"] if defn else None)
        records.append({})
        if i in broken:
            continue
        if defn is None or not defn.get("rules"):
            problems.append((i, "rejected", "no source definition",
                             f"source {src[:60]!r} matches no entry of published_sources.json"))
            continue
        try:
            rec, how = PUBLISHED_RULES[defn["rules"]](row, defn)
            platform = _published_platform(defn, str(row.get("gpu") or "").strip() or None, platforms_checked)
            _layout_checks(platform, rec, _cell_int(row, "gpus_per_node"))
        except _Skip as s:
            problems.append((i, "skipped", s.reason, s.reason))
            continue
        except _Reject as r:
            problems.append((i, "rejected", r.reason, r.detail))
            continue
        row_notes = str(row.get("notes") or "").strip()
        records[i] = {**rec, "run_id": f"{plan.path.stem}:{lines[i]}", "platform": platform.platform_id,
                      "source": src, "framework": defn["framework"], "source_id": defn["source_id"],
                      "notes": "; ".join([*how, f"row notes: {row_notes}"] if row_notes else how)}
    checks.add_rows(problems)
    out = pd.DataFrame(records, columns=MEASURED_RUN_COLUMNS)
    for c in MEASURED_RUN_INT_COLUMNS + ("zero_stage",):
        out[c] = out[c].astype("Int64")
    out["sequence_parallel"] = out["sequence_parallel"].astype("boolean")
    out["step_time_s"] = out["step_time_s"].astype("float64")
    good = _finish(out, checks)
    platforms: dict[str, tuple[str | None, str | None]] = {}
    for pid, p in platforms_checked.items():
        if pid in set(good["platform"]):
            platforms[pid] = (p.device.name, p.description)
    return ParsedFile(tables={"measured_runs": good}, platforms=platforms,
                      source=f"published-runs:{relative_source(plan.path, plan.root)}",
                      licence=plan.licence or "Apache-2.0 (facts from the repositories each row names)",
                      notes="published end-to-end runs (published_sources.json)",
                      run_rejections=_run_rejections(df, checks, sids), **checks.summary(limit))

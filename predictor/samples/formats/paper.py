"""The paper's sample layout (arXiv 2509.22832, Perlmutter A100 / Vista GH200): operator, optimizer, NCCL and
summary files."""
from __future__ import annotations

import numpy as np
import pandas as pd

from predictor.model import ops
from predictor.model.specs import (
    BYTES_PER_ELEMENT,
    ModelSpec,
    padded_vocab,
)
from predictor.samples.formats.common import (
    PAPER_COLUMN_MAP,
    PAPER_NCCL_COLUMNS,
    PAPER_OP_COLUMNS,
    PAPER_PASS_COLUMNS,
    PAPER_REPO,
    PAPER_STAGE_COLUMNS,
    PAPER_SUMMARY_COLUMNS,
    PAPER_VOCAB,
    PAPER_WHOLE_OPTIMIZER_COLUMNS,
    PUBLISHED_LICENCE,
    FilePlan,
    FormatError,
    ParsedFile,
    RowChecks,
    _duration_checks,
    _finish,
    _num,
    _paper_platform,
    _platform_entry,
    _text,
    read_frame,
    relative_source,
    require_columns,
    row_labels,
    row_problems,
    show,
    start_checks,
)


def paper_stage_params(hidden: int, layers: int, tp: int, variant: str) -> int:
    """Parameters one GPU holds for a GPT-NeoX pipeline stage of `layers` layers.

    Per layer: ModelSpec(arch='gpt').params_per_layer() with the matrix parameters divided
    by tp (12*h^2/tp) and the norm/bias parameters not (13*h). The first stage adds the
    padded vocab embedding / tp, the last stage the LM head / tp and the final LayerNorm.
    """
    full = ModelSpec(name="paper", arch="gpt", num_layers=layers, hidden_size=hidden, num_heads=1).params_per_layer()
    vector = 13 * hidden
    per_layer = (full - vector) // tp + vector
    total = layers * per_layer
    vocab_shard = padded_vocab(PAPER_VOCAB, tp) * hidden // tp
    if variant == "first":
        total += vocab_shard
    elif variant == "last":
        total += vocab_shard + 2 * hidden
    return total


def parse_paper_operator(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    name = plan.info["name"]
    if name not in ops.PAPER_OP_NAMES or name not in PAPER_OP_COLUMNS:
        raise FormatError(f"{plan.path.name}: unknown paper op '{name}'; known: {', '.join(sorted(PAPER_OP_COLUMNS))}")
    op = ops.PAPER_OP_NAMES[name]
    platform, device = _paper_platform(plan)
    df = read_frame(data, plan.path)
    if name == "res_add" and "B_dur(us)" not in df.columns and "F_dur(us)" in df.columns:
        df["B_dur(us)"] = df["F_dur(us)"]  # one measurement for both passes
    shape_cols = PAPER_OP_COLUMNS[name]
    expected = [*shape_cols, "F_dur(us)", "B_dur(us)"]
    require_columns(df, expected, plan.path, expected)
    n = len(df)
    long = pd.concat([df.assign(**{"pass": p, "_dur": df[c], "_durcol": c}) for p, c in PAPER_PASS_COLUMNS],
                     ignore_index=True)
    passes = long["pass"].to_numpy()
    lines = row_labels(df)
    checks = RowChecks(len(long), lambda i: f"{lines[i % max(n, 1)]} ({passes[i]})",
                       problems=[(i + k * n, reason, msg) for k in range(2) for i, reason, msg in row_problems(df)])
    out = pd.DataFrame({"platform": platform, "op": op, "pass": long["pass"]})
    for c in shape_cols:
        out[PAPER_COLUMN_MAP[c]] = checks.positive_int(c, long[c])
    durcols = long["_durcol"].to_numpy()
    raw = long["_dur"]
    v = _num(raw)
    _duration_checks(checks, raw, v, lambda i: durcols[i])
    out["duration_s"] = v * 1e-6
    out["dtype"] = plan.info["dtype"]
    good = _finish(out, checks)
    return _paper_result(plan, {"op_samples": good}, platform, device, checks, limit, f"paper {name} -> {op}")


def parse_paper_optimizer(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    name = plan.info["name"]
    variant = ops.PAPER_OPTIMIZER_FILES[name]
    platform, device = _paper_platform(plan)
    df = read_frame(data, plan.path)
    checks = start_checks(df, plan)
    out = pd.DataFrame({"platform": [platform] * len(df)})
    if variant == "whole":
        require_columns(df, PAPER_WHOLE_OPTIMIZER_COLUMNS, plan.path, PAPER_WHOLE_OPTIMIZER_COLUMNS)
        out["tp"] = pd.array([1] * len(df), dtype="Int64")
        for c in ("num_layers", "hidden_size", "params"):
            out[PAPER_COLUMN_MAP[c]] = checks.positive_int(c, df[c])
        dur_col = "dur"
    else:
        require_columns(df, PAPER_STAGE_COLUMNS, plan.path, PAPER_STAGE_COLUMNS)
        for c in ("mp", "dim", "encoders"):
            out[PAPER_COLUMN_MAP[c]] = checks.positive_int(c, df[c])
        dur_col = "dur(us)"
    v = _num(df[dur_col])
    _duration_checks(checks, df[dur_col], v, lambda i: dur_col)
    out["duration_s"] = v * 1e-6
    out = out.assign(op="optimizer", **{"pass": "step"}, variant=variant, dtype=plan.info["dtype"])
    good = _finish(out, checks)
    if variant != "whole" and len(good):
        good["params"] = pd.array([paper_stage_params(int(h), int(l), int(t), variant)
                                   for h, l, t in zip(good["hidden"], good["layers"], good["tp"])], dtype="Int64")
    return _paper_result(plan, {"op_samples": good}, platform, device, checks, limit,
                         f"paper {name} -> optimizer/{variant}")


def parse_paper_nccl(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    name = plan.info["name"]
    if name not in ops.PAPER_COLLECTIVES:
        raise FormatError(f"{plan.path.name}: unknown paper collective '{name}'; "
                          f"known: {', '.join(sorted(ops.PAPER_COLLECTIVES))}")
    platform, device = _paper_platform(plan)
    df = read_frame(data, plan.path)
    require_columns(df, PAPER_NCCL_COLUMNS, plan.path, PAPER_NCCL_COLUMNS)
    checks = start_checks(df, plan)
    shape = checks.positive_int("shape", df["shape"])
    nodes = checks.positive_int("nodes", df["nodes"])
    gpn = checks.positive_int("GPUsPerNode", df["GPUsPerNode"])
    if plan.info.get("nodes") is not None:
        want = (plan.info["nodes"], plan.info["gpn"])
        nv, gv = nodes.to_numpy(dtype="float64", na_value=np.nan), gpn.to_numpy(dtype="float64", na_value=np.nan)
        mismatch = ~np.isnan(nv) & ~np.isnan(gv) & ((nv != want[0]) | (gv != want[1]))
        checks.add(mismatch, lambda i: f"topology {nv[i]:g}x{gv[i]:g} does not match the file name {want[0]}x{want[1]}",
                   "topology does not match the file name")
    dur = checks.positive_float("dur(us)", df["dur(us)"], 1e-6)
    out = pd.DataFrame({"platform": platform, "collective": ops.PAPER_COLLECTIVES[name],
                        "message_bytes": shape * BYTES_PER_ELEMENT[plan.info["dtype"]], "ranks": nodes * gpn,
                        "nodes": nodes, "gpus_per_node": gpn, "dtype": plan.info["dtype"], "duration_s": dur})
    good = _finish(out, checks)
    return _paper_result(plan, {"collective_samples": good}, platform, device, checks, limit,
                         f"paper {name} -> {ops.PAPER_COLLECTIVES[name]}")


def parse_paper_summary(data: bytes, plan: FilePlan, limit: int) -> ParsedFile:
    df = read_frame(data, plan.path)
    kind = "nccl" if "Nodes" in df.columns else "operator"
    expected = PAPER_SUMMARY_COLUMNS[kind]
    require_columns(df, expected, plan.path, expected)
    plan.info.setdefault("device", df["GPU"].dropna().iloc[0] if df["GPU"].notna().any() else None)
    platform, device = _paper_platform(plan)
    checks = start_checks(df, plan)
    func = _text(df["Function"])
    if kind == "operator":
        names = {**ops.PAPER_OP_NAMES, **dict.fromkeys(ops.PAPER_OPTIMIZER_FILES, "optimizer")}
        checks.member("function", func, names)
        prop = _text(df["Propagation"])
        checks.member("propagation", prop, ("fwd", "bwd", "dur"))
        out = pd.DataFrame({"op": func.map(names), "pass": prop.map({"fwd": "fwd", "bwd": "bwd", "dur": "step"}),
                            "nodes": pd.array([None] * len(df), dtype="Int64")})
        out["gpus_per_node"] = out["nodes"]
    else:
        checks.member("function", func, ops.PAPER_COLLECTIVES)
        nodes = checks.positive_int("Nodes", df["Nodes"], minimum=0)
        gpn = checks.positive_int("GPUsPerNode", df["GPUsPerNode"], minimum=0)
        pooled = (nodes == 0) | (gpn == 0)  # 0,0 = the regressor over all topologies pooled
        out = pd.DataFrame({"op": func.map(ops.PAPER_COLLECTIVES), "pass": None,
                            "nodes": nodes.mask(pooled), "gpus_per_node": gpn.mask(pooled)})
    err = _num(df["Best_error%"])
    vals = df["Best_error%"].to_numpy()
    checks.add(~(np.isfinite(err) & (err >= 0)), lambda i: f"Best_error%={show(vals[i])} is not a non-negative number",
               "Best_error% not a non-negative number")
    out = out.assign(platform=platform, kind=kind, paper_function=func, best_model=_text(df["Best_model"]),
                     best_error=err)
    good = _finish(out, checks)
    return _paper_result(plan, {"paper_errors": good}, platform, device, checks, limit, f"paper {kind} error summary")


def _paper_result(plan: FilePlan, tables: dict[str, pd.DataFrame], platform: str, device: str | None,
                  checks: RowChecks, limit: int, notes: str) -> ParsedFile:
    source = f"{PAPER_REPO}:{relative_source(plan.path, plan.root)}"
    for name, df in tables.items():
        if name != "paper_errors":
            df["source"] = source
    return ParsedFile(tables=tables, platforms=_platform_entry(platform, device), source=source,
                      licence=plan.licence or PUBLISHED_LICENCE, notes=f"{notes} on {platform}",
                      **checks.summary(limit))

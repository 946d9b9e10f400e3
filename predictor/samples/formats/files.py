"""Which files an ingest reads and as what (planning, format detection), and the entry points: parse one planned
file, preview an ingest."""
from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from predictor.model import ops
from predictor.model.errors import InfeasibleConfig
from predictor.samples.formats import aiconfigurator, liger
from predictor.samples.formats.common import (
    _PAPER_FILE,
    _VTRAIN_LUT,
    DATA_SUFFIXES,
    KINDS,
    KNOWN_LAYOUTS,
    PAPER_DEVICES,
    FilePlan,
    FormatError,
    ParsedFile,
    SourceDefinitionError,
)
from predictor.samples.formats.paper import (
    parse_paper_nccl,
    parse_paper_operator,
    parse_paper_optimizer,
    parse_paper_summary,
)
from predictor.samples.formats.project import parse_collective_samples, parse_measured_runs, parse_op_samples
from predictor.samples.formats.published import parse_published_runs
from predictor.samples.formats.vtrain import parse_vtrain, parse_vtrain_allreduce_lut


def plan_files(path: Path, *, kind: str | None = None, platform: str | None = None,
               licence: str | None = None) -> list[FilePlan]:
    """List the data files under `path` (a file or a directory, recursively) with their kind.

    A directory holding `manifest.json` gives its files the manifest's platform/source/licence
    (explicit arguments win). Pooled paper NCCL files are skipped when per-topology files exist.
    A file named explicitly whose layout is unknown is rejected; one found in a directory is skipped
    (with the reason), since directories may hold other CSVs.
    """
    path = Path(path)
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown kind '{kind}'; use one of {', '.join(KINDS)}")
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {path}")
    explicit = path.is_file()
    files = [path] if explicit else sorted(
        p for p in path.rglob("*") if p.is_file() and (p.suffix.lower() in DATA_SUFFIXES or _VTRAIN_LUT.match(p.name)))
    plans = []
    for f in files:
        plan = FilePlan(path=f, platform=platform, licence=licence, root=path)
        plan.kind, plan.info = detect_kind(f, kind)
        try:
            _apply_manifest(plan, path)
        except (OSError, ValueError) as exc:
            plan.kind, plan.skip_reason = None, f"rejected: unreadable manifest.json: {exc}"
            plans.append(plan)
            continue
        if plan.kind is None:
            plan.skip_reason = plan.info.pop("reason", "unrecognised format")
            if explicit and not plan.skip_reason.startswith("rejected"):
                plan.skip_reason = f"rejected: {plan.skip_reason}"
        elif plan.kind == "paper_nccl" and plan.info.get("nodes") is None:
            siblings = _per_topology_siblings(f, plan.info)
            if siblings:
                plan.kind = None
                plan.skip_reason = (f"pooled NCCL file: its rows duplicate the {len(siblings)} per-topology "
                                    f"files {f.stem}_<nodes>_<gpus_per_node>.csv")
        plans.append(plan)
    return plans


def _apply_manifest(plan: FilePlan, root: Path) -> None:
    """Fill platform/source/licence from the nearest manifest.json between the file and `root`."""
    stop = root if root.is_dir() else root.parent
    for d in [plan.path.parent, *plan.path.parent.parents]:
        m = d / "manifest.json"
        if m.is_file():
            data = json.loads(m.read_text())
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            plan.platform = plan.platform or data.get("platform")
            plan.licence = plan.licence or data.get("licence") or data.get("license")
            plan.source = data.get("source")
            plan.info["manifest"] = {k: data[k] for k in ("device_name", "description") if k in data}
            return
        if d == stop:
            return


def _per_topology_siblings(path: Path, info: dict[str, Any]) -> list[Path]:
    out = []
    for p in sorted(path.parent.glob(f"{info['device']}_{info['name']}_{info['dtype']}_*_*.csv")):
        m = _PAPER_FILE.match(p.name)
        if m and m["name"] == info["name"] and m["nodes"] is not None:
            out.append(p)
    return out


def read_header(path: Path) -> list[str]:
    """Column names of a CSV (BOM stripped) or Parquet file."""
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq
        return [str(c).strip() for c in pq.read_schema(path).names]
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as fh:
        for line in fh:
            if line.strip():
                return [c.strip() for c in next(csv.reader([line], skipinitialspace=True))]
    return []


def detect_kind(path: Path, forced: str | None = None) -> tuple[str | None, dict[str, Any]]:
    """(kind, info) of one file; kind None with info['reason'] when it is not a data file we know."""
    try:
        if path.stat().st_size == 0:
            return None, {"reason": "rejected: empty file (0 bytes)"}
        cols = set(read_header(path))
    except Exception as exc:  # noqa: BLE001 - unreadable Parquet footer etc.: the message is the answer
        return None, {"reason": f"rejected: cannot read the header: {exc}"}
    if not cols and path.suffix.lower() != ".parquet":
        return None, {"reason": "rejected: empty file (only blank lines)"}
    m = _PAPER_FILE.match(path.name)
    info: dict[str, Any] = {}
    if m:
        info = {"device": m["device"], "name": m["name"], "dtype": m["dtype"],
                "nodes": int(m["nodes"]) if m["nodes"] else None, "gpn": int(m["gpn"]) if m["gpn"] else None}
    elif path.suffix.lower() == ".csv" and path.stem in PAPER_DEVICES:
        info = {"device": path.stem}
    if forced:
        if forced.startswith("paper_") and forced != "paper_summary" and not m:
            return None, {"reason": f"rejected: kind {forced} needs a file named <GPU>_<name>_fp16[_<n>_<g>].csv"}
        return forced, info
    if "Best_error%" in cols:
        return "paper_summary", info
    if "iteration time (ms)" in cols:
        return "vtrain", info
    lut = _VTRAIN_LUT.match(path.name)
    if lut and "size(B)" in cols:
        info = {"gpus": int(lut["n"]), "gpu_family": path.parent.name}
        return "vtrain_allreduce_lut", info
    if {"measured_metric", "measured_value"} <= cols:
        return "published_runs", info
    aic = aiconfigurator.detect(path, cols)
    if aic is not None:
        return aic, info
    if aiconfigurator.is_moe_table(cols):
        return None, {"reason": aiconfigurator.MOE_SKIP}
    if liger.detect(cols):
        return "liger", info
    if "op" in cols and "pass" in cols:
        return "op_samples", info
    if "collective" in cols:
        return "collective_samples", info
    if "step_time_s" in cols or "case_id" in cols:
        return "measured_runs", info
    if m and (m["device"] in PAPER_DEVICES or cols & {"F_dur(us)", "dur(us)", "dur", "shape"}):
        if m["name"] in ops.PAPER_OPTIMIZER_FILES:
            return "paper_optimizer", info
        if m["name"] in ops.PAPER_COLLECTIVES or path.parent.name == "nccl" or m["nodes"]:
            return "paper_nccl", info
        return "paper_operator", info
    shown = ", ".join(sorted(cols)[:8]) + (", ..." if len(cols) > 8 else "")
    return None, {"reason": f"unrecognised format: columns ({shown}) match no known layout; "
                            f"known: {'; '.join(KNOWN_LAYOUTS)}"}



PARSERS: dict[str, Callable[[bytes, FilePlan, int], ParsedFile]] = {
    "paper_operator": parse_paper_operator, "paper_optimizer": parse_paper_optimizer,
    "paper_nccl": parse_paper_nccl, "paper_summary": parse_paper_summary, "vtrain": parse_vtrain,
    "vtrain_allreduce_lut": parse_vtrain_allreduce_lut,
    "op_samples": parse_op_samples, "collective_samples": parse_collective_samples,
    "measured_runs": parse_measured_runs, "published_runs": parse_published_runs,
    "aiconfigurator_gemm": aiconfigurator.parse_gemm, "aiconfigurator_attention": aiconfigurator.parse_attention,
    "aiconfigurator_comm": aiconfigurator.parse_comm, "liger": liger.parse_liger,
}


def parse_file(data: bytes, plan: FilePlan, limit: int = 5) -> ParsedFile:
    """Parse one planned file; raises FormatError when the whole file must be rejected, and
    SourceDefinitionError / InfeasibleConfig when the project's own definitions are wrong."""
    assert plan.kind is not None
    try:
        return PARSERS[plan.kind](data, plan, limit)
    except (FormatError, SourceDefinitionError, InfeasibleConfig):
        raise
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise FormatError(f"{plan.path.name}: cannot parse as {plan.kind}: {exc}") from exc
    except Exception as exc:
        import pyarrow as pa
        if isinstance(exc, pa.ArrowException):
            raise FormatError(f"{plan.path.name}: cannot read Parquet: {exc}") from exc
        raise


def preview_path(path: Path, platform: str | None = None) -> pd.DataFrame:
    """A dry run of an ingest of `path` (a file or a folder): one row per file with its kind, platform(s),
    the rows it would add (`rows`, and per table in `tables`), the rows it would reject, and `status`
    (ok | skipped | rejected) with a `message` (the skip reason, the parse error, or example rejections).
    Nothing is written."""
    out = []
    for plan in plan_files(Path(path), platform=platform):
        row: dict[str, Any] = {"file": plan.path.name, "kind": plan.kind or "-", "platform": plan.platform or "",
                               "rows": 0, "rows_rejected": 0, "tables": "", "status": "ok", "message": ""}
        if plan.kind is None:
            row.update(status="rejected" if plan.skip_reason.startswith("rejected") else "skipped",
                       message=plan.skip_reason)
        else:
            try:
                parsed = parse_file(plan.path.read_bytes(), plan, 5)
            except FormatError as e:
                row.update(status="rejected", message=str(e))
            else:
                row.update(rows=int(sum(len(df) for df in parsed.tables.values())),
                           rows_rejected=int(parsed.rows_rejected),
                           platform=", ".join(parsed.platforms) or row["platform"],
                           tables=", ".join(f"{t} {len(df)}" for t, df in parsed.tables.items() if len(df)),
                           message="; ".join(parsed.examples[:3]))
                if not row["rows"]:
                    row["status"] = "rejected"
        out.append(row)
    return pd.DataFrame(out, columns=["file", "kind", "platform", "rows", "rows_rejected", "tables", "status",
                                      "message"])

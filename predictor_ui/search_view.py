"""What the Search page shows of a `predictor.plan.search.SearchReport`: the ranked table (with the refined
top rows' warnings), the rejections, and a row turned into the Predict page's query parameters."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from predictor.plan.search import SearchReport, layout_of

# predictor.plan.search.OBJECTIVES in words (tests/test_charts.py checks that the keys agree).
OBJECTIVE_LABELS = {"time": "step time", "tokens": "tokens / s", "mfu": "MFU", "cost": "GPU-hours per token"}


@dataclass(frozen=True)
class SearchView:
    table: pd.DataFrame        # SearchReport.table (feasible ranked first) + `warnings` of the refined top rows
    rejections: pd.DataFrame   # SearchReport.rejection_summary()
    host_modelled: bool        # False: `host_overhead_s` is empty (not modelled), not a measured 0
    elapsed_s: float
    enumerated: int
    feasible: int


def search_view(rep: SearchReport, host_modelled: bool) -> SearchView:
    table = rep.table.drop(columns=["_row"], errors="ignore")
    table["warnings"] = ""
    for r in rep.top:
        if r.prediction is not None and 0 <= r.table_index < len(table):
            table.loc[r.table_index, "warnings"] = " ".join(r.prediction.warnings)
    if not host_modelled and "host_overhead_s" in table:
        table["host_overhead_s"] = np.nan
    return SearchView(table=table, rejections=rep.rejection_summary(), host_modelled=host_modelled,
                      elapsed_s=rep.elapsed_s, enumerated=rep.n_enumerated, feasible=rep.n_feasible)


def predict_query(row: pd.Series | dict[str, Any]) -> dict[str, str]:
    """The Predict page's query parameters for one row of the search table (its layout)."""
    L = layout_of(row)
    out = {f: str(getattr(L, f)) for f in ("num_gpus", "tp", "pp", "cp", "ep", "dp", "micro_batch", "global_batch",
                                           "seq_len", "vpp", "zero_stage", "schedule", "recompute", "precision")}
    out["sequence_parallel"] = "true" if L.sequence_parallel else "false"
    if L.stage_layers:
        out["stage_layers"] = ",".join(map(str, L.stage_layers))
    # the framework and its overlap switches, as the Predict page's widgets name them
    out["framework"] = L.framework
    from .inputs import TRI_STATE_FIELDS, query_value
    for f in (*TRI_STATE_FIELDS, "overlap_tp_comm", "fp8_param_gather"):   # a tri-state left out at its default
        v = getattr(L, f)
        if v is not None:
            out[f] = query_value(f, v)
    if L.cp_comm != "p2p":   # all-to-all context parallelism and activation offloading, where used
        out["cp_comm"] = L.cp_comm
    if L.offload_activations:
        out["offload_activations"] = str(L.offload_activations)
    if L.etp is not None:   # MoE expert tensor parallelism (left out at the framework's default) and its overlap
        out["etp"] = str(L.etp)
    if L.moe_overlap:
        out["moe_overlap"] = query_value("moe_overlap", True)
    if L.moe_dispatcher != "alltoall":   # the MoE token dispatcher, where not the default
        out["moe_dispatcher"] = L.moe_dispatcher
    if L.cuda_graphs != "none":   # CUDA graphs, where used
        out["cuda_graphs"] = L.cuda_graphs
    if L.recompute == "selective" and L.recompute_modules is not None:   # selective recomputation's modules
        out["recompute_modules"] = ",".join(L.recompute_modules) or "none"
    return out

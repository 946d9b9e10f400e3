"""What the independent checks measured, kept for the error band of predictions on the GPUs they cover.

The independent checks (predictor.checks.independent: published llm-foundry H100 runs;
predictor.checks.independent_nemo:
NVIDIA's NeMo / Megatron-Bridge tables on H100, B200, GB200) are never fitted to. Their errors are how accurate the
product has proven on GPUs no end-to-end term was fitted on, so a prediction on such a GPU says them beside its
band, and the band is at least as wide as the worst of them (`band_words`). Nothing here moves a step time.

    python -m predictor check-independent --save    # run every check, write models_store/independent_checks.json

The record names the end-to-end terms it was measured with (`terms_fitted_at`); a prediction whose terms were
fitted later says the record predates them.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from predictor import paths
from predictor.paths import INDEPENDENT_CHECKS, ArtifactError, check_number

# What kind of model a check's runs trained: its error speaks for predictions of that kind ("all": every kind)
SCOPES = ("all", "dense", "moe")


@dataclass(frozen=True)
class DeviceCheck:
    """One source's published runs on one GPU, scored; `scope`: the kind of model they trained (SCOPES)."""
    source: str
    runs: int
    mape: float
    mean_signed: float
    scope: str = "all"

    def applies_to(self, moe: bool) -> bool:
        """Whether this check speaks for a prediction of a MoE (`moe`) or a dense model."""
        return self.scope == "all" or self.scope == ("moe" if moe else "dense")


def summarise(scored: Iterable[tuple[str, str, float, str]]) -> dict[str, list[DeviceCheck]]:
    """(device id, source, signed error = predicted / measured - 1, scope) per predicted run -> per device, one
    DeviceCheck per source and scope, worst MAPE first."""
    acc: dict[tuple[str, str, str], list[float]] = {}
    for dev, src, e, scope in scored:
        if isinstance(e, (int, float)) and math.isfinite(e):
            acc.setdefault((dev, src, scope), []).append(float(e))
    out: dict[str, list[DeviceCheck]] = {}
    for (dev, src, scope), es in acc.items():
        out.setdefault(dev, []).append(DeviceCheck(src, len(es), sum(abs(x) for x in es) / len(es),
                                                   sum(es) / len(es), scope))
    return {d: sorted(v, key=lambda c: -c.mape) for d, v in sorted(out.items())}


def record(checks: dict[str, list[DeviceCheck]], terms_fitted_at: str) -> dict[str, Any]:
    return {"what": "errors of the independent checks (published runs never fitted to), per GPU, source and scope "
                    "(the kind of model the runs trained: dense, moe, or all); signed = predicted / measured - 1 "
                    "(below zero: the prediction is faster)",
            "terms_fitted_at": terms_fitted_at, "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "devices": {d: [c.__dict__ for c in cs] for d, cs in checks.items()}}


def from_dict(d: Any, path: str | Path) -> tuple[dict[str, list[DeviceCheck]], str, str]:
    """(checks per device, terms_fitted_at, measured_at); ArtifactError naming the field on a bad value."""
    if not isinstance(d, dict) or not isinstance(d.get("devices"), dict):
        raise ArtifactError(path, "devices", "must be a mapping of GPU -> list of checks")
    out: dict[str, list[DeviceCheck]] = {}
    for dev, cs in d["devices"].items():
        if not isinstance(cs, list):
            raise ArtifactError(path, f"devices.{dev}", "must be a list of checks")
        lst = []
        for i, c in enumerate(cs):
            where = f"devices.{dev}[{i}]"
            if not isinstance(c, dict):
                raise ArtifactError(path, where, "must be a mapping")
            scope = c.get("scope", "all")
            if scope not in SCOPES:
                raise ArtifactError(path, f"{where}.scope", f"{scope!r} is not one of {', '.join(SCOPES)}")
            lst.append(DeviceCheck(str(c.get("source", "")),
                                   int(check_number(path, f"{where}.runs", c.get("runs"), ge=1, integer=True)),
                                   float(check_number(path, f"{where}.mape", c.get("mape"), ge=0.0)),
                                   float(check_number(path, f"{where}.mean_signed", c.get("mean_signed"))),
                                   scope))
        out[str(dev)] = lst
    return out, str(d.get("terms_fitted_at", "")), str(d.get("measured_at", ""))


def save(rec: dict[str, Any], models_dir: str | Path | None = None) -> Path:
    p = paths.shared_artifact(INDEPENDENT_CHECKS, models_dir)
    from_dict(rec, p)   # refuse to write what would not load back
    return paths.write_json_atomic(p, rec)


def load_checked(models_dir: str | Path | None = None
                 ) -> tuple[tuple[dict[str, list[DeviceCheck]], str, str] | None, str | None]:
    """(record, warning): None without a file; a bad file gives no record and a warning naming it."""
    p = paths.shared_artifact(INDEPENDENT_CHECKS, models_dir)
    try:
        d = paths.read_json_checked(p)
        return (None, None) if d is None else (from_dict(d, p), None)
    except (ArtifactError, ValueError, TypeError) as e:
        return None, f"Independent-check record ignored: {e}"


def band_words(checks: list[DeviceCheck], terms_fitted_at: str, record_terms_fitted_at: str,
               measured_at: str) -> tuple[float, str]:
    """(the worst MAPE, words) for a prediction's band on a GPU these checks cover (pass the checks that apply to
    the prediction's kind of model: `DeviceCheck.applies_to`)."""
    parts = []
    for c in checks:
        side = "faster" if c.mean_signed < 0 else "slower"
        kind = {"moe": ", MoE runs", "dense": ", dense runs"}.get(c.scope, "")
        parts.append(f"{c.source}{kind} {c.runs} runs {c.mape:.1%} ({abs(c.mean_signed):.1%} {side} than published "
                     f"on average)")
    stale = ("" if not terms_fitted_at or record_terms_fitted_at == terms_fitted_at
             else f", measured {measured_at[:10]} with end-to-end terms fitted before the current ones "
                  "(python -m predictor check-independent --save renews it)")
    return max(c.mape for c in checks), ("independent checks on this GPU, published runs never fitted to: "
                                         + "; ".join(parts) + stale)

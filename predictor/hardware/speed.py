"""Speed check: is the machine as fast now as when its operators were sampled?

A platform's regressors describe the machine at sampling time. Machines drift: a cloud VM's
neighbours, clocks and firmware change, and on this project's own 2-core VM the same Hugging Face
training step took up to 30 % longer at one hour than at another of the same morning, which no
regressor trained on earlier samples can know. `python -m bench speed-check` re-times a fixed
handful of the platform's own sampled shapes (about half a minute) and compares with what was stored:

    speed_factor = weighted median of (duration now / duration then), weights = duration then

(time-weighted, so the long GEMMs that dominate a step dominate the factor, and the microsecond
element-wise ops, whose ratios are mostly timer noise, do not; a median, because one shape can
land on an unlucky heap state and page-fault its memory in again: on this CPU one cross-entropy
backward re-timed at 5x its sample while the shapes around it moved by 10 %). Saved as
models_store/<platform>/speed_check.json, it scales that platform's *measured* operator times
(not transferred or analytical ones, not collectives); every prediction that uses it says so, with
the factor and when it was taken. Without the file nothing is scaled.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from predictor.paths import ArtifactError, check_number, platform_dir, read_json_checked, write_json_atomic

SPEED_CHECK_FILE = "speed_check.json"
# Beyond this the samples no longer describe the machine: re-sample rather than rescale.
PLAUSIBLE_FACTOR = (0.5, 2.0)
_FIX = "Delete the file or run `python -m bench speed-check --platform {} --save` again."


@dataclass(frozen=True)
class SpeedCheck:
    platform: str
    speed_factor: float               # duration now / duration at sampling (< 1: faster now)
    points: int                       # (shape, pass) timings compared
    measured_at: str                  # ISO time of the check
    ratio_p25: float | None = None    # spread of the per-timing ratios
    ratio_p75: float | None = None
    check_s: float | None = None      # seconds the check took
    samples_from: str = ""            # which sampling run(s) it compares with
    per_op: dict[str, float] = field(default_factory=dict)  # time-weighted factor per op
    facts: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        pct = (1.0 / self.speed_factor - 1.0) * 100.0
        how = f"{abs(pct):.0f} % {'faster' if pct >= 0 else 'slower'}"
        return (f"Measured operator times scaled by x{self.speed_factor:.3f}: the speed check of "
                f"{self.measured_at[:16].replace('T', ' ')} found this machine {how} than when it was sampled "
                f"({self.points} sampled timings re-timed; `python -m bench speed-check --platform {self.platform}`)")


def speed_factor(then_s: Iterable[float], now_s: Iterable[float]) -> float:
    """Weighted median of the ratios now / then, each weighted by its duration then (the ratio at
    which half of the stored time lies on either side; midpoint between two ratios on a tie)."""
    then = [float(x) for x in then_s]
    now = [float(x) for x in now_s]
    if len(then) != len(now) or not then:
        raise ValueError("speed_factor needs the same, non-zero number of old and new durations")
    if any(not (x > 0 and math.isfinite(x)) for x in then + now):
        raise ValueError("speed_factor: durations must be positive and finite")
    pairs = sorted((n / t, t) for t, n in zip(then, now))
    half, acc = sum(then) / 2.0, 0.0
    for i, (r, w) in enumerate(pairs):
        acc += w
        if math.isclose(acc, half, rel_tol=1e-12) and i + 1 < len(pairs):
            return (r + pairs[i + 1][0]) / 2.0
        if acc > half:
            return r
    return pairs[-1][0]


def check_plausible(sc: SpeedCheck) -> None:
    lo, hi = PLAUSIBLE_FACTOR
    if not lo <= sc.speed_factor <= hi:
        raise ValueError(f"speed_factor {sc.speed_factor:.3f} is outside {lo}..{hi}: the machine is not the one "
                         f"that was sampled (or the check was disturbed); sample it again with `python -m bench ops`")


def save_speed_check(models_dir: str | Path, sc: SpeedCheck) -> Path:
    check_plausible(sc)
    path = platform_dir(sc.platform, models_dir) / SPEED_CHECK_FILE
    speed_check_from_dict(json.loads(json.dumps(asdict(sc))), path)  # never write what would not load
    return write_json_atomic(path, asdict(sc))


def speed_check_from_dict(d: dict[str, Any], path: str | Path = SPEED_CHECK_FILE,
                          platform_id: str | None = None) -> SpeedCheck:
    """The SpeedCheck of a parsed speed_check.json, checked: the required fields present; speed_factor
    finite and within PLAUSIBLE_FACTOR; points a count >= 1; ratio_p25 / ratio_p75 / per_op factors
    finite > 0 (or null); check_s >= 0; `platform` equal to `platform_id` when given (a file copied
    from another machine's folder). ArtifactError (a ValueError) naming `path` and the field."""
    if not isinstance(d, dict):
        raise ArtifactError(path, None, "a speed check is a JSON object")
    missing = [k for k in ("platform", "speed_factor", "points", "measured_at") if k not in d]
    if missing:
        raise ArtifactError(path, missing[0], f"missing field(s) {', '.join(missing)}")
    if not isinstance(d["platform"], str) or not isinstance(d["measured_at"], str):
        raise ArtifactError(path, "platform" if not isinstance(d["platform"], str) else "measured_at",
                            "must be a string")
    if platform_id is not None and d["platform"] != platform_id:
        raise ArtifactError(path, "platform", f"is '{d['platform']}': this check was taken on another platform "
                                              f"than '{platform_id}'")
    lo, hi = PLAUSIBLE_FACTOR
    f = check_number(path, "speed_factor", d["speed_factor"], gt=0)
    if not lo <= f <= hi:
        raise ArtifactError(path, "speed_factor", f"speed_factor {f:.3f} is outside {lo}..{hi}: the machine is not "
                                                  "the one that was sampled (or the check was disturbed); sample it "
                                                  "again with `python -m bench ops`")
    check_number(path, "points", d["points"], ge=1, integer=True)
    for k in ("ratio_p25", "ratio_p75"):
        check_number(path, k, d.get(k), gt=0, optional=True)
    check_number(path, "check_s", d.get("check_s"), ge=0, optional=True)
    per_op = d.get("per_op") or {}
    if not isinstance(per_op, dict):
        raise ArtifactError(path, "per_op", "must be an object")
    for k, v in per_op.items():
        check_number(path, f"per_op.{k}", v, gt=0)
    if not isinstance(d.get("facts") or {}, dict) or not isinstance(d.get("samples_from", ""), str):
        raise ArtifactError(path, "facts" if not isinstance(d.get("facts") or {}, dict) else "samples_from",
                            "has the wrong type")
    return SpeedCheck(**{k: d[k] for k in SpeedCheck.__dataclass_fields__ if k in d})


def load_speed_check_checked(models_dir: str | Path, platform_id: str) -> tuple[SpeedCheck | None, str | None]:
    """(check, None); (None, None) without the file; (None, warning) when the file is unreadable or a
    value is out of range: nothing is scaled and the warning (naming the file, the field and the fix)
    says so."""
    try:
        return load_speed_check(models_dir, platform_id), None
    except ValueError as exc:
        return None, f"Speed check ignored: {exc}"


def load_speed_check(models_dir: str | Path, platform_id: str) -> SpeedCheck | None:
    """The platform's saved speed check, None without one; ArtifactError (a ValueError, naming the
    file, the field and the fix) when the file is unreadable or a value is out of range."""
    path = platform_dir(platform_id, models_dir) / SPEED_CHECK_FILE
    try:
        d = read_json_checked(path)
        return None if d is None else speed_check_from_dict(d, path, platform_id)
    except ArtifactError as exc:
        raise ArtifactError(exc.path, exc.field, f"{exc.problem}. {_FIX.format(platform_id)}") from None

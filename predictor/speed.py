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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

SPEED_CHECK_FILE = "speed_check.json"
# Beyond this the samples no longer describe the machine: re-sample rather than rescale.
PLAUSIBLE_FACTOR = (0.5, 2.0)


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
    path = Path(models_dir) / sc.platform / SPEED_CHECK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(sc), indent=2) + "\n")
    tmp.replace(path)
    return path


def speed_check_from_dict(d: dict[str, Any]) -> SpeedCheck:
    if not isinstance(d, dict):
        raise ValueError("a speed check is a JSON object")
    missing = [k for k in ("platform", "speed_factor", "points", "measured_at") if k not in d]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    sc = SpeedCheck(**{k: d[k] for k in SpeedCheck.__dataclass_fields__ if k in d})
    if not isinstance(sc.speed_factor, (int, float)) or not math.isfinite(sc.speed_factor):
        raise ValueError("speed_factor must be a number")
    check_plausible(sc)
    return sc


def load_speed_check(models_dir: str | Path, platform_id: str) -> SpeedCheck | None:
    """The platform's saved speed check, None without one; ValueError (naming the file and the fix)
    when the file is unreadable."""
    path = Path(models_dir) / platform_id / SPEED_CHECK_FILE
    if not path.exists():
        return None
    try:
        return speed_check_from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"{path}: {exc}. Delete the file or run `python -m bench speed-check --platform "
                         f"{platform_id} --save` again.") from exc

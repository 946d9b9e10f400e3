"""Run every independent check (published runs never fitted to) and summarise it per GPU and source, for
`python -m predictor check-independent --save` (the record itself: predictor.plan.accuracy_record)."""
from __future__ import annotations

from collections.abc import Callable

from predictor.checks import independent, independent_nemo
from predictor.hardware.platforms import get_platform
from predictor.plan.accuracy_record import DeviceCheck, summarise


def run_all(models_dir: str | None = None, progress: Callable[[str], None] | None = None
            ) -> dict[str, list[DeviceCheck]]:
    """Run every independent check with the shipped models and summarise it per GPU and source."""
    say = progress or (lambda _m: None)
    scored: list[tuple[str, str, float, str]] = []
    for sid, src in independent.load_sources().items():
        say(f"independent check: {sid}")
        chk = independent.run_check(sid, models_dir=models_dir)
        dev = get_platform(str(src["platform"])).device.device_id
        # a source whose models are all dense speaks for dense predictions only
        moe = any(int(m.get("num_experts") or 0) > 1 for m in (src.get("models") or {}).values())
        scored += [(dev, sid, float(e), "all" if moe else "dense") for e in chk.runs["signed_error"].dropna()]
    say("independent check: NeMo / Megatron-Bridge tables")
    nemo = independent_nemo.run_check(models_dir=models_dir)
    # the tables hold dense and MoE runs, whose errors differ: each kind speaks for predictions of its kind
    for (plat, moe), g in nemo.runs[nemo.runs["predicted_s"].notna()].groupby(["platform", "moe"]):
        dev = get_platform(str(plat)).device.device_id
        scored += [(dev, "NeMo / Megatron-Bridge tables", float(e), "moe" if moe else "dense")
                   for e in g["signed_error"]]
    return summarise(scored)

"""What a platform's predictions rest on, in words: the one description the command line
(`python -m predictor platforms`) and the dashboard (Predict's "data" tab, Calibrate) both show."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from predictor.model import ops
from predictor.step.terms import DEFAULT_HOST

if TYPE_CHECKING:
    from predictor.plan.predict import Predictor


@dataclass(frozen=True)
class PlatformBacking:
    kind: str            # measured | transferred | analytical: what the operator times rest on
    operators: str
    collectives: str
    host_overhead: str
    machine_speed: str
    end_to_end: str
    short: dict[str, str]  # the same facts in a few words each (tables)

    def to_dict(self) -> dict[str, str]:
        d = asdict(self)
        d.pop("short")
        return d


def kernel_words(kb) -> str:
    """Which operators a platform's kernel-table regressors time, and how each pass is obtained."""
    parts = []
    if kb.has_op("gemm", "fwd"):
        parts.append("linear-layer GEMMs measured forward (backward: the same GEMM grid at the data- and "
                     "weight-gradient shapes)")
    fmts = [f.table_dtype for f in ops.FORMAT_GEMMS.values() if kb.has_op(f.op, "fwd")]
    if fmts:
        parts.append(f"low-precision GEMMs measured in their own grids ({', '.join(fmts)})")
    if kb.has_op("flash_attn", "fwd"):
        parts.append("flash attention measured forward (backward derived: forward x the paper's bwd/fwd ratio)")
    return "; ".join(parts) or "no kernel models"


def describe_backing(pr: Predictor) -> PlatformBacking:
    p = pr.platform
    own = pr.own_measurements
    kb = getattr(pr, "kernel_bank", None)
    if pr.bank is not None:
        kind = "measured" if own else "transferred"
        ops = f"{kind} from {p.op_models} ({len(pr.bank.ops_available())} operator models)"
        if kb is not None and kb is pr.bank:
            ops += f"; {kernel_words(kb)}"
        elif kb is not None:
            kind = "measured + transferred"
            ops = (f"measured on this GPU (published kernel tables, {p.kernel_models}): "
                   f"{kernel_words(kb)}; the other operators transferred from {p.op_models} "
                   f"({len(pr.bank.ops_available())} operator models)")
        if pr.bank.degraded:
            ops += f"; DEGRADED: {len(pr.bank.problems)} model file(s) failed their check and are not used"
    elif p.op_models:
        kind = "analytical"
        ops = (f"analytical: {p.op_models} has no trained models "
               f"(run `python -m predictor train --platform {p.op_models}`)")
    else:
        kind = "analytical"
        ops = "analytical (roofline from the device specs)"
    if pr.coll_bank is not None:
        coll = f"measured ({p.collective_models}); analytic beyond the sampled range"
    else:
        src = pr.network.intra.source
        coll = "analytic " + (f"(calibrated: {src})" if pr.network.calibrated else "(link specs)")
    host = pr.host
    # GPU platforms without a fit of their own take the per-framework host terms of the end-to-end fit
    terms_host = {fw: t for fw, t in (pr.terms.host.items() if pr.terms is not None else []) if t.active}
    if host is not None:
        cv = f", CV MAPE {host.cv_mape:.1%} on held-out models" if host.cv_mape is not None else ""
        runs = f" on {host.fitted_on_runs:,} measured runs" if host.fitted_on_runs else " on measured runs"
        host_s = (f"fitted{runs}: {host.host_s_per_layer_pass * 1e3:.2f} ms per layer pass, blended with the GPU "
                  f"time (p = {host.blend_p:g}){cv}")
    elif terms_host:
        n_runs = sum(pr.terms.fitted_on.values()) if pr.terms is not None else 0
        per_fw = ", ".join(f"{'other frameworks (pooled)' if fw == DEFAULT_HOST else fw} "
                           f"{t.host_s_per_layer_pass * 1e3:.2f} ms" for fw, t in sorted(terms_host.items()))
        host_s = (f"from the end-to-end terms (framework_terms.json, fitted on {n_runs:,} measured GPU runs, scored "
                  f"leave-one-source-out): per layer pass {per_fw}, blended with the GPU time; this platform has no "
                  "host-overhead fit of its own (`python -m predictor calibrate-host` on its runs makes one)")
    else:
        host_s = ("not modelled on this platform (no fitted host overhead): predictions with short kernels "
                  "(small models, micro-batch 1, high TP) may be low; fit one with "
                  "`python -m predictor calibrate-host` on measured runs")
    err = pr.end_to_end_error()
    e2e = f"MAPE {err[0]:.1%} on {err[1]} measured runs{err[2]}" if err is not None else "not validated end to end"
    if pr.speed is not None:
        speed = pr.speed.describe()
    elif pr.bank is not None and own:
        speed = ("as sampled (no speed check saved; `python -m bench speed-check --platform "
                 f"{p.platform_id} --save` re-times a few sampled shapes and scales to the machine's speed today)")
    else:
        speed = "-"
    short = {"operators": (f"measured GEMMs + attention ({p.kernel_models}), rest transferred ({p.op_models})"
                           if kb is not None and pr.bank is not None and kb is not pr.bank else
                           f"{kind} ({p.op_models})" if p.op_models and pr.bank is not None else kind),
             "collectives": ("measured + analytic" if pr.coll_bank is not None else
                             "analytic (calibrated)" if pr.network.calibrated else "analytic (link specs)"),
             "host_overhead": (f"{host.host_s_per_layer_pass * 1e3:.2f} ms/layer pass" if host is not None
                               else "end-to-end terms (per framework)" if terms_host else "not modelled"),
             "machine_speed": f"x{pr.speed.speed_factor:.3f}" if pr.speed is not None else "-",
             "end_to_end": f"MAPE {err[0]:.1%} ({err[1]} runs)" if err is not None else "not validated"}
    rec = getattr(pr, "own_runs", None)
    if rec is not None:   # a platform calibrated on the user's own runs (predictor.calibrate.runs)
        held = rec.get("held_out_mape")
        held_s = f"held-out error {held:.1%}" if held is not None else "no held-out error (one run)"
        e2e = (f"calibrated on {rec.get('runs')} of your runs from {p.calibrated_from} ({rec.get('fitted_at', '')}): "
               f"{held_s}, in-sample {float(rec.get('in_sample_mape') or 0):.1%}; " + e2e)
        short["end_to_end"] = f"{rec.get('runs')} own runs: " + (f"held out {held:.1%}" if held is not None
                                                                  else "no held-out error")
    return PlatformBacking(kind=kind, operators=ops, collectives=coll, host_overhead=host_s, machine_speed=speed,
                           end_to_end=e2e, short=short)

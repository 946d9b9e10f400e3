"""What k of your own runs buy: calibrate a scratch platform on k runs of a source, score the rest. Prints tables.

    python -m tests.benchmarks.own_runs [--draws 20] [--max-runs 120] [--source NAME ...] [--k 1 3]
                                        [--all-frameworks]

For each published source on a GPU (the store's llm-foundry A100, BLOOM and vTrain runs; the llm-foundry H100 tables
and the NeMo / Megatron-Bridge runs of predictor/catalog/independent*.json), per platform: draw k = 1, 2, 3, 5 runs
(`--draws` draws each, fixed seeds), calibrate on them as `calibrate-runs` does (predictor.calibrate.runs:
starting from the shipped terms of the source's platform, the prior's strength chosen by leave-one-run-out on the k
runs themselves, `choose_prior_scale`; prior_scales counts the choices), and score the source's other runs; and,
with the same terms, the other sources on the same GPU. Nothing is saved: the calibrated platform is a scratch one, in
memory, so the H100 / B200 / NeMo runs (never fitted to by anything shipped) are used here only as a user would use
them.

Per (source, k): the median and 90th percentile over the draws of the held-out MAPE (a draw's MAPE over the runs it
did not see), the mean over the draws of the held-out mean signed error (below zero the prediction is faster), and
the median MAPE on the other sources on that GPU, of another framework (other_fw: the calibrated speeds apply to
the runs' frameworks only, so these are the shipped predictions unless --all-frameworks) and of the same framework
(same_fw); k = 0 is the shipped platform as it is. Runs of the same layout
are kept once (the first), as calibrate-runs refuses a file holding contradicting copies; a source with more than
`--max-runs` runs is scored on a fixed random subset of them (said in the table).
Targets (issue #35): k = 3 median held-out MAPE <= 5 % with |mean signed| <= 3 %; k = 1 <= 8 %.

A second table gives each source's floor: `calibrate-runs` given every run of the source (the prior's strength chosen
as above), its error on those very runs (in-sample) and each run's leave-one-run-out error (the closed form the choice
uses), and for sources with MoE models the in-sample error of the dense and the MoE runs apart. Fitted on every run,
the terms come as close to those runs as they can (up to the priors); k runs drawn from them predict the rest no better
in expectation, so where the in-sample floor is above 5 % the k = 3 target is beyond what calibrating these terms can
reach.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from predictor.calibrate.runs import (
    PRIOR_SCALES,
    OwnRun,
    RunEvaluator,
    active_terms,
    choose_prior_scale,
    prior_terms,
)
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import layout_from_fields, model_from_fields
from predictor.plan.predict import Predictor
from predictor.step.compose import ComposeOptions

KS = (1, 2, 3, 5)
MIN_RUNS = 7     # a source needs more runs than the largest k plus a few to score


@dataclass
class Source:
    name: str
    platform: str
    runs: list[OwnRun]
    total: int           # usable runs before the subset
    predictor: Predictor | None = None
    evaluator: RunEvaluator | None = None

    @property
    def meas(self) -> np.ndarray:
        return np.array([r.step_time_s for r in self.runs])


def _own_runs(rows: list[tuple[dict, float, str]]) -> list[OwnRun]:
    out, seen = [], set()
    for i, (fields, t, src) in enumerate(rows):
        try:
            m, L = model_from_fields(fields), layout_from_fields(fields)
            L.validate(m)
        except (InfeasibleConfig, ValueError, KeyError, TypeError):
            continue
        if (m, L) in seen or not t > 0:
            continue
        seen.add((m, L))
        out.append(OwnRun(i + 2, m, L, float(t), src, ()))
    return out


def store_sources() -> list[tuple[str, str, list[OwnRun]]]:
    from predictor.calibrate.framework import gpu_runs
    runs = gpu_runs()
    out = []
    for (sid, plat), g in runs.groupby(["source_id", "platform"], sort=True):
        rows = [({k: ("" if v is None or (isinstance(v, float) and v != v) else v) for k, v in r.items()},
                 float(r["step_time_s"]), str(sid)) for r in g.to_dict(orient="records")]
        out.append((f"{sid} ({plat})", str(plat), _own_runs(rows)))
    return out


def independent_sources() -> list[tuple[str, str, list[OwnRun]]]:
    from predictor.checks import independent as ih
    from predictor.checks import independent_nemo as nemo
    out = []
    for sid, src in ih.load_sources().items():
        d, _dropped = ih.published_runs(src)
        recs = ih.batch_rows(d, src, src["platform"])
        out.append((f"{sid} ({src['platform']})", str(src["platform"]),
                    _own_runs([(r, float(t), sid) for r, t in zip(recs, d["measured_s"])])))
    doc = nemo.load()
    pr = nemo.published_runs(doc)
    by: dict[tuple[str, str], list] = {}
    for _, r in pr.ok.iterrows():
        rec, why = nemo.predictable_record(nemo.batch_row(r, doc["models"][r["model_key"]]))
        if not why:
            by.setdefault((str(r["source"]), str(r["platform"])), []).append((rec, float(r["measured_s"]), r["source"]))
    for (sid, plat), rows in sorted(by.items()):
        out.append((f"{sid} ({plat})", plat, _own_runs(rows)))
    return out


def prepare(max_runs: int, only: list[str] | None) -> list[Source]:
    srcs = []
    for name, plat, runs in store_sources() + independent_sources():
        if only and not any(o in name for o in only):
            continue
        total = len(runs)
        if total < MIN_RUNS:
            print(f"  skipped {name}: {total} usable runs (fewer than {MIN_RUNS})")
            continue
        if total > max_runs:
            keep = np.sort(np.random.default_rng(0).choice(total, max_runs, replace=False))
            runs = [runs[i] for i in keep]
        pr = Predictor(plat, options=ComposeOptions(simulate=False))
        ok = []
        for r in runs:
            try:
                pr.check_runs(r.layout)
                pr.platform.device.check_precision(r.layout.precision)
                ok.append(r)
            except InfeasibleConfig:
                continue
        s = Source(name, plat, ok, total, pr)
        s.evaluator = RunEvaluator(pr, ok)
        srcs.append(s)
    return srcs


def _errors(pred: np.ndarray, meas: np.ndarray) -> tuple[float, float]:
    e = pred / meas - 1.0
    return float(np.abs(e).mean()), float(e.mean())


def floor_row(s: Source, all_frameworks: bool = False, scales: tuple[float, ...] = PRIOR_SCALES) -> dict:
    """`calibrate-runs` on every run of `s`: its in-sample and leave-one-run-out error (module docstring)."""
    assert s.predictor is not None and s.evaluator is not None
    meas = s.meas
    active = active_terms(s.runs, s.predictor.platform)
    chosen, _fits = choose_prior_scale(s.evaluator, prior_terms(s.predictor), active, meas,
                                       sorted({r.layout.framework for r in s.runs}), scoped=not all_frameworks,
                                       scales=scales)
    pred = s.evaluator(chosen.terms)
    moe = np.array([r.model.is_moe for r in s.runs])
    in_mape, in_signed = _errors(pred, meas)
    loo_mape, loo_signed = _errors(meas * np.exp(chosen.held_out_log), meas)
    row = {"source": s.name, "runs": len(s.runs), "prior_scale": chosen.scale,
           "in_sample_mape": in_mape, "in_sample_signed": in_signed, "loo_mape": loo_mape, "loo_signed": loo_signed,
           "dense_in_sample_mape": None, "moe_in_sample_mape": None, "moe_runs": int(moe.sum())}
    if moe.any() and (~moe).any():
        row["dense_in_sample_mape"] = _errors(pred[~moe], meas[~moe])[0]
        row["moe_in_sample_mape"] = _errors(pred[moe], meas[moe])[0]
    return row


def run(draws: int, max_runs: int, only: list[str] | None, ks: tuple[int, ...] = KS,
        all_frameworks: bool = False, scales: tuple[float, ...] = PRIOR_SCALES, exact: bool = False,
        floors: list[dict] | None = None) -> pd.DataFrame:
    """The k-draws table; `floors`, where given, receives each source's `floor_row`."""
    t0 = time.perf_counter()
    sources = prepare(max_runs, only)
    print(f"  {len(sources)} sources prepared in {time.perf_counter() - t0:.0f} s")
    rows = []
    for s in sources:
        assert s.predictor is not None and s.evaluator is not None
        meas = s.meas
        prior = prior_terms(s.predictor)
        same_gpu = [o for o in sources if o is not s and o.predictor is not None
                    and o.predictor.platform.device.device_id == s.predictor.platform.device.device_id]
        fws = {r.layout.framework for r in s.runs}
        # the same GPU's other sources: of another framework (the calibrated speeds do not apply to them unless
        # --all-frameworks) and of the same framework
        other_fw = [o for o in same_gpu if not fws & {r.layout.framework for r in o.runs}]
        same_fw = [o for o in same_gpu if o not in other_fw]
        base_mape, base_signed = _errors(s.evaluator(prior), meas)

        def others(group: list[Source], terms_of) -> list[float]:
            return [_errors(o.evaluator(terms_of(o)), o.meas)[0] for o in group if o.evaluator is not None]
        o_fw0 = others(other_fw, lambda o: prior_terms(o.predictor))
        s_fw0 = others(same_fw, lambda o: prior_terms(o.predictor))
        rows.append({"source": s.name, "runs": len(s.runs), "of": s.total, "k": 0, "draws": 1,
                     "median_mape": base_mape, "p90_mape": base_mape, "mean_signed": base_signed,
                     "other_fw_median_mape": float(np.median(o_fw0)) if o_fw0 else None,
                     "same_fw_median_mape": float(np.median(s_fw0)) if s_fw0 else None,
                     "other_fw": len(other_fw), "same_fw": len(same_fw)})
        for k in ks:
            if len(s.runs) < k + 2:
                continue
            mapes, signed, cross, cross_same, picked = [], [], [], [], []
            for d in range(draws):
                rng = np.random.default_rng(1000 * k + d)
                pick = np.zeros(len(s.runs), dtype=bool)
                pick[rng.choice(len(s.runs), k, replace=False)] = True
                drawn = [r for r, p in zip(s.runs, pick) if p]
                ev = RunEvaluator(s.predictor, drawn)
                dfws = sorted({r.layout.framework for r in drawn})
                chosen, _fits = choose_prior_scale(ev, prior, active_terms(drawn, s.predictor.platform),
                                                   np.array([r.step_time_s for r in drawn]), dfws,
                                                   scoped=not all_frameworks, scales=scales, exact=exact)
                terms = chosen.terms
                picked.append(chosen.scale)
                m_, s_ = _errors(s.evaluator(terms)[~pick], meas[~pick])
                mapes.append(m_)
                signed.append(s_)
                cross += others(other_fw, lambda o, t=terms: t)
                cross_same += others(same_fw, lambda o, t=terms: t)
            rows.append({"source": s.name, "runs": len(s.runs), "of": s.total, "k": k, "draws": draws,
                         "median_mape": float(np.median(mapes)), "p90_mape": float(np.percentile(mapes, 90)),
                         "mean_signed": float(np.mean(signed)),
                         "other_fw_median_mape": float(np.median(cross)) if cross else None,
                         "same_fw_median_mape": float(np.median(cross_same)) if cross_same else None,
                         "other_fw": len(other_fw), "same_fw": len(same_fw),
                         "prior_scales": " ".join(f"{v:g}x{picked.count(v)}" for v in sorted(set(picked)))})
        if floors is not None:
            floors.append(floor_row(s, all_frameworks, scales))
        print(f"  {s.name}: done ({time.perf_counter() - t0:.0f} s)", flush=True)
    return pd.DataFrame(rows)


def verdicts(t: pd.DataFrame) -> pd.DataFrame:
    out = []
    for src, g in t.groupby("source", sort=False):
        k1, k3 = g[g["k"] == 1], g[g["k"] == 3]
        r: dict = {"source": src}
        if len(k1):
            r["k=1 median <= 8 %"] = "met" if k1["median_mape"].iloc[0] <= 0.08 else "NOT met"
        if len(k3):
            ok = k3["median_mape"].iloc[0] <= 0.05 and abs(k3["mean_signed"].iloc[0]) <= 0.03
            r["k=3 median <= 5 %, |signed| <= 3 %"] = "met" if ok else "NOT met"
        out.append(r)
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=20, help="draws per k (fixed seeds)")
    ap.add_argument("--max-runs", type=int, default=120, help="score at most this many runs of a source")
    ap.add_argument("--source", nargs="*", help="only sources whose name contains one of these")
    ap.add_argument("--k", type=int, nargs="*", default=list(KS), help="the numbers of runs to calibrate on")
    ap.add_argument("--all-frameworks", action="store_true",
                    help="apply the calibrated speeds to every framework (calibrate-runs --all-frameworks)")
    ap.add_argument("--prior-scales", type=float, nargs="*", default=list(PRIOR_SCALES),
                    help="the prior strengths calibrate-runs chooses from by leave-one-run-out on the k runs "
                         "(one value: that scale, no choice)")
    ap.add_argument("--exact-loo", action="store_true",
                    help="choose the prior's strength on leave-one-run-out refits instead of the closed form "
                         "calibrate-runs uses (about 4x slower at k = 3, 5)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    floors: list[dict] = []
    t = run(a.draws, a.max_runs, a.source, tuple(a.k), a.all_frameworks, tuple(a.prior_scales), a.exact_loo, floors)
    pd.set_option("display.width", 220)
    pd.set_option("display.max_rows", 500)
    shown = t.copy()
    for c in ("median_mape", "p90_mape", "other_fw_median_mape", "same_fw_median_mape"):
        shown[c] = shown[c].map(lambda v: "-" if v is None or v != v else f"{v:.1%}")
    shown["mean_signed"] = shown["mean_signed"].map("{:+.1%}".format)
    print(f"\n== Own runs: calibrate on k runs of a source, score the rest (k = 0: as shipped); {a.draws} draws per k, "
          f"held-out MAPE median / 90th percentile over the draws, mean signed over the draws ==")
    print(shown.to_string(index=False))
    print("\n== Targets: k = 3 median held-out MAPE <= 5 % and |mean signed| <= 3 %; k = 1 median <= 8 % ==")
    print(verdicts(t).to_string(index=False))
    for k in a.k:
        g = t[t["k"] == k]
        if len(g):
            print(f"k = {k}: over {len(g)} sources, median of the per-source median MAPE "
                  f"{g['median_mape'].median():.1%}, mean signed {g['mean_signed'].mean():+.1%}")
    f = pd.DataFrame(floors)
    if len(f):
        for c in ("in_sample_mape", "loo_mape", "dense_in_sample_mape", "moe_in_sample_mape"):
            f[c] = f[c].map(lambda v: "-" if v is None or v != v else f"{v:.1%}")
        for c in ("in_sample_signed", "loo_signed"):
            f[c] = f[c].map("{:+.1%}".format)
        f["prior_scale"] = f["prior_scale"].map(lambda v: "keep" if v == 0 else f"x{v:g}")
        print("\n== Floors: calibrate-runs given every run of the source; the error on those runs (in-sample) and each "
              "run's leave-one-run-out error ==")
        print(f.to_string(index=False))
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()

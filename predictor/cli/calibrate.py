"""`python -m predictor calibrate-framework`: the end-to-end terms, fitted and scored leave-one-source-out."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any


def cmd_calibrate_framework(a: argparse.Namespace) -> int:
    from predictor.calibrate.framework import (
        TermsFitOptions,
        calibrate_framework,
        format_host_share,
        format_table,
        terms_in_words,
    )
    log = (lambda m: None) if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    opts = TermsFitOptions(max_evaluations=a.max_evaluations)
    if a.power_form:
        opts = replace(opts, power_form=a.power_form)
    if a.contention is not None:
        opts = replace(opts, contention=a.contention)
    cal = calibrate_framework(store_path=a.store, models_dir=a.models_dir, options=opts, progress=log,
                              save=not a.dry_run, use_host_floor=not a.no_host_floor)
    t = cal.terms
    if a.json:
        out: dict[str, Any] = {"terms": t.to_dict(), "per_source": cal.table.to_dict(orient="records"),
                               "written": str(cal.path) if cal.path else None}
        print(json.dumps(out, indent=2, default=float))
        return 0
    print(f"End-to-end terms ({terms_in_words(t)})")
    print(f"fitted on {t.source}\n")
    print(format_table(cal.table))
    v = t.validation
    print(f"\nsource-held-out MAPE {v['held_out_mape']:.1%} (mean signed {v['held_out_mean_signed']:+.1%}), "
          f"sources weighted equally; in-sample {v['in_sample_mape']:.1%}. 'skip' counts rows left out at ingest "
          f"(a field not stated) and here (fields that make no valid layout).")
    by_share = format_host_share(v)
    if by_share:
        print(by_share)
    print(f"written: {cal.path}" if cal.path else "(dry run: nothing written)")
    return 0


def _contention(text: str) -> float:
    """--contention: a number in [0, MAX_CONTENTION] (what a terms file allows), else a message naming the option."""
    from predictor.step.terms import MAX_CONTENTION
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--contention takes a number of seconds per second, not {text!r}") from None
    if not 0.0 <= v <= MAX_CONTENTION:
        raise argparse.ArgumentTypeError(f"--contention must lie in [0, {MAX_CONTENTION:g}] (seconds of compute lost "
                                         f"per second of overlapped communication), not {v:g}")
    return v


def add_calibrate_framework_parser(sub: Any, common: Any) -> None:
    sp = sub.add_parser("calibrate-framework",
                        help="fit the end-to-end terms (power factor, GPU speed spread, per-framework host overhead) "
                             "on the store's GPU runs; report in-sample and leave-one-source-out errors")
    sp.add_argument("--max-evaluations", type=int, default=40, help="least-squares evaluations per fit")
    from predictor.step.terms import POWER_FORMS
    sp.add_argument("--dry-run", action="store_true", help="fit and report, write nothing")
    sp.add_argument("--power-form", choices=POWER_FORMS,
                    help="how the power factor acts on tensor-core kernels: 'linear' adds beta x FLOPs / MAMF, 'cap' "
                         "runs none faster than MAMF / (1 + beta) (default: the shipped form, "
                         "predictor.calibrate.framework.TermsFitOptions)")
    sp.add_argument("--contention", type=_contention, metavar="KAPPA",
                    help="seconds of compute lost per second of overlapped communication, held fixed in the fit "
                         "(default: the published measurement, 0.159, "
                         "predictor.step.terms.PUBLISHED_CONTENTION; 0: none)")
    sp.add_argument("--no-host-floor", action="store_true",
                    help="ignore models_store/host_floor.json: host terms bounded below by 0 (for comparison)")
    common(sp)
    sp.set_defaults(func=cmd_calibrate_framework)


def cmd_check_independent(a: argparse.Namespace) -> int:
    from predictor.checks.record import run_all
    from predictor.plan import accuracy_record as IR
    from predictor.step.terms import load_terms_checked
    log = (lambda m: None) if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    checks = run_all(a.models_dir, progress=log)
    terms, _warning = load_terms_checked(a.models_dir)
    rec = IR.record(checks, terms.fitted_at if terms is not None else "")
    if a.json:
        print(json.dumps(rec, indent=2))
    else:
        print("independent checks (published runs never fitted to), per GPU, source and the kind of model they "
              "speak for: MAPE (mean signed; below zero the prediction is faster)")
        for dev, cs in checks.items():
            for c in cs:
                print(f"  {dev:<16} {c.source:<32} {c.scope:<6} {c.runs:>4} runs  {c.mape:6.1%} "
                      f"({c.mean_signed:+.1%})")
    if a.save:
        print(f"written: {IR.save(rec, a.models_dir)}", file=sys.stderr)
    return 0


def add_check_independent_parser(sub: Any, common: Any) -> None:
    sp = sub.add_parser("check-independent",
                        help="predict the independent published runs (never fitted to) and report the error per GPU "
                             "and source; --save keeps it for the error band of predictions on those GPUs")
    sp.add_argument("--save", action="store_true", help="write models_store/independent_checks.json")
    common(sp, store=False)
    sp.set_defaults(func=cmd_check_independent)


def cmd_calibrate_runs(a: argparse.Namespace) -> int:
    from pathlib import Path

    from predictor.calibrate.runs import calibrate_runs, choice_words, terms_table
    log = (lambda m: None) if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    cal = calibrate_runs(Path(a.runs), a.platform, a.save_as, models_dir=a.models_dir, clusters=a.clusters,
                         user_dir=a.user_models_dir, save=not a.dry_run, progress=log,
                         all_frameworks=a.all_frameworks)
    rec = cal.record
    if a.json:
        print(json.dumps({"record": rec, "terms": cal.terms.to_dict(), "per_run": cal.table.to_dict(orient="records"),
                          "terms_file": str(cal.terms_path) if cal.terms_path else None,
                          "clusters_file": str(cal.clusters_path) if cal.clusters_path else None},
                         indent=2, default=float))
        return 0
    import pandas as pd
    t = cal.table
    shown = pd.DataFrame({"line": t["line"], "source": t["source"], "model": t["model"], "gpus": t["gpus"],
                          "layout": t["layout"], "measured s": t["measured_s"].map("{:.4g}".format),
                          f"{cal.base} s": t["before_s"].map("{:.4g}".format),
                          "calibrated s": t["after_s"].map("{:.4g}".format),
                          "before": t["before_error"].map("{:+.1%}".format),
                          "after": t["after_error"].map("{:+.1%}".format),
                          "held out": t["held_out_error"].map(lambda v: "-" if v != v else f"{v:+.1%}")})
    print(f"{rec['runs']} runs on {cal.base}: each run before (the terms of {cal.base}) and after calibration, "
          "and held out (predicted by terms fitted without it)")
    print(shown.to_string(index=False))
    tt = terms_table(cal.fits)
    tt["prior"] = tt["prior"].map("{:.4g}".format)
    tt["fitted"] = tt["fitted"].map("{:.4g}".format)
    tt["prior_sd"] = tt["prior_sd"].map("{:.2f}".format)
    tt["posterior_sd"] = tt["posterior_sd"].map("{:.2f}".format)
    chose = choice_words(rec, cal.base)
    print("\nterms (sd: log units; identified where the runs at least halve the prior's sd)"
          + (f"; {chose}" if chose else ""))
    print(tt.to_string(index=False))

    def pct(v: Any) -> str:
        return "-" if v is None else f"{v:.1%}"
    print(f"\nMAPE before {pct(rec['before_mape'])} (mean signed {rec['before_mean_signed']:+.1%}), in-sample after "
          f"{pct(rec['in_sample_mape'])} ({rec['in_sample_mean_signed']:+.1%}); leave-one-run-out "
          f"{pct(rec['held_out_mape'])}" + (f" ({rec['held_out_mean_signed']:+.1%})" if rec['held_out_mape'] is not None
                                              else " (one run: none)")
          + (f"; leave-one-model-out {pct(rec['held_out_model_mape'])} over {rec['models']} models"
             if rec["held_out_model_mape"] is not None else ""))
    if cal.terms_path:
        print(f"saved {cal.new} (a user platform; {cal.base} is untouched): {cal.clusters_path}, {cal.terms_path}\n"
              f"use it with --platform {cal.new}")
        from predictor import paths
        if a.user_models_dir and paths.user_models_dir(a.user_models_dir) != paths.user_models_dir():
            print(f"note: predictions find its terms where ${paths.ENV_USER_MODELS_DIR} points: set "
                  f"{paths.ENV_USER_MODELS_DIR}={a.user_models_dir}")
    else:
        print("(dry run: nothing written)")
    return 0


def add_calibrate_runs_parser(sub: Any, common: Any) -> None:
    from predictor.cli.search import clusters_arg
    sp = sub.add_parser("calibrate-runs",
                        help="fit a platform's end-to-end terms on your own measured runs and save the result as a "
                             "new user platform (the shipped one is never changed)",
                        description="RUNS.csv: the predict-batch columns plus step_time_s (source optional), one row "
                                    "per measured run. Fits the sustained speed per kind of work, the host time per "
                                    "layer pass and per micro-batch and (runs across nodes) the network efficiency, "
                                    "pulled towards BASE's values; scores them leave-one-run-out. The fitted speeds "
                                    "apply to the runs' frameworks; another framework keeps BASE's.")
    sp.add_argument("--runs", required=True, help="CSV of measured runs")
    sp.add_argument("--platform", required=True, help="BASE: the platform the runs were measured on")
    sp.add_argument("--save-as", help="NEW: the name of the calibrated user platform (not a shipped one)")
    sp.add_argument("--user-models-dir", help="where NEW's terms go (default: $PREDICTOR_USER_MODELS_DIR, else "
                                              "user_models/ beside the clusters file)")
    sp.add_argument("--dry-run", action="store_true", help="fit and report, write nothing")
    sp.add_argument("--all-frameworks", action="store_true",
                    help="apply the fitted speeds to every framework, not only the runs' (by default another "
                         "framework keeps BASE's: a framework's own efficiency is in them)")
    clusters_arg(sp)
    common(sp, store=False)
    sp.set_defaults(func=cmd_calibrate_runs)

"""`python -m bench cpu-platform`: the whole measuring loop for this machine's CPU, phase by phase.

    python -m bench cpu-platform --plan          # phases, budgets, where everything goes; measures nothing
    python -m bench cpu-platform                 # run it: about 19.5 min of work on 2 cores
    python -m bench cpu-platform --fresh         # sample this machine again from scratch
    python -m bench cpu-platform --phases calibrate speed-check      # only some phases

Phases, in order, with their default budgets (seconds of work; waiting for a quiet machine is not
counted, and is recorded apart; the operator phases include the MoE ops, whose 96 points per op took
12 s on cpu-2t and 22 s on cpu-1t on machine 721472c952, hence 15 s / 25 s more than before):

    device        15   peak GEMM + STREAM copy -> catalog `cpu-host`; cluster entries cpu-2t / cpu-1t
    ops-2t       285   operator samples, one process x 2 threads (cpu-2t)
    coll-1t       60   gloo collectives of 2 ranks (cpu-1t), the loopback link fitted on them
    ops-1t       295   operator samples, 2 concurrent ranks x 1 thread (cpu-1t)
    context       60   per-op framework cost and whole HF layers vs their operators (bench/cpu/context.py)
    train        120   ingest this machine's sets (replacing the platforms' earlier rows in the store),
                       train every regressor, network.json, sampled_on.json
    calibrate    240   fresh HF training steps, each config a fresh process (bench/cpu/e2e.py): the host
                       term (host_overhead.json) and the validation record (validation.json)
    speed-check   90   re-time ~30 sampled shapes per platform, saved (speed_check.json, ~x1.0 now)
    curve         60   (not by default) regressor error vs samples -> cpu_error_curve.txt

Where: a platform's sample set is `<out-root>/<platform>` when that folder is free or holds this
machine's samples, and `<out-root>/machine-<id>/<platform>` when it holds another machine's
(predictor.hardware.machine; bench.sampling.store_io.sample_set_dir). Another machine's samples are never resumed,
ingested or trained on: ingest and train read this machine's sets only, and the store's earlier rows
of cpu-2t / cpu-1t are replaced. The loop's record `<sets' folder>/cpu_platform_run.json` holds the
plan, the time and result of every phase and the machine; an interrupted loop run again on the same
machine skips the phases it finished and resumes the one it was in (a sampling phase skips the
shapes already measured and gets what is left of its budget). A finished loop is not extended:
`--fresh` moves this machine's sets and record to `<sets' folder>/previous/<time>/` and samples
again. `PHASE_FUNCS` maps phase names to functions (tests replace them).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.sampling import store_io

REPO = Path(__file__).resolve().parents[2]
PLATFORMS = ("cpu-2t", "cpu-1t")
RECORD_FILE = "cpu_platform_run.json"
CALIBRATION_DIR = "calibration"
LIMIT_S = 1200.0  # the loop's promise: at most 20 minutes of work on a 2-core machine


@dataclass(frozen=True)
class PhaseSpec:
    name: str
    budget_s: float
    measures: bool  # times something: waits for a quiet machine first
    what: str
    samples: bool = False  # writes into a sample set (needs --fresh when the set is full)


SPECS = [
    PhaseSpec("device", 15, True, "peak GEMM + STREAM copy -> catalog cpu-host; cluster entries"),
    PhaseSpec("ops-2t", 285, True, "operator samples, 1 process x 2 threads (cpu-2t)", True),
    PhaseSpec("coll-1t", 60, True, "gloo collectives, 2 ranks (cpu-1t) + loopback link fit", True),
    PhaseSpec("ops-1t", 295, True, "operator samples, 2 concurrent ranks x 1 thread (cpu-1t)", True),
    PhaseSpec("context", 60, True, "per-op framework cost; HF layers in context vs their ops (cpu-2t)"),
    PhaseSpec("train", 120, False, "ingest this machine's sets, train, network.json, sampled_on.json"),
    PhaseSpec("calibrate", 240, True, "fresh HF training steps -> host_overhead.json, validation.json"),
    PhaseSpec("speed-check", 90, True, "re-time ~30 sampled shapes per platform (saved)"),
    PhaseSpec("curve", 60, False, "regressor error vs samples -> cpu_error_curve.txt"),
]
PHASES = {s.name: s for s in SPECS}
DEFAULT_PHASES = tuple(s.name for s in SPECS if s.name != "curve")
OLD_NAMES = {"ops2t": "ops-2t", "coll": "coll-1t", "ops1t": "ops-1t"}  # the earlier --steps names


@dataclass
class Loop:
    a: argparse.Namespace
    here: Any                       # predictor.hardware.machine.Machine
    root: Path                      # --out-root
    mroot: Path                     # the folder of this machine's sets and of the record
    models_dir: str
    store: str | None
    record: dict
    log: Callable[[str], None]
    first_gate: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def sets(self) -> dict[str, Path]:
        return {p: self.mroot / p for p in PLATFORMS}

    @property
    def record_path(self) -> Path:
        return self.mroot / RECORD_FILE

    def save(self) -> None:
        self.record["updated_at"] = store_io.now_iso()
        store_io.atomic_write_bytes(self.record_path, (json.dumps(self.record, indent=1, default=str) + "\n").encode())

    def rel(self, p: Path | str) -> str:
        try:
            return str(Path(p).resolve().relative_to(REPO))
        except ValueError:
            return str(p)


# --------------------------------------------------------------------------- where
def resolve_root(root: Path, here) -> tuple[Path, str]:
    """(the folder for this machine's sets and record, why in words)."""
    mroot = store_io.machine_root(root, PLATFORMS, here)
    rec = _read_record(root / RECORD_FILE)
    if mroot == root and rec and rec.get("machine_id") != here.id:
        from predictor.hardware.machine import from_dict, same_machine
        if not same_machine(from_dict(rec.get("machine") or {}), here):
            return store_io.machine_dir(root, here), f"{root / RECORD_FILE} is another machine's loop"
    if mroot == root:
        return root, "free or this machine's"
    for p in PLATFORMS:
        try:
            store_io.check_same_machine(root / p, here)
        except store_io.ForeignSamples as exc:
            return mroot, str(exc).split(". Samples of two machines")[0].replace(str(REPO) + os.sep, "")
    return mroot, "another machine's sets"


def _read_record(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- gates
def _gate(L: Loop) -> dict:
    from bench.launch import gate
    q = gate(L.a, L.first_gate)
    L.first_gate = False
    return q


# --------------------------------------------------------------------------- the phases
def ph_device(L: Loop, budget: float, q: dict | None) -> dict:
    from bench.cpu.cpu_clusters import cluster_entry_1t, cluster_entry_2t
    from bench.env import wait_calm
    from bench.sampling.device import (
        CATALOG,
        CATALOG_DEVICE_TOLERANCE,
        catalog_device_mismatch,
        cpu_device_entry,
        measure,
        upsert_catalog_entry,
    )
    waited = 0.0 if L.a.no_wait else wait_calm(300, log=L.log)
    m = measure("cpu", 2, "fp32")
    entry = cpu_device_entry(m)
    entry["sources"].append(f"quiet-machine check before measuring: {json.dumps(q, default=str)}")
    L.log(f"device cpu-host: {entry['peak_tflops']} TFLOP/s, {entry['hbm_bandwidth_gbps']} GB/s")
    if getattr(L.a, "no_catalog", False):
        # the models are trained and judged (physical bound, transfers, analytical parts) against the catalog's
        # cpu-host: with --no-catalog that must be this machine, or the loop builds models of another one
        cat = json.loads((CATALOG / "devices.json").read_text()).get("cpu-host")
        why = catalog_device_mismatch(entry, cat)
        if why:
            raise RuntimeError(
                f"--no-catalog, but the catalog's cpu-host is not this machine ({why}; more than "
                f"{CATALOG_DEVICE_TOLERANCE:.0%} apart): the models would be trained and judged against the "
                "catalog's device, and samples faster than its roofline dropped as impossible. Fix: run the loop "
                "without --no-catalog, from a separate checkout (git worktree add ../loop-checkout) if the shipped "
                "catalog must stay as it is.")
    else:
        upsert_catalog_entry(CATALOG / "devices.json", "cpu-host", entry)
        upsert_catalog_entry(CATALOG / "clusters.json", "cpu-2t", cluster_entry_2t())
        if "cpu-1t" not in json.loads((CATALOG / "clusters.json").read_text()):
            upsert_catalog_entry(CATALOG / "clusters.json", "cpu-1t", cluster_entry_1t(None))
    return {"peak_tflops": entry["peak_tflops"], "stream_gbps": entry["hbm_bandwidth_gbps"], "entry": entry,
            "waited_s": waited}


def _common(L: Loop) -> list[str]:
    return ["--quiet-load", str(L.a.quiet_load), "--max-wait-s", str(L.a.max_wait_s)]


def _last_run(out: Path, kind: str) -> dict:
    runs = [r for r in store_io.read_manifest(out).get("runs", []) if r.get("kind") == kind]
    return runs[-1] if runs else {}


def ph_ops_2t(L: Loop, budget: float, q: dict | None) -> dict:
    from bench.sampling.sampler import run_ops
    run = run_ops("cpu-2t", L.sets["cpu-2t"], threads=2, budget_s=budget, n_per_op=L.a.n_per_op, quiet_info=q,
                  profile=getattr(L.a, "profile", "cpu"), show_progress=not L.a.no_progress, log=L.log)
    return {"rows": run["rows_written"], "stopped": run["stopped"], "waited_s": run.get("waited_for_calm_s", 0.0)}


def ph_ops_1t(L: Loop, budget: float, q: dict | None) -> dict:
    from bench.launch import torchrun
    out = L.sets["cpu-1t"]
    rc = torchrun(2, ["ops", "--platform", "cpu-1t", "--out", str(out), "--threads", "1", "--budget-s",
                       f"{budget:.1f}", "--n-per-op", str(L.a.n_per_op), "--profile", getattr(L.a, "profile", "cpu"),
                       "--no-wait", "--no-progress", *_common(L)],
                   quiet=q)
    if rc:
        raise RuntimeError(f"the cpu-1t operator sampler (torchrun, 2 ranks) exited with {rc}")
    run = _last_run(out, "ops")
    return {"rows": run.get("rows_written"), "stopped": run.get("stopped"),
            "waited_s": float(run.get("waited_for_calm_s") or 0.0)}


def ph_coll_1t(L: Loop, budget: float, q: dict | None) -> dict:
    from bench.cpu.cpu_clusters import cluster_entry_1t, fit_network
    from bench.launch import torchrun
    from bench.sampling.device import CATALOG, upsert_catalog_entry
    out = L.sets["cpu-1t"]
    rc = torchrun(2, ["collectives", "--platform", "cpu-1t", "--out", str(out), "--threads", "1", "--budget-s",
                       f"{budget:.1f}", "--sizes", str(L.a.coll_sizes), "--no-wait", "--no-progress", *_common(L)],
                   quiet=q)
    if rc:
        raise RuntimeError(f"the collective sampler (torchrun, 2 gloo ranks) exited with {rc}")
    net = fit_network(out, "cpu-1t")
    if not getattr(L.a, "no_catalog", False):
        upsert_catalog_entry(CATALOG / "clusters.json", "cpu-1t", cluster_entry_1t(net))
    L.log(f"cpu-1t loopback: {net.intra.bandwidth_gbps:.2f} GB/s, {net.intra.latency_us:.1f} us "
          f"(fit MAPE {net.intra.fit_mape})")
    run = _last_run(out, "collectives")
    return {"rows": run.get("rows_written"), "stopped": run.get("stopped"),
            "bandwidth_gbps": round(net.intra.bandwidth_gbps, 3), "latency_us": round(net.intra.latency_us, 1),
            "waited_s": float(run.get("waited_for_calm_s") or 0.0)}


def ph_context(L: Loop, budget: float, q: dict | None) -> dict:
    from bench.cpu.context import run_context
    run = run_context("cpu-2t", L.sets["cpu-2t"], threads=2, budget_s=budget, log=L.log)
    return {"dispatch": run["dispatch"], "layer_shapes": len(run["layers"]), "stopped": run["stopped"]}


def train_platforms(root: Path, store: str | None, models_dir: str | Path,
                    platforms: tuple[str, ...] = PLATFORMS, log: Callable[[str], None] = print) -> dict[str, int]:
    """Ingest the sample sets `root/<platform>` (the store's earlier rows of the platform removed first, so
    the store mirrors the sets), train the regressors, save the calibrated loopback network."""
    from bench.cpu.cpu_clusters import fit_network
    from predictor.calibrate.training import train_platform
    from predictor.hardware.network import save_network
    from predictor.regress import regressors
    from predictor.samples.store import ingest_path
    mdir = Path(models_dir)
    if os.getloadavg()[0] > 1.5:  # OpenMP threads thrash on a busy 2-core machine; results do not depend on it
        regressors.DEFAULT_PARAMS["num_threads"] = 1
    out = {}
    for p in platforms:
        d = root / p
        if not d.is_dir():
            continue
        dropped = store_io.drop_platform_rows(p, store)
        if dropped:
            log(f"{p}: removed {dropped} earlier sample rows from the store (the store mirrors {d})")
        rep = ingest_path(d, store_path=store)
        log(rep.to_text().splitlines()[1])
        df = train_platform(p, store_path=store, models_dir=mdir,
                            progress=lambda i, n, m: log(f"[{i}/{n}] {m}") if i == n or "final" in m else None)
        log(f"{p}: trained {len(df)} models; median CV MAPE {df['cv_mape'].median():.1%}")
        if list(d.glob("coll-*.parquet")):
            save_network(fit_network(d, p), mdir / p / "network.json")
        out[p] = len(df)
    return out


def record_sampled_on(platform: str, samples: Path, models_dir: str | Path, written_by: str) -> Path:
    """models_store/<platform>/sampled_on.json from a sample set's manifest (its machine and runs)."""
    from predictor.hardware.machine import write_sampled_on
    man = store_io.read_manifest(samples)
    there = store_io.set_machine(samples)
    if there is None:
        raise ValueError(f"{samples}: no manifest.json naming the machine its samples were measured on")
    runs = [r for r in man.get("runs", []) if r.get("kind") in ("ops", "collectives")]
    starts = sorted(str(r.get("started_at")) for r in runs if r.get("started_at"))
    ends = sorted(str(r.get("finished_at") or r.get("started_at")) for r in runs if r.get("started_at"))
    try:
        rel = str(Path(samples).resolve().relative_to(REPO))
    except ValueError:
        rel = str(samples)
    return write_sampled_on(platform, models_dir, there, samples_dir=rel, sampled_from=starts[0] if starts else None,
                            sampled_until=ends[-1] if ends else None, runs=[r["run_id"] for r in runs],
                            written_by=written_by)


def ph_train(L: Loop, budget: float, q: dict | None) -> dict:
    from predictor.hardware.speed import SPEED_CHECK_FILE
    trained = train_platforms(L.mroot, L.store, L.models_dir, log=L.log)
    for p in trained:
        path = record_sampled_on(p, L.sets[p], L.models_dir, "python -m bench cpu-platform (train)")
        stale = Path(L.models_dir) / p / SPEED_CHECK_FILE
        if stale.exists():  # it compared the machine with the previous samples
            stale.unlink()
        L.log(f"{p}: {L.rel(path)} names machine {L.here.id}")
    return {"models": trained}


def _require_models_of_this_machine(L: Loop, platform: str) -> None:
    from predictor.hardware.machine import mismatch_warning
    w = mismatch_warning(platform, L.models_dir, L.here)
    if w:
        raise RuntimeError(f"{w} (run the train phase first: --phases train)")


def ph_calibrate(L: Loop, budget: float, q: dict | None) -> dict:
    from bench.cpu.e2e import calibrate
    for p in PLATFORMS:
        _require_models_of_this_machine(L, p)
    rec = calibrate(L.mroot / CALIBRATION_DIR, models_dir=L.models_dir, store=L.store, budget_s=budget,
                    loop_id=L.record["loop_id"], machine=L.here.to_dict(), log=L.log)
    out = {}
    for p, t in rec["tables"].items():
        fit = t.get("fit") or {}
        out[p] = {"configs": len(t["runs"]), "left_out": t.get("left_out", []),
                  **({"host_ms_per_layer_pass": round(fit["host_s_per_layer_pass"] * 1e3, 3),
                      "cv_mape": round(fit["cv_mape"], 4), "no_host_mape": round(fit["no_host_mape"], 4)}
                     if "cv_mape" in fit else {"fit": fit.get("skipped")})}
    return out


def ph_speed_check(L: Loop, budget: float, q: dict | None) -> dict:
    out = {}
    for p in PLATFORMS:
        _require_models_of_this_machine(L, p)
        with tempfile.TemporaryDirectory() as td:
            js = Path(td) / "speed.json"
            cmd = [sys.executable, "-m", "bench", "speed-check", "--platform", p, "--samples", str(L.sets[p]),
                   "--save", "--models-dir", str(L.models_dir), "--json-out", str(js)]
            if p == "cpu-1t":
                cmd += ["--ranks", "2"]
            env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
            r = subprocess.run(cmd, cwd=REPO, env=env, check=False)
            if r.returncode or not js.exists():
                raise RuntimeError(f"speed check of {p} failed (exit {r.returncode})")
            d = json.loads(js.read_text())
        out[p] = {"speed_factor": d["speed_factor"], "points": d["points"], "check_s": d["check_s"]}
        if not 0.9 <= d["speed_factor"] <= 1.1:
            L.notes.append(f"{p}: the speed check right after sampling read x{d['speed_factor']:.3f}: the machine's "
                           f"speed moved while it was sampled; a later quiet run gives steadier models")
    return out


def ph_curve(L: Loop, budget: float, q: dict | None) -> dict:
    import contextlib
    import io

    from bench.sampling.curve import print_curve
    text = io.StringIO()
    for p in PLATFORMS:
        if L.sets[p].is_dir():
            with contextlib.redirect_stdout(text):
                print_curve(L.sets[p], p)
    print(text.getvalue(), end="")
    path = L.mroot / "cpu_error_curve.txt"
    path.write_text(text.getvalue().replace(str(L.mroot.resolve()) + "/", ""))
    return {"written": L.rel(path)}


PHASE_FUNCS: dict[str, Callable[[Loop, float, dict | None], dict]] = {
    "device": ph_device, "ops-2t": ph_ops_2t, "coll-1t": ph_coll_1t, "ops-1t": ph_ops_1t, "context": ph_context,
    "train": ph_train, "calibrate": ph_calibrate, "speed-check": ph_speed_check, "curve": ph_curve}


# --------------------------------------------------------------------------- plan, record, run
def budgets(a: argparse.Namespace) -> dict[str, float]:
    b = {s.name: float(s.budget_s) for s in SPECS}
    for name, attr in (("ops-2t", "budget_2t"), ("ops-1t", "budget_1t"), ("coll-1t", "budget_coll")):
        if getattr(a, attr, None) is not None:
            b[name] = float(getattr(a, attr))
    for item in getattr(a, "budget", None) or []:
        name, _, secs = item.partition("=")
        if name not in b or not secs:
            raise SystemExit(f"--budget {item}: use PHASE=SECONDS with PHASE one of {', '.join(b)}")
        b[name] = float(secs)
    return b


def selected_phases(a: argparse.Namespace) -> list[str]:
    names = list(getattr(a, "phases", None) or getattr(a, "steps", None) or DEFAULT_PHASES)
    names = [OLD_NAMES.get(n, n) for n in names]
    unknown = [n for n in names if n not in PHASES]
    if unknown:
        raise SystemExit(f"unknown phase(s) {', '.join(unknown)}; phases: {', '.join(PHASES)}")
    return [s.name for s in SPECS if s.name in names]  # always in loop order


def _table(rows: list[list[str]]) -> str:
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(c if i == len(r) - 1 else c.ljust(w[i]) if i == 0 else c.rjust(w[i])
                                      for i, c in enumerate(r)) for r in rows)


def plan_text(L: Loop, phases: list[str], b: dict[str, float], why: str, resuming: dict | None) -> str:
    from predictor.paths import store_path
    lines = [f"bench cpu-platform on {L.here.short()}, machine {L.here.id}",
             f"  sample sets : {L.rel(L.sets['cpu-2t'])}, {L.rel(L.sets['cpu-1t'])}"
             + ("" if L.mroot == L.root else f"\n                ({why}; this machine samples into its own folder)"),
             (f"  models      : {L.rel(Path(L.models_dir) / 'cpu-2t')}, cpu-1t (retrained; sampled_on.json names "
              f"machine {L.here.id})"),
             f"  store       : {L.rel(store_path(L.store))} (rows of cpu-2t / cpu-1t replaced by this machine's)",
             (f"  op shapes   : profile {getattr(L.a, 'profile', 'cpu')}, {L.a.n_per_op} design points per op "
              "(bench/sampling/design.py)"),
             "  catalog     : " + ("not touched (--no-catalog)" if getattr(L.a, "no_catalog", False) else
                                   "predictor/catalog/devices.json cpu-host and clusters.json cpu-2t / cpu-1t "
                                   "updated with this machine's measurements"),
             f"  record      : {L.rel(L.record_path)}"]
    if resuming:
        done = [n for n, e in resuming.get("phases", {}).items() if e.get("status") == "done"]
        lines.append(f"  resuming the loop started {resuming.get('started_at', '?')[:19]} on this machine; "
                     f"done: {', '.join(done) or 'nothing yet'}")
    rows = [["phase", "budget", "what"]]
    total = 0.0
    for n in phases:
        st = (resuming or {}).get("phases", {}).get(n, {})
        left = b[n] - (float(st.get("spent_s") or 0) if st.get("status") in ("interrupted", "failed") else 0)
        skip = st.get("status") == "done"
        rows.append([n, "done" if skip else f"{max(0.0, left):.0f} s", PHASES[n].what])
        total += 0 if skip else max(0.0, left)
    rows.append(["total", f"{total:.0f} s", (f"{total / 60:.1f} min of work (limit {LIMIT_S / 60:.0f} min); "
                                             "waiting for a quiet machine comes on top and is recorded")])
    return "\n".join(lines) + "\n" + _table(rows)


def _move_aside(L: Loop) -> Path | None:
    """--fresh: this machine's sets, record and calibration to <mroot>/previous/<time>/."""
    items = [p for p in [*L.sets.values(), L.record_path, L.mroot / CALIBRATION_DIR, L.mroot / "cpu_error_curve.txt"]
             if p.exists()]
    if not items:
        return None
    dest = L.mroot / "previous" / time.strftime("%Y%m%dT%H%M%S")
    dest.mkdir(parents=True, exist_ok=True)
    for p in items:
        shutil.move(str(p), str(dest / p.name))
    return dest


def run(a: argparse.Namespace, log: Callable[[str], None] = print) -> int:
    from bench.env import loadavg, this_machine
    from predictor.paths import models_dir as default_models_dir
    here = this_machine()
    root = Path(a.out_root)
    mroot, why = resolve_root(root, here)
    phases = selected_phases(a)
    b = budgets(a)
    prev = _read_record(mroot / RECORD_FILE)
    prev = prev if prev and prev.get("machine_id") == here.id else None
    resuming = prev if prev and prev.get("status") != "done" else None
    # a finished loop of this machine: later phases may run again on its sets (and in its record)
    redo = prev is not None and resuming is None and not a.fresh and not any(PHASES[n].samples for n in phases)
    L = Loop(a=a, here=here, root=root, mroot=mroot, models_dir=str(a.models_dir or default_models_dir()),
             store=a.store, record={}, log=log)
    if getattr(a, "plan", False):
        print(plan_text(L, phases, b, why, resuming))
        full = [p for p in L.sets.values() if store_io.has_samples(p)]
        if not resuming and not a.fresh and full and any(PHASES[n].samples for n in phases):
            print(f"  note: {', '.join(L.rel(p) for p in full)} already hold this machine's samples: the loop needs "
                  f"--fresh (they move to {L.rel(mroot / 'previous')}/<time>/) or later phases only")
        return 0
    if a.fresh:
        dest = _move_aside(L)
        if dest:
            log(f"--fresh: moved this machine's earlier sets and record to {L.rel(dest)}")
        resuming = None
    elif not resuming and any(PHASES[n].samples for n in phases):
        full = [p for p in L.sets.values() if store_io.has_samples(p)]
        if full:
            log(f"{', '.join(L.rel(p) for p in full)} already hold samples of this machine and no unfinished loop "
                f"is recorded in {L.rel(L.record_path)}. A loop samples from scratch: add --fresh to move them to "
                f"{L.rel(mroot / 'previous')}/<time>/ first, or run the later phases on them "
                f"(--phases train calibrate speed-check).")
            return 2
    if resuming:
        L.record = resuming
        log(f"resuming the loop started {resuming.get('started_at', '?')[:19]} (record {L.rel(L.record_path)})")
    elif redo:
        L.record = prev
        log(f"running {', '.join(phases)} again in the loop of {prev.get('started_at', '?')[:19]} "
            f"(record {L.rel(L.record_path)})")
    else:
        L.record = {"loop_id": time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:4],
                    "started_at": store_io.now_iso(), "status": "running", "machine_id": here.id,
                    "machine": here.to_dict(), "machine_summary": here.short(), "limit_s": LIMIT_S,
                    "sets": {p: L.rel(d) for p, d in L.sets.items()}, "phases": {}}
    L.record["plan"] = sorted(set(L.record.get("plan", [])) | set(phases), key=list(PHASES).index)
    L.record["budgets_s"] = {**L.record.get("budgets_s", {}), **{n: b[n] for n in phases}}
    print(plan_text(L, phases, b, why, resuming), flush=True)
    mroot.mkdir(parents=True, exist_ok=True)
    L.save()
    t_all = time.monotonic()
    for n in phases:
        ent = L.record["phases"].get(n, {})
        if ent.get("status") == "done" and not redo:
            log(f"phase {n}: done {str(ent.get('finished_at', ''))[:19]}, skipped")
            continue
        if ent.get("status") == "done":
            ent = {}  # run again: its budget starts afresh
        spent_before = float(ent.get("spent_s") or 0) if ent.get("status") in ("interrupted", "failed") else 0.0
        left = max(0.0, b[n] - spent_before)
        t_gate = time.monotonic()
        q = _gate(L) if PHASES[n].measures else None
        gate_s = time.monotonic() - t_gate
        ent = {"status": "running", "budget_s": b[n], "started_at": store_io.now_iso(), "spent_s": spent_before,
               "quiet": q}
        L.record["phases"][n] = ent
        L.save()
        log(f"phase {n}: {PHASES[n].what} (budget {left:.0f} s)")
        t0 = time.monotonic()
        try:
            res = PHASE_FUNCS[n](L, left, q) or {}
        except KeyboardInterrupt:
            ent.update(status="interrupted", spent_s=round(spent_before + time.monotonic() - t0, 1),
                       finished_at=store_io.now_iso())
            L.save()
            raise
        except Exception as exc:  # noqa: BLE001 - recorded, and the loop resumes from this phase
            ent.update(status="failed", error=f"{type(exc).__name__}: {exc}",
                       spent_s=round(spent_before + time.monotonic() - t0, 1), finished_at=store_io.now_iso())
            L.save()
            log(f"phase {n} failed: {type(exc).__name__}: {exc}\nrun the same command again to resume from {n}")
            return 1
        wall = time.monotonic() - t0
        waited = float(res.pop("waited_s", 0.0) or 0.0)
        spent = max(0.0, wall - waited)
        ent.update(status="done", wall_s=round(wall, 1), waited_s=round(waited + gate_s, 1),
                   spent_s=round(spent_before + spent, 1), finished_at=store_io.now_iso(), result=res)
        if ent["spent_s"] > b[n] * 1.1 + 5:
            L.notes.append(f"{n} took {ent['spent_s']:.0f} s, over its {b[n]:.0f} s budget")
        L.save()
        log(f"phase {n}: {ent['spent_s']:.0f} s of {b[n]:.0f} s"
            + (f" (+{ent['waited_s']:.0f} s waiting for a quiet machine)" if ent["waited_s"] >= 1 else ""))
    done = {n: e for n, e in L.record["phases"].items() if e.get("status") == "done"}
    L.record["total_s"] = round(sum(float(e.get("spent_s") or 0) for e in done.values()), 1)
    L.record["waited_s"] = round(sum(float(e.get("waited_s") or 0) for e in done.values()), 1)
    if all(n in done for n in L.record["plan"]):
        L.record["status"] = "done"
        L.record["finished_at"] = store_io.now_iso()
    L.record["notes"] = L.record.get("notes", []) + L.notes
    L.save()
    rows = [["phase", "budget", "spent", "waited", "status"]]
    for n in L.record["plan"]:
        e = L.record["phases"].get(n, {})
        rows.append([n, f"{b.get(n, PHASES[n].budget_s):.0f} s", f"{float(e.get('spent_s') or 0):.0f} s",
                     f"{float(e.get('waited_s') or 0):.0f} s", e.get("status", "not run")])
    rows.append(["total", f"{sum(b[n] for n in L.record['plan']):.0f} s", f"{L.record['total_s']:.0f} s",
                 f"{L.record['waited_s']:.0f} s", L.record["status"]])
    print("\n" + _table(rows))
    for note in L.notes:
        log(f"note: {note}")
    log(f"cpu-platform: {L.record['total_s'] / 60:.1f} min of work this loop (limit {LIMIT_S / 60:.0f}), "
        f"{(time.monotonic() - t_all) / 60:.1f} min wall this run; load average now {loadavg()}")
    return 0

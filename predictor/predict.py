"""The public entry point: model + layout + platform -> StepPrediction.

    from predictor.predict import Predictor
    pred = Predictor("perlmutter-a100").predict(get_preset("llemma-7b"), Layout(...))

Every part of the answer carries the data it rests on:
  measured     a regressor trained on this device's own samples
  transferred  a regressor trained on another device, rescaled by the specs
  stand-in     an op nobody sampled, timed as a related sampled op scaled by work
  analytical   roofline / link specs only (no samples)
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import features
from .compose import ChunkTimes, ComposeOptions, StageTail, compose
from .decompose import CommCall, OpCall, StagePlan, decompose
from .network import analytic_time_s, load_network
from .overhead import HostOverhead, load_host_overhead
from .ops import SHAPE_COLUMNS, STAND_INS
from .platforms import Platform, get_platform
from .specs import InfeasibleConfig, Layout, ModelSpec, as_dict, padded_vocab
from .speed import SpeedCheck, load_speed_check

MODELS_DIR = Path(__file__).resolve().parent.parent / "models_store"


def default_models_dir() -> Path:
    """$PREDICTOR_MODELS_DIR if set, else the project's models_store/."""
    env = os.environ.get("PREDICTOR_MODELS_DIR")
    return Path(env) if env else MODELS_DIR
# Efficiency assumed where only the roofline is known (no samples at all): compute-bound ops
# reach about 60 % of peak, memory-bound ones about 70 % of HBM bandwidth.
ANALYTIC_EFFICIENCY = 0.6
# Expected error of parts without validation data behind them.
ASSUMED_ERROR = {"measured": None, "transferred": 0.15, "stand-in": 0.20, "analytical": 0.30}
HOST_PROVENANCE = "host overhead (fitted on measured runs)"
# Below this much GPU work per layer forward, host (framework) time matters (predictor.overhead).
SHORT_LAYER_PASS_S = 2e-3
GEMM_OPS = {"qkv_proj", "attn_out_proj", "mlp_up", "mlp_down", "lm_head", "attn_scores", "attn_context", "flash_attn"}


@dataclass
class StepPrediction:
    model: ModelSpec
    layout: Layout
    platform_id: str
    step_time_s: float
    breakdown_s: dict[str, float]
    detail_s: dict[str, float]
    ops: pd.DataFrame
    provenance_share: dict[str, float]
    expected_error: float
    error_basis: str
    tokens_per_s: float
    model_tflops_per_gpu: float
    mfu: float
    pipeline_s: float
    critical_stage: int
    timeline: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self, with_ops: bool = True) -> dict[str, Any]:
        d = {
            "platform": self.platform_id, "model": as_dict(self.model), "layout": as_dict(self.layout),
            "step_time_s": self.step_time_s, "expected_error": self.expected_error, "error_basis": self.error_basis,
            "step_time_range_s": [self.step_time_s * (1 - self.expected_error), self.step_time_s * (1 + self.expected_error)],
            "breakdown_s": self.breakdown_s, "detail_s": self.detail_s, "provenance_share": self.provenance_share,
            "tokens_per_s": self.tokens_per_s, "model_tflops_per_gpu": self.model_tflops_per_gpu, "mfu": self.mfu,
            "pipeline_s": self.pipeline_s, "critical_stage": self.critical_stage, "warnings": self.warnings,
        }
        d["layout"]["stage_layers"] = list(self.layout.stage_layers) if self.layout.stage_layers else None
        if with_ops:
            d["ops"] = self.ops.to_dict(orient="records")
        return d

    @property
    def provenance(self) -> str:
        """One-line summary: the share of predicted time resting on each kind of data."""
        return "; ".join(f"{k} {v:.0%}" for k, v in sorted(self.provenance_share.items(), key=lambda kv: -kv[1]) if v > 0.0005)


def model_flops_per_step(model: ModelSpec, layout: Layout) -> float:
    """Model FLOPs of one step (forward + backward = 3x forward, no recomputation), counting
    every matmul including attention scores (Megatron's convention, causal mask not discounted)."""
    h, s, L = model.hidden_size, layout.seq_len, model.num_layers
    hd = model.head_dim
    matmul_params = h * (model.num_heads + 2 * model.kv_heads) * hd + h * h + (3 if model.arch == "llama" else 2) * h * model.ffn
    per_token_fwd = 2 * L * matmul_params + 2 * 2 * L * s * h + 2 * h * padded_vocab(model.vocab_size)
    return 3.0 * per_token_fwd * layout.tokens_per_step


def platform_options(platform: Platform, options: ComposeOptions) -> ComposeOptions:
    """`options` as far as the platform allows: no overlap of collectives with compute where the platform's
    collectives share the compute's cores (Platform.overlaps_comm_with_compute)."""
    if platform.overlaps_comm_with_compute:
        return options
    return replace(options, overlap_grad_reduce=False, overlap_param_gather=False)


class Predictor:
    """Predicts step times on one platform. Holds the regressors, the network model and a
    cache of operator times, so repeated predictions (search) are cheap."""

    def __init__(self, platform: str | Platform, models_dir: str | Path | None = None,
                 options: ComposeOptions = ComposeOptions(), speed_check: SpeedCheck | None = None):
        """`speed_check`: scale the measured operator times by this check instead of the platform's saved
        one (models_store/<platform>/speed_check.json, used when `options.speed_check`)."""
        self.platform = platform if isinstance(platform, Platform) else get_platform(platform)
        self.models_dir = Path(models_dir) if models_dir else default_models_dir()
        self.options = platform_options(self.platform, options)
        self.bank = _load_bank(self.platform.op_models, str(self.models_dir)) if self.platform.op_models else None
        self.coll_bank = (_load_bank(self.platform.collective_models, str(self.models_dir))
                          if self.platform.collective_models else None)
        self.network = load_network(self.platform, self.models_dir)
        self.validation = _load_validation(self.models_dir, self.platform.platform_id)
        self.host = load_host_overhead(self.models_dir, self.platform.platform_id) if options.host_overhead else None
        self.speed, self.notes = speed_check, []
        if self.speed is None and options.speed_check:
            try:
                self.speed = load_speed_check(self.models_dir, self.platform.platform_id)
            except ValueError as exc:
                self.notes.append(f"Speed check ignored: {exc}")
        if self.speed is not None:
            self.notes.append(self.speed.describe() + ".")
        self._op_cache: dict[tuple, tuple[float, str, float | None]] = {}
        self._comm_cache: dict[tuple, tuple[float, str]] = {}

    # ---- operator times -------------------------------------------------------------------
    def time_ops(self, calls: list[OpCall], precision: str) -> None:
        """Fill the cache for all (op, pass, shape) in `calls`, one regressor call per (op, pass)."""
        todo: dict[tuple[str, str, str | None], set] = {}
        for c in calls:
            key = (*c.key, precision)
            if key not in self._op_cache:
                todo.setdefault((c.op, c.pass_, c.variant), set()).add(c.shape)
        for (op, pass_, variant), shapes in todo.items():
            shapes = sorted(shapes, key=lambda t: tuple(-1 if v is None else v for v in t))
            df = pd.DataFrame(shapes, columns=list(SHAPE_COLUMNS))
            if variant is not None:
                df["variant"] = variant
            secs, prov, err = self._predict_op_group(op, pass_, df, precision)
            if self.speed is not None and prov == "measured":
                secs = np.asarray(secs, dtype="float64") * self.speed.speed_factor
            for shp, t in zip(shapes, secs):
                self._op_cache[(op, pass_, shp, variant, precision)] = (float(t), prov, err)

    def _predict_op_group(self, op: str, pass_: str, df: pd.DataFrame, precision: str):
        """Seconds per shape row, provenance, and the expected relative error of those seconds.
        measured: own regressor (error = its CV MAPE); transferred: the regressor of the sampled platform
        in `op_models`, evaluated on ITS device and rescaled to this one by `transfer.predict_transferred`
        (error = the measured A100<->GH200 transfer error of that op, models_store/transfer_validation.json)."""
        from . import transfer
        dev = self.platform.device
        dev.check_precision(precision)
        dev.check_op(op)
        own = self.platform.op_models in (None, self.platform.platform_id) or self._same_device()
        src = None if own else transfer.source_device(self.platform)
        tval = None if own else transfer.cached_validation(self.models_dir)
        label = f"transferred from {self.platform.op_models}"
        if self.bank is not None and self.bank.has_op(op, pass_):
            info = self.bank.op_info(op, pass_)
            if not transfer.trustworthy(info):
                # most samples behind this regressor are physically impossible: take another sampled GPU's
                alt = transfer.alternative_source(op, pass_, dev, self.models_dir, exclude=(self.platform.op_models,))
                if alt is not None:
                    pid, abank, adev = alt
                    if adev.device_id == dev.device_id:
                        return abank.predict_op(op, pass_, df, dev, precision), "measured", abank.op_info(op, pass_).get("cv_mape")
                    t = transfer.predict_transferred(abank, op, pass_, df, adev, dev, precision)
                    return (t, f"transferred from {pid} ({self.platform.op_models} samples of it fail the physical bound)",
                            transfer.transfer_error(transfer.cached_validation(self.models_dir), op, pass_, pid))
            if own:
                return self.bank.predict_op(op, pass_, df, dev, precision), "measured", info.get("cv_mape")
            if src is None:  # source platform unknown to the catalog: its regressor on this device's spec
                return self.bank.predict_op(op, pass_, df, dev, precision), label, transfer.transfer_error(tval)
            t = transfer.predict_transferred(self.bank, op, pass_, df, src, dev, precision)
            # the measured transfer error already contains the source regressor's own error
            return t, label, transfer.transfer_error(tval, op, pass_, self.platform.op_models)
        stand = STAND_INS.get(op)
        if stand and self.bank is not None and self.bank.has_op(stand, pass_):
            if own or src is None:
                t = self.bank.predict_op(stand, pass_, df, dev, precision)
            else:
                t = transfer.predict_transferred(self.bank, stand, pass_, df, src, dev, precision)
            ratio = (features.roofline_s(op, pass_, df, dev, precision)
                     / features.roofline_s(stand, pass_, df, dev, precision))
            return t * ratio, "stand-in", None
        t = features.roofline_s(op, pass_, df, dev, precision) / ANALYTIC_EFFICIENCY
        return t, "analytical", None

    def _same_device(self) -> bool:
        """Whether the regressors in `op_models` were trained on this very device (then they are
        this platform's own measurements, not a transfer)."""
        if not self.platform.op_models:
            return True
        try:
            return get_platform(self.platform.op_models).device.device_id == self.platform.device.device_id
        except InfeasibleConfig:
            return False

    # ---- collective times -----------------------------------------------------------------
    def time_comm(self, c: CommCall) -> tuple[float, str]:
        if c.ranks <= 1 or c.message_bytes <= 0:
            return 0.0, "none"
        key = (c.collective, c.message_bytes, c.nodes, c.gpus_per_node)
        hit = self._comm_cache.get(key)
        if hit is not None:
            return hit
        res = None
        cb = self.coll_bank
        if cb is not None and cb.has_collective(c.collective):
            # the sample store (and so the regressors) keeps the paper's convention: an all-gather's
            # message is the per-rank input; decompose passes the full output buffer
            msg = max(1, c.message_bytes // (c.nodes * c.gpus_per_node)) if c.collective == "allgather" else c.message_bytes
            covers = cb.covers_collective(c.collective, np.array([msg]), np.array([c.nodes]),
                                          np.array([c.gpus_per_node]))
            if bool(np.asarray(covers)[0]):
                t = cb.predict_collective(c.collective, np.array([msg]), np.array([c.nodes]),
                                          np.array([c.gpus_per_node]), self.platform)
                res = (float(np.asarray(t)[0]), "measured")
        if res is None:
            t = analytic_time_s(self.network, c.collective, np.array([c.message_bytes]), np.array([c.nodes]),
                                np.array([c.gpus_per_node]))
            calibrated = self.network.intra.source != "link spec" or self.network.inter.source != "link spec"
            res = (float(t[0]), "analytical" + (" (calibrated)" if calibrated else ""))
        self._comm_cache[key] = res
        return res

    # ---- the step -------------------------------------------------------------------------
    @staticmethod
    def _add_host(ch: ChunkTimes, layers: int, recompute: str, host: HostOverhead) -> None:
        """Blend the host time of issuing this chunk's layers with its GPU time (predictor.overhead)."""
        for phase, d in (("fwd", ch.fwd), ("bwd", ch.bwd)):
            g = d.get("compute", 0.0) + d.get("tp_comm", 0.0)
            d["host_overhead"] = float(host.extra_s(g, layers, phase, recompute))

    def predict(self, model: ModelSpec, layout: Layout, *, timeline: bool = True) -> StepPrediction:
        plans, rows, chunks, tails = self.chunk_times(model, layout)
        if self.host is not None:
            for plan, ch in zip(plans, chunks):
                self._add_host(ch, plan.layers, layout.recompute, self.host)
                for phase, d in (("fwd", ch.fwd), ("bwd", ch.bwd)):
                    if d.get("host_overhead", 0.0) > 0:
                        rows.append((plan.stage, plan.chunk, "layer", phase, "host overhead", phase, "host_overhead",
                                     1, d["host_overhead"], d["host_overhead"], HOST_PROVENANCE, self.host.cv_mape))
        notes = []
        if self.host is None and self.options.host_overhead:
            per_pass = [(ch.fwd["compute"] + ch.fwd["tp_comm"]) / pl.layers for pl, ch in zip(plans, chunks) if pl.layers]
            if per_pass and min(per_pass) < SHORT_LAYER_PASS_S:
                notes.append(f"Kernels are short here ({min(per_pass) * 1e3:.2f} ms of GPU work per layer forward) and "
                             f"this platform has no fitted host overhead: eager frameworks add host time per layer "
                             f"(about 1 ms per layer pass on dgx-a100-80gb, fitted on measured runs), so this "
                             f"prediction may be low. Fit one with `python -m predictor calibrate-host` on your runs.")
        opts = self.options if timeline else ComposeOptions(**{**asdict(self.options), "simulate": False})
        comp = compose(chunks, tails, pp=layout.pp, vpp=layout.vpp,
                       m=layout.num_micro_batches, schedule=layout.schedule, options=opts)
        pred = self._finish(model, layout, comp, rows)
        pred.warnings.extend(self.notes + notes)
        return pred

    def end_to_end_error(self) -> tuple[float, int | str, str] | None:
        """(MAPE, measured runs, how) from the platform's validation.json: the speed-checked MAPE when a
        speed check scales this predictor's times and the validation has one, else the plain one."""
        val = self.validation or {}
        if self.speed is not None and val.get("mape_speed_checked") is not None:
            return (float(val["mape_speed_checked"]), val.get("n_runs_speed_checked", "?"),
                    " with a speed check around each run")
        if val.get("mape") is None:
            return None
        how = (f" over {val['measuring_runs']} measuring runs, as sampled" if val.get("measuring_runs", 1) > 1
               else "")
        return float(val["mape"]), val.get("n_runs", "?"), how

    def chunk_times(self, model: ModelSpec, layout: Layout):
        """Decompose and time: (plans, op rows, per-chunk micro-batch times without host overhead,
        per-stage tails), the inputs of `compose`."""
        plans = decompose(model, layout, self.platform)
        all_calls = [c for p in plans for c in p.ops + p.step_ops]
        self.time_ops(all_calls, layout.precision)
        rows: list[tuple] = []
        chunks: list[ChunkTimes] = []
        tails: dict[int, StageTail] = {}
        for plan in plans:
            fwd = {"compute": 0.0, "tp_comm": 0.0, "pp_comm": 0.0, "dp_comm": 0.0}
            bwd = dict(fwd)
            recompute = 0.0
            for c in plan.ops:
                t, prov, err = self._op_cache[(*c.key, layout.precision)]
                total = t * c.count * c.scale
                (fwd if c.phase == "fwd" else bwd)["compute"] += total
                if c.phase == "recompute":
                    recompute += total
                rows.append((plan.stage, plan.chunk, c.part, c.phase, c.op, c.pass_, "compute", c.count, t, total, prov, err))
            # ZeRO-2/3 (FSDP) traffic per micro-batch: [total, longest single call] by phase
            zero3 = {"fwd": [0.0, 0.0], "bwd": [0.0, 0.0]}
            for c in plan.comms:
                t, prov = self.time_comm(c)
                total = t * c.count
                cat = {"tp": "tp_comm", "pp": "pp_comm", "dp": "dp_comm"}[c.group]
                if c.group == "dp":  # ZeRO-2/3 gathers and reduce-scatters, prefetched under compute
                    z = zero3["fwd" if c.phase == "fwd" else "bwd"]
                    z[0] += total
                    z[1] = max(z[1], t)
                else:
                    (fwd if c.phase == "fwd" else bwd)[cat] += total
                rows.append((plan.stage, plan.chunk, c.group, c.phase, f"{c.collective}[{c.group}]", c.phase, cat,
                             c.count, t, total, prov, None))
            for d, k in ((fwd, "fwd"), (bwd, "bwd")):
                # exposed: what compute cannot cover, and at least one unit (the first gather of the
                # forward, the last reduce-scatter of the backward wait on / for compute)
                z_total, z_unit = zero3[k]
                d["dp_comm"] = max(z_unit, z_total - d["compute"]) if z_total > 0 else 0.0
            chunks.append(ChunkTimes(plan.stage, plan.chunk, fwd, bwd, recompute))
            tail = tails.setdefault(plan.stage, StageTail(plan.stage, 0.0, 0.0, 0.0, 0.0, 0.0))
            dp_s = gather_s = emb_s = 0.0
            for c in plan.step_comms:
                t, prov = self.time_comm(c)
                if c.group == "embedding":
                    emb_s += t
                elif c.collective == "allgather":
                    gather_s += t
                else:
                    dp_s += t
                rows.append((plan.stage, plan.chunk, c.group, "step", f"{c.collective}[{c.group}]", "step", "dp_comm",
                             1, t, t, prov, None))
            opt_s = 0.0
            for c in plan.step_ops:
                t, prov, err = self._op_cache[(*c.key, layout.precision)]
                opt_s += t * c.count
                rows.append((plan.stage, plan.chunk, c.part, "step", c.op, c.pass_, "optimizer", c.count, t, t * c.count, prov, err))
            last_bwd = bwd["compute"] - recompute
            tails[plan.stage] = StageTail(plan.stage, tail.dp_comm_s + dp_s, tail.param_gather_s + gather_s,
                                          tail.embedding_sync_s + emb_s, tail.optimizer_s + opt_s,
                                          tail.last_bwd_compute_s + last_bwd)
        return plans, rows, chunks, [tails[st] for st in sorted(tails)]

    def _finish(self, model: ModelSpec, layout: Layout, comp, rows: list[tuple]) -> StepPrediction:
        ops = pd.DataFrame(rows, columns=["stage", "chunk", "part", "phase", "op", "pass", "category", "count",
                                          "seconds_each", "seconds_total", "provenance", "cv_mape"])
        share, err, basis = self._confidence(ops, comp.breakdown_s, layout)
        flops = model_flops_per_step(model, layout)
        tflops_gpu = flops / comp.step_time_s / layout.num_gpus / 1e12
        peak = self.platform.device.peak_flops(layout.precision) / 1e12
        warnings = []
        if share.get("analytical", 0) + share.get("analytical (calibrated)", 0) > 0.5:
            warnings.append("More than half of this prediction rests on analytical estimates, not measured samples.")
        return StepPrediction(
            model=model, layout=layout, platform_id=self.platform.platform_id, step_time_s=comp.step_time_s,
            breakdown_s=comp.breakdown_s, detail_s=comp.detail_s, ops=ops, provenance_share=share,
            expected_error=err, error_basis=basis, tokens_per_s=layout.tokens_per_step / comp.step_time_s,
            model_tflops_per_gpu=tflops_gpu, mfu=tflops_gpu / peak, pipeline_s=comp.pipeline_s,
            critical_stage=comp.critical_stage, timeline=comp.timeline, warnings=warnings)

    def _confidence(self, ops: pd.DataFrame, breakdown: dict[str, float], layout: Layout):
        """Share of the step's work per provenance (all stages; per-micro-batch rows counted once per
        micro-batch), and the expected error band: the time-weighted error of the
        parts (measured ops: their CV error; transferred ops: the measured cross-GPU transfer error;
        collectives from the analytic network: its fit / leave-one-platform-out error; the rest:
        ASSUMED_ERROR), combined with the end-to-end validation error of the platform where one has
        been measured. The basis names each part's share and error."""
        from .network import expected_error
        comm_cats = {"tp_comm", "pp_comm", "dp_comm"}
        net_err, net_basis = expected_error(self.network, self.models_dir)
        m = float(max(layout.num_micro_batches, 1))
        # plain Python over the rows: this runs once per prediction and pandas' groupby costs ms
        secs: dict[str, float] = {}
        werr: dict[str, float] = {}
        any_comm = False
        cols = list(ops.columns)
        i_phase, i_cat, i_tot, i_prov, i_cv = (cols.index(c) for c in ("phase", "category", "seconds_total",
                                                                         "provenance", "cv_mape"))
        for r in ops.itertuples(index=False, name=None):
            t = r[i_tot]
            if not t > 0:
                continue
            t = t * (1.0 if r[i_phase] == "step" else m)
            prov, cat, cv = r[i_prov], r[i_cat], r[i_cv]
            comm = cat in comm_cats
            any_comm = any_comm or comm
            base = prov.split(" ")[0]
            cv = None if cv is None or cv != cv else float(cv)
            if base == "measured":
                e = 0.10 if cv is None else cv
            elif base in ("transferred", "host"):
                e = ASSUMED_ERROR["transferred"] if cv is None else cv
            elif base == "analytical":
                e = net_err if comm else ASSUMED_ERROR["analytical"]
            else:
                e = ASSUMED_ERROR.get(base) or 0.3
            secs[prov] = secs.get(prov, 0.0) + t
            werr[prov] = werr.get(prov, 0.0) + t * e
        total_s = sum(secs.values())
        share = {k: v / total_s for k, v in secs.items()} if total_s > 0 else {}
        op_err_parts = list(werr.values())
        notes = [f"{prov} {secs[prov] / total_s:.0%} (+/-{werr[prov] / secs[prov]:.0%})"
                 for prov in sorted(secs) if total_s > 0 and secs[prov] / total_s >= 0.005]
        op_err = float(sum(op_err_parts) / total_s) if total_s > 0 else 0.3
        parts = "; ".join(notes)
        if any(n.startswith("analytical") for n in notes) and any_comm:
            parts += f" [{net_basis}]"
        if any(n.startswith("transferred") for n in notes):
            parts += " [transfer error measured A100<->GH200, python -m tests.benchmarks.transfer_accuracy]"
        val = self.validation
        e2e = self.end_to_end_error()
        if e2e is not None:
            mape, n, how = e2e
            err = math.sqrt(op_err ** 2 + mape ** 2)
            basis = (f"parts {op_err:.1%} combined with end-to-end MAPE {mape:.1%} on {n} measured runs{how} "
                     f"({val.get('source', 'validation')}); {parts}")
        else:
            err = math.sqrt(op_err ** 2 + 0.15 ** 2)
            basis = (f"parts {op_err:.1%}; composition not validated end to end on this platform "
                     f"(15 % assumed); {parts}")
        return share, err, basis


@lru_cache(maxsize=16)
def _load_bank(platform_id: str, models_dir: str):
    path = Path(models_dir) / platform_id
    if not any(path.glob("*.txt")):
        return None
    from .regressors import ModelBank
    return ModelBank.load(platform_id, models_dir=Path(models_dir))


def _load_validation(models_dir: Path, platform_id: str) -> dict | None:
    path = Path(models_dir) / platform_id / "validation.json"
    if path.exists():
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None
    return None


@lru_cache(maxsize=16)
def get_predictor(platform_id: str, models_dir: str | None = None) -> Predictor:
    """A cached Predictor per platform (the CLI, the dashboard and search share it)."""
    return Predictor(platform_id, models_dir)


def predict_step(model: ModelSpec, layout: Layout, platform_id: str, models_dir: str | None = None,
                 timeline: bool = True) -> StepPrediction:
    return get_predictor(platform_id, models_dir).predict(model, layout, timeline=timeline)

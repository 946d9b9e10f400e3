"""The public entry point: model + layout + platform -> StepPrediction.

    from predictor.plan.predict import Predictor
    pred = Predictor("perlmutter-a100").predict(get_preset("llemma-7b"), Layout(...))

Every part of the answer carries the data it rests on:
  measured     a regressor trained on this device's own samples (on a platform with `kernel_models`: the published
               kernel tables of that device; the backward GEMMs are the same forward grid at their shapes)
  derived      a measured time turned into another pass by a stated rule (flash-attention backward = the measured
               forward x the bwd/fwd ratio the paper's samples measure)
  transferred  a regressor trained on another device, rescaled by the specs
  stand-in     an op nobody sampled, timed as a related sampled op scaled by work
  analytical   roofline / link specs only (no samples)

The numbers come from the one step-time engine (`predictor.step.engine`), the same that ranks layouts in
`predictor.plan.search` and predicts batches (`Predictor.predict_many`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from predictor import paths
from predictor.hardware.network import analytic_time_s, expected_error, load_network_checked
from predictor.hardware.platforms import Platform, get_platform
from predictor.hardware.speed import SpeedCheck, load_speed_check_checked
from predictor.model.errors import InfeasibleConfig
from predictor.model.ops import OP_SHAPE_COLUMNS, STAND_INS
from predictor.model.params import layer_matmul_params, padded_vocab
from predictor.model.specs import Layout, ModelSpec, as_dict
from predictor.model.stages import chunk_rank
from predictor.paths import ArtifactError
from predictor.plan.accuracy_record import DeviceCheck
from predictor.plan.accuracy_record import band_words as independent_band_words
from predictor.plan.accuracy_record import load_checked as load_independent_checked
from predictor.regress import features
from predictor.step import fp8
from predictor.step.alignment import simt_floor_s
from predictor.step.compose import ChunkTimes, ComposeOptions, simulate_pipeline
from predictor.step.decompose import FA2_BASE, FUSED, CommCall, OpCall
from predictor.step.engine import (
    HOST_PROVENANCE,
    TERMS_HOST_PROVENANCE,
    Engine,
    Evaluation,
    Structure,
    chunk_dense,
    class_keys,
    rows_for,
    separate_accumulation,
    structure_classes,
    unit_key,
    unit_keys,
)
from predictor.step.memory import GIB, MemoryOptions, MemoryReport, report_from_arrays
from predictor.step.overhead import load_host_overhead_checked
from predictor.step.terms import causal_attention_factors, host_share_bin, load_own_terms_checked, load_terms_checked

# op_times' group of the optimizer's stage variants (one regressor call for every variant, the variant a feature)
OPTIMIZER_GROUP = "optimizer-variants"

PAPER_SOURCE_PREFIX = "arXiv 2509.22832"  # regressors.PAPER_SOURCE: the paper's (non-causal) samples

MODELS_DIR = paths.PACKAGED_MODELS_DIR


def default_models_dir() -> Path:
    """$PREDICTOR_MODELS_DIR if set, else the project's models_store/ (see predictor.paths)."""
    return paths.models_dir()


# Efficiency assumed where only the roofline is known (no samples at all): compute-bound ops
# reach about 60 % of peak, memory-bound ones about 70 % of HBM bandwidth.
ANALYTIC_EFFICIENCY = 0.6
# Flash-attention backward / forward time: the median over the paper's 4,071 A100 flash_atten samples (Perlmutter,
# flash-attn 2.5.6, fp16; B_dur / F_dur: quartiles 2.95 / 3.135 / 3.39). The GH200 file is not used: 82 % of its
# backward rows fail the physical bound (tests/test_kernel_tables_predict.py recomputes the value from the file).
FLASH_BWD_OVER_FWD = 3.135
# The published kernel tables against another harness on the same GPU: the collector's A100 bf16 grid predicts the
# paper's Perlmutter linear-layer samples at a median ratio of 1.01-1.05 per op (tests.benchmarks.measured_kernels,
# "A100 cross-harness"): a harness bias of about 3 %, added to every measured-table operator's error
CROSS_HARNESS_BIAS = 0.03


def measured_table_error(info: dict[str, Any]) -> float:
    """The expected relative error of an operator timed from a published kernel table: the larger of its
    regressor's random-split CV MAPE and its error with whole ranges of the grid held out (`block_heldout`, written
    by training.block_heldout_error), combined with the cross-harness bias."""
    cv = float(info.get("cv_mape") or 0.0)
    held = float((info.get("block_heldout") or {}).get("mape") or 0.0)
    return math.hypot(max(cv, held), CROSS_HARNESS_BIAS)


def grid_pass_s(grid: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray], op: str, pass_: str,
                shapes: dict[str, np.ndarray]) -> np.ndarray:
    """Seconds of a linear layer's GEMMs in one pass from a forward GEMM grid `grid(m, n, k)`: the forward at the
    layer's (M, N, K); the backward's data gradient [M, N] x [N, K] plus weight gradient [K, M] x [M, N], the same
    grid at those shapes."""
    M, N, K, _ = features.gemm_mnk(op, features.derived_dims(shapes))
    if pass_ == "fwd":
        return grid(M, N, K)
    return grid(M, K, N) + grid(K, N, M)


FLASH_BWD_RATIO_SPREAD = 0.07  # half the interquartile range over the median: (3.39 - 2.95) / 2 / 3.135
KERNEL_GEMM_OPS = tuple(o for o in features.GEMM_OPS if o not in features.GRID_GEMM_OPS)  # what the grid times
BWD_GEMM_PROVENANCE = "measured (derived: the forward GEMM grid at the data- and weight-gradient shapes)"
FLASH_BWD_PROVENANCE = (f"derived (flash-attention forward measured x {FLASH_BWD_OVER_FWD:g}, the bwd/fwd ratio of "
                        f"the paper's A100 samples)")
FUSED_PROVENANCE = "analytical (fused kernel)"
# Expected error of an end-to-end composition not validated on this platform.
UNVALIDATED_COMPOSITION_ERROR = 0.15
# Below this much GPU work per layer forward, host (framework) time matters (predictor.step.overhead).
SHORT_LAYER_PASS_S = 2e-3
OP_COLUMNS = ["stage", "chunk", "part", "phase", "op", "pass", "category", "count", "seconds_each", "seconds_total",
              "provenance", "cv_mape", "per"]
# `per`: how often a row's calls happen: every micro-batch (its count is per micro-batch) or once per step (the
# data-parallel gradient / parameter traffic, the optimizer, the embedding all-reduce)
PER_MICRO_BATCH, PER_STEP = "micro-batch", "step"


@dataclass
class StepPrediction:
    model: ModelSpec
    layout: Layout
    platform_id: str
    step_time_s: float
    breakdown_s: dict[str, float]
    detail_s: dict[str, float]
    provenance_share: dict[str, float]
    expected_error: float
    error_basis: str
    tokens_per_s: float
    model_tflops_per_gpu: float
    mfu: float
    pipeline_s: float
    critical_stage: int
    memory: MemoryReport | None = None
    timeline: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    host_overhead_modelled: bool = False
    memory_gib: float = float("nan")    # peak memory per GPU (the fullest stage), as nvidia-smi reports it
    memory_allocated_gib: float = float("nan")  # the fullest stage as torch.cuda.max_memory_allocated counts it
    memory_reserved_gib: float = float("nan")   # ... and as torch.cuda.max_memory_reserved counts it
    fits_memory: bool = True            # whether that peak fits in the device's usable memory
    memory_tight: bool = False          # fits only with the least allocator reserve seen (memory.MemoryReport.tight)
    usable_gib: float = float("nan")    # the device's memory less the allocator reserve
    hbm_gib: float = float("nan")       # the device's memory
    op_rows: list[tuple] = field(default_factory=list, repr=False)

    @property
    def ops(self):
        """Every operator / collective call of the step with its time (a DataFrame, built on demand)."""
        import pandas as pd
        return pd.DataFrame(self.op_rows, columns=OP_COLUMNS)

    @property
    def fits(self) -> bool:
        return self.fits_memory

    def to_dict(self, with_ops: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "platform": self.platform_id, "model": as_dict(self.model), "layout": as_dict(self.layout),
            "step_time_s": self.step_time_s, "expected_error": self.expected_error, "error_basis": self.error_basis,
            "step_time_range_s": [self.step_time_s * (1 - self.expected_error),
                                  self.step_time_s * (1 + self.expected_error)],
            "breakdown_s": dict(self.breakdown_s), "detail_s": self.detail_s,
            "provenance_share": self.provenance_share, "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu, "mfu": self.mfu, "pipeline_s": self.pipeline_s,
            "critical_stage": self.critical_stage, "warnings": self.warnings,
            "host_overhead_modelled": self.host_overhead_modelled,
        }
        if not self.host_overhead_modelled:  # not modelled: empty, never a measured-looking 0
            d["breakdown_s"]["host_overhead"] = None
        d["memory_gib"] = self.memory_gib
        d["memory_allocated_gib"] = self.memory_allocated_gib
        d["memory_reserved_gib"] = self.memory_reserved_gib
        d["fits"] = self.fits_memory
        d["memory_tight"] = self.memory_tight
        d["usable_gib"] = self.usable_gib
        if self.memory is not None:
            d["memory"] = self.memory.to_dict()
        d["layout"]["stage_layers"] = list(self.layout.stage_layers) if self.layout.stage_layers else None
        if with_ops:
            d["ops"] = self.ops.to_dict(orient="records")
        return d

    @property
    def provenance(self) -> str:
        """One-line summary: the share of predicted time resting on each kind of data."""
        return "; ".join(f"{k} {v:.0%}" for k, v in sorted(self.provenance_share.items(), key=lambda kv: -kv[1])
                         if v > 0.0005)


def model_flops_per_step(model: ModelSpec, layout: Layout) -> float:
    """Model FLOPs of one step (forward + backward = 3x forward, no recomputation), counting
    every matmul including attention scores (Megatron's convention, causal mask not discounted)."""
    h, s, L = model.hidden_size, layout.seq_len, model.num_layers
    # attention scores and context: 2 matmuls of s x (heads * head_dim) per token (= s x h unless head_dim is
    # decoupled from hidden / heads)
    # MoE: the active parameters (router, shared and top_k routed experts) of the MoE layers
    gemm = (L - model.moe_layers) * layer_matmul_params(model) + model.moe_layers * layer_matmul_params(model, True)
    # MLA: Q K^T at heads * (qk_nope + qk_rope), P V at heads * v_head_dim
    attn = (model.num_heads * (model.qk_head_size + model.v_head_size) / 2 if model.is_mla else model.attn_width)
    w = model.sliding_window
    if w is not None and s > w:   # windowed layers: (s*W - W^2/2) of the causal s^2/2 score work
        f = model.full_attention_share
        attn *= f + (1.0 - f) * (s * w - w * w / 2) / (s * s / 2)
    per_token_fwd = (2 * gemm + 2 * 2 * L * s * attn
                     + 2 * h * padded_vocab(model.vocab_size))
    return 3.0 * per_token_fwd * layout.tokens_per_step


def platform_options(platform: Platform, options: ComposeOptions) -> ComposeOptions:
    """`options` as far as the platform allows: no overlap of collectives with compute where the platform's
    collectives share the compute's cores (Platform.overlaps_comm_with_compute)."""
    if platform.overlaps_comm_with_compute:
        return options
    return replace(options, overlap_grad_reduce=False, overlap_param_gather=False)


class Predictor:
    """Predicts step times on one platform. Holds the regressors, the network model, a cache of
    operator and collective times and the step-time engine, so repeated predictions are cheap."""

    def __init__(self, platform: str | Platform, models_dir: str | Path | None = None,
                 options: ComposeOptions = ComposeOptions(), speed_check: SpeedCheck | None = None,
                 memory_options: MemoryOptions = MemoryOptions()):
        """`speed_check`: scale the measured operator times by this check instead of the platform's saved
        one (models_store/<platform>/speed_check.json, used when `options.speed_check`)."""
        from predictor.regress.regressors import load_bank
        self.platform = platform if isinstance(platform, Platform) else get_platform(platform)
        paths.check_platform_ids(self.platform)   # before any file of the platform is opened
        self.models_dir = paths.models_dir(models_dir)
        self.options = platform_options(self.platform, options)
        self.bank = load_bank(self.platform.op_models, self.models_dir) if self.platform.op_models else None
        self.coll_bank = (load_bank(self.platform.collective_models, self.models_dir)
                          if self.platform.collective_models else None)
        # published kernel tables of this device (Platform.kernel_models): its GEMMs and flash attention
        km = self.platform.kernel_models
        self.kernel_bank = (None if not km else self.bank if km == self.platform.op_models
                            else load_bank(km, self.models_dir))
        self.notes: list[str] = []   # said with every prediction: degraded artifacts, the speed check
        for bank in dict.fromkeys(b for b in (self.bank, self.coll_bank, self.kernel_bank) if b is not None):
            if bank is not None and bank.degraded:
                self.notes += bank.warnings()
        self.network, warn = load_network_checked(self.platform, self.models_dir)
        self._note(warn)
        self.network_error, self.network_basis = expected_error(self.network, self.models_dir)
        self.validation, warn = paths.load_platform_validation_checked(self.platform.platform_id, self.models_dir)
        self._note(warn)
        self.terms = None   # end-to-end terms (predictor.step.terms): GPU platforms
        if self.platform.device.vendor == "cpu":
            from predictor.hardware.machine import mismatch_warning  # CPU samples describe the machine that took them
            self._note(mismatch_warning(self.platform.op_models or self.platform.platform_id, self.models_dir))
        else:
            self.terms, warn = load_terms_checked(self.models_dir)
            self._note(warn)
        self.own_runs: dict[str, Any] | None = None   # a platform calibrated on its own runs: what they gave
        if self.platform.calibrated_from:
            own, warn = load_own_terms_checked(self.platform.platform_id)
            self._note(warn)
            if own is not None:
                self.terms, self.own_runs = own, dict(own.validation["own_runs"])
        self.independent: list[DeviceCheck] = []   # what the independent checks measured on this GPU
        self._independent_dates = ("", "")
        if self.platform.device.vendor != "cpu":
            rec, warn = load_independent_checked(self.models_dir)
            self._note(warn)
            if rec is not None:
                self.independent = rec[0].get(self.platform.device.device_id, [])
                self._independent_dates = (rec[1], rec[2])
        self.host = None
        if options.host_overhead:
            self.host, warn = load_host_overhead_checked(self.models_dir, self.platform.platform_id)
            self._note(warn)
        self.speed = speed_check
        if self.speed is None and options.speed_check:
            self.speed, warn = load_speed_check_checked(self.models_dir, self.platform.platform_id)
            self._note(warn)
        if self.speed is not None:
            self.notes.append(self.speed.describe() + ".")
        self.engine = Engine(self, memory_options)
        self._op_cache: dict[tuple, tuple[float, str, float | None]] = {}
        self._comm_cache: dict[tuple, tuple[float, str]] = {}
        self._ideal_cache: dict[tuple, float] = {}

    def _note(self, warning: str | None) -> None:
        if warning:
            self.notes.append(warning)

    # ---- operator times -------------------------------------------------------------------
    @property
    def own_measurements(self) -> bool:
        """Whether the operator regressors were trained on this very device (measured, not transferred)."""
        if not self.platform.op_models or self.platform.op_models == self.platform.platform_id:
            return True
        try:
            return get_platform(self.platform.op_models).device.device_id == self.platform.device.device_id
        except InfeasibleConfig:
            return False

    def op_times(self, calls: Sequence[OpCall], precision: str) -> list[tuple[float, str, float | None]]:
        """(seconds of one call, provenance, expected relative error) per call; one regressor call per
        (operator, pass) for every shape not cached yet."""
        todo: dict[tuple[str, str, str | None], dict] = {}
        cache = self._op_cache
        base = fp8.base_precision(precision)  # fp8: every regressor is asked for bf16 (predictor.step.fp8)
        # the device runs the step's precision (and, under fp8, the BF16 rest); checked in that order, so the
        # message names the precision asked for
        for p in dict.fromkeys((precision, base)):
            self.platform.device.check_precision(p)
        keys = [(*c.key, precision) for c in calls]
        for c, k in zip(calls, keys):
            if k not in cache:
                # the optimizer's stage variants are a feature of one regressor: one call for all of them
                group = OPTIMIZER_GROUP if c.variant in features.OPTIMIZER_VARIANTS else c.variant
                todo.setdefault((c.op, c.pass_, group), {})[(c.shape, c.variant)] = None
        for (op, pass_, group), keyed in todo.items():
            shapes = [s_ for s_, _v in keyed]
            variants = [v_ for _s, v_ in keyed]
            arrays = features.arrays_from_shapes(shapes, variants)
            if group == FUSED:   # the framework's fused kernel (predictor.model.frameworks): one pass over memory
                self.platform.device.check_op(op)
                t_f = np.asarray(features.fused_kernel_s(op, pass_, arrays, self.platform.device, base), "float64")
                for s_, v_, t in zip(shapes, variants, t_f):
                    cache[(op, pass_, s_, v_, precision)] = (float(t), FUSED_PROVENANCE, None)
                    self._ideal_cache[(op, pass_, s_, v_, precision)] = 0.0
                continue
            tables = group != FA2_BASE  # Triton attention: an FA2 base, not the published (FMHA) attention
            try:
                secs, prov, err = self._predict_op_group(op, pass_, arrays, base, tables)
            except ArtifactError as e:  # a model file changed on disk after it was checked: fall back, say so
                self._note(f"Model {op}.{pass_} was not used: {e}")
                secs, prov, err = self._predict_op_group(op, pass_, arrays, base, tables)
            secs = np.asarray(secs, dtype="float64")
            if self.speed is not None and prov == "measured":
                secs = secs * self.speed.speed_factor
            ideal = self._achievable_floor_s(op, pass_, arrays, base)
            causal = op == "flash_attn" and self._flash_samples_causal(pass_, tables)
            if causal:  # causal samples: the kernel computes only the blocks on and below the diagonal
                ideal = np.asarray(ideal) * causal_attention_factors(arrays["seq"])
            # no tensor-core kernel below MAMF; none for unaligned shapes below the FP32 peak (predictor.step.alignment)
            secs = np.maximum(np.maximum(secs, ideal), simt_floor_s(op, pass_, arrays, self.platform.device, base))
            fmt = (self._kernel_format_gemm(op, pass_, arrays, precision)
                   if tables and fp8.is_fp8_gemm(op, precision) else None)
            if fmt is not None:  # the format's own measured GEMM grid + the cast passes
                t_fmt, prov, err = fmt
                if self.speed is not None:
                    t_fmt = t_fmt * self.speed.speed_factor
                secs, ideal = fp8.measured_gemm_times(op, pass_, arrays, t_fmt, self.platform.device,
                                                      self.achievable_flops(base), precision)
            elif fp8.is_fp8_gemm(op, precision):  # the BF16 GEMM time x the format's ratio + the cast passes
                secs, ideal, how = fp8.gemm_times(op, pass_, arrays, secs, self.platform.device,
                                                  self.achievable_flops(base), precision)
                prov, err = f"{prov} ({how})", max(err or 0.0, fp8.FORMATS[precision].assumed_error)
            if op == "flash_attn" and not causal:
                # samples (or the roofline) of the non-causal kernel; a decoder's causal kernel computes only the
                # blocks on and below the diagonal
                k = causal_attention_factors(arrays["seq"])
                secs, ideal = secs * k, np.asarray(ideal) * k
            ideal = np.broadcast_to(np.asarray(ideal, dtype="float64"), secs.shape)
            for s, v_, t, i in zip(shapes, variants, secs, ideal):
                cache[(op, pass_, s, v_, precision)] = (float(t), prov, err)
                self._ideal_cache[(op, pass_, s, v_, precision)] = float(i)
        return [cache[k] for k in keys]

    def op_ideal_s(self, calls: Sequence[OpCall], precision: str) -> list[float]:
        """Per call: its FLOPs over the achievable matmul throughput (tensor-core operators; 0 for the rest),
        the time it would take at the device's measured maximum. After `op_times` on the same calls."""
        return [self._ideal_cache.get((*c.key, precision), 0.0) for c in calls]

    def achievable_flops(self, precision: str) -> float | None:
        """The device's measured maximum achievable matmul FLOP/s (MAMF), else its peak scaled by the MAMF/peak
        ratio of the sampled device behind it; None where neither is known (a CPU). On a platform whose BF16 GEMMs
        come from a measured grid, never above the grid's best throughput (its `grid_best_flops`)."""
        dev = self.platform.device
        ach = dev.achievable_flops(precision)
        kb = self.kernel_bank
        if ach and precision in ("bf16", "fp16") and kb is not None and kb.has_op("gemm", "fwd"):
            best = kb.op_info("gemm", "fwd").get("grid_best_flops")
            return min(ach, float(best)) if best else ach
        if ach:
            return ach
        from predictor.regress import transfer
        src = transfer.source_device(self.platform)
        src_ach = src.achievable_flops(precision) if src is not None else None
        if src is not None and src_ach and dev.peak_flops(precision) > 0:
            return dev.peak_flops(precision) * src_ach / src.peak_flops(precision)
        return None

    def _achievable_floor_s(self, op: str, pass_: str, shapes: dict[str, np.ndarray], precision: str):
        """A tensor-core operator cannot beat its FLOPs at the achievable matmul throughput: the floor that keeps
        every predicted MFU at or below MAMF / peak (measured, transferred or analytical alike)."""
        if op not in features.COMPUTE_BOUND_OPS:
            return 0.0
        ach = self.achievable_flops(precision)
        if not ach:
            return 0.0
        flops, _ = features.op_work(op, shapes, precision, pass_)
        return np.asarray(flops, dtype="float64") / ach

    def _flash_samples_causal(self, pass_: str, tables: bool = True) -> bool:
        """Whether the flash-attention times come from causal samples: the project's bench samples are
        (F.scaled_dot_product_attention(is_causal=True)); the paper's flash_attn_func samples are not (its
        README: causal flag left False), nor is the roofline."""
        kb = self.kernel_bank
        if tables and kb is not None and kb.has_op("flash_attn", "fwd"):  # the collector's prefill attention: causal
            return True
        b = self.bank
        if b is None or not b.has_op("flash_attn", pass_):
            return False
        return not str(b.op_info("flash_attn", pass_).get("source", "")).startswith(PAPER_SOURCE_PREFIX)

    def _predict_op_group(self, op: str, pass_: str, shapes: dict[str, np.ndarray], precision: str,
                          tables: bool = True):
        """Seconds per shape row, provenance, and the expected relative error of those seconds.
        measured: own regressor (error = its CV MAPE); transferred: the regressor of the sampled platform
        in `op_models`, evaluated on ITS device and rescaled to this one by `transfer.predict_transferred`
        (error = the measured A100<->GH200 transfer error of that op, models_store/transfer_validation.json)."""
        from predictor.regress import transfer
        dev = self.platform.device
        dev.check_op(op)  # the precision was checked by op_times, this method's only caller
        if self.kernel_bank is not None and tables:
            got = self._kernel_table_op(op, pass_, shapes, precision)
            if got is not None:
                return got
        own = self.own_measurements
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
                        return (abank.predict_op(op, pass_, shapes, dev, precision), "measured",
                                abank.op_info(op, pass_).get("cv_mape"))
                    t = transfer.predict_transferred(abank, op, pass_, shapes, adev, dev, precision)
                    return (t, f"transferred from {pid} ({self.platform.op_models} samples of it fail the physical "
                               f"bound)", transfer.transfer_error(transfer.cached_validation(self.models_dir), op,
                                                                   pass_, pid))
            if own:
                return self.bank.predict_op(op, pass_, shapes, dev, precision), "measured", info.get("cv_mape")
            if src is None:  # source platform unknown to the catalog: its regressor on this device's spec
                return self.bank.predict_op(op, pass_, shapes, dev, precision), label, transfer.transfer_error(tval)
            t = transfer.predict_transferred(self.bank, op, pass_, shapes, src, dev, precision)
            # the measured transfer error already contains the source regressor's own error
            return t, label, transfer.transfer_error(tval, op, pass_, self.platform.op_models)
        stand = STAND_INS.get(op)
        if stand and self.bank is not None and self.bank.has_op(stand, pass_):
            if own or src is None:
                t = self.bank.predict_op(stand, pass_, shapes, dev, precision)
            else:
                t = transfer.predict_transferred(self.bank, stand, pass_, shapes, src, dev, precision)
            ratio = (features.roofline_s(op, pass_, shapes, dev, precision)
                     / features.roofline_s(stand, pass_, shapes, dev, precision))
            return t * ratio, "stand-in", None
        t = features.roofline_s(op, pass_, shapes, dev, precision) / ANALYTIC_EFFICIENCY
        return t, "analytical", None

    def _kernel_table_op(self, op: str, pass_: str, shapes: dict[str, np.ndarray], precision: str):
        """(seconds, provenance, error) from the device's published kernel tables, None where they do not time `op`.
        A linear layer's forward is the gemm grid at its (M, N, K); its backward is the data gradient
        [M, N] x [N, K] plus the weight gradient [K, M] x [M, N], the same grid at those shapes. Flash attention:
        the measured (causal) forward; the backward = forward x FLASH_BWD_OVER_FWD."""
        kb = self.kernel_bank
        assert kb is not None
        dev = self.platform.device
        if op in KERNEL_GEMM_OPS and kb.has_op("gemm", "fwd"):
            err = measured_table_error(kb.op_info("gemm", "fwd"))

            def grid(m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
                return np.asarray(kb.predict_op("gemm", "fwd", gemm_shapes(m, n, k), dev, precision), "float64")
            return grid_pass_s(grid, op, pass_, shapes), ("measured" if pass_ == "fwd" else BWD_GEMM_PROVENANCE), err
        if op == "flash_attn" and kb.has_op("flash_attn", "fwd"):
            t = np.asarray(kb.predict_op("flash_attn", "fwd", shapes, dev, precision), "float64")
            err = measured_table_error(kb.op_info("flash_attn", "fwd"))
            if pass_ == "fwd":
                return t, "measured", err
            e = math.hypot(err, FLASH_BWD_RATIO_SPREAD)
            return t * FLASH_BWD_OVER_FWD, FLASH_BWD_PROVENANCE, e
        return None

    def _kernel_format_gemm(self, op: str, pass_: str, shapes: dict[str, np.ndarray], precision: str):
        """(seconds, provenance, error) of a linear layer's GEMMs in the low-precision format of `precision` from
        the device's measured grid of that format (`fp8.format_grid`), None where no table measures it. As for
        BF16: the forward at (M, N, K), the backward's data- and weight-gradient GEMMs at their shapes."""
        kb = self.kernel_bank
        dev = self.platform.device
        grid_of = fp8.format_grid(dev, precision)
        if kb is None or grid_of is None or op not in KERNEL_GEMM_OPS or not kb.has_op(grid_of.op, "fwd"):
            return None
        info = kb.op_info(grid_of.op, "fwd")
        rp = str(info.get("precision") or grid_of.roofline_precision)
        fixed = float(info.get("grid_fixed_overhead_s") or 0.0)  # the grid's own per-call quantize latency
        best = float(info.get("grid_best_flops") or np.inf)  # the grid's best throughput: no GEMM of it is faster

        def grid(m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
            t = np.asarray(kb.predict_op(grid_of.op, "fwd", gemm_shapes(m, n, k), dev, rp), "float64")
            return np.maximum(np.maximum(t - fixed, features.LAUNCH_LATENCY_S), 2.0 * m * n * k / best)
        prov = (f"measured ({grid_of.label})" if pass_ == "fwd" else
                f"measured (derived: the {grid_of.label} at the data- and weight-gradient shapes)")
        return grid_pass_s(grid, op, pass_, shapes), f"{prov} + {fp8.CAST_RULE}", measured_table_error(info)

    # ---- collective times -----------------------------------------------------------------
    def comm_times(self, calls: Sequence[CommCall]) -> list[tuple[float, str]]:
        """(seconds of one call, provenance) per call; one vectorised network / regressor evaluation per
        collective for every call not cached yet."""
        cache = self._comm_cache
        todo: dict[str, set] = {}
        for c in calls:
            if c.ranks > 1 and c.message_bytes > 0 and c.key not in cache:
                todo.setdefault(c.collective, set()).add(c.key)
        label = "analytical (calibrated)" if self.network.calibrated else "analytical"
        for coll, keyset in todo.items():
            keys = sorted(keyset)
            S = np.array([k[1] for k in keys], float)
            N = np.array([k[2] for k in keys])
            G = np.array([k[3] for k in keys])
            t = np.asarray(analytic_time_s(self.network, coll, S, N, G), float).copy()
            prov = [label] * len(keys)
            cb = self.coll_bank
            if cb is not None and cb.has_collective(coll):
                # the sample store (and so the regressors) keeps the paper's convention: an all-gather's
                # message is the per-rank input; decompose passes the full output buffer
                Sr = np.maximum(1, (S // (N * G))) if coll == "allgather" else S
                cov = np.asarray(cb.covers_collective(coll, Sr, N, G), bool)
                if cov.any():
                    t[cov] = np.asarray(cb.predict_collective(coll, Sr[cov], N[cov], G[cov], self.platform), float)
                    for i in np.nonzero(cov)[0]:
                        prov[i] = "measured"
            for k, v, pv in zip(keys, t, prov):
                cache[k] = (float(v), pv)
        return [(0.0, "none") if c.ranks <= 1 or c.message_bytes <= 0 else cache[c.key] for c in calls]

    def time_comm(self, c: CommCall) -> tuple[float, str]:
        return self.comm_times([c])[0]

    # ---- the step -------------------------------------------------------------------------
    def _cuda_graphs_note(self, model: ModelSpec, layout: Layout) -> str:
        """What Layout.cuda_graphs changed in this prediction: the host time it removed per layer pass (measured
        shares, `bench host-floor --cuda-graphs`), or that it changed nothing where no host time is modelled."""
        import numpy as np

        from predictor.model.specs import cuda_graphs_mask
        from predictor.step.engine import cuda_graph_cuts
        on = self.terms is not None and self.host is None and self.options.host_overhead
        if not on or self.terms is None or self.terms.host_for(layout.framework) is None:
            return (f"CUDA graphs ({layout.cuda_graphs}) remove host time only, and no host time is modelled here: "
                    "the prediction is the eager one.")
        if layout.cuda_graphs == "full_iteration":
            return ("CUDA graphs (full_iteration): no per-layer or per-micro-batch host time; one graph replay per "
                    "step. GPU time and the graphs' memory pool are as eager (not modelled).")
        dense_cut, moe_cut, _ = cuda_graph_cuts(self.terms, np.array([cuda_graphs_mask(layout.cuda_graphs)]))
        parts = []
        if model.moe_layers < model.num_layers:
            parts.append(f"{float(dense_cut[0]):.2f} of each dense layer pass")
        if model.is_moe:
            local = model.num_experts / max(1, layout.ep)
            parts.append(f"{float(moe_cut[0]):.2f} of the "
                         f"{self.terms.moe_passes_for(layout.framework, local):.2f} of each MoE layer pass")
        return (f"CUDA graphs ({layout.cuda_graphs}): host time removed, in dense layer passes: {', '.join(parts)} "
                "(the captured parts' measured share less one replay per layer, `bench host-floor --cuda-graphs`). "
                "GPU time and the graphs' memory pool are as eager (not modelled).")

    def predict(self, model: ModelSpec, layout: Layout, *, timeline: bool = True) -> StepPrediction:
        """One layout: step time, breakdown, memory, provenance and expected error, the operator table and
        (with `timeline`) the simulated pipeline timeline."""
        layout.validate(model)
        self.check_runs(layout)
        rows, structs = rows_for(model, [layout])
        ev = self.engine.evaluate(model, rows, structs, layout.seq_len, layout.precision, detail=True)
        pred = self._prediction(model, layout, ev, 0)
        det = ev.details[0]
        pred.op_rows = self._op_rows(model, layout, det, pred, rows[0])
        if timeline:
            chunks = chunk_times_of(det)
            m = layout.num_micro_batches
            if 2 * m * layout.pp * layout.vpp <= self.options.max_simulated_tasks:
                sim_s, pred.timeline = simulate_pipeline(chunks, layout.pp, layout.vpp, m, layout.schedule)
                if abs(sim_s / pred.pipeline_s - 1) > 0.01:
                    pred.warnings.append(f"The pipeline timeline (event simulation, {sim_s:.4g} s) differs from the "
                                         f"closed form the step time uses ({pred.pipeline_s:.4g} s) by more than 1 %.")
        return pred

    def predict_many(self, items: Sequence[tuple[ModelSpec, Layout]]) -> list[StepPrediction]:
        """Many (model, layout) pairs, validated by the caller, through the engine in a few vectorised
        groups (what predict-batch uses). No operator table, no timeline."""
        groups: dict[tuple, list[int]] = {}
        for i, (model, L) in enumerate(items):
            groups.setdefault((model, L.seq_len, L.precision), []).append(i)
        prepared = []
        units: list[tuple] = []
        classes: list[tuple] = []
        for (model, seq, prec), idx in groups.items():
            rows, structs = rows_for(model, [items[i][1] for i in idx])
            prepared.append((model, seq, prec, idx, rows, structs))
            units += [(model, seq, prec, k) for k in unit_keys(rows, self.platform, model)]
            classes += [(model, seq, prec, k) for k in class_keys(rows, [structure_classes(s, model) for s in structs])]
        self.engine.prepare_many(units)
        self.engine.prepare_classes_many(classes)
        out: list[StepPrediction | None] = [None] * len(items)
        for model, seq, prec, idx, rows, structs in prepared:
            ev = self.engine.evaluate(model, rows, structs, seq, prec)
            for j, i in enumerate(idx):
                out[i] = self._prediction(model, items[i][1], ev, j)
        return out  # type: ignore[return-value]

    @property
    def host_modelled(self) -> bool:
        """Whether predictions carry a host (framework) overhead: the platform's own fit, or the end-to-end
        terms' per-framework host where they have one."""
        if not self.options.host_overhead:
            return False
        return self.host is not None or bool(self.terms is not None and self.terms.host)

    def check_runs(self, layout: Layout) -> None:
        """Raise InfeasibleConfig when the platform cannot run this many ranks (see `check_ranks`), or
        context parallelism where its ranks have no GPU collectives (CPU platforms)."""
        if layout.cp > 1 and self.platform.device.vendor == "cpu":
            raise InfeasibleConfig("cp", f"context parallelism needs peer-to-peer GPU collectives; "
                                         f"{self.platform.platform_id} is a CPU platform without them.",
                                   "set cp = 1 on this platform, or use a GPU platform.")
        self.check_ranks(layout.num_gpus)

    def check_ranks(self, ranks: int) -> None:
        """Raise InfeasibleConfig when the platform cannot run `ranks` ranks: one without collectives
        (cpu-2t) runs one, one without a link between nodes (cpu-1t: 2 ranks on this machine) one node."""
        why = self.platform.ranks_problem(ranks)
        if why:
            cap = self.platform.max_ranks
            raise InfeasibleConfig("num_gpus", why, f"use num_gpus {'1' if cap == 1 else f'<= {cap}'} on "
                                                    f"{self.platform.platform_id}, or another platform.")

    def _prediction(self, model: ModelSpec, layout: Layout, ev: Evaluation, r: int) -> StepPrediction:
        step = float(ev.step_time_s[r])
        flops = model_flops_per_step(model, layout)
        tflops_gpu = flops / step / layout.num_gpus / 1e12
        peak = self.platform.device.peak_flops(fp8.mfu_peak_precision(layout.precision)) / 1e12  # fp8: BF16 peak
        share, err, basis = self.confidence(ev.provenance_s[r], layout.framework,
                                            (model, layout.tp, layout.precision))
        if self.own_runs is not None:
            err, basis = own_runs_band(self.own_runs, model, layout, self.platform.gpus_per_node, err, basis)
        det = ev.details.get(r)
        memory = None
        if det is not None:
            from predictor.step.memory import stage_layer_counts
            memory = report_from_arrays({k: v[None, :] for k, v in det["memory"].items()}, 0,
                                        stage_layer_counts(model, layout), ev.capacity_bytes, self.engine.mopt)
        warnings: list[str] = []
        if share.get("analytical", 0) + share.get("analytical (calibrated)", 0) > 0.5:
            warnings.append("More than half of this prediction rests on analytical estimates, not measured samples.")
        fits, tight = bool(ev.fits[r]), bool(ev.tight[r])
        if not fits:
            warnings.append(f"Does not fit in memory: stage {int(ev.peak_stage[r])} needs "
                            f"{ev.peak_bytes[r] / GIB:.1f} GiB of {ev.usable_bytes / GIB:.1f} GiB usable "
                            f"({self.platform.device.hbm_gib:g} GiB HBM).")
        elif tight:
            warnings.append(f"Memory is tight: {ev.peak_bytes[r] / GIB:.1f} GiB per GPU with the caching allocator's "
                            f"typical reserve, above the {ev.usable_bytes / GIB:.1f} GiB usable; it fits "
                            f"({ev.low_peak_bytes[r] / GIB:.1f} GiB) only if the allocator fragments as little as "
                            "runs tuned to the edge do (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps). "
                            "Leave headroom when planning.")
        if self.platform.device.vendor != "cpu":
            from predictor.step.alignment import alignment_warning
            aw = alignment_warning(model, layout)
            if aw:
                warnings.append(aw)
        gpn = self.platform.gpus_per_node
        if layout.tp > gpn > 0:   # the search refuses this unless asked (SearchSpace.tp_within_node)
            tp_share = float(ev.breakdown_s["tp_comm"][r]) / step
            warnings.append(f"TP {layout.tp} crosses nodes: a node of {self.platform.platform_id} has {gpn} GPUs, so "
                            "every layer's tensor-parallel exchanges run over the inter-node network "
                            f"({tp_share:.0%} of the step is TP communication). Fix: set tp to {gpn} or less and "
                            "put the other GPUs into pp or dp.")
        if model.is_moe:
            from predictor.model.moe import routing_note
            note = routing_note(model, layout)
            local = model.num_experts / max(1, layout.ep)
            on = self.terms is not None and self.host is None and self.options.host_overhead
            passes = self.terms.moe_passes_for(layout.framework, local) if on and self.terms is not None else 1.0
            if passes != 1.0:
                per_expert = self.terms.moe_host_passes_per_expert.get(layout.framework, 0.0) if self.terms else 0.0
                how = (f", of which {per_expert * local:.2f} for the one GEMM per expert its {local:g} local "
                       "experts' grouped GEMMs issue" if per_expert else "")
                note += (f" Host time: each MoE layer counted as {passes:.2f} dense layer passes{how} (measured on a "
                         "CPU, `bench host-floor --moe`).")
            warnings.append(note)
        if layout.cuda_graphs != "none":
            warnings.append(self._cuda_graphs_note(model, layout))
        warnings += self.notes
        if not self.host_modelled and self.options.host_overhead:
            lay = self.engine._parts[(model, layout.seq_len, layout.precision,
                                      *unit_key(layout, self.platform, model))].layer
            per_pass = lay.fc + lay.ft
            if per_pass < SHORT_LAYER_PASS_S:
                warnings.append(f"Kernels are short here ({per_pass * 1e3:.2f} ms of GPU work per layer forward) and "
                                f"this platform has no fitted host overhead: eager frameworks add host time per layer "
                                f"(about 1 ms per layer pass on dgx-a100-80gb, fitted on measured runs), so this "
                                "prediction may be low. Fit one with `python -m predictor calibrate-host` on your "
                                "runs.")
        return StepPrediction(
            model=model, layout=layout, platform_id=self.platform.platform_id, step_time_s=step,
            breakdown_s={k: float(v[r]) for k, v in ev.breakdown_s.items()},
            detail_s={k: float(v[r]) for k, v in ev.detail_s.items()}, provenance_share=share, expected_error=err,
            error_basis=basis, tokens_per_s=layout.tokens_per_step / step, model_tflops_per_gpu=tflops_gpu,
            mfu=tflops_gpu / peak, pipeline_s=float(ev.pipeline_s[r]), critical_stage=int(ev.critical_stage[r]),
            memory=memory, warnings=warnings, host_overhead_modelled=self.host_modelled,
            memory_gib=float(ev.peak_bytes[r] / GIB), fits_memory=fits, memory_tight=tight,
            memory_allocated_gib=float(ev.peak_allocated_bytes[r] / GIB),
            memory_reserved_gib=float(ev.peak_reserved_bytes[r] / GIB),
            usable_gib=float(ev.usable_bytes / GIB),
            hbm_gib=float(self.platform.device.hbm_gib))

    def _op_rows(self, model: ModelSpec, layout: Layout, det: dict[str, Any], pred: StepPrediction,
                 row: np.ndarray) -> list[tuple]:
        """Every call of the step (per micro-batch; optimizer and once-per-step traffic per step); `row`: the
        layout's engine row."""
        parts = self.engine._parts[(model, layout.seq_len, layout.precision, *unit_key(layout, self.platform, model))]
        S: Structure = det["structure"]
        nch = S.pp * S.vpp
        cats = {"tp": "tp_comm", "cp": "cp_comm", "ep": "ep_comm", "pp": "pp_comm", "dp": "dp_comm", "edp": "dp_comm",
                "embedding": "dp_comm"}
        dense_counts = chunk_dense(S, model)
        m = layout.num_micro_batches
        acc_k = (m - 1) / m * float(separate_accumulation(row[None, :], self.platform)[0])
        rows: list[tuple] = []

        def add_unit(stage: int, chunk: int, unit, k: float) -> None:
            for tc in unit.calls:
                c, t, prov = tc.call, tc.seconds, tc.provenance
                if isinstance(c, CommCall):
                    rows.append((stage, chunk, c.group, c.phase, f"{c.collective}[{c.group}]", c.phase,
                                 cats[c.group], c.count * k, t, t * c.count * k, prov, None, PER_MICRO_BATCH))
                else:
                    rows.append((stage, chunk, c.part, c.phase, c.op, c.pass_, "compute", c.count * k, t,
                                 t * c.count * k, prov, tc.raw_error, PER_MICRO_BATCH))
        for i in range(nch):
            stage, chunk, n = chunk_rank(S.schedule, S.pp, i), i // S.pp, S.counts[i]
            n_dense = dense_counts[i]
            add_unit(stage, chunk, parts.layer, float(n - n_dense))
            if n_dense:
                add_unit(stage, chunk, parts.dense or parts.layer, float(n_dense))
            if i == 0:
                add_unit(stage, chunk, parts.first, 1.0)
            if i == nch - 1:
                add_unit(stage, chunk, parts.last, 1.0)
            n_p2p = D_p2p(i, nch, S.pp, S.schedule)
            if n_p2p and det["p2p_s"] > 0:
                for ph in ("fwd", "bwd"):
                    rows.append((stage, chunk, "pp", ph, "p2p[pp]", ph, "pp_comm", n_p2p, det["p2p_s"],
                                 det["p2p_s"] * n_p2p, self._p2p_prov(layout, parts.p2p_bytes), None, PER_MICRO_BATCH))
            for ph in ("fwd", "bwd"):
                h = float(det[ph]["host_overhead"][i])
                if h > 0:
                    rows.append((stage, chunk, "layer", ph, "host overhead", ph, "host_overhead", 1, h, h,
                                 HOST_PROVENANCE, self.host.cv_mape if self.host else None, PER_MICRO_BATCH))
            cls = self.engine.chunk_class(model, layout.seq_len, layout.precision, row, S.pp, det["classes"][i])
            for tc in cls.calls:
                c, t, prov = tc.call, tc.seconds, tc.provenance
                if isinstance(c, CommCall):
                    rows.append((stage, chunk, c.group, c.phase, f"{c.collective}[{c.group}]", c.phase,
                                 "dp_comm", c.count, t, t * c.count, prov, None, PER_STEP))
                else:
                    rows.append((stage, chunk, c.part, "step", c.op, c.pass_, "optimizer", c.count, t, t * c.count,
                                 prov, tc.raw_error, PER_STEP))
            if acc_k > 0:   # the gradient accumulation pass after every micro-batch but the first: per micro-batch
                for tc in cls.accum_calls:   # (m - 1) / m of it, as the engine puts it on each backward
                    c, t = tc.call, tc.seconds
                    rows.append((stage, chunk, c.part, "bwd", f"grad_accum ({c.op})", c.pass_, "compute",
                                 c.count * acc_k, t, t * c.count * acc_k, tc.provenance, tc.raw_error, PER_MICRO_BATCH))
            if (i == 0 or i == nch - 1) and det["tails"]["embedding_sync_s"][stage] > 0:
                t_emb = self.engine._emb[(model, layout.tp, S.pp, layout.dp * layout.cp, layout.precision)]
                rows.append((stage, chunk, "embedding", "step", "allreduce[embedding]", "step", "dp_comm", 1,
                             t_emb[0], t_emb[0], t_emb[1], None, PER_STEP))
        return rows

    def _p2p_prov(self, layout: Layout, nbytes: int) -> str:
        return self.engine._p2p[(nbytes, layout.tp, layout.pp, layout.dp * layout.cp)][1]

    # ---- confidence -----------------------------------------------------------------------
    def end_to_end_error(self, framework: str | None = None,
                         host_share: float | None = None) -> tuple[float, int | str, str] | None:
        """(MAPE, measured runs, how) from the platform's validation.json: the speed-checked MAPE when a
        speed check scales this predictor's times and the validation has one, else the plain one. On GPU
        platforms: the leave-one-source-out error of the end-to-end terms, pooled over the sources where
        measured runs cover both this GPU and `framework`, else (a GPU or a framework no run covers) the
        worst source's; where the prediction's framework host time is `host_share` of its work and the terms
        record their held-out error by host share, that bin's error instead of the pooled one (host-bound
        steps were never identified on another source's runs), and at least it where GPU or framework is
        uncovered."""
        val = self.validation or {}
        tv = (self.terms.validation or {}) if self.terms is not None else {}
        if tv.get("held_out_mape") is not None and self.host is None:
            # GPU platforms: the error on sources the end-to-end terms never saw (leave-one-source-out)
            per = {k: v for k, v in (tv.get("per_source") or {}).items() if isinstance(v, dict)}
            n_src, runs = len(per), sum(self.terms.fitted_on.values())  # type: ignore[union-attr]
            missing = self._uncovered(per, framework)
            worst = max(((float(v["held_out_mape"]), k) for k, v in per.items()
                         if v.get("held_out_mape") is not None), default=None)
            b = host_share_bin(tv.get("by_host_share"), host_share) if host_share is not None else None
            base = float(tv["held_out_mape"] if b is None else b["held_out_mape"])
            base_how = f", each of {n_src} sources predicted by terms fitted without it"
            if b is not None:
                base_how += (f", over the {b['runs']} runs whose framework host time is {b['from']:.0%}-{b['to']:.0%} "
                             f"of the work as here ({host_share:.0%})")
            if missing and worst is not None and worst[0] > base:
                return (worst[0], runs, f"; no measured run covers {' or '.join(missing)}, so the worst of "
                                        f"{n_src} sources held out ({worst[1]}) rather than their mean"
                                        + signed_words(per[worst[1]].get("held_out_mean_signed")))
            return base, runs, base_how + signed_words((tv if b is None else b).get("held_out_mean_signed"))
        if self.speed is not None and val.get("mape_speed_checked") is not None:
            return (float(val["mape_speed_checked"]), val.get("n_runs_speed_checked", "?"),
                    " with a speed check around each run")
        if val.get("mape") is None:
            return None
        how = (f" over {val['measuring_runs']} measuring runs, as sampled" if val.get("measuring_runs", 1) > 1
               else "")
        return float(val["mape"]), val.get("n_runs", "?"), how

    def _uncovered(self, per_source: dict[str, dict[str, Any]], framework: str | None) -> list[str]:
        """What of (this GPU, `framework`) no source of the end-to-end validation has runs of, in words.
        Sources recorded before devices were kept count as covering every GPU."""
        out = []
        devices = [v.get("devices") for v in per_source.values()]
        if devices and all(isinstance(d, str) for d in devices) and not any(
                self.platform.device.device_id in str(d).split(", ") for d in devices):
            out.append(f"this GPU ({self.platform.device.device_id})")
        if framework and not any(framework in str(v.get("framework", "")).split(", ") for v in per_source.values()):
            out.append(f"the framework {framework}")
        return out

    def shape_error(self, model: ModelSpec, tp: int, precision: str) -> tuple[float, str] | None:
        """(error, words) for GEMM shapes the samples do not cover (dimensions not in multiples of 8, see
        predictor.step.alignment): the source-held-out error of the measured runs with such shapes
        (framework_terms.json `validation.shape_flagged`), which the band widens to. None where the shapes
        are aligned, on CPU platforms, or without such runs."""
        from predictor.step.alignment import shape_flagged
        if self.platform.device.vendor == "cpu" or not shape_flagged(model, tp, precision):
            return None
        rec = ((self.terms.validation or {}) if self.terms is not None else {}).get("shape_flagged")
        if not isinstance(rec, dict) or not rec.get("runs"):
            return None
        mape, signed = float(rec["held_out_mape"]), float(rec["held_out_mean_signed"])
        return mape, (f"GEMM dimensions not in multiples of 8: {int(rec['runs'])} measured runs with such shapes "
                      f"were {mape:.0%} off (mean signed {signed:+.0%}) with the terms fitted without their source")

    def confidence(self, prov_s: dict[str, list[float]], framework: str | None = None,
                   shape: tuple[ModelSpec, int, str] | None = None) -> tuple[dict[str, float], float, str]:
        """(share of the step's work per provenance, expected relative error, basis in words) from the
        seconds (and seconds x error) resting on each provenance: the time-weighted error of the parts
        (measured ops: their CV error; transferred ops: the measured cross-GPU transfer error; collectives
        from the analytic network: its fit / leave-one-platform-out error; the rest: assumed), combined
        with the end-to-end validation error of the platform where one has been measured (for `framework`:
        `end_to_end_error`), and widened to `shape_error` where `shape` = (model, tp, precision) has GEMM
        dimensions the samples do not cover, and to the worst independent check on this GPU that speaks for the
        model's kind (dense or MoE: `DeviceCheck.applies_to`; every check where no `shape` is given)."""
        total = sum(v[0] for v in prov_s.values())
        share = {k: v[0] / total for k, v in prov_s.items()} if total > 0 else {}
        op_err = sum(v[1] for v in prov_s.values()) / total if total > 0 else 0.3
        notes = [f"{p} {prov_s[p][0] / total:.0%} (+/-{prov_s[p][1] / prov_s[p][0]:.0%})"
                 for p in sorted(prov_s) if total > 0 and prov_s[p][0] / total >= 0.005]
        parts = "; ".join(notes)
        if any(n.startswith("analytical") for n in notes):
            parts += f" [{self.network_basis}]"
        if any(n.startswith("transferred") for n in notes):
            parts += " [transfer error measured A100<->GH200, python -m tests.benchmarks.transfer_accuracy]"
        e2e = self.end_to_end_error(framework, host_share(prov_s))
        if e2e is not None:
            mape, n, how = e2e
            err = math.sqrt(op_err ** 2 + mape ** 2)
            what = ("framework_terms.json" if how.startswith((", each of", "; no measured run covers")) else
                    (self.validation or {}).get('source', 'validation'))
            basis = (f"parts {op_err:.1%} combined with end-to-end MAPE {mape:.1%} on {n} measured runs{how} "
                     f"({what}); {parts}")
        else:
            err = math.sqrt(op_err ** 2 + UNVALIDATED_COMPOSITION_ERROR ** 2)
            basis = (f"parts {op_err:.1%}; composition not validated end to end on this platform "
                     f"({UNVALIDATED_COMPOSITION_ERROR:.0%} assumed); {parts}")
        wide = self.shape_error(*shape) if shape is not None else None
        if wide is not None:
            err, basis = max(err, wide[0]), f"{basis}; {wide[1]}"
        # how far off published runs of this kind of model on this GPU were: the band is at least that wide
        checks = [c for c in self.independent if shape is None or c.applies_to(shape[0].is_moe)]
        if checks:
            worst, words = independent_band_words(checks, self.terms.fitted_at if self.terms else "",
                                                  *self._independent_dates)
            err, basis = max(err, worst), f"{basis}; {words}"
        return share, err, basis


def own_runs_band(rec: dict[str, Any], model: ModelSpec, layout: Layout, gpus_per_node: int, shipped_err: float,
                  shipped_basis: str) -> tuple[float, str]:
    """(expected error, basis) of a prediction on a platform calibrated on the user's own runs
    (predictor.calibrate.runs): their leave-one-run-out error (leave-one-model-out for a model none of them ran),
    widened where the layout is far from the runs (another model size, framework, more nodes than any run).
    Without a held-out error (a single run) the shipped band stays."""
    n = int(rec.get("runs") or 0)
    loro, lomo = rec.get("held_out_mape"), rec.get("held_out_model_mape")
    sizes = [float(v) for v in rec.get("model_params") or []]
    params = float(model.total_params())
    known_model = any(abs(params / s - 1.0) < 0.02 for s in sizes if s > 0)
    if loro is None:
        return shipped_err, (f"calibrated on {n} of your runs: no held-out error from a single run, so the shipped "
                             f"band; {shipped_basis}")
    base = max(float(loro), OWN_RUNS_MIN_ERROR)
    how = [f"calibrated on {n} of your runs: held-out error {float(loro):.1%} (each run predicted by terms fitted "
           f"without it, mean signed {float(rec.get('held_out_mean_signed') or 0.0):+.1%})"]
    if not known_model:
        if lomo is not None and float(lomo) > base:
            base = float(lomo)
            how.append(f"a model none of them ran: leave-one-model-out error {base:.1%}")
        lo, hi = (min(sizes), max(sizes)) if sizes else (params, params)
        out = max(lo / params, params / hi, 1.0)
        if out > 1.0:
            k = 1.0 + OWN_RUNS_WIDEN_PER_DOUBLING * math.log2(out)
            base *= k
            how.append(f"{params / 1e9:.3g} B parameters, outside the runs' {lo / 1e9:.3g}-{hi / 1e9:.3g} B: "
                       f"x{k:.2f}")
    nodes = max(1, -(-layout.num_gpus // max(1, gpus_per_node)))
    max_nodes = int(rec.get("max_nodes") or 1)
    if nodes > max_nodes:
        k = 1.0 + OWN_RUNS_WIDEN_PER_DOUBLING * math.log2(nodes / max_nodes)
        base *= k
        how.append(f"{nodes} nodes, more than any run ({max_nodes}): x{k:.2f}")
    moved = own_runs_moved(rec)
    if moved is not None and len(how) > 1 and base > shipped_err + moved:
        # far from the runs the widening compounds; the calibrated terms there are at worst the shipped ones moved by
        # what the calibration moved the runs
        base = shipped_err + moved
        how.append(f"at most the shipped band {shipped_err:.1%} + the most the calibration moved a run "
                   f"({moved:.1%})")
    err = base
    if layout.framework not in (rec.get("frameworks") or []):
        if rec.get("frameworks_scoped"):
            return shipped_err, (f"calibrated on {n} of your runs of {', '.join(rec.get('frameworks') or [])}; "
                                 f"framework {layout.framework} is not among them, so it keeps "
                                 f"{rec.get('base') or 'the base'}'s terms, uncalibrated, and the shipped band: "
                                 f"{shipped_basis}")
        err = max(err, shipped_err)
        how.append(f"framework {layout.framework} not among the runs': at least the shipped band {shipped_err:.0%}")
    return err, "; ".join(how) + f"; parts: {shipped_basis}"


def own_runs_moved(rec: dict[str, Any]) -> float | None:
    """The most the calibration moved a run's prediction (|after / before - 1| over the runs), None unrecorded."""
    moved = [abs(float(r["after_s"]) / float(r["before_s"]) - 1.0) for r in rec.get("per_run") or []
             if r.get("after_s") and r.get("before_s")]
    return max(moved) if moved else None


OWN_RUNS_WIDEN_PER_DOUBLING = 0.5   # the own-runs band x (1 + this x log2 of how far off) beyond the runs
OWN_RUNS_MIN_ERROR = 0.02           # no band narrower than this: runs themselves vary by a few percent


def gemm_shapes(m: np.ndarray, n: np.ndarray, k: np.ndarray) -> dict[str, np.ndarray]:
    """Shape arrays of generic `gemm` calls [m, k] x [k, n] (ops.py: seq = m, hidden = k, ffn_hidden = n)."""
    m = np.asarray(m, "float64")
    nan = np.full(m.shape, np.nan)
    one = np.ones(m.shape)
    out = dict.fromkeys(OP_SHAPE_COLUMNS, nan)
    out.update(tp=one, batch=one, seq=m, hidden=np.asarray(k, "float64"), ffn_hidden=np.asarray(n, "float64"))
    out["variant"] = np.zeros(m.shape)
    return out


def signed_words(mean_signed: Any) -> str:
    """The held-out mean signed error in words for an error band's basis ('' where none is recorded): a planner
    needs the direction of the error (the bias) more than its spread."""
    if not isinstance(mean_signed, (int, float)) or isinstance(mean_signed, bool) or not math.isfinite(mean_signed):
        return ""
    side = "faster" if mean_signed < 0 else "slower"
    return f"; held out, those predictions were {abs(mean_signed):.1%} {side} than measured on average (mean signed)"


def host_share(prov_s: dict[str, list[float]]) -> float:
    """The share of a prediction's work (seconds over every stage, per provenance) that is framework host time."""
    total = sum(v[0] for v in prov_s.values())
    host = sum(prov_s.get(k, [0.0])[0] for k in (TERMS_HOST_PROVENANCE, HOST_PROVENANCE))
    return host / total if total > 0 else 0.0


def D_p2p(i: int, nch: int, pp: int, schedule: str = "1f1b") -> int:
    from predictor.step.decompose import p2p_calls_per_pass
    return p2p_calls_per_pass(i, nch, pp, schedule)


def chunk_times_of(det: dict[str, Any]) -> list[ChunkTimes]:
    """The per-chunk micro-batch times of one evaluated layout (engine detail) as ChunkTimes."""
    S: Structure = det["structure"]
    out = []
    for i in range(S.pp * S.vpp):
        out.append(ChunkTimes(chunk_rank(S.schedule, S.pp, i), i // S.pp,
                              {k: float(v[i]) for k, v in det["fwd"].items()},
                              {k: float(v[i]) for k, v in det["bwd"].items()}, float(det["recompute"][i]),
                              wgrad_s=float(det["wgrad"][i])))
    return out


@lru_cache(maxsize=16)
def get_predictor(platform_id: str, models_dir: str | None = None, clusters: str | None = None,
                  memory_options: MemoryOptions | None = None) -> Predictor:
    """A cached Predictor per platform (the CLI, the dashboard and search share it). `clusters`: a user's
    cluster definitions file (JSON / YAML, the catalog's format) where `platform_id` may also be defined.
    `memory_options`: the memory model's settings (default MemoryOptions())."""
    mopt = memory_options or MemoryOptions()
    if clusters:
        from predictor.hardware.platforms import get_platform
        return Predictor(get_platform(platform_id, clusters), models_dir, memory_options=mopt)
    return Predictor(platform_id, models_dir, memory_options=mopt)


def predict_step(model: ModelSpec, layout: Layout, platform_id: str, models_dir: str | None = None,
                 timeline: bool = True) -> StepPrediction:
    return get_predictor(platform_id, models_dir).predict(model, layout, timeline=timeline)

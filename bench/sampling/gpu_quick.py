"""`python -m bench gpu-quick`: one unattended pass over a lent GPU (H100 / H200 / B200) in a fixed budget.

    python -m bench gpu-quick                      # cuda, bf16, --budget-s 480 -> bench/samples/<platform>

Phases, in this order (each phase's shards are flushed before the next starts):

  gemm       the training GEMMs of real models' layers (llama3-8b / 70b, qwen3-8b / 32b: qkv_proj, attn_out_proj,
             mlp_up (gate + up fused), mlp_down, lm_head) at TP 1/2/4/8 and micro-batch x seq of 4k-16k tokens:
             forward, backward (autograd: data + weight gradient) and, in extra columns of the bwd row, the
             data-gradient GEMM dY W (`dgrad_s`) and the weight-gradient GEMM dY^T X (`wgrad_s`) timed alone
  attention  flash attention forward and backward (torch scaled_dot_product_attention under
             sdpa_kernel(SDPBackend.FLASH_ATTENTION)) on those models' heads at TP 1..8, seq 4k-16k
  pointwise  RMSNorm, SwiGLU and cross-entropy forward and backward on the same tokens
  sustained  one square BF16 GEMM repeated for 60 s, read every window: achieved TFLOP/s, SM clock, power and
             temperature through NVML (pynvml / nvidia-ml-py when importable, else `nvidia-smi --query-gpu`
             in a subprocess; the manifest records which). Its windows go into the manifest, not into op_samples.

Everything goes through the operator sampler's pieces: kernels from bench/kernels/opbench.py, timing from
bench/sampling/timing.py, Parquet shards + manifest.json from bench/sampling/store_io.py, so `python -m predictor
ingest <out>` reads the set as any bench output (op_samples rows; the extra columns are ignored by the store).

Budget: the whole command, CUDA start-up included, stops by `budget_s` (default 480 s). The sustained phase keeps
its `sustained_s` (default 60 s, at most 15 % of the budget) at the end; the sampling phases share the rest,
a phase's unused time going to the next. Each phase's points are visited in a fixed shuffled order, so a phase cut
short still covers its models, TP degrees and token counts evenly.

Being cut short: shards are written every few seconds and at every phase's end; SIGTERM (and SIGINT) stop the
run after the current kernel, flush what was measured and write the manifest (`gpu_quick.phases` says which phases
finished); a hard kill loses at most the last few seconds. A rerun into the same folder skips the shapes already
measured and the phases already finished, so nothing is duplicated.
"""
from __future__ import annotations

import json
import random
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import env
from bench.sampling import store_io
from bench.sampling.design import DesignPoint
from bench.sampling.timing import time_call
from predictor.model import ops as P

PHASES = ("gemm", "attention", "pointwise", "sustained")
SAMPLING_PHASES = PHASES[:-1]
PHASE_WEIGHTS = {"gemm": 0.55, "attention": 0.28, "pointwise": 0.17}  # shares of the sampling time
GEMM_OPS = ("qkv_proj", "attn_out_proj", "mlp_up", "mlp_down", "lm_head")
POINTWISE_OPS = ("rmsnorm", "swiglu", "cross_entropy")
DEFAULT_BUDGET_S = 480.0
DEFAULT_SUSTAINED_S = 60.0
SUSTAINED_MAX_SHARE = 0.15
FLUSH_EVERY_S = 5.0


@dataclass(frozen=True)
class QuickModel:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    ffn: int          # SwiGLU width of each of gate and up
    vocab: int
    head_dim: int

    @property
    def attention_in_schema(self) -> bool:
        """The op_samples schema derives head_dim = hidden / heads (predictor.model.ops): a decoupled head_dim
        (qwen3-32b) cannot be recorded, so its qkv_proj / flash_attn shapes are left out."""
        return self.hidden == self.heads * self.head_dim


@dataclass(frozen=True)
class QuickProfile:
    name: str
    models: tuple[QuickModel, ...]
    tps: tuple[int, ...]
    gemm_tokens: tuple[tuple[int, int], ...]       # (micro-batch, seq)
    attention_tokens: tuple[tuple[int, int], ...]
    sustained_n: int                                # square GEMM size of the sustained phase
    target_s: float                                 # timing: measured time per pass and shape
    max_total_s: float                              # timing: at most this per pass and shape
    max_reps: int                                   # timing: at most this many repeats (their inputs stay alive)
    window_s: float                                 # sustained: seconds per telemetry window


def _preset(name: str) -> QuickModel:
    from predictor.model.presets import get_preset
    m = get_preset(name)
    return QuickModel(name, m.hidden_size, m.num_heads, m.kv_heads, m.ffn, m.vocab_size, m.head_size)


def _profiles() -> dict[str, QuickProfile]:
    real = tuple(_preset(n) for n in ("llama3-8b", "llama3-70b", "qwen3-8b", "qwen3-32b"))
    tiny = (QuickModel("tiny-a", 64, 4, 2, 128, 512, 16), QuickModel("tiny-b", 96, 6, 6, 160, 640, 16))
    return {
        "gpu": QuickProfile("gpu", real, (1, 2, 4, 8), ((1, 4096), (1, 8192), (2, 8192), (1, 16384)),
                            ((1, 4096), (2, 8192), (1, 16384)), sustained_n=8192, target_s=0.05, max_total_s=1.0,
                            max_reps=10, window_s=1.0),
        "tiny": QuickProfile("tiny", tiny, (1, 2), ((1, 32), (2, 32)), ((1, 32), (2, 16)), sustained_n=64,
                             target_s=0.002, max_total_s=0.05, max_reps=10, window_s=0.1),
    }


PROFILES = _profiles()


# --------------------------------------------------------------------------- the plan
def _shape(**kw: int | None) -> dict[str, int | None]:
    s: dict[str, int | None] = dict.fromkeys(P.SHAPE_COLUMNS)
    s.update(kw)
    return s


def phase_points(phase: str, prof: QuickProfile, seed: int = 0) -> list[DesignPoint]:
    """The shapes of one sampling phase in its fixed shuffled order (one DesignPoint per shape, its model in
    `extra['model']`). Duplicate shapes (two models sharing a hidden size, say) are kept once."""
    pts: list[DesignPoint] = []
    seen: set[tuple[str, tuple[tuple[str, int | None], ...]]] = set()

    def add(op: str, model: QuickModel, shape: dict[str, int | None]) -> None:
        k = (op, tuple(sorted(shape.items())))
        if k not in seen:
            seen.add(k)
            pts.append(DesignPoint(op, len(pts), shape, {"model": model.name}))

    for m in prof.models:
        for tp in prof.tps:
            if m.kv_heads % tp and tp % m.kv_heads:
                continue
            if phase == "gemm":
                for b, s in prof.gemm_tokens:
                    if m.attention_in_schema:
                        add("qkv_proj", m, _shape(tp=tp, batch=b, seq=s, hidden=m.hidden, heads=m.heads,
                                                  kv_heads=m.kv_heads))
                        add("attn_out_proj", m, _shape(tp=tp, batch=b, seq=s, hidden=m.hidden))
                    add("mlp_up", m, _shape(tp=tp, batch=b, seq=s, hidden=m.hidden, ffn_hidden=2 * m.ffn))
                    add("mlp_down", m, _shape(tp=tp, batch=b, seq=s, hidden=m.hidden, ffn_hidden=m.ffn))
                    add("lm_head", m, _shape(tp=tp, batch=b, seq=s, hidden=m.hidden, vocab=m.vocab))
            elif phase == "attention":
                if not m.attention_in_schema:
                    continue
                for b, s in prof.attention_tokens:
                    add("flash_attn", m, _shape(tp=tp, batch=b, seq=s, hidden=m.hidden, heads=m.heads,
                                                kv_heads=m.kv_heads))
            elif phase == "pointwise":
                for b, s in prof.gemm_tokens:
                    if tp == prof.tps[0]:
                        add("rmsnorm", m, _shape(batch=b, seq=s, hidden=m.hidden))
                    add("swiglu", m, _shape(tp=tp, batch=b, seq=s, hidden=m.hidden, ffn_hidden=m.ffn))
                    add("cross_entropy", m, _shape(tp=tp, batch=b, seq=s, vocab=m.vocab))
            else:
                raise ValueError(f"{phase} is not a sampling phase ({', '.join(SAMPLING_PHASES)})")
    random.Random(seed * 7919 + SAMPLING_PHASES.index(phase)).shuffle(pts)
    return pts


# --------------------------------------------------------------------------- kernels
@contextmanager
def _flash_only() -> Iterator[None]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        yield


def _in_ctx(ctx: Callable[[], Any], fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*a: Any) -> Any:
        with ctx():
            return fn(*a)
    return run


def build_passes(p: DesignPoint, dtype: str, device: str) -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
    """{pass: (setup, run)}: fwd and bwd of `p` (opbench.build), plus 'dgrad' and 'wgrad' of a GEMM; flash
    attention runs under the flash backend only (a shape it cannot run raises RuntimeError: skipped)."""
    import torch

    from bench.kernels import opbench
    shape: dict[str, int | None] = {k: v for k, v in p.shape.items() if v is not None}
    if p.op == "flash_attn":
        try:
            with _flash_only():
                passes = dict(opbench.build(p.op, shape, dtype, device))
        except RuntimeError:
            # SDPA's GQA (enable_gqa) runs on the flash backend only, from torch 2.5: where it does not, the same
            # kernel on K / V expanded to every query head (what FlashAttention computes for GQA; the row says so)
            if shape.get("kv_heads") in (None, shape.get("heads")):
                raise
            with _flash_only():
                passes = dict(opbench.build(p.op, {**shape, "kv_heads": shape["heads"]}, dtype, device))
            passes["gqa_expanded"] = (lambda: None, lambda _: None)
        return {ps: (_in_ctx(_flash_only, s), _in_ctx(_flash_only, r)) for ps, (s, r) in passes.items()}
    passes = dict(opbench.build(p.op, shape, dtype, device))
    if p.op in GEMM_OPS:
        M, N, K = opbench.gemm_mnk(p.op, shape)
        dt, dev = opbench.DTYPES[dtype], torch.device(device)
        x = torch.randn(M, K, dtype=dt, device=dev)
        w = torch.randn(N, K, dtype=dt, device=dev)
        dy = torch.randn(M, N, dtype=dt, device=dev)
        passes["dgrad"] = (lambda: None, lambda _: torch.mm(dy, w))       # dX = dY W      [M, K]
        passes["wgrad"] = (lambda: None, lambda _: torch.mm(dy.t(), x))   # dW = dY^T X    [N, K]
    return passes


# --------------------------------------------------------------------------- GPU telemetry
class Telemetry:
    """SM clock (MHz), power (W) and temperature (C) of one GPU, and its static facts."""
    kind = "none"

    def read(self) -> dict[str, float | None]:
        return {"sm_clock_mhz": None, "power_w": None, "temperature_c": None}

    def static(self) -> dict[str, Any]:
        return {}


class NvmlTelemetry(Telemetry):
    kind = "nvml (pynvml)"

    def __init__(self, index: int = 0):
        import pynvml  # type: ignore[import-not-found]
        self._nv = pynvml
        pynvml.nvmlInit()
        self._h = pynvml.nvmlDeviceGetHandleByIndex(index)

    def read(self) -> dict[str, float | None]:
        nv, h = self._nv, self._h
        return {"sm_clock_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "temperature_c": float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))}

    def static(self) -> dict[str, Any]:
        nv, h = self._nv, self._h
        out: dict[str, Any] = {}
        for key, fn in (("driver", nv.nvmlSystemGetDriverVersion),
                        ("max_sm_clock_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
                        ("max_memory_clock_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)),
                        ("power_limit_w", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
                        ("gpu_name", lambda: nv.nvmlDeviceGetName(h))):
            try:
                v = fn()
                out[key] = v.decode() if isinstance(v, bytes) else v
            except Exception as exc:  # noqa: BLE001 - a field this driver does not report: say so, go on
                out[key] = f"unavailable: {type(exc).__name__}"
        return out


class SmiTelemetry(Telemetry):
    """`nvidia-smi --query-gpu` in a subprocess (tens of ms a call: read once per window, not per kernel)."""
    kind = "nvidia-smi --query-gpu (subprocess)"
    FIELDS = "clocks.sm,power.draw,temperature.gpu"
    STATIC = "driver_version,clocks.max.sm,clocks.max.memory,power.limit,name"

    def __init__(self, index: int = 0):
        self.index = index

    def _query(self, fields: str) -> list[str]:
        r = subprocess.run(["nvidia-smi", f"--id={self.index}", f"--query-gpu={fields}",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10, check=False)
        if r.returncode != 0 or not r.stdout.strip():
            raise RuntimeError(f"nvidia-smi failed: {r.stderr.strip()[:200]}")
        return [s.strip() for s in r.stdout.strip().splitlines()[0].split(",")]

    @staticmethod
    def _num(s: str) -> float | None:
        try:
            return float(s)
        except ValueError:
            return None

    def read(self) -> dict[str, float | None]:
        try:
            c, pw, t = self._query(self.FIELDS)
        except (OSError, subprocess.SubprocessError, RuntimeError, ValueError):
            return super().read()
        return {"sm_clock_mhz": self._num(c), "power_w": self._num(pw), "temperature_c": self._num(t)}

    def static(self) -> dict[str, Any]:
        try:
            drv, clk, mclk, pl, name = self._query(self.STATIC)
        except (OSError, subprocess.SubprocessError, RuntimeError, ValueError) as exc:
            return {"error": str(exc)[:200]}
        return {"driver": drv, "max_sm_clock_mhz": self._num(clk), "max_memory_clock_mhz": self._num(mclk),
                "power_limit_w": self._num(pl), "gpu_name": name}


class FakeTelemetry(Telemetry):
    """A CPU run's stand-in (no GPU to read): fixed figures, recorded as fake in the manifest."""
    kind = "fake (no GPU: --device cpu)"

    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> dict[str, float | None]:
        self.reads += 1
        return {"sm_clock_mhz": 1980.0 - self.reads % 3, "power_w": 700.0, "temperature_c": 50.0 + self.reads % 5}

    def static(self) -> dict[str, Any]:
        return {"driver": "fake", "max_sm_clock_mhz": 1980.0, "power_limit_w": 700.0, "gpu_name": "fake"}


def nvml_index(cuda_index: int, visible: str | None = None) -> int:
    """NVML / nvidia-smi index of CUDA device `cuda_index`: through CUDA_VISIBLE_DEVICES where it lists indexes."""
    import os
    vis = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    ids = [v.strip() for v in (vis or "").split(",") if v.strip()]
    if ids and all(v.isdigit() for v in ids) and cuda_index < len(ids):
        return int(ids[cuda_index])
    return cuda_index


def choose_telemetry(device: str) -> tuple[Telemetry, str]:
    """(reader, why): NVML where pynvml imports and initialises, else nvidia-smi where it is on PATH, else none;
    the fake reader on a CPU device."""
    if not device.startswith("cuda"):
        return FakeTelemetry(), "device is not a GPU: fixed fake figures"
    index = nvml_index(int(device.split(":")[1]) if ":" in device else 0)
    try:
        return NvmlTelemetry(index), "pynvml imported and initialised"
    except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError...: fall back, say why
        why = f"pynvml unavailable ({type(exc).__name__}: {str(exc)[:80]})"
    if shutil.which("nvidia-smi"):
        return SmiTelemetry(index), f"{why}; nvidia-smi on PATH"
    return Telemetry(), f"{why}; no nvidia-smi on PATH: no clocks, power or temperature"


# --------------------------------------------------------------------------- the run
class Stop(BaseException):
    """Raised in the main thread by SIGTERM / SIGINT / the budget alarm: flush, write the manifest, leave."""


@contextmanager
def _stop_on_signals(state: dict[str, Any], hard_stop_s: float | None) -> Iterator[None]:
    def handler(signum: int, _frame: Any) -> None:
        state["signal"] = signal.Signals(signum).name
        raise Stop(state["signal"])
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)}
    try:
        for s in old:
            signal.signal(s, handler)
        if hard_stop_s:
            signal.setitimer(signal.ITIMER_REAL, hard_stop_s)  # a kernel that overruns the budget still ends it
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, h in old.items():
            signal.signal(s, h)


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc; 0 where unknown): the CLI counts its own start-up, torch's
    import included, against the budget."""
    import os
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def default_platform(device_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", (device_name or "gpu").lower()).strip("-")
    return f"quick-{slug}"[:60].rstrip("-")


def run_quick(out_dir: str | Path, *, platform: str | None = None, device: str = "cuda", dtype: str = "bf16",
              profile: str | QuickProfile = "gpu", budget_s: float = DEFAULT_BUDGET_S,
              sustained_s: float | None = None, phases: tuple[str, ...] = PHASES, seed: int = 0,
              telemetry: Telemetry | None = None, clock: Callable[[], float] = time.monotonic,
              log: Callable[[str], None] = print, handle_signals: bool = True, machine: Any = None,
              already_spent_s: float = 0.0) -> dict[str, Any]:
    """Run the phases into `out_dir` within `budget_s` (measured by `clock` from the call, less `already_spent_s`
    spent before it, e.g. the process's start-up), flushing each phase's shards before the next; returns this run's
    manifest entry. Phases finished by an earlier run into the same folder are skipped, as are shapes already
    measured."""
    import torch
    t0 = clock() - already_spent_s
    prof = PROFILES[profile] if isinstance(profile, str) else profile
    unknown = [ph for ph in phases if ph not in PHASES]
    if unknown:
        raise ValueError(f"unknown phase(s) {unknown}: use {', '.join(PHASES)}")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError("gpu-quick --device cuda: torch.cuda.is_available() is False (use --device cpu "
                               "--profile tiny to try it without a GPU)")
        from bench.sampling.sampler import rank_device
        device = rank_device(device)  # "cuda" -> "cuda:<LOCAL_RANK>", made current
        torch.backends.cuda.matmul.allow_tf32 = False
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    facts = env.facts(device)
    if machine is not None:
        facts["machine"], facts["machine_id"] = machine.to_dict(), machine.id
    here = env_machine(facts)
    store_io.check_same_machine(out, here, hint="gpu-quick writes one machine's samples per folder.")
    platform = platform or (default_platform(str(facts.get("device_name"))) if device.startswith("cuda")
                            else "quick-cpu")
    tel, tel_why = (telemetry, "given") if telemetry is not None else choose_telemetry(device)
    gpu = {"reader": tel.kind, "reader_why": tel_why, **tel.static(), "at_start": tel.read()}
    m0 = store_io.read_manifest(out)
    prev = (m0.get("gpu_quick") or {}).get("phases") or {}
    finished = {ph for ph, st in prev.items() if st.get("finished")}
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:4]
    sustain = min(DEFAULT_SUSTAINED_S if sustained_s is None else sustained_s, SUSTAINED_MAX_SHARE * budget_s)
    provenance = {k: facts.get(k) for k in ("device_name", "driver", "cuda", "cudnn", "nccl", "torch",
                                             "compute_capability", "sm_count", "device_memory_gib", "max_sm_clock",
                                             "host", "recorded_at", "repo_commit")}
    provenance.update({k: gpu.get(k) for k in ("max_sm_clock_mhz", "max_memory_clock_mhz", "power_limit_w")})
    provenance["driver"] = provenance.get("driver") or gpu.get("driver")
    provenance["telemetry_reader"] = tel.kind
    run: dict[str, Any] = {"run_id": run_id, "kind": "gpu-quick", "started_at": store_io.now_iso(),
                           "platform": platform, "device": device, "dtype": dtype, "profile": prof.name,
                           "budget_s": budget_s, "spent_before_start_s": round(already_spent_s, 1),
                           "sustained_s": sustain, "phases_asked": list(phases),
                           "phases_already_finished": sorted(finished), "provenance": provenance, "gpu": gpu,
                           "facts": facts, "machine_id": here.id,
                           "timing": f"warm-up 2, median of 3..{prof.max_reps} repeats (target {prof.target_s} s, "
                                     f"at most {prof.max_total_s} s per shape and pass); CUDA events on a GPU",
                           "phases": {}}
    state: dict[str, Any] = {"signal": None}
    phase_log: dict[str, Any] = dict(prev)

    def write_manifest() -> None:
        store_io.update_manifest(out, platform, facts, run,
                                 description=f"{platform}: gpu-quick on {facts.get('device_name')} ({dtype})",
                                 gpu_quick={"phases": phase_log, "provenance": provenance,
                                            "telemetry_reader": tel.kind,
                                            "command": "python -m bench gpu-quick"})

    write_manifest()
    source = f"bench/gpu-quick {platform} run {run_id} on {facts.get('host')}"
    done = store_io.done_op_keys(out)
    deadline = t0 + budget_s
    sampling_end = deadline - (sustain if "sustained" in phases and "sustained" not in finished else 0.0)
    rows: list[dict[str, Any]] = []
    seq = [0]
    written = [0]
    last_flush = [time.monotonic()]

    def flush(force: bool = False) -> None:
        if rows and (force or time.monotonic() - last_flush[0] >= FLUSH_EVERY_S):
            store_io.write_shard(out, "ops", run_id, seq[0], rows)
            written[0] += len(rows)
            seq[0] += 1
            rows.clear()
            last_flush[0] = time.monotonic()

    stopped = "all phases finished"
    current = None
    ctx = _stop_on_signals(state, max(1.0, deadline - clock()) + 30.0) if handle_signals else nullcontext()
    try:
        with ctx:
            todo_sampling = [ph for ph in SAMPLING_PHASES if ph in phases and ph not in finished]
            for i, ph in enumerate(todo_sampling):
                current = ph
                now = clock()
                w_left = sum(PHASE_WEIGHTS[q] for q in todo_sampling[i:])
                phase_deadline = now + max(0.0, sampling_end - now) * PHASE_WEIGHTS[ph] / w_left
                st = _sample_phase(ph, prof, seed, dtype, device, platform, source, done, rows, flush, clock,
                                   phase_deadline, tel, log)
                flush(force=True)
                st["rows_total_in_set"] = st.pop("rows") + int((prev.get(ph) or {}).get("rows_total_in_set", 0))
                phase_log[ph] = st
                run["phases"][ph] = st
                write_manifest()
                log(f"gpu-quick {ph}: {st['measured_points']} shapes measured, {st['skipped_points']} skipped, "
                    f"{'finished' if st['finished'] else 'cut by its time share'} ({st['elapsed_s']} s)")
            if "sustained" in phases and "sustained" not in finished:
                current = "sustained"
                left = deadline - clock()
                st = sustained_gemm(device, dtype, min(sustain, max(0.0, left)), prof, tel, clock)
                st["finished"] = bool(st["windows"]) and st["elapsed_s"] >= 0.9 * sustain
                phase_log["sustained"] = {k: v for k, v in st.items() if k != "windows"} | {
                    "windows": st["windows"]}
                run["phases"]["sustained"] = phase_log["sustained"]
                write_manifest()
                log(f"gpu-quick sustained: {st['summary']}")
            current = None
    except Stop as exc:
        stopped = f"stopped by {exc} during phase {current}"
        if current and current in SAMPLING_PHASES:
            phase_log[current] = {**(phase_log.get(current) or {}), "finished": False,
                                  "stopped": stopped}
    finally:
        flush(force=True)
        gpu["at_end"] = tel.read()
        run.update({"finished_at": store_io.now_iso(), "elapsed_s": round(clock() - t0, 1),
                    "rows_written": written[0], "stopped": stopped,
                    "phases_finished": sorted(ph for ph, st in phase_log.items() if st.get("finished"))})
        write_manifest()
    log(f"gpu-quick {platform}: {written[0]} rows in {run['elapsed_s']} s ({stopped}); -> {out}")
    return run


def env_machine(facts: dict[str, Any]) -> Any:
    from predictor.hardware.machine import from_dict
    return from_dict(facts["machine"])


def _sample_phase(phase: str, prof: QuickProfile, seed: int, dtype: str, device: str, platform: str, source: str,
                  done: set[str], rows: list[dict[str, Any]], flush: Callable[[], None], clock: Callable[[], float],
                  phase_deadline: float, tel: Telemetry, log: Callable[[str], None]) -> dict[str, Any]:
    import torch
    pts = phase_points(phase, prof, seed)
    todo = [p for p in pts if any(p.key(ps, dtype) not in done for ps in P.OPS[p.op].passes)]
    t_start = clock()
    measured, skipped, n_rows = 0, [], 0
    reached = 0
    finished = True
    last_read, reading = -1e9, tel.read()
    for p in todo:
        if clock() >= phase_deadline:
            finished = False
            break
        reached += 1
        try:
            kernels = build_passes(p, dtype, device)
            expanded = kernels.pop("gqa_expanded", None) is not None
            res = {ps: time_call(run, setup, device=device, target_s=prof.target_s, max_total_s=prof.max_total_s,
                                 max_reps=prof.max_reps)
                   for ps, (setup, run) in kernels.items()}
        except (RuntimeError, MemoryError, ValueError) as exc:  # OOM, no flash kernel for the shape: skip it
            skipped.append({"op": p.op, "shape": {k: v for k, v in p.shape.items() if v is not None},
                            "error": str(exc)[:200]})
            kernels = {}
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            continue
        del kernels
        if time.monotonic() - last_read >= prof.window_s:
            reading, last_read = tel.read(), time.monotonic()
        extra_cols: dict[str, Any] = {f"{k}_s": res[k].median_s for k in ("dgrad", "wgrad") if k in res}
        if p.op == "flash_attn":
            extra_cols["gqa_expanded"] = expanded
        for ps in P.OPS[p.op].passes:
            if p.key(ps, dtype) in done:
                continue
            tm = res[ps]
            rows.append({"platform": platform, "op": p.op, "pass": ps, **p.shape, "variant": p.variant, "dtype": dtype,
                         "duration_s": tm.median_s, "source": source, "measured_at": store_io.now_iso(),
                         "design_index": p.index, "reps": tm.reps, "iqr_s": tm.iqr_s, "min_s": tm.min_s,
                         "phase": phase, "model": p.extra["model"], "device": device,
                         **{k: v for k, v in extra_cols.items() if ps == "bwd" or not k.endswith("grad_s")},
                         **reading})
            done.add(p.key(ps, dtype))
            n_rows += 1
        measured += 1
        flush()
    return {"finished": finished, "planned_points": len(pts), "already_done_points": len(pts) - len(todo),
            "measured_points": measured, "skipped_points": len(skipped), "skipped": skipped[:10], "rows": n_rows,
            "elapsed_s": round(clock() - t_start, 1), "time_share_s": round(max(0.0, phase_deadline - t_start), 1),
            "not_reached_points": len(todo) - reached}


def sustained_gemm(device: str, dtype: str, seconds: float, prof: QuickProfile, tel: Telemetry,
                   clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """One square GEMM (prof.sustained_n) repeated for `seconds`, in windows of about prof.window_s: each window's
    achieved TFLOP/s and the telemetry read at its end."""
    import statistics

    import torch

    from bench.kernels.opbench import DTYPES
    n = prof.sustained_n
    dev = torch.device(device)
    a = torch.randn(n, n, dtype=DTYPES[dtype], device=dev)
    b = torch.randn(n, n, dtype=DTYPES[dtype], device=dev)
    c = torch.empty(n, n, dtype=DTYPES[dtype], device=dev)
    cuda = device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    flops = 2.0 * n ** 3
    for _ in range(3):  # warm-up (library initialisation, clocks ramping)
        torch.mm(a, b, out=c)
    sync()
    t0 = time.perf_counter()
    for _ in range(3):
        torch.mm(a, b, out=c)
    sync()
    per = max((time.perf_counter() - t0) / 3, 1e-7)
    k = max(1, int(prof.window_s / per))
    windows: list[dict[str, Any]] = []
    start = clock()
    w_start = time.perf_counter()
    while clock() - start < seconds:
        for _ in range(k):
            torch.mm(a, b, out=c)
        reading = tel.read()  # on a GPU, read while the window's GEMMs run (the launches are asynchronous)
        sync()
        now = time.perf_counter()
        dt = now - w_start
        windows.append({"t_s": round(clock() - start, 3), "tflops": k * flops / dt / 1e12, "calls": k, **reading})
        w_start = now
    tf = [w["tflops"] for w in windows]
    clocks = [w["sm_clock_mhz"] for w in windows if w.get("sm_clock_mhz") is not None]
    power = [w["power_w"] for w in windows if w.get("power_w") is not None]
    temps = [w["temperature_c"] for w in windows if w.get("temperature_c") is not None]
    tenth = max(1, len(tf) // 6)
    summ: dict[str, Any] = {
        "gemm": f"{n}x{n}x{n} {dtype}", "windows_n": len(tf),
        "tflops_median": statistics.median(tf) if tf else None,
        "tflops_first": statistics.median(tf[:tenth]) if tf else None,
        "tflops_last": statistics.median(tf[-tenth:]) if tf else None,
        "sm_clock_mhz_min": min(clocks) if clocks else None,
        "sm_clock_mhz_median": statistics.median(clocks) if clocks else None,
        "power_w_median": statistics.median(power) if power else None,
        "temperature_c_max": max(temps) if temps else None}
    return {"seconds_asked": round(seconds, 1), "elapsed_s": round(clock() - start, 1), "reader": tel.kind,
            "summary": summ, "windows": windows}


def read_phases(out_dir: str | Path) -> dict[str, Any]:
    """The set's phase record (manifest `gpu_quick.phases`)."""
    return (store_io.read_manifest(Path(out_dir)).get("gpu_quick") or {}).get("phases") or {}


def describe(run: dict[str, Any]) -> str:
    return json.dumps({k: run.get(k) for k in ("platform", "stopped", "rows_written", "elapsed_s",
                                               "phases_finished")}, default=str)

"""Which machine is this? A CPU fingerprint, and the check that a CPU platform's models were sampled here.

Operator samples describe the machine they were measured on. Another CPU (an Intel Xeon instead of the
AMD EPYC the shipped `cpu-2t` / `cpu-1t` were sampled on) runs the same training step at a different
speed, and nothing in a prediction says so. This module (pure Python: /proc/cpuinfo, /proc/meminfo,
os.cpu_count and the installed torch's version from its package metadata; torch is never imported)
answers three questions:

    m = current()                         # this machine's Machine (cached)
    m.id                                  # short stable id: a hash of the identity fields only
    differences(a, b)                     # which fields differ, in words
    mismatch_warning("cpu-2t", models)    # a sentence when cpu-2t was sampled on another machine, else None

Identity fields (hashed into `id`): CPU vendor, model name, family / model / stepping, logical cores,
architecture, L2 and L3 cache size (a VM's model name can be as vague as "AMD EPYC"; the caches tell
Zen 3 from Zen 4), the instruction-set extensions that decide which kernels torch runs (AVX2,
AVX-512, AMX, ...; `ISA_FLAGS`) and the torch release. Not hashed, only recorded: memory size (a VM
resized keeps its CPU), clock frequency and load (they change from minute to minute), host name (a
fleet of identical VMs shares one set of samples), and the sampler's settings (threads, allocator).

A fingerprint rebuilt from an older manifest's facts (`from_facts`) knows only some fields; None
means "not recorded". Two fingerprints describe the same machine when every identity field known
in both is equal (`same_machine`); with both complete that is the same `id`.

The bench loop (`python -m bench cpu-platform`) writes `models_store/<platform>/sampled_on.json` with
the fingerprint of the machine that sampled the platform; `mismatch_warning` compares it with this one.
`$PREDICTOR_MACHINE_OVERRIDE` (a JSON object of fields) replaces fields of `current()`: for tests,
and to see what the bench loop would do on another machine (`--plan`).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform as _platform
import socket
import tempfile
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SAMPLED_ON_FILE = "sampled_on.json"
OVERRIDE_ENV = "PREDICTOR_MACHINE_OVERRIDE"
# Instruction-set extensions that change which CPU kernels torch (oneDNN, MKL, its own vectorised
# code) dispatches to, x86 then Arm; others (aes, sha, ...) do not matter for training speed.
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl",
             "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
             "amx_fp16", "asimd", "asimdhp", "asimddp", "sve", "sve2", "bf16", "i8mm", "sme")
IDENTITY_FIELDS = ("vendor", "model_name", "family", "model", "stepping", "cores", "arch", "l2", "l3", "isa",
                   "torch")
_LABELS = {"vendor": "CPU vendor", "model_name": "CPU model", "family": "CPU family", "model": "CPU model number",
           "stepping": "CPU stepping", "cores": "logical cores", "arch": "architecture", "l2": "L2 cache",
           "l3": "L3 cache", "isa": "instruction sets", "torch": "torch release"}


@dataclass
class Machine:
    vendor: str | None = None
    model_name: str | None = None
    family: str | None = None
    model: str | None = None
    stepping: str | None = None
    cores: int | None = None
    arch: str | None = None
    l2: str | None = None              # per-core L2 as the kernel reports it, e.g. 1024K
    l3: str | None = None
    isa: list[str] | None = None       # ISA_FLAGS present (None: not recorded)
    torch: str | None = None           # public release (local build tag such as +cpu dropped)
    # recorded, not part of the identity
    torch_build: str | None = None     # the full version string, e.g. 2.13.0+cpu
    memory_gib: float | None = None
    usable_cores: int | None = None    # sched_getaffinity (containers may allow fewer than cpu_count)
    caches: dict[str, str] = field(default_factory=dict)
    hypervisor: bool | None = None
    host: str | None = None
    threads: int | None = None         # the sampler's torch threads per process, where recorded
    allocator: str | None = None       # the host allocator the samples were taken with
    recorded_at: str | None = None
    source: str = "read on this machine"

    @property
    def identity(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (sorted(d[k]) if k == "isa" and d[k] is not None else d[k]) for k in IDENTITY_FIELDS}

    @property
    def unknown(self) -> list[str]:
        """Identity fields this fingerprint does not know (rebuilt from older facts)."""
        return [k for k, v in self.identity.items() if v is None]

    @property
    def id(self) -> str:
        blob = json.dumps(self.identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    def isa_summary(self) -> str:
        if self.isa is None:
            return "ISA not recorded"
        s = set(self.isa)
        for flags, name in ((("amx_tile",), "AMX"), (("avx512f",), "AVX-512"), (("avx2",), "AVX2"),
                            (("avx",), "AVX"), (("sve2",), "SVE2"), (("sve",), "SVE"), (("asimd",), "NEON")):
            if s.issuperset(flags):
                return name
        return "no vector extension known to torch"

    def short(self) -> str:
        """'AMD EPYC (family 25 model 17, 2 cores, L2 1024K, AVX-512, torch 2.13.0)'."""
        parts = [f"family {self.family} model {self.model}" if self.family is not None else None,
                 f"{self.cores} cores" if self.cores else None, f"L2 {self.l2}" if self.l2 else None,
                 None if self.isa is None else self.isa_summary(), f"torch {self.torch}" if self.torch else None]
        return f"{self.model_name or 'unknown CPU'} ({', '.join(p for p in parts if p)})"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "id": self.id}


def from_dict(d: dict[str, Any]) -> Machine:
    """A Machine from `to_dict()` output (an `id` key is recomputed, never trusted)."""
    if not isinstance(d, dict):
        raise TypeError("a machine fingerprint is a JSON object")
    known = {f.name for f in fields(Machine)}
    m = Machine(**{k: v for k, v in d.items() if k in known})
    m.isa = None if m.isa is None else sorted(m.isa)
    return m


def from_facts(facts: dict[str, Any], source: str = "rebuilt from the facts a sampling run recorded") -> Machine:
    """A (partial) fingerprint from the facts bench recorded before fingerprints existed: cpu_model,
    cpu_count, cpu_caches, ram_gib, torch, torch_threads, host_allocator. The vendor is inferred from
    the model name; family / model / stepping and the ISA flags stay unknown (None)."""
    if isinstance(facts.get("machine"), dict):
        return from_dict(facts["machine"])
    name = facts.get("cpu_model")
    low = (name or "").lower()
    vendor = "AuthenticAMD" if ("amd" in low or "epyc" in low or "ryzen" in low) else \
        "GenuineIntel" if ("intel" in low or "xeon" in low) else None
    caches = dict(facts.get("cpu_caches") or {})
    os_str = str(facts.get("os") or "")
    arch = next((a for a in ("x86_64", "aarch64", "arm64") if a in os_str), None)
    alloc = facts.get("host_allocator")
    return Machine(vendor=vendor, model_name=name, cores=facts.get("cpu_count"), arch=arch,
                   l2=caches.get("L2"), l3=caches.get("L3"), torch=torch_release(facts.get("torch")),
                   torch_build=facts.get("torch"), memory_gib=facts.get("ram_gib"), caches=caches,
                   host=facts.get("host"), threads=facts.get("torch_threads"),
                   allocator=", ".join(alloc) if isinstance(alloc, list) else alloc,
                   recorded_at=facts.get("recorded_at"), source=source)


# --------------------------------------------------------------------------- reading this machine
def _kv_blocks(text: str) -> list[dict[str, str]]:
    blocks: list[dict[str, str]] = []
    cur: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if cur:
                blocks.append(cur)
                cur = {}
            continue
        if ":" in line:
            k, v = line.split(":", 1)
            cur.setdefault(k.strip().lower(), v.strip())
    if cur:
        blocks.append(cur)
    return blocks


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """Vendor, model name, family / model / stepping, ISA flags and the hypervisor bit from
    /proc/cpuinfo text (x86 and Arm layouts)."""
    blocks = _kv_blocks(text)
    first = next((b for b in blocks if "processor" in b or "vendor_id" in b or "cpu implementer" in b),
                 blocks[0] if blocks else {})
    merged: dict[str, str] = {}
    for b in blocks:  # Arm puts 'Hardware' / 'Model' in a trailing block
        for k, v in b.items():
            merged.setdefault(k, v)
    flags = (first.get("flags") or first.get("features") or "").split()
    out: dict[str, Any] = {"isa": sorted(f for f in set(flags) if f in ISA_FLAGS),
                           "hypervisor": "hypervisor" in flags if flags else None}
    if "vendor_id" in first:  # x86
        out.update(vendor=first["vendor_id"], model_name=first.get("model name") or "unknown",
                   family=first.get("cpu family"), model=first.get("model"), stepping=first.get("stepping"))
    elif "cpu implementer" in first:  # Arm: implementer / part / variant+revision
        out.update(vendor=f"Arm implementer {first['cpu implementer']}",
                   model_name=first.get("model name") or merged.get("hardware") or merged.get("model")
                   or f"Arm part {first.get('cpu part', '?')}",
                   family=first.get("cpu architecture"), model=first.get("cpu part"),
                   stepping=f"{first.get('cpu variant', '?')}/{first.get('cpu revision', '?')}")
    elif first:
        out.update(vendor=first.get("vendor") or "unknown",
                   model_name=first.get("model name") or first.get("cpu") or "unknown")
    return out


def parse_meminfo_gib(text: str) -> float | None:
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            try:
                return round(int(line.split()[1]) / 2**20, 1)
            except (IndexError, ValueError):
                return None
    return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def cpu_caches() -> dict[str, str]:
    """This CPU's caches from sysfs, e.g. {'L1d': '32K', 'L2': '1024K', 'L3': '32768K'} (empty elsewhere)."""
    out = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")) if base.exists() else []:
        try:
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            out[f"L{level}{'d' if kind == 'Data' else 'i' if kind == 'Instruction' else ''}"] = \
                (idx / "size").read_text().strip()
        except OSError:
            continue
    return out


def torch_release(version: str | None) -> str | None:
    """'2.13.0+cpu' -> '2.13.0' (the local build tag names the wheel, not different CPU kernels)."""
    return version.split("+", 1)[0] if version else None


def _torch_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("torch")
        except PackageNotFoundError:
            return None
    except ImportError:  # pragma: no cover - stdlib
        return None


def read_machine(cpuinfo: str | None = None, meminfo: str | None = None, cpu_count: int | None = None,
                 torch_version: str | None = None) -> Machine:
    """This machine's fingerprint (arguments replace what would be read: for tests)."""
    info = parse_cpuinfo(_read("/proc/cpuinfo") if cpuinfo is None else cpuinfo)
    if info.get("model_name") in (None, "unknown"):
        info["model_name"] = _platform.processor() or _platform.machine() or "unknown"
    tv = _torch_version() if torch_version is None else torch_version
    caches = cpu_caches()
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return Machine(vendor=info.get("vendor") or "unknown", model_name=info["model_name"],
                   family=info.get("family"), model=info.get("model"), stepping=info.get("stepping"),
                   cores=os.cpu_count() if cpu_count is None else cpu_count, arch=_platform.machine() or None,
                   l2=caches.get("L2"), l3=caches.get("L3"), isa=info.get("isa", []), torch=torch_release(tv),
                   torch_build=tv,
                   memory_gib=parse_meminfo_gib(_read("/proc/meminfo") if meminfo is None else meminfo),
                   usable_cores=usable, caches=caches, hypervisor=info.get("hypervisor"),
                   host=socket.gethostname(),
                   recorded_at=datetime.now(UTC).isoformat(timespec="seconds"))


_CURRENT: dict[str, tuple[Machine, str]] = {}


def _current_cached(refresh: bool = False) -> tuple[Machine, str]:
    """(this machine, its id), read once per process and override; shared: never modify it."""
    key = os.environ.get(OVERRIDE_ENV, "")
    if refresh or key not in _CURRENT:
        m = read_machine()
        if key:
            try:
                over = json.loads(key)
            except ValueError as exc:
                raise ValueError(f"${OVERRIDE_ENV} is not a JSON object: {exc}") from None
            m = from_dict({**asdict(m), **over, "source": f"read on this machine, fields replaced by ${OVERRIDE_ENV}"})
        _CURRENT.clear()
        _CURRENT[key] = (m, m.id)
    return _CURRENT[key]


def current(refresh: bool = False) -> Machine:
    """This machine (read once per process; `$PREDICTOR_MACHINE_OVERRIDE` fields applied). A copy:
    callers may record settings (threads, allocator) on it."""
    return from_dict(asdict(_current_cached(refresh)[0]))


# --------------------------------------------------------------------------- comparing
def differences(a: Machine, b: Machine, notes: bool = False) -> list[str]:
    """The identity fields in which `a` and `b` differ, in words ('logical cores: 2 vs 4'); with
    `notes`, also the recorded-only fields (memory, threads, allocator), marked as such."""
    out = []
    ia, ib = a.identity, b.identity
    fms = ("family", "model", "stepping")
    known = [k for k in fms if ia[k] is not None and ib[k] is not None]
    if any(ia[k] != ib[k] for k in known):
        out.append(f"CPU family/model/stepping {'/'.join(str(ia[k]) for k in fms)} vs "
                   f"{'/'.join(str(ib[k]) for k in fms)}")
    for k in IDENTITY_FIELDS:
        if k in fms or ia[k] is None or ib[k] is None or ia[k] == ib[k]:
            continue
        if k == "isa":
            only_a = sorted(set(ia[k]) - set(ib[k]))
            only_b = sorted(set(ib[k]) - set(ia[k]))
            parts = ([f"only the first has {', '.join(only_a)}"] if only_a else []) + \
                    ([f"only the second has {', '.join(only_b)}"] if only_b else [])
            out.append(f"instruction sets: {'; '.join(parts)}")
        else:
            out.append(f"{_LABELS[k]}: {ia[k]} vs {ib[k]}")
    if notes:
        for who, m in (("first", a), ("second", b)):
            if m.unknown:
                out.append(f"not recorded for the {who}: {', '.join(_LABELS[k] for k in m.unknown)}")
        for k, label in (("memory_gib", "memory GiB"), ("threads", "threads per process"), ("allocator", "allocator")):
            va, vb = getattr(a, k), getattr(b, k)
            if va is not None and vb is not None and va != vb:
                out.append(f"{label}: {va} vs {vb} (recorded, not part of the machine's identity)")
    return out


def same_machine(a: Machine | None, b: Machine | None) -> bool:
    """Same id, or, where either fingerprint is partial, every identity field known in both equal
    (at least the model name and the cores must be known in both)."""
    if a is None or b is None:
        return False
    if not a.unknown and not b.unknown:
        return a.id == b.id
    ia, ib = a.identity, b.identity
    if any(ia[k] is None or ib[k] is None for k in ("model_name", "cores")):
        return False
    return all(ia[k] == ib[k] for k in IDENTITY_FIELDS if ia[k] is not None and ib[k] is not None)


# --------------------------------------------------------------------------- sampled_on.json
def sampled_on_path(platform_id: str, models_dir: str | os.PathLike[str]) -> Path:
    if not platform_id or "/" in platform_id or "\\" in platform_id or ".." in platform_id:
        raise ValueError(f"'{platform_id}' is not a platform name")
    return Path(models_dir) / platform_id / SAMPLED_ON_FILE


def write_sampled_on(platform_id: str, models_dir: str | os.PathLike[str], machine: Machine, *,
                     samples_dir: str | None = None, sampled_from: str | None = None,
                     sampled_until: str | None = None, runs: list[str] | None = None,
                     written_by: str = "python -m bench cpu-platform", note: str | None = None) -> Path:
    """Record which machine a platform's models were sampled on (atomic write)."""
    path = sampled_on_path(platform_id, models_dir)
    rec = {"platform": platform_id, "machine_id": machine.id, "machine": machine.to_dict(),
           "machine_summary": machine.short(), "samples_dir": samples_dir,
           "sampled_from": sampled_from, "sampled_until": sampled_until, "sample_runs": runs or [],
           "written_at": datetime.now(UTC).isoformat(timespec="seconds"), "written_by": written_by}
    if note:
        rec["note"] = note
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(rec, indent=1) + "\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_sampled_on(platform_id: str, models_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The platform's sampled_on.json (its `machine` parsed into a Machine), None without one;
    ValueError naming the file when it cannot be read."""
    path = sampled_on_path(platform_id, models_dir)
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text())
        rec["machine"] = from_dict(rec["machine"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} cannot be read ({type(exc).__name__}: {exc})") from None
    return rec


_WARN_CACHE: dict[tuple, str | None] = {}


def mismatch_warning(platform_id: str, models_dir: str | os.PathLike[str],
                     machine: Machine | None = None) -> str | None:
    """A sentence when `platform_id`'s models were sampled on another machine than this one (or
    `machine`), None when it is the same machine or the platform does not say where it was sampled
    (no models_store/<platform>/sampled_on.json). Cheap to call per prediction (cached by file)."""
    try:
        path = sampled_on_path(platform_id, models_dir)
        st = path.stat()
    except (ValueError, OSError):
        return None
    here, here_id = (machine, machine.id) if machine is not None else _current_cached()
    key = (str(path), st.st_mtime_ns, st.st_size, here_id)
    if key in _WARN_CACHE:
        return _WARN_CACHE[key]
    msg: str | None
    try:
        rec = read_sampled_on(platform_id, models_dir)
    except ValueError as exc:
        msg = (f"Cannot tell which machine {platform_id} was sampled on: {exc}. Run `python -m bench cpu-platform` "
               f"to sample this machine if it is not the one.")
        _WARN_CACHE[key] = msg
        return msg
    if rec is None:  # the file went away since the stat above
        return None
    there: Machine = rec["machine"]
    msg = None
    if not same_machine(there, here):
        diff = differences(there, here)
        only_torch = bool(diff) and all(d.startswith(_LABELS["torch"]) for d in diff)
        if only_torch:
            msg = (f"{platform_id} was sampled with torch {there.torch} on this CPU ({there.model_name}); this "
                   f"machine runs torch {here.torch}, whose CPU kernels can be faster or slower: run "
                   f"`python -m bench cpu-platform` to sample this machine again.")
        else:
            when = f" on {str(rec.get('sampled_until') or rec.get('sampled_from'))[:10]}" \
                if rec.get("sampled_until") or rec.get("sampled_from") else ""
            why = "; ".join(diff) if diff else \
                "the record does not name the " \
                + " and ".join(_LABELS[k] for k in ("model_name", "cores") if k in there.unknown)
            msg = (f"{platform_id} was sampled{when} on {there.short()}; this machine is {here.short()} "
                   f"({why}). Its operator times describe that CPU, not this one, so this prediction can be "
                   f"far off: run `python -m bench cpu-platform` to sample this machine.")
    _WARN_CACHE[key] = msg
    return msg

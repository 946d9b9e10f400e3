"""predictor.hardware.machine: the CPU fingerprint, its id, the comparison in words, sampled_on.json and the
mismatch warning a prediction on another CPU gets. Pure: fake /proc text, no torch import."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from predictor.hardware import machine as M

REPO = Path(__file__).resolve().parents[1]

AMD = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
cpu MHz\t\t: 2596.132
flags\t\t: fpu sse sse2 sse4_2 avx avx2 fma f16c avx512f avx512dq avx512bw avx512vl avx512_bf16 aes hypervisor

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
cpu MHz\t\t: 3400.000
flags\t\t: fpu sse sse2 sse4_2 avx avx2 fma f16c avx512f avx512dq avx512bw avx512vl avx512_bf16 aes hypervisor
"""
INTEL = AMD.replace("AuthenticAMD", "GenuineIntel").replace("AMD EPYC", "Intel(R) Xeon(R) Platinum 8480+") \
    .replace("cpu family\t: 25", "cpu family\t: 6").replace("model\t\t: 17", "model\t\t: 143") \
    .replace("avx512_bf16", "avx512_bf16 amx_tile amx_bf16 amx_int8")
ARM = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimddp sve sve2 i8mm bf16
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd4f
CPU revision\t: 1
"""
MEM = "MemTotal:       24684096 kB\nMemFree:        23630544 kB\n"


def machine(cpuinfo=AMD, cores=2, torch="2.13.0+cpu", mem=MEM, **over) -> M.Machine:
    m = M.read_machine(cpuinfo=cpuinfo, meminfo=mem, cpu_count=cores, torch_version=torch)
    m.l2, m.l3 = over.pop("l2", "1024K"), over.pop("l3", "32768K")  # not the test machine's sysfs
    for k, v in over.items():
        setattr(m, k, v)
    return m


def test_fingerprint_reads_cpuinfo_and_meminfo():
    m = machine()
    assert (m.vendor, m.model_name, m.family, m.model, m.stepping) == ("AuthenticAMD", "AMD EPYC", "25", "17", "1")
    assert m.cores == 2 and m.memory_gib == 23.5 and m.torch == "2.13.0" and m.torch_build == "2.13.0+cpu"
    assert m.isa == ["avx", "avx2", "avx512_bf16", "avx512bw", "avx512dq", "avx512f", "avx512vl", "f16c", "fma",
                     "sse4_2"]  # relevant flags only: no fpu, aes, hypervisor
    assert m.hypervisor is True and not m.unknown
    assert m.short() == "AMD EPYC (family 25 model 17, 2 cores, L2 1024K, AVX-512, torch 2.13.0)"
    arm = M.read_machine(cpuinfo=ARM, meminfo=MEM, cpu_count=4, torch_version="2.13.0")
    assert arm.vendor == "Arm implementer 0x41" and arm.model == "0xd4f" and arm.stepping == "0x0/1"
    assert arm.isa == ["asimd", "asimddp", "asimdhp", "bf16", "i8mm", "sve", "sve2"] and arm.isa_summary() == "SVE2"


def test_id_is_stable_and_ignores_load_frequency_memory_and_settings():
    a = machine()
    b = machine(cpuinfo=AMD.replace("2596.132", "1500.000"), mem=MEM.replace("24684096", "16000000"),
                host="other-vm", threads=1, allocator="system default", recorded_at="2030-01-01")
    assert a.id == b.id and len(a.id) == 10 and M.same_machine(a, b)
    assert M.differences(a, b) == []
    assert any("memory GiB: 23.5 vs 15.3" in d for d in M.differences(a, b, notes=True))
    # the id survives a round trip through JSON (an `id` key is recomputed, not trusted)
    assert M.from_dict(json.loads(json.dumps({**a.to_dict(), "id": "forged"}))).id == a.id
    # identity fields do change it
    for other in (machine(cores=4), machine(torch="2.14.0"), machine(l2="512K"),
                  machine(cpuinfo=AMD.replace(" avx512f", "")), machine(cpuinfo=INTEL)):
        assert other.id != a.id and not M.same_machine(a, other)
    assert machine(torch="2.13.0").id == a.id  # +cpu / +cu121 wheels of one release run the same CPU kernels


def test_differences_are_said_in_words():
    d = M.differences(machine(), machine(cpuinfo=INTEL, cores=4))
    assert "CPU family/model/stepping 25/17/1 vs 6/143/1" in d
    assert "CPU vendor: AuthenticAMD vs GenuineIntel" in d and "logical cores: 2 vs 4" in d
    assert "CPU model: AMD EPYC vs Intel(R) Xeon(R) Platinum 8480+" in d
    assert "instruction sets: only the second has amx_bf16, amx_int8, amx_tile" in d


def test_partial_fingerprint_from_old_facts_compares_what_it_knows():
    facts = json.loads((REPO / "bench/samples/cpu-2t/manifest.json").read_text())["runs"][0]["facts"]
    old = M.from_facts({k: v for k, v in facts.items() if k != "machine"})
    assert old.vendor == "AuthenticAMD" and old.cores == 2 and old.l2 == "512K" and old.torch == "2.13.0"
    assert set(old.unknown) == {"family", "model", "stepping", "isa"}
    assert M.same_machine(old, machine(l2="512K"))  # every field known in both agrees
    assert not M.same_machine(old, machine())       # the L2 cache differs
    assert M.differences(old, machine()) == ["L2 cache: 512K vs 1024K"]
    assert not M.same_machine(M.Machine(), machine())  # nothing known: not the same


def test_mismatch_warning_names_both_machines_and_the_command(tmp_path):
    amd, intel = machine(), machine(cpuinfo=INTEL, cores=4)
    assert M.mismatch_warning("cpu-2t", tmp_path, intel) is None  # no sampled_on.json: nothing to say
    p = M.write_sampled_on("cpu-2t", tmp_path, amd, samples_dir="bench/samples/cpu-2t",
                           sampled_from="2026-11-23T03:49:06+00:00", sampled_until="2026-11-23T03:54:44+00:00")
    assert p == tmp_path / "cpu-2t" / "sampled_on.json"
    assert M.mismatch_warning("cpu-2t", tmp_path, amd) is None
    w = M.mismatch_warning("cpu-2t", tmp_path, intel)
    assert w.startswith("cpu-2t was sampled on 2026-11-23 on AMD EPYC (family 25 model 17, 2 cores")
    assert "this machine is Intel(R) Xeon(R) Platinum 8480+ (family 6 model 143, 4 cores" in w
    assert "logical cores: 2 vs 4" in w and "run `python -m bench cpu-platform` to sample this machine" in w
    tw = M.mismatch_warning("cpu-2t", tmp_path, machine(torch="2.14.0"))
    assert "sampled with torch 2.13.0 on this CPU" in tw and "runs torch 2.14.0" in tw
    rec = M.read_sampled_on("cpu-2t", tmp_path)
    assert rec["machine"].id == amd.id and rec["machine_id"] == amd.id and rec["samples_dir"] == "bench/samples/cpu-2t"
    (tmp_path / "cpu-2t" / "sampled_on.json").write_text("{not json")
    assert "Cannot tell which machine cpu-2t was sampled on" in M.mismatch_warning("cpu-2t", tmp_path, intel)
    assert M.mismatch_warning("../x", tmp_path, intel) is None


def test_override_env_and_no_torch_import(tmp_path):
    code = ("import json, sys; from predictor.hardware import machine as M; m = M.current(); "
            "print(json.dumps([m.model_name, m.cores, 'torch' in sys.modules]))")
    env = {"PYTHONPATH": str(REPO), "PREDICTOR_MACHINE_OVERRIDE": json.dumps({"model_name": "Fake CPU", "cores": 64}),
           "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["Fake CPU", 64, False]


@pytest.mark.parametrize("platform", ["cpu-2t", "cpu-1t"])
def test_shipped_cpu_platforms_say_where_they_were_sampled(platform):
    rec = M.read_sampled_on(platform, REPO / "models_store")
    m = rec["machine"]
    man = json.loads((REPO / "bench/samples" / platform / "manifest.json").read_text())
    facts = man["runs"][0]["facts"]
    assert m.model_name == facts["cpu_model"] and m.cores == facts["cpu_count"] and m.l2 == facts["cpu_caches"]["L2"]
    assert m.torch == M.torch_release(facts["torch"]) and rec["samples_dir"] == f"bench/samples/{platform}"
    assert M.from_dict(man["machine"]).id == m.id == rec["machine_id"]

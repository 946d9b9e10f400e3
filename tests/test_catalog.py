"""Hardware catalog, cluster presets, generic clusters and user cluster files."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from predictor import paths
from predictor.hardware import platforms as P
from predictor.model.errors import InfeasibleConfig

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
CATALOG = paths.CATALOG_DIR
GPUS = ["a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-40gb", "a100-pcie-80gb", "h100-sxm5-80gb", "h100-pcie-80gb",
        "h200-sxm-141gb", "gh200-96gb", "b200-sxm-180gb", "gb200", "l40s", "l4", "v100-sxm2-32gb", "mi250x", "mi300x",
        "mi325x"]
REQUIRED_PLATFORMS = ["dgx-h100", "dgx-h200", "dgx-b200", "mi300x-8", "perlmutter-a100", "vista-gh200", "dgx-a100-80gb",
                      "dgx-a100-40gb", "gb200-nvl72"]


@pytest.fixture(scope="module")
def raw_devices():
    return json.loads((CATALOG / "devices.json").read_text())


def test_every_gpu_is_in_the_catalog_with_sources(raw_devices):
    devs = P.load_devices()
    cites = raw_devices["_sources"]
    for g in GPUS:
        assert g in devs, g
        d = devs[g]
        assert d.sources, g
        assert d.peak_flops("bf16") > 0 and d.hbm_bandwidth_gbps > 0 and d.hbm_gib > 0 and d.sm_count > 0
        assert d.generation and d.transfer_source in P.load_platforms(), g
        # every value names its citation (a key of _sources, optionally with a remark)
        for fld, src in d.value_sources.items():
            assert re.split(r"[ ,(]", src)[0] in cites, (g, fld, src)
        for fld in ("peak_tflops", "hbm_bandwidth_gbps", "hbm_gib", "sm_count"):
            assert fld in d.value_sources, (g, fld)


def test_dense_peaks_and_mamf_are_consistent():
    for d in P.load_devices().values():
        for prec, v in d.achievable_matmul_tflops.items():
            assert v <= d.peak_tflops.get(prec, d.peak_tflops.get("bf16", 0)) * 1.001, (d.device_id, prec)
        if "fp8" in d.peak_tflops and "bf16" in d.peak_tflops:
            assert d.peak_tflops["fp8"] == pytest.approx(2 * d.peak_tflops["bf16"], rel=0.02), d.device_id


@pytest.mark.skipif(not (SHARED / "ml-engineering").exists(), reason="shared datasets absent")
def test_mamf_values_match_ml_engineering():
    rows = {"a100-sxm4-80gb": "NVIDIA A100 SXM", "a100-pcie-80gb": "NVIDIA A100 PCIe", "gh200-96gb": "NVIDIA GH200 SXM",
            "h100-sxm5-80gb": "NVIDIA H100 SXM", "b200-sxm-180gb": "NVIDIA B200 SXM", "gb200": "NVIDIA GB200 SXM",
            "mi300x": "AMD MI300X", "mi325x": "AMD MI325X"}
    bf = pd.read_csv(SHARED / "ml-engineering" / "mamf_bf16.csv", comment="#").set_index("Accelerator")
    fp8 = pd.read_csv(SHARED / "ml-engineering" / "mamf_fp8.csv", comment="#").set_index("Accelerator")
    devs = P.load_devices()
    for did, acc in rows.items():
        assert devs[did].achievable_matmul_tflops["bf16"] == pytest.approx(float(bf.loc[acc, "MAMF"])), did
        assert devs[did].peak_tflops["bf16"] == pytest.approx(float(bf.loc[acc, "Theory"]), rel=0.01), did
    for dev, name in (("h200-sxm-141gb", "NVIDIA H200 SXM"), ("b200-sxm-180gb", "NVIDIA B200 SXM")):
        assert devs[dev].achievable_matmul_tflops["fp8"] == pytest.approx(float(fp8.loc[name, "MAMF"]))


def test_presets_cover_every_gpu_and_required_ids():
    plats = P.load_platforms()
    for pid in REQUIRED_PLATFORMS:
        assert pid in plats, pid
        assert plats[pid].sources
    covered = {p.device.device_id for p in plats.values()}
    for g in GPUS:
        if g != "gh200-144gb":
            assert g in covered or g == "a100-pcie-40gb", g


def test_paper_platforms_unchanged():
    p = P.get_platform("perlmutter-a100")
    assert (p.gpus_per_node, p.intra_node.bandwidth_gbps, p.inter_node.bandwidth_gbps) == (4, 300, 25)
    assert p.op_models == "perlmutter-a100" and p.device.device_id == "a100-sxm4-80gb"
    v = P.get_platform("vista-gh200")
    assert (v.gpus_per_node, v.inter_node.bandwidth_gbps, v.op_models) == (1, 50, "vista-gh200")
    d = P.get_platform("dgx-a100-80gb")
    assert (d.gpus_per_node, d.intra_node.bandwidth_gbps, d.op_models) == (8, 300, "perlmutter-a100")


def test_transfer_sources_follow_the_generation():
    plats = P.load_platforms()
    assert plats["dgx-h100"].op_models == "vista-gh200"
    assert plats["dgx-b200"].op_models == "vista-gh200"
    assert plats["dgx-a100-40gb"].op_models == "perlmutter-a100"


def test_nvls_only_on_nvswitch_hopper_and_blackwell():
    plats = P.load_platforms()
    assert plats["dgx-h200"].has_nvls and plats["dgx-h200"].nvls_min_gpus == 5
    assert plats["dgx-b200"].has_nvls and plats["dgx-b200"].nvls_min_gpus == 6
    assert not any(plats[p].has_nvls for p in ("dgx-a100-80gb", "mi300x-8", "perlmutter-a100"))


def test_make_cluster_defaults_and_generic_ids():
    c = P.make_cluster("h100-sxm5-80gb", 8)
    assert c.intra_node.kind == "nvswitch" and c.intra_node.bandwidth_gbps == 450
    assert c.inter_node.bandwidth_gbps == P.DEFAULT_INTER_GBPS and c.op_models == "vista-gh200"
    assert c.has_nvls
    m = P.make_cluster("mi300x", 8, inter_gbps=25)
    assert m.intra_node.kind == "xgmi" and not m.has_nvls and m.inter_node.bandwidth_gbps == 25
    l4 = P.make_cluster("l4", 4)
    assert l4.intra_node.kind == "pcie" and l4.op_models == "perlmutter-a100"
    g = P.get_platform("generic:b200-sxm-180gb:8:900:50")
    assert g.gpus_per_node == 8 and g.intra_node.bandwidth_gbps == 900 and g.device.device_id == "b200-sxm-180gb"
    with pytest.raises(InfeasibleConfig) as e:
        P.get_platform("generic:no-such-gpu:8")
    assert e.value.field == "device"
    with pytest.raises(InfeasibleConfig):
        P.get_platform("generic:h100-sxm5-80gb:eight")


def test_user_file_yaml_and_json(tmp_path):
    y = tmp_path / "mine.yaml"
    y.write_text("""
devices:
  my-gpu:
    name: My GPU
    peak_tflops: {bf16: 500, fp16: 500}
    hbm_gib: 64
    hbm_bandwidth_gbps: 3000
    sm_count: 100
    generation: hopper
    transfer_source: vista-gh200
clusters:
  my-cluster:
    device: my-gpu
    gpus_per_node: 4
    intra_node: {kind: nvswitch, bandwidth_gbps: 300}
    inter_node: {kind: roce, bandwidth_gbps: 25}
  my-h100s:
    device: h100-sxm5-80gb
    gpus_per_node: 8
    intra_node: {kind: nvswitch, bandwidth_gbps: 450}
    inter_node: {kind: infiniband-ndr, bandwidth_gbps: 50}
""")
    plats = P.load_platforms(str(y))
    assert plats["my-cluster"].device.peak_flops("bf16") == 500e12
    assert plats["my-cluster"].op_models == "vista-gh200" and plats["my-cluster"].user_defined
    assert plats["my-h100s"].op_models == "vista-gh200"
    assert "dgx-h100" in plats  # the catalog stays
    assert P.get_platform("my-h100s", str(y)).gpus_per_node == 8
    j = tmp_path / "flat.json"
    j.write_text(json.dumps({"flat": {"device": "l40s", "gpus_per_node": 2,
                                      "intra_node": {"kind": "pcie", "bandwidth_gbps": 32},
                                      "inter_node": {"kind": "ethernet", "bandwidth_gbps": 12.5}}}))
    assert P.load_platforms(str(j))["flat"].device.device_id == "l40s"


@pytest.mark.parametrize("entry,field", [
    ({"device": "nope", "gpus_per_node": 8, "intra_node": {"bandwidth_gbps": 10}, "inter_node": {"bandwidth_gbps": 10}},
     "bad.device"),
    ({"device": "l4", "intra_node": {"bandwidth_gbps": 10}, "inter_node": {"bandwidth_gbps": 10}}, "bad.gpus_per_node"),
    ({"device": "l4", "gpus_per_node": 0, "intra_node": {"bandwidth_gbps": 10}, "inter_node": {"bandwidth_gbps": 10}},
     "bad.gpus_per_node"),
    ({"device": "l4", "gpus_per_node": 4, "intra_node": {"bandwidth_gbps": -1}, "inter_node": {"bandwidth_gbps": 10}},
     "bad.intra_node.bandwidth_gbps"),
    ({"device": "l4", "gpus_per_node": 4, "intra_node": {"bandwidth_gbps": 32}, "inter_node": {"bandwidth_gbps": 0}},
     "bad.inter_node.bandwidth_gbps"),
    ({"device": "l4", "gpus_per_node": 4, "intra_node": {"bandwidth_gbps": 32},
      "inter_node": {"bandwidth_gbps": 10000}},
     "bad.inter_node.bandwidth_gbps"),
    ({"device": "l4", "gpus_per_node": 4, "intra_node": {"kind": "pcie", "bandwidth_gbps": 32},
      "inter_node": {"bandwidth_gbps": 10}, "collective_algorithms": ["ring", "nvls"]}, "bad.collective_algorithms"),
    ({"device": "l4", "gpus_per_node": 4, "intra_node": {"bandwidth_gbps": 32}, "inter_node": {"bandwidth_gbps": 10},
      "overlaps_comm_with_compute": "no"}, "bad.overlaps_comm_with_compute"),
    ({"device": {"name": "x", "peak_tflops": {}, "hbm_gib": 1, "hbm_bandwidth_gbps": 1, "sm_count": 1},
      "gpus_per_node": 1, "inter_node": {"bandwidth_gbps": 10}}, "bad-device.peak_tflops"),
])
def test_user_file_errors_name_the_field(tmp_path, entry, field):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"bad": entry}))
    with pytest.raises(InfeasibleConfig) as e:
        P.load_platforms(str(f))
    assert e.value.field.endswith(field), e.value.field
    assert "bad.json" in e.value.field


def test_unreadable_user_file(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("clusters: [unclosed")
    with pytest.raises(InfeasibleConfig) as e:
        P.load_platforms(str(f))
    assert e.value.field == "clusters"
    with pytest.raises(InfeasibleConfig):
        P.load_platforms(str(tmp_path / "missing.json"))


def test_precision_and_kernel_support():
    v100 = P.load_devices()["v100-sxm2-32gb"]
    with pytest.raises(InfeasibleConfig) as e:
        v100.check_precision("bf16")
    assert e.value.field == "precision"
    v100.check_precision("fp16")
    with pytest.raises(InfeasibleConfig) as e:
        v100.check_op("flash_attn")
    assert e.value.field == "attention_impl"
    P.load_devices()["h100-sxm5-80gb"].check_op("flash_attn")
    assert P.load_devices()["mi300x"].achievable_flops("fp16") == pytest.approx(668.4e12)
    assert P.load_devices()["l4"].achievable_flops("bf16") is None

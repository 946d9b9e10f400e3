"""predictor.checks.network_check: the saved network calibrations against the measured NCCL sweeps (what the
Accuracy page's Network tab shows). The real-data checks skip without ../shared/datasets."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictor.checks import network_check as NC
from predictor.hardware import network as N
from predictor.hardware import network_fit as C
from predictor.hardware.platforms import get_platform

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
MODELS = Path(__file__).resolve().parents[1] / "models_store"
needs_shared = pytest.mark.skipif(not (SHARED / "ml-engineering").exists(), reason="shared datasets absent")

# Median error of the saved calibrations over all their measured timings, as measured when this was written:
# dgx-a100-80gb 3.9 %, dgx-b200 6.8 %, dgx-h200 1.2 %, perlmutter-a100 7.1 %, vista-gh200 2.1 %.
PLATFORM_MEDIAN_APE_MAX = 0.10
# Worst group (collective x nodes x GPUs per node): vista-gh200 all-gather 2x1, 20.9 % median error.
GROUP_MEDIAN_APE_MAX = 0.25


@pytest.fixture(scope="module")
def check():
    return NC.network_check(SHARED, MODELS)


@needs_shared
def test_points_and_curves_cover_every_calibrated_platform(check):
    assert not check.empty and check.warnings == ()
    for pid in C.CALIBRATED_PLATFORMS:
        assert (check.points["platform"] == pid).sum() > 0, pid
        assert (check.curves["platform"] == pid).sum() > 0, pid
    assert set(check.platforms["platform"]) == set(C.CALIBRATED_PLATFORMS)
    # cpu-1t has a network.json but no sweeps: not listed
    assert "cpu-1t" not in set(check.points["platform"])
    # opens on the platform with the most measured timings
    counts = check.points.groupby("platform").size()
    assert check.platform_ids()[0] == counts.idxmax()
    # every group has a curve spanning its measured message sizes
    for (pid, g), pts in check.points.groupby(["platform", "group"]):
        cv = check.curves[(check.curves["platform"] == pid) & (check.curves["group"] == g)]
        assert len(cv) >= 2, (pid, g)
        assert cv["message_bytes"].min() <= pts["message_bytes"].min() * (1 + 1e-9)
        assert cv["message_bytes"].max() >= pts["message_bytes"].max() * (1 - 1e-9)
        assert (cv["predicted_s"] > 0).all() and (cv["busbw_predicted"] > 0).all()
    assert {"allreduce 4x8", "allreduce 1x8", "allreduce 1x8 nvls"} <= set(
        check.points.loc[check.points["platform"] == "dgx-b200", "group"])


@needs_shared
def test_curves_pass_near_the_measurements(check):
    for pid, err in check.points.groupby("platform")["ape"].median().items():
        assert err < PLATFORM_MEDIAN_APE_MAX, (pid, err)
    for (pid, g), pts in check.points.groupby(["platform", "group"]):
        cv = check.curves[(check.curves["platform"] == pid) & (check.curves["group"] == g)].sort_values(
            "message_bytes")
        on_curve = np.exp(np.interp(np.log(pts["message_bytes"]), np.log(cv["message_bytes"]),
                                    np.log(cv["predicted_s"])))
        # the line is the same model as the points' predictions (log-interpolated on the grid) ...
        assert np.max(np.abs(on_curve / pts["predicted_s"] - 1)) < 0.01, (pid, g)
        # ... and passes near the measured timings
        assert np.median(np.abs(on_curve / pts["duration_s"] - 1)) < GROUP_MEDIAN_APE_MAX, (pid, g)


@needs_shared
def test_uses_the_saved_network_json(check, tmp_path):
    """Predictions come from <models_dir>/<platform>/network.json through load_network_checked."""
    pid = "dgx-b200"
    plat = get_platform(pid)
    net, warn = N.load_network_checked(plat, MODELS)
    assert warn is None
    pts = check.points[check.points["platform"] == pid]
    t, _ = N.analytic_choice(net, "allreduce", pts["message_bytes"].to_numpy(float), pts["nodes"].to_numpy(float),
                             pts["gpus_per_node"].to_numpy(float))
    free = pts["algorithm"].isna().to_numpy()
    assert np.allclose(t[free], pts["predicted_s"].to_numpy(float)[free])
    # a models folder holding only a changed B200 calibration: only B200, with the changed predictions
    d = tmp_path / "models" / pid
    d.mkdir(parents=True)
    rec = json.loads((MODELS / pid / "network.json").read_text())
    rec["inter"]["bandwidth_gbps"] /= 2
    (d / "network.json").write_text(json.dumps(rec))
    other = NC.network_check(SHARED, tmp_path / "models")
    assert list(other.platforms["platform"]) == [pid]
    four = other.points[other.points["group"] == "allreduce 4x8"]
    before = pts[pts["group"] == "allreduce 4x8"]
    big = four["message_bytes"] >= 2**30
    assert (four.loc[big, "predicted_s"].to_numpy() > 1.5 * before.loc[big.to_numpy(), "predicted_s"].to_numpy()).all()
    # an unusable network.json is skipped with a warning naming the file, not raised
    (d / "network.json").write_text('{"intra": {"bandwidth_gbps": -1, "latency_us": 1}}')
    bad = NC.network_check(SHARED, tmp_path / "models")
    assert bad.empty and len(bad.warnings) == 1 and "network.json" in bad.warnings[0]


@needs_shared
def test_summary_per_dataset_and_collective(check):
    s = check.summary
    assert list(s.columns) == NC.SUMMARY_COLUMNS
    assert not s.duplicated(["platform", "dataset", "collective"]).any()
    assert s["rows"].sum() == len(check.points)
    raw = C.measured_sweeps(SHARED)
    for pid in C.CALIBRATED_PLATFORMS:
        assert s.loc[s["platform"] == pid, ["rows", "dropped"]].to_numpy().sum() == (raw["platform"] == pid).sum()
    b = s.set_index(["platform", "dataset"]).loc[("dgx-b200", "ml-eng B200 all_reduce_bench 4 nodes")]
    pts = check.points[check.points["dataset"] == "ml-eng B200 all_reduce_bench 4 nodes"]
    assert b["rows"] == 20 and b["median_ape"] == pytest.approx(pts["ape"].median())
    assert b["mean_signed"] == pytest.approx(((pts["predicted_s"] - pts["duration_s"]) / pts["duration_s"]).mean())
    assert (s["median_ape"] >= 0).all() and (s["mape"] >= 0).all()


@needs_shared
def test_b200_four_nodes_reach_the_node_nic_bandwidth(check):
    note = NC.fabric_note(check, get_platform("dgx-b200"))
    assert note is not None and "4 nodes × 8 GPUs" in note and "8 × 50 GB/s = 400 GB/s" in note
    four = check.points[(check.points["platform"] == "dgx-b200") & (check.points["group"] == "allreduce 4x8")]
    assert 0.85 * 400 < four["busbw_measured"].max() < 1.05 * 400
    assert NC.fabric_note(check, get_platform("dgx-h200")) is None  # one node only


def test_absent_datasets_give_empty_frames(tmp_path):
    for shared, models in ((tmp_path / "absent", MODELS), (tmp_path, MODELS)):
        chk = NC.network_check(shared, models)
        assert chk.empty and chk.shared == shared and chk.warnings == ()
        assert list(chk.points.columns) == NC.POINT_COLUMNS and chk.points.empty
        assert list(chk.curves.columns) == NC.CURVE_COLUMNS and chk.curves.empty
        assert list(chk.summary.columns) == NC.SUMMARY_COLUMNS and chk.summary.empty
        assert chk.platform_ids() == []


@needs_shared
def test_no_saved_calibration_gives_empty_frames(tmp_path):
    chk = NC.network_check(SHARED, tmp_path / "no-models")
    assert chk.empty and chk.platforms.empty


def test_on_a_small_sweep_folder(tmp_path):
    """Without ../shared: one ml-engineering file in a folder of its own, the B200 calibration saved."""
    d = tmp_path / "shared" / "ml-engineering"
    d.mkdir(parents=True)
    payloads = ["32KiB", "1MiB", "64MiB", "1GiB", "16GiB"]
    pd.DataFrame({"payload": payloads, "1 node": [1.2, 36.0, 400.0, 723.0, 845.0],
                  "4 nodes": [0.01, 5.4, 157.0, 362.0, 382.0]}).to_csv(d / "b200_allreduce_1node_vs_4nodes.csv",
                                                                       index=False)
    models = tmp_path / "models"
    shutil.copytree(MODELS / "dgx-b200", models / "dgx-b200")
    chk = NC.network_check(tmp_path / "shared", models)
    assert list(chk.platforms["platform"]) == ["dgx-b200"]
    assert sorted(chk.points["group"].unique()) == ["allreduce 1x8", "allreduce 4x8"] and len(chk.points) == 10
    assert len(chk.summary) == 2 and set(chk.summary["dropped"]) == {0}
    big = chk.points[chk.points["message_bytes"] == 16 * 2**30]
    assert np.allclose(big["busbw_measured"].sort_values(), [382.0, 845.0], rtol=0.01)
    assert (big["ape"] < 0.15).all()


def test_message_grid():
    g = NC.message_grid(2**15, 2**34)
    assert g[0] == pytest.approx(2**15) and g[-1] == pytest.approx(2**34)
    assert len(g) == int(np.ceil(np.log10(2**19) * NC.GRID_PER_DECADE)) + 1
    one = NC.message_grid(8 * 2**30, 8 * 2**30)  # one measured size: a short curve about it
    assert one[0] == pytest.approx(4 * 2**30) and one[-1] == pytest.approx(16 * 2**30)
    assert NC.group_label("allreduce", 4, 8) == "allreduce 4x8"
    assert NC.group_label("allreduce", 1, 8, "nvls") == "allreduce 1x8 nvls"

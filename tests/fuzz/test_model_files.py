"""Model files cut short or corrupted never reach LightGBM and never crash the process.

LightGBM's text parser trusts its input: `lgb.Booster(model_file=...)` on a model cut in half dies
with a segmentation fault. Every cut of a real model (every 1/50th of its length and the last few
bytes) must be refused by the integrity check, named with its file, with the platform's other
models still served; the same holds for sidecars without a hash (structural check only)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictor.hardware.platforms import get_platform
from predictor.paths import ArtifactError
from predictor.regress import regressors as R

PLATFORM = "perlmutter-a100"
STEM, OTHER = "mlp_up.fwd", "mlp_down.fwd"
SRC = R.MODELS_DIR / PLATFORM
ROW = pd.DataFrame([{"tp": 2, "batch": 2, "seq": 2048, "hidden": 4096, "heads": 32, "kv_heads": None,
                     "ffn_hidden": None, "vocab": None, "layers": 4, "params": None, "variant": None}])


def cut_points(n: int) -> list[int]:
    """Every 1/50th of the length, and the last bytes ('end of trees\\n' is 13 of them)."""
    return sorted({n * k // 50 for k in range(50)} | {n - k for k in (1, 2, 3, 5, 8, 13, 14, 20)})


def make_platform(root: Path, hashed: bool) -> Path:
    d = root / PLATFORM
    d.mkdir(parents=True)
    for stem in (STEM, OTHER):
        for ext in (".txt", ".json"):
            shutil.copy(SRC / f"{stem}{ext}", d / f"{stem}{ext}")
        if not hashed:  # as written by a version before the hash
            md = json.loads((d / f"{stem}.json").read_text())
            md.pop(R.MODEL_FILE_KEY)
            (d / f"{stem}.json").write_text(json.dumps(md, indent=1) + "\n")
    return d


@pytest.mark.parametrize("hashed", [True, False], ids=["hashed", "structural-only"])
def test_truncation_sweep_never_reaches_lightgbm(tmp_path, monkeypatch, hashed):
    d = make_platform(tmp_path, hashed)
    full = (d / f"{STEM}.txt").read_bytes()
    # control: the complete file verifies and predicts (a check that refused everything would pass the sweep)
    bank = R.ModelBank(PLATFORM, d)
    assert bank.problems == [] and bank.has_op("mlp_up", "fwd")
    assert bank.unhashed == ([] if hashed else [OTHER, STEM])
    assert np.isfinite(bank.predict_op("mlp_up", "fwd", ROW, get_platform(PLATFORM).device)).all()

    reached: list[int] = []

    def booster(*a, **k):  # LightGBM must never see a cut file
        reached.append(1)
        raise AssertionError("a cut model reached LightGBM")
    monkeypatch.setattr(R.lgb, "Booster", booster)
    cuts = cut_points(len(full))
    assert len(cuts) >= 55
    t0 = time.perf_counter()
    for n in cuts:
        (d / f"{STEM}.txt").write_bytes(full[:n])
        bank = R.ModelBank(PLATFORM, d)
        assert [p.stem for p in bank.problems] == [STEM], n
        assert f"{STEM}.txt" in bank.problems[0].reason and bank.degraded
        assert not bank.has_op("mlp_up", "fwd") and bank.has_op("mlp_down", "fwd")
        assert any(STEM in w for w in bank.warnings())
        with pytest.raises(ArtifactError) as e:
            R.OpRegressor.load(d, "mlp_up", "fwd")
        assert e.value.path.name == f"{STEM}.txt"
    elapsed = time.perf_counter() - t0
    assert reached == []
    print(f"{len(cuts)} cuts, {elapsed / len(cuts) * 1e3:.1f} ms per cut (bank + load)")


_CHILD = textwrap.dedent('''
    import json, random, shutil, sys
    from pathlib import Path
    from predictor.regress import regressors as R
    from predictor.paths import ArtifactError
    d = Path(sys.argv[1])
    txt = d / "mlp_up.fwd.txt"
    full = txt.read_bytes()
    refused = loaded = 0
    cuts = sorted({len(full) * k // 50 for k in range(50)} | {len(full) - k for k in (1, 2, 3, 5, 13)})
    rng = random.Random(0)
    mutants = []
    for _ in range(150):  # random byte edits: whatever passes the structural check must load without a crash
        b = bytearray(full)
        for _ in range(rng.choice([1, 2, 3])):
            j = rng.randrange(len(b))
            op = rng.random()
            if op < 0.4:
                b[j] = rng.choice(b"0123456789-.e \\n=Tz[]:")
            elif op < 0.7:
                del b[j]
            else:
                b.insert(j, rng.choice(b"0123456789-. \\n="))
        mutants.append(bytes(b))
    for data in [full[:n] for n in cuts] + mutants:
        txt.write_bytes(data)
        try:
            R.OpRegressor.load(d, "mlp_up", "fwd")   # real LightGBM, after the check
            loaded += 1
        except ArtifactError:
            refused += 1
        R.ModelBank("perlmutter-a100", d)
    print(json.dumps({"cuts": len(cuts), "refused": refused, "loaded": loaded}))
''')


def test_cut_and_mutated_models_do_not_crash_the_process(tmp_path):
    """With the real LightGBM in a child process (a segmentation fault there fails this test instead
    of killing pytest): every cut is refused, and random byte edits of a structure-only model either
    are refused or load."""
    d = make_platform(tmp_path, hashed=False)
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", _CHILD, str(d)], cwd=root, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, f"child died with {r.returncode}: {r.stderr[-2000:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["refused"] >= out["cuts"]  # every cut, plus the mutants the check caught
    assert out["refused"] + out["loaded"] == out["cuts"] + 150

"""predictor.regress.lgb_import: lightgbm without scikit-learn, pandas and (until needed) scipy, and still correct."""
from __future__ import annotations

import subprocess
import sys

import pytest

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def run_child(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_import_leaves_sklearn_pandas_and_scipy_unloaded_and_boosters_work():
    out = run_child(
        "import sys\n"
        "from predictor.regress.lgb_import import import_lightgbm\n"
        "lgb = import_lightgbm()\n"
        "print(sorted(m for m in ('sklearn', 'pandas', 'scipy', 'scipy.sparse') if m in sys.modules))\n"
        "import numpy as np\n"
        "X = np.random.default_rng(0).random((300, 3)); y = 3 * X[:, 0] + X[:, 1]\n"
        "b = lgb.train({'verbose': -1, 'num_leaves': 7}, lgb.Dataset(X, y), 20)\n"
        "dense = b.predict(X[:5])\n"
        "import scipy.sparse as sp\n"  # the real one, loaded after
        "print(getattr(sp, '_planner_stand_in', False))\n"
        "print(bool(np.allclose(b.predict(sp.csr_matrix(X[:5])), dense)),"
        " bool(np.allclose(b.predict(sp.csc_matrix(X[:5])), dense)))\n"
        "b2 = lgb.train({'verbose': -1, 'num_leaves': 7}, lgb.Dataset(sp.csr_matrix(X), y), 20)\n"
        "print(bool(np.allclose(b2.predict(X[:5]), dense)))\n"
        "from sklearn.model_selection import KFold\n"
        "print('sklearn', KFold.__name__)\n")
    lines = out.splitlines()
    assert lines[0] == "[]"          # nothing heavy imported by the predictor's lightgbm
    assert lines[1] == "False"       # a later `import scipy.sparse` is the real module
    assert lines[2] == "True True"   # sparse inputs still predicted as dense ones
    assert lines[3] == "True"        # and still trained on
    assert lines[4] == "sklearn KFold"


@pytest.mark.parametrize("case", ["scipy already loaded", "lightgbm needs more scipy at import"])
def test_plain_import_when_stand_ins_cannot_be_used(case):
    pre = ("import scipy.sparse\n" if case == "scipy already loaded"
           # the stand-in lacks what basic needs
           else "import predictor.regress.lgb_import as li\nli._SPARSE_CLASSES = ()\n")
    out = run_child(
        pre + "import sys\nfrom predictor.regress.lgb_import import import_lightgbm\nlgb = import_lightgbm()\n"
        "import lightgbm.basic as lb\n"
        "print(getattr(lb.scipy, '_planner_stand_in', False), 'scipy.sparse' in sys.modules)\n"
        "import numpy as np\n"
        "X = np.random.default_rng(1).random((100, 2))\n"
        "print(lgb.train({'verbose': -1}, lgb.Dataset(X, X[:, 0]), 3).predict(X[:2]).shape)\n")
    assert out.splitlines() == ["False True", "(2,)"]


def test_single_thread_predictor_gives_booster_predict_numbers():
    import numpy as np

    from predictor.regress.lgb_import import import_lightgbm, single_thread_predictor
    lgb = import_lightgbm()
    rng = np.random.default_rng(1)
    X = rng.random((400, 4))
    y = np.sin(4 * X[:, 0]) + X[:, 1] * X[:, 2]
    b = lgb.train({"verbose": -1, "num_leaves": 15}, lgb.Dataset(X, y), 60)
    b = lgb.Booster(model_str=b.model_to_string())   # as the predictor loads them: from verified text
    fast = single_thread_predictor(b)
    for rows in (X[:1], X[:7], rng.random((33, 4))):
        assert np.array_equal(fast(rows), b.predict(rows, num_threads=1))

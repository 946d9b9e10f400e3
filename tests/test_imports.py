"""The import graph: the layers of predictor/, no circles anywhere, the library never reaching into the UI, the
samplers or the tests. The contract lives in pyproject.toml ([tool.importlinter]) and is checked by import-linter
over every import, those inside functions included (only `if TYPE_CHECKING:` blocks, never executed, are left
out); .ci/run runs `lint-imports` too. Here it runs on the checkout, and on a copy with one lazy back-edge added,
to show that the contract sees imports inside functions. pages/ and app.py are scripts, not packages, so their
imports are read with `ast` here.
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("predictor", "predictor_ui", "bench", "tests")
MAX_MODULES_PER_FOLDER = 15

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter not installed (requirements.txt)")


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_the_import_contract_is_kept():
    r = _lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def _copy_tree(dst: Path) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:   # only the code: no data folders, no byte code
        data = {"samples"} if Path(folder) == ROOT / "bench" else set()
        return {n for n in names if n in data or n == "__pycache__" or n.endswith(".pyc")
                or (Path(folder, n).is_file() and not n.endswith(".py"))}

    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")


@pytest.mark.parametrize("module, probe, broken", [
    # the engine calling back into the facade above it, from inside a function
    ("predictor/step/engine.py", "from predictor.plan import predict", "layers, each importing only"),
    # a circle inside one package (specs imports bounds at module level)
    ("predictor/model/bounds.py", "from predictor.model import specs", "no import circles"),
    # a circle inside bench (cli imports launch)
    ("bench/launch.py", "from bench import cli", "no import circles"),
])
def test_a_lazy_back_edge_breaks_the_contract(tmp_path, module, probe, broken):
    _copy_tree(tmp_path)
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n\ndef _probe():\n    {probe}\n    return None\n")
    r = _lint_imports(tmp_path)
    assert r.returncode != 0, r.stdout
    assert "Broken contracts" in r.stdout, r.stdout + r.stderr
    assert broken in r.stdout.split("Broken contracts", 1)[1], r.stdout


def test_no_folder_holds_more_than_15_modules():
    crowded = {}
    for pkg in ("predictor", "predictor_ui", "bench"):
        for d in [ROOT / pkg, *[p for p in (ROOT / pkg).rglob("*") if p.is_dir()]]:
            mods = [p for p in d.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
            if len(mods) > MAX_MODULES_PER_FOLDER:
                crowded[str(d.relative_to(ROOT))] = len(mods)
    assert not crowded, f"folders of more than {MAX_MODULES_PER_FOLDER} modules: {crowded}"


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom) and not n.level:
            out.add(n.module or "")
    return out


@pytest.mark.parametrize("script", ["app.py", *sorted(p.name for p in (ROOT / "pages").glob("*.py"))])
def test_the_pages_never_import_the_tests_or_the_samplers(script):
    path = ROOT / script if script == "app.py" else ROOT / "pages" / script
    bad = sorted(t for t in _imports(path) if t.split(".")[0] in ("tests", "bench"))
    assert not bad, f"{script} imports {bad}"

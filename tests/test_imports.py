"""The import graph: no circles inside predictor/, and the library never reaches into the UI or the tests.

Read with `ast` (nothing is imported): module-level imports count, including those under `try`/`if`,
except `if TYPE_CHECKING:` blocks; imports inside functions (the lazy ones that keep start-up fast) do
not make a circle at import time and are left out of the graph, but are included in the "never imports"
checks.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """Absolute names a `from ... import ...` refers to (the module, and each name as a submodule)."""
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target] + [f"{target}.{a.name}" for a in node.names]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, *, module_level_only: bool) -> set[str]:
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    out: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for n in nodes:
            if isinstance(n, ast.Import):
                out.update(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                out.update(_resolve(module, is_package, n))
            elif isinstance(n, ast.If):
                if not _is_type_checking(n.test):
                    visit(n.body)
                visit(n.orelse)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not module_level_only:
                    visit(n.body)
            else:  # try / with / for / while at module level
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(n, field, []))
                for h in getattr(n, "handlers", []):
                    visit(h.body)

    if module_level_only:
        visit(ast.parse(path.read_text()).body)
    else:
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Import):
                out.update(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                out.update(_resolve(module, is_package, n))
    return out


def _files(package: str) -> list[Path]:
    """The .py files of a package folder, or the one file `package` names (e.g. app.py)."""
    path = ROOT / package
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def _graph(package: str) -> dict[str, set[str]]:
    files = {_module_name(p): p for p in _files(package)}
    # a package's __init__ runs before any of its submodules anyway: an edge to an enclosing package is no circle
    return {m: {t for t in _imports(p, module_level_only=True) if t in files and t != m and not m.startswith(t + ".")}
            for m, p in files.items()}


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm; components with more than one module (a module importing itself is not kept)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_cycles():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _strongly_connected(g) == [["a", "b", "c"]]
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


def test_predictor_import_graph_has_no_cycles():
    cycles = _strongly_connected(_graph("predictor"))
    assert not cycles, f"import circles in predictor/ (module-level imports): {cycles}"


@pytest.mark.parametrize("package, banned", [
    ("predictor", ("streamlit", "altair", "predictor_ui", "pages", "app", "tests")),
    ("predictor_ui", ("tests", "pages", "app")),
    ("pages", ("tests",)),
    ("app.py", ("tests",)),
])
def test_library_never_imports_the_ui_or_the_tests(package, banned):
    bad = {}
    for p in _files(package):
        hits = sorted(t for t in _imports(p, module_level_only=False)
                      if any(t == b or t.startswith(b + ".") for b in banned))
        if hits:
            bad[str(p.relative_to(ROOT))] = hits
    assert _files(package), f"nothing to check under {package}"
    assert not bad, f"{package} imports what it must not: {bad}"

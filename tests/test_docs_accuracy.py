"""The documentation's figures match the saved benchmark outputs they quote, and the README stays a front door.

docs/accuracy.md (and the README's accuracy summary) mark each figure block with a comment naming the saved
output(s) of its benchmark, `<!-- benchmark: NAME [NAME ...] -->`, where docs/benchmarks/NAME.txt holds the output
and, on its first line, the command that produced it. The block right after the comment is either

- a fenced code block: every line but `...` must be a line of the saved output, or its beginning up to a space
  (runs of spaces collapsed: a long line may be cut short, never changed), or
- a Markdown table: the numbers of every body cell but the first (the label) must occur together on one line of
  the saved output(s) (a figure and its signed error, say).

The benchmarks are not rerun here (minutes); docs/accuracy.md says how to refresh the saved outputs.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SAVED = DOCS / "benchmarks"
README = ROOT / "README.md"
ACCURACY = DOCS / "accuracy.md"
MAX_README_LINES = 250

MARKER = re.compile(r"<!--\s*benchmark:\s*([\w\s-]+?)\s*-->")
# a number not glued to a word (H100, fp8, 2x1 stay out), optional sign, thousands separators, decimals
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:,\d{3})*(?:\.\d+)?")


def _norm(line: str) -> str:
    return " ".join(line.split())


def _numbers(text: str) -> set[str]:
    found: set[str] = set()
    for m in NUMBER.finditer(text):
        tok = m.group(0).replace(",", "")
        found.add(tok)
        found.add(tok.lstrip("+-"))  # an unsigned quote of a signed figure
    return found


def figure_blocks(text: str) -> list[tuple[int, list[str], str, list[str]]]:
    """(line number of the marker, benchmark names, 'code' | 'table', the block's lines) for every marker."""
    lines = text.splitlines()
    blocks = []
    for i, line in enumerate(lines):
        m = MARKER.search(line)
        if not m:
            continue
        names = m.group(1).split()
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j < len(lines) and lines[j].lstrip().startswith("```"):
            k = j + 1
            while k < len(lines) and not lines[k].lstrip().startswith("```"):
                k += 1
            blocks.append((i + 1, names, "code", lines[j + 1:k]))
        elif j < len(lines) and lines[j].lstrip().startswith("|"):
            k = j
            while k < len(lines) and lines[k].lstrip().startswith("|"):
                k += 1
            blocks.append((i + 1, names, "table", lines[j:k]))
        else:
            blocks.append((i + 1, names, "missing", []))
    return blocks


def _table_cells(rows: list[str]) -> list[list[str]]:
    body = []
    for n, row in enumerate(rows):
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]  # an escaped \| stays in its cell
        if n == 0 or all(re.fullmatch(r":?-{3,}:?", c) for c in cells if c):
            continue  # header and separator rows
        body.append(cells)
    return body


def check_figures(text: str, saved_dir: Path = SAVED, doc: str = "doc") -> list[str]:
    """Every mismatch between the figure blocks of `text` and the saved outputs they name (empty: all match)."""
    problems = []
    for at, names, kind, block in figure_blocks(text):
        outputs = []
        for name in names:
            path = saved_dir / f"{name}.txt"
            if not path.is_file():
                problems.append(f"{doc}:{at}: no saved output {name}.txt in {saved_dir}")
                continue
            outputs.append(path.read_text())
        if not outputs:
            continue
        label = f"{doc}:{at} ({' '.join(names)})"
        if kind == "missing":
            problems.append(f"{label}: the marker is not followed by a code block or a table")
        elif kind == "code":
            saved_lines = [_norm(line) for out in outputs for line in out.splitlines()]
            quoted = [_norm(line) for line in block if line.strip() and line.strip() != "..."]
            if not quoted:
                problems.append(f"{label}: empty figure block")
            for line in quoted:
                if not any(s == line or s.startswith(line + " ") for s in saved_lines):
                    problems.append(f"{label}: not in the saved output: {line!r}")
        else:
            line_pools = [_numbers(line) for out in outputs for line in out.splitlines()]
            body = _table_cells(block)
            if not body:
                problems.append(f"{label}: table without body rows")
            for cells in body:
                for cell in cells[1:]:
                    wanted = [m.group(0).replace(",", "") for m in NUMBER.finditer(cell)]
                    if wanted and not any(all(w in pool for w in wanted) for pool in line_pools):
                        problems.append(f"{label}: {cell!r} (row {cells[0]!r}): its numbers are not on one line of "
                                        "the saved output")
    return problems


# --------------------------------------------------------------------------- the documents as committed
def test_accuracy_page_has_figure_blocks():
    blocks = figure_blocks(ACCURACY.read_text())
    assert len(blocks) >= 15, "docs/accuracy.md lost its benchmark-marked figure blocks"
    named = {n for _, names, _, _ in blocks for n in names}
    assert {"end_to_end", "independent_h100", "independent_nemo", "memory_published"} <= named


def test_accuracy_page_matches_saved_outputs():
    assert check_figures(ACCURACY.read_text(), doc="docs/accuracy.md") == []


def test_readme_summary_matches_saved_outputs():
    text = README.read_text()
    assert figure_blocks(text), "the README's accuracy summary is not marked with its benchmarks"
    assert check_figures(text, doc="README.md") == []


def test_saved_outputs_name_their_command():
    modules = {p.stem for p in (ROOT / "tests" / "benchmarks").glob("*.py")} - {"__init__"}
    files = sorted(SAVED.glob("*.txt"))
    assert files
    for path in files:
        first = path.read_text().splitlines()[0]
        m = re.match(r"\$ python -m tests\.benchmarks\.(\w+)", first)
        assert m, f"{path.name}: first line must be the command, '$ python -m tests.benchmarks.NAME ...'"
        assert m.group(1) in modules, f"{path.name}: {m.group(1)} is not a benchmark in tests/benchmarks/"
        assert "Traceback (most recent call last)" not in path.read_text(), f"{path.name}: the run failed"


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; move detail into docs/ (limit {MAX_README_LINES})"


def test_readme_keeps_the_setup_and_test_commands_first():
    text = README.read_text()
    first_block = text.split("```", 2)[1].splitlines()[1:3]
    assert first_block[0].startswith("bash scripts/setup.sh && .venv/bin/streamlit run app.py")
    assert first_block[1].startswith(".venv/bin/python -m pytest -q")


def _doc_links(path: Path) -> list[str]:
    text = path.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'src="([^"]+)"', text)
    return [link for link in links if not re.match(r"[a-z]+:", link)]


@pytest.mark.parametrize("doc", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    broken = []
    for link in _doc_links(doc):
        target = link.split("#", 1)[0]
        if target and not (doc.parent / target).exists():
            broken.append(link)
    assert broken == [], f"{doc.name}: links to missing files: {broken}"


def test_readme_links_into_docs():
    links = [link for link in _doc_links(README) if link.startswith("docs/")]
    assert any(link.startswith("docs/accuracy.md") for link in links)
    assert any(link.startswith("docs/architecture.md") for link in links)
    for link in links:
        assert (ROOT / link.split("#", 1)[0]).is_file(), link


# --------------------------------------------------------------------------- the checker can fail
def test_a_tampered_figure_is_detected():
    text = ACCURACY.read_text()
    line = "all runs    52 10.6%      12.3%     25.8%      -10.6%         38.3%         43.2%            0     13"
    assert line in text
    before = check_figures(text)
    after = check_figures(text.replace(line, line.replace("10.6%      12.3%", "9.8%      12.3%")))
    new = [p for p in after if p not in before]
    assert len(new) == 1 and "9.8%" in new[0]


def test_a_tampered_table_cell_is_detected(tmp_path):
    (tmp_path / "bench_x.txt").write_text("$ python -m tests.benchmarks.bench_x\nMAPE 8.8% (mean signed -1.3%)\n")
    table = "<!-- benchmark: bench_x -->\n| what | ours |\n| --- | ---: |\n| vTrain 1,440 runs | {} |\n"
    assert check_figures(table.format("8.8 % (-1.3 %)"), tmp_path) == []
    assert check_figures(table.format("8.8 % (+1.3 %)"), tmp_path)  # the sign matters
    assert check_figures(table.format("7.9 % (-1.3 %)"), tmp_path)
    assert check_figures(table.format("1.3 %"), tmp_path) == []  # an unsigned quote of a signed figure
    (tmp_path / "bench_x.txt").write_text("$ python -m tests.benchmarks.bench_x\nMAPE 8.8%\nsigned -1.4%\n"
                                          "MAPE 9.0% (mean signed -1.3%)\n")
    assert check_figures(table.format("8.8 % (-1.3 %)"), tmp_path)  # both numbers exist, not on one line


def test_a_marker_without_output_or_block_is_reported(tmp_path):
    assert check_figures("<!-- benchmark: nowhere -->\n```text\nx\n```\n", tmp_path)
    (tmp_path / "y.txt").write_text("$ python -m tests.benchmarks.y\nx\n")
    assert check_figures("<!-- benchmark: y -->\n\nsome prose\n", tmp_path)
    assert check_figures("<!-- benchmark: y -->\n```text\nx\n...\n```\n", tmp_path) == []
    assert check_figures("<!-- benchmark: y -->\n```text\nx\nz\n```\n", tmp_path)
    (tmp_path / "w.txt").write_text("$ python -m tests.benchmarks.w\nMAPE 10.8% over 52 runs\n")
    assert check_figures("<!-- benchmark: w -->\n```text\nMAPE 10.8%\n```\n", tmp_path) == []  # cut short
    assert check_figures("<!-- benchmark: w -->\n```text\nMAPE 10.8% over 5\n```\n", tmp_path)  # not a token
    assert check_figures("<!-- benchmark: w -->\n```text\nMAPE 0.8%\n```\n", tmp_path)

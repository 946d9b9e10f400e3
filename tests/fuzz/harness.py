"""Shared pieces of the fuzz corpus: run the CLI in-process and classify the outcome.

Outcome classes (every case asserts one):
  ERROR(field)  exit 2, stderr opens with `error: <field>` (or argparse's `argument --<flag>`), no traceback
  OK            exit 0 and, for a prediction, a finite positive step time
  ROW(field)    predict-batch goes on (exit 0) and the row's `error` opens with `<field>:`
"""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from predictor.cli.main import main
from predictor.model.layout_io import BATCH_COLUMNS
from tests.batch_rows import batch_row

SMALL = ["--arch", "llama", "--layers", "4", "--hidden", "1024", "--heads", "16"]
GOOD_ROW = {"case_id": "good", "platform": "dgx-a100-80gb", "arch": "llama", "layers": "4", "hidden": "2048",
            "heads": "16", "seq_len": "2048", "num_gpus": "8", "tp": "2", "micro_batch": "1", "global_batch": "16"}


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `python -m predictor argv`, in this process."""
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse: bad flag values exit 2 with a usage line
        rc = e.code if isinstance(e.code, int) else 2
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def assert_error(rc: int, err: str, field: str) -> None:
    assert "Traceback" not in err, err
    assert rc == 2, (rc, err)
    first = err.strip().splitlines()[-1] if "usage:" in err else err.strip().splitlines()[0]
    named = first.startswith(f"error: {field}") or f"argument --{field.replace('_', '-')}" in first
    assert named, f"expected the field {field!r} named first, got: {err}"


def assert_prediction(rc: int, out: str, err: str) -> dict:
    assert "Traceback" not in err and rc == 0, (rc, err)
    d = json.loads(out)
    assert math.isfinite(d["step_time_s"]) and d["step_time_s"] > 0
    assert math.isfinite(d["memory_gib"]) and d["memory_gib"] > 0
    assert all(v is None or (math.isfinite(v) and v >= -1e-12) for v in d["breakdown_s"].values())
    return d


def row(**kw) -> dict[str, str]:
    return batch_row(GOOD_ROW, **kw)


def write_rows(path: Path, rows: list[dict[str, str]], header: list[str] | None = None) -> Path:
    header = header or list(BATCH_COLUMNS)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")  # quotes cells holding a CR
    w.writerow(header)
    for r in rows:
        w.writerow([r.get(c, "") for c in header])
    path.write_bytes(buf.getvalue().encode("utf-8"))
    return path


def read_output(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def batch(tmp_path: Path, capsys, rows: list[dict[str, str]], *extra: str,
          header: list[str] | None = None) -> tuple[int, list[dict[str, str]], str]:
    src = write_rows(tmp_path / "in.csv", rows, header)
    rc, _, err = run(["predict-batch", "--input", str(src), "--output", str(tmp_path / "out.csv"), "--quiet", *extra],
                     capsys)
    assert "Traceback" not in err
    return rc, (read_output(tmp_path / "out.csv") if rc == 0 else []), err


@pytest.fixture
def cli(capsys):
    return lambda argv: run(argv, capsys)

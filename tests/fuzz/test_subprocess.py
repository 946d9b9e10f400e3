"""A few corpus cases as real processes: the exit status and stderr the shell sees (no segfault, no
traceback), and a real Ctrl-C (SIGINT) in the middle of a predict-batch."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import row, write_rows

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(  # noqa: PLW1510  (the return code is what the tests check)
        [sys.executable, "-m", "predictor", *args], cwd=REPO, capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.parametrize("args,field", [
    (["predict", "--platform", "dgx-h100", "--arch", "gpt", "--hidden", str(2 ** 40), "--layers", "2", "--heads", "16"],
     "hidden"),
    (["predict", "--platform", "dgx-h100", "--model", "llama3-405b", "--num-gpus", "8", "--tp", "8"], "memory"),
    (["predict", "--platform", "cpu-2t", "--arch", "gpt", "--layers", "2", "--hidden", "256", "--heads", "4",
      "--num-gpus", "16", "--global-batch", "16"], "num_gpus"),
    (["search", "--model", "llama3-70b", "--platform", "dgx-h100", "--num-gpus", "500", "--global-batch", "1024",
      "--seq-len", "4096"], "num_gpus"),
])
def test_exit_status_and_one_clear_line(args, field):
    p = cli(*args)
    assert p.returncode == 2 and p.stderr.startswith(f"error: {field}:") and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_predict_batch_empty_file_as_a_process(tmp_path):
    (tmp_path / "e.csv").write_bytes(b"")
    p = cli("predict-batch", "--input", str(tmp_path / "e.csv"), "--output", str(tmp_path / "o.csv"))
    assert p.returncode == 2 and p.stderr.startswith("error: input:") and "Traceback" not in p.stderr


def test_ctrl_c_during_predict_batch(tmp_path):
    src = write_rows(tmp_path / "in.csv", [row(case_id=str(i), seq_len=str(512 * (1 + i % 8))) for i in range(40000)])
    out = tmp_path / "out.csv"
    # the child must not inherit Ctrl-C ignored: a test run started as a background job of a non-interactive shell
    # has SIGINT ignored (bash does that for `cmd &`), and a Python started so never raises KeyboardInterrupt; a
    # handled (not ignored) signal is reset to its default in the child at exec
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "predictor", "predict-batch", "--input", str(src), "--output",
                                 str(out), "--chunk-rows", "500"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # '  500 rows done': inside the prediction loop
        assert "rows done" in first, first
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in rest.strip().splitlines() if "rows done" not in ln]
    assert rc == 130 and "Traceback" not in rest
    assert lines == [f"interrupted; {out} was not written"], rest
    assert not out.exists() and not list(tmp_path.glob(".out.csv*"))

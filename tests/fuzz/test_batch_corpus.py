"""predict-batch corpus: whole-file problems (exit 2, nothing written, checked before computing) and
row problems (the row's `error` names the field, the other rows are predicted), memory, formula
escaping."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from predictor.model.layout_io import BATCH_COLUMNS, MOE_ECHO_COLUMNS

from .harness import assert_error, batch, read_output, row, run, write_rows

HEADER = ",".join(BATCH_COLUMNS)
GOOD_LINE = "good,dgx-a100-80gb,llama,4,2048,16,,,,2048,8,2,,,1,16,,,,,,"


def _batch_files(tmp_path: Path, capsys, data: bytes, out: str = "out.csv") -> tuple[int, str, Path]:
    src = tmp_path / "in.csv"
    src.write_bytes(data)
    dst = tmp_path / out
    rc, _, err = run(["predict-batch", "--input", str(src), "--output", str(dst), "--quiet"], capsys)
    return rc, err, dst


# ---- whole-file problems ------------------------------------------------------------------------
WHOLE_FILE = {
    "empty": b"",
    "blank-lines": b"\n\n\r\n",
    "bom-only": b"\xef\xbb\xbf",
    "header-only": (HEADER + "\n").encode(),
    "header-only-crlf-bom": b"\xef\xbb\xbf" + (HEADER + "\r\n").encode(),
    "header-and-blank-lines": (HEADER + "\n\n\n").encode(),
    "latin-1": (HEADER + "\ncaf\xe9,dgx-a100-80gb,llama,4,2048,16,,,,2048,8,2,,,1,16,,,,,,\n").encode("latin-1"),
    "utf-16": (HEADER + "\n" + GOOD_LINE + "\n").encode("utf-16"),
    "binary": bytes(range(256)) * 4,
    "xlsx-zip": b"PK\x03\x04\x14\x00\x06\x00\x08\x00\x00\x00!\x00\xb5U0#\xf4\x00\x00\x00L\x02\x00\x00",
    "nul-byte": (HEADER + "\n" + GOOD_LINE.replace("good", "go\x00od") + "\n").encode(),
    "missing-columns": b"case_id,platform\n1,dgx-a100-80gb\n",
    "unknown-column": (HEADER + ",colour\n" + GOOD_LINE + ",red\n").encode(),
    "repeated-column": (HEADER + ",tp\n" + GOOD_LINE + ",2\n").encode(),
    "semicolons": (HEADER.replace(",", ";") + "\n" + GOOD_LINE.replace(",", ";") + "\n").encode(),
    "unterminated-quote": (HEADER + '\n"good,dgx-a100-80gb,llama,4,2048,16,,,,2048,8,2,,,1,16,,,,,,\n').encode(),
    "json": b'{"case_id": 1, "platform": "dgx-a100-80gb"}',
    "non-utf8-late": (HEADER + "\n" + (GOOD_LINE + "\n") * 50).encode() + b"\xff\xfe\n",
}


@pytest.mark.parametrize("name", sorted(WHOLE_FILE))
def test_whole_file_problems_exit_2_and_write_nothing(tmp_path, capsys, name):
    rc, err, dst = _batch_files(tmp_path, capsys, WHOLE_FILE[name])
    assert_error(rc, err, "input")
    assert not dst.exists() and not list(tmp_path.glob(".out.csv*"))  # nothing half-written


@pytest.mark.parametrize("name,words", [("empty", "is empty"), ("header-only", "header but no rows"),
                                        ("latin-1", "not UTF-8"), ("binary", "not UTF-8"),
                                        ("missing-columns", "lacks columns"), ("repeated-column", "repeats"),
                                        ("unknown-column", "does not know"), ("nul-byte", "line 2")])
def test_whole_file_messages_say_what_is_wrong(tmp_path, capsys, name, words):
    rc, err, _ = _batch_files(tmp_path, capsys, WHOLE_FILE[name])
    assert rc == 2 and words in err and "Fix:" in err


def _good_input(tmp_path: Path) -> Path:
    return write_rows(tmp_path / "in.csv", [row()])


@pytest.mark.parametrize("case", ["input-dir", "output-dir", "no-out-folder", "out-is-in", "input-missing",
                                  "out-parent-is-file", "out-folder-not-writable"])
def test_paths_checked_before_computing(tmp_path, capsys, monkeypatch, case):
    src = _good_input(tmp_path)
    out = tmp_path / "out.csv"
    field = "output"
    if case == "input-dir":
        src, field = tmp_path, "input"
    elif case == "input-missing":
        src, field = tmp_path / "nope.csv", "input"
    elif case == "output-dir":
        out = tmp_path
    elif case == "no-out-folder":
        out = tmp_path / "missing" / "out.csv"
    elif case == "out-is-in":
        out = src
    elif case == "out-parent-is-file":
        out = src / "out.csv"
    elif case == "out-folder-not-writable":
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, m, *a, **k: False if Path(p) == tmp_path else real(p, m))
    computed = []
    import predictor.plan.batch as B
    real_predict = B.predict_records
    monkeypatch.setattr(B, "predict_records", lambda *a, **k: computed.append(1) or real_predict(*a, **k))
    rc, _, err = run(["predict-batch", "--input", str(src), "--output", str(out), "--quiet"], capsys)
    assert_error(rc, err, field)
    assert computed == []  # refused before any row was predicted
    if case == "out-is-in":
        assert src.read_text().startswith("case_id")  # the input is untouched


# ---- rows with a problem: rejected by name, the batch goes on -----------------------------------
ROW_CASES = [
    ({"tp": "inf"}, "tp"), ({"tp": "nan"}, "tp"), ({"tp": "1e309"}, "tp"), ({"tp": "-1"}, "tp"), ({"tp": "0"}, "tp"),
    ({"tp": "1.5"}, "tp"), ({"tp": "two"}, "tp"), ({"num_gpus": "-inf"}, "num_gpus"),
    ({"hidden": str(2 ** 40)}, "hidden"), ({"layers": str(2 ** 63)}, "layers"), ({"seq_len": "1e9"}, "seq_len"),
    ({"vocab": "1e12"}, "vocab"), ({"num_gpus": str(2 ** 21), "tp": "1"}, "num_gpus"),
    ({"micro_batch": str(2 ** 17)}, "micro_batch"), ({"global_batch": str(2 ** 25)}, "global_batch"),
    ({"heads": str(2 ** 15), "hidden": str(2 ** 15)}, "heads"), ({"ffn_hidden": str(2 ** 20)}, "ffn_hidden"),
    ({"kv_heads": str(2 ** 15)}, "kv_heads"), ({"platform": ""}, "platform"),
    ({"platform": "../../etc/evil"}, "platform"),
    ({"platform": "nowhere"}, "platform"), ({"platform": "cpu-2t", "precision": "fp32"}, "num_gpus"),
    ({"platform": "cpu-1t", "precision": "fp32"}, "num_gpus"), ({"schedule": "zigzag"}, "schedule"),
    ({"recompute": "half"}, "recompute"), ({"precision": "fp8"}, "precision"), ({"zero_stage": "4"}, "zero_stage"),
    ({"sequence_parallel": "maybe"}, "sequence_parallel"), ({"arch": "mamba"}, "arch"), ({"heads": "3"}, "hidden"),
    ({"kv_heads": "5"}, "kv_heads"), ({"tp": "3"}, "num_gpus"), ({"global_batch": "3"}, "global_batch"),
    ({"layers": ""}, "layers"), ({"arch": "", "platform": "dgx-a100-80gb"}, "model"),
    ({"vpp": "2", "schedule": "1f1b"}, "vpp"), ({"pp": "8", "num_gpus": "16"}, "pp"),
    ({"platform": "dgx-h100", "arch": "llama", "layers": "126", "hidden": "16384", "heads": "128", "kv_heads": "8",
      "ffn_hidden": "53248", "vocab": "128256", "num_gpus": "8", "tp": "8", "global_batch": "8"}, "memory"),
]


@pytest.mark.parametrize("cells,field", ROW_CASES, ids=[f"{f}-{i}" for i, (_, f) in enumerate(ROW_CASES)])
def test_a_bad_row_is_rejected_and_the_batch_goes_on(tmp_path, capsys, cells, field):
    rows = [row(case_id="before"), row(case_id="bad", **cells), row(case_id="after")]
    rc, out, err = batch(tmp_path, capsys, rows)
    assert rc == 0, err
    by = {r["case_id"]: r for r in out}
    assert len(out) == 3
    assert by["bad"]["error"].startswith(f"{field}:"), by["bad"]["error"]
    assert by["bad"]["step_time_s"] == ""  # never a number beside an error
    for ok in ("before", "after"):
        step = float(by[ok]["step_time_s"])
        assert by[ok]["error"] == "" and math.isfinite(step) and step > 0


# Mixture of Experts: the base row is a dense llama on 8 GPUs, tp 2 (dp 4: tp*cp*dp = 8)
MOE = {"num_experts": "8", "top_k": "2", "sequence_parallel": "true"}
MOE_ROW_CASES = [
    ({"num_experts": "8"}, "top_k"), ({**MOE, "top_k": "9"}, "top_k"), ({"top_k": "2"}, "top_k"),
    ({"capacity_factor": "1.0"}, "capacity_factor"), ({"shared_experts": "1"}, "shared_experts"),
    ({"ep": "2"}, "ep"), ({**MOE, "ep": "3"}, "ep"), ({**MOE, "num_experts": "16", "ep": "16"}, "ep"),
    ({**MOE, "ep": "0"}, "ep"), ({**MOE, "ep": "-2"}, "ep"), ({**MOE, "ep": "1.5"}, "ep"), ({**MOE, "ep": "inf"}, "ep"),
    ({**MOE, "ep": str(2 ** 21)}, "ep"), ({**MOE, "sequence_parallel": "false"}, "sequence_parallel"),
    ({**MOE, "capacity_factor": "nan"}, "capacity_factor"), ({**MOE, "capacity_factor": "1e999"}, "capacity_factor"),
    ({**MOE, "capacity_factor": "5"}, "capacity_factor"), ({**MOE, "moe_imbalance": "0.9"}, "moe_imbalance"),
    ({**MOE, "num_experts": "1e9"}, "num_experts"), ({**MOE, "num_experts": "two"}, "num_experts"),
    ({**MOE, "num_experts": "1"}, "num_experts"), ({**MOE, "top_k": "0"}, "top_k"),
    ({**MOE, "moe_ffn_hidden": str(2 ** 20)}, "moe_ffn_hidden"), ({**MOE, "dense_layers": "4"}, "dense_layers"),
    ({"model": "deepseek-v3.2", "arch": ""}, "model"),   # refused by name: its sparse attention is not modelled
]
MOE_HEADER = [*BATCH_COLUMNS, "model", *MOE_ECHO_COLUMNS]


@pytest.mark.parametrize("cells,field", MOE_ROW_CASES, ids=[f"{f}-{i}" for i, (_, f) in enumerate(MOE_ROW_CASES)])
def test_a_bad_moe_row_is_rejected_and_the_batch_goes_on(tmp_path, capsys, cells, field):
    rows = [row(case_id="before", **MOE, ep="4"), row(case_id="bad", **cells), row(case_id="after")]
    rc, out, err = batch(tmp_path, capsys, rows, header=MOE_HEADER)
    assert rc == 0, err
    by = {r["case_id"]: r for r in out}
    assert by["bad"]["error"].startswith(f"{field}:"), by["bad"]["error"]
    assert by["bad"]["step_time_s"] == ""
    for ok in ("before", "after"):
        assert by[ok]["error"] == "" and float(by[ok]["step_time_s"]) > 0, by[ok]["error"]
    assert (by["before"]["ep"], by["after"]["ep"], by["after"]["num_experts"]) == ("4", "1", "0")


@pytest.mark.parametrize("extra", [1, 2, 5, -1, -3, -21])
def test_a_row_with_another_cell_count_is_rejected_by_line(tmp_path, capsys, extra):
    good = GOOD_LINE
    cells = good.replace("good", "bad").split(",")
    cells = cells + ["x"] * extra if extra > 0 else cells[:extra]
    text = f"{HEADER}\n{good}\n{','.join(cells)}\n{good.replace('good', 'after')}\n"
    rc, err, dst = _batch_files(tmp_path, capsys, text.encode())
    assert rc == 0, err
    out = read_output(dst)
    assert [r["case_id"] for r in out] == ["good", "bad", "after"]
    bad = out[1]
    assert "line 3" in bad["error"] and f"{len(cells)} cells" in bad["error"] and bad["step_time_s"] == ""
    assert all(bad[c] == "" for c in BATCH_COLUMNS if c != "case_id")  # nothing shifted into the wrong column
    assert out[2]["error"] == "" and float(out[2]["step_time_s"]) > 0


def test_quoted_commas_and_crlf_are_read_as_one_cell(tmp_path, capsys):
    text = f'{HEADER}\r\n"a,b",dgx-a100-80gb,llama,4,2048,16,,,,2048,8,2,,,1,16,,,,,,\r\n'
    rc, err, dst = _batch_files(tmp_path, capsys, b"\xef\xbb\xbf" + text.encode())
    assert rc == 0, err
    (r,) = read_output(dst)
    assert r["case_id"] == "a,b" and r["error"] == ""


# ---- memory -------------------------------------------------------------------------------------
BIG = dict(platform="dgx-h100", layers="126", hidden="16384", heads="128", kv_heads="8", ffn_hidden="53248",
           vocab="128256", num_gpus="8", tp="8", global_batch="8")


@pytest.mark.parametrize("allow", [False, True])
def test_rows_that_do_not_fit(tmp_path, capsys, allow):
    rc, out, err = batch(tmp_path, capsys, [row(case_id="small"), row(case_id="big", **BIG)],
                         *(["--allow-oom"] if allow else []))
    assert rc == 0 and "do not fit" in err
    small, big = out
    assert small["fits"] == "True" and small["error"] == "" and float(small["memory_gib"]) > 0
    assert big["fits"] == "False" and float(big["memory_gib"]) > 80
    if allow:
        assert big["error"] == "" and float(big["step_time_s"]) > 0 and big["warnings"].startswith("DOES NOT FIT")
    else:
        assert big["step_time_s"] == "" and big["mfu"] == "" and big["error"].startswith("memory:")
        assert "GiB" in big["error"] and "--allow-oom" in big["error"]


# ---- spreadsheet injection ----------------------------------------------------------------------
@pytest.mark.parametrize("cell", ["=cmd|' /C calc'!A0", '=HYPERLINK("http://x","y")', "+1+2", "-2+3", "@SUM(A1)",
                                  "\t=1", "\r=1", "=1", "-", "+", "@"])
def test_formula_cells_are_escaped(tmp_path, capsys, cell):
    rc, out, _err = batch(tmp_path, capsys, [row(case_id=cell), row(case_id="x", platform=cell)])
    assert rc == 0
    assert out[0]["case_id"] == "'" + cell
    assert out[1]["platform"] == "'" + cell and out[1]["error"].startswith("platform:")
    assert not any(v.startswith(("=", "+", "-", "@", "\t", "\r")) and not _number(v) for r in out for v in r.values())


def _number(v: str) -> bool:
    try:
        return math.isfinite(float(v))
    except ValueError:
        return False


@pytest.mark.parametrize("cell", ["-5", "-1.5e3", "+7", "42", "-0"])
def test_numbers_are_not_escaped(tmp_path, capsys, cell):
    rc, out, _ = batch(tmp_path, capsys, [row(case_id=cell)])
    assert rc == 0 and out[0]["case_id"] == cell


def test_output_replaced_only_when_complete(tmp_path, capsys, monkeypatch):
    """An existing output survives a batch that fails half-way; a complete batch replaces it."""
    src = write_rows(tmp_path / "in.csv", [row(case_id=str(i)) for i in range(30)])
    dst = tmp_path / "out.csv"
    dst.write_text("previous\n")
    import predictor.plan.batch as B
    real, calls = B.predict_records, []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(B, "predict_records", flaky)
    rc, _, _err = run(["predict-batch", "--input", str(src), "--output", str(dst), "--quiet", "--chunk-rows", "10"],
                     capsys)
    assert rc == 130 and dst.read_text() == "previous\n" and not list(tmp_path.glob(".out.csv*"))
    monkeypatch.setattr(B, "predict_records", real)
    rc, _, _err = run(["predict-batch", "--input", str(src), "--output", str(dst), "--quiet", "--chunk-rows", "7"],
                      capsys)
    assert rc == 0 and [r["case_id"] for r in read_output(dst)] == [str(i) for i in range(30)]

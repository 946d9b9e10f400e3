"""Property-based generation (Hypothesis, derandomized): random layouts and random predict-batch and
sample files. A layout gives either a prediction with finite positive numbers or InfeasibleConfig
(never another exception); a batch file gives exit 0 with one output row per input row or exit 2;
a sample file is ingested or rejected cleanly, the store unchanged when nothing was ingested."""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from predictor.cli.main import main
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import BATCH_COLUMNS, layout_from_fields, model_from_fields
from predictor.plan.predict import get_predictor
from predictor.samples import store

FAST = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
PLATFORMS = ["dgx-a100-80gb", "dgx-h100", "perlmutter-a100", "vista-gh200", "cpu-2t", "cpu-1t", "mi300x-8"]


def pow2(lo: int, hi: int):
    return st.integers(lo, hi).map(lambda k: 2 ** k)


BAD = st.one_of(st.integers(-3, 0), st.integers(2 ** 20, 2 ** 70),
                st.sampled_from(["inf", "-inf", "nan", "1e309", "1.5", "x", "", " 8 ", "0x10", "1e3"]))


def cell(typical, bad_one_in: int = 25):
    """A field value: plausible, or one time in `bad_one_in` zero, negative, huge, non-finite, text or empty."""
    return st.integers(0, bad_one_in - 1).flatmap(lambda k: BAD if k == bad_one_in // 2 else typical)


def blank_or(typical):
    return st.integers(0, 3).flatmap(lambda k: typical if k == 2 else st.just(""))


LAYOUT = st.fixed_dictionaries({
    "platform": st.sampled_from(PLATFORMS),
    "arch": st.sampled_from(["llama", "gpt"] * 10 + ["mamba"]),
    "layers": cell(st.integers(1, 96)), "hidden": cell(pow2(8, 14)), "heads": cell(pow2(0, 6)),
    "kv_heads": blank_or(cell(pow2(0, 3))), "ffn_hidden": blank_or(cell(pow2(10, 16))),
    "vocab": blank_or(cell(st.integers(1, 300_000))), "seq_len": cell(pow2(4, 17)),
    "num_gpus": blank_or(cell(pow2(0, 12))), "tp": cell(pow2(0, 3)), "pp": cell(pow2(0, 3)),
    "dp": blank_or(cell(pow2(0, 6))), "micro_batch": cell(pow2(0, 4)),
    "global_batch": blank_or(cell(pow2(0, 12))), "vpp": st.sampled_from(["", "", "", "1", "2", "3"]),
    "schedule": st.sampled_from(["", "", "", "1f1b", "gpipe", "interleaved", "zigzag"]),
    "recompute": st.sampled_from(["", "none", "selective", "full", "full", "none", "half"]),
    "sequence_parallel": st.sampled_from(["", "", "", "false", "true", "maybe"]),
    "zero_stage": st.sampled_from(["", "", "0", "1", "2", "3", "4"]),
    "precision": st.sampled_from(["", "bf16", "fp16", "fp32", "fp8"]),
    "framework": st.sampled_from(["", "", "megatron", "deepspeed", "fsdp", "ddp", "jax"]),
    "attention": st.sampled_from(["", "flash", "unfused"]),
}).map(lambda d: {k: str(v) for k, v in d.items()})


@st.composite
def consistent_layouts(draw) -> dict[str, str]:
    """Layouts built to be valid (divisibility, batch multiples), sizes from tiny to the bounds, then
    at times one field swapped for a random value: the memory verdict and every number are exercised."""
    tp, pp, dp = (2 ** draw(st.integers(0, k)) for k in (3, 3, 8))
    heads = tp * 2 ** draw(st.integers(0, 4))
    hidden = heads * 2 ** draw(st.integers(4, 8))
    mb = 2 ** draw(st.integers(0, 4))
    f = {"platform": draw(st.sampled_from(PLATFORMS[:4] + ["mi300x-8", "gb200-nvl72"])),
         "arch": draw(st.sampled_from(["llama", "gpt"])), "layers": pp * draw(st.integers(1, 16)), "hidden": hidden,
         "heads": heads, "kv_heads": "", "ffn_hidden": "", "vocab": draw(st.sampled_from(["", 32000, 128256, 2 ** 22])),
         "seq_len": 2 ** draw(st.integers(7, 16)), "num_gpus": tp * pp * dp, "tp": tp, "pp": pp, "dp": dp,
         "micro_batch": mb, "global_batch": mb * dp * draw(st.sampled_from([1, 2, 4, 8])) * pp, "vpp": "",
         "schedule": draw(st.sampled_from(["", "gpipe"])), "recompute": draw(st.sampled_from(["none", "full"])),
         "sequence_parallel": "true" if tp > 1 and draw(st.booleans()) else "",
         "zero_stage": draw(st.sampled_from(["0", "1"])), "precision": draw(st.sampled_from(["bf16", "fp16"])),
         "framework": "", "attention": ""}
    if draw(st.integers(0, 3)) == 0:
        f[draw(st.sampled_from(sorted(f)))] = draw(st.one_of(BAD, st.integers(1, 2 ** 24)))
    return {k: str(v) for k, v in f.items()}


@FAST
@given(st.one_of(LAYOUT, consistent_layouts()))
def test_random_layouts_predict_or_refuse_by_name(fields):
    try:
        model = model_from_fields(fields)
        layout = layout_from_fields(fields)
        p = get_predictor(fields["platform"]).predict(model, layout, timeline=False)
    except InfeasibleConfig as e:
        assert e.field and str(e).startswith(f"{e.field}:")
        return
    for v in (p.step_time_s, p.tokens_per_s, p.mfu, p.memory_gib, p.model_tflops_per_gpu):
        assert math.isfinite(v) and v > 0, (fields, v)
    assert all(math.isfinite(v) and v >= -1e-12 * p.step_time_s for v in p.breakdown_s.values())
    assert sum(p.breakdown_s.values()) == pytest.approx(p.step_time_s, rel=1e-6)
    assert p.fits_memory == (p.memory_gib <= p.usable_gib)


CELL_TEXT = st.one_of(st.text(max_size=6), st.sampled_from(["=1+1", "@x", "-3", "\r", "\n", '"', ",", "dgx-h100"]))


@st.composite
def batch_files(draw) -> bytes:
    """A predict-batch file: the real header (sometimes damaged), rows drawn from LAYOUT with random
    cells replaced, dropped or added, random line ends and encodings."""
    header = list(BATCH_COLUMNS)
    if draw(st.integers(0, 9)) == 0:
        header = draw(st.permutations(header))[: draw(st.integers(0, len(header)))]
    rows = []
    for i in range(draw(st.integers(0, 5))):
        r = draw(LAYOUT)
        cells = [str(i) if c == "case_id" else r.get(c, "") for c in header]
        for _ in range(draw(st.integers(0, 2))):
            k = draw(st.integers(0, max(0, len(cells) - 1)))
            op = draw(st.integers(0, 3))
            if op == 0 and cells:
                cells[k] = draw(CELL_TEXT)
            elif op == 1 and cells:
                cells.pop(k)
            elif op == 2:
                cells.append(draw(CELL_TEXT))
        rows.append(cells)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator=draw(st.sampled_from(["\n", "\r\n"])))
    w.writerow(header)
    w.writerows(rows)
    data = buf.getvalue().encode(draw(st.sampled_from(["utf-8", "utf-8-sig", "latin-1"])), errors="replace")
    if draw(st.integers(0, 9)) == 0:
        data = data[: draw(st.integers(0, len(data)))]
    return data


@FAST
@given(batch_files())
def test_random_batch_files(tmp_path, capsys, data):
    src, out = tmp_path / "in.csv", tmp_path / "out.csv"
    src.write_bytes(data)
    out.unlink(missing_ok=True)
    try:
        rc = main(["predict-batch", "--input", str(src), "--output", str(out), "--quiet"])
    except SystemExit as e:  # pragma: no cover - argparse only
        rc = e.code
    err = capsys.readouterr().err
    assert rc in (0, 2), err
    if rc == 2:
        assert err.startswith("error: input:") and not out.exists()
        return
    with open(out, encoding="utf-8", newline="") as f:
        got = list(csv.DictReader(f))
    assert got
    for r in got:
        if r["error"]:
            assert r["step_time_s"] == "", r
        else:
            assert math.isfinite(float(r["step_time_s"])) and float(r["step_time_s"]) > 0
        for v in r.values():  # nothing a spreadsheet would run
            assert not (v[:1] in ("=", "+", "-", "@", "\t", "\r") and not _finite(v)), v


def _finite(v: str) -> bool:
    try:
        return math.isfinite(float(v))
    except ValueError:
        return False


# ---- sample files to ingest ---------------------------------------------------------------------
SAMPLE_COLS = ["platform", "op", "pass", "batch", "seq", "hidden", "dtype", "duration_s", "source"]
BASE = ("platform,op,pass,batch,seq,hidden,dtype,duration_s,source\n"
        "fz-gpu,layernorm,fwd,2,1024,1024,bf16,1.5e-05,fuzz\n"
        "fz-gpu,res_add,bwd,4,2048,2048,bf16,3.25e-05,fuzz\n")


def _counts(db: Path) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in store.SAMPLE_TABLES}
    finally:
        con.close()


SAMPLE_CELL = st.one_of(st.sampled_from(["layernorm", "res_add", "fwd", "bwd", "bf16", "fp32", "fuzz", "fz-gpu", ""]),
                        st.integers(-5, 10 ** 6).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                        st.text(max_size=5))


@st.composite
def sample_files(draw) -> bytes:
    cols = draw(st.one_of(st.just(SAMPLE_COLS), st.permutations(SAMPLE_COLS),
                          st.lists(st.sampled_from(SAMPLE_COLS + ["extra", "duration_ms"]), max_size=10)))
    lines = [",".join(cols)]
    for _ in range(draw(st.integers(0, 6))):
        vals = {"platform": "fz-gpu", "op": draw(st.sampled_from(["layernorm", "res_add"])),
                "pass": draw(st.sampled_from(["fwd", "bwd"])), "batch": str(draw(st.integers(1, 16))),
                "seq": str(draw(st.sampled_from([512, 1024, 2048]))), "hidden": str(draw(st.sampled_from([512, 1024]))),
                "dtype": "bf16", "duration_s": f"{draw(st.floats(1e-6, 1e-1)):.6e}", "source": "fuzz"}
        cells = [vals.get(c, "x") for c in cols]
        if cells and draw(st.booleans()):
            cells[draw(st.integers(0, len(cells) - 1))] = draw(SAMPLE_CELL)
        lines.append(",".join(cells))
    data = ("\n".join(lines) + draw(st.sampled_from(["\n", ""]))).encode()
    if draw(st.integers(0, 4)) == 0:
        raw = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            if raw:
                raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        data = bytes(raw)
    return data


@settings(max_examples=20, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(sample_files())
def test_random_sample_files_ingest_or_reject_cleanly(tmp_path, data):
    db = tmp_path / "s.duckdb"
    if not db.exists():
        seed = tmp_path / "seed.csv"
        seed.write_text(BASE)
        assert store.ingest_path(seed, store_path=db).ok
    before = _counts(db)
    f = tmp_path / "x" / "ops.csv"
    f.parent.mkdir(exist_ok=True)
    f.write_bytes(data)
    rep = store.ingest_path(f, store_path=db)  # never raises
    (outcome,) = rep.files
    assert outcome.status in ("ingested", "rejected", "skipped", "duplicate", "already ingested"), outcome
    after = _counts(db)
    if outcome.status != "ingested":
        assert after == before, (outcome, data)
        if outcome.status == "rejected":
            assert outcome.reason
    else:
        added = sum(rep.rows_added.values())
        assert sum(after.values()) - sum(before.values()) == added
        ops = store.read_op_samples("fz-gpu", store_path=db)
        assert ops["duration_s"].map(lambda x: math.isfinite(x) and x > 0).all()
    f.unlink()

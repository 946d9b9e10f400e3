"""The command-line corpus: every input issue 16 lists and more, each with its outcome class
(see harness.py). In-process through `predictor.cli.main.main`; tests/fuzz/test_subprocess.py runs a few
as real processes for exit codes and crashes."""
from __future__ import annotations

import pytest

from predictor.model.bounds import BOUNDS

from .harness import SMALL, assert_error, assert_prediction, run

PRED = ["predict", "--platform", "dgx-a100-80gb", "--json"]


# ---- predict: bounds, one case above and one at each bound --------------------------------------
OVER = {  # flag -> (value over the bound, extra flags making the rest valid)
    "layers": (2 ** 12 + 1, []), "hidden": (2 ** 40, []), "heads": (2 ** 15, ["--hidden", str(2 ** 15)]),
    "kv-heads": (2 ** 15, []), "ffn-hidden": (2 ** 20, []), "vocab": (10 ** 12, []), "seq-len": (10 ** 9, []),
    "num-gpus": (2 ** 21, []), "tp": (2 ** 21, []), "pp": (2 ** 13, []), "dp": (2 ** 21, []),
    "vpp": (2 ** 13, ["--schedule", "interleaved", "--pp", "2"]), "micro-batch": (2 ** 17, []),
    "global-batch": (2 ** 25, []), "ep": (2 ** 21, []),
    "num-experts": (2 ** 14 + 1, ["--top-k", "2"]), "top-k": (2 ** 10 + 1, ["--num-experts", "8"]),
    "moe-ffn-hidden": (2 ** 19 + 1, ["--num-experts", "8", "--top-k", "2"]),
    "shared-ffn-hidden": (2 ** 19 + 1, ["--num-experts", "8", "--top-k", "2"]),
    "shared-experts": (2 ** 10 + 1, ["--num-experts", "8", "--top-k", "2"]),
    "dense-layers": (2 ** 12 + 1, ["--num-experts", "8", "--top-k", "2"]),
}


@pytest.mark.parametrize("flag", sorted(OVER))
def test_above_the_bound_names_field_bound_and_reason(capsys, flag):
    value, extra = OVER[flag]
    field = flag.replace("-", "_")
    rc, _, err = run([*PRED, *SMALL, *extra, f"--{flag}", str(value)], capsys)
    assert_error(rc, err, field)
    hi, why = BOUNDS[field]
    assert f"{hi:,}" in err and why.split(";")[0][:30] in err


@pytest.mark.parametrize("text", ["2^63", str(2 ** 63), str(2 ** 64 + 1), str(10 ** 30)])
def test_huge_layers_any_spelling(capsys, text):
    rc, _, err = run([*PRED, "--arch", "gpt", "--hidden", "1024", "--heads", "16", "--layers", text], capsys)
    assert_error(rc, err, "layers")


@pytest.mark.parametrize("flag,value", [("tp", "inf"), ("tp", "1e309"), ("num-gpus", "-inf"), ("hidden", "nan"),
                                        ("seq-len", "1e9"), ("vocab", "1e12"), ("layers", "4.5"), ("heads", ""),
                                        ("micro-batch", "0x10")])
def test_non_integer_flags_are_refused_by_name(capsys, flag, value):
    rc, _, err = run([*PRED, *SMALL, f"--{flag}", value], capsys)
    assert_error(rc, err, flag.replace("-", "_"))


@pytest.mark.parametrize("flag,value", [("layers", 0), ("layers", -1), ("hidden", -1024), ("heads", 0), ("vocab", -5),
                                        ("seq-len", 0), ("num-gpus", -8), ("tp", 0), ("pp", -1), ("micro-batch", 0),
                                        ("global-batch", -16), ("vpp", 0), ("kv-heads", -1), ("ffn-hidden", 0),
                                        ("zero-stage", 4), ("zero-stage", -1)])
def test_zero_and_negative_fields(capsys, flag, value):
    rc, _, err = run([*PRED, *SMALL, f"--{flag}", str(value)], capsys)
    assert_error(rc, err, {"kv-heads": "kv_heads", "ffn-hidden": "ffn_hidden"}.get(flag, flag.replace("-", "_")))


def test_tokens_per_micro_batch_bound(capsys):
    rc, _, err = run([*PRED, *SMALL, "--seq-len", str(2 ** 22), "--micro-batch", "8", "--global-batch", "8"], capsys)
    assert_error(rc, err, "micro_batch")
    assert "16,777,216" in err


@pytest.mark.parametrize("args", [
    ["--seq-len", str(2 ** 20), "--recompute", "full", "--tp", "8", "--num-gpus", "8", "--global-batch", "1",
     "--sequence-parallel", "--allow-oom"],
    ["--layers", str(2 ** 12), "--pp", "8", "--num-gpus", "8", "--global-batch", "64", "--allow-oom"],
    ["--vocab", str(2 ** 22), "--allow-oom"],
    ["--hidden", str(2 ** 17), "--heads", "128", "--allow-oom"],
])
def test_at_the_bound_a_finite_prediction(capsys, args):
    """At the bounds every number is still finite and positive (no overflow in the arithmetic)."""
    base = {"--arch": "llama", "--layers": "4", "--hidden": "1024", "--heads": "16"}
    argv = [*PRED]
    for k, v in base.items():
        if k not in args:
            argv += [k, v]
    assert_prediction(*run([*argv, *args], capsys))


def test_digits_of_other_scripts_are_numbers(capsys):
    """int() reads any Unicode decimal digits: '١٦' is 16, a valid global batch."""
    d = assert_prediction(*run([*PRED, *SMALL, "--global-batch", "١٦"], capsys))
    assert d["layout"]["global_batch"] == 16


# ---- predict: memory verdict --------------------------------------------------------------------
@pytest.mark.parametrize("platform,gpus,extra", [
    ("dgx-h100", 8, ["--tp", "8"]), ("dgx-h100", 1, []), ("dgx-a100-80gb", 8, ["--tp", "8"]),
    ("perlmutter-a100", 4, ["--tp", "4"]), ("vista-gh200", 16, ["--pp", "16"]),
])
def test_llama3_405b_on_few_gpus_does_not_fit(capsys, platform, gpus, extra):
    argv = ["predict", "--platform", platform, "--model", "llama3-405b", "--num-gpus", str(gpus), *extra]
    rc, out, err = run(argv, capsys)
    assert_error(rc, err, "memory")
    assert "GiB per GPU needed" in err and "GiB usable" in err and "--allow-oom" in err
    assert any(w in err for w in ("tensor parallelism", "pipeline stages", "ZeRO", "recomputation", "micro-batch"))
    assert out == ""  # no time printed
    rc, out, err = run([*argv, "--allow-oom"], capsys)
    assert rc == 0 and "DOES NOT FIT" in out and "step time" in out
    rc, out, err = run([*argv, "--allow-oom", "--json"], capsys)
    d = assert_prediction(rc, out, err)
    assert d["fits"] is False and d["memory_gib"] > d["usable_gib"]


def test_a_layout_that_fits_says_so(capsys):
    rc, out, _err = run(["predict", "--platform", "dgx-a100-80gb", "--model", "llama3-8b", "--num-gpus", "8", "--tp",
                        "8", "--global-batch", "8"], capsys)
    assert rc == 0 and "memory:" in out and ": fits" in out and "GiB usable" in out


@pytest.mark.parametrize("mb,recompute", [(8, "none"), (16, "selective"), (32, "full")])
def test_activation_heavy_oom_suggests_activation_levers_first(capsys, mb, recompute):
    rc, _, err = run(["predict", "--platform", "dgx-h100", "--model", "llama3-8b", "--num-gpus", "1",
                      "--seq-len", "8192",
                      "--micro-batch", str(mb), "--global-batch", str(mb), "--recompute", recompute], capsys)
    assert_error(rc, err, "memory")
    fix = err.split("Fix:", 1)[1]
    assert "micro-batch" in fix and fix.index("micro-batch") < fix.index("more GPUs")


# ---- predict: platforms, models, names ----------------------------------------------------------
@pytest.mark.parametrize("platform,gpus", [("cpu-2t", 2), ("cpu-2t", 16), ("cpu-1t", 4), ("cpu-1t", 16),
                                           ("cpu-1t", 1024)])
def test_platforms_without_links_refuse_more_ranks(capsys, platform, gpus):
    rc, _, err = run(["predict", "--platform", platform, "--arch", "gpt", "--layers", "2", "--hidden", "256", "--heads",
                      "4", "--num-gpus", str(gpus), "--global-batch", str(gpus), "--precision", "fp32"], capsys)
    assert_error(rc, err, "num_gpus")
    assert platform in err and "ranks" in err


@pytest.mark.parametrize("platform,gpus", [("cpu-2t", 1), ("cpu-1t", 1), ("cpu-1t", 2)])
def test_cpu_platforms_within_their_ranks_predict(capsys, platform, gpus):
    assert_prediction(*run(["predict", "--platform", platform, "--arch", "gpt", "--layers", "2", "--hidden", "256",
                            "--heads", "4", "--num-gpus", str(gpus), "--global-batch", str(gpus), "--seq-len", "128",
                            "--precision", "fp32", "--json"], capsys))


@pytest.mark.parametrize("platform", ["tpu-v9", "../../etc/evil", "", " ", "dgx-h100/../x", "generic:nope:8",
                                      "generic:a100-sxm4-80gb:0", "generic:a100-sxm4-80gb:8:-5",
                                      "generic:a100-sxm4-80gb:8:nan", "generic:a100-sxm4-80gb:8:inf",
                                      "generic:a100-sxm4-80gb:100000000", "generic:a100-sxm4-80gb:8:0:0",
                                      "generic:a100-sxm4-80gb:8:300:-1", "DGX-H100; rm -rf /"])
def test_bad_platform_names(capsys, platform):
    rc, _, err = run(["predict", "--platform", platform, "--model", "llama2-7b"], capsys)
    assert "Traceback" not in err and rc == 2 and err.startswith("error:")
    assert any(w in err.split("Fix")[0] for w in ("platform", "device", "gpus_per_node", "bandwidth"))


@pytest.mark.parametrize("model", ["gpt5", "", "../presets", "LLAMA3-8B-X", "llama3-8b\x00"])
def test_unknown_models(capsys, model):
    rc, _, err = run(["predict", "--platform", "dgx-h100", "--model", model], capsys)
    assert_error(rc, err, "model")


@pytest.mark.parametrize("args,field", [
    (["--arch", "llama", "--layers", "2", "--hidden", "100", "--heads", "3"], "hidden"),
    (["--arch", "gpt", "--hidden", "1024", "--heads", "16"], "layers"),
    (["--arch", "llama", "--layers", "4", "--heads", "16"], "hidden"),
    ([*SMALL, "--kv-heads", "5"], "kv_heads"),
    ([*SMALL, "--tp", "3", "--num-gpus", "3"], "tp"),
    ([*SMALL, "--num-gpus", "8", "--tp", "3"], "num_gpus"),
    ([*SMALL, "--pp", "8", "--num-gpus", "8"], "pp"),
    ([*SMALL, "--global-batch", "3", "--num-gpus", "2"], "global_batch"),
    ([*SMALL, "--schedule", "interleaved"], "schedule"),
    ([*SMALL, "--vpp", "2"], "schedule"),  # vpp > 1 means the interleaved schedule, which needs pp >= 2
    ([*SMALL, "--vpp", "2", "--schedule", "1f1b"], "vpp"),
    ([*SMALL, "--sequence-parallel"], "sequence_parallel"),
    ([*SMALL, "--stage-layers", "1,x"], "stage_layers"),
    ([*SMALL, "--stage-layers", "1,1", "--pp", "2", "--num-gpus", "2", "--global-batch", "2"], "stage_layers"),
    ([*SMALL, "--framework", "jax"], "framework"),
    ([*SMALL, "--framework", "deepspeed", "--zero-stage", "3", "--pp", "2", "--num-gpus", "2"], "zero_stage"),
    ([*SMALL, "--precision", "fp8"], "precision"),
    ([*SMALL, "--schedule", "zigzag"], "schedule"),
    ([*SMALL, "--recompute", "half"], "recompute"),
    ([*SMALL, "--arch", "mamba"], "arch"),
    (["--layers", "4"], "model"),
    # Mixture of Experts
    ([*SMALL, "--num-experts", "8"], "top_k"), ([*SMALL, "--top-k", "2"], "top_k"), ([*SMALL, "--ep", "2"], "ep"),
    ([*SMALL, "--num-experts", "8", "--top-k", "9"], "top_k"),
    ([*SMALL, "--num-experts", "8", "--top-k", "2", "--num-gpus", "8", "--ep", "3"], "ep"),
    ([*SMALL, "--num-experts", "8", "--top-k", "2", "--num-gpus", "8", "--pp", "2", "--ep", "8"], "ep"),
    ([*SMALL, "--num-experts", "8", "--top-k", "2", "--num-gpus", "8", "--tp", "2"], "sequence_parallel"),
    ([*SMALL, "--num-experts", "8", "--top-k", "2", "--capacity-factor", "-1"], "capacity_factor"),
    ([*SMALL, "--num-experts", "8", "--top-k", "2", "--moe-imbalance", "nan"], "moe_imbalance"),
    ([*SMALL, "--num-experts", "8", "--top-k", "2", "--dense-layers", "4"], "dense_layers"),
    ([*SMALL, "--num-experts", "8", "--top-k", "2.5"], "top_k"), ([*SMALL, "--ep", "x"], "ep"),
    (["--model", "deepseek-v3.2"], "model"),
    (["--model", "mixtral-8x7b", "--num-experts", "0", "--top-k", "2"], "top_k"),
])
def test_invalid_layouts_name_the_field(capsys, args, field):
    rc, _, err = run(["predict", "--platform", "dgx-a100-80gb", *args], capsys)
    assert_error(rc, err, field)


@pytest.mark.parametrize("platform", ["dgx-a100-80gb", "dgx-h100", "perlmutter-a100", "vista-gh200", "mi300x-8",
                                      "gb200-nvl72", "dgx1-v100"])
def test_valid_small_layouts_predict_everywhere(capsys, platform):
    extra = ["--attention", "unfused", "--precision", "fp16"] if platform == "dgx1-v100" else []
    d = assert_prediction(*run(["predict", "--platform", platform, *SMALL, "--num-gpus", "16", "--tp", "2", "--pp", "2",
                                "--global-batch", "32", "--json", *extra], capsys))
    assert d["fits"] is True


# ---- search -------------------------------------------------------------------------------------
SEARCH = ["search", "--model", "llama3-70b", "--platform", "dgx-h100", "--global-batch", "1024", "--seq-len", "4096"]


@pytest.mark.parametrize("fmt", [[], ["--json"], ["--csv"], ["--all"]])
def test_search_500_gpus_on_dgx_h100(capsys, fmt):
    rc, _out, err = run([*SEARCH, "--num-gpus", "500", *fmt], capsys)
    assert_error(rc, err, "num_gpus")
    assert "500" in err and "GPUs" in err and "Fix: try" in err


@pytest.mark.parametrize("gpus", ["abc", "0", "-5", "10-5", ",", "1e3", str(2 ** 21), "inf"])
def test_search_gpu_counts_that_cannot_be_read(capsys, gpus):
    assert_error(*run([*SEARCH, "--num-gpus", gpus], capsys)[::2], "num_gpus")


@pytest.mark.parametrize("args,field", [
    (["--seq-len", str(2 ** 23)], "seq_len"), (["--global-batch", "0"], "global_batch"),
    (["--global-batch", str(2 ** 25)], "global_batch"), (["--hidden", str(2 ** 20)], "hidden"),
    (["--recompute", "half"], "recompute"), (["--tp", "x"], "tp"), (["--tokens", "lots"], "tokens"),
    (["--objective", "speed"], "objective"), (["--precision", "fp4"], "precision"),
    (["--platform", "dgx-a100-80gb", "--precision", "fp8"], "precision"), (["--top-k", "2"], "top_k"),
    (["--model", "mixtral-8x7b", "--top-k", "9"], "top_k"), (["--model", "deepseek-v3.2"], "model"),
    (["--model", "mixtral-8x7b", "--capacity-factor", "inf"], "capacity_factor"),
])
def test_search_bad_fields(capsys, args, field):
    argv = [*SEARCH, "--num-gpus", "64"]
    for k, v in zip(args[::2], args[1::2]):
        if k in argv:
            argv[argv.index(k) + 1] = v
        else:
            argv += [k, v]
    assert_error(*run(argv, capsys)[::2], field)


@pytest.mark.parametrize("platform,gpus", [("cpu-2t", "4"), ("cpu-1t", "8"), ("cpu-1t", "2,16")])
def test_search_refuses_ranks_a_platform_cannot_run(capsys, platform, gpus):
    rc, _, err = run(["search", "--platform", platform, "--arch", "gpt", "--layers", "2", "--hidden", "256", "--heads",
                      "4", "--num-gpus", gpus, "--global-batch", "16", "--seq-len", "128", "--precision", "fp32"],
                     capsys)
    assert_error(rc, err, "num_gpus")


def test_search_where_nothing_fits_says_so(capsys):
    rc, out, err = run(["search", "--model", "llama3-70b", "--platform", "dgx-h100", "--num-gpus", "8",
                        "--global-batch", "8", "--seq-len", "4096"], capsys)
    assert rc == 3 and "No layout fits" in out and "out of memory" in out and "Traceback" not in err


def test_search_that_finds_layouts(capsys):
    rc, out, _err = run(["search", "--model", "llama3-8b", "--platform", "dgx-h100", "--num-gpus", "64",
                        "--global-batch", "512", "--seq-len", "4096", "--top", "3", "--csv"], capsys)
    assert rc == 0 and len(out.strip().splitlines()) == 4


# ---- other commands listed in the issue ---------------------------------------------------------
@pytest.mark.parametrize("argv,field", [
    (["calibrate-host", "--platform", "cpu-2t", "--folds", "0", "--dry-run"], "folds"),
    (["calibrate-host", "--platform", "cpu-2t", "--folds", "-3", "--dry-run"], "folds"),
    (["calibrate-host", "--platform", "dgx-h100", "--dry-run"], "platform"),
    (["ingest", "--kind", "nonsense", "x.csv"], "unknown --kind"),
])
def test_other_commands(capsys, argv, field):
    rc, _, err = run(argv, capsys)
    assert rc == 2 and "Traceback" not in err and field in err.splitlines()[0]


# ---- Ctrl-C -------------------------------------------------------------------------------------
def _interrupt(*a, **k):
    raise KeyboardInterrupt


@pytest.mark.parametrize("target,argv", [
    ("predictor.plan.batch.predict_records", "batch"),
    ("predictor.samples.store.ingest_path", ["ingest", "x.csv", "--quiet"]),
    ("predictor.plan.search.search", [*SEARCH, "--num-gpus", "64"]),
    ("predictor.plan.predict.Predictor.predict", ["predict", "--platform", "dgx-h100", "--model", "llama3-8b"]),
    ("predictor.checks.validate.validate_runs", ["validate", "--quiet"]),
])
def test_ctrl_c_is_one_line_and_130(capsys, tmp_path, monkeypatch, target, argv):
    import importlib
    mod, attr = target.rsplit(".", 1)
    if mod.endswith("Predictor"):
        mod, cls = mod.rsplit(".", 1)
        monkeypatch.setattr(getattr(importlib.import_module(mod), cls), attr, _interrupt)
    else:
        monkeypatch.setattr(importlib.import_module(mod), attr, _interrupt)
    if argv == "batch":
        from .harness import row, write_rows
        src = write_rows(tmp_path / "in.csv", [row()])
        argv = ["predict-batch", "--input", str(src), "--output", str(tmp_path / "out.csv"), "--quiet"]
    rc, _, err = run(argv, capsys)
    assert rc == 130 and len(err.strip().splitlines()) == 1 and err.startswith("interrupted"), err
    assert not (tmp_path / "out.csv").exists() and not list(tmp_path.glob(".out.csv*"))

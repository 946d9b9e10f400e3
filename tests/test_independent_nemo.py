"""predictor.checks.independent_nemo: published NeMo / Megatron-Bridge runs, checked, never fitted to (fast: no
prediction except one dense run)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from predictor.checks import independent_nemo as nemo

DOC = nemo.load()


def test_catalog_loads_and_every_row_and_model_is_complete():
    assert set(DOC) >= {"_comment", "systems", "precisions", "model_names", "models", "sources"}
    for sid, src in DOC["sources"].items():
        for key in ("description", "document", "licence", "framework", "columns", "rows", "definitions"):
            assert src.get(key), (sid, key)
        assert src["framework"] == "megatron"
        assert all(len(r) == len(src["columns"]) for r in src["rows"]), sid
        printed = {r[src["columns"].index("model")] for r in src["rows"]}
        assert printed <= set(DOC["model_names"]), (sid, printed - set(DOC["model_names"]))
    for key, m in DOC["models"].items():
        if "unpredictable" in m:
            continue
        assert m["cite"] and {"layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab"} <= set(m), key
        if m.get("num_experts"):  # the predictor's MoE field names
            assert {"top_k", "moe_ffn_hidden", "shared_experts", "dense_layers", "head_dim"} <= set(m), key
    assert set(DOC["model_names"].values()) <= set(DOC["models"])


def test_every_kept_row_closes_and_the_drops_are_the_known_ones():
    pr = nemo.published_runs(DOC)
    ok = pr.ok
    assert len(ok) + len(pr.dropped) == sum(len(s["rows"]) for s in DOC["sources"].values())
    tpp = ok["tp"].fillna(1) * ok["pp"].fillna(1) * ok["cp"].fillna(1)
    assert (ok["gpus"] == tpp * ok["dp_derived"]).all()
    assert (ok["global_batch"] % (ok["micro_batch"] * ok["dp_derived"]) == 0).all()
    derived = ok["global_batch"] * ok["seq_len"] / (ok["tokens_per_s_per_gpu"] * ok["gpus"])
    assert ((ok["measured_s"] / derived - 1).abs() < 1e-9).all()
    counts = pr.dropped_counts
    # the transcription is clean: no throughput is off its model's FLOPs per token, no printed step time is off
    assert nemo.BAD_FLOPS not in counts and nemo.BAD_STEP not in counts and nemo.BAD_GPUS not in counts
    # the four rows whose published numbers do not close: Mixtral-8x22B printed with GBS 1 / MBS 64 (25.02, 25.04),
    # Megatron-Bridge 25.11 GB300 Qwen3-235B and H100 GPT-OSS whose printed GA is not GBS / (MBS x dp)
    bad = pr.dropped[pr.dropped["reason"] == nemo.BAD_BATCH]
    assert sorted(bad["model"]) == ["GPT OSS 120B", "Mixtral-8x22B", "Mixtral-8x22B", "Qwen3_235B_a22B"]
    assert counts[nemo.NO_STEP] == 9  # the long-sequence (CP) table prints no batch sizes
    assert set(ok["platform"]) <= {"dgx-h100", "dgx-b200", "gb200-nvl72", "dgx-b300", "gb300-nvl72"}
    assert set(ok["pred_precision"]) <= {"bf16", "fp8", "mxfp8"}


@pytest.mark.parametrize("column,change,reason", [("tokens_per_s_per_gpu", lambda v: v * 1.3, nemo.BAD_FLOPS),
                                                   ("gpus", lambda v: v + 1, nemo.BAD_GPUS),
                                                   ("global_batch", lambda v: v * 3, nemo.BAD_BATCH),
                                                   ("step_time_ms", lambda v: v * 1.05, nemo.BAD_STEP)])
def test_a_corrupted_row_is_dropped_and_counted(tmp_path, column, change, reason):
    doc = json.loads(nemo.CATALOG.read_text())
    sid = "megatron-bridge-cards" if column == "step_time_ms" else "megatron-bridge"
    src = doc["sources"][sid]
    i = src["columns"].index(column)
    col = {c: j for j, c in enumerate(src["columns"])}
    # an H100 Qwen3-30B-A3B row of a release that prints GA and the model more than once (TFLOP/s cross-check)
    k = next(j for j, r in enumerate(src["rows"]) if r[col["model"]] in ("Qwen3_30B_a3B", "Qwen/Qwen3-30B-A3B")
             and r[col["system"]] in ("DGX-H100", "H100") and r[col["release"]] in ("25.11", "card"))
    src["rows"][k][i] = change(src["rows"][k][i])
    before = nemo.published_runs(nemo.load(), [sid]).dropped_counts
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(doc))
    after = nemo.published_runs(nemo.load(path), [sid]).dropped_counts
    assert after.get(reason, 0) == before.get(reason, 0) + 1


def _row(model_key: str, **over) -> pd.Series:
    base = {"source": "t", "release": "r", "system": "DGX-H100", "model": "m", "gpus": 64, "precision": "fp8-cs",
            "platform": "dgx-h100", "pred_precision": "fp8", "seq_len": 4096, "global_batch": 256, "micro_batch": 1,
            "fsdp": 0, "tp": 2, "pp": 4, "cp": 2, "vp": 5, "ep": None, "dp_derived": 4}
    base.update(over)
    return pd.Series(base)


def test_the_row_builder_emits_the_predict_batch_columns():
    r = nemo.batch_row(_row("llama3-70b"), DOC["models"]["llama3-70b"])
    assert list(r) == nemo.ROW_COLUMNS and all(isinstance(v, str) for v in r.values())
    assert r["schedule"] == "interleaved" and r["vpp"] == "5" and r["sequence_parallel"] == "true"
    assert (r["zero_stage"], r["framework"], r["precision"], r["recompute"]) == ("1", "megatron", "fp8", "none")
    assert (r["tp"], r["pp"], r["cp"], r["dp"], r["ep"], r["num_gpus"]) == ("2", "4", "2", "4", "1", "64")
    assert (r["layers"], r["kv_heads"], r["num_experts"], r["top_k"], r["head_dim"]) == ("80", "8", "0", "", "")
    r = nemo.batch_row(_row("qwen3-30b-a3b", tp=1, pp=1, cp=1, vp=None, ep=8, fsdp=64, dp_derived=64),
                       DOC["models"]["qwen3-30b-a3b"])
    assert r["schedule"] == "1f1b" and r["sequence_parallel"] == "false" and r["zero_stage"] == "3"
    assert (r["num_experts"], r["top_k"], r["moe_ffn_hidden"], r["ep"], r["head_dim"]) == ("128", "8", "768", "8",
                                                                                          "128")
    assert r["moe_imbalance"] == ""  # the modelled imbalance of random routing
    # forced balancing is Megatron-Core's random router (random normal logits): random routing, not an exact balance
    r = nemo.batch_row(_row("qwen3-30b-a3b", ep=8, force_balanced=True), DOC["models"]["qwen3-30b-a3b"])
    assert r["moe_imbalance"] == ""
    assert nemo.batch_row(_row("llama3-70b", force_balanced=True), DOC["models"]["llama3-70b"])["moe_imbalance"] == ""


def test_a_moe_row_is_never_sent_without_its_expert_columns():
    moe = nemo.batch_row(_row("qwen3-30b-a3b", ep=8), DOC["models"]["qwen3-30b-a3b"])
    dense = nemo.batch_row(_row("llama3-70b"), DOC["models"]["llama3-70b"])
    base = nemo.accepted_columns() - set(nemo.MOE_DEFAULTS)  # a predictor without MoE columns
    kept, why = nemo.predictable_record(dense, base)
    assert why == "" and set(kept) <= base and "num_experts" not in kept
    kept, why = nemo.predictable_record(moe, base)
    assert "num_experts" in why and "ep" in why
    full = base | set(nemo.MOE_DEFAULTS)  # once the predictor accepts them, they go through unchanged
    kept, why = nemo.predictable_record(moe, full)
    assert why == "" and kept["num_experts"] == "128" and kept["ep"] == "8"


def test_a_dense_run_is_predicted_and_scored():
    c = nemo.run_check(["nemo-24.07-h100"], accepted=nemo.accepted_columns() - set(nemo.MOE_DEFAULTS))
    d = c.runs
    assert len(d) == 7 and d["predicted_s"].notna().all() and (d["predicted_s"] > 0).all()
    assert ((d["signed_error"] - (d["predicted_s"] / d["measured_s"] - 1)).abs() < 1e-12).all()
    s = c.summary("platform")
    assert list(s["group"]) == ["dgx-h100"] and int(s["runs"].iloc[0]) == 7


def test_rows_carry_the_recipes_memory_settings_where_their_scripts_state_them():
    """bf16 gradients in every performance path, FP8 primary weights for Megatron-Bridge and NeMo 2.0's delayed /
    current-scaling FP8 (not NeMo's MXFP8, not stated for 24.07); the model cards' runs keep the defaults."""
    import pandas as pd

    from predictor.checks.independent_nemo import memory_settings
    row = lambda src, prec, pred: pd.Series({"source": src, "precision": prec, "pred_precision": pred})  # noqa: E731
    assert memory_settings(row("megatron-bridge", "fp8-mx", "mxfp8")) == (False, True)
    assert memory_settings(row("megatron-bridge", "bf16", "bf16")) == (False, False)
    assert memory_settings(row("nemo-25.04", "fp8-cs", "fp8")) == (False, True)
    assert memory_settings(row("nemo-25.02", "fp8-mx", "mxfp8")) == (False, False)
    assert memory_settings(row("nemo-24.07-h100", "fp8", "fp8")) == (False, False)
    assert memory_settings(row("megatron-bridge-cards", "fp8-mx", "mxfp8")) == (None, False)


def test_the_recipes_memory_options_follow_their_scripts_row_by_row():
    """Megatron-Bridge 25.11's scripts compute the loss with Transformer Engine's cross entropy (no fp32 logits) and
    its DeepSeek-V3 recipe keeps Adam's moments in bf16; other releases, sources and models keep the defaults, and
    every row is predicted without NVLS buffers (the launchers' NCCL_NVLS_ENABLE=0)."""
    from predictor.step.memory import MemoryOptions
    opts = lambda src, rel, key: nemo.recipe_memory_options(  # noqa: E731
        pd.Series({"source": src, "release": rel, "model_key": key}))
    base = MemoryOptions(nccl_nvls_mib=nemo.NO_NVLS_MIB)
    assert opts("megatron-bridge", "25.11", "qwen3-30b-a3b") == MemoryOptions(nccl_nvls_mib=0.0, logits_fp32=False)
    assert opts("megatron-bridge", "25.11", "deepseek-v3") == MemoryOptions(
        nccl_nvls_mib=0.0, logits_fp32=False, optimizer_bytes_per_param=4)
    assert opts("megatron-bridge", "26.02", "deepseek-v3") == base
    assert opts("nemo-25.07", "25.07", "llama3-70b") == base
    assert opts("megatron-bridge-cards", "25.11", "qwen3-30b-a3b") == base


def test_bf16_moments_and_16_bit_logits_lower_the_predicted_memory_of_a_deepseek_row():
    from predictor.plan.batch import predict_records
    pr = nemo.published_runs(DOC, ["megatron-bridge"])
    r = next(r for _, r in pr.ok.iterrows() if r["release"] == "25.11" and r["system"] == "DGX-GB200"
             and r["model_key"] == "deepseek-v3" and r["precision"] == "bf16")
    rec, why = nemo.predictable_record(nemo.batch_row(r, DOC["models"][r["model_key"]]))
    assert not why
    from predictor.step.memory import MemoryOptions
    (plain,) = predict_records([rec], allow_oom=True, memory_options=MemoryOptions(nccl_nvls_mib=nemo.NO_NVLS_MIB))
    (recipe,) = predict_records([rec], allow_oom=True, memory_options=nemo.recipe_memory_options(r))
    # the optimizer shard of a 671B model over the expert-data-parallel group shrinks by a third (12 -> 8 bytes per
    # parameter): several GiB per GPU, the step time untouched
    assert recipe["memory_allocated_gib"] < plain["memory_allocated_gib"] - 5.0
    assert recipe["step_time_s"] == pytest.approx(plain["step_time_s"], rel=1e-9)


def test_fp8_mx_rows_are_predicted_as_mxfp8_on_every_blackwell_platform_they_run_on():
    """The printed FP8-MX recipe is MXFP8 block scaling: predicted as mxfp8 (not per-tensor fp8), on B200, GB200, B300
    and GB300 alike (Blackwell Ultra runs MXFP8), none refused for the format."""
    from predictor.checks.independent_nemo import load, published_runs, run_check
    doc = load()
    assert doc["precisions"]["fp8-mx"] == "mxfp8" and doc["precisions"]["fp8-cs"] == "fp8"
    ok = published_runs(doc).ok
    mx = ok[ok["precision"] == "fp8-mx"]
    assert {"dgx-b200", "gb200-nvl72", "dgx-b300", "gb300-nvl72"} <= set(mx["platform"])
    runs = run_check().runs
    mx_runs = runs[runs["precision"] == "fp8-mx"]
    assert not mx_runs["error"].str.contains("cannot run mxfp8").any()
    assert not mx_runs["error"].str.contains("fp8_param_gather").any()


def test_the_megatron_bridge_releases_are_transcribed_row_by_row():
    """Rows per release of the Megatron-Bridge performance summary (26.06 its pre-training tables only), the 26.06 rows
    kept or dropped for the same reasons as 26.02's, and one 26.06 row with its fields as printed."""
    src = DOC["sources"]["megatron-bridge"]
    col = {c: j for j, c in enumerate(src["columns"])}
    per_release: dict[str, int] = {}
    for r in src["rows"]:
        per_release[r[col["release"]]] = per_release.get(r[col["release"]], 0) + 1
    assert per_release == {"26.06": 25, "26.02": 33, "25.11": 32, "25.09": 17}
    # DGX-GB300 | 8 | MXFP8 | 512 | 8 | 4096 | 1 | 1 | 1 | n/a | 8 | 45275 | 1041 (no FSDP / GA column in 26.06)
    row = dict(zip(src["columns"], next(r for r in src["rows"] if r[col["release"]] == "26.06"
                                        and r[col["system"]] == "DGX-GB300" and r[col["model"]] == "Qwen3_30B_a3B")))
    assert row == {"release": "26.06", "system": "DGX-GB300", "model": "Qwen3_30B_a3B", "gpus": 8,
                   "precision": "fp8-mx", "global_batch": 512, "micro_batch": 8, "seq_len": 4096, "fsdp": None,
                   "tp": 1, "pp": 1, "cp": 1, "vp": None, "ep": 8, "etp": None, "ga": None, "dp": None,
                   "tokens_per_s_per_gpu": 45275, "tflops_per_gpu": 1041, "step_time_ms": None}
    pr = nemo.published_runs(DOC, ["megatron-bridge"])
    ok = pr.ok[pr.ok["release"] == "26.06"]
    assert len(ok) == 12 and set(ok["platform"]) == {"gb300-nvl72", "gb200-nvl72", "dgx-h100"}
    assert sorted(ok["model_key"].unique()) == ["gpt-oss-120b", "llama3.1-405b", "qwen3-235b-a22b", "qwen3-30b-a3b"]
    assert ok["force_balanced"].all()
    dropped = pr.dropped[pr.dropped["release"] == "26.06"]
    prefixes = ("precision nvfp4 not modelled", "model not modelled: DeepSeek-V3 rows that do not say",
                "model not modelled: Nemotron 3", "model not modelled: Kimi K2")
    reasons = {next(p for p in prefixes if why.startswith(p)): n for why, n in nemo.reason_counts(dropped).items()}
    assert reasons == dict(zip(prefixes, (4, 3, 5, 1)))


def test_the_26_06_recipe_settings_are_cited_and_turn_on_the_moe_overlap_of_their_rows_only():
    """Each 26.06 recipe entry matches one printed row, cites its recipe file and records its CUDA graph (not
    modelled); its dispatch / combine overlap reaches the predict-batch row; a row without an entry keeps none."""
    src = DOC["sources"]["megatron-bridge"]
    rows = pd.DataFrame(src["rows"], columns=src["columns"])
    for e in src["recipe_settings"]:
        hit = rows[(rows["release"] == e["release"]) & (rows["system"] == e["system"])
                   & (rows["model"] == e["model"]) & (rows["precision"] == e["precision"])]
        assert len(hit) == 1, e
        assert "Megatron-Bridge" in e["cite"], e
        # every entry states something the check uses or records: the full-iteration graph (recorded, not modelled),
        # per-layer scopes, the overlap or the dispatcher
        assert (e.get("cuda_graph_impl") == "full_iteration" or e.get("cuda_graphs") or "moe_overlap" in e
                or e.get("moe_dispatcher")), e
    ok = nemo.published_runs(DOC, ["megatron-bridge"]).ok

    def built(release: str, system: str, model: str) -> dict[str, str]:
        r = ok[(ok["release"] == release) & (ok["system"] == system) & (ok["model"] == model)].iloc[0]
        return nemo.batch_row(r, DOC["models"][r["model_key"]])
    assert built("26.06", "DGX-GB300", "Qwen3_30B_a3B")["moe_overlap"] == "true"
    assert built("26.06", "DGX-GB200", "GPT OSS 120B")["moe_overlap"] == "true"
    assert built("26.06", "DGX-H100", "Qwen3_30B_a3B")["moe_overlap"] == "false"   # its recipe sets it False
    assert built("26.02", "DGX-GB300", "Qwen3_30B_a3B")["moe_overlap"] == "false"  # 26.02's presets leave it unset
    assert built("26.02", "DGX-H100", "Qwen3_235B_a22B")["moe_overlap"] == "true"  # MB_OVERLAP, unchanged


def test_the_recipes_cuda_graph_scopes_reach_their_rows_only_and_remove_host_time():
    """The per-layer CUDA-graph scopes a recipe states (`recipe_settings` cuda_graphs, in the Megatron-Bridge source
    and the cards) reach exactly their rows' predict-batch records, every other row stays eager, and a captured row
    predicts no slower than the same row eager (the captured modules' host share is removed, nothing added)."""
    from predictor.plan.batch import predict_records
    for sid in ("megatron-bridge", "megatron-bridge-cards"):
        src = DOC["sources"][sid]
        rows = pd.DataFrame(src["rows"], columns=src["columns"])
        for e in src.get("recipe_settings", []):
            if e.get("cuda_graphs"):
                hit = rows[(rows["release"] == e["release"]) & (rows["system"] == e["system"])
                           & (rows["model"] == e["model"]) & (rows["precision"] == e["precision"])]
                assert len(hit) == 1 and "@" in e["cite"], e
        ok = nemo.published_runs(DOC, [sid]).ok
        keyed = {(e["release"], e["system"], e["model"], e["precision"]): e.get("cuda_graphs")
                 for e in src.get("recipe_settings", [])}
        for _, r in ok.iterrows():
            want = keyed.get((r["release"], r["system"], r["model"], r["precision"])) or ""
            assert nemo.batch_row(r, DOC["models"][r["model_key"]])["cuda_graphs"] == want
    ok = nemo.published_runs(DOC, ["megatron-bridge"]).ok
    r = ok[(ok["release"] == "26.02") & (ok["system"] == "DGX-B200") & (ok["model"] == "Qwen3_30B_a3B")].iloc[0]
    rec, why = nemo.predictable_record(nemo.batch_row(r, DOC["models"][r["model_key"]]))
    assert not why and rec["cuda_graphs"] == "moe_router+moe_preprocess"
    (graphed,) = predict_records([rec], allow_oom=True)
    (eager,) = predict_records([{**rec, "cuda_graphs": ""}], allow_oom=True)
    assert graphed["step_time_s"] < eager["step_time_s"]


def test_the_recipes_hybridep_dispatcher_reaches_its_rows_only_and_replaces_the_all_to_all_peers():
    """`recipe_settings` moe_dispatcher hybridep (the flex dispatcher with HybridEP, each entry citing it) reaches
    exactly its rows' predict-batch records, every other MoE row keeps alltoall, and on the DeepSeek-V3 GB200 row the
    HybridEP buffer stands in for NCCL's per-peer buffers of its 63 expert-parallel peers (less communication
    memory)."""
    from predictor.plan.batch import predict_records
    for sid in ("megatron-bridge", "megatron-bridge-cards"):
        src = DOC["sources"][sid]
        keyed = {(e["release"], e["system"], e["model"], e["precision"]): e.get("moe_dispatcher")
                 for e in src.get("recipe_settings", [])}
        for e in src.get("recipe_settings", []):
            if e.get("moe_dispatcher"):
                assert e["moe_dispatcher"] == "hybridep" and "hybridep" in e["cite"].lower(), e
        ok = nemo.published_runs(DOC, [sid]).ok
        for _, r in ok.iterrows():
            want = keyed.get((r["release"], r["system"], r["model"], r["precision"])) or ""
            rec = nemo.batch_row(r, DOC["models"][r["model_key"]])
            assert rec["moe_dispatcher"] == (want if r["moe"] else ""), (r["release"], r["system"], r["model"])
    ok = nemo.published_runs(DOC, ["megatron-bridge"]).ok
    r = ok[(ok["release"] == "25.11") & (ok["system"] == "DGX-GB200") & ok["model"].str.startswith("DeepSeekV3")
           & (ok["precision"] == "bf16")].iloc[0]
    rec, why = nemo.predictable_record(nemo.batch_row(r, DOC["models"][r["model_key"]]))
    assert not why and rec["moe_dispatcher"] == "hybridep"
    opts = nemo.recipe_memory_options(r)
    (hyb,) = predict_records([rec], allow_oom=True, memory_options=opts)
    (a2a,) = predict_records([{**rec, "moe_dispatcher": ""}], allow_oom=True, memory_options=opts)
    assert hyb["memory_gib"] < a2a["memory_gib"] - 20

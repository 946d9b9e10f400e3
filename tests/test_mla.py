"""Multi-head latent attention (MLA, docs/mla.md): parameters against the published model sizes and the config-derived
per-layer formula, the operator shapes and tensor-parallel exchanges of Megatron-Core's MLASelfAttention, the
activation memory's dependence on the latent ranks, context-parallel ring bytes, and the refusals of bad input through
the spec, the CLI and predict-batch."""
from __future__ import annotations

import pytest

from predictor.cli.main import main
from predictor.model import params
from predictor.model.errors import InfeasibleConfig
from predictor.model.layout_io import BATCH_COLUMNS, model_from_fields
from predictor.model.presets import get_preset
from predictor.model.specs import Layout, ModelSpec, with_changes
from predictor.regress import features
from predictor.step import decompose as D
from predictor.step import memory
from tests.batch_rows import batch_row

V3 = get_preset("deepseek-v3")


def _cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:   # argparse refusing a flag value
        rc = int(e.code or 0)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# ---- parameters ----------------------------------------------------------------------------------------------
# Published sizes. Totals: DeepSeek-V3 671B (arXiv 2412.19437, abstract; the 14B MTP module is not part of it),
# DeepSeek-V2-Lite 15.7B (arXiv 2405.04434, appendix B), Kimi K2 "1T" (moonshotai/Kimi-K2-Instruct model card, one
# significant figure, hence 5 %). Activated: 37B, 2.4B, 32B, which DeepSeek and Moonshot count without the input
# embedding (a lookup, not a matmul; the output head is counted): our active_params less the embedding table.
# Tolerance 3 %: the activated figures are printed to two significant figures.
@pytest.mark.parametrize("name,total_b,total_rel,active_b", [
    ("deepseek-v3", 671.0, 0.005, 37.0),
    ("deepseek-v2-lite", 15.7, 0.005, 2.4),
    ("kimi-k2", 1000.0, 0.05, 32.0)])
def test_mla_presets_have_their_published_sizes(name, total_b, total_rel, active_b):
    m = get_preset(name)
    assert m.is_mla
    assert m.total_params() / 1e9 == pytest.approx(total_b, rel=total_rel)
    active_wo_embedding = m.active_params() - params.padded_vocab(m.vocab_size) * m.hidden_size
    assert active_wo_embedding / 1e9 == pytest.approx(active_b, rel=0.03)


def test_moonlight_has_its_published_size():
    """moonshotai/Moonlight-16B-A3B: 16B total, 3B activated, each printed to one significant figure (so: within
    0.5B of 16B, and rounding to 3B with or without the input embedding)."""
    m = get_preset("moonlight-16b-a3b")
    assert m.is_mla and m.q_lora_rank is None
    assert abs(m.total_params() / 1e9 - 16.0) < 0.5
    emb = params.padded_vocab(m.vocab_size) * m.hidden_size
    assert round(m.active_params() / 1e9) == 3 and round((m.active_params() - emb) / 1e9) == 3


def test_mla_layer_parameters_follow_the_deepseek_v3_config():
    """Per layer, from DeepSeek-V3's config.json (HF DeepseekV3Attention's modules): q_a_proj 7168 x 1536,
    q_a_layernorm 1536, q_b_proj 1536 x 128*(128+64), kv_a_proj_with_mqa 7168 x (512+64), kv_a_layernorm 512,
    kv_b_proj 512 x 128*(128+128), o_proj 128*128 x 7168; no biases."""
    attn = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168)
    assert params.attention_matmul_params(V3) + params.mla_norm_params(V3) == attn == 187_107_328
    dense = attn + 2 * 7168 + 3 * 7168 * 18432
    assert params.layer_params(V3) == dense
    moe = attn + 2 * 7168 + 7168 * 256 + (256 + 1) * 3 * 7168 * 2048
    assert params.layer_params(V3, moe=True) == moe


def test_mla_tp_splits_the_up_projections_and_keeps_the_down_projections_whole():
    """Megatron-Core: linear_q_down_proj / linear_kv_down_proj are replicated (TELinear 'duplicated') with the latent
    norms; linear_q_up_proj / linear_kv_up_proj column-parallel, linear_proj row-parallel, the shared expert split."""
    split = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168 + 3 * 7168 * 2048
    whole = 7168 * 1536 + 7168 * 576 + 1536 + 512 + 2 * 7168 + 7168 * 256
    assert params.layer_dense_params_per_gpu(V3, 8, moe=True) == split // 8 + whole
    dense_split = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168 + 3 * 7168 * 18432
    assert params.layer_params_per_gpu(V3, 8) == dense_split // 8 + whole - 7168 * 256


def test_mla_without_query_compression_projects_the_query_from_hidden():
    lite = get_preset("deepseek-v2-lite")
    assert lite.q_lora_rank is None
    assert params.mla_down_params(lite) == 2048 * (512 + 64)
    assert params.mla_split_params(lite) == 2048 * 16 * 192 + 512 * 16 * 256 + 16 * 128 * 2048
    assert params.mla_norm_params(lite) == 512


# ---- operators and exchanges ---------------------------------------------------------------------------------
def _mnk(call: D.OpCall) -> tuple[int, int, int]:
    M, N, K, _ = features.gemm_mnk(call.op, features.derived_dims(features.arrays_from_shapes([call.shape])))
    return int(M[0]), int(N[0]), int(K[0])


def _layer(model: ModelSpec, tp: int, b: int, s: int, sp: bool) -> D.Unit:
    topo = (tp, 1, tp) if tp > 1 else (1, 1, 1)
    return D.layer_unit(model, tp, b, s, sp, "none", "bf16", topo, moe=False)


def test_mla_gemms_have_their_own_shapes():
    b, s, tp = 1, 4096, 8
    unit = _layer(V3, tp, b, s, True)
    fwd = [c for c in unit.ops if c.phase == "fwd"]
    gemms = sorted(_mnk(c) for c in fwd if c.op in ("mlp_up", "attn_out_proj", "qkv_proj"))
    expected = sorted([(s // tp, 1536, 7168),            # W_DQ on the sequence-parallel shard, whole
                       (s // tp, 576, 7168),             # W_DKV (kv_lora + rope), whole
                       (s, 128 * 192 // tp, 1536),       # W_UQ, column-parallel
                       (s, 128 * 256 // tp, 512),        # W_UKV, column-parallel
                       (s, 2 * 18432 // tp, 7168),       # the dense MLP's gate + up
                       (s, 7168, 128 * 128 // tp)])      # W_O, row-parallel
    assert gemms == expected
    assert not [c for c in fwd if c.op == "qkv_proj"]
    # the latent RMSNorms on the shard's tokens (q_lora 1536, kv_lora 512) beside the two layer norms
    norms = sorted((c.shape[3], c.count) for c in fwd if c.op == "rmsnorm")
    assert norms == [(512, 1), (1536, 1), (7168, 2)]


def test_mla_flash_attention_carries_the_papers_attention_flops():
    """Q K^T at qk_nope + qk_rope = 192 and P V at v_head_dim = 128 per head: 2*b*s^2*(H/tp)*(192 + 128) FLOPs in the
    forward (non-causal count, as the regressor's work model), and Q, K (192), V, O (128) bytes."""
    b, s, tp = 2, 2048, 4
    fa = [c for c in _layer(V3, tp, b, s, True).ops if c.op == "flash_attn" and c.phase == "fwd"]
    assert len(fa) == 1
    flops, byts = features.op_work("flash_attn", features.arrays_from_shapes([fa[0].shape]), "bf16")
    assert float(flops[0]) == pytest.approx(2 * b * s * s * (128 / tp) * (192 + 128))
    assert float(byts[0]) == pytest.approx(2 * b * s * (128 / tp) * (2 * 192 + 2 * 128))


def test_mla_rope_rotates_the_rope_part_only():
    b, s, tp = 1, 1024, 2
    rope = [c for c in _layer(V3, tp, b, s, False).ops if c.op == "rope" and c.phase == "fwd"]
    assert len(rope) == 1
    elems = features.elements("rope", features.derived_dims(features.arrays_from_shapes([rope[0].shape])))
    assert float(elems[0]) == b * s * (128 / tp) * 64      # of the query's heads / tp heads, 64 dims each
    hr = 128 / tp
    assert rope[0].scale == pytest.approx((hr + 1) / (2 * hr))   # q of hr heads + the one shared key head


def test_mla_tp_exchanges_gather_the_latents_with_sequence_parallelism():
    b, s, tp = 1, 4096, 8
    unit = _layer(V3, tp, b, s, True)
    fwd = sorted((c.collective, c.message_bytes) for c in unit.comms if c.phase == "fwd")
    e = 2
    latents = [("allgather", b * s * w * e) for w in (1536, 512, 64)]
    mlp = [("allgather", b * s * 7168 * e), ("reducescatter", b * s * 7168 * e)]
    assert fwd == sorted([*latents, ("reducescatter", b * s * 7168 * e), *mlp])
    bwd = sorted((c.collective, c.message_bytes) for c in unit.comms if c.phase == "bwd")
    assert bwd == sorted([("reducescatter", n) for _, n in latents] + [("allgather", b * s * 7168 * e), *mlp])


def test_mla_tp_exchanges_without_sequence_parallelism():
    b, s, tp = 1, 2048, 4
    unit = _layer(V3, tp, b, s, False)
    fwd = sorted(c.message_bytes for c in unit.comms if c.phase == "fwd")
    bwd = sorted(c.message_bytes for c in unit.comms if c.phase == "bwd")
    assert all(c.collective == "allreduce" for c in unit.comms)
    assert fwd == [b * s * 7168 * 2] * 2                                  # out projection and MLP down
    assert bwd == sorted([b * s * 512 * 2, b * s * 1536 * 2, b * s * 7168 * 2])   # up-proj inputs, MLP up input


def test_gqa_layers_are_untouched_by_the_mla_branch():
    m = get_preset("llama3-8b")
    unit = _layer(m, 2, 1, 1024, True)
    assert [c.op for c in unit.ops if c.phase == "fwd"][:3] == ["rmsnorm", "qkv_proj", "rope"]
    assert sum(c.count for c in unit.comms if c.phase == "fwd") == 4


def test_mla_cp_ring_sends_the_up_projected_keys_and_values():
    b, s, tp, cp = 1, 8192, 2, 4
    n = D.cp_kv_bytes(V3, tp, b, s, "bf16", cp)
    assert n == b * (s // cp) * (128 // tp) * (192 + 128) * 2
    assert memory.cp_ring_buffer_bytes(V3, s, b, tp, "bf16", cp) == n


# ---- activations -----------------------------------------------------------------------------------------------
def test_mla_activations_grow_with_the_latent_ranks_by_the_saved_latents():
    """Each latent rank unit keeps its norm input and the up projection's input (2 + 2 bytes in bf16) per token,
    split over tp by sequence parallelism."""
    s, b, tp = 4096, 1, 4
    base = memory.activation_bytes_per_layer(V3, s, b, tp, True, "none", "bf16")
    wider = with_changes(V3, kv_lora_rank=V3.kv_lora_rank + 64)
    grown = memory.activation_bytes_per_layer(wider, s, b, tp, True, "none", "bf16")
    assert grown - base == pytest.approx(s * b * 64 * 4 / tp)
    # the up-projected Q, K (192) and V (128) of heads / tp heads and the output (128) kept for flash attention
    more_heads = with_changes(V3, num_heads=256)
    diff = (memory.activation_bytes_per_layer(more_heads, s, b, tp, True, "none", "bf16") - base)
    assert diff == pytest.approx(s * b * (128 / tp) * (192 + 192 + 128 + 128) * 2 + 4 * b * (128 / tp) * s)
    assert memory.activation_bytes_per_layer(V3, s, b, tp, True, "full", "bf16") == s * b * 7168 * 2 / tp


# ---- bad input -------------------------------------------------------------------------------------------------
MLA = dict(attention_kind="mla", q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
           v_head_dim=128)


def _spec(**over) -> ModelSpec:
    return ModelSpec(**{"name": "m", "arch": "llama", "num_layers": 4, "hidden_size": 4096, "num_heads": 32,
                        **MLA, **over})


@pytest.mark.parametrize("over,field", [
    (dict(q_lora_rank=4096), "q_lora_rank"),                       # not below hidden
    (dict(kv_lora_rank=8192), "kv_lora_rank"),
    (dict(kv_lora_rank=None), "kv_lora_rank"),                     # missing with mla
    (dict(v_head_dim=None), "v_head_dim"),
    (dict(qk_rope_head_dim=33), "qk_rope_head_dim"),               # odd
    (dict(qk_nope_head_dim=0), "qk_nope_head_dim"),
    (dict(qk_nope_head_dim=124), "qk_nope_head_dim"),              # 124 + 64 not a multiple of 8
    (dict(attention_kind="latent"), "attention_kind"),
    (dict(attention_kind="gqa"), "q_lora_rank"),                   # MLA fields with gqa
    (dict(num_kv_heads=8), "kv_heads"),                            # GQA fields with mla
    (dict(head_dim=128), "head_dim"),
    (dict(arch="gpt"), "arch"),
])
def test_bad_mla_input_names_the_field_and_the_fix(over, field):
    with pytest.raises(InfeasibleConfig) as e:
        _spec(**over).validate()
    assert e.value.field == field and e.value.fix


PRED = ["predict", "--platform", "dgx-h100"]
CUSTOM = ["--arch", "llama", "--layers", "4", "--hidden", "4096", "--heads", "32", "--num-gpus", "8", "--tp", "8",
          "--sequence-parallel", "--global-batch", "8", "--seq-len", "4096"]


@pytest.mark.parametrize("extra,field", [
    (["--attention-kind", "mla", "--kv-lora-rank", "512", "--qk-nope-head-dim", "128", "--qk-rope-head-dim", "63",
      "--v-head-dim", "128"], "qk_rope_head_dim"),
    (["--attention-kind", "mla", "--qk-nope-head-dim", "128", "--qk-rope-head-dim", "64", "--v-head-dim", "128"],
     "kv_lora_rank"),
    (["--kv-lora-rank", "512"], "kv_lora_rank"),
    (["--attention-kind", "sparse"], "attention_kind"),
])
def test_cli_bad_mla_input_exits_2_naming_the_field(capsys, extra, field):
    rc, out, err = _cli(capsys, [*PRED, *CUSTOM, *extra])
    assert rc == 2 and err.startswith(f"error: {field}:"), err
    assert "Traceback" not in err and "Fix:" in err and out == ""


def test_cli_flags_describe_the_same_model_as_the_preset(capsys):
    # etp 1 as DeepSeek-V3 recipes run it (Megatron-Core's default etp = tp would need tp x ep = 64 ranks per stage)
    lay = ["--num-gpus", "64", "--tp", "8", "--pp", "8", "--ep", "8", "--etp", "1", "--sequence-parallel",
           "--global-batch", "64",
           "--seq-len", "4096", "--recompute", "full", "--zero-stage", "1", "--allow-oom", "--json"]
    rc, out_p, err = _cli(capsys, [*PRED, "--model", "deepseek-v3", *lay])
    assert rc == 0, err
    flags = ["--arch", "llama", "--layers", "61", "--hidden", "7168", "--heads", "128", "--ffn-hidden", "18432",
             "--vocab", "129280", "--num-experts", "256", "--top-k", "8", "--moe-ffn-hidden", "2048",
             "--shared-experts", "1", "--dense-layers", "3", "--attention-kind", "mla", "--q-lora-rank", "1536",
             "--kv-lora-rank", "512", "--qk-nope-head-dim", "128", "--qk-rope-head-dim", "64", "--v-head-dim", "128"]
    rc, out_f, err = _cli(capsys, [*PRED, *flags, *lay])
    assert rc == 0, err
    import json
    p, f = json.loads(out_p), json.loads(out_f)
    assert f["step_time_s"] == pytest.approx(p["step_time_s"], rel=1e-12)
    # and it is not the GQA reading of the same shapes
    rc, out_g, _ = _cli(capsys, [*PRED, *flags[:-12], *lay])
    assert rc == 0 and json.loads(out_g)["step_time_s"] != pytest.approx(p["step_time_s"], rel=1e-3)


def test_attention_kind_gqa_drops_a_presets_mla_fields():
    m = model_from_fields({"model": "deepseek-v3", "attention_kind": "gqa"})
    assert not m.is_mla and m.q_lora_rank is None and m.kv_lora_rank is None
    with pytest.raises(InfeasibleConfig) as e:
        model_from_fields({"model": "deepseek-v3", "attention_kind": "gqa", "kv_lora_rank": "256"})
    assert e.value.field == "kv_lora_rank"
    assert model_from_fields({"model": "deepseek-v3", "kv_lora_rank": "256"}).kv_lora_rank == 256


def test_predict_batch_reads_the_mla_columns(tmp_path):
    import pandas as pd
    cols = [*BATCH_COLUMNS, "model", "ep", "etp", "num_experts", "top_k", "moe_ffn_hidden", "shared_experts",
            "dense_layers",
            "attention_kind", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"]
    row = {"platform": "dgx-h100", "seq_len": "4096", "num_gpus": "64", "tp": "8", "pp": "8", "dp": "1", "ep": "8",
           "etp": "1",
           "micro_batch": "1", "global_batch": "64", "vpp": "1", "schedule": "1f1b", "recompute": "full",
           "sequence_parallel": "true", "zero_stage": "1", "precision": "bf16"}
    mla = {"arch": "llama", "layers": "61", "hidden": "7168", "heads": "128", "ffn_hidden": "18432",
           "vocab": "129280", "num_experts": "256", "top_k": "8", "moe_ffn_hidden": "2048", "shared_experts": "1",
           "dense_layers": "3", "attention_kind": "mla", "q_lora_rank": "1536", "kv_lora_rank": "512",
           "qk_nope_head_dim": "128", "qk_rope_head_dim": "64", "v_head_dim": "128"}
    rows = [batch_row(row, case_id="preset", model="deepseek-v3"), batch_row({**row, **mla}, case_id="fields"),
            batch_row({**row, **mla}, case_id="odd", qk_rope_head_dim="65")]
    inp, out = tmp_path / "in.csv", tmp_path / "out.csv"
    pd.DataFrame(rows, columns=cols).to_csv(inp, index=False)
    assert main(["predict-batch", "--input", str(inp), "--output", str(out), "--quiet", "--allow-oom"]) == 0
    res = pd.read_csv(out, keep_default_na=False, dtype=str).set_index("case_id")
    assert res.loc["preset", "error"] == "" and res.loc["fields", "error"] == "", res["error"].tolist()
    assert float(res.loc["fields", "step_time_s"]) == pytest.approx(float(res.loc["preset", "step_time_s"]),
                                                                    rel=1e-12)
    assert res.loc["odd", "error"].startswith("qk_rope_head_dim:")


def test_a_deepseek_v3_layout_predicts_on_a_gpu_platform():
    from predictor.plan.predict import get_predictor
    lay = Layout(num_gpus=1024, tp=2, pp=16, dp=32, ep=64, etp=1, sequence_parallel=True, seq_len=4096,
                 global_batch=8192, recompute="full", zero_stage=1)
    p = get_predictor("dgx-h100").predict(V3, lay)
    assert p.step_time_s > 0 and p.memory.peak_gib > 0


def test_mla_model_flops_reproduce_megatron_bridges_published_deepseek_v3_flops_per_token():
    """Megatron-Bridge's 25.11 table prints, for DeepSeek-V3 without MTP at seq 4096, Model TFLOP/s/GPU and
    tokens/s/GPU (predictor/catalog/independent_nemo.json, never fitted); their ratio is the model FLOPs per token of
    Megatron's formula, which counts causal attention at half (Q K^T and P V at MLA's 192 / 128 head dimensions).
    Our model FLOPs (matmuls of the MLA shapes, the MoE's active experts, the head; attention not discounted) with
    the causal half of the attention taken off reproduce it within 1 %."""
    import pandas as pd

    from predictor.checks import independent_nemo as nemo
    from predictor.plan.predict import model_flops_per_step
    runs = nemo.published_runs(nemo.load()).ok
    rows = runs[runs["model"] == "DeepSeekV3 (w/o MTP)"]
    assert len(rows) >= 2
    published = float((pd.to_numeric(rows["tflops_per_gpu"]) * 1e12 / rows["tokens_per_s_per_gpu"]).median())
    s = 4096
    assert (rows["seq_len"] == s).all()
    ours = model_flops_per_step(V3, Layout(num_gpus=1, seq_len=s, global_batch=1)) / s
    causal_half = 3 * V3.num_layers * s * V3.num_heads * (V3.qk_head_size + V3.v_head_size)   # fwd + bwd, per token
    assert ours - causal_half == pytest.approx(published, rel=0.01)
    # the GQA reading of the same shapes (head dim 7168 / 128 = 56, KV heads = heads) misses it by 5 %
    gqa = with_changes(V3, attention_kind="gqa", q_lora_rank=None, kv_lora_rank=None, qk_nope_head_dim=None,
                       qk_rope_head_dim=None, v_head_dim=None)
    ours_gqa = model_flops_per_step(gqa, Layout(num_gpus=1, seq_len=s, global_batch=1)) / s
    assert abs(ours_gqa - 3 * 61 * s * 128 * 112 - published) / published > 0.04


@pytest.mark.parametrize("name,platform,n,gb,seq,precision", [
    ("deepseek-v2-lite", "dgx-h100", 32, 128, 4096, "bf16"),     # MLA without query compression
    ("deepseek-v3", "dgx-b200", 256, 1024, 4096, "fp8"),         # MLA with compression, FP8 GEMMs
    ("llama4-maverick", "dgx-h100", 64, 256, 8192, "bf16"),      # interleaved MoE layers
    ("gpt-oss-20b", "dgx-h100", 32, 128, 8192, "bf16"),          # sliding-window attention
])
def test_search_and_predict_are_one_engine_for_the_new_models(name, platform, n, gb, seq, precision):
    """The engine's search table equals Predictor.predict (step time, breakdown, memory) on random layouts of the
    new models (tests/test_engine.py's check)."""
    from tests.test_engine import _search_and_predict_agree
    _search_and_predict_agree(name, platform, n, gb, seq, "megatron", precision)


def test_mla_fp8_weight_copies_keep_the_down_projections_whole():
    from predictor.step import fp8
    down = 7168 * 1536 + 7168 * 576
    split = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168
    assert fp8.layer_gemm_params_per_gpu(V3, 8) == pytest.approx(down + (split + 3 * 7168 * 18432) / 8)
    moe = fp8.layer_gemm_params_per_gpu(V3, 8, moe=True, ep=64)
    assert moe == pytest.approx(down + (split + 3 * 7168 * 2048) / 8 + 256 // 64 * 3 * 7168 * 2048)


def test_unfused_mla_attention_scores_at_qk_and_context_at_v():
    unfused = with_changes(V3, attention_impl="unfused")
    ops = [c for c in _layer(unfused, 2, 1, 1024, False).ops if c.phase == "fwd"]
    sc = next(c for c in ops if c.op == "attn_scores")
    ctx = next(c for c in ops if c.op == "attn_context")
    assert _bmm(sc) == (1024, 1024, 192, 64) and _bmm(ctx) == (1024, 128, 1024, 64)


def _bmm(call: D.OpCall) -> tuple[int, int, int, int]:
    M, N, K, B = features.gemm_mnk(call.op, features.derived_dims(features.arrays_from_shapes([call.shape])))
    return int(M[0]), int(N[0]), int(K[0]), int(B[0])


def test_mla_alignment_checks_its_own_head_dimensions():
    """hidden / heads means nothing to MLA (7000 / 128 is not whole): the alignment check looks at the query / key
    and value head dimensions instead, and the spec accepts such a hidden size."""
    from predictor.step.alignment import unaligned_dims_at
    m = with_changes(V3, hidden_size=7000)
    m.validate()
    assert unaligned_dims_at(m, 1) == {}
    assert unaligned_dims_at(with_changes(V3, hidden_size=7004), 1) == {"hidden per TP rank": 7004}

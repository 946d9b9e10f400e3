import pytest

from predictor.hardware.platforms import get_platform
from predictor.model.ops import SHAPE_COLUMNS
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.model.stages import split_layers
from predictor.plan.predict import model_flops_per_step
from predictor.regress import features
from predictor.step.decompose import decompose, group_topology

GEMMS = {"qkv_proj", "attn_out_proj", "mlp_up", "mlp_down", "lm_head", "flash_attn", "attn_scores", "attn_context"}
DGX = get_platform("dgx-a100-80gb")


def _fwd_gemm_flops(plans, precision="bf16"):
    import pandas as pd
    total = 0.0
    for p in plans:
        for c in p.ops:
            if c.phase == "fwd" and c.op in GEMMS:
                f, _ = features.op_work(c.op, pd.DataFrame([c.shape], columns=list(SHAPE_COLUMNS)), precision)
                total += float(f[0]) * c.count
    return total


@pytest.mark.parametrize("name", ["llama3-8b", "gpt3-1.3b"])
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 2), (4, 1)])
def test_forward_matmul_flops_are_conserved_across_tp_and_pp(name, tp, pp):
    """Summed over the GPUs of one model replica, forward matmul FLOPs of one micro-batch
    equal one third of the model FLOPs of that micro-batch, however the model is split."""
    model = get_preset(name)
    L = Layout(num_gpus=tp * pp, tp=tp, pp=pp, dp=1, micro_batch=2, global_batch=2, seq_len=1024)
    plans = decompose(model, L, DGX)
    per_replica = _fwd_gemm_flops(plans) * tp
    expected = model_flops_per_step(model, L) / 3
    # flash attention is counted non-causal like the model FLOPs; allow for vocab padding by tp
    assert per_replica == pytest.approx(expected, rel=0.01)


def test_edge_stages_carry_embedding_and_head():
    model = get_preset("llama2-7b")
    L = Layout(num_gpus=4, pp=4, micro_batch=1, global_batch=8, seq_len=1024)
    plans = decompose(model, L, DGX)
    ops = [{c.op for c in p.ops} for p in plans]
    assert "embedding" in ops[0] and "embedding" not in ops[1]
    assert {"lm_head", "cross_entropy"} <= ops[3] and "lm_head" not in ops[2]
    assert [p.layers for p in plans] == [8, 8, 8, 8]
    assert plans[0].params_per_gpu > plans[1].params_per_gpu


def test_split_layers_puts_remainder_in_the_middle():
    assert split_layers(30, 4) == [7, 8, 8, 7]
    assert sum(split_layers(126, 16)) == 126


def test_recompute_and_sp_change_the_calls():
    model = get_preset("llama2-7b")
    base = dict(num_gpus=4, tp=4, micro_batch=1, global_batch=1, seq_len=2048)
    none = decompose(model, Layout(**base), DGX)[0]
    full = decompose(model, Layout(**base, recompute="full"), DGX)[0]
    sp = decompose(model, Layout(**base, sequence_parallel=True), DGX)[0]
    assert not any(c.phase == "recompute" for c in none.ops)
    rec = sum(c.count for c in full.ops if c.phase == "recompute")
    fwd = sum(c.count for c in full.ops if c.phase == "fwd" and c.part == "layer")
    assert rec == fwd
    assert {c.collective for c in none.comms if c.group == "tp"} == {"allreduce"}
    assert {"allgather", "reducescatter"} <= {c.collective for c in sp.comms if c.group == "tp"}
    # SP norms run on seq / tp tokens
    norm = next(c for c in sp.ops if c.op == "rmsnorm")
    assert norm.shape[SHAPE_COLUMNS.index("seq")] == 512


def test_group_topology_follows_megatron_rank_order():
    L = Layout(num_gpus=64, tp=8, pp=2, dp=4, micro_batch=1, global_batch=4)
    assert group_topology(DGX, L, "tp") == (8, 1, 8)
    assert group_topology(DGX, L, "dp") == (4, 4, 1)
    assert group_topology(DGX, L, "pp") == (2, 2, 1)
    L2 = Layout(num_gpus=8, tp=2, pp=1, dp=4, micro_batch=1, global_batch=4)
    assert group_topology(DGX, L2, "dp") == (4, 1, 4)


def test_zero_stages_shard_optimizer_and_change_dp_traffic():
    model = get_preset("llama2-7b")
    base = dict(num_gpus=8, dp=8, micro_batch=1, global_batch=8, seq_len=1024)
    z0 = decompose(model, Layout(**base), DGX)[0]
    z1 = decompose(model, Layout(**base, zero_stage=1), DGX)[0]
    p0 = z0.step_ops[0].shape[SHAPE_COLUMNS.index("params")]
    p1 = z1.step_ops[0].shape[SHAPE_COLUMNS.index("params")]
    assert p1 == pytest.approx(p0 / 8, rel=0.01)
    assert [c.collective for c in z0.step_comms] == ["allreduce"]
    assert {c.collective for c in z1.step_comms} == {"reducescatter", "allgather"}


def test_gradient_accumulation_pass_covers_the_gradients_each_rank_holds():
    """The accumulation pass of each chunk reads and writes every gradient the GPU holds (its shard under ZeRO-3), in
    the layout's gradient bytes; Megatron's fused weight-gradient GEMM needs none on a GPU, but not on a CPU."""
    model = get_preset("llama3-8b")
    base = dict(num_gpus=8, tp=2, pp=2, dp=2, micro_batch=1, global_batch=8, seq_len=2048)

    def elements(plan):   # the res_add elements, in gradient elements (the call's scale = gradient / add bytes)
        return sum(c.shape[SHAPE_COLUMNS.index("seq")] * c.shape[SHAPE_COLUMNS.index("hidden")] * c.count
                   for c in plan.accum_ops)

    assert all(not p.accum_ops for p in decompose(model, Layout(**base), DGX))
    plans = decompose(model, Layout(**base, framework="megatron-deepspeed"), DGX)
    for p in plans:
        assert {(c.op, c.part, c.phase) for c in p.accum_ops} == {("res_add", "grad_accum", "accum")}
        assert {c.scale for c in p.accum_ops} == {2.0}              # fp32 gradients of a bf16 model
        assert elements(p) == pytest.approx(p.params_per_gpu, rel=0.01)
    bf16 = decompose(model, Layout(**base, framework="ddp", grad_reduce_in_fp32=False), DGX)
    assert {c.scale for p in bf16 for c in p.accum_ops} == {1.0}
    z3 = decompose(model, Layout(**dict(base, pp=1, dp=4), framework="fsdp", zero_stage=3), DGX)[0]
    assert elements(z3) == pytest.approx(z3.params_per_gpu / 4, rel=0.01)
    cpu = decompose(model, Layout(num_gpus=1, global_batch=2, seq_len=128, precision="fp32"), get_platform("cpu-2t"))
    assert cpu[0].accum_ops and {c.scale for c in cpu[0].accum_ops} == {1.0}

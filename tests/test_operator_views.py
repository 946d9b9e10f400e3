"""Per-micro-batch and once-per-step operators are kept apart (#36): the DP reduce-scatter of a ZeRO-1 step is not
a per-micro-batch operator, and a collective's group tag ([dp], [tp]) survives the CLI's table."""
from __future__ import annotations

from predictor.cli.main import main
from predictor.model.presets import get_preset
from predictor.model.specs import Layout
from predictor.plan.predict import PER_MICRO_BATCH, PER_STEP, get_predictor
from predictor_ui import charts

LAYOUT = Layout(num_gpus=16, tp=2, dp=8, global_batch=128, zero_stage=1, seq_len=2048, sequence_parallel=True)


def _pred():
    return get_predictor("dgx-h100").predict(get_preset("llama3-8b"), LAYOUT, timeline=False)


def test_every_operator_row_says_whether_it_runs_per_micro_batch_or_per_step():
    ops = _pred().ops
    assert set(ops["per"]) == {PER_MICRO_BATCH, PER_STEP}
    step = ops[ops["per"] == PER_STEP]
    assert {"optimizer", "reducescatter[dp]"} <= set(step["op"])
    assert (step["category"].isin(["dp_comm", "optimizer"])).all()
    assert not ops[(ops["per"] == PER_MICRO_BATCH) & (ops["category"] == "optimizer")].shape[0]


def test_the_operators_chart_keeps_per_step_calls_off_the_per_micro_batch_axis():
    ops = _pred().ops
    mb = charts.ops_frame(ops, 0, 1000)
    step = charts.ops_frame(ops, 0, 1000, per="step")
    assert "reducescatter[dp]" not in set(mb["op"]) and "reducescatter[dp]" in set(step["op"])
    assert "optimizer" not in set(mb["op"])


def test_the_cli_tables_keep_the_group_tags_and_split_per_step(capsys):
    assert main(["predict", "--platform", "dgx-h100", "--model", "llama3-8b", "--num-gpus", "16", "--tp", "2",
                 "--dp", "8", "--global-batch", "128", "--zero-stage", "1", "--sequence-parallel"]) == 0
    out = capsys.readouterr().out
    per_mb, per_step = out.split("Once per step on the critical stage", 1)
    per_mb = per_mb.split("Top operators on the critical stage", 1)[1]
    assert "[tp]" in per_mb and "reducescatter[dp]" not in per_mb
    assert "reducescatter[dp]" in per_step and "optimizer" in per_step

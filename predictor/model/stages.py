"""Layers per pipeline chunk: the layout's own split, or the default one (Megatron-Core's, for the interleaved
schedule). Pure functions of a model and a layout (typed only), so the layout's own checks can use them."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from predictor.model.specs import Layout, ModelSpec


def split_layers(num_layers: int, chunks: int) -> list[int]:
    """As even as possible; the remainder goes to the middle chunks, since the first and
    last carry the embedding and the LM head + loss."""
    base, rem = divmod(num_layers, chunks)
    counts = [base] * chunks
    order = sorted(range(chunks), key=lambda i: (i in (0, chunks - 1), abs(i - (chunks - 1) / 2)))
    for i in order[:rem]:
        counts[i] += 1
    return counts


def interleaved_split(num_layers: int, chunks: int) -> list[int] | None:
    """The default layers per chunk of the interleaved schedule (Megatron-Core needs equal chunks): an even split,
    or, where the layers do not divide but layers + 2 do, Megatron-Core's account-for-embedding / account-for-loss
    split (--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split: the embedding and the
    loss count as one layer each, so the first and the last chunk hold one transformer layer fewer; e.g. Llama 3.1
    405B's 126 layers in 64 chunks: 1, 2, ..., 2, 1). None where neither applies."""
    if num_layers % chunks == 0:
        return [num_layers // chunks] * chunks
    per, rem = divmod(num_layers + 2, chunks)
    if rem or per < 2 or chunks < 2:
        return None
    counts = [per] * chunks
    counts[0] -= 1
    counts[-1] -= 1
    return counts


def chunk_layer_counts(model: ModelSpec, layout: Layout) -> list[int]:
    """Layers of each pipeline chunk in pipeline order (the layout's split, or the default one: as even as possible,
    interleaved chunks by `interleaved_split`)."""
    if layout.stage_layers:
        return [int(n) for n in layout.stage_layers]
    chunks = layout.pp * layout.vpp
    if layout.schedule == "interleaved":
        split = interleaved_split(model.num_layers, chunks)
        if split is not None:
            return split
    return split_layers(model.num_layers, chunks)


# --- zero-bubble and bidirectional pipeline schedules (docs/schedules.md) ---
# zb-h1: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024, arXiv 2401.10241), section 3.1;
# zb-v: Qi et al., "Pipeline Parallelism with Controllable Memory" (arXiv 2405.15362), 2 chunks per GPU in a V;
# dualpipe: DeepSeek-V3 technical report (arXiv 2412.19437) section 3.2.1, Table 2;
# dualpipe-v: DualPipeV, the "cut-in-half" DualPipe (github.com/deepseek-ai/DualPipe), 2 chunks per GPU in a V.
ZB_SCHEDULES = ("zb-h1", "zb-v", "dualpipe", "dualpipe-v")
V_SCHEDULES = ("zb-v", "dualpipe-v")   # two model chunks per GPU, the first going down the ranks, the second back


def chunk_rank(schedule: str, pp: int, chunk_index: int) -> int:
    """The pipeline rank that runs chunk `chunk_index` (chunks in model order): zb-v / dualpipe-v place two chunks
    per rank in a V (chunk g on rank g going down, chunk 2pp-1-g coming back); every other schedule chunk g on
    rank g % pp (DualPipe's second copy, chunk g on rank pp-1-g, is predictor.step.compose.chunk_rank_matrix's)."""
    if schedule in V_SCHEDULES:
        return chunk_index if chunk_index < pp else 2 * pp - 1 - chunk_index
    return chunk_index % pp

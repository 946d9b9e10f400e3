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

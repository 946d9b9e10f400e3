"""Mixture-of-Experts layers as Megatron-Core runs them (alltoall or allgather token dispatcher, expert tensor
parallelism etp).

One MoE layer of one micro-batch on one GPU replaces the dense MLP by:

  router         [T, hidden] x [hidden, experts] logits, softmax, top-k       `moe_router`, T tokens
  permute        the T * top_k routed rows gathered into expert order          `moe_permute`
  dispatch       all-to-all over the ep ranks of the expert-parallel group     `alltoall[ep]`
  (sort)         rows re-sorted by local expert when a rank holds several      `moe_permute` again
  experts        per local expert: up (gate + up for SwiGLU), activation, down  `mlp_up`, `swiglu`/`gelu`,
                 on that expert's rows (split over etp ranks; 1: whole experts)   `mlp_down` x local experts
  (unsort)       back to source-rank order                                     `moe_unpermute` again
  combine        all-to-all back                                               `alltoall[ep]`
  unpermute      rows weighted by the router probabilities and summed          `moe_unpermute`
  shared experts a dense MLP of shared_experts * shared_ffn width, split over tp (with its own sequence-parallel
                 all-gather and reduce-scatter)

Tokens per GPU: T = micro_batch * seq_len / cp, divided by tp (a MoE model with tp > 1 runs sequence
parallelism, each tensor-parallel rank routing its own share). Each rank sends T * top_k rows and, on average,
receives as many; the step waits for the busiest rank of the expert-parallel group, which receives
`imbalance` times the mean. With `moe_imbalance` unset the imbalance is modelled for random routing: a
rank's load is binomial over the ep ranks, and the expected maximum of ep such loads is about
mean + sqrt(2 ln ep) standard deviations. Learned routers are less balanced than random ones early in training and
with weak load-balancing losses; `moe_imbalance` states a measured figure. A capacity factor caps every expert at
capacity_factor x its mean load (tokens beyond it are dropped, Megatron-Core's token-drop mode), so it caps the
imbalance too. Grouped GEMMs are timed as one GEMM per local expert on its rows: a grouped GEMM kernel does the
same work in one launch (the per-expert GEMM time is an upper bound for it where experts get few rows).

The allgather dispatcher (Layout.moe_dispatcher, Megatron-Core's MoEAllGatherTokenDispatcher) replaces permute,
dispatch, (sort), (unsort), combine and unpermute by: all-gather of the T tokens' hidden states, routing
probabilities and routing map over the etp x ep ranks (`tp_ep_group`), one permutation of the rows routed to the
local experts out of the gathered etp x ep x T tokens, the experts, an un-permutation (scatter-add) into a zeroed
[etp x ep x T, hidden] tensor, and its reduce-scatter back to the T tokens (predictor.step.decompose._moe_calls).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from predictor.model.specs import ModelSpec


@dataclass(frozen=True)
class Routing:
    """What one MoE layer moves and computes on the busiest GPU of its expert-parallel group, per micro-batch."""
    tokens: int              # tokens this GPU routes (T)
    routed_rows: int         # T * top_k: rows it permutes and sends
    local_experts: int       # num_experts / ep
    imbalance: float         # busiest rank's rows over the mean (>= 1)
    rows_per_expert: int     # rows each local expert computes on the busiest rank
    permutes: int            # permute (and unpermute) passes: 2 when rows are re-sorted by local expert after the
    #                          all-to-all (ep > 1 and several local experts), else 1
    # --- expert tensor parallelism ---
    etp: int = 1             # expert tensor-parallel degree: the rows received are all-gathered over etp ranks, each
    #                          computing every gathered row on 1/etp of each expert's width
    received_rows: int = 0   # rows the busiest rank receives from the all-to-all (before the etp all-gather)
    # --- the token dispatcher (Layout.moe_dispatcher) ---
    dispatcher: str = "alltoall"
    gathered_rows: int = 0   # allgather with etp x ep > 1: the tokens all-gathered over the etp x ep ranks,
    #                          etp x ep x T (0 otherwise: no gather)
    sent_rows: int = 0       # rows this GPU sends in the dispatch (and receives back in the combine), on average:
    #                          T x top_k with alltoall; T x the expected distinct destination ranks per token with
    #                          hybridep (`hybridep_sent_rows`)

    @property
    def local_rows(self) -> int:
        """Rows the busiest rank's local experts compute (rows_per_expert x local_experts)."""
        return self.rows_per_expert * self.local_experts


def tokens_per_gpu(micro_batch: int, seq_len: int, cp: int, tp: int, sequence_parallel: bool) -> int:
    """Tokens one GPU routes in a MoE layer: its share of the micro-batch after context and sequence parallelism."""
    t = micro_batch * (seq_len // max(cp, 1))
    return t // tp if sequence_parallel and tp > 1 else t


def modelled_imbalance(rows_per_rank: float, ep: int) -> float:
    """The busiest of `ep` ranks' load over the mean for uniformly random routing: rows land on a rank with
    probability 1/ep (binomial over ep x rows_per_rank rows); the expected maximum of ep loads is about
    mean + sqrt(2 ln ep) standard deviations. 1 with one rank (the rank computes every row whatever the split)."""
    if ep <= 1 or rows_per_rank <= 0:
        return 1.0
    sd_over_mean = math.sqrt((1.0 - 1.0 / ep) / rows_per_rank)
    return 1.0 + math.sqrt(2.0 * math.log(ep)) * sd_over_mean


def routing(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, cp: int, ep: int,
            sequence_parallel: bool, etp: int = 1, dispatcher: str = "alltoall") -> Routing:
    """The routing of one MoE layer (see the module docstring). Expert tensor parallelism (`etp` > 1, Megatron-Core's
    alltoall dispatcher with expert_tensor_parallel_size > 1, megatron/core/transformer/moe/token_dispatcher.py):
    after the all-to-all over the ep ranks the received rows are all-gathered over the etp ranks, so each rank's
    local experts compute etp x the rows it received, each on 1/etp of the expert's width (the same FLOPs); the
    busiest expert set's load is binomial over the etp x T x top_k rows the etp group routes to it.

    `dispatcher` allgather (MoEAllGatherTokenDispatcher): every rank all-gathers the T tokens of each of the etp x ep
    ranks of its tp_ep group (`gathered_rows` = etp x ep x T) and permutes out, in one pass, the rows routed to its
    local experts: the same rows as the alltoall dispatcher's (etp x T x top_k on average, the busiest rank
    `imbalance` times that), so the expert work and the imbalance are the same; one permutation (no sort by local
    expert, `permutes` 1). With etp x ep = 1 it gathers nothing and runs as the alltoall dispatcher does."""
    k = model.top_k or 1
    t = tokens_per_gpu(micro_batch, seq_len, cp, tp, sequence_parallel)
    rows = t * k
    e = max(etp, 1)
    local = max(model.num_experts // max(ep, 1), 1)
    imb = model.moe_imbalance if model.moe_imbalance is not None else modelled_imbalance(rows * e, ep)
    if model.capacity_factor is not None:
        imb = min(imb, float(model.capacity_factor))
    per_expert = max(1, math.ceil(e * rows * imb / local))
    gathered = e * max(ep, 1) * t if dispatcher == "allgather" and e * max(ep, 1) > 1 else 0
    if dispatcher == "hybridep":   # permutations inside the dispatch / combine kernels: no permute passes of their own
        permutes, sent = 0, hybridep_sent_rows(t, k, model.num_experts, ep)
    else:
        permutes, sent = (1 if gathered else (2 if ep > 1 and local > 1 else 1)), rows
    return Routing(t, rows, local, imb, per_expert, permutes, e, int(math.ceil(rows * imb)), dispatcher, gathered,
                   sent)


def expected_distinct_ranks(top_k: int, num_experts: int, ep: int) -> float:
    """Expected number of the ep ranks a token's top_k distinct experts land on, the experts drawn uniformly at random
    without replacement and spread evenly, num_experts / ep per rank: ep x (1 - C(E - E/ep, k) / C(E, k))."""
    if ep <= 1:
        return 1.0
    per_rank = num_experts // ep
    miss = math.comb(num_experts - per_rank, top_k) / math.comb(num_experts, top_k)
    return ep * (1.0 - miss)


def hybridep_sent_rows(tokens: int, top_k: int, num_experts: int, ep: int) -> int:
    """Rows the HybridEP dispatch sends: each token once per destination rank, not once per expert (its routing map
    is expanded to [tokens, ranks, local experts] and the kernel writes a token's row into a destination rank's buffer
    once, that rank's own permutation copying it per local expert: DeepEP hybrid-ep, Megatron-Core fused_a2a.py
    HybridEPDispatch 'permute + dispatch a2a + permute'; the receive buffer holds max_num_of_tokens_per_rank x ranks
    token rows, NVLCoordinator.allocate_dispatch_buffers). For random routing the mean is T x
    expected_distinct_ranks; the busiest rank's share is scaled by the same imbalance as the rows it computes."""
    if ep <= 1:
        return tokens * top_k
    return int(math.ceil(tokens * expected_distinct_ranks(top_k, num_experts, ep)))


def routing_note(model: ModelSpec, layout: Any) -> str:
    """What a MoE prediction rests on, said with it: the routed rows, the imbalance and where it comes from."""
    etp = layout.expert_tp
    r = routing(model, layout.micro_batch, layout.seq_len, layout.tp, layout.cp, layout.ep, layout.sequence_parallel,
                etp, layout.moe_dispatcher)
    basis = "as given" if layout.etp is not None else f"unset: the {layout.framework} default"
    return (f"MoE: {r.tokens:,} tokens x top-{model.top_k} per GPU and micro-batch, {r.local_experts} of "
            f"{model.num_experts} experts per GPU (ep {layout.ep}), the busiest rank computing {r.imbalance:.3f}x the "
            f"mean rows; {imbalance_basis(model)}. Grouped expert GEMMs are timed as one GEMM per local expert."
            + (f" Expert tensor parallelism {etp} ({basis}): each expert's fc1 / fc2 split over {etp} ranks, the "
               "dispatched rows all-gathered over them and the expert output reduce-scattered back."
               if etp > 1 else
               (f" Experts whole on each rank (expert tensor parallelism 1, {basis}), not split over the tp "
                f"{layout.tp} ranks." if layout.tp > 1 else ""))
            + (" Dispatch / combine overlapped with the other micro-batch's compute (combined 1F1B)."
               if getattr(layout, "moe_overlap", False) else "")
            + (f" hybridep dispatcher (Megatron-Core flex, HybridEP backend): the permutations run inside its "
               f"dispatch / combine kernels (no permute passes of their own) and each token goes once per destination "
               f"rank, {r.sent_rows / max(r.tokens, 1):.2f} ranks on average for random routing instead of "
               f"{model.top_k} copies; its kernels are timed as the all-to-all of those rows (derived: the kernels "
               "themselves are not sampled)." if r.dispatcher == "hybridep" else "")
            + (f" allgather token dispatcher: the {r.tokens:,} tokens of each of the {r.gathered_rows // r.tokens} "
               "etp x ep ranks all-gathered (hidden states, routing probabilities and map), the expert output "
               "reduce-scattered back." if r.gathered_rows else
               " allgather token dispatcher (etp x ep = 1: nothing gathered)."
               if r.dispatcher == "allgather" else ""))


def imbalance_basis(model: ModelSpec) -> str:
    """How the expert load imbalance of a prediction was set (said with every MoE prediction)."""
    if model.moe_imbalance is not None:
        return f"expert load imbalance {model.moe_imbalance:g} as given"
    cap = f", capped by capacity factor {model.capacity_factor:g}" if model.capacity_factor is not None else ""
    return (f"expert load imbalance modelled for random routing{cap} (learned routers can be less balanced: "
            "set moe_imbalance to a measured figure)")

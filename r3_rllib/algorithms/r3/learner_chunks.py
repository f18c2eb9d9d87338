"""How a learner rank splits its share of a minibatch into micro-batches (one forward/backward pass each).

Every rank must run the same number of passes: FSDP2's collectives (and the replicated learners' gradient average)
line up pass by pass, so a rank with fewer chunks gets empty ones, and an empty chunk still runs one pass on a
dummy row weighted 0 (:func:`chunk_or_dummy`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from r3_rllib.algorithms.r3.learner_memory import tokens_per_pass
from r3_rllib.core.batching import row_count_chunks, token_budget_chunks
from r3_rllib.types import TrainingBatch


class MicroBatches:
    """The micro-batches of rank ``rank`` of ``world``: ``micro_batch_size`` rows, or the ``micro_batch_max_tokens``
    budget; a batch with deferred ranked groups is split by ``ranked`` (learner_ranking.py: its groups stay
    whole)."""

    def __init__(self, config: Any, ranked: Any, *, rank: int, world: int, device: Any) -> None:
        self.config, self.ranked = config, ranked
        self.rank, self.world, self.device = rank, world, device

    def chunks(self, mb: np.ndarray, batch: TrainingBatch) -> list[np.ndarray]:
        """This rank's rows of minibatch ``mb`` (indices into ``batch``), split; the same count on every rank."""
        local = mb[self.rank :: self.world]
        budget = tokens_per_pass(self.config.micro_batch_max_tokens, self.config.model_path)
        if batch.ranking is not None:
            return self.ranked.chunks(mb, batch, budget)
        if not budget:
            return row_count_chunks(local, len(mb), self.world, self.config.micro_batch_size)
        chunks = [local[c] for c in token_budget_chunks(batch.lengths[local], budget)]
        n_chunks = max(1, len(chunks))
        if self.world > 1:  # the ranks' samples differ in length, so their chunk counts may differ too
            count = torch.tensor([n_chunks], dtype=torch.int64, device=self.device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            n_chunks = int(count.item())
        return chunks + [np.array([], dtype=np.int64)] * (n_chunks - len(chunks))


def chunk_or_dummy(chunk: np.ndarray) -> tuple[np.ndarray, bool]:
    """``(rows, real)``: an empty chunk still runs one forward/backward, on row 0 weighted 0, to keep collectives in
    step."""
    return (chunk, True) if len(chunk) else (np.array([0]), False)

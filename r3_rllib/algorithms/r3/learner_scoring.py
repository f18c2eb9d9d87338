"""A no-grad pass of the learners over every row of a batch (R^3's ranking entropies, the in-reward KL), split over
the learner ranks.

Each rank scores its share of the pass's micro-batches (``core.batching.rank_share``: chunk ``i`` to rank
``i % world``) and the ranks exchange their rows' results, so N learners do the pass's work once between them, not N
times over. A chunk is scored as it would be by a single learner (the same rows, packed the same way), so the
results do not depend on the number of ranks. A sharded (FSDP2) policy's forwards are collectives, pass by pass:
a rank with fewer chunks runs a dummy pass for each one it lacks; replicated policies skip them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch.distributed as dist

from r3_rllib.algorithms.r3.learner_chunks import chunk_or_dummy
from r3_rllib.algorithms.r3.learner_memory import tokens_per_pass
from r3_rllib.core.batching import entropy_chunks, rank_share
from r3_rllib.types import TrainingBatch

T = TypeVar("T")


@dataclass(frozen=True)
class RankShare:
    """Which share of a scoring pass a learner makes: rank ``rank`` of ``world``; ``sharded``: its policy is FSDP2
    sharded (every forward is a collective)."""

    rank: int = 0
    world: int = 1
    sharded: bool = False

    def passes(self, batch: TrainingBatch, config: Any) -> list[tuple[np.ndarray, bool]]:
        """This rank's forwards over ``batch`` at the learner's budget (``config``'s micro_batch_max_tokens /
        micro_batch_size) as ``(rows, real)``: real ones score their rows, a dummy one (row 0, sharded only)
        keeps the collectives in step and is not read."""
        if not len(batch):
            return []  # every rank holds the same batch: none makes a pass
        budget = tokens_per_pass(config.micro_batch_max_tokens, config.model_path)
        chunks = [c for c in entropy_chunks(batch.lengths, budget, config.micro_batch_size) if len(c)]
        passes = [chunk_or_dummy(c) for c in rank_share(chunks, self.rank, self.world)]
        return passes if self.sharded else [p for p in passes if p[1]]

    def gather(self, part: dict[int, T]) -> dict[int, T]:
        """Every rank's ``part`` (batch row -> its result) merged, on every rank: one ``all_gather_object``."""
        if self.world == 1:
            return part
        parts: list[dict[int, T] | None] = [None] * self.world
        dist.all_gather_object(parts, part)
        return {row: value for got in parts if got for row, value in got.items()}

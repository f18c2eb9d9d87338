"""Deferred ranking: R^3's ranking rewards and group advantages computed on the learner, from the exact entropies
of a forward the update makes anyway (ranking_entropies_from_learner, without a separate scoring pass).

The batch's `DeferredRanking` names the ranked groups. Each stays whole: in one minibatch, on one rank, in one
micro-batch, so the micro-batch that scores a group's rows scores all of them and its advantages are known before
its loss. The entropies are those of the policy before the update's first optimizer step at the rollout
temperature over the full vocabulary, as `R3Learner.score_entropies` gives them: the first minibatch's groups from
its training forward (no step has been taken yet), the later minibatches' from the no-grad pass that scores their
proximal log-probs. When the phase's scored logits are not the ones the runners sample from (a rollout head that
does not train), those forwards do not score the rollout distribution: the groups are then scored by one pass of
their own at the update's start. Later epochs reuse the advantages. The rewards, advantages and entropy statistics
go back to the driver in the update's result (``RANKING_RESULT``), summed over ranks (each group is computed on
one rank).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from r3_rllib.algorithms.r3.learner_kl import agg_count
from r3_rllib.core import mismatch
from r3_rllib.core.batching import minibatch_plan, unit_chunks, unit_minibatch_plan
from r3_rllib.core.ranking import ranked_group_scores
from r3_rllib.types import DeferredRanking, TrainingBatch


class DeferredRankingMixin:
    """The deferred-ranking side of an ``R3Learner`` update (see the module docstring)."""

    _ranking: DeferredRanking | None = None  # the update's deferred groups (none outside an update)

    def _start_ranking(self, batch: TrainingBatch) -> None:
        """Reset the per-update state for `batch`; score its groups now when the update's forwards cannot."""
        ranking = batch.ranking
        self._ranking = ranking
        self._rank_done: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # Tokens ranked, tokens compared with the engine's entropies, sum of the differences, sum of their |.|.
        self._rank_stats = np.zeros(4)
        self._rank_everywhere = False
        if ranking is None:
            self._row_group: dict[int, int] = {}
            return
        self._row_group = {int(i): g for g, rows in enumerate(ranking.groups) for i in rows}
        if self._phase.scores_rollout_logits != self._extras.has_rollout_logits:
            fresh = ranking.rows[ranking.fresh]
            scored = self.score_entropies(batch.take(fresh))
            entropies = {int(i): h for i, h in zip(fresh, scored, strict=True)}
            for g in range(len(ranking.groups)):
                self._rank_group(g, entropies)
            self._rank_everywhere = True  # every rank scored every group: rank 0 reports them

    def _update_plan(self, batch: TrainingBatch, seed: int) -> list[np.ndarray]:
        """The update's minibatches: each deferred group whole in one."""
        if batch.ranking is None:
            return minibatch_plan(len(batch), self.config.num_minibatches, seed)
        return unit_minibatch_plan(self._units(np.arange(len(batch))), self.config.num_minibatches, seed)

    def _units(self, rows: np.ndarray) -> list[np.ndarray]:
        """`rows` (in order) cut into units: a deferred group's rows together, every other row alone."""
        units: list[list[int]] = []
        placed: dict[int, list[int]] = {}
        for i in rows:
            g = self._row_group.get(int(i))
            if g is None:
                units.append([int(i)])
            elif g in placed:
                placed[g].append(int(i))
            else:
                placed[g] = [int(i)]
                units.append(placed[g])
        return [np.asarray(u, dtype=np.int64) for u in units]

    def _group_chunks(self, mb: np.ndarray, batch: TrainingBatch, budget: int | None) -> list[np.ndarray]:
        """This rank's micro-batches of minibatch `mb` with the deferred groups whole: units dealt to ranks in
        turn, packed into micro-batches; every rank gets the same number (padded with empty ones)."""
        local = self._units(mb)[self._rank :: self._world]
        chunks = unit_chunks(local, batch.lengths, budget, self.config.micro_batch_size)
        n_chunks = max(1, len(chunks))
        if self._world > 1:  # the ranks' units differ, so their chunk counts may too
            count = torch.tensor([n_chunks], dtype=torch.int64, device=self._device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            n_chunks = int(count.item())
        return chunks + [np.array([], dtype=np.int64)] * (n_chunks - len(chunks))

    def _needs_entropy(self, idx: np.ndarray, real: bool) -> bool:
        """Whether a forward of rows `idx` must score entropies: it holds a deferred group not ranked yet."""
        if not real or self._ranking is None:
            return False
        return any(self._row_group.get(int(i), -1) not in (-1, *self._rank_done) for i in idx)

    def _rank_from_forward(self, packed: dict, idx: np.ndarray, entropy: torch.Tensor) -> None:
        """Rank the deferred groups of rows `idx` not ranked yet, from the forward's per-token `entropy`."""
        mask = packed["response_mask"]
        entropies = {
            int(i): entropy[j][mask[j]].detach().float().cpu().numpy()
            for j, i in enumerate(idx)
            if int(i) in self._row_group
        }
        for g in {self._row_group[i] for i in entropies} - set(self._rank_done):
            self._rank_group(g, entropies)

    def _rank_group(self, g: int, entropies: dict[int, np.ndarray]) -> None:
        """Group `g`'s ranking rewards, rewards and advantages from its fresh rows' `entropies` (row -> values)."""
        r = self._ranking
        lo, hi = int(r.group_offsets[g]), int(r.group_offsets[g + 1])
        rows, fresh = r.rows[lo:hi], r.fresh[lo:hi]
        own = [entropies[int(i)] for i in rows[fresh]]
        self._rank_done[g] = ranked_group_scores(
            own,
            r.fixed_rewards[lo:hi][fresh],
            r.fixed_rewards[lo:hi][~fresh],
            p=r.p,
            r_max=r.r_max,
            estimator=r.estimator,
            params=r.params,
        )
        for j, h in zip(np.flatnonzero(fresh) + lo, own, strict=True):
            engine = r.engine_entropies[r.engine_offsets[j] : r.engine_offsets[j + 1]]
            self._rank_stats[0] += len(h)
            if len(engine) == len(h) and len(h):
                diff = engine.astype(np.float64) - np.asarray(h, np.float64)
                self._rank_stats[1:] += (len(h), diff.sum(), np.abs(diff).sum())

    def _row_advantages(self, packed: dict, idx: np.ndarray, real: bool) -> torch.Tensor:
        """Rows `idx`'s advantages: the batch's, with the deferred rows' as ranked."""
        advantages = packed["advantages"]
        if not real or self._ranking is None or not any(int(i) in self._row_group for i in idx):
            return advantages
        values = advantages.detach().cpu().numpy().copy()
        for j, i in enumerate(idx):
            g = self._row_group.get(int(i))
            if g is not None:
                values[j] = self._group_value(g, int(i), 2)
        return torch.from_numpy(values).to(advantages.device)

    def _group_value(self, g: int, row: int, which: int) -> float:
        """Row `row`'s ranked value `which` (1: reward, 2: advantage) in group `g`."""
        r = self._ranking
        lo, hi = int(r.group_offsets[g]), int(r.group_offsets[g + 1])
        j = int(np.flatnonzero(r.rows[lo:hi] == row)[0])
        return float(self._rank_done[g][which][j])

    def _drop_zero_groups(self, batch: TrainingBatch, mb: np.ndarray, denom: int, reduced: dict) -> float:
        """Take the rows of minibatch `mb`'s deferred groups whose advantages all came out zero out of the loss's
        normaliser `denom` (when they are dropped: no KL term): the passes were weighed by `denom`, so the gradients
        and the reduced loss metrics are divided by the share of it that remains. Their rows add nothing else (zero
        advantage). Each rank counts the groups it ranked; the counts are summed over ranks. Returns the response
        tokens of the dropped rows (over all ranks), which the update's trained-token count leaves out."""
        r = self._ranking
        if r is None or not r.drop_zero:
            return 0.0
        mine = not self._rank_everywhere or self._rank == 0
        rows = [
            r.rows[int(r.group_offsets[g]) : int(r.group_offsets[g + 1])]
            for g, (_, _, advantages) in self._rank_done.items()
            if mine and not np.any(advantages)
        ]
        in_mb = np.intersect1d(np.concatenate(rows), mb) if rows else np.zeros(0, np.int64)
        counts = {
            "n": float(agg_count(batch, in_mb, self.config.loss_agg_mode)),
            "t": float(batch.trained_tokens[in_mb].sum()),
        }
        totals = self._all_reduce_sum(counts)
        dropped, dropped_tokens = totals["n"], totals["t"]
        share = (denom - dropped) / denom if denom else 1.0
        if 0.0 < share < 1.0:
            with torch.no_grad():
                for p in self.policy.parameters():
                    if p.grad is not None:
                        p.grad.mul_(1.0 / share)
            mismatch.scale_loss_metrics(reduced, 1.0 / share)
        return dropped_tokens

    def _ranking_result(self) -> dict[str, np.ndarray] | None:
        """Per deferred row (``rows`` order) the ranking reward (NaN for a replayed row), reward and advantage,
        and the entropy statistics, summed over ranks; None without deferred groups."""
        r = self._ranking
        if r is None:
            return None
        values = np.zeros((3, len(r.rows)))
        if not self._rank_everywhere or self._rank == 0:
            for g, (ranking, rewards, advantages) in self._rank_done.items():
                lo, hi = int(r.group_offsets[g]), int(r.group_offsets[g + 1])
                values[0, lo:hi] = np.concatenate([ranking, np.zeros(hi - lo - len(ranking))])
                values[1, lo:hi], values[2, lo:hi] = rewards, advantages
            stats = self._rank_stats
        else:
            stats = np.zeros(4)
        flat = torch.from_numpy(np.concatenate([values.ravel(), stats]))
        if self._world > 1:
            flat = flat.to(self._device)
            dist.all_reduce(flat)
        flat = flat.cpu().numpy()
        values = flat[: values.size].reshape(3, -1)
        tokens, compared, diff, abs_diff = flat[values.size : values.size + 4]
        return {
            "ranking_rewards": np.where(r.fresh, values[0], np.nan),
            "rewards": values[1],
            "advantages": values[2],
            "entropy_stats": np.array([tokens, compared, diff, abs_diff]),
        }

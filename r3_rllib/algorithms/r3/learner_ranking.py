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

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from r3_rllib.algorithms.r3.learner_kl import agg_count
from r3_rllib.algorithms.r3.learner_scoring import RankShare
from r3_rllib.algorithms.r3.rl_module import pack_batch
from r3_rllib.core import mismatch
from r3_rllib.core.batching import minibatch_plan, unit_chunks, unit_minibatch_plan
from r3_rllib.core.ranking import ranked_group_scores
from r3_rllib.types import DeferredRanking, TrainingBatch


class DeferredRankingUpdate:
    """The deferred-ranking side of an ``R3Learner``'s updates (see the module docstring), held by the learner:
    :meth:`start` takes each update's batch; the update loop then asks which forwards must score entropies, and the
    ranked groups' values are held until the update's :meth:`result`. A batch without deferred groups changes
    nothing. ``rank``/``world``/``device``: the learner's place in the learner group."""

    def __init__(self, config: Any, *, rank: int, world: int, device: Any) -> None:
        self._config, self._rank, self._world, self._device = config, rank, world, device
        self.ranking: DeferredRanking | None = None
        self._row_group: dict[int, int] = {}

    def start(
        self, batch: TrainingBatch, score_now: Callable[[TrainingBatch], list[np.ndarray]] | None = None
    ) -> None:
        """Take `batch`'s deferred groups for the coming update. ``score_now``: the learner's separate entropy
        pass, given when the update's own forwards do not score the rollout distribution (the groups are then
        ranked here, before any forward)."""
        ranking = self.ranking = batch.ranking
        self._done: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # Tokens ranked, tokens compared with the engine's entropies, sum of the differences, sum of their |.|.
        self._stats = np.zeros(4)
        self._everywhere = False
        self._row_group = (
            {} if ranking is None else {int(i): g for g, rows in enumerate(ranking.groups) for i in rows}
        )
        if ranking is not None and score_now is not None:
            fresh = ranking.rows[ranking.fresh]
            scored = score_now(batch.take(fresh))
            entropies = {int(i): h for i, h in zip(fresh, scored, strict=True)}
            for g in range(len(ranking.groups)):
                self._rank_group(g, entropies)
            self._everywhere = True  # every rank has every group's entropies: rank 0 reports them

    def plan(self, batch: TrainingBatch, seed: int) -> list[np.ndarray]:
        """The update's minibatches: each deferred group whole in one."""
        if self.ranking is None:
            return minibatch_plan(len(batch), self._config.num_minibatches, seed)
        return unit_minibatch_plan(self._units(np.arange(len(batch))), self._config.num_minibatches, seed)

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

    def chunks(self, mb: np.ndarray, batch: TrainingBatch, budget: int | None) -> list[np.ndarray]:
        """This rank's micro-batches of minibatch `mb` with the deferred groups whole: units dealt to ranks in
        turn, packed into micro-batches; every rank gets the same number (padded with empty ones)."""
        local = self._units(mb)[self._rank :: self._world]
        chunks = unit_chunks(local, batch.lengths, budget, self._config.micro_batch_size)
        n_chunks = max(1, len(chunks))
        if self._world > 1:  # the ranks' units differ, so their chunk counts may too
            count = torch.tensor([n_chunks], dtype=torch.int64, device=self._device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            n_chunks = int(count.item())
        return chunks + [np.array([], dtype=np.int64)] * (n_chunks - len(chunks))

    def needs_entropy(self, idx: np.ndarray, real: bool) -> bool:
        """Whether a forward of rows `idx` must score entropies: it holds a deferred group not ranked yet."""
        if not real or self.ranking is None:
            return False
        return any(self._row_group.get(int(i), -1) not in (-1, *self._done) for i in idx)

    def rank_from_forward(self, packed: dict, idx: np.ndarray, entropy: torch.Tensor) -> None:
        """Rank the deferred groups of rows `idx` not ranked yet, from the forward's per-token `entropy`."""
        mask = packed["response_mask"]
        entropies = {
            int(i): entropy[j][mask[j]].detach().float().cpu().numpy()
            for j, i in enumerate(idx)
            if int(i) in self._row_group
        }
        for g in {self._row_group[i] for i in entropies} - set(self._done):
            self._rank_group(g, entropies)

    def _rank_group(self, g: int, entropies: dict[int, np.ndarray]) -> None:
        """Group `g`'s ranking rewards, rewards and advantages from its fresh rows' `entropies` (row -> values)."""
        r = self.ranking
        lo, hi = int(r.group_offsets[g]), int(r.group_offsets[g + 1])
        rows, fresh = r.rows[lo:hi], r.fresh[lo:hi]
        own = [entropies[int(i)] for i in rows[fresh]]
        self._done[g] = ranked_group_scores(
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
            self._stats[0] += len(h)
            if len(engine) == len(h) and len(h):
                diff = engine.astype(np.float64) - np.asarray(h, np.float64)
                self._stats[1:] += (len(h), diff.sum(), np.abs(diff).sum())

    def row_advantages(self, packed: dict, idx: np.ndarray, real: bool) -> torch.Tensor:
        """Rows `idx`'s advantages: the batch's, with the deferred rows' as ranked."""
        advantages = packed["advantages"]
        if not real or self.ranking is None or not any(int(i) in self._row_group for i in idx):
            return advantages
        values = advantages.detach().cpu().numpy().copy()
        for j, i in enumerate(idx):
            g = self._row_group.get(int(i))
            if g is not None:
                values[j] = self._group_value(g, int(i), 2)
        return torch.from_numpy(values).to(advantages.device)

    def _group_value(self, g: int, row: int, which: int) -> float:
        """Row `row`'s ranked value `which` (1: reward, 2: advantage) in group `g`."""
        r = self.ranking
        lo, hi = int(r.group_offsets[g]), int(r.group_offsets[g + 1])
        j = int(np.flatnonzero(r.rows[lo:hi] == row)[0])
        return float(self._done[g][which][j])

    def drop_zero_groups(
        self,
        batch: TrainingBatch,
        mb: np.ndarray,
        denom: int,
        reduced: dict,
        parameters: Iterable[torch.nn.Parameter],
        all_reduce_sum: Callable[[dict[str, float]], dict[str, float]],
    ) -> float:
        """Take the rows of minibatch `mb`'s deferred groups whose advantages all came out zero out of the loss's
        normaliser `denom` (when they are dropped: no KL term): the passes were weighed by `denom`, so the gradients
        of `parameters` and the reduced loss metrics are divided by the share of it that remains. Their rows add
        nothing else (zero advantage). Each rank counts the groups it ranked; the counts are summed over ranks
        (`all_reduce_sum`). Returns the response tokens of the dropped rows (over all ranks), which the update's
        trained-token count leaves out."""
        r = self.ranking
        if r is None or not r.drop_zero:
            return 0.0
        mine = not self._everywhere or self._rank == 0
        rows = [
            r.rows[int(r.group_offsets[g]) : int(r.group_offsets[g + 1])]
            for g, (_, _, advantages) in self._done.items()
            if mine and not np.any(advantages)
        ]
        in_mb = np.intersect1d(np.concatenate(rows), mb) if rows else np.zeros(0, np.int64)
        counts = {
            "n": float(agg_count(batch, in_mb, self._config.loss_agg_mode)),
            "t": float(batch.trained_tokens[in_mb].sum()),
        }
        totals = all_reduce_sum(counts)
        dropped, dropped_tokens = totals["n"], totals["t"]
        share = (denom - dropped) / denom if denom else 1.0
        if 0.0 < share < 1.0:
            with torch.no_grad():
                for p in parameters:
                    if p.grad is not None:
                        p.grad.mul_(1.0 / share)
            mismatch.scale_loss_metrics(reduced, 1.0 / share)
        return dropped_tokens

    def result(self) -> dict[str, np.ndarray] | None:
        """Per deferred row (``rows`` order) the ranking reward (NaN for a replayed row), reward and advantage,
        and the entropy statistics, summed over ranks; None without deferred groups."""
        r = self.ranking
        if r is None:
            return None
        values = np.zeros((3, len(r.rows)))
        if not self._everywhere or self._rank == 0:
            for g, (ranking, rewards, advantages) in self._done.items():
                lo, hi = int(r.group_offsets[g]), int(r.group_offsets[g + 1])
                values[0, lo:hi] = np.concatenate([ranking, np.zeros(hi - lo - len(ranking))])
                values[1, lo:hi], values[2, lo:hi] = rewards, advantages
            stats = self._stats
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


@torch.no_grad()
def score_entropies(
    score: Callable[[dict], tuple],
    batch: TrainingBatch,
    pad_id: int,
    device: Any,
    config: Any,
    share: RankShare = RankShare(),
) -> list[np.ndarray]:
    """Exact entropies (nats, full vocabulary) of the next-token distributions of each row's response tokens, by
    ``score(packed)`` (the learner's forward of the policy with entropies, on the logits the runners sample from),
    in micro-batches of the learner's budget (``config``'s micro_batch_max_tokens / micro_batch_size). With several
    learners each scores its ``share`` of the micro-batches and every rank gets every row's (learner_scoring.py)."""
    part: dict[int, np.ndarray] = {}
    for chunk, real in share.passes(batch, config):
        packed = pack_batch(batch, chunk, pad_id, device)
        entropy = score(packed)[1]
        if not real:
            continue
        mask = packed["response_mask"]
        flat = entropy[mask].float().cpu().numpy()  # row-major: each row's response positions in order
        for i, row in zip(chunk, np.split(flat, np.cumsum(batch.trained_tokens[chunk])[:-1]), strict=True):
            part[int(i)] = row
    got = share.gather(part)
    return [got.get(i, np.zeros(0, dtype=np.float32)) for i in range(len(batch))]

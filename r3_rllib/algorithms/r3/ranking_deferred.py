"""The driver's side of deferred ranking: R^3's ranking rewards and advantages of the rankable groups computed by
the learner (learner_ranking.py) from the exact entropies of forwards its update makes anyway, instead of a
separate scoring forward before the update (`groups.rescore_ranking_entropies`).

It applies when the ranking's entropies come from the learner (ranking_entropies_from_learner) and every group's
advantages depend on that group alone: an estimator without a batch step and without per-sample inputs (HGPO's
step keys). Otherwise the batch is built as before. The ranked groups' rows enter the batch with a
`DeferredRanking` description; after the update their rewards and advantages are filled in from the learners'
result, so metrics and sample records read as they do on the driver's path.

A ranked group whose advantages all come out zero (its ranking rewards tie: no sample dominates another) is
left out as on the driver's path unless a KL term keeps it: the learner takes its rows out of the loss's
normaliser (their advantages are zero, so they add nothing else), and the driver drops them from the batch after
the update. The learner still scores them (which rows a ranking zeroes is not known before the update).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from r3_rllib.algorithms.r3.groups import UNRANKED_COUNTS, assemble_training_batch, shaped_rewards
from r3_rllib.core.advantages import ADVANTAGE_FNS
from r3_rllib.core.iteration import IterationSettings
from r3_rllib.types import DeferredRanking, Group, Sample

#: The update result's key for the deferred groups' results (learner_ranking.py's ``DeferredRankingUpdate.result``).
RANKING_RESULT = "deferred_ranking"


@dataclass(frozen=True)
class PendingRanking:
    """A batch's deferred groups, as the driver completes them after the update."""

    description: DeferredRanking  # what the learners get (in the TrainingBatch)
    reflection: np.ndarray  # bool per group: a reflection group (not in the zero-advantage fraction)
    unranked: tuple[float, float]  # fresh groups scored on the driver, and those of them with zero advantage


def defers_ranking(settings: IterationSettings, entropies_from_learner: bool) -> bool:
    """Whether this batch's ranking is left to the learner (see the module docstring)."""
    return (
        settings.ranking
        and entropies_from_learner
        and settings.batch_step is None
        and not ADVANTAGE_FNS.sample_inputs.get(settings.advantage_estimator)
    )


def build_deferred_batch(
    groups: Sequence[Group],
    settings: IterationSettings,
    fetch_replay: Callable[[list[tuple[str, bool, int]]], list[list[Sample]]] | None = None,
) -> tuple[list[Sample], dict[str, float], PendingRanking | None]:
    """`groups.build_training_batch` with the rankable groups deferred to the learner: (samples, metrics, their
    description; None when no group is deferred)."""
    batch, metrics, deferred = assemble_training_batch(groups, settings, fetch_replay, defer_ranking=True)
    unranked = tuple(metrics.pop(key) for key in UNRANKED_COUNTS)
    if not deferred:
        return batch, metrics, None
    rows, offsets, fresh, fixed, engine = [], [0], [], [], []
    for start, g, members in deferred:
        n_own = len(g.samples)
        rows.extend(range(start, start + len(members)))
        offsets.append(len(rows))
        fresh.extend(j < n_own for j in range(len(members)))
        fixed.extend(shaped_rewards([replace(s, reward=0.0) for s in g.samples], settings.overlong))
        fixed.extend(shaped_rewards(members[n_own:], settings.overlong))
        for j, s in enumerate(members):
            h = np.asarray(s.entropies, np.float32)
            engine.append(h if j < n_own and len(h) == _trained(s) else np.zeros(0, np.float32))
    description = DeferredRanking(
        rows=np.asarray(rows, np.int64),
        group_offsets=np.asarray(offsets, np.int64),
        fresh=np.asarray(fresh, bool),
        fixed_rewards=np.asarray(fixed, np.float64),
        engine_entropies=np.concatenate(engine).astype(np.float32),
        engine_offsets=np.concatenate([[0], np.cumsum([len(h) for h in engine])]).astype(np.int64),
        p=float(settings.ranking_p),
        r_max=float(settings.ranking_r_max),
        estimator=settings.advantage_estimator,
        params=dict(settings.advantage_params),
        drop_zero=not settings.keep_zero_advantage,
    )
    reflection = np.asarray([g.is_reflection for _, g, _ in deferred], bool)
    return batch, metrics, PendingRanking(description, reflection, unranked)


def finish_deferred(
    batch: list[Sample], metrics: dict[str, float], pending: PendingRanking | None, learner_metrics: dict
) -> list[Sample]:
    """`batch` with the deferred rows' rewards and advantages from the learners' result (popped from
    `learner_metrics`, key ``RANKING_RESULT``); completes the ranking metrics in `metrics` (in place): the
    zero-advantage fraction, trained groups, ranked reward spread and the ranking entropy statistics. `batch` as it
    is when nothing was deferred."""
    result = learner_metrics.pop(RANKING_RESULT, None)
    if pending is None or result is None:
        return batch
    d = pending.description
    out = list(batch)
    for j, i in enumerate(d.rows):
        out[int(i)] = replace(
            batch[int(i)], reward=float(result["rewards"][j]), advantage=float(result["advantages"][j])
        )
    groups = range(len(d.group_offsets) - 1)
    spans = [slice(int(d.group_offsets[g]), int(d.group_offsets[g + 1])) for g in groups]
    zero = np.asarray([not np.any(result["advantages"][s]) for s in spans], bool)
    if d.drop_zero:
        dropped = {int(i) for s, z in zip(spans, zero, strict=True) if z for i in d.rows[s]}
        out = [x for i, x in enumerate(out) if i not in dropped]
        metrics["train_samples"] = float(len(out))
        metrics["train_replayed"] = float(sum(x.is_replay for x in out))
        metrics["train_reflected"] = float(sum(x.is_reflection for x in out))
    fresh_zero = zero[~pending.reflection]
    n_fresh, n_zero = pending.unranked[0] + len(fresh_zero), pending.unranked[1] + fresh_zero.sum()
    metrics["zero_adv_frac"] = float(n_zero / n_fresh) if n_fresh else float("nan")
    metrics["trained_groups"] = float(n_fresh - n_zero)
    if not d.drop_zero:
        metrics["train_zero_adv_samples"] += float(
            sum(s.stop - s.start for s, z in zip(spans, zero, strict=True) if z)
        )
    ranking = result["ranking_rewards"]
    metrics["ranked_reward_spread"] = float(np.mean([np.ptp(ranking[s][d.fresh[s]]) for s in spans]))
    tokens, compared, diff, abs_diff = (float(v) for v in result["entropy_stats"])
    metrics["ranking_entropy_tokens"] = tokens
    metrics["ranking_entropy_bias"] = diff / compared if compared else 0.0
    metrics["ranking_entropy_abs_diff"] = abs_diff / compared if compared else 0.0
    return out


def _trained(sample: Sample) -> int:
    """The response tokens of `sample` the learner scores (tool output excluded)."""
    mask = sample.loss_mask
    return int(np.count_nonzero(mask)) if mask is not None else len(sample.response_ids)

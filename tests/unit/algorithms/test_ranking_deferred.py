"""Deferred ranking (ranking_deferred.py, learner_ranking.py): the learner ranks the all-wrong groups from the
entropies of forwards its update makes anyway, and the update equals the one after a separate scoring pass
(`score_entropies` + `rescore_ranking_entropies` + `build_training_batch`)."""

from __future__ import annotations

from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch
from numeric import TORCH_THREADS, f32_tol, max_abs
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.groups import build_training_batch, rescore_ranking_entropies
from r3_rllib.algorithms.r3.learner import R3Learner
from r3_rllib.algorithms.r3.ranking_deferred import (
    RANKING_RESULT,
    build_deferred_batch,
    defers_ranking,
    finish_deferred,
)
from r3_rllib.core.iteration import IterationSettings, estimator_settings
from r3_rllib.core.stream_digest import stream_keys
from r3_rllib.types import Group, TrainingBatch

torch.set_num_threads(TORCH_THREADS)

LR = 1e-3


def _learner(model_path: str, **training) -> R3Learner:
    cfg = (
        R3Config.grpo_preset()
        .learners(num_learners=0, num_cpus_per_learner=TORCH_THREADS)
        .training(model_path=model_path, gradient_checkpointing=False, lr=LR, **training)
    )
    space = gym.spaces.Text(8)
    return cfg.build_learner(env=None, spaces={"__env__": (space, space), "default_policy": (space, space)})


def _groups() -> tuple[list[Group], dict]:
    """Two all-wrong groups (one with two replayed successes), a mixed group, an all-right one."""
    raw = random_samples(20, seed=3, min_response_len=3, num_queries=1)
    wrong = [replace(s, reward=0.0, correct=False) for s in raw]
    right = [replace(s, reward=1.0, correct=True) for s in raw]
    groups = [
        Group("a", [replace(s, query_id="a") for s in wrong[0:4]]),
        Group("b", [replace(s, query_id="b") for s in wrong[4:6] + right[6:8]]),
        Group("c", [replace(s, query_id="c") for s in wrong[8:11]]),
        Group("d", [replace(s, query_id="d") for s in right[11:14]]),
    ]
    replayed = {"c": [replace(s, query_id="c", is_replay=True) for s in right[14:16]]}
    return groups, replayed


def _settings(learner: R3Learner) -> IterationSettings:
    return IterationSettings(
        replay=True, replay_k=2, ranking=True, **estimator_settings("grpo", learner.config)
    )


def _fetch(replayed):
    return lambda requests: [replayed.get(q, []) if want else [] for q, want, _ in requests]


# T = 0.6 too: the entropies (training forward, proximal pass, separate pass) are all of the tempered distribution.
@pytest.mark.parametrize(("num_minibatches", "temperature"), [(1, 1.0), (2, 1.0), (2, 0.6)])
def test_deferred_ranking_matches_a_separate_scoring_pass(tiny_random_model, num_minibatches, temperature):
    training = dict(
        num_minibatches=num_minibatches, num_epochs=2, micro_batch_size=2, temperature=temperature
    )
    groups, replayed = _groups()

    # Deferred: the learner ranks groups a and c (micro_batch_size 2 < their 4 and 5 rows: they stay whole).
    ours = _learner(tiny_random_model, **training)
    settings = _settings(ours)
    assert defers_ranking(settings, True)
    scored = []
    ours.score_entropies = lambda batch: scored.append(batch) or []
    plans = []
    plan_of = ours._ranked.plan
    ours._ranked.plan = lambda batch, seed: plans.append(plan_of(batch, seed)) or plans[-1]
    batch, metrics, pending = build_deferred_batch(groups, settings, _fetch(replayed))
    assert pending is not None and len(pending.description.groups) == 2
    learner_metrics = ours.update_from_samples(
        replace(TrainingBatch.from_samples(batch), ranking=pending.description), seed=5
    )
    assert scored == []  # no separate forward
    assert RANKING_RESULT in learner_metrics
    result = learner_metrics[RANKING_RESULT]
    trained = finish_deferred(batch, metrics, pending, learner_metrics)
    # Groups whose ranking tied (no sample dominates another: common with few samples) leave the batch, as on
    # today's path; the reference trains the same minibatches less those rows.
    d = pending.description
    dropped = {
        int(i) for rows in d.groups for i in rows if not np.any(result["advantages"][np.isin(d.rows, rows)])
    }
    kept = [i for i in range(len(batch)) if i not in dropped]
    assert len(kept) == len(trained)
    new_index = {old: new for new, old in enumerate(kept)}
    batch = trained
    for rows in pending.description.groups:  # each group in one minibatch
        assert sum(set(rows.tolist()) <= set(mb.tolist()) for mb in plans[0]) == 1

    # Today's path: a separate scoring forward, ranking on the driver, the same minibatches.
    ref = _learner(tiny_random_model, **training)
    rescored, entropy_metrics = rescore_ranking_entropies(
        groups, lambda samples: ref.score_entropies(TrainingBatch.from_samples(samples))
    )
    ref_batch, ref_metrics = build_training_batch(rescored, settings, _fetch(replayed))
    ref_metrics |= entropy_metrics
    ref_plan = [np.array([new_index[int(i)] for i in mb if int(i) in new_index]) for mb in plans[0]]
    ref._ranked.plan = lambda batch, seed: [mb for mb in ref_plan if len(mb)]
    ref_learner = ref.update_from_samples(TrainingBatch.from_samples(ref_batch), seed=5)

    assert stream_keys(batch) == stream_keys(ref_batch)
    ours_adv = np.array([s.advantage for s in batch])
    ref_adv = np.array([s.advantage for s in ref_batch])
    # The ranking is by rank (strict comparisons of entropy means), so entropies that differ by a few float32 ulps
    # (the two forwards pad differently) give the same rewards; advantages are float64 of the same rewards.
    np.testing.assert_allclose(ours_adv, ref_adv, rtol=0, atol=f32_tol(max_abs(ref_adv), 4))
    np.testing.assert_allclose(
        [s.reward for s in batch], [s.reward for s in ref_batch], rtol=0, atol=f32_tol(1.0, 4)
    )
    for key in ("zero_adv_frac", "trained_groups", "ranked_groups", "ranked_reward_spread", "train_samples"):
        assert metrics[key] == pytest.approx(ref_metrics[key], abs=f32_tol(1.0, 4)), key
    assert metrics["ranking_entropy_tokens"] == ref_metrics["ranking_entropy_tokens"]
    for key in ("ranking_entropy_bias", "ranking_entropy_abs_diff"):
        assert metrics[key] == pytest.approx(
            ref_metrics[key], abs=f32_tol(max_abs(ref_metrics[key], 1.0), 64)
        )
    # The losses are sums of the same float32 terms grouped into other micro-batches (the deferred path keeps each
    # ranked group in one): they differ by a few ulps of the loss's terms. The weights after the Adam steps differ
    # by the rounding of those steps plus each Adam step's disagreement: Adam's step g / (|g| + eps) * lr, on a
    # coordinate whose gradient is a cancelling sum (|g| near eps = 1e-8), turns a rounding-level gradient difference
    # delta (ulps of the largest gradient term, ~1e-10 here) into up to lr * delta / eps ~ 1e-2 lr. A wrong advantage
    # or another minibatch split moves weights by O(lr) per step.
    assert learner_metrics["loss"] == pytest.approx(ref_learner["loss"], abs=f32_tol(1.0, 64))
    # The tied groups' rows were not trained on: the token count is the reference's (an exact integer).
    assert learner_metrics["trained_tokens"] == ref_learner["trained_tokens"]
    for a, b in zip(ours.policy.parameters(), ref.policy.parameters(), strict=True):
        a, b = a.detach(), b.detach()
        steps = num_minibatches * training["num_epochs"]
        torch.testing.assert_close(a, b, rtol=0, atol=f32_tol(max_abs(b), 16) + steps * 1e-2 * LR)

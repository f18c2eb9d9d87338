"""Deferred ranking end to end (ranking_entropy_source='learner', hf runners): the learners rank the all-wrong groups
from their own training forward and proximal pass, with two FSDP2 learners over gloo (each ranks the groups it
trains, the results are all-reduced) as with one; the trained digest and the learners' trained tokens count the rows
that were trained, after groups whose ranking tied left the batch."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest

import r3_rllib.algorithms.r3.r3 as r3_module
from r3_rllib import R3Config
from r3_rllib.algorithms.r3.ranking_deferred import RANKING_RESULT, finish_deferred
from r3_rllib.core.stream_digest import stream_digest, stream_keys

pytestmark = pytest.mark.slow
sys.path.insert(0, os.path.dirname(__file__))
from numeric import f64_tol, max_abs  # noqa: E402

# The same setup as the FSDP2 trajectory test (G = 4, two minibatches): its tolerances apply as derived there.
from test_distributed_and_checkpoint import GROUP_SIZE, _assert_same_trajectory, abs_param_sum  # noqa: E402

ITERATIONS = 2
NUM_EPOCHS = 1


def _run(model_path: str, num_learners: int, monkeypatch, **training) -> tuple[list[dict], list[dict]]:
    """(per-iteration results plus the last parameters, as test_distributed_and_checkpoint's trajectory; the
    driver's view of each iteration's deferred ranking: whether it ran, the trained batch's keys, advantages and
    trained tokens). `training`: more settings."""
    seen: list[dict] = []

    def finish(batch, metrics, pending, learner_metrics):  # the driver's hook, recording what it returns
        deferred = pending is not None and RANKING_RESULT in learner_metrics
        out = finish_deferred(batch, metrics, pending, learner_metrics)
        seen.append(
            {
                "deferred": deferred,
                "keys": stream_keys(out),
                "digest": stream_digest(out),
                "advantages": np.array([s.advantage for s in out]),
                "tokens": sum(len(s.response_ids) for s in out),
            }
        )
        return out

    monkeypatch.setattr(r3_module, "finish_deferred", finish)
    config = (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"num_queries": 64})
        .env_runners(num_env_runners=1)
        .learners(num_learners=num_learners, num_cpus_per_learner=1)
        # The random policy's groups are all wrong: every group is ranked, on the learners' exact entropies.
        .r3(ranking=True, ranking_start_epoch=0, ranking_entropy_source="learner")
        .training(
            model_path=model_path,
            group_size=GROUP_SIZE,
            queries_per_iteration=8,
            max_new_tokens=5,
            lr=3e-3,
            num_minibatches=2,
            micro_batch_size=4,
            num_epochs=NUM_EPOCHS,
        )
        .training(**training)
    )
    algo = config.build_algo()
    try:
        out = []
        for _ in range(ITERATIONS):
            r = algo.train()
            # Nothing trained (R^2PO's stage A on all-zero advantages): the learner reports trained_tokens 0.
            if r["learner"]["trained_tokens"] == 0:
                continue
            out.append(
                {k: float(r["learner"][k]) for k in ("loss", "grad_norm", "entropy", "trained_tokens")}
                # NaN where absent (no ranking in an iteration: R^2PO's stage A)
                | {k: float(r["r3"].get(k, math.nan)) for k in ("ranked_groups", "ranking_entropy_tokens")}
                | {"train_samples": float(r["r3"]["train_samples"])}
                | {
                    "digest": int(r["rollout"]["trained_digest"]),
                    "zero_adv_frac": r["rollout"]["zero_adv_frac"],
                }
            )
        per_rank = algo.learner_call(lambda lr: lr.parameter_checksum())
        vocab = algo.learner_call(lambda lr: lr.policy.config.vocab_size)[0]
        scale = abs_param_sum(algo) if num_learners == 0 else None
        out.append({"params": per_rank[0], "per_rank": per_rank, "abs_params": scale, "vocab": vocab})
        return out, seen
    finally:
        algo.stop()


def test_two_fsdp_learners_rank_as_one(ray_session, tiny_random_model, monkeypatch):
    one, one_seen = _run(tiny_random_model, 0, monkeypatch)
    two, two_seen = _run(tiny_random_model, 2, monkeypatch)
    _assert_checked(one, one_seen)
    _assert_checked(two, two_seen)
    _assert_same_run(one, one_seen, two, two_seen)


def test_two_fsdp_learners_rank_with_a_rollout_head_as_one(ray_session, tiny_random_model, monkeypatch):
    """R^2PO: stage A (the head trains, no ranking) then stage B (the base trains on the ranked groups). Stage B's
    training forwards score the base logits, not the head's the runners sample from, so every rank scores every
    ranked group in a pass of its own at the update's start and rank 0 reports them."""
    head = dict(rollout_head=True, rollout_head_head_iters=1, rollout_head_base_iters=1, rollout_head_lr=1e-3)
    one, one_seen = _run(tiny_random_model, 0, monkeypatch, **head)
    two, two_seen = _run(tiny_random_model, 2, monkeypatch, **head)
    for results, seen in ((one, one_seen), (two, two_seen)):
        # Stage A trains nothing when its advantages are all zero (a random policy's all-wrong groups): only the
        # iterations that trained are in `results`.
        assert [s["deferred"] for s in seen][-1:] == [True] and not any(s["deferred"] for s in seen[:-1]), (
            seen
        )
        assert results[-2]["ranked_groups"] >= 1 and results[-2]["ranking_entropy_tokens"] > 0, results
        assert all(math.isfinite(r[k]) for r in results[:-1] for k in ("loss", "grad_norm")), results
    _assert_same_run(one, one_seen, two, two_seen)


def _assert_checked(results: list[dict], seen: list[dict]) -> None:
    """Every iteration ranked on the learners, with finite metrics, and reported what it trained."""
    assert len(seen) == ITERATIONS and all(s["deferred"] for s in seen), "the learners ranked the groups"
    for r, s in zip(results[:-1], seen, strict=True):
        assert r["ranked_groups"] >= 1 and r["ranking_entropy_tokens"] > 0, r
        assert all(math.isfinite(v) for k, v in r.items() if k != "digest"), r
        # What was trained, after the tied groups left the batch: the digest, the samples, the tokens (each
        # row once per epoch, over all ranks).
        assert r["digest"] == s["digest"] and r["train_samples"] == len(s["keys"]), (r, s)
        assert r["trained_tokens"] == NUM_EPOCHS * s["tokens"], (r, s)


def _assert_same_run(one: list[dict], one_seen: list[dict], two: list[dict], two_seen: list[dict]) -> None:
    """The two-learner run trained what the one-learner run did, with the same advantages, losses and weights."""
    # Both runs sample the same responses (seeded runner; the weights differ by rounding only, see below) and score
    # each group in a pass of the same rows and padding (micro_batch_size = G: one group per pass, on whichever
    # rank). Ranking rewards are ranks from strict comparisons of entropy statistics, so they agree unless two
    # statistics lie within float32 rounding of each other; the advantages are then float64 functions of the same
    # rewards by the same code, summed over ranks with zeros: 4 float64 ulps of the largest leave room for the
    # summation order only. A wrong group, rank or row moves an advantage by O(1 / sqrt(G)).
    for a, b in zip(one_seen, two_seen, strict=True):
        assert a["keys"] == b["keys"]
        scale = max_abs(a["advantages"], 1.0)
        np.testing.assert_allclose(b["advantages"], a["advantages"], rtol=0, atol=f64_tol(scale, 4))
    # Loss, gradient norm, entropy and parameters as in test_distributed_and_checkpoint (tolerances derived there).
    _assert_same_trajectory(one, two)

"""overlap_generation: the runners generate batch k+1 while the learner trains on batch k (one-step off-policy)."""

from __future__ import annotations

import pytest
from algo_checks import assert_runner_scores_like_learner
from numeric import forward_atol
from test_algorithm import tiny_config

from r3_rllib import R3Config

pytestmark = pytest.mark.slow


def _query_ids(rollout) -> list[str]:
    return [g.query_id for g in rollout.groups]


def test_overlap_trains_one_update_old_and_checkpoints_the_batch_in_flight(
    ray_session, tiny_random_model, tmp_path
):
    """Each batch after the first was requested before the previous update (policy lag 1) and the weights reach the
    runner in order. Saving drains the rollout being generated into the checkpoint, so its queries (already consumed
    from the runners' env order) are trained after a restore instead of being skipped."""
    # The importance weight corrects the one-update-old batches (grpo_preset, verl's recipe, leaves it off).
    algo = tiny_config(tiny_random_model, overlap_generation=True, off_policy_correction=True).build_algo()
    try:
        results = [algo.train() for _ in range(3)]
        # The first batch is sampled on the spot; each later one was requested before the previous update.
        assert [r["rollout"]["policy_lag"] for r in results] == [0.0, 1.0, 1.0]
        assert algo.coordinator.in_flight  # batch 4 is being generated now
        assert results[-1]["learner"]["optimizer_steps"] == 1.0
        assert "is_weight_mean" in results[-1]["learner"]
        # The queued weight load ran after the rollout in flight: a call made now sees the newest weights (the HF
        # engine against a plain forward: forward_atol of the values compared, tests/numeric.py).
        assert_runner_scores_like_learner(algo, tiny_random_model, tolerance=forward_atol)

        checkpoint = algo.save(str(tmp_path / "ckpt")).checkpoint.path
        pending = _query_ids(algo.coordinator.ready)
        assert len(pending) == 8
        after_save = algo.train()  # trains on exactly that batch
        assert after_save["rollout"]["policy_lag"] == 1.0
        next_ids = _query_ids(algo.coordinator.gather())
    finally:
        algo.stop()

    restored = tiny_config(tiny_random_model, overlap_generation=True).build_algo()
    try:
        restored.restore_from_path(checkpoint)  # RLlib's Checkpointable restore: our format, as restore()
        assert _query_ids(restored.coordinator.ready) == pending
        result = restored.train()
        assert result["rollout"]["policy_lag"] == 1.0
        assert result["rollout"]["policy_version"] == 4.0  # three updates before the save, one after
        # Same env order after the restore: the next batch asks for the same queries as the uninterrupted run.
        assert _query_ids(restored.coordinator.gather()) == next_ids
    finally:
        restored.stop()


def test_overlap_refuses_a_sleeping_engine():
    config = R3Config().training(overlap_generation=True, sleep_between_rollouts=True)
    with pytest.raises(ValueError, match="overlap_generation needs the engine awake"):
        config.validate()

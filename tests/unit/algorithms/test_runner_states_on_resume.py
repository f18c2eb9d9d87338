"""Which data position and sampling seed each runner resumes with when a checkpoint is restored on the number of
EnvRunners it was saved with, or on more or fewer (coordinator.runner_states_for, DataEpoch.restore)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from r3_rllib.algorithms.r3.checkpoint import AlgorithmState
from r3_rllib.algorithms.r3.coordinator import DataEpoch, RolloutCoordinator, resume_note, runner_states_for
from r3_rllib.algorithms.r3.rollout_types import RunnerState
from r3_rllib.algorithms.r3.runner_setup import RUNNER_SEED_STRIDE


def _saved(n: int) -> dict[int, RunnerState]:
    return {
        w: RunnerState(env={"cursor": 4 * w, "epoch": 1}, sample_seed=1000 * w + 7) for w in range(1, n + 1)
    }


def test_the_same_runners_keep_their_own_states():
    assert runner_states_for(_saved(3), 3) == _saved(3)
    assert runner_states_for({}, 3) == {}


def test_added_runners_take_runner_1s_position_and_their_own_seed_stream():
    states = runner_states_for(_saved(2), 4)
    assert [states[w] for w in (1, 2)] == [_saved(2)[1], _saved(2)[2]]
    for wid in (3, 4):
        assert states[wid].env == _saved(2)[1].env
        # Where runner `wid`'s seed would stand after as many rollouts as runner 1's (runner_seed's stride).
        assert states[wid].sample_seed == 1007 + RUNNER_SEED_STRIDE * (wid - 1)


def test_runners_gone_are_dropped_and_a_runner_that_never_delivered_stays_without_a_state():
    assert runner_states_for(_saved(4), 2) == {1: _saved(4)[1], 2: _saved(4)[2]}
    gap = {1: _saved(3)[1], 3: _saved(3)[3]}  # runner 2 never delivered before the save
    assert runner_states_for(gap, 3) == gap
    assert sorted(runner_states_for(gap, 4)) == [1, 3, 4]


def test_the_data_epoch_follows_the_runners():
    epoch = DataEpoch()
    epoch.restore(2, {1: 2, 2: 3, 3: 2})
    assert (epoch.value, epoch.runner_epochs) == (2, {1: 2, 2: 3, 3: 2})
    epoch.restore(2, {1: 2, 2: 3, 3: 2}, num_runners=2)
    assert epoch.runner_epochs == {1: 2, 2: 3}
    epoch.restore(2, {"1": 3, "2": 2}, num_runners=4)  # keys as a JSON state would have them
    assert epoch.runner_epochs == {1: 3, 2: 2, 3: 3, 4: 3}
    epoch.update({3: 4})
    assert epoch.value == 2


def test_the_resume_note_counts_the_saved_states_against_the_configured_runners():
    assert resume_note(_saved(3), 3) is None and resume_note({}, 3) is None
    assert resume_note(_saved(4), 3).startswith(
        "The checkpoint holds the data positions of 4 EnvRunner(s) (worker ids [1, 2, 3, 4]); resuming on 3:"
    )
    # Runner 2 never delivered: 3 states, not the highest id 4, whether the run resumes on 4 or on 3 (runner 4's
    # state dropped then, runner 2 left as it is).
    gap = {1: _saved(4)[1], 3: _saved(4)[3], 4: _saved(4)[4]}
    for num_runners in (4, 3):
        assert (
            f"positions of 3 EnvRunner(s) (worker ids [1, 3, 4]); resuming on {num_runners}:"
            in resume_note(gap, num_runners)
        )
    # Runner 3 of 3 never delivered: it takes runner 1's position as an added runner would, so it is told too.
    assert (
        "positions of 2 EnvRunner(s) (worker ids [1, 2]); resuming on 3: a runner above those ids takes runner 1's"
        in (resume_note(_saved(2), 3))
    )


def test_a_restore_logs_the_note_with_both_numbers(caplog):
    runners = SimpleNamespace(healthy_worker_ids=lambda: [])
    coordinator = RolloutCoordinator(runners, SimpleNamespace(num_env_runners=4), metrics=None)
    saved = {1: _saved(4)[1], 3: _saved(4)[3], 4: _saved(4)[4]}
    state = AlgorithmState(
        iteration=2,
        policy_version=2,
        dataset_epoch=0,
        runner_epochs={w: 0 for w in saved},
        rng={},
        runners={w: s.to_dict() for w, s in saved.items()},
        replay=None,
        metrics=None,
    )
    with caplog.at_level(logging.INFO, logger="r3_rllib.algorithms.r3.coordinator"):
        coordinator.restore(state)
    assert "holds the data positions of 3 EnvRunner(s) (worker ids [1, 3, 4]); resuming on 4:" in caplog.text
    assert sorted(coordinator.runner_states) == [1, 3, 4]

"""Runner and learner faults without Ray processes: what a runner's error carries, how the driver tells an
application error from a crash, the bounded wait for restarted runners, and a dead learner named by its rank
(runner_faults.py, learner_faults.py; the e2e side is tests/e2e/test_faults.py)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3 import runner_faults
from r3_rllib.algorithms.r3.coordinator import RolloutCoordinator
from r3_rllib.algorithms.r3.learner_faults import LearnerDiedError, learner_death_error
from r3_rllib.algorithms.r3.rollout_types import RolloutResult, RolloutTimings, RunnerError, RunnerState
from r3_rllib.algorithms.r3.runner_faults import raise_runner_errors, sample_or_error, wait_for_runners
from r3_rllib.rollout.kinds.context import NonFiniteRewardError, check_finite_rewards
from r3_rllib.types.samples import Group


class _Env:
    pass


class _Runner:
    """What sample_or_error reads of an LLMEnvRunner."""

    def __init__(self, error: Exception | None, query_id: str | None = None) -> None:
        self.worker_index, self.env, self.query_id, self.error = 3, _Env(), query_id, error

    def sample(self, **kwargs):
        if self.error is not None:
            raise self.error
        return "result"


def test_a_runner_error_names_the_runner_env_query_and_cause_and_survives_pickling():
    err = sample_or_error(_Runner(ZeroDivisionError("boom"), query_id="q7"), num_queries=2)
    assert isinstance(err, RunnerError)
    assert (err.worker_index, err.env, err.query_id, err.error_type) == (3, "_Env", "q7", "ZeroDivisionError")
    assert str(err).startswith("EnvRunner 3 (env _Env, query 'q7') failed: ZeroDivisionError: boom")
    assert (
        "\n" not in str(err) and "raise self.error" in err.remote_traceback
    )  # one line; the traceback apart
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is RunnerError and str(copy) == str(err) and copy.query_id == "q7"
    assert sample_or_error(_Runner(None), num_queries=2) == "result"
    # the error's own query (a NaN reward's) comes before the one the runner was grading last
    nan = sample_or_error(_Runner(NonFiniteRewardError("q9", "_Env", float("nan")), query_id="q7"))
    assert nan.query_id == "q9" and "_Env gave query 'q9' a non-finite reward (nan)" in str(nan)
    # no query known (the env's reset raised)
    assert str(sample_or_error(_Runner(ValueError("x")))).startswith(
        "EnvRunner 3 (env _Env) failed: ValueError"
    )


def test_non_finite_rewards_are_named_by_query():
    samples = random_samples(4)
    bad = [
        dataclasses.replace(s, query_id="qq", reward=float("inf")) if i == 2 else s
        for i, s in enumerate(samples)
    ]
    check_finite_rewards([Group("a", samples)], "Env")
    with pytest.raises(NonFiniteRewardError, match=r"Env gave query 'qq' a non-finite reward \(inf\)"):
        check_finite_rewards([Group("a", bad)], "Env")


def test_the_lowest_runner_error_is_raised_and_results_pass():
    first = RunnerError(1, "ValueError", "a", remote_traceback="Traceback ...\nValueError: a")
    second = RunnerError(2, "KeyError", "b")
    raise_runner_errors([(1, "result"), (2, None)])
    with pytest.raises(RunnerError, match="^EnvRunner 1 failed: ValueError: a$") as caught:
        raise_runner_errors([(2, second), (1, first)])
    # raised from the runner's traceback: a printed traceback shows where in the runner it happened
    assert str(caught.value.__cause__) == "\nTraceback ...\nValueError: a"


class _Runners:
    """An EnvRunnerGroup stand-in: healthy ids, one answer list per fetch (a callable may change the state)."""

    def __init__(self, healthy, fetches=()) -> None:
        self.healthy, self.fetches, self.requests = list(healthy), list(fetches), []

    def healthy_worker_ids(self):
        return list(self.healthy)

    def num_remote_env_runners(self):
        return 1

    def foreach_env_runner_async(self, fn, tag, remote_worker_ids):
        self.requests.append(list(remote_worker_ids))
        return len(remote_worker_ids)

    def fetch_ready_async_reqs(self, tags, timeout_seconds):
        answer = self.fetches.pop(0)
        return answer() if callable(answer) else answer


class _Metrics:
    def log_value(self, *args, **kwargs):
        pass

    def delete(self, *key, key_error=True):  # metric_groups.clear_groups
        pass


def _result(worker_id: int) -> RolloutResult:
    group = Group("q", random_samples(2))
    return RolloutResult(worker_id, (group,), 0, RolloutTimings(), 0, {"samples": 2.0}, RunnerState({}, 0))


def test_no_healthy_runner_waits_for_the_restart_then_fails_when_none_comes_back(monkeypatch):
    monkeypatch.setattr(runner_faults, "RESTORE_POLL_S", 0.0)
    config = R3Config()
    runners = _Runners(healthy=[])
    calls = []

    def restore():
        calls.append(1)
        if len(calls) == 3:  # Ray's restart finished: RLlib's probe marks the runner healthy
            runners.healthy = [1]
        return runners.healthy

    assert wait_for_runners(runners, restore, config) == [1] and len(calls) == 3
    assert wait_for_runners(runners, None, config) == [1]  # healthy: no wait
    runners.healthy = []
    with pytest.raises(RuntimeError, match=r"restart_failed_env_runners=False"):
        wait_for_runners(runners, restore, R3Config().fault_tolerance(restart_failed_env_runners=False))
    with pytest.raises(RuntimeError, match=r"no EnvRunner came back within 0 s"):
        wait_for_runners(runners, lambda: [], R3Config().fault_tolerance(env_runner_restore_timeout_s=0.0))


def test_a_rollout_whose_only_runner_was_lost_is_asked_again_after_the_restore(monkeypatch):
    """No fake empty rollout: the crash (RLlib takes the runner out of service and drops its answer) is followed by
    the wait for the restart and a new request, whose answer is the iteration's rollout."""
    monkeypatch.setattr(runner_faults, "RESTORE_POLL_S", 0.0)

    def crashed():
        runners.healthy = []
        return []

    runners = _Runners(healthy=[1], fetches=[crashed, [(1, _result(1))]])

    def restore():
        runners.healthy = [1]
        return [1]

    coordinator = RolloutCoordinator(runners, R3Config(), _Metrics(), restore)
    rollout = coordinator.sample(4, None)
    assert len(rollout.groups) == 1 and runners.requests == [[1], [1]]
    # an application error is raised at once, not retried
    runners.fetches = [[(1, RunnerError(1, "ValueError", "bad"))]]
    with pytest.raises(RunnerError, match="bad"):
        coordinator.sample(4, None)
    assert len(runners.requests) == 3


def _call_results(errors: dict[int, Exception | None]):
    from ray.rllib.utils.actor_manager import RemoteCallResults, ResultOrError

    results = RemoteCallResults()
    for actor_id, err in errors.items():
        results.add_result(
            actor_id, ResultOrError(result={"loss": 0.0}) if err is None else ResultOrError(error=err), ""
        )
    return results


def test_a_dead_learner_is_named_by_rank_and_a_broken_collective_is_not_a_death():
    from ray.exceptions import ActorDiedError, RayTaskError

    gloo = RayTaskError("update_from_samples", "traceback", RuntimeError("Connection reset by peer"))
    found = learner_death_error(_call_results({0: gloo, 1: ActorDiedError()}), num_learners=2)
    assert found is not None
    error, cause = found
    assert isinstance(cause, ActorDiedError) and error.ranks == (1,)
    assert str(error).startswith("learner rank 1 died (ActorDiedError: ")
    assert "--resume" in str(error) and "num_learners=2" in str(error)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)
    assert learner_death_error(_call_results({0: gloo, 1: None}), num_learners=2) is None
    assert learner_death_error([], num_learners=2) is None
    assert isinstance(error, LearnerDiedError)

"""Faults reach the user with their cause, and the run survives what it can.

- A runner's application error (its env's reset/step raised, sampling settings the engine refuses, a NaN reward)
  stops ``train()`` within seconds with a ``RunnerError`` naming the runner, the env, the query and the original
  exception (before: ~60 s, then only "no healthy EnvRunner left to sample from").
- The only runner killed between iterations: the next iteration waits for Ray's restart, restores the runner and
  trains on a full batch (before: a fake row with accuracy 0.0, then the trial failed).
- A learner process killed (num_learners=2): ``train()`` raises ``LearnerDiedError`` naming the rank and how to
  resume (before: gloo's "Connection reset by peer").
"""

from __future__ import annotations

import pickle
import re
import time

import faulty_envs
import pytest
import ray

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.learner_faults import LearnerDiedError
from r3_rllib.algorithms.r3.rollout_types import RunnerError

pytestmark = pytest.mark.slow

QUERIES, GROUP = 4, 2  # per iteration: 8 samples
#: How soon a runner's error must reach the driver (the old path waited delay_between_env_runner_restarts_s, 60 s).
ERROR_WITHIN_S = 20.0


@pytest.fixture(scope="module", autouse=True)
def _ship_faulty_envs_by_value():
    """The runners' processes cannot import tests/: cloudpickle sends the env classes by value."""
    ray.cloudpickle.register_pickle_by_value(faulty_envs)
    yield
    ray.cloudpickle.unregister_pickle_by_value(faulty_envs)


def _config(model_path: str, env=None, *, env_config: dict | None = None, **training) -> R3Config:
    return (
        R3Config.grpo_preset()
        .environment(env or "arithmetic", env_config={"num_queries": 32, **(env_config or {})})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
        .learners(num_learners=0)
        .training(
            model_path=model_path,
            group_size=GROUP,
            queries_per_iteration=QUERIES,
            max_new_tokens=4,
            lr=1e-3,
            **training,
        )
    )


ENV_ERROR = re.escape(f"ZeroDivisionError: {faulty_envs.FAILURE_MESSAGE}")
#: fail_on mode of the env -> what the error says. One algorithm goes through them all (its runner survives each).
CASES = {
    "reset": r"^EnvRunner 1 \(env FaultyArithmeticEnv\) failed: " + ENV_ERROR,
    "step": r"^EnvRunner 1 \(env FaultyArithmeticEnv, query 'arith:.+'\) failed: " + ENV_ERROR,
    "nan": r"NonFiniteRewardError: FaultyArithmeticEnv gave query 'arith:.+' a non-finite reward \(nan\)$",
    "engine": re.escape(f"ValueError: {faulty_envs.SAMPLING_REFUSED}"),
}


def _fail_on(algo, mode: str) -> None:
    def switch(runner, _mode=mode):
        runner.env.fail_on = _mode
        if _mode == "engine":  # the engine refuses the sampling parameters
            faulty_envs.install_refusing_engine(runner)

    algo.env_runner_group.foreach_env_runner(switch, local_env_runner=False)


@pytest.fixture(scope="module")
def sync_algo(ray_session, tiny_random_model):
    """One synchronous run (FaultyArithmeticEnv, a plain ArithmeticEnv with fail_on 'none') for the runner errors
    and the synchronous kill: each test leaves its runner healthy and plain, and counts from its own start, so the
    two pay for one build. 128 queries: the two tests' ~12 iterations of 4 stay in the data's first pass (the
    kill test counts the data position without wrapping)."""
    env_config = {"fail_on": "none", "num_queries": 128}
    algo = _config(
        tiny_random_model, faulty_envs.FaultyArithmeticEnv, env_config=env_config, max_staleness=0
    ).build_algo()
    yield algo
    algo.stop()


def _plain_again(algo) -> None:
    """Undo _fail_on: the env's failures off, the engine's own ``generate`` back."""

    def plain(runner):
        runner.env.fail_on = "none"
        runner.engine.__dict__.pop("generate", None)

    algo.env_runner_group.foreach_env_runner(plain, local_env_runner=False)


def test_a_runner_error_stops_the_iteration_with_its_cause(sync_algo):
    """Each error reaches ``train()`` at once, with the runner, env, query and the runner's traceback, and the runner
    process stays up (a run that catches the error can go on, and does below). "engine": the runner's engine refuses
    the sampling parameters (config rules already refuse temperature <= 0 and top_p outside (0, 1], see the next
    test; an engine may refuse more)."""
    algo = sync_algo
    algo.train()
    try:
        for mode, message in CASES.items():
            _fail_on(algo, mode)
            t0 = time.monotonic()
            with pytest.raises(RunnerError, match=message) as caught:
                algo.train()
            elapsed = time.monotonic() - t0
            print(f"{mode}: error after {elapsed:.2f} s")
            assert elapsed < ERROR_WITHIN_S
            err = caught.value
            assert err.worker_index == 1 and err.env == "FaultyArithmeticEnv"
            assert "in sample_or_error" in str(err.__cause__)  # raised from the runner's own traceback
            copy = pickle.loads(pickle.dumps(err))  # crosses process boundaries (Tune trial -> driver) whole
            assert str(copy) == str(err) and copy.query_id == err.query_id
            # The runner process is still up (its error was returned, not raised into RLlib, which exits it).
            assert algo.env_runner_group.healthy_worker_ids() == [1]
    finally:
        _plain_again(algo)
    # The run goes on: a full batch after the errors.
    before = algo.train()["num_env_steps_sampled_lifetime"]
    assert algo.train()["num_env_steps_sampled_lifetime"] - before == QUERIES * GROUP


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (dict(temperature=-1.0), "temperature must be finite and > 0"),
        (dict(temperature=float("nan")), "temperature must be finite and > 0"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
    ],
)
def test_bad_sampling_settings_are_refused_before_any_runner_starts(tiny_random_model, setting, message):
    with pytest.raises(ValueError, match=message):
        _config(tiny_random_model, **setting).validate()


def _runner_handle(algo, worker_id: int):
    return algo.env_runner_group._worker_manager.actors()[worker_id]


@pytest.mark.parametrize("max_staleness", [0, 2], ids=["sync", "streaming"])
def test_the_only_runner_killed_the_run_waits_for_its_restart(
    request, ray_session, tiny_random_model, max_staleness
):
    """Killed between iterations (as by the OS for memory), the only runner is restarted by Ray; the iteration that
    finds it gone waits for it, restores it (current weights, data position) and trains on a full batch of real
    samples. Streaming (max_staleness=2) first trains the requests already delivered (up to 2), so the loss shows
    up to two iterations later. Synchronous: then a restart that completes before the next request (below); it
    runs on the runner-error test's algorithm (sync_algo)."""
    if max_staleness == 0:
        algo = request.getfixturevalue("sync_algo")
    else:
        algo = _config(tiny_random_model, max_staleness=max_staleness).build_algo()
    try:
        sampled = [algo.train()["num_env_steps_sampled_lifetime"]]
        [position] = algo.env_runner_group.foreach_env_runner(lambda r: r.env.state(), local_env_runner=False)
        ray.kill(_runner_handle(algo, 1), no_restart=False)
        for _ in range(3):
            t0 = time.monotonic()
            sampled.append(algo.train()["num_env_steps_sampled_lifetime"])
            print(f"{max_staleness=}: iteration after the kill took {time.monotonic() - t0:.1f} s")
        # Full batches, not a fake row of nothing.
        assert [b - a for a, b in zip(sampled[:-1], sampled[1:], strict=True)] == [QUERIES * GROUP] * 3
        assert algo.env_runner_group.healthy_worker_ids() == [1]
        if max_staleness == 0:  # synchronous: the restored runner went on from its last delivered rollout
            [after] = algo.env_runner_group.foreach_env_runner(
                lambda r: r.env.state(), local_env_runner=False
            )
            assert after["cursor"] == position["cursor"] + 3 * QUERIES
            [version] = algo.env_runner_group.foreach_env_runner(
                lambda r: r.engine.version, local_env_runner=False
            )
            assert version == algo.learner_call(lambda lr: lr.policy_state.version)[0]
            _restarted_before_the_next_request(algo, after)
    finally:
        if max_staleness != 0:
            algo.stop()


def _incarnation(handle) -> str | None:
    try:
        return ray.get(handle.apply.remote(lambda r: r.incarnation), timeout=5)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return None


def _restarted_before_the_next_request(algo, position: dict) -> None:
    """The runner killed again, and Ray's restart complete before the next request (RLlib never saw it die): the
    fresh process's rollout (initial weights, the start of its data) is dropped, the runner restored, and the
    iteration trains on a full batch from where the last delivered rollout left off."""
    handle = _runner_handle(algo, 1)
    before = _incarnation(handle)
    ray.kill(handle, no_restart=False)
    deadline = time.monotonic() + 120
    while _incarnation(handle) in (None, before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert algo.env_runner_group.healthy_worker_ids() == [1]  # RLlib does not know
    sampled = algo.train()["num_env_steps_sampled_lifetime"]
    [after] = algo.env_runner_group.foreach_env_runner(lambda r: r.env.state(), local_env_runner=False)
    assert after["cursor"] == position["cursor"] + QUERIES  # not QUERIES from the start of the data
    [version] = algo.env_runner_group.foreach_env_runner(lambda r: r.engine.version, local_env_runner=False)
    assert version == algo.learner_call(lambda lr: lr.policy_state.version)[0]
    assert sampled > 0


def test_a_dead_learner_is_named(ray_session, tiny_random_model):
    """num_learners=2 (FSDP2 over gloo): learner rank 1's process is killed between iterations; the next update
    fails with LearnerDiedError naming rank 1 and how to resume, not with gloo's "Connection reset by peer"."""
    config = _config(tiny_random_model, env=faulty_envs.NoisyRewardEnv).learners(
        num_learners=2, num_cpus_per_learner=1
    )
    algo = config.build_algo()
    try:
        algo.train()
        ranks = algo.learner_call(lambda lr: lr._rank)
        assert ranks == [0, 1]  # RLlib's actor ids are the ranks
        ray.kill(algo.learner_group._workers[1], no_restart=True)
        t0 = time.monotonic()
        with pytest.raises(LearnerDiedError, match=r"learner rank 1 died \(.*\).*--resume") as caught:
            algo.train()
        print(f"learner death reported after {time.monotonic() - t0:.1f} s")
        assert caught.value.ranks == (1,)
    finally:
        algo.stop()


#: phase -> (the learner method whose rank-1 call raises before its first collective, what the driver does).
COLLECTIVE_PHASES = {
    "update": ("update_from_samples", lambda algo, path: algo.train()),
    "save": ("save_dcp", lambda algo, path: algo.save(path)),
    "load": ("load_dcp", lambda algo, path: algo.restore(path)),
    "export": ("export_hf", lambda algo, path: algo.export_policy(path)),
}


@pytest.mark.parametrize("phase", list(COLLECTIVE_PHASES))
def test_a_learner_that_raises_in_a_collective_call_is_reported_while_the_other_waits(
    ray_session, tiny_random_model, tmp_path, phase
):
    """num_learners=2 (FSDP2 over gloo): rank 1's call raises before its first collective, while rank 0 waits for
    it in one (the update's forward all-gather, DCP's save and load, the export's state-dict gather). Before, the
    driver waited for both calls, so the run hung until the process group's timeout (Ray Train's 30 minutes) with
    the error unseen; now rank 1's error reaches the caller within seconds (learner_calls.collective_results), and
    the stop kills the learner still waiting rather than waiting Ray Train's 30-s teardown timeout for it."""
    import threading

    method, act = COLLECTIVE_PHASES[phase]
    # Noisy rewards: every group has advantages, so every iteration updates.
    config = _config(tiny_random_model, env=faulty_envs.NoisyRewardEnv).learners(
        num_learners=2, num_cpus_per_learner=1
    )
    algo = config.build_algo()
    try:
        if phase == "update":
            algo.train()  # the first update runs unarmed: the failure lands in a run already under way
        target = str(tmp_path / "out")
        if phase == "load":
            target = algo.save(str(tmp_path / "ckpt")).checkpoint.path
        message = f"rank 1's {method} failed before its first collective"

        def arm(learner, _method=method, _message=message) -> None:  # nested: sent by value
            def fail(*args, **kwargs):
                raise ValueError(_message)

            if learner._rank == 1:
                setattr(learner, _method, fail)

        algo.learner_group.foreach_learner(arm)
        outcome: dict = {}

        def call() -> None:
            try:
                act(algo, target)
            except Exception as e:  # noqa: BLE001 - the error is what the test checks
                outcome["error"] = e

        t0 = time.monotonic()
        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(timeout=120)
        assert not thread.is_alive(), f"the {phase} still waits for the learner stuck in the collective"
        print(f"the failure was reported after {time.monotonic() - t0:.1f} s")
        assert message in str(outcome.get("error")), outcome
    finally:
        # The learner left in its collective is killed, not waited for (learner_calls.stop_stuck_learners).
        t0 = time.monotonic()
        algo.stop()
        print(f"the stop took {time.monotonic() - t0:.1f} s")

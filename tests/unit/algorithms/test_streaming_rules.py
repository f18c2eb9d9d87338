"""Streaming rollouts (max_staleness): the staleness of a group, the drop at training, the config's rules and the
request slots it reserves on each runner."""

from __future__ import annotations

import dataclasses

import pytest
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.iteration_settings import max_staleness_of
from r3_rllib.algorithms.r3.r3_schedule import schedule_for_config
from r3_rllib.algorithms.r3.streaming import group_staleness, split_stale_groups
from r3_rllib.types.samples import Group


def _group(query_id: str, versions: list[int], reflection: bool = False) -> Group:
    samples = [
        dataclasses.replace(s, policy_version=v)
        for s, v in zip(random_samples(len(versions)), versions, strict=True)
    ]
    return Group(query_id, samples, is_reflection=reflection)


def test_a_group_is_as_stale_as_its_oldest_sample_and_older_groups_are_dropped():
    fresh, mixed, old = _group("a", [5, 5]), _group("b", [3, 5]), _group("c", [2, 2], reflection=True)
    assert [group_staleness(g, 5) for g in (fresh, mixed, old)] == [0, 2, 3]
    kept, stale = split_stale_groups([fresh, mixed, old], policy_version=5, max_staleness=2)
    assert kept == [fresh, mixed] and stale == [old]
    assert split_stale_groups([fresh, mixed, old], policy_version=5, max_staleness=3) == (
        [fresh, mixed, old],
        [],
    )


def test_max_staleness_defaults_to_the_overlap_setting():
    assert max_staleness_of(R3Config()) == 0
    assert max_staleness_of(R3Config().training(overlap_generation=True)) == 1
    assert max_staleness_of(R3Config().training(max_staleness=4)) == 4
    assert max_staleness_of(R3Config().training(overlap_generation=True, max_staleness=1)) == 1


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"max_staleness": -1}, "max_staleness"),
        ({"max_staleness": 2, "overlap_generation": True}, "overlap_generation=True is max_staleness=1"),
        ({"max_staleness": 0, "overlap_generation": True}, "overlap_generation=True is max_staleness=1"),
        ({"max_staleness": 2, "sleep_between_rollouts": True}, "engine must stay awake"),
        ({"max_staleness": 3, "dynamic_sampling": True, "replay": False}, "streaming rollouts"),
        ({"partial_rollouts": True}, "partial_rollouts needs generation to overlap"),
        (
            {
                "partial_rollouts": True,
                "max_staleness": 2,
                "engine": "vllm",
                "engine_kwargs": {"in_process": False},
            },
            "needs the engine core in the runner's process",
        ),
        ({"partial_rollouts": True, "max_staleness": 2, "rollout_head": True}, "rollout_head"),
        (
            {"partial_rollouts": True, "max_staleness": 2, "engine": "vllm", "lora_rank": 8},
            "LoRA needs engine_kwargs\\['lora_mode'\\]='merge'",
        ),
    ],
)
def test_contradicting_settings_are_refused(training, message):
    with pytest.raises(ValueError, match=message):
        R3Config().training(**training).validate()


def test_streaming_reserves_request_slots_and_the_schedule_counts_its_lag():
    config = R3Config().training(max_staleness=3)
    config.validate()
    # twice max_staleness per runner and tag, plus one
    assert config.max_requests_in_flight_per_env_runner == 7
    sync = R3Config().training(max_staleness=0)
    sync.validate()
    assert sync.max_requests_in_flight_per_env_runner == R3Config().max_requests_in_flight_per_env_runner
    lags = [
        schedule_for_config(R3Config.r3_preset().training(max_staleness=k), dataset_size=64).revisit_max
        for k in (0, 1, 3)
    ]
    assert lags[1] - lags[0] == 1 and lags[2] - lags[0] == 3


def test_partial_rollouts_are_accepted_with_overlap_or_streaming_on_hf_and_in_process_vllm_engines():
    for training in ({"overlap_generation": True}, {"max_staleness": 1}, {"max_staleness": 4}):
        R3Config().training(partial_rollouts=True, **training).validate()
        R3Config().training(partial_rollouts=True, engine="vllm", **training).validate()
        merged = {"lora_mode": "merge"}
        R3Config().training(
            partial_rollouts=True, engine="vllm", lora_rank=8, engine_kwargs=merged, **training
        ).validate()


def _result(worker_id: int, fresh: int, reflection: int = 0, env_epoch: int = 0):
    from r3_rllib.algorithms.r3.rollout_types import RolloutResult, RolloutTimings, RunnerState

    groups = tuple(_group(f"w{worker_id}q{i}", [0]) for i in range(fresh))
    groups += tuple(_group(f"w{worker_id}r{i}", [0], reflection=True) for i in range(reflection))
    return RolloutResult(
        worker_id, groups, env_epoch, RolloutTimings(), 0, {}, RunnerState(env={}, sample_seed=0)
    )


def test_a_batch_takes_the_oldest_requests_and_waits_for_one_about_to_go_stale():
    from r3_rllib.algorithms.r3.streaming import QueuedRollout, StreamingCoordinator

    config = R3Config().training(max_staleness=2, queries_per_iteration=4)
    coordinator = StreamingCoordinator(runners=None, config=config, metrics=None, max_staleness=2)
    coordinator.queue = [
        QueuedRollout(5, _result(1, 2, env_epoch=2)),
        QueuedRollout(3, _result(2, 2, reflection=1, env_epoch=1)),
        QueuedRollout(4, _result(1, 2, env_epoch=1)),
    ]
    # requests 3 and 4 (oldest first) hold 4 fresh groups; the reflection comes along
    taken = coordinator._take(4)
    assert sorted(q.request for q in taken) == [3, 4] and [q.request for q in coordinator.queue] == [5]
    assert [q.result.worker_id for q in taken] == [1, 2]  # merged in worker order
    # the data epoch is the trained requests' (1), not that of request 5, delivered but still queued (2)
    assert coordinator.epoch.value == 1 and coordinator.epoch.runner_epochs == {1: 1, 2: 1}
    coordinator._take(4)
    assert coordinator.epoch.runner_epochs == {1: 2, 2: 1} and coordinator.epoch.value == 1
    # request 7, issued at version 3, is still in flight: trained after version 5 it would be 3 versions old
    coordinator._in_flight, coordinator._issued = {2: [7]}, {7: 3}
    assert coordinator._at_risk(policy_version=5) and not coordinator._at_risk(policy_version=4)
    assert not coordinator._at_risk(
        policy_version=None
    )  # draining for a checkpoint waits for everything anyway


def test_the_iterations_after_a_timeout_report_zero_timeouts_and_one_without_fresh_samples_no_lag():
    """Both were NaN there before (RLlib reports a key logged in an earlier iteration and not in this one as NaN):
    ``runners_timed_out`` was logged only by the iteration with a timeout, and ``policy_lag`` / ``staleness_max``
    only by one with a fresh sample (here every group went stale)."""
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

    from r3_rllib.algorithms.r3.streaming import QueuedRollout, StreamingCoordinator

    config = R3Config().training(max_staleness=2, queries_per_iteration=4, rollout_timeout_s=0.001)
    coordinator = StreamingCoordinator(runners=None, config=config, metrics=MetricsLogger(), max_staleness=2)
    hung = []
    for name in ("_top_up", "_forget_lost_requests"):
        setattr(coordinator, name, lambda *args: None)
    coordinator._receive = lambda timeout_s: 0  # nothing comes back
    coordinator._restart_hung_runners = hung.extend
    results = []
    for version, in_flight in ((0, {2: [9]}), (5, {})):
        coordinator.queue = [QueuedRollout(version, _result(1, 2))]  # 2 fresh groups sampled at version 0
        coordinator._in_flight, coordinator._issued = in_flight, {9: 0}
        coordinator.rollout(None, lambda: None, version)
        results.append(MetricsLogger.peek_results(coordinator.metrics.reduce())["rollout"])
    assert hung == [2]  # the first iteration's wait for runner 2 timed out
    picked = [{k: r.get(k) for k in ("runners_timed_out", "policy_lag", "staleness_max")} for r in results]
    assert picked == [
        {"runners_timed_out": 1.0, "policy_lag": 0.0, "staleness_max": 0.0},
        {"runners_timed_out": 0.0, "policy_lag": None, "staleness_max": None},  # its 2 groups: 5 versions old
    ]
    assert results[1]["stale_groups_dropped"] == 2.0


def test_a_synchronous_rollout_of_reflection_groups_alone_reports_no_lag_rather_than_nan():
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

    from r3_rllib.algorithms.r3.coordinator import RolloutCoordinator
    from r3_rllib.algorithms.r3.rollout_types import Rollout

    coordinator = RolloutCoordinator(runners=None, config=R3Config(), metrics=MetricsLogger())
    lags = []
    for groups in ((_group("q", [1, 1]),), (_group("q", [2, 2], reflection=True),)):
        coordinator._next = lambda num_queries, reflection, groups=groups: Rollout(groups=groups)
        coordinator.rollout(None, lambda: None, policy_version=2)
        lags.append(MetricsLogger.peek_results(coordinator.metrics.reduce())["rollout"].get("policy_lag"))
    assert lags == [1.0, None]  # fresh samples one version old; then no fresh sample: absent, not NaN

"""core/threads.py: the torch threads of each phase, hand-computed for the layouts users run, and the config's
choice between them and the reservations."""

from __future__ import annotations

import pytest

from r3_rllib import R3Config
from r3_rllib.core import threads
from r3_rllib.core.threads import PhaseThreads, phase_threads


def plan(cores, overlapped, runners, runner_cpus=1, learners=0, learner_cpus=None):
    return phase_threads(
        cores=cores,
        overlapped=overlapped,
        num_env_runners=runners,
        runner_cpus=runner_cpus,
        num_learners=learners,
        learner_cpus=learner_cpus,
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # Synchronous: each phase has the machine to itself, shared by the runners (or the learners).
        ((2, False, 1), PhaseThreads(runner=2, learner=2)),
        ((16, False, 4), PhaseThreads(runner=4, learner=16)),
        ((16, False, 4, 1, 2), PhaseThreads(runner=4, learner=8)),
        ((3, False, 2), PhaseThreads(runner=1, learner=3)),  # 3 // 2 = 1: never below the reservation
        ((2, False, 4, 2), PhaseThreads(runner=2, learner=2)),  # reservations above the share are kept
        # Overlapped: the runners keep their reservations, the learners share the rest.
        ((2, True, 1), PhaseThreads(runner=1, learner=1)),
        ((16, True, 4, 2), PhaseThreads(runner=2, learner=8)),
        ((16, True, 4, 2, 2), PhaseThreads(runner=2, learner=4)),
        ((4, True, 4), PhaseThreads(runner=1, learner=1)),  # nothing left: one thread (at least)
        ((4, True, 4, 1, 0, 3), PhaseThreads(runner=1, learner=3)),  # an explicit learner reservation
    ],
)
def test_phase_threads(args, expected):
    assert plan(*args) == expected


def test_config_auto_and_reserved(monkeypatch):
    monkeypatch.delenv("R3_CPU_THREADS", raising=False)  # the test suite sets it (tests/conftest.py)
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    monkeypatch.setattr("r3_rllib.algorithms.r3.config.available_cores", lambda: 8)
    config = R3Config().env_runners(num_env_runners=2, num_cpus_per_env_runner=1).learners(num_learners=0)
    # The default, 'auto': the update takes the machine's cores, the runners keep their reservation.
    assert config.phase_threads() == PhaseThreads(runner=1, learner=8)
    config.training(cpu_threads="all")
    assert config.phase_threads() == PhaseThreads(runner=4, learner=8)
    config.training(cpu_threads="auto")
    config.training(overlap_generation=True)
    assert config.phase_threads() == PhaseThreads(runner=1, learner=6)
    config.training(cpu_threads="reserved")
    assert config.phase_threads() == PhaseThreads(runner=1, learner=1)
    config.training(cpu_threads="auto", overlap_generation=False)
    config.learners(num_learners=1, num_gpus_per_learner=1)
    assert config.phase_threads() == PhaseThreads(runner=1, learner=1)  # a GPU learner keeps its reservation
    with pytest.raises(ValueError, match="cpu_threads"):
        R3Config().training(cpu_threads="every").validate()


def test_the_environment_variable_sets_the_default_and_a_bad_value_is_refused(monkeypatch):
    monkeypatch.setenv("R3_CPU_THREADS", "reserved")
    assert R3Config().cpu_threads == "reserved"
    monkeypatch.setenv("R3_CPU_THREADS", "all")
    assert R3Config().cpu_threads == "all"
    monkeypatch.delenv("R3_CPU_THREADS")
    assert R3Config().cpu_threads == "auto"
    monkeypatch.setenv("R3_CPU_THREADS", "fast")
    with pytest.raises(ValueError, match="cpu_threads"):
        R3Config().validate()


@pytest.mark.parametrize(
    ("planned", "reserved", "cores", "runnable", "expected"),
    [
        (2, 1, 2, 1, 2),  # only this task runs: the whole plan
        (2, 1, 2, 2, 1),  # another task is running: one free core, one thread
        (8, 1, 8, 4, 5),  # three others running: 5 free cores
        (8, 2, 8, 30, 2),  # a busy machine (a host's count seen from a container): the reservation
        (4, 1, 16, 1, 4),  # never above the plan
        (2, 1, 2, None, 1),  # unknown: the reservation
    ],
)
def test_threads_now(planned, reserved, cores, runnable, expected):
    assert threads.threads_now(planned, reserved, cores, runnable) == expected


def test_phase_start_threads_reads_the_runnable_tasks(monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 4)
    monkeypatch.setattr(threads, "runnable_tasks", lambda: 3)
    assert threads.phase_start_threads(4, 1) == 2  # two others running on four cores
    assert threads.phase_start_threads(1, 1) == 1  # within the reservation: no reading needed


def test_runnable_tasks_reads_proc_loadavg():
    count = threads.runnable_tasks()
    if count is None:
        pytest.skip("no /proc/loadavg on this system")
    assert count >= 1  # the reading task itself is runnable

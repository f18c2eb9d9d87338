"""core/threads.py: the torch threads of each phase, hand-computed for the layouts users run, and the config's
choice between them and the reservations."""

from __future__ import annotations

import functools

import pytest

from r3_rllib import R3Config
from r3_rllib.core import threads
from r3_rllib.core.threads import PhaseThreads, phase_threads
from r3_rllib.engines.registry import engine_capabilities


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


def test_auto_gives_free_cores_to_runners_whose_engine_samples_the_same_bits_at_any_thread_count(monkeypatch):
    """vLLM's samples are the same bits at any thread count (tests/e2e/test_vllm_engine_threads.py): under 'auto'
    its runners take their share of the cores in the synchronous loop. Not under overlap (the learner's cores), nor
    with a rollout head or LoRA adapters (not checked), nor for the HF engine (its log-probs move in the last bit)."""
    monkeypatch.delenv("R3_CPU_THREADS", raising=False)
    monkeypatch.setattr("r3_rllib.algorithms.r3.config.available_cores", lambda: 8)
    config = R3Config().env_runners(num_env_runners=2, num_cpus_per_env_runner=1).learners(num_learners=0)
    assert (
        engine_capabilities("vllm").thread_invariant_sampling
        and not engine_capabilities("hf").thread_invariant_sampling
    )
    assert config.copy().training(engine="vllm").phase_threads() == PhaseThreads(runner=4, learner=8)
    assert config.copy().training(engine="hf").phase_threads().runner == 1
    assert config.copy().training(engine="vllm", overlap_generation=True).phase_threads().runner == 1
    assert config.copy().training(engine="vllm", rollout_head=True).phase_threads().runner == 1
    assert config.copy().training(engine="vllm", lora_rank=8).phase_threads().runner == 1
    assert config.copy().training(engine="vllm", cpu_threads="reserved").phase_threads().runner == 1


def test_the_environment_variable_sets_the_default_and_a_bad_value_is_refused(monkeypatch):
    monkeypatch.setenv("R3_CPU_THREADS", "reserved")
    assert R3Config().cpu_threads == "reserved"
    monkeypatch.setenv("R3_CPU_THREADS", "all")
    assert R3Config().cpu_threads == "all"
    monkeypatch.delenv("R3_CPU_THREADS")
    assert R3Config().cpu_threads == "auto"
    monkeypatch.setenv("R3_CPU_THREADS", "fast")
    with pytest.raises(
        ValueError, match="R3_CPU_THREADS='fast' in the environment .* not one of auto, reserved, all"
    ):
        R3Config()


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


def test_own_running_threads_counts_state_r_after_the_last_parenthesis(tmp_path):
    stats = {"10": "10 (python) R 1 10", "11": "11 (omp (worker) 1) R 1 10", "12": "12 (ray::IDLE) S 1 10"}
    for tid, text in stats.items():
        (tmp_path / tid).mkdir()
        (tmp_path / tid / "stat").write_text(text)
    (tmp_path / "13").mkdir()  # a thread that ended between the listing and the read
    assert threads.own_running_threads(str(tmp_path)) == 2
    assert threads.own_running_threads(str(tmp_path / "missing")) == 1
    assert threads.own_running_threads() >= 1  # this process: at least the calling thread


def test_this_process_s_spinning_threads_are_not_counted_as_other_jobs(monkeypatch, tmp_path):
    """Two runnable tasks on the machine, both ours (the caller and an OpenMP worker still spinning): the machine is
    free, so the whole plan; with one running thread of ours, the other task is another job's."""
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("1.00 1.00 1.00 2/300 12345\n")
    monkeypatch.setattr(
        threads, "runnable_tasks", functools.partial(threads.runnable_tasks, loadavg=str(loadavg))
    )
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.setattr(threads, "own_running_threads", lambda: 2)
    assert threads.runnable_tasks() == 1 and threads.phase_start_threads(2, 1) == 2
    monkeypatch.setattr(threads, "own_running_threads", lambda: 1)
    assert threads.runnable_tasks() == 2 and threads.phase_start_threads(2, 1) == 1


def test_the_follower_moves_at_the_reading_that_finds_a_change_and_averages_over_time(monkeypatch):
    """Planned 2, reserved 1, started on 1 thread on a 2-core machine; a reading at most every 0.1 s."""
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    now, readings, applied = (
        [0.0],
        [None],
        [],
    )  # the first reading (at construction) has nothing to compare with
    follower = threads.FreeCoreFollower(
        planned=2,
        reserved=1,
        current=1,
        set_threads=applied.append,
        read_busy=lambda: readings.pop(0),
        clock=lambda: now[0],
    )
    assert follower.follows and follower.interval_s == 0.1
    steps = [  # (time, cores busy elsewhere read, or "-" when no reading is due; threads after)
        (0.05, "-", 1),  # before the first interval: nothing read
        (0.1, 0.9, 1),  # the other core busy: stays on one
        (0.15, "-", 1),  # 0.05 s after the last reading: none due
        (0.21, 0.5, 1),  # half a core busy counts as busy
        (0.32, 0.4, 2),  # less than half: free, two threads from t = 0.32
        (0.43, 0.0, 2),
        (0.54, None, 2),  # no reading: no change
        (0.65, 0.6, 1),  # busy again: back to one at once, at t = 0.65
    ]
    for t, reading, want in steps:
        now[0] = t
        if reading != "-":
            readings.append(reading)
        follower.poll()
        assert not readings and follower.current == want, t
    assert applied == [2, 1] and follower.changes == 2
    now[0] = 1.0  # 1 thread for 0.32 s, 2 for 0.33 s, 1 for 0.35 s: 1.33 thread-seconds over 1.0 s
    assert follower.mean_threads() == pytest.approx(1.33)
    assert not threads.FreeCoreFollower(planned=1, reserved=1, current=1, set_threads=applied.append).follows


def test_busy_elsewhere_is_the_machine_s_busy_time_less_this_process_s(tmp_path):
    """In whole clock ticks, so the expected value holds for any SC_CLK_TCK: over 0.5 s the machine was busy 150
    ticks (100 user, 25 system, 25 stolen), this process 75 of them: 75 ticks elsewhere per 0.5 s."""
    hz = threads.os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    now, own = [10.0], [3.0]
    reader = threads.BusyElsewhere(str(stat), own_seconds=lambda: own[0], clock=lambda: now[0])

    def write(
        user, system, idle, steal
    ):  # cpu user nice system idle iowait irq softirq steal guest guest_nice
        ticks = " ".join(str(v) for v in (user, 0, system, idle, 0, 0, 0, steal, 0, 0))
        stat.write_text(f"cpu  {ticks}\ncpu0 0 0 0 0 0 0 0 0 0 0\n")

    write(10_000, 1_000, 50_000, 0)
    assert reader() is None  # nothing to compare with yet
    now[0], own[0] = 10.5, 3.0 + 75 / hz
    write(10_100, 1_025, 50_050, 25)
    assert reader() == pytest.approx(75 / hz / 0.5)
    assert threads.BusyElsewhere(str(tmp_path / "missing"))() is None


def test_the_learner_grows_to_its_share_of_the_machine_under_overlap(monkeypatch):
    monkeypatch.setattr("r3_rllib.algorithms.r3.config.available_cores", lambda: 8)
    config = R3Config().env_runners(num_env_runners=2).learners(num_learners=0).training(cpu_threads="auto")
    assert config.copy().training(max_staleness=1).phase_threads().learner == 6  # starts beside the runners
    assert config.copy().training(max_staleness=1).most_learner_threads() == 8  # grows while they wait
    assert config.copy().learners(num_learners=2).most_learner_threads() == 4
    assert config.copy().training(cpu_threads="reserved").most_learner_threads() == 1
    assert config.copy().learners(num_learners=1, num_gpus_per_learner=1).most_learner_threads() == 1


def test_an_idle_machine_is_read_once_a_busy_one_three_times(monkeypatch, tmp_path):
    """Own threads are read only when the machine counts more than the caller; the least of three readings when
    something else stays runnable, one reading when the first finds nothing else."""
    loadavg, reads, own = tmp_path / "loadavg", [], [1]
    monkeypatch.setattr(threads, "own_running_threads", lambda: reads.append(1) or own[0])
    loadavg.write_text("0.10 0.10 0.10 1/300 12345\n")
    assert (
        threads.runnable_tasks(loadavg=str(loadavg)) == 1 and not reads
    )  # the caller alone: nothing to read
    loadavg.write_text("2.00 2.00 2.00 3/300 12345\n")
    assert threads.runnable_tasks(loadavg=str(loadavg), gap_s=0.0) == 3 and len(reads) == 3
    own[0] = 3  # the three runnable tasks are this process's threads: one reading, the least possible
    assert threads.runnable_tasks(loadavg=str(loadavg), gap_s=0.0) == 1 and len(reads) == 4

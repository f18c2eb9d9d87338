"""Shared fixtures: one local Ray session for the whole run, the shared data folder, thread limits."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Token authentication stays on in tests too: Ray's ports listen on every interface (r3_rllib/ray_session.py).
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
# OpenMP threads that wait at a barrier sleep instead of spinning. Every process the tests start inherits it (Ray's
# workers, `r3` subprocesses; OpenMP reads it when torch loads, after this line). Tests share 2 cores with other
# test processes (scripts/test.sh runs three side by side) and a learner or engine with 2 torch threads spins on
# cores the others need: measured here (load ~5 from other jobs), 6 forward+backward steps of the tiny model with 2
# threads took 5.3 s of CPU with PASSIVE against 14.6-16.8 s spinning (wall 8-11 s against 18-41 s). The results
# are the same bits: the policy changes how an idle thread waits, not what any thread computes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The suite's runs keep cpu_threads at the CPUs Ray reserves (R3_CPU_THREADS: that setting's default where it is
# set): CI runs three test processes on two cores, the shared machine 'reserved' is for; 'auto' (the default
# elsewhere) took the run from 27.3-27.7 to 29.0 min. The tests of 'auto' itself set it or clear the variable.
os.environ.setdefault("R3_CPU_THREADS", "reserved")

from numeric import TORCH_THREADS  # noqa: E402  (tests/ is on sys.path: this conftest's folder)
from repo_paths import SHARED_DATA  # noqa: E402

TESTS = Path(__file__).resolve().parent
E2E = TESTS / "e2e"
#: The `numeric` unit tests: torch float results compared with tolerances (tests/numeric.py) whose rounding depends
#: on the CPU's kernels and the thread count. scripts/test.sh runs them again under every ATEN_CPU_CAPABILITY
#: (default, avx2, avx512) x R3_TEST_TORCH_THREADS (1, 2) combination. numpy-only files (advantages, HGPO, rarity)
#: are left out: ATen's capability does not reach numpy.
NUMERIC = {
    "unit/core/test_losses.py",
    "unit/core/test_mismatch.py",
    "unit/algorithms/test_mismatch_learner.py",
    "unit/algorithms/test_learner_update.py",
    "unit/algorithms/test_learner_functions.py",
    "unit/algorithms/test_r2po_stages.py",
    "unit/algorithms/test_lora_learner.py",
    "unit/engines/test_hf_engine.py",
    "unit/engines/test_kv_cache.py",
    "unit/engines/test_partial_rollout_engine.py",
    "unit/engines/test_lora_engines.py",
    "unit/models/test_rollout_head.py",
}


def pytest_collection_modifyitems(config, items):
    """Everything under tests/e2e (Ray sessions, engines, subprocesses) is `slow`, and so are the unit tests marked
    so one by one (a fresh process or server, a timeout waited out, a short training run: ~1 s or more each):
    `pytest -m "not slow"` runs the rest of tests/unit, which mirrors the package. The files in NUMERIC are
    `numeric`."""
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if E2E in path.parents:
            item.add_marker(pytest.mark.slow)
        if path.is_relative_to(TESTS) and path.relative_to(TESTS).as_posix() in NUMERIC:
            item.add_marker(pytest.mark.numeric)


@pytest.fixture(autouse=True)
def _torch_threads():
    """Every test starts with R3_TEST_TORCH_THREADS torch threads (default 1: two threads collapse under load on 2
    cores; scripts/test.sh runs the `numeric` tests with 2 as well, where a sum's order, and so its rounding, changes
    with the threads). Only when torch is imported already: tests without torch do not pay for it."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(TORCH_THREADS)
    yield


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data folder {SHARED_DATA} is absent")
    return SHARED_DATA


@pytest.fixture(scope="session")
def ray_session():
    """One Ray instance for all tests (start-up costs ~5 s). Logical CPUs exceed the 2 cores on purpose: actors
    here mostly wait on each other, and Tune trials need room for a runner and a learner each."""
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=4,
            address="local",
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1"}},
        )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_random_model(tmp_path_factory) -> str:
    """An untrained tiny Qwen2 with the character tokenizer (for plumbing tests that need no skill)."""
    import torch

    from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny

    torch.set_num_threads(TORCH_THREADS)
    path = tmp_path_factory.mktemp("tiny_random")
    tok = build_tiny_tokenizer()
    save_tiny(build_tiny_model(tok, seed=0), tok, path)
    return str(path)


@pytest.fixture(scope="session")
def gridworld_warm_start(tmp_path_factory) -> str:
    """The tiny model warm-started on gridworld expert moves (~30 s of SFT, once per session): a partial policy
    (about a quarter of held-out layouts solved greedily) for the multi-step tests."""
    import torch

    from r3_rllib.warmstart.gridworld import build_warm_start

    threads = torch.get_num_threads()
    try:
        return str(build_warm_start(tmp_path_factory.mktemp("gridworld") / "warm_start", seed=0))
    finally:
        torch.set_num_threads(threads)


#: R3_TEST_CPU_LOG=<path>: each test's wall seconds and the CPU-seconds of this pytest process and everything it
#: started (Ray's raylet and every actor it forked, `r3` subprocesses), appended to <path>.<pid> as
#: "cpu_s wall_s processes nodeid" lines (processes: how many new ones the test started). For budgeting the suite's time: scripts/test.sh runs several test processes on two
#: cores, where a test's wall time says more about its neighbours than about it.
CPU_LOG = os.environ.get("R3_TEST_CPU_LOG")


class _TreeCPU:
    """The CPU-seconds of this process and its descendants, read every ``interval_s`` by a thread: a descendant's
    last reading stays counted after it exits (Ray's raylet does not collect its workers' times, so a reaped
    actor's CPU would otherwise vanish; what it used in its last interval is missed)."""

    def __init__(self, interval_s: float = 0.5) -> None:
        import threading

        import psutil

        self._psutil, self._me = psutil, psutil.Process()
        self._last: dict[tuple[int, float], float] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._run, args=(interval_s,), daemon=True, name="r3-test-cpu").start()

    def _run(self, interval_s: float) -> None:
        import time

        while True:
            self.total()
            time.sleep(interval_s)

    def total(self) -> float:
        """Read every live descendant now; the sum of the last reading of every process seen so far."""
        procs = [self._me]
        try:
            procs += self._me.children(recursive=True)
        except self._psutil.Error:
            pass
        with self._lock:
            for proc in procs:
                try:
                    t, key = proc.cpu_times(), (proc.pid, proc.create_time())
                except self._psutil.Error:
                    continue  # ended between the listing and the read
                self._last[key] = t.user + t.system
            return sum(self._last.values())

    def seen(self) -> int:
        """How many processes have been read so far (this one included)."""
        with self._lock:
            return len(self._last)


_TREE_CPU: list[_TreeCPU] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not CPU_LOG:
        yield
        return
    import time

    if not _TREE_CPU:
        _TREE_CPU.append(_TreeCPU())
    wall0, cpu0, seen0 = time.monotonic(), _TREE_CPU[0].total(), _TREE_CPU[0].seen()
    yield
    cpu, wall = _TREE_CPU[0].total() - cpu0, time.monotonic() - wall0
    with open(f"{CPU_LOG}.{os.getpid()}", "a") as f:
        f.write(f"{cpu:.2f} {wall:.2f} {_TREE_CPU[0].seen() - seen0} {item.nodeid}\n")


#: Metrics an iteration did not measure are absent from its result, not NaN (core/metric_groups.py): every result
#: that `R3.train` returns in an e2e test's own process is scanned, and a float NaN anywhere in it (its config left
#: out) fails the test, naming the iterations and keys (the NaN-loss test's run raises before a result holds its
#: NaN). Tune trials run in processes of their own and are not scanned.


def _nan_scanning(train, seen: list):
    """``train`` wrapped to record ``(iteration, NaN keys)`` of each result in ``seen``. Ray and Tune pickle R3 by
    value in places (a trial's actor class), wrapper included, and their processes cannot import this conftest:
    everything the wrapper reaches is defined inside this function (pickled by value) or importable anywhere."""

    def nan_keys(value: object, key: str = "") -> list[str]:
        """The '/'-joined keys under ``value`` (a result's ``config`` left out) that hold a float NaN."""
        import math

        if isinstance(value, dict):
            return [
                found
                for k, v in value.items()
                if not (key == "" and k == "config")
                for found in nan_keys(v, f"{key}/{k}" if key else str(k))
            ]
        return [key] if isinstance(value, float) and math.isnan(value) else []

    def scanned_train(self, *args, **kwargs):
        result = train(self, *args, **kwargs)
        keys = nan_keys(result)
        if keys:
            seen.append((result.get("training_iteration"), keys))
        return result

    return scanned_train


@pytest.fixture(autouse=True)
def _no_nan_in_results(request, monkeypatch):
    if E2E not in Path(str(request.node.fspath)).resolve().parents:
        yield
        return
    from r3_rllib.algorithms.r3.r3 import R3

    seen: list = []
    monkeypatch.setattr(R3, "train", _nan_scanning(R3.train, seen))
    yield
    assert not seen, f"results with NaN metrics (iteration, keys): {seen}"

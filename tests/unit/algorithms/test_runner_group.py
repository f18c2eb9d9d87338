"""The runner group R3 builds (runner_group.py), without Ray processes: remote runners get the config by value, a
config too large to inline keeps RLlib's ObjectRef, and ``R3.setup``'s binding of the class in RLlib's Algorithm
module is undone afterwards (the e2e side: tests/e2e/test_examples.py, a fresh process's stderr)."""

from __future__ import annotations

import threading

import pytest
from ray.rllib.algorithms import algorithm as rllib_algorithm
from ray.rllib.env.env_runner_group import EnvRunnerGroup

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.runner_group import R3EnvRunnerGroup, r3_env_runner_group


def _configs_given(monkeypatch, worker_index: int) -> list:
    """The config RLlib's `_make_worker` receives when add_workers asks for runner `worker_index` with the group's
    ObjectRef (a stand-in: no object store here)."""
    seen: list = []
    monkeypatch.setattr(EnvRunnerGroup, "_make_worker", lambda self, **kwargs: seen.append(kwargs["config"]))
    group = object.__new__(R3EnvRunnerGroup)  # no Ray: only the attributes _make_worker reads
    group._remote_config, group._remote_config_obj_ref = R3Config(), object()
    group._make_worker(config=group._remote_config_obj_ref, worker_index=worker_index, num_workers=1)
    return [c is group._remote_config for c in seen]


def test_remote_runners_get_the_config_by_value(monkeypatch):
    assert _configs_given(monkeypatch, worker_index=1) == [True]


def test_a_config_too_large_to_inline_keeps_rllibs_object_ref(monkeypatch):
    monkeypatch.setenv("RAY_max_direct_call_object_size", "1000")  # R3Config pickles to ~14 KB
    assert _configs_given(monkeypatch, worker_index=1) == [False]


def test_the_local_runner_gets_what_rllib_gives_it(monkeypatch):
    assert _configs_given(monkeypatch, worker_index=0) == [False]


def test_the_class_is_bound_during_setup_only_and_nests():
    rllib_class = rllib_algorithm.EnvRunnerGroup
    assert rllib_class is EnvRunnerGroup
    with r3_env_runner_group():
        with r3_env_runner_group():
            assert rllib_algorithm.EnvRunnerGroup is R3EnvRunnerGroup
        assert rllib_algorithm.EnvRunnerGroup is R3EnvRunnerGroup
    assert rllib_algorithm.EnvRunnerGroup is EnvRunnerGroup
    with pytest.raises(RuntimeError), r3_env_runner_group():
        raise RuntimeError("setup failed")
    assert rllib_algorithm.EnvRunnerGroup is EnvRunnerGroup


def test_overlapping_setups_in_threads_restore_rllibs_class():
    """Two setups whose windows overlap (A enters, B enters, A leaves, B leaves): RLlib's class comes back."""
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: list = []

    def a():
        with r3_env_runner_group():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b():
        a_in.wait(5)
        with r3_env_runner_group():
            b_in.set()
            a_out.wait(5)
            seen.append(rllib_algorithm.EnvRunnerGroup)

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [R3EnvRunnerGroup]
    assert rllib_algorithm.EnvRunnerGroup is EnvRunnerGroup

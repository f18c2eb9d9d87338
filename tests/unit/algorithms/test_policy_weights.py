"""PolicyWeights' sync after an update (weight_sync.py), against fake learner and runner groups with RLlib's call
shapes: the synchronous loop's loads start and are collected later, overlap's queue behind the rollouts, a runner
that refuses a load gets the blocking one, and a runner's error in its load reaches the caller at the collection."""

from __future__ import annotations

import pytest

from r3_rllib.algorithms.r3.weight_sync import WEIGHTS_TAG, PolicyWeights


class _Result:
    def __init__(self, value) -> None:
        self.ok, self._value = True, value

    def get(self):
        return self._value


class FakeLearners:
    is_local = True  # one learner in the driver's process: called as foreach_learner calls it

    def __init__(self, version: int) -> None:
        self.version = version

    def foreach_learner(self, fn):
        return [_Result(fn(self))]

    def weights_ref(self):
        return f"ref-v{self.version}", self.version


class FakeRunner:
    def __init__(self, fail: bool = False) -> None:
        self.loads: list[tuple] = []
        self.fail = fail

    def update_weights(self, ref, version, only_if_newer=False):
        if self.fail:
            raise RuntimeError("the runner's engine could not load the weights")
        self.loads.append((ref, version, only_if_newer))


class FakeRunners:
    """RLlib's EnvRunnerGroup calls: async requests run when they are fetched (they are still in flight before),
    ``in_flight`` requests per runner at most ``limit`` (RLlib refuses past it)."""

    def __init__(self, runners: dict[int, FakeRunner], limit: int = 1) -> None:
        self.runners, self.limit = runners, limit
        self.queued: list[tuple[int, str, object]] = []  # (runner id, tag, call)
        self.fetches: list[tuple] = []

    def healthy_worker_ids(self):
        return list(self.runners)

    def foreach_env_runner_async(self, fn, tag, remote_worker_ids):
        sent = 0
        for wid in remote_worker_ids:
            if sum(q[0] == wid for q in self.queued) < self.limit:
                self.queued.append((wid, tag, fn))
                sent += 1
        return sent

    def fetch_ready_async_reqs(self, tags, timeout_seconds):
        self.fetches.append((tags, timeout_seconds))
        if timeout_seconds == 0.0:
            return []  # nothing is ready at once in this fake
        ready = [q for q in self.queued if q[1] == tags]
        self.queued = [q for q in self.queued if q[1] != tags]
        return [
            (wid, fn(self.runners[wid])) for wid, _, fn in ready
        ]  # a runner's error is raised, as RLlib does

    def foreach_env_runner(self, fn, local_env_runner, remote_worker_ids=None):
        assert local_env_runner is False
        return [fn(self.runners[wid]) for wid in remote_worker_ids or self.runners]


def test_the_synchronous_loop_starts_the_loads_and_collects_them_later():
    runners = {1: FakeRunner(), 2: FakeRunner()}
    group = FakeRunners(runners)
    weights = PolicyWeights(FakeLearners(version=3), group)
    pending = weights.start_sync(max_staleness=0)
    assert weights.version == 3 and weights.sent == ("ref-v3", 3)
    assert all(r.loads == [] for r in runners.values())  # sent, not loaded yet: the driver went on
    assert [(wid, tag) for wid, tag, _ in group.queued] == [(1, WEIGHTS_TAG), (2, WEIGHTS_TAG)]
    seconds = pending.collect()
    assert seconds >= pending.send_s >= 0.0
    assert all(r.loads == [("ref-v3", 3, False)] for r in runners.values())
    assert group.fetches == [(WEIGHTS_TAG, None)] and group.queued == []


def test_a_runner_with_a_request_in_flight_gets_the_blocking_load():
    runners = {1: FakeRunner(), 2: FakeRunner()}
    group = FakeRunners(runners)
    group.queued.append((2, "rollout", lambda r: None))  # runner 2 still has a request: it refuses the load
    weights = PolicyWeights(FakeLearners(version=1), group)
    weights.start_sync(max_staleness=0).collect()
    # Runner 1's load was sent and collected; then every runner loads, blocking (runner 1 a second time).
    assert runners[1].loads == [("ref-v1", 1, False)] * 2
    assert runners[2].loads == [("ref-v1", 1, False)]


def test_overlap_queues_the_load_behind_the_rollout_and_waits_for_nothing():
    runners = {1: FakeRunner()}
    group = FakeRunners(runners, limit=2)
    group.queued.append((1, "rollout", lambda r: None))  # the next rollout, already asked for
    weights = PolicyWeights(FakeLearners(version=5), group)
    pending = weights.start_sync(max_staleness=1)
    assert pending.weights is None and pending.collect() == pending.send_s
    assert [(wid, tag) for wid, tag, _ in group.queued] == [(1, "rollout"), (1, WEIGHTS_TAG)]
    assert runners[1].loads == []  # it loads after its rollout
    assert group.fetches == [(WEIGHTS_TAG, None)]  # the previous load collected first (one may wait)
    weights.start_sync(max_staleness=2)
    assert group.fetches[-1] == (WEIGHTS_TAG, 0.0)  # streaming: only the finished ones


def test_a_runners_error_in_its_load_is_raised_at_the_collection():
    group = FakeRunners({1: FakeRunner(), 2: FakeRunner(fail=True)})
    pending = PolicyWeights(FakeLearners(version=2), group).start_sync(max_staleness=0)
    with pytest.raises(RuntimeError, match="could not load the weights"):
        pending.collect()

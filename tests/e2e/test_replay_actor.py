import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "token")
ray = pytest.importorskip("ray")

from r3_rllib.replay.actor import ReplayBufferActor, ReplayBufferClient, create_replay_actor  # noqa: E402
from r3_rllib.replay.buffer import QueryReplayBuffer, ReplayConfig, SampleRequest  # noqa: E402
from r3_rllib.types.samples import ReplaySample  # noqa: E402

CONFIG = ReplayConfig(max_per_query=3, max_age=4, seed=3)


@pytest.fixture(scope="module")
def ray_session():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, address="local", include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def samples(n=40):
    return [
        ReplaySample(
            query_id=f"q{i % 5}",
            prompt_ids=[1, 2, i % 5],
            response_ids=[i, i + 1, i + 2][: 1 + i % 3],
            behavior_logprobs=[-0.1, -0.2, -0.3][: 1 + i % 3],
            reward=float(i % 2 == 0),
            correct=i % 2 == 0,
            policy_version=i // 8,
            truncated=i % 7 == 0,
            response_text=f"resp {i}",
        )
        for i in range(n)
    ]


REQUESTS = [SampleRequest(f"q{i % 6}", i % 2 == 0, 1 + i % 3, 5) for i in range(25)]


def _ids(groups):
    return [[s.response_ids.tolist() for s in g] for g in groups]


def _stats(stats):
    # NaN != NaN: compare the mean only for queries with history
    return {q: (s.n_seen, s.n_correct, s.mean_reward if s.n_seen else None) for q, s in stats.items()}


def test_default_actor_takes_no_cpu():
    assert ReplayBufferActor._default_options["num_cpus"] == 0


def test_actor_matches_in_process_buffer(ray_session):
    local = QueryReplayBuffer(CONFIG)
    n_added = local.add(samples())
    handle = create_replay_actor(CONFIG)
    assert ray.get(handle.add.remote(samples())) == n_added
    assert ray.get(handle.size.remote()) == len(local)
    assert _ids(ray.get(handle.sample_batch.remote(REQUESTS))) == _ids(local.sample_batch(REQUESTS))
    qids = [f"q{i}" for i in range(6)]
    assert _stats(ray.get(handle.query_stats.remote(qids))) == _stats(local.query_stats(qids))
    assert ray.get(handle.query_stats.remote(["q5"]))["q5"].n_seen == 0
    assert ray.get(handle.mean_past_rewards.remote(qids)) == local.mean_past_rewards(qids)
    assert ray.get(handle.metrics.remote()) == local.metrics()
    ray.kill(handle)


def test_client_packed_transport(ray_session):
    local = QueryReplayBuffer(CONFIG)
    n_added = local.add(samples())
    client = ReplayBufferClient(create_replay_actor(CONFIG.__dict__))  # a plain dict config works too
    assert client.add(samples()) == n_added
    assert _ids(client.sample_batch(REQUESTS)) == _ids(local.sample_batch(REQUESTS))
    qids = ["q0", "q1", "nope", "q3"]
    got = client.sample_wrong_answers(qids, 5)
    want = local.sample_wrong_answers(qids, 5)
    assert [None if s is None else s.response_text for s in got] == [
        None if s is None else s.response_text for s in want
    ]
    assert got[2] is None
    ref = client.add(samples(3), block=False)
    assert isinstance(ray.get(ref), int)
    ray.kill(client.handle)


def test_state_round_trip_through_actors(ray_session):
    src = create_replay_actor(CONFIG, name="replay-src", namespace="r3-test")
    ray.get(src.add.remote(samples()))
    ray.get(src.sample_batch.remote(REQUESTS[:5]))  # advance the RNG
    state = ray.get(src.get_state.remote())
    same = ray.get_actor("replay-src", namespace="r3-test")
    dst = create_replay_actor(ReplayConfig(seed=99), num_cpus=0)
    ray.get(dst.set_state.remote(state))
    assert ray.get(dst.config.remote()) == ray.get(src.config.remote())
    assert ray.get(dst.metrics.remote()) == ray.get(same.metrics.remote())
    assert _ids(ray.get(dst.sample_batch.remote(REQUESTS))) == _ids(
        ray.get(src.sample_batch.remote(REQUESTS))
    )
    # and into an in-process buffer (what an algorithm restore does)
    local = QueryReplayBuffer()
    local.set_state(ray.get(src.get_state.remote()))
    assert ray.get(src.nbytes.remote()) == local.nbytes()
    assert ray.get(src.evict_stale.remote(100)) == len(local)
    for h in (src, dst):
        ray.kill(h)

"""One global data order per epoch, sharded over the EnvRunners (envs/data.py: QueryOrder, Shard), and the R^3
schedule it gives an algorithm with 4 runners (algorithms/r3/r3_schedule.py)."""

from __future__ import annotations

import json
import os
import time

import pytest

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.r3_schedule import schedule_for_config
from r3_rllib.algorithms.r3.runner_setup import env_accepts_shard, runner_env_config
from r3_rllib.envs.arithmetic import ArithmeticEnv
from r3_rllib.envs.data import MathProblem, QueryOrder, Shard, runner_shards
from r3_rllib.envs.math_env import MathEnv


def _draw(order: QueryOrder, n: int) -> list[int]:
    return [order.next() for _ in range(n)]


def test_runner_shards_tile_each_step():
    assert runner_shards(32, 4) == [Shard(32, 0, 8), Shard(32, 8, 8), Shard(32, 16, 8), Shard(32, 24, 8)]
    # 10 over 4: the first 10 % 4 = 2 runners take one more, as the rollout coordinator splits a rollout (coordinator.query_shares).
    assert [(s.start, s.count) for s in runner_shards(10, 4)] == [(0, 3), (3, 3), (6, 2), (8, 2)]
    with pytest.raises(ValueError, match="cannot share steps of 3 queries"):
        runner_shards(3, 4)
    with pytest.raises(ValueError, match="start \\+ count <= batch_size"):
        Shard(8, 6, 3)
    with pytest.raises(ValueError, match="unknown shard key"):
        Shard.of({"batch_size": 8, "start": 0, "count": 2, "index": 1})


@pytest.mark.parametrize("batch", [32, 10])
def test_four_shards_walk_one_global_order(batch):
    """100 queries, 4 shards: every step (iteration) is one slice of the epoch's permutation, no query twice in a
    step, each query at most once per epoch, and the last 100 % batch of each permutation sit out (other ones each
    epoch)."""
    size, shards = 100, runner_shards(batch, 4)
    orders = [QueryOrder(size, seed=7, shard=s) for s in shards]
    steps = size // batch  # 3 (batch 32) or 10 (batch 10)
    skipped_sets = []
    for epoch in range(3):
        perm = orders[0].global_order(epoch)
        served = []
        for step in range(steps):
            assert all(o.epoch == epoch for o in orders)  # the shards move in step
            this_step = [q for o in orders for q in _draw(o, o.shard.count)]
            assert len(set(this_step)) == batch
            assert this_step == perm[step * batch : (step + 1) * batch]
            served += this_step
        assert len(set(served)) == len(served) == steps * batch
        assert set(perm) - set(served) == set(perm[steps * batch :])  # the drop-last tail
        skipped_sets.append(frozenset(perm[steps * batch :]))
    assert all(o.epoch == 3 for o in orders)
    if batch == 32:  # 4 queries sit out each epoch, different ones
        assert len(set(skipped_sets)) == 3
    else:  # 100 = 10 x 10: nothing sits out
        assert skipped_sets == [frozenset()] * 3


def test_unsharded_order_is_the_whole_permutation():
    order = QueryOrder(10, seed=3)
    assert _draw(order, 10) == order.global_order(0) and order.epoch == 1
    with pytest.raises(ValueError, match="a pool of 5 queries is smaller than one step of 8 queries"):
        QueryOrder(5, shard=Shard(8, 0, 4))


def test_sharded_state_resumes_exactly_and_names_a_mismatch():
    shard = Shard(32, 8, 8)
    order = QueryOrder(100, seed=1, shard=shard)
    _draw(order, 8 * 3 + 5)  # one epoch of this shard (3 steps x 8) and 5 more
    state = json.loads(json.dumps(order.state()))  # checkpoints are JSON-able
    assert (state["epoch"], state["cursor"]) == (1, 5)
    resumed = QueryOrder(100, seed=1, shard=shard)
    resumed.set_state(state)
    assert _draw(resumed, 40) == _draw(order, 40)
    # Another shard of the same steps: cursor 5 of 8 stands inside a step, which no shard of another split shares.
    with pytest.raises(ValueError, match="cursor=5 of shard .* stands inside a step"):
        QueryOrder(100, seed=1, shard=Shard(32, 0, 8)).set_state(state)
    with pytest.raises(ValueError, match="steps of 32 and 16 queries .* same queries_per_iteration"):
        QueryOrder(100, seed=1, shard=Shard(16, 0, 8)).set_state(state)
    with pytest.raises(ValueError, match="invalid state cursor=24"):
        QueryOrder(100, seed=1, shard=shard).set_state({**state, "cursor": 24})
    # A state written before shards existed is an unsharded one.
    plain = QueryOrder(100, seed=1)
    plain.set_state({"cursor": 3, "epoch": 2, "seed": 1, "size": 100})
    assert plain.position(3) == 3


@pytest.mark.parametrize("new_count", [3, 5, 1])
def test_a_state_moves_to_another_number_of_shards_at_its_step(new_count):
    """A run resumed on another number of EnvRunners: 4 shards' states after 5 steps (the second epoch's second
    step), moved to ``new_count`` shards of the same steps, serve from there exactly the queries the 4 would have
    served, step for step, in the same order (the shards tile each step contiguously), epochs included."""
    size, batch = 100, 20  # 5 steps per epoch
    old = [QueryOrder(size, seed=4, shard=s) for s in runner_shards(batch, 4)]
    for _ in range(7):
        for order in old:
            _draw(order, order.shard.count)
    states = [json.loads(json.dumps(o.state())) for o in old]
    new = [QueryOrder(size, seed=4, shard=s) for s in runner_shards(batch, new_count)]
    for i, order in enumerate(new):
        order.set_state(
            states[min(i, len(states) - 1)]
        )  # added shards take a saved state; gone ones are dropped
    assert all(o.epoch == 1 for o in new)
    for _ in range(6):  # into the third epoch
        expected = [q for o in old for q in _draw(o, o.shard.count)]
        assert [q for o in new for q in _draw(o, o.shard.count)] == expected
    assert all(o.epoch == 2 for o in new + old)


def test_runner_env_configs_share_the_seed_and_split_the_batch():
    config = (
        R3Config()
        .environment("arithmetic", env_config={"num_queries": 100, "seed": 5})
        .env_runners(num_env_runners=4)
        .training(queries_per_iteration=32)
        .debugging(seed=11)
    )
    configs = [runner_env_config(config, i) for i in (1, 2, 3, 4)]
    assert {c["seed"] for c in configs} == {16}  # the data order is global
    assert [c["shard"] for c in configs] == [s.as_dict() for s in runner_shards(32, 4)]
    assert runner_env_config(config, 0)["shard"] == {"batch_size": 32, "start": 0, "count": 32}
    # An env without a shard keyword keeps one order per runner (seed offset by the runner's).
    assert [runner_env_config(config, i, shardable=False)["seed"] for i in (1, 2)] == [1016, 2016]
    assert "shard" not in runner_env_config(config, 1, shardable=False)
    assert env_accepts_shard("arithmetic") and env_accepts_shard(MathEnv)
    assert not env_accepts_shard(lambda **kwargs: ArithmeticEnv(**kwargs))

    envs = [ArithmeticEnv(**c) for c in configs]
    first = [e.reset()[1]["query_id"] for e in envs for _ in range(8)]
    assert len(set(first)) == 32


def test_math_env_takes_a_shard():
    problems = [MathProblem(f"p{i}", f"What is {i}+1?", (str(i + 1),)) for i in range(10)]
    envs = [MathEnv(data=problems, seed=2, shard=s) for s in runner_shards(4, 2)]
    ids = [e.reset()[1]["query_id"] for _ in range(2) for e in envs for _ in range(2)]
    assert len(set(ids)) == 8  # two steps of 4, 10 // 4 = 2 steps per epoch
    assert all(e.epoch == 1 for e in envs) and envs[0].state()["shard"] == {
        "batch_size": 4,
        "start": 0,
        "count": 2,
    }


# -- end to end: 4 EnvRunners ---------------------------------------------------------------------------------
NUM_QUERIES = 26  # 26 // 8 = 3 iterations per epoch, 2 queries sit out each epoch
QUERIES_PER_ITERATION = 8
RUNNERS = 4


def _four_runner_config() -> R3Config:
    from r3_rllib.models import default_tiny_model_path

    # The shipped warm-started model answers 2-digit sums right about half the time: with 2 samples per query,
    # groups are often all right or all wrong, and a query's previous visit often had the other outcome.
    return (
        R3Config.r3_preset()
        .environment("arithmetic", env_config={"num_queries": NUM_QUERIES})
        .env_runners(num_env_runners=RUNNERS, num_cpus_per_env_runner=0.25)
        .learners(num_learners=0)
        .r3(replay_start_epoch=1, reflection_start_epoch=1, ranking_start_epoch=2, reflection_tau=1.1)
        .training(
            model_path=str(default_tiny_model_path()),
            group_size=2,
            queries_per_iteration=QUERIES_PER_ITERATION,
            max_new_tokens=4,
            lr=1e-5,
        )
    )


def _record_served_queries(algo, ids=None) -> None:
    """Wrap each runner's env.reset so that the runner keeps the query ids it draws from its order."""

    def install(runner):
        # Installed again after a restore: wrap the env's own reset, not the previous wrapper.
        original = getattr(runner, "unwrapped_reset", None) or runner.env.reset
        runner.unwrapped_reset = original
        runner.served = []

        def reset(*, seed=None, options=None):
            obs, info = original(seed=seed, options=options)
            if not options:
                runner.served.append(info["query_id"])
            return obs, info

        runner.env.reset = reset

    algo.env_runner_group.foreach_env_runner(install, remote_worker_ids=ids, local_env_runner=False)


def _served(algo) -> dict[int, list[str]]:
    pairs = algo.env_runner_group.foreach_env_runner(
        lambda r: (r.worker_index, list(r.served)), local_env_runner=False
    )
    return dict(pairs)


def _reference_orders(config) -> dict[int, list[str]]:
    """What each runner must serve, from its env_config built here (200 draws each)."""
    out = {}
    for wid in range(1, RUNNERS + 1):
        env = ArithmeticEnv(**runner_env_config(config, wid))
        out[wid] = [env.reset()[1]["query_id"] for _ in range(200)]
    return out


@pytest.mark.slow
def test_four_runners_switch_r3_on_at_the_computed_iteration_and_resume_exactly(ray_session, tmp_path):
    config = _four_runner_config()
    schedule = schedule_for_config(config, NUM_QUERIES)
    t = schedule.iterations_per_epoch
    assert (
        t == 3
        and schedule.parts["replay"].first_iteration == 4
        and schedule.parts["ranking"].first_iteration == 7
    )
    assert schedule.max_age == 6  # derived: two epochs of updates
    reference = _reference_orders(config)
    share = QUERIES_PER_ITERATION // RUNNERS

    # runner_loss 'skip': the crash below costs runner 2's share of that batch, which it draws again once restored
    # (the default, 'reask', asks it again in the same iteration: tests/e2e/test_chaos.py).
    algo = config.training(runner_loss="skip").build_algo()
    try:
        assert algo.schedule.iterations_per_epoch == t
        replay_config = algo._replay.client.handle.config.remote()
        import ray

        assert ray.get(replay_config)["max_age"] == 6
        _record_served_queries(algo)
        results = [algo.train() for _ in range(3 * t)]

        # Every runner served its shard of the global order; the 8 queries of an iteration are distinct, and each
        # epoch's 24 queries are too.
        served = _served(algo)
        for wid in served:
            assert served[wid] == reference[wid][: 3 * t * share]
        per_iteration = [
            [q for wid in sorted(served) for q in served[wid][i * share : (i + 1) * share]]
            for i in range(3 * t)
        ]
        assert all(len(set(batch)) == QUERIES_PER_ITERATION for batch in per_iteration)
        for epoch in range(3):
            queries = [q for batch in per_iteration[epoch * t : (epoch + 1) * t] for q in batch]
            assert len(set(queries)) == t * QUERIES_PER_ITERATION

        # Each part switches on in the iteration schedule.py computes, and not before.
        epochs = [r["rollout"]["dataset_epoch"] for r in results]
        assert epochs == [schedule.reported_epoch(j) for j in range(1, 3 * t + 1)]
        replay_first, ranking_first = (
            schedule.parts["replay"].first_iteration,
            schedule.parts["ranking"].first_iteration,
        )
        for j, r in enumerate(results, start=1):
            if j < replay_first:
                assert r["r3"]["replay_requests"] == 0 and r["r3"]["reflection_prompts"] == 0, j
            if j < ranking_first:
                assert r["r3"]["ranked_groups"] == 0, j
        after = results[replay_first - 1 :]
        assert sum(r["r3"]["replay_requests"] for r in after) > 0
        assert sum(r["r3"]["replay_hits"] for r in after) > 0  # history of revisited queries is found
        assert sum(r["r3"]["reflection_prompts"] for r in after) > 0
        assert sum(r["r3"]["ranked_groups"] for r in results[ranking_first - 1 :]) > 0

        # Checkpoint in the middle of an epoch, go on, restore, and the same queries come again.
        checkpoint = algo.save(str(tmp_path / "ckpt")).checkpoint.path
        for _ in range(2):
            algo.train()
        after_save = {wid: q[3 * t * share :] for wid, q in _served(algo).items()}
        algo.restore(checkpoint)
        _record_served_queries(algo)
        restored = [algo.train() for _ in range(2)]
        assert _served(algo) == after_save
        assert restored[-1]["rollout"]["dataset_epoch"] == schedule.reported_epoch(3 * t + 2)

        # Runner 2 crashes in the middle of generating: restarted, it draws again the queries it lost.
        def crash(runner):
            runner.engine.generate = lambda *a, **k: os._exit(1)

        algo.env_runner_group.foreach_env_runner(crash, remote_worker_ids=[2], local_env_runner=False)
        delivered = 3 * t * share + 2 * share  # runner 2's draws that reached the driver
        assert algo.train()["rollout"]["runners_failed"] == 1
        restored_ids = []
        for _ in range(120):  # the restarted actor needs a few seconds to load its engine
            restored_ids = algo.restore_env_runners(algo.env_runner_group)
            if restored_ids:
                break
            time.sleep(0.5)
        assert restored_ids == [2]
        _record_served_queries(algo, ids=[2])
        algo.train()
        assert _served(algo)[2] == reference[2][delivered : delivered + share]
    finally:
        algo.stop()

    # The same checkpoint on 5 runners (each step's 8 queries split 2, 2, 2, 1, 1): the added runner 5 starts at
    # runner 1's step, and the same queries come, iteration for iteration, in the same order (the shards tile each
    # step of the one global order). Fewer runners: tests/unit/algorithms/test_runner_states_on_resume.py.
    from r3_rllib import R3

    elastic = R3.from_checkpoint(checkpoint, config_overrides={"num_env_runners": 5})
    try:
        _record_served_queries(elastic)
        results = [elastic.train() for _ in range(2)]
        served, shares = _served(elastic), dict(zip((1, 2, 3, 4, 5), (2, 2, 2, 1, 1), strict=True))
    finally:
        elastic.stop()
    for i in range(2):
        expected = [q for wid in sorted(after_save) for q in after_save[wid][i * share : (i + 1) * share]]
        assert [q for wid in shares for q in served[wid][i * shares[wid] : (i + 1) * shares[wid]]] == expected
    assert results[-1]["rollout"]["dataset_epoch"] == schedule.reported_epoch(3 * t + 2)

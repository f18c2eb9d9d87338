"""Asynchronous training (max_staleness): 0 and 1 are the synchronous and overlap loops bit for bit; k >= 2 streams
rollouts within the bound, trains every query once in the runners' data order, checkpoints the queue mid-stream and
survives a runner crash mid-stream."""

from __future__ import annotations

import importlib.util
import os
import time

import pytest
from test_algorithm import _reproducible_numbers, tiny_config
from test_fault_tolerance import _break_runner_2, _two_runner_config

requires_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")

pytestmark = pytest.mark.slow


def _run(config, iterations: int) -> tuple[list, list[dict]]:
    algo = config.build_algo()
    try:
        results = [algo.train() for _ in range(iterations)]
        return _reproducible_numbers(algo, results), results
    finally:
        algo.stop()


def test_max_staleness_1_is_the_overlap_loop_bit_for_bit(ray_session, tiny_random_model):
    """Same seed: every sampled and trained number and the final parameters are equal to the last bit between
    max_staleness=1 and overlap_generation. (max_staleness=0 against the synchronous loop: test_algorithm.py's
    reproducibility test, whose repeat sets it.)"""

    def config(**training):
        return tiny_config(tiny_random_model, **training).debugging(seed=3)

    expected, results = _run(config(overlap_generation=True), 2)
    got, _ = _run(config(max_staleness=1), 2)
    assert got == expected
    assert [r["rollout"]["policy_lag"] for r in results] == [0.0, 1.0]


def _data_order(config, worker_id: int, n: int) -> list[str]:
    """The first ``n`` query ids runner ``worker_id`` draws from its shard of the data order."""
    from r3_rllib.algorithms.r3.runner_setup import build_env, load_policy_tokenizer, runner_env_config

    env = build_env(config.env, runner_env_config(config, worker_id), load_policy_tokenizer(config))
    return [env.reset()[1]["query_id"] for _ in range(n)]


class _TrainedQueries:
    """Records the query ids of the fresh groups each iteration trains (wraps the algorithm's batch builder)."""

    def __init__(self, algo) -> None:
        self.ids: list[str] = []
        build = algo._build_batch

        def recording(groups, settings):
            self.ids += [g.query_id for g in groups if not g.is_reflection]
            return build(groups, settings)

        algo._build_batch = recording


def test_streaming_stays_within_the_bound_trains_the_data_order_and_checkpoints_mid_stream(
    ray_session, tiny_random_model, tmp_path
):
    """max_staleness=3, one runner: three requests stay outstanding, so the lag climbs 0, 1, 2, 3 and stays at 3
    (never above); the queries trained are the runner's data order (nothing lost, doubled or reordered); a
    checkpoint taken with three requests outstanding saves them, and the restored run trains the same queries as
    the uninterrupted one."""
    config = tiny_config(tiny_random_model, max_staleness=3)
    data_order = _data_order(config, 1, 48)

    algo = config.build_algo()
    try:
        trained = _TrainedQueries(algo)
        results = [algo.train() for _ in range(4)]
        assert [r["rollout"]["policy_lag"] for r in results] == [0.0, 1.0, 2.0, 3.0]
        assert all(r["rollout"]["staleness_max"] <= 3 for r in results)
        assert all(r["rollout"]["stale_groups_dropped"] == 0 for r in results)
        assert results[-1]["rollout"]["requests_in_flight"] + results[-1]["rollout"]["queue_depth"] / 8 == 3
        checkpoint = algo.save(str(tmp_path / "ckpt")).checkpoint.path
        assert len(algo.coordinator.queue) == 3  # drained: every outstanding request saved
        after = [algo.train() for _ in range(2)]
        assert [r["rollout"]["policy_lag"] for r in after] == [3.0, 3.0]
        assert trained.ids == data_order
        uninterrupted = trained.ids[32:]
    finally:
        algo.stop()

    restored = tiny_config(tiny_random_model, max_staleness=3).build_algo()
    try:
        restored.restore(checkpoint)
        trained_after_restore = _TrainedQueries(restored)
        assert [restored.train()["rollout"]["policy_lag"] for _ in range(2)] == [3.0, 3.0]
        assert trained_after_restore.ids == uninterrupted
    finally:
        restored.stop()


def test_streaming_runner_crash_costs_only_its_requests_in_flight(ray_session, tiny_random_model):
    """Two runners, max_staleness=2: runner 2's process exits while it holds requests. The run goes on with runner
    1's groups (never staler than 2 versions); runner 2 is restarted with the learner's weights at the data position
    of its last delivered request, so the queries of its lost requests are drawn again: each runner's queries are
    trained exactly in its data order, none skipped and none twice."""

    def config(**training):
        return _two_runner_config(tiny_random_model, **training).environment(env_config={"num_queries": 256})

    streaming = config(max_staleness=2)
    orders = [_data_order(streaming, wid, 128) for wid in (1, 2)]  # each runner's shard, first epoch

    algo = streaming.build_algo()
    try:
        trained = _TrainedQueries(algo)
        for _ in range(2):
            algo.train()
        _break_runner_2(algo, lambda *args, **kwargs: os._exit(1))
        failed = 0
        for _ in range(10):  # Ray reports the dead actor's requests after a moment: runner 1 trains meanwhile
            time.sleep(1.0)
            result = algo.train()
            assert result["rollout"]["staleness_max"] <= 2
            failed += result["rollout"]["runners_failed"]
            if failed:
                break
        assert failed == 1
        for _ in range(120):  # RLlib restores it at an iteration's start, or we do once its actor is back
            if algo.env_runner_group.healthy_worker_ids() == [1, 2]:
                break
            algo.restore_env_runners(algo.env_runner_group)
            time.sleep(0.5)
        assert algo.env_runner_group.healthy_worker_ids() == [1, 2]
        results = [algo.train() for _ in range(3)]
        assert all(
            r["rollout"]["runners_failed"] == 0 and r["rollout"]["staleness_max"] <= 2 for r in results
        )
        assert results[-1]["rollout"]["policy_version"] == float(results[-1]["training_iteration"])
        versions = algo.env_runner_group.foreach_env_runner(
            lambda r: r.engine.version, local_env_runner=False
        )
        assert versions == [algo.weights.version] * 2
    finally:
        algo.stop()
    for order in orders:
        mine = [q for q in trained.ids if q in set(order)]
        assert mine == order[: len(mine)] and len(mine) >= 8
    assert sorted(trained.ids) == sorted(set(trained.ids))


@pytest.mark.parametrize(
    ("engine", "num_runners", "num_learners"),
    [("hf", 2, 2), pytest.param("vllm", 1, 0, marks=[pytest.mark.vllm, requires_vllm])],
)
def test_partial_rollouts_pull_newer_weights_mid_response(
    ray_session, tiny_random_model, engine, num_runners, num_learners
):
    """max_staleness=2 with partial_rollouts at T = 0.6 trains within the bound; then a version published while the
    runners are about to decode is pulled between decoding steps by each of them: each response's first 4 tokens
    carry its runner's version, the rest the new one, the sample counts as the older, and the queued load of the
    pulled version is skipped. Two HF runners with two FSDP learners (the board gets rank 0's full weights; each
    runner has its own puller); one vLLM runner driving its engine step by step
    (``r3_rllib/engines/vllm_stepping.py``)."""
    import ray

    algo = (
        tiny_config(
            tiny_random_model,
            max_staleness=2,
            partial_rollouts=True,
            max_new_tokens=12,
            engine=engine,
            temperature=0.6,
            # Small steps: which runner delivers first decides the streamed batches, so the trained weights vary
            # from run to run; near the random initialisation they keep the responses longer than 4 tokens.
            lr=1e-6,
        )
        .env_runners(num_env_runners=num_runners)
        .learners(num_learners=num_learners, num_cpus_per_learner=1)
        .build_algo()
    )
    try:
        results = [algo.train() for _ in range(3)]
        assert all(r["rollout"]["staleness_max"] <= 2 for r in results)
        algo.coordinator.drain()  # nothing in flight: the calls below run on idle runners
        starts = algo.env_runner_group.foreach_env_runner(lambda r: r.engine.version, local_env_runner=False)
        new_version = max(starts) + 5
        (weights_ref, _), *_ = [
            r.get() for r in algo.learner_group.foreach_learner(lambda lr: lr.weights_ref())
        ]
        ray.get(algo.weights.board.publish.remote(new_version, [weights_ref]))

        def sample_and_reload(runner, _ref=weights_ref, _v=new_version):
            start = runner.engine.version
            result = runner.sample(num_queries=2)
            return start, result, runner.update_weights(_ref, _v, only_if_newer=True), runner.engine.version

        outcomes = algo.env_runner_group.foreach_env_runner(sample_and_reload, local_env_runner=False)
        assert len(outcomes) == num_runners
        for start, result, reload_s, version in outcomes:
            samples = [s for g in result.groups for s in g.samples]
            # pulled mid-rollout, so the queued load of the same version is skipped
            assert version == new_version and reload_s == 0.0
            for s in samples:
                head = min(4, len(s.response_ids))  # a response may end within the first 4 steps
                assert s.token_versions.tolist()[:4] == [start] * head
                assert set(s.token_versions.tolist()[4:]) <= {new_version}
                assert s.policy_version == start
            assert any(len(s.response_ids) > 4 for s in samples)
    finally:
        algo.stop()

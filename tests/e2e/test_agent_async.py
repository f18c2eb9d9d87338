"""Asynchronous training of an agent env through the EnvRunners' rollout gateways (two HF runners, T = 0.6): the
one-step overlap (overlap_generation) and streaming with partial rollouts (max_staleness=2). Each trained sample's
tokens, log-probs and token versions are the gateways' records (CallRecord), the staleness stays within its bound,
and a version published while the runners decode is pulled between decoding steps by the engine's hook, which runs
on the gateway's engine thread."""

from __future__ import annotations

import pytest
from test_agent_training import (
    TASKS,
    _calculator_agent,
    assert_trained_as_recorded,
    save_chat_tiny,
    train_keeping_calls,
)

from r3_rllib import R3Config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chat_tiny_model(tmp_path_factory) -> str:
    return save_chat_tiny(tmp_path_factory)


def _config(model_path: str, num_env_runners: int = 2, **training) -> R3Config:
    """The calculator agent (two calls of up to 5 tokens per episode) on HF runners (two by default), four queries
    per iteration, T = 0.6, GRPO, seeded."""
    return (
        R3Config.grpo_preset()
        .environment("agent", env_config={"run": _calculator_agent(), "tasks": TASKS, "test_size": 0})
        .env_runners(num_env_runners=num_env_runners, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=7)
        .training(
            model_path=model_path,
            group_size=4,
            queries_per_iteration=4,
            max_new_tokens=5,
            temperature=0.6,
            micro_batch_size=32,
            eval_interval=0,
            **{"lr": 1e-3, **training},
        )
    )


def test_an_agent_trains_with_overlap_generation(ray_session, chat_tiny_model):
    """Each batch after the first was requested before the previous update (policy lag 1): its samples carry the
    version their gateway recorded, one behind the learner. One runner: the streaming test below runs two."""
    algo = _config(chat_tiny_model, num_env_runners=1, overlap_generation=True).build_algo()
    try:
        results, batches, records = train_keeping_calls(algo, 3)
    finally:
        algo.stop()
    assert [r["rollout"]["policy_lag"] for r in results] == [0.0, 1.0, 1.0]
    assert all(r["rollout"]["staleness_max"] <= 1 for r in results)
    assert len(records) == 4 * 4 * 4 * 2  # 4 rollouts (one in flight at the end) x 4 queries x G x 2 calls
    trained = [s for b in batches for s in b]
    assert_trained_as_recorded(trained, records)
    # Rollout k was requested before update k: sampled by version k - 1 (the first two by version 0); a call's
    # tokens all carry its engine's version (no pull between decoding steps without partial rollouts).
    assert all(len(set(r.token_versions.tolist())) == 1 for r in records)
    assert sorted({int(r.token_versions[0]) for r in records}) == [0, 1, 2]
    assert sum(r["learner"]["trained_tokens"] for r in results) > 0


def _sample_after_a_publish(new_version: int, weights_ref):
    """A function (built here so it reaches the runners by value): one rollout on an idle runner after
    ``new_version`` was published on the weight board, then the queued load of that version; the engine's version
    before and after, the rollout's samples, the calls its gateway recorded and the seconds the queued load took."""

    def sample_and_reload(runner):
        start, seen = runner.engine.version, len(runner.kept_calls)
        result = runner.sample(num_queries=1)
        reload_s = runner.update_weights(weights_ref, new_version, only_if_newer=True)
        samples = [s for g in result.groups for s in g.samples]
        return start, samples, runner.kept_calls[seen:], reload_s, runner.engine.version

    return sample_and_reload


def test_an_agent_streams_with_partial_rollouts(ray_session, chat_tiny_model):
    """max_staleness=2 with partial rollouts trains within the bound on the recorded tokens; then a version
    published while the runners are about to decode is pulled by the engine's between-steps hook on the gateway's
    engine thread: the tokens before the pull carry the runner's version, those after it the new one, as recorded
    and as trained."""
    import ray

    # Small steps: which runner delivers first decides the streamed batches, so the trained weights vary from run
    # to run; near the initial weights some replies run past 4 tokens (the pull below needs one).
    algo = _config(chat_tiny_model, max_staleness=2, partial_rollouts=True, lr=1e-6).build_algo()
    try:
        results, batches, records = train_keeping_calls(algo, 3)
        assert all(r["rollout"]["staleness_max"] <= 2 for r in results)
        assert_trained_as_recorded([s for b in batches for s in b], records)

        starts = algo.env_runner_group.foreach_env_runner(lambda r: r.engine.version, local_env_runner=False)
        new_version = max(starts) + 5
        (weights_ref, _), *_ = [
            r.get() for r in algo.learner_group.foreach_learner(lambda lr: lr.weights_ref())
        ]
        ray.get(algo.weights.board.publish.remote(new_version, [weights_ref]))
        outcomes = algo.env_runner_group.foreach_env_runner(
            _sample_after_a_publish(new_version, weights_ref), local_env_runner=False
        )
    finally:
        algo.stop()
    assert len(outcomes) == 2
    for start, samples, calls, reload_s, version in outcomes:
        assert version == new_version and reload_s == 0.0  # pulled mid-rollout: the queued load is skipped
        assert len(calls) == 4 * 2
        # One pull, between two decoding steps of an engine call: each episode's tokens (its calls in order) carry
        # the runner's version up to there and the new one after, and the call it happened in is split after a
        # multiple of 4 tokens (which call that is depends on which replies run past 4 tokens).
        sessions: dict[str, list] = {}
        for c in sorted(calls, key=lambda c: c.index):
            sessions.setdefault(c.session_id, []).append(c)
        for episode in sessions.values():
            tokens = [v for c in episode for v in c.token_versions.tolist()]
            old = tokens.count(start)
            assert tokens == [start] * old + [new_version] * (len(tokens) - old)
        split = [c.token_versions.tolist() for c in calls if len(set(c.token_versions.tolist())) == 2]
        assert split and all(v.count(start) % 4 == 0 for v in split)
        assert_trained_as_recorded(samples, calls)
        assert all(s.policy_version == start for s in samples)

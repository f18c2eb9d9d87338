"""Multi-turn tool use through the algorithm: a tool env's trajectories (model turns + tool output in one sequence)
are one sample each, trained with the tool tokens masked, with R^3's replay, reflection and ranking on, and with
DAPO's dynamic sampling; the sandboxed Python tool env runs on a runner."""

from __future__ import annotations

import pytest

from r3_rllib import R3Config

pytestmark = pytest.mark.slow

TOOL_TEXT = "+0="  # what the test tool answers: characters the tiny model's vocabulary has


def _register_echo_tool_env(name: str) -> None:
    """Arithmetic whose episodes call a tool once: the first model turn (the tiny model's answer) is graded as the
    arithmetic env grades it and answered by TOOL_TEXT (tool tokens); the second turn ends the trajectory."""
    from r3_rllib.envs import register_text_env
    from r3_rllib.envs.arithmetic import ArithmeticEnv

    class EchoToolEpisode:
        def __init__(self, env, query_id, user_content):
            self.env, self.query_id, self.turns, self.first = env, query_id, 0, ""
            options = {"query_id": query_id} | ({"user_content": user_content} if user_content else {})
            self.prompt, _ = env.reset(options=options)

        def tool_reply(self, turn_text):
            self.turns += 1
            if self.turns == 1:
                self.first = turn_text
                return TOOL_TEXT
            return None

        def finish(self, model_text):
            self.env.reset(options={"query_id": self.query_id})
            _, reward, _, _, info = self.env.step(self.first)
            return reward, bool(info.get("correct")), {}

    class EchoToolEnv(ArithmeticEnv):
        def tool_episode(self, query_id, user_content=None):
            return EchoToolEpisode(self, query_id, user_content)

    register_text_env(name, EchoToolEnv, overwrite=True)


def _config(env: str, num_env_runners: int = 1, **training) -> R3Config:
    return (
        R3Config.r3_preset()
        # Six queries, all of them every iteration: replay and reflection see each query again.
        .environment(env, env_config={"digits": 2, "num_queries": 6, "seed": 0})
        .env_runners(num_env_runners=num_env_runners, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .r3(replay_start_epoch=0, reflection_start_epoch=0, ranking_start_epoch=0, reflection_tau=1.0)
        .debugging(seed=3)
        .training(
            group_size=4,
            queries_per_iteration=6,
            max_new_tokens=5,
            max_tool_turns=2,
            lr=1e-3,
            micro_batch_size=32,
            **training,
        )
    )


def test_tool_trajectories_train_with_r3_parts_and_tool_tokens_masked(ray_session):
    from r3_rllib.envs.registry import _REGISTRY

    _register_echo_tool_env("echo_tool_arith")
    try:
        # As users run it: two runners (three queries each per iteration), T = 0.6.
        algo = _config("echo_tool_arith", num_env_runners=2, temperature=0.6).build_algo()
        try:
            results = [algo.train() for _ in range(3)]
            groups = algo.env_runner_group.foreach_env_runner(
                lambda r: [s for g in r.sample(num_queries=2).groups for s in g.samples],
                local_env_runner=False,
            )[0]
        finally:
            algo.stop()
    finally:
        _REGISTRY.pop("echo_tool_arith", None)
    rollout = results[-1]["rollout"]
    assert rollout["tool_calls_mean"] > 0 and rollout["tool_token_frac"] > 0
    # Every sample is one trajectory with the tool's tokens masked out of the loss.
    for s in groups:
        assert s.loss_mask is not None and len(s.loss_mask) == len(s.response_ids)
        assert (~s.loss_mask).sum() in (0, len(TOOL_TEXT))
        assert len(s.entropies) == int(s.loss_mask.sum())  # ranking reads the model's tokens only
    assert all(r["learner"]["trained_tokens"] > 0 for r in results)
    # R^3's three parts ran on trajectory samples (seeded: the same counts every run).
    total = {
        k: sum(r["r3"][k] for r in results) for k in ("replay_hits", "ranked_groups", "reflection_prompts")
    }
    assert all(v > 0 for v in total.values()), total


def test_python_tool_env_runs_on_a_runner_with_dynamic_sampling(ray_session, tmp_path):
    import json

    problems = [{"id": f"p{i}", "problem": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(12)]
    data = tmp_path / "math.jsonl"
    data.write_text("\n".join(json.dumps(p) for p in problems))
    config = (
        R3Config.dapo_preset()
        .environment("python_tool", env_config={"data": str(data), "tool_timeout_s": 2.0})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=0)
        .training(
            group_size=2,
            queries_per_iteration=4,
            max_new_tokens=6,
            max_tool_turns=2,
            # Two generation batches; the shipped model may leave every group filtered, which this test of the
            # tool env trains through (ours) rather than stopping the run (verl's default, 'raise').
            max_num_gen_batches=2,
            dynamic_sampling_shortfall="train_on_kept",
        )
    )
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    assert result["training_iteration"] == 1
    assert "tool_turns_mean" in result["rollout"] and result["rollout"]["tool_turns_mean"] >= 1.0

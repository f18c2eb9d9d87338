"""reasoning-gym tasks through the algorithm: the env's grade reasons are counted in the rollout metrics, and a
verifier that raises on every answer costs those samples their reward, never the runner."""

from __future__ import annotations

import pytest
from numeric import f64_tol

from r3_rllib import R3Config

pytestmark = pytest.mark.slow
pytest.importorskip("reasoning_gym")


def _config(env: str) -> R3Config:
    return (
        R3Config.grpo_preset()
        .environment(env, env_config={"tasks": "basic_arithmetic", "size": 40, "test_size": 8})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=0)
        .training(
            group_size=2,
            queries_per_iteration=4,
            max_new_tokens=6,
            eval_num_queries=4,
            eval_env_config={"split": "test"},
        )
    )


def test_grade_reasons_are_counted_and_verifier_errors_do_not_stop_the_run(ray_session):
    from r3_rllib.envs import register_text_env
    from r3_rllib.envs.reasoning_gym import ReasoningGymEnv
    from r3_rllib.envs.registry import _REGISTRY

    class BrokenVerifier(ReasoningGymEnv):
        """Every response is an answer, and the verifier raises on every one."""

        def grade(self, response, entry):
            def broken(answer, entry):
                raise RuntimeError("verifier bug")

            self.dataset.score_answer = broken
            return super().grade(f"<answer>{response}</answer>", entry)

    algo = _config("reasoning_gym").build_algo()
    try:
        plain = algo.train()["rollout"]
        heldout = algo.evaluate_heldout(4)
    finally:
        algo.stop()
    # The untrained tiny model writes no <answer> block: every sample is counted under its reason.
    reasons = {k: v for k, v in plain.items() if k.startswith("grade_reason/")}
    # Fractions count / samples in float64: each quotient and each addition of the sum within half an ulp of 1. A
    # sample counted under two reasons, or under none, moves the sum by 1 / samples (1/8 here) or more.
    assert reasons and sum(reasons.values()) == pytest.approx(1.0, rel=0, abs=f64_tol(1.0, ulps=len(reasons)))
    assert heldout["num_queries"] == 4 and 0.0 <= heldout["accuracy"] <= 1.0  # on the held-out split

    register_text_env("rg_broken_verifier", BrokenVerifier, overwrite=True)
    try:
        algo = _config("rg_broken_verifier").build_algo()
        try:
            broken = algo.train()["rollout"]
        finally:
            algo.stop()
    finally:
        _REGISTRY.pop("rg_broken_verifier", None)
    assert broken["grade_reason/verifier_error_frac"] == 1.0 and broken["reward_mean"] == 0.0

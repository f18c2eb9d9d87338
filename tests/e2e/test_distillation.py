"""On-policy distillation end to end: the teacher's actors score every sampled token while the runners generate
(overlap_generation, 2 runners), the learner trains on the teacher's signal and the reverse KL to the teacher
falls; a LoRA student distills too (the advantage term, the teacher's signal alone); a teacher of another
vocabulary is refused before any training."""

from __future__ import annotations

import math

import pytest
from ray.tune.utils import flatten_dict

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.rollout_stages import build_rollout_stages
from r3_rllib.distill import TeacherVocabularyError
from r3_rllib.models import default_tiny_model_path
from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny

pytestmark = pytest.mark.slow


def _config(model_path, teacher, **training) -> R3Config:
    base = dict(
        model_path=model_path,
        group_size=4,
        queries_per_iteration=8,
        max_new_tokens=5,
        lr=1e-2,
        micro_batch_size=32,
        distill_teacher=str(teacher),
        distill_mode="loss",
        distill_num_cpus_per_worker=1,
    )
    return (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 200, "seed": 0})
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=0)
        .training(**(base | training))
    )


def _train(config: R3Config, iterations: int) -> list[dict]:
    algo = config.build_algo()
    try:
        return [algo.train() for _ in range(iterations)]
    finally:
        for stage in algo.coordinator.stages:
            stage.stop()
        algo.stop()


def test_the_student_distills_another_tiny_model_under_overlap(ray_session, tiny_random_model):
    """The shipped arithmetic model distils an untrained tiny model (another model, the same vocabulary) with 2
    runners generating while the learner trains: the reverse KL of its samples to the teacher falls."""
    config = _config(default_tiny_model_path(), tiny_random_model, overlap_generation=True)
    results = _train(config, 5)
    stage = [r["distill"] for r in results]
    learner = [r["learner"] for r in results]
    assert all(s["scored_samples"] == 32 and s["unscored_samples"] == 0 and s["errors"] == 0 for s in stage)
    # Every trained token has the teacher's log-prob, and zero-advantage groups were trained on (not dropped).
    assert all(m["distill_teacher_token_frac"] == 1.0 and m["distill_loss"] > 0 for m in learner)
    assert sum(r["r3"]["train_zero_adv_samples"] for r in results) > 0
    assert [r["rollout"]["policy_lag"] for r in results][1:] == [1.0] * 4  # overlapped
    kl = [s["reverse_kl"] for s in stage]
    assert kl[-1] < 0.5 * kl[0], kl


def test_with_r2po_the_teacher_scores_only_the_rollouts_of_stage_b(ray_session, tiny_random_model):
    """R^2PO (head and base stages alternating, one iteration each, stage A first) with a teacher: stage A trains
    the rollout head alone with no distillation term, so its rollouts are not sent to the teacher (``skipped``, no
    samples scored, no teacher token in the update); stage B's are all scored and distilled. Overlap: the rollout
    trained in an iteration was asked for in the one before, in the other stage. No result holds a NaN for a metric
    its iteration did not measure (the other stage's ``r2po/*``, ``eval/*`` between evaluations, a health check's
    value and threshold while it is unmeasured): such a metric is absent."""
    config = _config(
        default_tiny_model_path(),
        tiny_random_model,
        overlap_generation=True,
        rollout_head=True,
        rollout_head_head_iters=1,
        rollout_head_base_iters=1,
        eval_interval=2,
        eval_num_queries=8,
    )
    results = _train(config, 4)
    stage = [r["distill"] for r in results]
    learner = [r["learner"] for r in results]
    assert [s["skipped"] for s in stage] == [1.0, 0.0, 1.0, 0.0]
    # Stage A's iterations report the teacher's numbers as absent, not NaN (nor a distillation term of 0), also
    # after a stage B that logged them.
    assert [s.get("scored_samples") for s in stage] == [None, 32.0, None, 32.0]
    assert [m.get("distill_loss") is None for m in learner] == [True, False, True, False]
    for result in results[::2]:
        distill = result["distill"] | {k: v for k, v in result["learner"].items() if k.startswith("distill")}
        assert not any(math.isnan(v) for v in distill.values()), distill
    assert [m["distill_teacher_token_frac"] for m in learner] == [0.0, 1.0, 0.0, 1.0]
    # Each iteration reports its own stage's numbers, evaluations and measured health checks, and nothing as NaN.
    assert [sorted(r["r2po"]) for r in results] == [["A", "stage"], ["B", "stage"]] * 2
    assert [sorted(r.get("eval", {})) for r in results] == [[], ["accuracy", "num_queries"]] * 2
    assert not any("reward_hacking_value" in r["health"] for r in results)  # a 10-iteration window
    assert "length_blowup_value" not in results[0]["health"]  # no baseline yet
    for result in results:
        flat = flatten_dict({k: v for k, v in result.items() if k != "config"}, delimiter="/")
        nan = [k for k, v in flat.items() if isinstance(v, float) and math.isnan(v)]
        assert nan == [], (result["training_iteration"], nan)


def test_a_lora_student_distills_with_the_advantage_term(ray_session, tiny_random_model):
    pytest.importorskip("peft")
    config = _config(
        default_tiny_model_path(),
        tiny_random_model,
        distill_mode="advantage",
        distill_task_reward=False,
        lora_rank=4,
        lora_alpha=8.0,
        lr=3e-2,
    )
    results = _train(config.env_runners(num_env_runners=1), 4)
    learner = [r["learner"] for r in results]
    assert all(m["distill_teacher_token_frac"] == 1.0 for m in learner)
    kl = [r["distill"]["reverse_kl"] for r in results]
    assert kl[-1] < kl[0], kl


def test_a_teacher_with_another_vocabulary_is_refused_before_training(tiny_random_model, tmp_path):
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens(["<tool>"])
    save_tiny(build_tiny_model(tokenizer, seed=1), tokenizer, tmp_path / "teacher")
    # What the algorithm's setup builds before its first iteration (build_algo raises the same error, after
    # starting its runners: 25 s more).
    with pytest.raises(TeacherVocabularyError, match="token id 100 is None for the policy and '<tool>'"):
        build_rollout_stages(_config(tiny_random_model, tmp_path / "teacher"))

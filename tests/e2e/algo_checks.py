"""Checks shared by the algorithm tests."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch


def assert_runner_scores_like_learner(algo, model_path: str, *, tolerance: Callable[..., float]) -> None:
    """The first runner's engine gives a freshly sampled response the log-probs that the learner's current weights
    (loaded into a plain HF model) give it: the weight sync reached the engine."""
    from r3_rllib.models.tiny import load_tiny

    state = algo.learner_call(lambda learner: learner.full_state_dict())[0]
    model, _ = load_tiny(model_path)
    model.load_state_dict(state, strict=False)
    assert_runner_scores_like(algo, model, tolerance=tolerance)


def assert_runner_scores_like(algo, model, *, tolerance: Callable[..., float]) -> None:
    """The first runner's engine gives a freshly sampled response the log-probs that `model` gives it, to
    `tolerance(compared values)`: tests/numeric.py's forward_atol for the HF engine (a KV-cache decode against one
    pass) or engine_atol for vLLM (its kernels against transformers')."""
    prompt = [5, 6, 7]
    out = algo.env_runner_group.foreach_env_runner(
        lambda r: r.engine.generate([prompt], 1, r.sampling_params()), local_env_runner=False
    )[0][0][0]
    ids = torch.tensor([prompt + list(out.token_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), -1)
    expected = logp.gather(-1, ids[0, len(prompt) :].unsqueeze(-1)).squeeze(-1).numpy()
    np.testing.assert_allclose(out.logprobs, expected, rtol=0, atol=tolerance(out.logprobs, expected))


def arithmetic_learning_config(**training):
    """The learning tests' setup: GRPO on 2-digit sums with the shipped tiny model, one runner, one local learner,
    32 queries x G = 8 per iteration, lr 1e-4 (measured to lift held-out accuracy within 40 iterations)."""
    from r3_rllib import R3Config

    base = dict(
        group_size=8,
        queries_per_iteration=32,
        max_new_tokens=4,
        lr=1e-4,
        num_minibatches=2,
        micro_batch_size=128,
    )
    return (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 2000})
        .env_runners(num_env_runners=1)
        .learners(num_learners=0)
        .training(**{**base, **training})
    )


def checkpoint_fingerprint(algo) -> dict[str, float]:
    """What a restore must bring back: the learner's parameter and AdamW-moment sums and the replay buffer size (0 without one).
    A restore copies the tensors' bits, so each tensor's float64 sum is the same, and the totals are equal to the last
    bit: the parameters are added in the model's order; the moments (of a local learner) with math.fsum, exactly
    rounded in any order, since the optimizer keeps its states in the order the parameters first stepped (R^2PO steps
    the head first), which a restore need not repeat."""
    return {
        "params": algo.learner_call(lambda lr: lr.parameter_checksum())[0],
        "optim": algo.learner_call(_optimizer_fsum)[0],
        "replay_size": algo.replay_metrics().get("size", 0),  # 0 without a replay actor
    }


def _optimizer_fsum(learner) -> float:
    states = learner._optimizer.state.values()
    return math.fsum(
        float(s[k].detach().double().sum()) for s in states for k in ("exp_avg", "exp_avg_sq") if k in s
    )

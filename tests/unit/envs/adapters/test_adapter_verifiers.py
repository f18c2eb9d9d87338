"""env 'verifiers': a verifiers 0.4 taskset defined in the tests (vf_tiny_taskset.py: three prompts, a rubric of
two weighted rewards) rolled out by verifiers' own episode machinery, its model calls relayed to a real rollout
gateway session over the tiny model (HF engine): the reward is the rubric's, the gateway's records hold the call."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

import openai  # noqa: E402
import torch  # noqa: E402
from numeric import TORCH_THREADS  # noqa: E402

from r3_rllib.engines.base import SamplingParams  # noqa: E402
from r3_rllib.envs import make_text_env  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[2] / "gateway"))
from gateway_helpers import CHAT_TEMPLATE  # noqa: E402


@pytest.fixture(scope="module")
def gateway():
    from r3_rllib.engines.hf_engine import HFEngine
    from r3_rllib.gateway import Gateway
    from r3_rllib.models.tiny import build_tiny_model, build_tiny_tokenizer

    torch.set_num_threads(TORCH_THREADS)
    tok = build_tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    defaults = SamplingParams(max_new_tokens=8, temperature=0.6, seed=7)
    gw = Gateway(HFEngine(build_tiny_model(tok, seed=0), tok), tok, defaults=defaults, max_batch_wait_s=0.5)
    gw.start()
    yield gw
    gw.stop()


async def _run(gateway, env, query_ids):
    sessions = [gateway.open_session() for _ in query_ids]
    clients = [
        openai.AsyncOpenAI(base_url=gateway.session_base_url(s), api_key="x", timeout=60, max_retries=0)
        for s in sessions
    ]
    results = await asyncio.gather(
        *(env.run_agent(c, "policy", env.agent_task(q)) for c, q in zip(clients, query_ids, strict=True))
    )
    return results, [gateway.close_session(s) for s in sessions]


@pytest.mark.slow  # importing verifiers alone takes ~6 s here
def test_verifiers_episodes_run_through_the_gateway_with_the_rubrics_reward(gateway):
    env = make_text_env("verifiers", env={"taskset": {"id": "vf_tiny_taskset"}}, shuffle=False)
    assert env.query_ids == ["vf-0", "vf-1", "vf-2"] and env.agent_task("vf-1")["prompt"] == "say b"
    results, records = asyncio.run(asyncio.wait_for(_run(gateway, env, env.query_ids), 120))
    for letter, result, calls in zip("abc", results, records, strict=True):
        assert len(calls) == 1 and calls[0].endpoint == "chat" and len(calls[0].completion_ids) > 0
        has_letter = float(letter in calls[0].text.strip())
        # The rubric, as verifiers records it (weighted): replied (weight 0.5) + has_letter (weight 1), computed by
        # verifiers on the reply the gateway sampled.
        assert result["info"]["rewards"] == {"replied": 0.5, "has_letter": has_letter}
        assert result["reward"] == 0.5 + has_letter


@pytest.mark.slow  # loads verifiers' plugin machinery (~6 s)
def test_verifiers_errors_are_named():
    with pytest.raises(ValueError, match="cannot load the env.*no_such_taskset"):
        make_text_env("verifiers", env={"taskset": {"id": "no_such_taskset"}})

"""The adapter tests' gateways: the tiny character tokenizer with the gateway tests' chat template (Hermes tool
calls, the tools listed in a first system turn), a served gateway over an untrained tiny model behind the HF engine
(``gateway``), and a factory of served gateways over a scripted engine (``scripted_gateway``) for the replies an
untrained model does not write (a tool call, a right answer)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "gateway"))
from gateway_helpers import CHAT_TEMPLATE, ScriptedEngine  # noqa: E402

from r3_rllib.engines.base import SamplingParams  # noqa: E402

#: Sampling defaults of the tiny-model gateway: short replies at T = 0.6, seeded.
TINY_DEFAULTS = SamplingParams(max_new_tokens=8, temperature=0.6, seed=7)
#: The scripted engine's replies are whole texts: room for a tool call.
SCRIPTED_DEFAULTS = SamplingParams(max_new_tokens=200, temperature=1.0, seed=7)


@pytest.fixture(scope="session")
def chat_tokenizer():
    from r3_rllib.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="module")
def gateway(chat_tokenizer):
    """A served gateway over the untrained tiny model (HF engine), one per test module."""
    import torch
    from numeric import TORCH_THREADS

    from r3_rllib.engines.hf_engine import HFEngine
    from r3_rllib.gateway import Gateway
    from r3_rllib.models.tiny import build_tiny_model

    torch.set_num_threads(TORCH_THREADS)
    engine = HFEngine(build_tiny_model(chat_tokenizer, seed=0), chat_tokenizer)
    with Gateway(
        engine, chat_tokenizer, defaults=TINY_DEFAULTS, max_context=1024, max_batch_wait_s=0.5
    ) as gw:
        yield gw


@pytest.fixture
def scripted_gateway(chat_tokenizer):
    """``make(replies)``: a served gateway whose engine answers call k with ``replies[k]`` (then its eos); the
    engine is ``gateway.engine`` (its ``calls`` hold the prompts it got). Stopped after the test."""
    from r3_rllib.gateway import Gateway

    served = []

    def make(replies):
        gw = Gateway(ScriptedEngine(chat_tokenizer, replies), chat_tokenizer, defaults=SCRIPTED_DEFAULTS)
        served.append(gw.start())
        return gw

    yield make
    for gw in served:
        gw.stop()

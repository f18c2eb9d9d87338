"""The gateway's test fixtures: the tiny character tokenizer with a small chat template (its end of turn is the
model's eos, ``<eos>``), an untrained tiny model behind the HF engine, and a served gateway."""

from __future__ import annotations

import pytest
import torch
from gateway_helpers import CHAT_TEMPLATE, DEFAULTS
from numeric import TORCH_THREADS


@pytest.fixture(scope="session")
def chat_tokenizer():
    from r3_rllib.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="session")
def hf_engine(chat_tokenizer):
    from r3_rllib.engines.hf_engine import HFEngine
    from r3_rllib.models.tiny import build_tiny_model

    torch.set_num_threads(TORCH_THREADS)
    return HFEngine(build_tiny_model(chat_tokenizer, seed=0), chat_tokenizer)


@pytest.fixture(scope="module")
def gateway(hf_engine, chat_tokenizer):
    """A served gateway over the HF engine (one per test module); tests close the sessions they open."""
    from r3_rllib.gateway import Gateway

    with Gateway(hf_engine, chat_tokenizer, defaults=DEFAULTS, max_context=256, max_batch_wait_s=2.0) as gw:
        yield gw

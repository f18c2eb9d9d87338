"""Shared by the gateway tests: the chat template of the tiny character tokenizer, the sampling defaults, the
client timeout, and a scripted engine."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from r3_rllib.engines.base import Completion, GenerationEngine, SamplingParams

#: A ChatML-like template over the character tokenizer: ``<bos>role\ncontent<eos>\n`` per message, Hermes tool calls,
#: the tools listed in a first system turn, and ``<bos>assistant\n`` as the generation prompt.
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<bos>system\\ntools: ' + (tools | map(attribute='function') | map(attribute='name') "
    "| join(',')) + '<eos>\\n' }}{% endif %}"
    "{% for m in messages %}{{ '<bos>' + m['role'] + '\\n' + (m['content'] or '') }}"
    "{% for c in m.get('tool_calls') or [] %}{{ '<tool_call>' + (c['function'] | tojson) + '</tool_call>' }}"
    "{% endfor %}{{ '<eos>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<bos>assistant\\n' }}{% endif %}"
)
DEFAULTS = SamplingParams(max_new_tokens=12, temperature=0.6, seed=7)
TIMEOUT_S = 60.0


class ScriptedEngine(GenerationEngine):
    """Answers every prompt with the next scripted text (encoded, then the eos), log-prob -1 per token; raises
    ``RuntimeError`` for a prompt that ends with the token of ``"!"``."""

    def __init__(self, tokenizer, replies: Sequence[str]) -> None:
        self.tokenizer, self.replies, self.calls = tokenizer, list(replies), []

    def generate(self, prompt_ids, n, params):
        self.calls.append([list(p) for p in prompt_ids])
        if any(p[-1] == self.tokenizer.convert_tokens_to_ids("!") for p in prompt_ids):
            raise RuntimeError("scripted engine failure")
        out = []
        for p in prompt_ids:
            ids = self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False) + [
                self.tokenizer.eos_token_id
            ]
            ids = ids[: params.max_new_tokens]
            reason = "stop" if ids[-1] == self.tokenizer.eos_token_id else "length"
            lp = np.full(len(ids), -1.0, np.float32)
            out.append([Completion(list(p), ids, lp, -lp, reason) for _ in range(n)])
        return out

    def update_weights(self, named_tensors, version):
        self._version = version

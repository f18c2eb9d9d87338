"""A tokenizer of one token per character, no chat template (as the shipped character tokenizers): for env tests
that count prompt tokens without loading a real tokenizer."""

from __future__ import annotations


class CharTokenizer:
    """One token per character; no chat template."""

    chat_template = None
    eos_token = "<eos>"
    name_or_path = "/models/char-tok"

    def __call__(self, text, add_special_tokens=False):
        if isinstance(text, list):
            return {"input_ids": [list(range(len(t))) for t in text]}
        return {"input_ids": list(range(len(text)))}

"""Whether an env renders its prompts with the tokenizer's chat template: one rule for every text env.

``apply_chat_template`` (an env option of MathEnv, PythonToolEnv, ReasoningGymEnv, TextWorldEnv, ChatArithmeticEnv):

- ``"auto"`` (or True): the template when the tokenizer has one; a tokenizer without one renders plain text, with a
  warning once per tokenizer naming it (an instruct model then sees no chat turns, which it was not trained on);
- ``"required"``: a tokenizer without one is an error naming it (verl and TRL apply the template and fail without
  one, as transformers' ``apply_chat_template`` does);
- ``"none"`` (or False): plain text.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

#: Values of ``apply_chat_template`` (True is "auto", False is "none").
CHAT_TEMPLATE_MODES = ("auto", "required", "none")
# Tokenizers already warned about (by name or path): one warning per tokenizer per process, not per env or split.
_WARNED_NO_TEMPLATE: set[str] = set()


def tokenizer_name(tokenizer: Any) -> str:
    """What names a tokenizer in a message: its folder or hub name, else its class."""
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def use_chat_template(tokenizer: Any, mode: bool | str) -> bool:
    """Whether prompts are rendered with ``tokenizer``'s chat template under ``apply_chat_template=mode`` (the
    modes are in the module docstring); a mode outside :data:`CHAT_TEMPLATE_MODES` and the bools is a ValueError."""
    mode = {True: "auto", False: "none"}.get(mode, mode) if isinstance(mode, bool) else mode
    if mode not in CHAT_TEMPLATE_MODES:
        raise ValueError(
            f"apply_chat_template must be one of {list(CHAT_TEMPLATE_MODES)} or a bool, got {mode!r}"
        )
    if mode == "none" or tokenizer is None:
        if mode == "required":
            raise ValueError(
                "apply_chat_template='required' needs a tokenizer with a chat template (none was given)"
            )
        return False
    if getattr(tokenizer, "chat_template", None):
        return True
    name = tokenizer_name(tokenizer)
    if mode == "required":
        raise ValueError(
            f"tokenizer {name!r} has no chat template, and apply_chat_template='required': give a tokenizer with "
            "one (tokenizer_path), or set apply_chat_template 'auto' or 'none' to render plain text"
        )
    if name not in _WARNED_NO_TEMPLATE:
        _WARNED_NO_TEMPLATE.add(name)
        logger.warning(
            "tokenizer %r has no chat template: prompts are plain text (set apply_chat_template='none' to say so, "
            "or 'required' to refuse such a tokenizer)",
            name,
        )
    return False

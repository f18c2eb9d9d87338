"""Arithmetic asked in words through a chat model's template: the arithmetic task for pretrained instruct models.

:class:`ArithmeticEnv` serves the bare ``"3+5="`` that the tiny character model was trained to complete, and grades
a response that is exactly the integer. An instruct model (SmolLM2-135M-Instruct) needs a question in its chat
template, and answers in prose ("The answer is 8.", "3 + 5 = 8"); :class:`ChatArithmeticEnv` asks
``prompt_template`` through the tokenizer's chat template and, by default, grades the *last* integer of the response,
so the reward measures the arithmetic rather than the model's habit of wrapping numbers in words. ``answer="exact"``
keeps the strict grading (the response must be the integer alone), which turns the task into one of format as well.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from r3_rllib.envs.arithmetic import ArithmeticEnv
from r3_rllib.envs.chat import use_chat_template
from r3_rllib.envs.context import check_prompts_fit
from r3_rllib.envs.data import parse_reset_options
from r3_rllib.envs.math_env import load_tokenizer

DEFAULT_CHAT_PROMPT = "What is {expression}? Answer with the number only."
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_integer(text: str) -> str | None:
    """The last integer written in ``text`` (a leading minus kept unless it follows a word or digit), or None.

    Decimals are not integers: ``"2.5"`` yields None, ``"It is 3."`` yields ``"3"``.
    """
    found = None
    for match in _NUMBER.finditer(text):
        token = match.group(0)
        if "." in token:
            found = None  # a decimal after an integer replaces it as the last number written
            continue
        if token.startswith("-") and match.start() > 0 and (text[match.start() - 1].isalnum()):
            token = token[1:]  # "9-3" is a subtraction, not minus three
        found = token
    return found


class ChatArithmeticEnv(ArithmeticEnv):
    """:class:`ArithmeticEnv`'s pools and data order, asked through a chat template and graded leniently.

    Config (besides every :class:`ArithmeticEnv` option except ``length_bonus_max_tokens``):
        tokenizer: a tokenizer object or folder with a chat template (the runner hands over the policy's).
        apply_chat_template: ``"required"`` (default: this env exists to ask through the template; a tokenizer
            without one is an error naming it), ``"auto"`` or ``"none"`` (plain text; see
            :mod:`r3_rllib.envs.chat`).
        model_max_positions, max_new_tokens: the model's context and the response budget (the EnvRunner fills
            them in); a prompt too long for them raises ``DataError`` naming the query. None: no check.
        prompt_template: the user turn; ``{expression}`` is replaced by e.g. ``"3+5"``.
        system_prompt: a system turn; None keeps the template's default (SmolLM2's names the assistant).
        answer: ``"last_integer"`` (default) grades the last integer of the response; ``"exact"`` requires the
            response (eos removed, whitespace stripped) to be the integer alone, as :class:`ArithmeticEnv` does.

    ``info["query_text"]`` is the user turn before the chat template (what reflection prompts quote); a reflection
    prompt (``reset`` option ``user_content``) is rendered through the same template.
    """

    def __init__(
        self,
        *,
        tokenizer: Any = None,
        prompt_template: str = DEFAULT_CHAT_PROMPT,
        system_prompt: str | None = None,
        answer: Literal["last_integer", "exact"] = "last_integer",
        apply_chat_template: bool | str = "required",
        model_max_positions: int | None = None,
        max_new_tokens: int = 0,
        **arithmetic_config: Any,
    ) -> None:
        if "{expression}" not in prompt_template:
            raise ValueError(f"prompt_template must contain '{{expression}}', got {prompt_template!r}")
        if answer not in ("last_integer", "exact"):
            raise ValueError(f"answer must be 'last_integer' or 'exact', got {answer!r}")
        if arithmetic_config.get("length_bonus_max_tokens") is not None:
            # ArithmeticEnv counts characters (= tokens of the character model); a BPE model's answer length in
            # characters would reward short prose, not short token sequences.
            raise ValueError("ChatArithmeticEnv has no length bonus; use ArithmeticEnv or MathEnv for one")
        tokenizer = load_tokenizer(tokenizer)
        try:
            chat = use_chat_template(tokenizer, apply_chat_template)
        except ValueError as e:
            raise ValueError(
                f"ChatArithmeticEnv: {e}; use ArithmeticEnv for models that complete '3+5=' directly"
            ) from None
        super().__init__(tokenizer=tokenizer, **arithmetic_config)
        self.tokenizer = tokenizer
        self.use_chat_template = chat
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt
        self.answer = answer
        prompts = ((qid, self.render_prompt(self.user_text(qid))) for qid in self.query_ids)
        check_prompts_fit(prompts, tokenizer, model_max_positions, max_new_tokens, env_name="chat_arithmetic")

    def render_prompt(self, user_text: str) -> str:
        """The chat template applied to one user turn (after the optional system turn), ready for the reply; plain
        text (the system turn, a blank line, the user turn) without one."""
        if not self.use_chat_template:
            return f"{self.system_prompt}\n\n{user_text}" if self.system_prompt else user_text
        messages = [{"role": "user", "content": user_text}]
        if self.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def user_text(self, query_id: str) -> str:
        return self.prompt_template.replace("{expression}", self.problem(query_id).expression)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        _, user_content = parse_reset_options(options)
        _, info = super().reset(seed=seed, options=options)
        query_text = self.user_text(info["query_id"])
        info["query_text"] = query_text
        return self.render_prompt(query_text if user_content is None else user_content), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.answer == "exact":
            return super().step(action)
        response = action
        for eos in self.eos_texts:
            response = response.replace(eos, "")
        number = last_integer(response)
        # The parent grades a response that is exactly an integer; hand it the extracted one (or the stripped
        # response, which then fails its integer check, when there is none).
        obs, reward, terminated, truncated, info = super().step(number if number is not None else response)
        info["extracted_answer"] = number
        return obs, reward, terminated, truncated, info

"""A generative judge: a causal LM, served by one of the package's generation engines, reads a rubric holding the
question and one response and writes a verdict, parsed into a reward in [0, 1].

The judge (:class:`JudgeModel`, shared with the group judge of :mod:`r3_rllib.reward_models.group_judge`) is built
like an evaluation engine: the engine registered as ``spec.engine`` (``hf``, ``vllm`` or a plugin's) with that
engine's options for grading (:meth:`~r3_rllib.engines.base.GenerationEngine.evaluation_kwargs`: seed 0, a KV cache
for the rubric's prompt plus ``max_new_tokens``, no top-k log-probs; on a GPU vLLM takes
:data:`JUDGE_GPU_MEMORY_UTILIZATION` of its memory, beside the policy's engines), dtype ``auto`` (bf16 on GPUs that
support it), and on a visible GPU for an engine that takes a ``device`` (the HF engine). Sampling is greedy unless
``spec.temperature`` > 0 (then seeded, so reruns agree), at most ``spec.max_new_tokens`` tokens.

The prompt is the rubric (``spec.rubric``, else :data:`DEFAULT_RUBRIC` or, without a gold answer,
:data:`DEFAULT_RUBRIC_NO_GOLD`) with ``{question}`` (the prompt as the policy saw it), ``{response}`` and ``{gold}``
(the reference answer; ``(no reference answer)`` when the env has none) filled in in one pass, rendered as one user
turn through the judge tokenizer's chat template (as plain text when it has none). When the policy's prompt is a
rendering of the judge tokenizer's own chat template (policy and judge of one template family: the prompt ends as
that template ends a user turn), the question is the content of its last user turn, without the system turn and the
template's markup (:func:`last_user_turn`). The judge tokenizer's special tokens are removed from the question,
response and gold, so a response cannot close the judge's turn and write the judge's reply itself.

The verdict is read by :func:`r3_rllib.core.verdicts.parse_verdict`: the last line beginning ``Verdict:``, followed
by ``correct`` (1.0), ``incorrect`` (0.0) or a number in [0, 1]. Reasons (value 0): ``judge_unparsable`` (no such
line), ``judge_too_long`` (the prompt plus ``max_new_tokens`` does not fit what the engine serves; not sent),
``judge_error`` (the engine raised: every request of that engine call). Timeouts and hangs are the reward server's.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from r3_rllib.core.verdicts import parse_verdict
from r3_rllib.reward_models.specs import RewardModelSpec
from r3_rllib.rewards.scoring import RewardRequest, RewardScore

logger = logging.getLogger(__name__)

#: Share of GPU memory a vLLM judge takes (the policy's runners hold theirs beside it).
JUDGE_GPU_MEMORY_UTILIZATION = 0.25
#: What ``{gold}`` becomes in a user's rubric when the env exposes no reference answer.
NO_GOLD = "(no reference answer)"

_VERDICT_INSTRUCTIONS = (
    "You may explain briefly first. The last line of your reply must be exactly `Verdict: correct` or "
    "`Verdict: incorrect` (or `Verdict: ` followed by a score between 0 and 1)."
)
#: The default rubric of a judge when the request has a gold answer.
DEFAULT_RUBRIC = (
    "You are grading a response to a question.\n\n"
    "Question:\n{question}\n\n"
    "Reference answer:\n{gold}\n\n"
    "Response to grade:\n{response}\n\n"
    "Does the response answer the question correctly, giving the same final answer as the reference answer? "
    + _VERDICT_INSTRUCTIONS
)
#: The default rubric of a judge when the env exposes no gold answer.
DEFAULT_RUBRIC_NO_GOLD = (
    "You are grading a response to a question.\n\n"
    "Question:\n{question}\n\n"
    "Response to grade:\n{response}\n\n"
    "Does the response answer the question correctly? " + _VERDICT_INSTRUCTIONS
)

_PLACEHOLDER = re.compile(r"\{(question|response|gold|responses|n)\}")


def fill_rubric(rubric: str, values: dict[str, str]) -> str:
    """``rubric`` with each ``{name}`` of ``values`` (question, response, gold, responses, n) replaced in one pass
    (a response holding ``{gold}`` stays as written); other braces are left alone."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), rubric)


def judge_prompt(rubric: str | None, question: str, response: str, gold: str | None) -> str:
    """The text the judge reads for one response (module docstring)."""
    if rubric is None:
        rubric = DEFAULT_RUBRIC if gold is not None else DEFAULT_RUBRIC_NO_GOLD
    return fill_rubric(
        rubric, {"question": question, "response": response, "gold": NO_GOLD if gold is None else gold}
    )


def user_turn_markers(tokenizer: Any) -> tuple[str, str] | None:
    """``(opener, closer)`` of a user turn in ``tokenizer``'s chat template: the text from the last special token
    before a user message's content (``"<|im_start|>user\\n"``), and everything after it up to the reply
    (``"<|im_end|>\\n<|im_start|>assistant\\n"``); None without a template or when the opener holds no special
    token."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    marker = "\x00"
    try:
        messages = [{"role": "user", "content": marker}]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that refuses a lone user turn: the prompt is then used whole
        return None
    if not isinstance(rendered, str) or rendered.count(marker) != 1:
        return None
    prefix, closer = rendered.split(marker)
    start = max((prefix.rfind(t) for t in tokenizer.all_special_tokens if t), default=-1)
    return None if start < 0 or not closer else (prefix[start:], closer)


def last_user_turn(prompt: str, markers: tuple[str, str] | None) -> str | None:
    """The content of the last user turn of ``prompt`` when it ends as a user turn of ``markers``'
    template (:func:`user_turn_markers`) ends; None otherwise."""
    if markers is None:
        return None
    opener, closer = markers
    if not prompt.endswith(closer):
        return None
    body = prompt[: len(prompt) - len(closer)]
    start = body.rfind(opener)
    return None if start < 0 else body[start + len(opener) :]


def _engine_kwargs(cls: type, spec: RewardModelSpec) -> dict[str, Any]:
    """The judge engine's options (module docstring)."""
    import torch

    from r3_rllib.models.dtypes import dtype_name

    gpu = torch.cuda.is_available()
    kwargs = cls.evaluation_kwargs(
        seed=0,
        max_new_tokens=spec.max_new_tokens,
        gpu_memory_utilization=JUDGE_GPU_MEMORY_UTILIZATION,
        tensor_parallel_size=1,
    )
    kwargs["dtype"] = dtype_name("auto")
    if gpu and "device" in inspect.signature(cls.__init__).parameters:
        kwargs["device"] = "cuda"
    return kwargs


class JudgeModel:
    """A judge LM behind an engine: renders prompts through its chat template and writes one reply to each."""

    def __init__(self, spec: RewardModelSpec) -> None:
        from transformers import AutoConfig

        from r3_rllib.engines import make_engine
        from r3_rllib.engines.base import SamplingParams
        from r3_rllib.engines.budget import derive_max_model_len, model_max_positions
        from r3_rllib.engines.registry import engine_class
        from r3_rllib.models.hub import resolve_model_path
        from r3_rllib.models.tiny import load_tokenizer

        if not spec.model:
            raise ValueError(
                f"reward term {spec.name!r} (type {spec.type}) needs model: a causal LM's folder or name"
            )
        path = resolve_model_path(spec.model)
        self.tokenizer = load_tokenizer(path)
        cls = engine_class(spec.engine)
        kwargs = _engine_kwargs(cls, spec)
        self.engine = make_engine(spec.engine, str(path), self.tokenizer, **kwargs)
        positions = model_max_positions(AutoConfig.from_pretrained(str(path)))
        budget = kwargs.get("budget")
        #: Prompt plus reply tokens the engine serves (None: no known limit).
        self.max_tokens = positions if budget is None else derive_max_model_len(budget, positions)
        self.max_new_tokens = int(spec.max_new_tokens)
        # Greedy needs no seed; sampling is seeded so that reruns agree.
        seed = 0 if spec.temperature > 0 else None
        self.params = SamplingParams(
            max_new_tokens=self.max_new_tokens, temperature=float(spec.temperature), seed=seed
        )
        self._specials = sorted((t for t in self.tokenizer.all_special_tokens if t), key=len, reverse=True)
        self._user_turn = user_turn_markers(self.tokenizer)

    def clean(self, text: str) -> str:
        """``text`` without the judge tokenizer's special tokens (a response cannot open or close its turns)."""
        for token in self._specials:
            text = text.replace(token, "")
        return text

    def question(self, prompt_text: str) -> str:
        """What the judge reads as the question: the last user turn of a prompt rendered with the judge's own chat
        template, else the whole prompt; special tokens removed."""
        turn = last_user_turn(prompt_text, self._user_turn)
        return self.clean(prompt_text if turn is None else turn)

    def prompt_ids(self, text: str) -> list[int]:
        """``text`` as one user turn through the chat template (plain text without one), as token ids."""
        if getattr(self.tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": text}]
            rendered = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            return list(self.tokenizer(rendered, add_special_tokens=False)["input_ids"])
        return list(self.tokenizer(text)["input_ids"])

    def fits(self, ids: Sequence[int]) -> bool:
        """Whether a prompt of ``ids`` plus ``max_new_tokens`` fits what the engine serves."""
        return self.max_tokens is None or len(ids) + self.max_new_tokens <= self.max_tokens

    def replies(self, prompts: Sequence[Sequence[int]]) -> list[str]:
        """One reply per prompt (token ids), in order; raises what the engine raises."""
        if not prompts:
            return []
        return [completions[0].text for completions in self.engine.generate(prompts, 1, self.params)]

    def judge(
        self, prompts: Sequence[Sequence[int]], parsers: Sequence[Callable[[str], Any]]
    ) -> tuple[list[Any], str | None]:
        """``(each reply read by its prompt's parser, None)``, or ``([], "judge_error")`` when the engine raised."""
        try:
            texts = self.replies(prompts)
        except Exception as exc:  # a judge that fails must not stop the run: its batch scores 0 with a reason
            logger.warning(
                "judge engine failed on a batch of %d: %s: %s", len(prompts), type(exc).__name__, exc
            )
            return [], "judge_error"
        return [parse(text) for parse, text in zip(parsers, texts, strict=True)], None

    def shutdown(self) -> None:
        """Release the engine."""
        self.engine.shutdown()


class GenerativeJudge:
    """Grades each response by a judge LM's verdict (module docstring); a
    :class:`~r3_rllib.rewards.scoring.RewardScorer`."""

    def __init__(self, spec: RewardModelSpec) -> None:
        self.name = spec.name
        self.rubric = spec.rubric
        self.batch_size = int(spec.batch_size)
        self.model = JudgeModel(spec)

    def prompt_text(self, request: RewardRequest) -> str:
        """The judge's prompt for ``request``, before the chat template."""
        clean = self.model.clean
        gold = None if request.gold is None else clean(request.gold)
        return judge_prompt(
            self.rubric, self.model.question(request.prompt_text), clean(request.response_text), gold
        )

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardScore]:
        """One score per request, in order; ``batch_size`` prompts per engine call."""
        scores: list[RewardScore] = [RewardScore(0.0, "judge_too_long") for _ in requests]
        prompts = [self.model.prompt_ids(self.prompt_text(r)) for r in requests]
        sent = [i for i, ids in enumerate(prompts) if self.model.fits(ids)]
        for start in range(0, len(sent), self.batch_size):
            chunk = sent[start : start + self.batch_size]
            values, failure = self.model.judge([prompts[i] for i in chunk], [parse_verdict] * len(chunk))
            for k, i in enumerate(chunk):
                if failure is not None:
                    scores[i] = RewardScore(0.0, failure)
                elif values[k] is None:
                    scores[i] = RewardScore(0.0, "judge_unparsable")
                else:
                    scores[i] = RewardScore(values[k])
        return scores

"""Math word problems with verifiable answers (MATH, AIME, DeepScaleR, ...), graded by the math grader.

The user turn is ``prompt_template`` with ``{problem}`` replaced (DeepScaleR's instruction by default), rendered
with the tokenizer's chat template when it has one. The reward is 1 when the last ``\\boxed{}`` of the final answer
(after ``</think>``) is equivalent to one of the row's accepted answers, plus an optional length bonus for correct
answers counted in tokens.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from r3_rllib.envs.arithmetic import length_bonus
from r3_rllib.envs.base import PooledTextEnv
from r3_rllib.envs.chat import use_chat_template
from r3_rllib.envs.context import PromptLimits
from r3_rllib.envs.data import (
    DataError,
    LoadReport,
    MathProblem,
    QueryOrder,
    Shard,
    check_count,
    load_math_problems_with_report,
    parse_reset_options,
)
from r3_rllib.rewards.math_grader import DEFAULT_TIMEOUT_S, check_timeout, shared_grader

# DeepScaleR's instruction; rendered text: "... output the final answer within \boxed{}."
DEFAULT_PROMPT_TEMPLATE = "{problem} Let's think step by step and output the final answer within \\boxed{}."

logger = logging.getLogger(__name__)

DataSource = str | os.PathLike
DataSpec = DataSource | Sequence[DataSource] | Sequence[MathProblem] | Mapping[str, Any]


def load_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer object as is; a folder through the project's loader.

    The loader reads the project's character-level tokenizers with ``PreTrainedTokenizerFast``, because
    ``AutoTokenizer`` resolves a Qwen2 ``config.json`` to ``Qwen2Tokenizer``, which silently drops characters of a
    custom vocabulary; every other folder goes through ``AutoTokenizer``.
    """
    if tokenizer is None or not isinstance(tokenizer, str | os.PathLike):
        return tokenizer
    from r3_rllib.models.tiny import load_tokenizer as load_from_dir

    return load_from_dir(tokenizer)


def render_user_text(problem: str, template: str) -> str:
    """``template`` with ``{problem}`` replaced. Not ``str.format``: templates contain ``\\boxed{}``."""
    return template.replace("{problem}", problem)


def _check_options(
    prompt_template: Any, system_prompt: Any, think_in_prompt: Any, grading_timeout_s: Any
) -> None:
    """Refuse, naming the option, a template that is not a string with ``{problem}``, a system prompt that is not a
    string, ``think_in_prompt`` not a bool or None, and a grading timeout that is not a finite number > 0 (NaN
    passed ``<= 0`` and failed at the first grade)."""
    if not isinstance(prompt_template, str) or "{problem}" not in prompt_template:
        raise ValueError(f"prompt_template must contain '{{problem}}' (a string), got {prompt_template!r}")
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise ValueError(
            f"system_prompt must be a string or None, got {type(system_prompt).__name__} {system_prompt!r}"
        )
    # bool("false") is True: a string must not open a think block silently.
    if think_in_prompt is not None and not isinstance(think_in_prompt, bool):
        raise ValueError(
            f"think_in_prompt must be true, false or None (detect it), got {type(think_in_prompt).__name__} "
            f"{think_in_prompt!r}"
        )
    check_timeout("grading_timeout_s", grading_timeout_s)


def _check_counts(
    length_bonus_max_tokens: Any, max_prompt_tokens: Any, model_max_positions: Any, max_new_tokens: Any
) -> None:
    """Refuse token counts that are not integers > 0 or None, and a response budget that is not an integer >= 0,
    naming the option (``length_bonus_max_tokens="5"`` failed with a bare TypeError, NaN passed silently)."""
    check_count("length_bonus_max_tokens", length_bonus_max_tokens, minimum=1)
    check_count("max_prompt_tokens", max_prompt_tokens, minimum=1)
    check_count("model_max_positions", model_max_positions, minimum=1)
    check_count("max_new_tokens", max_new_tokens, minimum=0, optional=False)


class MathEnv(PooledTextEnv):
    """Single-step math problems from local files or a hub dataset.

    Config:
        data: a source (``.json``/``.jsonl``/``.parquet`` path or hub dataset name), a list of sources (their
            problems are concatenated; ids colliding across sources are prefixed with ``"<source stem>/"``), a list
            of :class:`MathProblem`, or a mapping ``{split: source(s)}`` (``split`` picks the entry). A source that
            gives no problem (an empty file or split, or all its rows skipped as bad) raises ``DataError`` naming
            it, as ``datasets``/verl refuse an empty dataset, rather than contributing nothing silently.
        split: the hub split, or the key of a ``{split: source}`` mapping. A single local file has no test split:
            ``split != "train"`` with one is an error rather than a silent evaluation on training data.
        problem_key, answer_key, answers_key, id_key, on_bad_row, max_rows: see ``load_math_problems``.
        tokenizer: a tokenizer object or folder; renders the chat template and counts tokens.
        prompt_template: the user turn, ``{problem}`` replaced (default: DeepScaleR's instruction).
        system_prompt: an optional system turn (plain text: prepended with a blank line).
        apply_chat_template: ``"auto"`` (default, or True): the tokenizer's chat template when it has one, else
            plain text with a warning naming the tokenizer; ``"required"``: a tokenizer without one is an error;
            ``"none"`` (or False): plain text (see :func:`use_chat_template`).
        max_prompt_tokens: prompts longer than this (rendered, in tokens) raise ``DataError`` naming the row, or
            are skipped and counted (``data_report["skipped_too_long"]``) with ``on_bad_row="skip"``.
        model_max_positions, max_new_tokens: the model's context (``max_position_embeddings``) and the response
            budget; a prompt whose tokens + max_new_tokens exceed the context raises ``DataError`` naming the query,
            its length and the limit (skipped, counted and warned about with ``on_bad_row="skip"``). The EnvRunner
            fills both in from the model's config and ``R3Config.max_new_tokens``; None: no check.
        length_bonus_max_tokens: ``L``; correct answers get ``max(0, 1 - tokens / L)`` more reward.
        Token counts (``max_prompt_tokens``, ``model_max_positions``, ``length_bonus_max_tokens``: integers > 0 or
        None; ``max_new_tokens``: an integer >= 0), ``prompt_template``, ``system_prompt`` and ``think_in_prompt``
        of the wrong type raise ValueError naming the option when the env is built.
        seed, shuffle, shard: the per-epoch order and this env's shard of it, as in ``ArithmeticEnv``.
        grading_timeout_s: hard limit per graded answer (math-verify runs in a worker subprocess).
        think_in_prompt: whether the prompt opens a ``<think>`` block (then a response without ``</think>`` is
            wrong); ``None`` detects it from the rendered prompt (DeepSeek-R1 templates end with ``<think>\\n``).
    """

    def __init__(
        self,
        *,
        data: DataSpec,
        split: str = "train",
        problem_key: str = "problem",
        answer_key: str = "answer",
        answers_key: str = "answers",
        id_key: str = "id",
        on_bad_row: Literal["error", "skip"] = "error",
        max_rows: int | None = None,
        tokenizer: Any = None,
        prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
        system_prompt: str | None = None,
        apply_chat_template: bool | str = "auto",
        max_prompt_tokens: int | None = None,
        model_max_positions: int | None = None,
        max_new_tokens: int = 0,
        length_bonus_max_tokens: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        shard: Shard | dict[str, int] | None = None,
        grading_timeout_s: float = DEFAULT_TIMEOUT_S,
        think_in_prompt: bool | None = None,
    ) -> None:
        super().__init__()
        _check_options(prompt_template, system_prompt, think_in_prompt, grading_timeout_s)
        _check_counts(length_bonus_max_tokens, max_prompt_tokens, model_max_positions, max_new_tokens)
        self.tokenizer = load_tokenizer(tokenizer)
        if self.tokenizer is None and (max_prompt_tokens is not None or length_bonus_max_tokens is not None):
            raise ValueError("max_prompt_tokens and length_bonus_max_tokens count tokens: pass a tokenizer")
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt
        self.use_chat_template = use_chat_template(self.tokenizer, apply_chat_template)
        self.length_bonus_max_tokens = length_bonus_max_tokens
        self.grading_timeout_s = float(grading_timeout_s)
        self.think_in_prompt = think_in_prompt
        self.split = split

        loader_options = dict(
            problem_key=problem_key,
            answer_key=answer_key,
            answers_key=answers_key,
            id_key=id_key,
            on_bad_row=on_bad_row,
            max_rows=max_rows,
        )
        problems, reports = _load(data, split, loader_options)
        self.load_reports: list[LoadReport] = reports
        limits = PromptLimits(max_prompt_tokens, model_max_positions, int(max_new_tokens))
        problems, skipped_long = self._drop_long_prompts(problems, limits, on_bad_row)
        if not problems:
            raise DataError(f"no usable problems in {_describe_data(data)} (split {split!r})")
        self.problems: list[MathProblem] = problems
        self.data_report = {
            "loaded": len(problems),
            "skipped_bad_rows": sum(r.skipped for r in reports),
            "skipped_too_long": skipped_long,
        }
        self._by_id = {p.id: p for p in problems}
        self._order = QueryOrder(len(problems), seed=seed, shuffle=shuffle, shard=shard)
        self._current: tuple[MathProblem, bool] | None = None

    # -- prompts ---------------------------------------------------------------------------------------------
    def render_prompt(self, user_text: str) -> str:
        """The full prompt for a user turn: the chat template with the generation prompt, or plain text."""
        if self.use_chat_template:
            messages = [{"role": "user", "content": user_text}]
            if self.system_prompt is not None:
                messages.insert(0, {"role": "system", "content": self.system_prompt})
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if self.system_prompt:
            return f"{self.system_prompt}\n\n{user_text}"
        return user_text

    def user_text(self, problem: MathProblem) -> str:
        return render_user_text(problem.problem, self.prompt_template)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _drop_long_prompts(
        self, problems: list[MathProblem], limits: PromptLimits, on_bad_row: str
    ) -> tuple[list[MathProblem], int]:
        """The problems whose rendered prompt passes ``limits``, and how many were dropped (``on_bad_row='skip'``;
        with 'error' the first one raises DataError naming it)."""
        if not limits.active or self.tokenizer is None:
            return problems, 0
        prompts = [self.render_prompt(self.user_text(p)) for p in problems]
        # Special tokens written as text in a rendered template count as one token each (add_special_tokens=False
        # keeps a BOS from being added twice).
        lengths = [len(ids) for ids in self.tokenizer(prompts, add_special_tokens=False)["input_ids"]]
        kept, reasons = [], []
        for problem, n in zip(problems, lengths, strict=True):
            reason = limits.violation(n)
            if reason is None:
                kept.append(problem)
                continue
            message = f"query {problem.id!r}: prompt has {n} tokens{reason}"
            if on_bad_row == "error":
                raise DataError(f"{message} (pass on_bad_row='skip' to drop such rows)")
            reasons.append(message)
        if reasons:
            logger.warning("skipped %d prompt(s) too long; first: %s", len(reasons), "; ".join(reasons[:3]))
        return kept, len(reasons)

    # -- TextEnv ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.problems)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Next problem of the shuffled pool (``seed`` restarts the iteration with that shuffle seed). Options:
        ``query_id`` re-serves that problem without moving the cursor; ``user_content`` (with ``query_id``) is
        rendered as the user turn instead of the problem, graded against the problem's answers."""
        super().reset(seed=seed)
        if seed is not None:
            self._order.restart(seed)
        query_id, user_content = parse_reset_options(options)
        problem = self.problems[self._order.next()] if query_id is None else self.problem(query_id)
        query_text = self.user_text(problem)
        prompt = self.render_prompt(query_text if user_content is None else user_content)
        think = self.think_in_prompt
        if think is None:
            think = prompt.rstrip().endswith("<think>")
        self._current = (problem, think)
        return prompt, {"query_id": problem.id, "query_text": query_text, "gold": problem.answers}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._current is None:
            raise RuntimeError("call reset() before step(); an episode is one response")
        (problem, think), self._current = self._current, None
        grade = shared_grader(self.grading_timeout_s).grade(action, problem.answers, think_in_prompt=think)
        correctness = 1.0 if grade.correct else 0.0
        bonus = 0.0
        if grade.correct and self.length_bonus_max_tokens is not None:
            bonus = length_bonus(self.count_tokens(action), self.length_bonus_max_tokens)
        info = {
            "query_id": problem.id,
            "correct": grade.correct,
            "reward_components": {"correctness": correctness, "length_bonus": bonus},
            "grade_reason": grade.reason,
            "gold": problem.answers,
        }
        return "", correctness + bonus, True, False, info

    # -- helpers ---------------------------------------------------------------------------------------------
    def problem(self, query_id: str) -> MathProblem:
        try:
            return self._by_id[query_id]
        except KeyError:
            raise ValueError(
                f"unknown query_id {query_id!r}: not among this environment's {len(self)} problems"
            ) from None

    @property
    def query_ids(self) -> list[str]:
        return [p.id for p in self.problems]


def _describe_data(data: Any) -> str:
    if isinstance(data, str | os.PathLike):
        return str(data)
    if isinstance(data, Mapping):
        return f"data mapping with splits {sorted(data)}"
    return f"{len(data)} data item(s)"


def _is_local_file(source: Any) -> bool:
    return isinstance(source, os.PathLike) or (
        isinstance(source, str) and Path(os.path.expanduser(source)).exists()
    )


def _load(data: DataSpec, split: str, options: dict[str, Any]) -> tuple[list[MathProblem], list[LoadReport]]:
    if isinstance(data, Mapping):
        if split not in data:
            raise DataError(f"data has no split {split!r}; splits: {sorted(data)}")
        data = data[split]  # a hub name here is loaded with that split
    elif split != "train" and (
        _is_local_file(data)
        or (isinstance(data, Sequence) and not isinstance(data, str) and any(_is_local_file(d) for d in data))
    ):
        raise DataError(
            f"split {split!r} requested but {_describe_data(data)} is a local file without splits; "
            f"pass data={{'train': ..., {split!r}: ...}} or a hub dataset name"
        )
    if isinstance(data, str | os.PathLike):
        sources: list[Any] = [data]
    elif isinstance(data, Iterable):
        sources = list(data)
    else:  # None: env_config without 'data'
        raise TypeError(
            f"data must be a file, a folder, a hub dataset name, a list of them, a split mapping or MathProblems, "
            f"got {type(data).__name__} (env_config needs a 'data' entry)"
        )
    if sources and all(isinstance(s, MathProblem) for s in sources):
        problems = list(sources)
        ids = [p.id for p in problems]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise DataError(f"duplicate problem id {dup!r} in the given problems")
        return problems, []
    if not sources or not all(isinstance(s, str | os.PathLike) for s in sources):
        raise TypeError(
            "data must be a path/hub name, a list of them, a list of MathProblem, or {split: ...}"
        )
    return _load_sources(sources, split, options, _describe_data(data))


def _load_sources(
    sources: list[DataSource], split: str, options: dict[str, Any], described: str
) -> tuple[list[MathProblem], list[LoadReport]]:
    """The problems of every source, ids colliding across sources prefixed with ``"<source stem>/"``. A source
    that gives no problem (an empty file or split, or every row skipped as bad) is a DataError naming it, as
    ``datasets``/verl refuse an empty dataset: among several sources it would otherwise contribute nothing,
    silently, though it is most likely a wrong path, split or filter."""
    per_source = []
    reports = []
    for source in sources:
        problems, report = load_math_problems_with_report(source, split=split, **options)
        if not problems:
            raise DataError(f"{report.source}: {_why_no_problems(report, options)}")
        per_source.append((source, problems))
        reports.append(report)
    counts: dict[str, int] = {}
    for _, problems in per_source:
        for p in problems:
            counts[p.id] = counts.get(p.id, 0) + 1
    out: list[MathProblem] = []
    for source, problems in per_source:
        stem = Path(str(source)).stem if _is_local_file(source) else str(source).rsplit("/", 1)[-1]
        for p in problems:
            # Ids unique within a file can collide across files: qualify only those (stable across runs).
            out.append(p if counts[p.id] == 1 else MathProblem(f"{stem}/{p.id}", p.problem, p.answers))
    if len({p.id for p in out}) != len(out):
        raise DataError(f"problem ids collide across {described} even after prefixing the source stem")
    return out, reports


def _why_no_problems(report: LoadReport, options: Mapping[str, Any]) -> str:
    """Why a source gave no problem, for the DataError naming it."""
    if options.get("max_rows") == 0:
        return "no problems: max_rows=0 loads none"
    if report.rows_read == 0:
        return (
            "no problems: the source has no rows (every data source must give at least one: check the path, the "
            "split or the filter that produced it)"
        )
    first = f"; first: {report.skip_reasons[0]}" if report.skip_reasons else ""
    return f"no problems: all {report.rows_read} row(s) are bad and were skipped (on_bad_row='skip'){first}"

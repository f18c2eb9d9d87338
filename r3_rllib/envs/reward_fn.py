"""A task from a dataset and a reward function (``env: reward_fn``), what TRL's ``GRPOTrainer`` takes: a
single-step text env with epochs, sharding over the EnvRunners, checkpointed data order and a held-out split.

::

    R3Config().environment("reward_fn", env_config={
        "data": "problems.jsonl",            # .json/.jsonl/.parquet, a hub name, a datasets.Dataset, a list of dicts
        "prompt": "{question}",              # a column, or a template over the row's columns
        "reward": "my_rewards:exact_match",  # "module:function", or the function itself
    })

**The reward function**, ``reward(prompt, completion, **row) -> float | dict``:

- ``prompt``: the row's prompt as formatted (the user turn before any chat template; the list of messages of a
  conversational prompt column); ``completion``: the response text, its end-of-sequence token removed; ``row``:
  the row's columns as keywords, except columns named ``prompt`` or ``completion`` (as TRL passes them).
- A number (a bool counts as 0 or 1) is the reward. The sample counts as correct (accuracy, replay, reflection)
  when the reward is at least ``correct_threshold`` (default 1.0).
- A dict holds *parts*: every number in it is a part (``info["reward_components"]``: the per-sample records show
  them); the reward is its ``"reward"`` entry when it has one, else the sum of the parts. Two keys are not parts:
  ``"correct"`` (a bool: overrides the threshold) and ``"reason"`` (a string: the grade reason, counted per
  iteration as ``rollout/grade_reason/<reason>_frac``). Without a reason the grade reason is ``correct`` or
  ``wrong``.
- ``reward_style="trl"`` calls a reward function written for TRL unchanged: ``reward(prompts=[prompt],
  completions=[completion], **{column: [value]})`` returning a list of one number (a conversational prompt's
  completion is ``[{"role": "assistant", "content": text}]``, as in TRL).

**A reward function that fails costs a sample, not the run**: one that raises, or returns something other than a
number or a dict of numbers (``"correct"`` not a bool or 0/1, a TRL result not a list of one number), or calls
``sys.exit()``, gives reward 0 with grade reason ``reward_error``; one that has not returned after
``reward_timeout_s`` seconds (default 30; :func:`~r3_rllib.rewards.bounded.bounded_call`) gives 0 with reason
``timeout``. The exception or the limit is in ``info["grade_detail"]``; both are counted (``reward_failures`` on the
env, ``rollout/grade_reason/reward_error_frac`` and ``.../timeout_frac`` in the metrics) and logged at the 1st,
10th, 100th, ... failure. ``on_reward_error="raise"`` stops at the first one instead (to debug a reward function).
A KeyboardInterrupt is not a failure of the reward function: it stops the run as anywhere else.

**Data**: train and held-out rows, ids, prompt columns and templates are :mod:`r3_rllib.envs.rows`'s; the held-out
env (``eval_env_config: {split: test}``, the default) serves the held-out rows.

**A callable in env_config** (a reward function, data as a list or a ``datasets.Dataset``) reaches the EnvRunners,
Ray actors in other processes, *pickled* (cloudpickle): a function of your script or a lambda is shipped by value,
so it must not hold what cannot be pickled (an open file, a lock, a CUDA model). A ``"module:function"`` string is
imported in each runner instead: the form for run files, and the module must be importable there (an installed
package, a module in the current directory, which Ray adds to its workers' paths, or one on ``PYTHONPATH``).
"""

from __future__ import annotations

import logging
import math
import numbers
from collections import Counter
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Literal

from r3_rllib.envs.arithmetic import DEFAULT_EOS_TEXTS
from r3_rllib.envs.base import PooledTextEnv
from r3_rllib.envs.chat import use_chat_template
from r3_rllib.envs.context import check_prompts_fit
from r3_rllib.envs.data import QueryOrder, Shard, check_count, parse_reset_options
from r3_rllib.envs.math_env import load_tokenizer
from r3_rllib.envs.registry import load_object
from r3_rllib.envs.rows import Messages, PromptSpec, Row, format_prompt, split_rows, user_text
from r3_rllib.rewards.bounded import DEFAULT_REWARD_TIMEOUT_S, bounded_call

logger = logging.getLogger(__name__)

REWARD_STYLES = ("sample", "trl")
ON_REWARD_ERROR = ("zero", "raise")
#: Grade reasons of a failed reward call.
FAILURE_REASONS = ("reward_error", "timeout")
#: Keys of a reward dict that are not parts.
RESERVED_KEYS = ("correct", "reason")
#: Columns not passed to the reward function again (they are its positional arguments), as in TRL.
POSITIONAL_COLUMNS = ("prompt", "completion")
#: What the reward function's own code may raise and still cost only its sample. SystemExit too: a ``sys.exit()``
#: in a reward function must not end the EnvRunner process. KeyboardInterrupt is left out: a Ctrl-C (delivered to
#: the main thread, where an untimed reward call runs) must still stop the run.
USER_CODE_ERRORS: tuple[type[BaseException], ...] = (Exception, SystemExit)


class RewardFailure(Exception):
    """A reward call that raised, returned something unusable or timed out: ``reason`` and ``detail``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class Grade:
    """A graded completion: the reward, its parts, whether it counts as correct, the grade reason and detail."""

    reward: float
    parts: dict[str, float]
    correct: bool
    reason: str
    detail: str = ""


def resolve_reward(reward: Any) -> Callable[..., Any]:
    """The reward function: ``reward`` itself when callable, the object a ``"module:function"`` string names;
    a ValueError naming env_config key ``reward`` otherwise."""
    if isinstance(reward, str):
        reward = load_object(reward, what="reward")
    if not callable(reward):
        raise ValueError(
            f"env_config 'reward' must be a function or a 'module:function' string, got {type(reward).__name__}"
        )
    return reward


def reward_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def score_value(value: Any, correct_threshold: float) -> tuple[float, dict[str, float], bool, str]:
    """``(reward, parts, correct, reason)`` of what a reward function returned (see the module); a RewardFailure
    (reason ``reward_error``) for anything else, or a reward that is not finite."""
    if not isinstance(value, Mapping) and getattr(value, "shape", None) == () and hasattr(value, "item"):
        value = value.item()  # a numpy scalar or a 0-d tensor
    if isinstance(value, Mapping):
        parts, extra = _parts(value)
        total = parts.pop("reward") if "reward" in parts else sum(parts.values())
        parts = parts or {"reward": total}
    elif isinstance(value, numbers.Real):
        total, parts, extra = float(value), {"reward": float(value)}, {}
    else:
        raise RewardFailure(
            "reward_error", f"returned {type(value).__name__}, not a number or a dict of numbers"
        )
    if not math.isfinite(total):
        raise RewardFailure("reward_error", f"returned a reward of {total}")
    correct = _correct_flag(extra["correct"]) if "correct" in extra else total >= correct_threshold
    reason = extra.get("reason") or ("correct" if correct else "wrong")
    return float(total), parts, correct, reason


def _correct_flag(item: Any) -> bool:
    """A reward dict's ``"correct"`` entry as a bool: a bool or a number 0 or 1 (numpy scalars and 0-d arrays or
    tensors included); a RewardFailure naming the type otherwise. Not ``bool(item)``: ``bool("False")`` is True,
    which would count a wrong sample as correct, and ``bool`` of a longer array raises."""
    if getattr(item, "shape", None) == () and hasattr(item, "item"):
        item = item.item()  # np.bool_ (not a numbers.Real), a numpy number, a 0-d array or tensor
    if isinstance(item, bool):
        return item
    if isinstance(item, numbers.Real) and item in (0, 1):
        return bool(item)
    raise RewardFailure(
        "reward_error",
        f"'correct' must be a bool (or a number 0 or 1), got {type(item).__name__} {item!r}"[:500],
    )


def _parts(value: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    parts: dict[str, float] = {}
    extra: dict[str, Any] = {}
    for key, item in value.items():
        if key in RESERVED_KEYS:
            if key == "reason" and not isinstance(item, str):
                raise RewardFailure("reward_error", f"'reason' must be a string, got {type(item).__name__}")
            extra[key] = item
        elif isinstance(item, numbers.Real) and math.isfinite(float(item)):
            parts[str(key)] = float(item)
        else:
            raise RewardFailure("reward_error", f"part {key!r} is {item!r}, not a finite number")
    if not parts:
        raise RewardFailure("reward_error", "returned a dict without a number (a 'reward' or parts)")
    return parts, extra


def _check_options(
    reward_style: str, on_reward_error: str, timeout_s: float | None, threshold: float
) -> None:
    if reward_style not in REWARD_STYLES:
        raise ValueError(
            f"env_config 'reward_style' must be one of {list(REWARD_STYLES)}, got {reward_style!r}"
        )
    if on_reward_error not in ON_REWARD_ERROR:
        raise ValueError(
            f"env_config 'on_reward_error' must be one of {list(ON_REWARD_ERROR)}, got {on_reward_error!r}"
        )
    # inf would reach Thread.join, which raises OverflowError on every call: every sample a reward_error.
    if timeout_s is not None and not (
        isinstance(timeout_s, numbers.Real)
        and not isinstance(timeout_s, bool)
        and math.isfinite(timeout_s)
        and timeout_s > 0
    ):
        raise ValueError(
            f"env_config 'reward_timeout_s' must be > 0 or None (no limit), a finite number, got {timeout_s!r}"
        )
    # NaN compares False with every reward and inf exceeds them all: every sample would be graded wrong, silently.
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not math.isfinite(threshold):
        raise ValueError(f"env_config 'correct_threshold' must be a finite number, got {threshold!r}")


def _check_prompt_options(system_prompt: Any, model_max_positions: Any, max_new_tokens: Any) -> None:
    """Refuse, naming it, a system prompt that is not a string and context options that are not integers (a string
    failed with a bare TypeError in the context check, or passed silently when no tokenizer counts tokens)."""
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise ValueError(
            f"env_config 'system_prompt' must be a string or None, got {type(system_prompt).__name__} "
            f"{system_prompt!r}"
        )
    check_count("model_max_positions", model_max_positions, minimum=1)
    check_count("max_new_tokens", max_new_tokens, minimum=0, optional=False)


class RewardFnEnv(PooledTextEnv):
    """Rows of a dataset scored by a reward function (see the module).

    Config:
        data: the rows (:mod:`r3_rllib.envs.rows`): a ``.json``/``.jsonl``/``.parquet`` path, a hub dataset name, a
            list of dicts, a ``datasets.Dataset``, or ``{"train": ..., "test": ...}`` of them.
        reward: the reward function, or a ``"module:function"`` string naming it.
        prompt: a column (default ``"prompt"``), a ``str.format`` template over the columns (``"{question}"``), or
            ``prompt(row) -> str | messages``.
        split: ``"train"`` or ``"test"`` (the held-out rows; what the held-out env gets from ``eval_env_config``).
        test_size: held-out rows carved from ``data``: a count, a fraction (default 0.1), or 0 for none.
        heldout: held-out rows of their own (a source as ``data``; a hub name is read with split ``test``).
        split_seed: the draw of the carved held-out rows (not the run's seed: every runner carves the same rows).
        hub_config: a hub dataset's configuration (``load_dataset(name, hub_config)``), e.g. ``"main"``.
        id_key: the column holding row ids (default ``"id"``; rows without one get ``"<file stem>:<row>"``).
        system_prompt: an optional system turn.
        apply_chat_template: ``"auto"`` (default), ``"required"`` or ``"none"`` (:mod:`r3_rllib.envs.chat`).
        tokenizer: a tokenizer object or folder (the EnvRunner hands over the policy's): the chat template, the eos
            token removed from completions, and the context check.
        eos_text: text(s) removed from a completion's end (default: the tokenizer's eos token).
        reward_style: ``"sample"`` (default: ``reward(prompt, completion, **row)``) or ``"trl"`` (TRL's batched
            signature, called with lists of one).
        correct_threshold: a reward at least this counts as correct (default 1.0).
        reward_timeout_s: seconds a reward call may take (default 30; None: no limit).
        on_reward_error: ``"zero"`` (default: reward 0, counted) or ``"raise"``.
        seed, shuffle, shard: the per-epoch order and this env's shard of it, as in the other envs.
        model_max_positions, max_new_tokens: the model's context and the response budget (the EnvRunner fills them
            in); a prompt too long for them raises ``DataError`` naming its row.
    """

    def __init__(
        self,
        *,
        data: Any,
        reward: Any,
        prompt: PromptSpec = "prompt",
        split: Literal["train", "test"] = "train",
        test_size: int | float | None = None,
        heldout: Any = None,
        split_seed: int = 0,
        hub_config: str | None = None,
        id_key: str = "id",
        system_prompt: str | None = None,
        apply_chat_template: bool | str = "auto",
        tokenizer: Any = None,
        eos_text: str | list[str] | None = None,
        reward_style: Literal["sample", "trl"] = "sample",
        correct_threshold: float = 1.0,
        reward_timeout_s: float | None = DEFAULT_REWARD_TIMEOUT_S,
        on_reward_error: Literal["zero", "raise"] = "zero",
        seed: int = 0,
        shuffle: bool = True,
        shard: Shard | dict[str, int] | None = None,
        model_max_positions: int | None = None,
        max_new_tokens: int = 0,
    ) -> None:
        super().__init__()
        _check_options(reward_style, on_reward_error, reward_timeout_s, correct_threshold)
        _check_prompt_options(system_prompt, model_max_positions, max_new_tokens)
        self.reward_fn = resolve_reward(reward)
        self.reward_name = reward_name(self.reward_fn)
        self.reward_style, self.on_reward_error = reward_style, on_reward_error
        self.correct_threshold = float(correct_threshold)
        self.reward_timeout_s = None if reward_timeout_s is None else float(reward_timeout_s)
        self.tokenizer = load_tokenizer(tokenizer)
        self.use_chat_template = use_chat_template(self.tokenizer, apply_chat_template)
        self.system_prompt = system_prompt
        self.eos_texts = _eos_texts(eos_text, self.tokenizer)
        self.split = split
        self.rows: list[Row] = split_rows(
            data,
            split=split,
            test_size=test_size,
            heldout=heldout,
            split_seed=split_seed,
            hub_config=hub_config,
            id_key=id_key,
        )
        self.prompts: list[str | Messages] = [format_prompt(prompt, row) for row in self.rows]
        self._index = {row.id: i for i, row in enumerate(self.rows)}
        self._order = QueryOrder(len(self.rows), seed=seed, shuffle=shuffle, shard=shard)
        self._current: int | None = None
        #: Failed reward calls by grade reason (``reward_error``, ``timeout``).
        self.reward_failures: Counter[str] = Counter()
        self.data_report = {"loaded": len(self.rows), "split": split}
        check_prompts_fit(
            ((row.id, self.render_prompt(p)) for row, p in zip(self.rows, self.prompts, strict=True)),
            self.tokenizer,
            model_max_positions,
            max_new_tokens,
            env_name="reward_fn",
        )

    # -- prompts ---------------------------------------------------------------------------------------------
    def render_prompt(self, prompt: str | Messages, user_content: str | None = None) -> str:
        """The text the policy sees: the chat template with the generation prompt, or plain text (the system
        prompt and each message's content, a blank line apart). ``user_content`` replaces the user turn."""
        messages = (
            [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        )
        if user_content is not None:
            users = [m for m in messages if m["role"] == "user"] or messages
            users[-1]["content"] = user_content
        if self.system_prompt is not None and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        if self.use_chat_template:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "\n\n".join(m["content"] for m in messages if m["content"])

    # -- TextEnv ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.rows)

    @property
    def query_ids(self) -> list[str]:
        return [row.id for row in self.rows]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """The next row of the order (``seed`` restarts the order with it); options ``query_id`` (serve that row
        again) and ``user_content`` (render that text as the user turn, scored against the row), as for every env."""
        super().reset(seed=seed)
        if seed is not None:
            self._order.restart(seed)
        query_id, user_content = parse_reset_options(options)
        index = self._order.next() if query_id is None else self._lookup(query_id)
        self._current = index
        prompt = self.prompts[index]
        info = {"query_id": self.rows[index].id, "query_text": user_text(prompt)}
        return self.render_prompt(prompt, user_content), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._current is None:
            raise RuntimeError("call reset() before step(); an episode is one response")
        index, self._current = self._current, None
        grade = self.grade(index, action)
        info = {
            "query_id": self.rows[index].id,
            "correct": grade.correct,
            "reward_components": grade.parts,
            "grade_reason": grade.reason,
        }
        if grade.detail:
            info["grade_detail"] = grade.detail
        return "", grade.reward, True, False, info

    # -- scoring ---------------------------------------------------------------------------------------------
    def grade(self, index: int, response: str) -> Grade:
        """Score ``response`` to row ``index`` with the reward function; a failed call grades 0 (see the module)."""
        try:
            value = self._call_reward(self.prompts[index], self.completion(response), self.rows[index].values)
            reward, parts, correct, reason = self._score(value)
        except RewardFailure as failure:
            self._note_failure(failure, self.rows[index].id)
            return Grade(0.0, {"reward": 0.0}, False, failure.reason, failure.detail)
        return Grade(reward, parts, correct, reason)

    def _score(self, value: Any) -> tuple[float, dict[str, float], bool, str]:
        """:func:`score_value` of the reward function's result (its one item under ``reward_style="trl"``). The
        result is the user's object: its ``len``, ``item()``, ``==`` or ``float`` may raise where no check foresaw
        it, and that is a failed sample (``reward_error``), not a failed run."""
        try:
            if self.reward_style == "trl":
                value = _trl_value(value)
            return score_value(value, self.correct_threshold)
        except RewardFailure:
            raise
        except USER_CODE_ERRORS as e:
            detail = f"returned an unusable {type(value).__name__}: {type(e).__name__}: {e}"
            raise RewardFailure("reward_error", detail[:500]) from e

    def completion(self, response: str) -> str:
        """The response as the reward function sees it: its trailing eos text(s) removed."""
        stripped = True
        while stripped:
            stripped = False
            for eos in self.eos_texts:
                if eos and response.endswith(eos):
                    response, stripped = response[: -len(eos)], True
        return response

    def _call_reward(self, prompt: str | Messages, completion: str, row: Mapping[str, Any]) -> Any:
        fn, columns = self.reward_fn, {k: v for k, v in row.items() if k not in POSITIONAL_COLUMNS}
        if self.reward_style == "trl":
            answer: Any = (
                completion if isinstance(prompt, str) else [{"role": "assistant", "content": completion}]
            )

            def call() -> Any:
                return fn(prompts=[prompt], completions=[answer], **{k: [v] for k, v in columns.items()})
        else:

            def call() -> Any:
                return fn(prompt, completion, **columns)

        call.__qualname__ = self.reward_name
        try:
            if self.reward_timeout_s is None:
                value = call()
            else:
                bounded = bounded_call(call, timeout_s=self.reward_timeout_s)
                if not bounded.ok:
                    raise RewardFailure("timeout", f"did not return within {self.reward_timeout_s:g} s")
                value = bounded.value
        except RewardFailure:
            raise
        except USER_CODE_ERRORS as e:
            # the reward function's own error (a sys.exit() too): this sample scores 0, the run goes on
            raise RewardFailure("reward_error", f"raised {type(e).__name__}: {e}"[:500]) from e
        return value

    def _note_failure(self, failure: RewardFailure, query_id: str) -> None:
        self.reward_failures[failure.reason] += 1
        count = self.reward_failures[failure.reason]
        message = f"reward {self.reward_name} on query {query_id!r}: {failure.reason}: {failure.detail}"
        if self.on_reward_error == "raise":
            raise RuntimeError(f"{message} (on_reward_error='raise')") from failure.__cause__
        if str(count).rstrip("0") == "1":  # the 1st, 10th, 100th, ... failure
            logger.warning(
                "%s; graded 0 (%d such failure(s) so far in this env; on_reward_error='raise' stops at the first)",
                message,
                count,
            )

    def _lookup(self, query_id: str) -> int:
        try:
            return self._index[query_id]
        except KeyError:
            raise ValueError(
                f"unknown query_id {query_id!r}: not among this environment's {len(self)} rows"
            ) from None


def _trl_value(value: Any) -> Any:
    """The one value of a TRL-style reward function's list (or tuple, 1-d array or tensor). A set has a length but
    no order or indexing, and a 0-d array has ``__len__`` but no length: both are refused here, by type."""
    if (
        isinstance(value, str | bytes | Mapping | AbstractSet)
        or getattr(value, "shape", None) == ()
        or not (hasattr(value, "__len__") and hasattr(value, "__getitem__"))
        or len(value) != 1
    ):
        raise RewardFailure(
            "reward_error", f"reward_style='trl': expected a list of one reward, got {value!r}"[:500]
        )
    item = value[0]
    if item is None:
        raise RewardFailure("reward_error", "reward_style='trl': returned None (TRL's 'not applicable')")
    return item


def _eos_texts(eos_text: str | list[str] | None, tokenizer: Any) -> tuple[str, ...]:
    if eos_text is not None:
        return (eos_text,) if isinstance(eos_text, str) else tuple(eos_text)
    eos = getattr(tokenizer, "eos_token", None) if tokenizer is not None else None
    return (eos,) if eos else DEFAULT_EOS_TEXTS

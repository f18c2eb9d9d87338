"""What every rollout kind shares at rollout time: the runner's env, engine, tokenizer, settings and sampling
parameters, R^3's reflection prompts, scoring a response with ``env.step``, and refusing a non-finite reward.

The runner builds one :class:`RolloutContext` per call and hands it to its kind; what depends on the process (the
replay actor, whose failures the runner handles, and the runner's own check of ``step()``'s info) comes in as
callables.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from r3_rllib.core.reflection import ReflectionSettings, past_score, select_reflection_queries
from r3_rllib.engines.base import GenerationEngine, SamplingParams
from r3_rllib.envs.base import TextEnv
from r3_rllib.envs.context import drop_long_prompts
from r3_rllib.types.samples import Group, Sample

#: ``(query_id, past wrong answer or None)`` for each hard query of a rollout (see :func:`hard_wrong_answers`).
PastWrongAnswers = Callable[[list[str], ReflectionSettings], list[tuple[str, Sample | None]]]


class NonFiniteRewardError(ValueError):
    """An env graded a response with a NaN or infinite reward (it would turn every advantage of the batch into
    NaN); names the query and the env."""

    def __init__(self, query_id: str, env: str, reward: float) -> None:
        self.query_id, self.env, self.reward = query_id, env, float(reward)
        super().__init__(f"{env} gave query {query_id!r} a non-finite reward ({reward})")

    def __reduce__(self):
        return (type(self), (self.query_id, self.env, self.reward))


def check_finite_reward(query_id: str, env: str, reward: float) -> None:
    """Raise :class:`NonFiniteRewardError` when ``reward``, the one ``env`` gave ``query_id``, is NaN or infinite."""
    if not math.isfinite(float(reward)):
        raise NonFiniteRewardError(query_id, env, reward)


def check_finite_rewards(groups: Iterable[Group], env: str) -> None:
    """:func:`check_finite_reward` for every sample of ``groups`` (multi-step and tool rollouts)."""
    for group in groups:
        for sample in group.samples:
            check_finite_reward(sample.query_id, env, sample.reward)


class Score(NamedTuple):
    """The env's grade of one response: reward, correctness, grade reason and reward parts (numbers only)."""

    reward: float
    correct: bool
    reason: str | None
    parts: dict[str, float] | None


def hard_wrong_answers(
    replay: Any, query_ids: list[str], settings: ReflectionSettings
) -> list[tuple[str, Any]]:
    """``(query_id, past wrong answer or None)`` for the hard queries among ``query_ids``: core/reflection.py
    chooses them from the replay actor's statistics (``replay``: a ReplayBufferClient), which then gives one past
    wrong answer of each."""
    stats = replay.query_stats(query_ids)
    scores = {
        q: past_score(stats[q].n_seen, stats[q].n_correct, stats[q].mean_reward, settings.hardness)
        if q in stats
        else None
        for q in query_ids
    }
    hard = select_reflection_queries(scores, settings.tau, settings.max_per_batch)
    wrong = replay.sample_wrong_answers(hard, settings.policy_version) if hard else []
    return list(zip(hard, wrong, strict=True))


def _no_check(env: str, info: Mapping[str, Any]) -> None:
    """The default check of ``step()``'s info: none."""


@dataclass
class RolloutContext:
    """The runner's side of one rollout or evaluation call (see the module docstring).

    ``sampling_params()`` gives the training sampler's next parameters; ``past_wrong_answers`` (None: no replay
    actor, no reflection prompts) the hard queries' past wrong answers; ``check_info(env name, info)`` may refuse
    the info of a ``step``; ``model_context`` is the bound a generated reflection prompt is held to
    (``envs.context.drop_long_prompts``). ``query_id`` is the query being graded (a runner's error names it) and
    ``reflection_dropped`` the reflection prompts left out of this call for being too long. ``gateway`` is the
    runner's rollout gateway (:mod:`r3_rllib.gateway`, started) for an agent env, None for other envs."""

    env: TextEnv
    engine: GenerationEngine
    tokenizer: Any
    config: Any
    sampling_params: Callable[[], SamplingParams]
    past_wrong_answers: PastWrongAnswers | None = None
    check_info: Callable[[str, Mapping[str, Any]], None] = _no_check
    model_context: Mapping[str, Any] = field(default_factory=dict)
    query_id: str | None = None
    reflection_dropped: int = 0
    gateway: Any = None

    @property
    def env_name(self) -> str:
        return type(self.env).__name__

    def generation_done(self) -> None:
        """After a rollout's generation: let the learner use the engine's GPU memory until the next rollout
        (``sleep_between_rollouts``)."""
        if self.config.sleep_between_rollouts:
            self.engine.sleep()

    def score(self, query_id: str, user_content: str | None, text: str) -> Score:
        """The grade of response ``text`` to the query (or its reflection prompt ``user_content``), from the env's
        ``step``; ``check_info`` sees the step's info first, then a non-finite reward is refused."""
        options, self.query_id = {"query_id": query_id}, query_id
        if user_content is not None:
            options["user_content"] = user_content
        self.env.reset(options=options)
        _, reward, _, _, info = self.env.step(text)
        self.check_info(self.env_name, info)
        check_finite_reward(query_id, self.env_name, reward)
        parts = info.get("reward_components")
        if isinstance(parts, dict):  # numbers only (the records' column is a map of floats)
            parts = {str(k): float(v) for k, v in parts.items() if isinstance(v, numbers.Real)}
        else:
            parts = None
        return Score(float(reward), bool(info.get("correct", reward > 0)), info.get("grade_reason"), parts)

    def reflection_prompts(
        self, query_ids: Sequence[str], query_texts: Mapping[str, str], settings: ReflectionSettings | None
    ) -> list[tuple[str, str, str]]:
        """``(query_id, user_content, prompt)``: prompts `query + past wrong answer + guidance` for this rollout's
        hard queries (none without ``settings`` or a replay actor); the env renders each. Prompts past the model's
        context are left out and counted in ``reflection_dropped``."""
        if not settings or self.past_wrong_answers is None:
            return []
        out = []
        for qid, sample in self.past_wrong_answers(list(query_ids), settings):
            if sample is None:
                continue
            content = settings.prompt(query_texts[qid], sample.response_text)
            obs, _ = self.env.reset(options={"query_id": qid, "user_content": content})
            out.append((qid, content, obs))
        out, self.reflection_dropped = drop_long_prompts(out, self.tokenizer, **self.model_context)
        return out

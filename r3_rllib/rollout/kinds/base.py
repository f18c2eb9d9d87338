"""The rollout-kind interface: what every kind of env (single-step, multi-step, multi-turn tool use) supplies to the
env runner, and what the kinds share.

A :class:`RolloutKind` turns an env's queries into training groups (:meth:`~RolloutKind.sample`), scores held-out
queries (:meth:`~RolloutKind.evaluate`), converts its own records into groups (:meth:`~RolloutKind.to_groups`), sums
its rollout statistics (:meth:`~RolloutKind.totals`, reported by :meth:`~RolloutKind.means`) and refuses settings
that do not fit it (:meth:`~RolloutKind.check_config`). The runner chooses the kind once, from its env
(``kinds.kind_for_env``), and calls only this interface. What the kinds share at rollout time (the engine, the
sampling parameters, reflection prompts, scoring with ``env.step``) is the :class:`~context.RolloutContext`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NamedTuple, TypeVar

import numpy as np

from r3_rllib.core.advantages import group_is_degenerate, is_step_level, needs_greedy_baseline
from r3_rllib.types.samples import Group

if TYPE_CHECKING:
    from r3_rllib.core.reflection import ReflectionSettings
    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.envs.base import TextEnv
    from r3_rllib.rollout.kinds.context import RolloutContext

#: A kind's own record of one rollout (a prompt's scored responses, a step, a trajectory).
RecordT = TypeVar("RecordT")


class KindRollout(NamedTuple):
    """One rollout of a kind: its groups, ``(generate_s, grade_s)``, the tokens generated and the totals."""

    groups: list[Group]
    timings: tuple[float, float]
    generated_tokens: int
    totals: dict[str, float]


class RolloutKind(ABC, Generic[RecordT]):
    """One kind of rollout (see the module docstring); subclasses are stateless."""

    #: The kind's name, as logs and errors give it.
    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def matches(cls, env: Any) -> bool:
        """Whether ``env`` is rolled out as this kind (the kinds are mutually exclusive)."""

    @abstractmethod
    def sample(
        self, ctx: RolloutContext, num_queries: int, reflection: ReflectionSettings | None
    ) -> KindRollout:
        """Groups of the next ``num_queries`` queries of ``ctx.env`` (plus reflection groups where the kind has
        them and ``reflection`` is given)."""

    @abstractmethod
    def evaluate(
        self,
        ctx: RolloutContext,
        env: TextEnv,
        first: Sequence[tuple[str, dict]],
        per_query: int,
        params: SamplingParams,
    ) -> dict[str, float]:
        """Held-out counts (``queries``, ``samples``, ``correct``; the kind may add sums) on the queries of
        ``first`` ((observation, info) of ``env.reset()``), ``per_query`` responses or trajectories each."""

    @abstractmethod
    def to_groups(
        self, records: Sequence[RecordT], policy_version: int, *, is_reflection: bool = False
    ) -> list[Group]:
        """The training groups of this kind's records, sampled by the engine at ``policy_version``."""

    def record_totals(self, records: Sequence[RecordT]) -> dict[str, float]:
        """What the kind's records add to :func:`rollout_totals`, as sums. Default: nothing."""
        return {}

    def totals(self, groups: Sequence[Group], records: Sequence[RecordT]) -> dict[str, float]:
        """One rollout's statistics as sums: :func:`rollout_totals` of its groups and the kind's own."""
        return {**rollout_totals(groups), **self.record_totals(records)}

    @classmethod
    def means(cls, totals: Mapping[str, float]) -> dict[str, float]:
        """The reported metrics of the kind's own totals (merged over runners and rounds). Default: none."""
        return {}

    def check_config(self, config: Any, defaults: Mapping[str, Any]) -> None:
        """Refuse settings that do not fit this kind (``defaults``: every setting's default value). Default, a kind
        that scores single responses without tools: no step-level estimator, no tool settings."""
        refuse_step_level_estimator(config)
        refuse_tool_settings(config, defaults)
        refuse_episode_cap(config, "single-step")
        refuse_agent_settings(config, defaults, "single-step")
        refuse_step_discount(config, defaults, "single-step")
        refuse_action_penalty(config, defaults, "single-step")


def env_label(config: Any) -> str:
    """The configured env as errors name it."""
    return config.env if isinstance(config.env, str) else getattr(config.env, "__name__", str(config.env))


def refuse_step_level_estimator(config: Any) -> None:
    """A step-level estimator (one reading step identities, as 'hgpo') on an env that is not multi-step."""
    name = config.advantage_estimator
    if is_step_level(name):
        raise ValueError(
            f"advantage_estimator {name!r} needs a multi-step env (one with episode(query_id), e.g. "
            f"'gridworld'); env {env_label(config)!r} is single-step"
        )


def refuse_greedy_baseline(config: Any, what: str) -> None:
    """An estimator whose baseline is a greedy response's reward (ReMax): only the single-step kind decodes one per
    prompt; an env of another kind (``what``, as the message describes it) would leave every group without one."""
    name = getattr(config, "advantage_estimator", None)
    if needs_greedy_baseline(name):
        raise ValueError(
            f"advantage_estimator {name!r} takes the reward of a greedy response to each prompt as its baseline, "
            f"which only single-step envs decode; env {env_label(config)!r} is {what}"
        )


def refuse_tool_settings(config: Any, defaults: Mapping[str, Any]) -> None:
    """``max_tool_turns``/``max_trajectory_tokens`` shape multi-turn tool trajectories only: set for an env without
    ``tool_episode`` they would be silently ignored, so refuse them there."""
    _refuse_unread(
        config,
        defaults,
        ("max_tool_turns", "max_trajectory_tokens"),
        "multi-turn tool envs (ones with tool_episode(query_id), e.g. 'python_tool')",
        "not one",
    )


def refuse_episode_cap(config: Any, what: str) -> None:
    """``max_episode_steps`` caps the episodes of multi-step envs only: set for an env of another kind (``what``, as
    the message describes the env) it would be silently ignored, so refuse it there. Checked here, when the runner
    has built the env, not by the config's own checks: the kind is a property of the env object (``kind_for_env``),
    and a factory or an adapter may build either kind."""
    steps = getattr(config, "max_episode_steps", None)
    if steps is not None:
        raise ValueError(
            f"max_episode_steps={steps!r} caps the episodes of multi-step envs (ones with episode(query_id), e.g. "
            f"'gridworld'); env {env_label(config)!r} is {what}, so it would be ignored: leave max_episode_steps "
            "at None"
        )


def refuse_agent_settings(config: Any, defaults: Mapping[str, Any], what: str) -> None:
    """The agent programs' settings (their episode timeout, the rollout gateway's address and batch wait) on an env
    that runs no agent program (``what``, as the message describes the env): nothing reads them there."""
    names = ("agent_episode_timeout_s", "gateway_host", "gateway_max_batch_wait_s")
    _refuse_unread(config, defaults, names, "agent envs (ones with run_agent, e.g. 'agent')", what)


def refuse_step_discount(config: Any, defaults: Mapping[str, Any], what: str) -> None:
    """``step_gamma`` discounts the step rewards of episodes into returns: nothing reads it for an env whose samples
    are single responses or whole tool trajectories (``what``)."""
    _refuse_unread(
        config, defaults, ("step_gamma",), "multi-step and agent envs (step rewards of episodes)", what
    )


def refuse_action_penalty(config: Any, defaults: Mapping[str, Any], what: str) -> None:
    """``invalid_action_penalty`` lowers the rewards of the steps a multi-step env reports invalid: nothing reads it
    for an env of another kind (``what``)."""
    _refuse_unread(
        config,
        defaults,
        ("invalid_action_penalty",),
        "multi-step envs (steps whose info reports an invalid action)",
        what,
    )


def _refuse_unread(
    config: Any, defaults: Mapping[str, Any], names: tuple[str, ...], readers: str, what: str
) -> None:
    """Refuse the settings among ``names`` changed from their defaults: only ``readers`` read them, and the env is
    ``what`` (as the message describes it)."""
    changed = [
        f"{name}={getattr(config, name)!r}" for name in names if getattr(config, name) != defaults[name]
    ]
    if changed:
        one = len(changed) == 1
        verb, subject, obj = (
            ("applies", "it", "it at its default") if one else ("apply", "they", "them at their defaults")
        )
        raise ValueError(
            f"{', '.join(changed)} only {verb} to {readers}; env {env_label(config)!r} is {what}, so {subject} would "
            f"be ignored: leave {obj}"
        )


def oldest_version(token_versions: np.ndarray | None, call_version: int) -> int:
    """The version a sample is counted under: its oldest token's (partial rollouts), else the call's."""
    return (
        int(token_versions.min()) if token_versions is not None and len(token_versions) else int(call_version)
    )


def rollout_totals(groups: Sequence[Group]) -> dict[str, float]:
    """What one rollout's groups add to the iteration's rollout metrics, as sums (and maxima) that combine across
    EnvRunners and dynamic-sampling rounds (``algorithms/r3/groups.py``'s ``merge_rollout_totals`` and
    ``rollout_means``). Fresh groups make the sample statistics; reflection groups are counted apart. Rewards are
    the env's (before any ranking reward)."""
    fresh = [s for g in groups if not g.is_reflection for s in g.samples]
    reflected = [s for g in groups if g.is_reflection for s in g.samples]
    with_entropy = [float(np.mean(s.entropies)) for s in fresh if len(s.entropies)]
    return {
        "samples": float(len(fresh)),
        "correct": float(sum(s.correct for s in fresh)),
        "reward": float(sum(s.env_reward for s in fresh)),
        "response_tokens": float(sum(len(s.response_ids) for s in fresh)),
        "response_len_max": float(max((len(s.response_ids) for s in fresh), default=0)),
        "truncated": float(sum(s.truncated for s in fresh)),
        "entropy": float(sum(with_entropy)),
        "entropy_samples": float(len(with_entropy)),
        "groups": float(sum(not g.is_reflection for g in groups)),
        # On the env's rewards, before replay or ranking could repair the group.
        "degenerate_groups": float(
            sum(group_is_degenerate([s.env_reward for s in g.samples]) for g in groups if not g.is_reflection)
        ),
        "reflection_groups": float(sum(g.is_reflection for g in groups)),
        "reflection_samples": float(len(reflected)),
        "reflection_correct": float(sum(s.correct for s in reflected)),
    }


def ratio(totals: Mapping[str, float], num: str, den: str) -> float:
    """``totals[num] / totals[den]``, 0 where the denominator is missing or 0 (nothing was sampled)."""
    return totals.get(num, 0.0) / totals[den] if totals.get(den) else 0.0

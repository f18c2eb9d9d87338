"""The rollout kinds (agent programs, single-step, multi-step, multi-turn tool use), one module each, behind one
interface (:class:`~base.RolloutKind`); :func:`kind_for_env` chooses an env's kind."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from r3_rllib.rollout.kinds.agent import AgentKind
from r3_rllib.rollout.kinds.base import RolloutKind
from r3_rllib.rollout.kinds.multi_step import MultiStepKind
from r3_rllib.rollout.kinds.single_step import SingleStepKind
from r3_rllib.rollout.kinds.tool_use import ToolUseKind

#: Every rollout kind; an env is rolled out as the first one it matches (an agent env as an agent, whatever else it
#: defines).
KINDS: tuple[type[RolloutKind], ...] = (AgentKind, SingleStepKind, MultiStepKind, ToolUseKind)


def kind_for_env(env: Any) -> RolloutKind:
    """The rollout kind of ``env``: agent when it runs agent programs (``run_agent``), else tool use when it hands
    out tool episodes, multi-step when it hands out episodes (and no tool episodes), single-step otherwise."""
    for kind in KINDS:
        if kind.matches(env):
            return kind()
    raise TypeError(f"{type(env).__name__} matches no rollout kind")  # the kinds cover every env


def kind_means(totals: Mapping[str, float]) -> dict[str, float]:
    """Every kind's reported metrics of merged rollout totals (a kind's are empty when it sampled nothing)."""
    return {name: value for kind in KINDS for name, value in kind.means(totals).items()}

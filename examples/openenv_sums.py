"""An OpenEnv environment (``openenv-core``) of 2-digit sums, for ``examples/openenv_sums.yaml`` (env ``openenv``).

OpenEnv's server-side ``Environment`` runs in-process on each EnvRunner: ``reset(seed=k)`` draws the sum of task
``k`` (the same sum for the same seed), the observation's ``question`` (``"12+7="``) is the user turn, the model's
reply becomes ``SumAction(answer=reply)`` for ``step``, which ends the episode with reward 1.0 when the reply
starts with the sum, else 0.0.

    PYTHONPATH=examples r3 train examples/openenv_sums.yaml      # this module must be importable by the runners
"""

from __future__ import annotations

import random
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class SumAction(Action):
    """The model's reply."""

    answer: str


class SumObservation(Observation):
    """The question shown to the model (empty once the episode is over)."""

    question: str = ""


def sum_of_seed(seed: int) -> tuple[int, int]:
    """The two 2-digit operands of task ``seed``."""
    rng = random.Random(seed)
    return rng.randint(10, 99), rng.randint(10, 99)


class SumsEnvironment(Environment):
    """One question, one answer: reward 1.0 for the right sum at the start of the reply."""

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self._operands = (0, 0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> SumObservation:
        self._state = State(episode_id=episode_id)
        self._operands = sum_of_seed(int(seed or 0))
        a, b = self._operands
        return SumObservation(question=f"{a}+{b}=")

    def step(self, action: SumAction, timeout_s: float | None = None, **_: Any) -> SumObservation:
        self._state.step_count += 1
        digits = ""
        for ch in action.answer.strip():
            if not ch.isdigit():
                break
            digits += ch
        right = digits == str(sum(self._operands))
        return SumObservation(done=True, reward=1.0 if right else 0.0)

    @property
    def state(self) -> State:
        return self._state

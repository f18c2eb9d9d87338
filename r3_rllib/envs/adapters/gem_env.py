"""GEM environments (``gem-llm``: gymnasium-style, string in / string out) as an agent env (``env: gem``)::

    R3Config().environment("gem", env_config={
        "env_id": "game:GuessTheNumber-v0-easy",   # anything gem.make accepts (gem.register makes your own)
        # "entry_point": "my_envs:MyEnv",           # your own env: registered under env_id in every process
        "num_tasks": 64,                            # tasks = reset seeds 0 .. 63 (or "seeds": [...])
        "max_turns": 8,
    })

One rollout: a fresh ``gem.make(env_id, **make_kwargs)`` is reset with the task's seed; its observation is the
user turn; each model reply goes to ``env.step``, whose next observation is the next user turn, until the env
terminates or truncates or ``max_turns`` replies were made. The reward is the sum of the step rewards (each one
must be finite). Needs the ``gem`` extra (``pip install 'r3-rllib[gem]'``, see scripts/setup.sh for how it is
installed beside our reasoning-gym).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from r3_rllib.envs.adapters.common import (
    AgentTaskEnv,
    StepResult,
    chat_step_loop,
    finite_reward,
    require_extra,
)
from r3_rllib.envs.data import Shard


class GemEnv(AgentTaskEnv):
    """A GEM env's episodes as agent tasks.

    Config:
        env_id: the id ``gem.make`` takes. make_kwargs: its keyword arguments.
        entry_point: a ``"module:Class"`` to register as ``env_id`` when no env has that id (GEM's registry lives
            in each process: a run file names the user's env this way, and each EnvRunner registers it).
        num_tasks / seeds: the tasks are reset seeds (``seeds``, else ``range(num_tasks)``).
        max_turns: model replies per episode at most. system_prompt: an optional system message.
        sampling: extra keyword arguments of each chat call (``max_tokens``, ``temperature``, ...).
        seed, shuffle, shard: the pool's order (as every pooled env).
    """

    def __init__(
        self,
        *,
        env_id: str,
        entry_point: str | None = None,
        make_kwargs: Mapping[str, Any] | None = None,
        num_tasks: int = 64,
        seeds: Sequence[int] | None = None,
        max_turns: int = 8,
        system_prompt: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        seed: int = 0,
        shuffle: bool = True,
        shard: Shard | dict[str, int] | None = None,
    ) -> None:
        self._gem = require_extra("gem", "gem", "env 'gem'")
        if max_turns < 1:
            raise ValueError(f"gem: max_turns must be >= 1, got {max_turns}")
        self.env_id, self.make_kwargs = str(env_id), dict(make_kwargs or {})
        if entry_point is not None and self.env_id not in self._gem.envs.registration.ENV_REGISTRY:
            self._gem.register(self.env_id, entry_point=str(entry_point))
        self.max_turns, self.system_prompt = int(max_turns), system_prompt
        self.sampling = dict(sampling or {})
        probe = self._make()  # an unknown id fails here, naming it, not in the first rollout
        probe_close = getattr(probe, "close", None)
        if callable(probe_close):
            probe_close()
        task_seeds = list(seeds) if seeds is not None else list(range(int(num_tasks)))
        tasks = [{"id": f"gem-{int(s)}", "seed": int(s)} for s in task_seeds]
        super().__init__(tasks, id_prefix="gem", seed=seed, shuffle=shuffle, shard=shard)

    def _make(self) -> Any:
        try:
            return self._gem.make(self.env_id, **self.make_kwargs)
        except Exception as exc:
            raise ValueError(f"gem: cannot make env {self.env_id!r}: {type(exc).__name__}: {exc}") from exc

    def task_prompt(self, task: Mapping[str, Any]) -> str:
        return f"{self.env_id} (seed {task['seed']})"

    async def run_agent(self, client: Any, model: str, task: dict[str, Any]) -> dict[str, Any]:
        """One episode of a fresh env reset with the task's seed (see the module docstring)."""
        env = self._make()
        observation, _ = await asyncio.to_thread(env.reset, seed=int(task["seed"]))
        source = f"gem env {self.env_id!r}"

        async def step(text: str) -> StepResult:
            obs, reward, terminated, truncated, _ = await asyncio.to_thread(env.step, text)
            return str(obs), finite_reward(reward, source), bool(terminated or truncated)

        result = await chat_step_loop(
            client,
            model,
            str(observation),
            step,
            max_turns=self.max_turns,
            system_prompt=self.system_prompt,
            sampling=self.sampling,
        )
        result["correct"] = result["reward"] > 0
        return result

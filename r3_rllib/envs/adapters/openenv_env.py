"""OpenEnv environments (``openenv-core``) run in-process, as an agent env (``env: openenv``)::

    R3Config().environment("openenv", env_config={
        "environment": "my_envs:EchoEnvironment",    # an openenv Environment subclass (or a factory of one)
        "action": "my_envs:EchoAction",              # its Action class
        "action_field": "message",                   # the Action's field that receives the model's reply
        "observation_field": "echoed_message",       # the Observation's field shown to the model
        "num_tasks": 32,                             # tasks = reset seeds 0 .. 31 (or "tasks": [reset kwargs])
    })

The server-side ``Environment`` runs in this process, no HTTP server: one rollout builds a fresh one, calls
``reset_async(seed=..., **task_kwargs)``, shows the observation's text as the user turn, turns each model reply
into ``Action(**{action_field: reply})`` for ``step_async``, and loops until the observation says ``done`` or
after ``max_turns`` replies. The reward is the sum of the observations' rewards (None counts as 0; each must be
finite). Needs the ``openenv`` extra (``pip install 'r3-rllib[openenv]'``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from r3_rllib.core.objects import load_object
from r3_rllib.envs.adapters.common import (
    AgentTaskEnv,
    StepResult,
    chat_step_loop,
    finite_reward,
    require_extra,
)
from r3_rllib.envs.data import Shard

# The Observation fields every OpenEnv observation has; the text shown to the model is in the others.
_BASE_FIELDS = ("done", "reward", "metadata")


def _resolve(value: Any, what: str) -> Any:
    """A ``"module:attribute"`` string imported, anything else as given."""
    return load_object(value, what=what) if isinstance(value, str) else value


def observation_text(observation: Any, field: str | None) -> str:
    """The text of an OpenEnv observation: its ``field``; else its one field beyond done/reward/metadata when
    there is one, else those fields as JSON."""
    if field is not None:
        return str(getattr(observation, field))
    data = observation.model_dump(exclude=set(_BASE_FIELDS))
    if len(data) == 1:
        return str(next(iter(data.values())))
    return json.dumps(data, default=str)


class OpenEnvEnv(AgentTaskEnv):
    """An in-process OpenEnv ``Environment``'s episodes as agent tasks.

    Config:
        environment: the Environment subclass or factory (``"module:attr"`` or the object); environment_kwargs:
            its keyword arguments. action: the Action class; action_field: the field that gets the reply.
        observation_field: the observation's text field (default: see :func:`observation_text`).
        num_tasks / tasks: the tasks: reset keyword dicts (``tasks``), else seeds ``range(num_tasks)``.
        max_turns, system_prompt, sampling, seed, shuffle, shard: as for :class:`~r3_rllib.envs.adapters.gem_env.GemEnv`.
    """

    def __init__(
        self,
        *,
        environment: Any,
        action: Any,
        action_field: str = "message",
        observation_field: str | None = None,
        environment_kwargs: Mapping[str, Any] | None = None,
        num_tasks: int = 64,
        tasks: Sequence[Mapping[str, Any]] | None = None,
        max_turns: int = 8,
        system_prompt: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        seed: int = 0,
        shuffle: bool = True,
        shard: Shard | dict[str, int] | None = None,
    ) -> None:
        interfaces = require_extra("openenv.core.env_server.interfaces", "openenv", "env 'openenv'")
        types = require_extra("openenv.core.env_server.types", "openenv", "env 'openenv'")
        self._factory = _resolve(environment, "openenv environment")
        self._action_cls = _resolve(action, "openenv action")
        if not (isinstance(self._action_cls, type) and issubclass(self._action_cls, types.Action)):
            raise TypeError(f"openenv: action must be an openenv Action class, got {self._action_cls!r}")
        if action_field not in self._action_cls.model_fields:
            raise ValueError(
                f"openenv: {self._action_cls.__name__} has no field {action_field!r} (action_field); "
                f"fields: {sorted(self._action_cls.model_fields)}"
            )
        self._environment_cls = interfaces.Environment
        self.environment_kwargs = dict(environment_kwargs or {})
        self.action_field, self.observation_field = action_field, observation_field
        self.max_turns, self.system_prompt = int(max_turns), system_prompt
        self.sampling = dict(sampling or {})
        if self.max_turns < 1:
            raise ValueError(f"openenv: max_turns must be >= 1, got {max_turns}")
        self._make()  # a factory that fails, or builds something else, fails here, not in the first rollout
        pool = [dict(t) for t in tasks] if tasks is not None else [{"seed": i} for i in range(int(num_tasks))]
        super().__init__(pool, id_prefix="openenv", seed=seed, shuffle=shuffle, shard=shard)

    def _make(self) -> Any:
        env = self._factory(**self.environment_kwargs)
        if not isinstance(env, self._environment_cls):
            raise TypeError(
                f"openenv: {self._factory!r} built a {type(env).__name__}, not an openenv Environment"
            )
        return env

    def task_prompt(self, task: Mapping[str, Any]) -> str:
        """The text ``reset`` shows: the environment and the task's reset arguments, e.g. ``Sums reset(seed=3)``."""
        args = ", ".join(f"{k}={v!r}" for k, v in task.items() if k != "id")
        return f"{getattr(self._factory, '__name__', type(self._factory).__name__)} reset({args})"

    async def run_agent(self, client: Any, model: str, task: dict[str, Any]) -> dict[str, Any]:
        """One episode of a fresh environment reset with the task (see the module docstring)."""
        env = self._make()
        kwargs = {k: v for k, v in task.items() if k != "id"}
        observation = await env.reset_async(**kwargs)
        source = f"openenv environment {type(env).__name__}"

        async def step(text: str) -> StepResult:
            obs = await env.step_async(self._action_cls(**{self.action_field: text}))
            reward = 0.0 if obs.reward is None else finite_reward(obs.reward, source)
            return observation_text(obs, self.observation_field), reward, bool(obs.done)

        try:
            result = await chat_step_loop(
                client,
                model,
                observation_text(observation, self.observation_field),
                step,
                max_turns=self.max_turns,
                system_prompt=self.system_prompt,
                sampling=self.sampling,
            )
        finally:
            env.close()
        result["correct"] = result["reward"] > 0
        return result

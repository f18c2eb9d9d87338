"""What every adapter shares: the optional-extra import check, a pool of agent tasks served like any pooled env
(:class:`~r3_rllib.envs.agent_tasks.AgentTaskPool`, as ``env: agent``'s), the finite-reward check, and the chat loop
of step-wise envs (OpenEnv, GEM).

An adapter env is a :class:`~r3_rllib.envs.base.PooledTextEnv` whose queries are *agent tasks* (JSON-like dicts)
and an :class:`~r3_rllib.envs.base.AgentEnv`: the agent rollout kind calls ``run_agent(client, model, task)`` with
an ``openai.AsyncOpenAI`` client bound to one session of the EnvRunner's rollout gateway, so every model call of
the episode is recorded token for token there. ``reset`` serves the pool's next task (its prompt text and query
id) as other pooled envs do; ``step`` is refused: the episode is the agent program, not one response.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from r3_rllib.envs.agent_tasks import AgentTaskPool, finite_reward
from r3_rllib.envs.data import Shard

__all__ = ["AgentTaskEnv", "StepResult", "chat_step_loop", "finite_reward", "require_extra"]

#: ``(observation_text, reward, done)`` after one model turn of a step-wise env.
StepResult = tuple[str, float, bool]


def require_extra(module: str, extra: str, what: str) -> Any:
    """``module`` imported; an ``ImportError`` naming the extra to install when it is not installed."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.split(".")[0]
        if exc.name is not None and exc.name.split(".")[0] != top:
            raise  # the package is there; something it imports is not: its own error says what
        raise ImportError(
            f"{what} needs the {top!r} package, which is not installed: pip install 'r3-rllib[{extra}]'"
        ) from exc


class AgentTaskEnv(AgentTaskPool):
    """An adapter's pool of agent tasks (dicts), with query ids ``f"{id_prefix}-{index}"`` (or each task's own
    ``"id"`` entry when every task has a distinct one).

    Subclasses implement :meth:`run_agent` (the :class:`~r3_rllib.envs.base.AgentEnv` protocol) and may override
    :meth:`task_prompt` (the text ``reset`` shows: the task's ``"prompt"`` entry by default); it is read once, when
    the pool is built, so a subclass sets what it needs before calling ``super().__init__``.
    """

    def __init__(
        self,
        tasks: Sequence[Mapping[str, Any]],
        *,
        id_prefix: str,
        seed: int = 0,
        shuffle: bool = True,
        shard: Shard | dict[str, int] | None = None,
    ) -> None:
        tasks = [dict(task) for task in tasks]
        own_ids = [str(task.get("id", "")) for task in tasks]
        distinct = all(own_ids) and len(set(own_ids)) == len(own_ids)
        ids = own_ids if distinct else [f"{id_prefix}-{i}" for i in range(len(tasks))]
        texts = [self.task_prompt(task) for task in tasks]
        super().__init__(ids, tasks, texts, seed=seed, shuffle=shuffle, shard=shard)

    def task_prompt(self, task: Mapping[str, Any]) -> str:
        """The text ``reset`` returns for ``task``: its ``"prompt"`` entry, or the task as text."""
        prompt = task.get("prompt")
        return prompt if isinstance(prompt, str) else str(dict(task))


async def chat_step_loop(
    client: Any,
    model: str,
    first_observation: str,
    step: Callable[[str], Awaitable[StepResult]],
    *,
    max_turns: int,
    system_prompt: str | None = None,
    sampling: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Play a step-wise text env through chat calls: the observation is the user turn, the reply goes to ``step``;
    the conversation grows turn by turn (each prompt extends the last) until ``step`` says done or after
    ``max_turns`` model turns. Returns ``{"reward": sum of step rewards, "info": {turns, done}}``."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": first_observation})
    total, done, turns = 0.0, False, 0
    while turns < max_turns and not done:
        response = await client.chat.completions.create(
            model=model, messages=messages, **dict(sampling or {})
        )
        text = response.choices[0].message.content or ""
        turns += 1
        observation, reward, done = await step(text)
        total += reward
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": observation}]
    return {"reward": total, "info": {"turns": turns, "done": done}}

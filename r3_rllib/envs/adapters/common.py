"""What every adapter shares: the optional-extra import check, a pool of agent tasks served like any pooled env,
the finite-reward check, and the chat loop of step-wise envs (OpenEnv, GEM).

An adapter env is a :class:`~r3_rllib.envs.base.PooledTextEnv` whose queries are *agent tasks* (JSON-like dicts)
and an :class:`~r3_rllib.envs.base.AgentEnv`: the agent rollout kind calls ``run_agent(client, model, task)`` with
an ``openai.AsyncOpenAI`` client bound to one session of the EnvRunner's rollout gateway, so every model call of
the episode is recorded token for token there. ``reset`` serves the pool's next task (its prompt text and query
id) as other pooled envs do; ``step`` is refused: the episode is the agent program, not one response.
"""

from __future__ import annotations

import importlib
import math
import numbers
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from r3_rllib.envs.base import PooledTextEnv
from r3_rllib.envs.data import QueryOrder, Shard, parse_reset_options

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


def finite_reward(value: Any, source: str) -> float:
    """``value`` as a float (a bool counts as 0 or 1); a ``ValueError`` naming ``source`` when it is not a finite
    number."""
    if not isinstance(value, numbers.Real):
        raise ValueError(f"{source} returned a reward of type {type(value).__name__}, not a number")
    reward = float(value)
    if not math.isfinite(reward):
        raise ValueError(f"{source} returned a non-finite reward ({reward}); rewards must be finite numbers")
    return reward


class AgentTaskEnv(PooledTextEnv):
    """A pool of agent tasks (dicts) in :class:`~r3_rllib.envs.data.QueryOrder`'s per-epoch order, with query ids
    ``f"{id_prefix}-{index}"`` (or each task's own ``"id"`` entry when every task has a distinct one).

    Subclasses implement :meth:`run_agent` (the :class:`~r3_rllib.envs.base.AgentEnv` protocol) and may override
    :meth:`task_prompt` (the text ``reset`` shows: the task's ``"prompt"`` entry by default).
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
        super().__init__()
        self._tasks = [dict(task) for task in tasks]
        if not self._tasks:
            raise ValueError(f"{type(self).__name__} needs at least one task")
        own_ids = [str(task.get("id", "")) for task in self._tasks]
        if all(own_ids) and len(set(own_ids)) == len(own_ids):
            self._ids = own_ids
        else:
            self._ids = [f"{id_prefix}-{i}" for i in range(len(self._tasks))]
        self._index = {qid: i for i, qid in enumerate(self._ids)}
        self._order = QueryOrder(len(self._tasks), seed=seed, shuffle=shuffle, shard=shard)

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def query_ids(self) -> list[str]:
        return list(self._ids)

    def agent_task(self, query_id: str) -> dict[str, Any]:
        """A copy of the task of ``query_id`` (a ``KeyError`` naming the id when the pool has no such query)."""
        if query_id not in self._index:
            raise KeyError(f"{type(self).__name__}: unknown query id {query_id!r}")
        return dict(self._tasks[self._index[query_id]])

    def task_prompt(self, task: Mapping[str, Any]) -> str:
        """The text ``reset`` returns for ``task``: its ``"prompt"`` entry, or the task as text."""
        prompt = task.get("prompt")
        return prompt if isinstance(prompt, str) else str(dict(task))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Serve the order's next task (``seed`` restarts the order with it), or ``options["query_id"]``'s."""
        super().reset(seed=seed)
        if seed is not None:
            self._order.restart(seed)
        query_id, user_content = parse_reset_options(options)
        if user_content is not None:
            raise ValueError(f"{type(self).__name__} runs agent programs; 'user_content' is not supported")
        if query_id is None:
            query_id = self._ids[self._order.next()]
        prompt = self.task_prompt(self.agent_task(query_id))
        return prompt, {"query_id": query_id, "query_text": prompt}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        raise TypeError(
            f"{type(self).__name__} is an agent env: its episodes are agent programs run through the rollout "
            "gateway by the agent rollout kind (run_agent), not single responses passed to step()"
        )


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

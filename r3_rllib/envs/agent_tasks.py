"""A pool of agent tasks served like any pooled env: what ``env: agent`` (:mod:`r3_rllib.envs.agent`) and the
field's env adapters (:mod:`r3_rllib.envs.adapters`) share.

An agent env's queries are *tasks* (JSON-like dicts); an episode is an agent program talking to the policy through
the EnvRunner's rollout gateway (the agent rollout kind calls ``run_agent``), never a single response passed to
``step``. :class:`AgentTaskPool` holds the tasks with their query ids and texts, serves them in
:class:`~r3_rllib.envs.data.QueryOrder`'s per-epoch order (epoch and checkpointed position come with it) and
refuses ``step`` and ``user_content`` (reflection reaches a program through its task).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from r3_rllib.envs.base import PooledTextEnv
from r3_rllib.envs.data import QueryOrder, Shard, parse_reset_options


def finite_reward(value: Any, source: str) -> float:
    """``value`` as a float (a bool counts as 0 or 1, a numpy scalar as its number); a ``ValueError`` naming
    ``source`` when it is not a finite number."""
    if not isinstance(value, numbers.Real):
        raise ValueError(f"{source} returned a reward of type {type(value).__name__}, not a number")
    reward = float(value)
    if not math.isfinite(reward):
        raise ValueError(f"{source} returned a non-finite reward of {reward}; rewards must be finite numbers")
    return reward


class AgentTaskPool(PooledTextEnv):
    """Agent tasks with their query ids and texts (see the module). Subclasses implement ``run_agent`` (the
    :class:`~r3_rllib.envs.base.AgentEnv` protocol); ``reset`` info may carry more through :meth:`reset_info`."""

    def __init__(
        self,
        ids: Sequence[str],
        tasks: Sequence[Mapping[str, Any]],
        texts: Sequence[str],
        *,
        seed: int = 0,
        shuffle: bool = True,
        shard: Shard | dict[str, int] | None = None,
    ) -> None:
        super().__init__()
        if not tasks:
            raise ValueError(f"{type(self).__name__} needs at least one task")
        if not len(ids) == len(tasks) == len(texts):
            raise ValueError(
                f"{len(ids)} ids, {len(tasks)} tasks and {len(texts)} texts: one of each per task"
            )
        self._ids = [str(i) for i in ids]
        self._tasks = [dict(task) for task in tasks]
        self._texts = list(texts)
        self._index = {qid: i for i, qid in enumerate(self._ids)}
        if len(self._index) != len(self._ids):
            raise ValueError(f"{type(self).__name__}: task ids must be distinct")
        self._order = QueryOrder(len(self._tasks), seed=seed, shuffle=shuffle, shard=shard)

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def query_ids(self) -> list[str]:
        return list(self._ids)

    def agent_task(self, query_id: str) -> dict[str, Any]:
        """A copy of the task of ``query_id`` (a program may change it freely)."""
        return dict(self._tasks[self._lookup(query_id)])

    def reset_info(self, index: int) -> dict[str, Any]:
        """What ``reset``'s info carries beyond ``query_id`` and ``query_text`` for task ``index``: nothing."""
        return {}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """The next task of the order (``seed`` restarts the order with it), or ``options["query_id"]``'s; the
        observation is the task's text. ``user_content`` is refused: reflection reaches a program through the
        task."""
        super().reset(seed=seed)
        if seed is not None:
            self._order.restart(seed)
        query_id, user_content = parse_reset_options(options)
        if user_content is not None:
            raise ValueError(
                f"{type(self).__name__}: reset option 'user_content' is not supported; an agent program gets "
                "a reflection prompt through its task"
            )
        index = self._order.next() if query_id is None else self._lookup(query_id)
        info = {"query_id": self._ids[index], "query_text": self._texts[index], **self.reset_info(index)}
        return self._texts[index], info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        raise TypeError(
            f"{type(self).__name__} is an agent env: its episodes are agent programs run through the rollout "
            "gateway by the agent rollout kind (run_agent), not single responses passed to step()"
        )

    def _lookup(self, query_id: str) -> int:
        try:
            return self._index[query_id]
        except KeyError:
            raise ValueError(
                f"unknown query_id {query_id!r}: not among this env's {len(self)} tasks"
            ) from None

"""An agent program and its tasks as a text env (``env: agent``): the rollout of each query is a user's agent program
talking to the policy through the EnvRunner's OpenAI-compatible gateway (:mod:`r3_rllib.gateway`), and the
trajectories are assembled from the calls the gateway recorded (:mod:`r3_rllib.rollout.kinds.agent`).

::

    R3Config().environment("agent", env_config={
        "run": "my_agent:run",         # "module:function", or the function itself
        "tasks": "tasks.jsonl",        # .json/.jsonl/.parquet, a hub name, a datasets.Dataset, a list of dicts
    })

**The agent program**, ``async def run(client, task) -> float | dict`` (or ``run(client, task, model)``):

- ``client``: an ``openai.AsyncOpenAI`` bound to one gateway session (every call it makes is recorded, token for
  token); ``model``: the name the gateway serves the policy under (``"policy"``); a ``run`` without a ``model``
  parameter passes that name itself. ``task``: the task's row (a dict of its columns). R^3's reflection reruns a
  hard task with key ``"reflection"`` added (:data:`REFLECTION_KEY`): the task's text, a past wrong answer and
  guidance as one user message, which a program may send in place of its own first user message.
- It returns the episode's reward: a number (a bool counts as 0 or 1; correct when at least
  ``correct_threshold``), or a mapping with ``"reward"`` and optionally ``"correct"`` (a bool) and more entries
  (kept as the episode's info).
- An exception in the program stops the rollout with an error naming the env, the query and the exception: an
  episode is never silently scored 0.

**Tasks**: rows, ids and the train / held-out split are :mod:`r3_rllib.envs.rows`'s, as for ``reward_fn``;
``prompt`` (a column or template) gives the task's text for logs and reflection prompts (default: the row's
``prompt`` or ``question`` column when it is a string).

A callable ``run`` reaches the EnvRunners pickled (cloudpickle), as ``reward_fn``'s reward function does; a
``"module:function"`` string is imported in each runner (the form for run files).
"""

from __future__ import annotations

import inspect
import json
import numbers
from collections.abc import Callable, Mapping
from typing import Any, Literal

from r3_rllib.envs.agent_tasks import AgentTaskPool, finite_reward
from r3_rllib.envs.data import Shard
from r3_rllib.envs.registry import load_object
from r3_rllib.envs.rows import PromptSpec, Row, format_prompt, split_rows, user_text

#: The task key under which a reflection rerun gets its user message (the task, a past wrong answer, guidance).
REFLECTION_KEY = "reflection"
#: Columns tried, in order, for a task's text when no ``prompt`` is given.
TEXT_COLUMNS = ("prompt", "question")


def resolve_run(run: Any) -> Callable[..., Any]:
    """The agent program: ``run`` itself when callable, the object a ``"module:function"`` string names; a
    ValueError naming env_config key ``run`` otherwise."""
    if isinstance(run, str):
        run = load_object(run, what="agent run function")
    if not callable(run):
        raise ValueError(
            f"env_config 'run' must be a function or a 'module:function' string, got {type(run).__name__}"
        )
    return run


def takes_model(run: Callable[..., Any]) -> bool:
    """Whether ``run`` takes the model name: a third positional parameter, a ``model`` one or ``**kwargs``."""
    try:
        params = list(inspect.signature(run).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return (
        any(p.name == "model" for p in params)
        or len(positional) >= 3
        or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)
    )


def episode_outcome(value: Any, correct_threshold: float | None = None) -> dict[str, Any]:
    """``{"reward", "correct", ...}`` of what an agent program returned: a number (a bool counts as 0 or 1) or a
    mapping with a numeric ``"reward"`` (other entries kept). ``correct``: the mapping's own bool, else reward at
    least ``correct_threshold`` (None: reward > 0). A TypeError names anything else; a ValueError a reward that is
    not finite."""
    if not isinstance(value, Mapping) and getattr(value, "shape", None) == () and hasattr(value, "item"):
        value = value.item()  # a numpy scalar or a 0-d tensor
    if isinstance(value, Mapping):
        out = dict(value)
        if "reward" not in out:
            raise TypeError(f"returned a mapping without 'reward' (keys: {sorted(map(str, out))})")
    elif isinstance(value, numbers.Real):
        out = {"reward": value}
    else:
        raise TypeError(f"returned {type(value).__name__}, not a number or a mapping with 'reward'")
    reward = out["reward"]
    if not isinstance(reward, numbers.Real):
        raise TypeError(f"returned reward {reward!r}, not a number")
    out["reward"] = finite_reward(reward, "the agent program")
    if "correct" in out:
        out["correct"] = bool(out["correct"])
    else:
        threshold = correct_threshold
        out["correct"] = out["reward"] > 0 if threshold is None else out["reward"] >= threshold
    return out


def task_text(row: Row, prompt: PromptSpec | None) -> str:
    """A task's text (logs, reflection prompts): ``prompt`` applied to the row, else its first string column of
    :data:`TEXT_COLUMNS`, else the row as JSON."""
    if prompt is not None:
        return user_text(format_prompt(prompt, row))
    for column in TEXT_COLUMNS:
        if isinstance(row.values.get(column), str):
            return row.values[column]
    return json.dumps(row.values, sort_keys=True, default=str)


class AgentTextEnv(AgentTaskPool):
    """Tasks rolled out by an agent program (see the module): an :class:`~r3_rllib.envs.base.AgentEnv`.

    Config:
        run: the agent program, or a ``"module:function"`` string naming it.
        tasks: the rows (:mod:`r3_rllib.envs.rows`): a ``.json``/``.jsonl``/``.parquet`` path, a hub dataset name,
            a list of dicts, a ``datasets.Dataset``, or ``{"train": ..., "test": ...}`` of them.
        prompt: a column or a ``str.format`` template giving the task's text (default: see the module).
        split, test_size, heldout, split_seed, hub_config, id_key: the rows and their split, as ``reward_fn``'s.
        correct_threshold: a numeric reward at least this counts as correct (default 1.0).
        seed, shuffle, shard: the per-epoch order and this env's shard of it, as in the other envs.

    ``reset`` serves the next task (its text as the observation; ``info["task"]`` the task); ``step`` is not used:
    an episode is the agent program's run (:meth:`run_agent`). It takes no context options (``model_max_positions``):
    a task's prompts are the program's, and the rollout gateway refuses a call past the model's context.
    """

    def __init__(
        self,
        *,
        run: Any,
        tasks: Any,
        prompt: PromptSpec | None = None,
        split: Literal["train", "test"] = "train",
        test_size: int | float | None = None,
        heldout: Any = None,
        split_seed: int = 0,
        hub_config: str | None = None,
        id_key: str = "id",
        correct_threshold: float = 1.0,
        seed: int = 0,
        shuffle: bool = True,
        shard: Shard | dict[str, int] | None = None,
    ) -> None:
        if isinstance(correct_threshold, bool) or not isinstance(correct_threshold, numbers.Real):
            raise ValueError(f"env_config 'correct_threshold' must be a number, got {correct_threshold!r}")
        self.run_fn = resolve_run(run)
        self._pass_model = takes_model(self.run_fn)
        self.correct_threshold = float(correct_threshold)
        self.split = split
        self.rows: list[Row] = split_rows(
            tasks,
            split=split,
            test_size=test_size,
            heldout=heldout,
            split_seed=split_seed,
            hub_config=hub_config,
            id_key=id_key,
        )
        super().__init__(
            [row.id for row in self.rows],
            [row.values for row in self.rows],
            [task_text(row, prompt) for row in self.rows],
            seed=seed,
            shuffle=shuffle,
            shard=shard,
        )

    async def run_agent(self, client: Any, model: str, task: dict[str, Any]) -> dict[str, Any]:
        """One run of the agent program on ``task``; its outcome as :func:`episode_outcome` reads it."""
        value = self.run_fn(client, task, model) if self._pass_model else self.run_fn(client, task)
        if inspect.isawaitable(value):
            value = await value
        return episode_outcome(value, self.correct_threshold)

    def reset_info(self, index: int) -> dict[str, Any]:
        """The task itself (``info["task"]``), beside its id and text."""
        return {"task": dict(self.rows[index].values)}

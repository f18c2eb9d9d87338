"""verifiers environments (``verifiers`` 0.4, its ``verifiers.v1`` stack) as an agent env (``env: verifiers``)::

    R3Config().environment("verifiers", env_config={
        "env": {"taskset": {"id": "my_taskset"}},   # a verifiers env config (what `vf-eval`'s [env] block holds)
        "max_tasks": 256,                           # the first tasks of the taskset (a bound infinite one needs it)
    })

The verifiers env is built with verifiers' own loaders (``resolve_env_config`` + ``load_environment``: the taskset
named by ``taskset.id``, an installed or importable package exporting its ``Taskset``, and the env class it
pairs with). A rollout is one verifiers episode of the task (``Env.run_episode``): verifiers serves its
interception endpoint on loopback, the agent's harness talks to it, and verifiers' eval client relays each call,
unchanged, to the rollout gateway session the ``client`` is bound to (``client.base_url``), where it is recorded
token for token. The reward is the episode's trace reward (the sum of its task's weighted ``@reward`` values; the
info holds each reward and the task's ``@metric`` values); an episode that failed (``episode.ok`` false) raises,
naming verifiers' errors.

The harness: an env config that pins none runs the in-process chat harness (harness id ``r3_in_process``,
:mod:`r3_rllib.envs.adapters.verifiers_harness`: chat calls with the task's verifiers toolsets as tools), which
needs no ``uv`` or network; verifiers' own harnesses
(``bash``, ``null``: programs bootstrapped with ``uv`` in a runtime) run when the config pins them. Needs the
``verifiers`` extra (``pip install 'r3-rllib[verifiers]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Mapping
from typing import Any

from r3_rllib.envs.adapters.common import AgentTaskEnv, finite_reward, require_extra
from r3_rllib.envs.data import Shard

#: The in-process harness's verifiers id. verifiers resolves a harness id to a module of its own harnesses package
#: (or a top-level module): :func:`register_in_process_harness` makes our module that package's ``r3_in_process``.
IN_PROCESS_HARNESS = "r3_in_process"
#: The environment variable verifiers reads the endpoint's API key from (unset: "EMPTY"; a gateway needs none).
API_KEY_VAR = "R3_GATEWAY_API_KEY"


def with_harness(env_config: Mapping[str, Any]) -> dict[str, Any]:
    """``env_config`` with the in-process harness on the ``agent`` seat when no harness is pinned there (and, then,
    the local ``subprocess`` runtime unless one is pinned: the harness runs in this process, so verifiers' default
    remote runtime, reached through a tunnel, would serve nothing)."""
    config = dict(env_config)
    agent = dict(config.get("agent") or {})
    if "harness" not in agent:
        agent["harness"] = {"id": IN_PROCESS_HARNESS}
        agent.setdefault("runtime", {"type": "subprocess"})
    config["agent"] = agent
    return config


def register_in_process_harness() -> None:
    """Make the in-process harness loadable by verifiers as harness id ``r3_in_process``."""
    from r3_rllib.envs.adapters import verifiers_harness

    sys.modules.setdefault(f"verifiers.v1.harnesses.{IN_PROCESS_HARNESS}", verifiers_harness)


class VerifiersEnv(AgentTaskEnv):
    """A verifiers env's tasks as agent tasks; each rollout is one verifiers episode (see the module docstring).

    Config:
        env: the verifiers env config (a dict). max_tasks: take the taskset's first tasks only.
        seed, shuffle, shard: the pool's order (as every pooled env).
    """

    def __init__(
        self,
        *,
        env: Mapping[str, Any],
        max_tasks: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        shard: Shard | dict[str, int] | None = None,
    ) -> None:
        self._vf = require_extra("verifiers.v1", "verifiers", "env 'verifiers'")
        register_in_process_harness()
        try:
            config = self._vf.resolve_env_config(with_harness(env))
            self._vf_env = self._vf.load_environment(config)
        except Exception as exc:
            raise ValueError(
                f"verifiers: cannot load the env {dict(env)!r}: {type(exc).__name__}: {exc}"
            ) from exc
        taskset = self._vf_env.taskset
        if max_tasks is not None:
            taskset = taskset.take(int(max_tasks))
        elif not taskset.bounded:
            raise ValueError("verifiers: the taskset is infinite; set max_tasks")
        self._vf_tasks = {f"vf-{i}": task for i, task in enumerate(taskset)}
        tasks = [{"id": qid, "prompt": _prompt_text(t.data.prompt)} for qid, t in self._vf_tasks.items()]
        super().__init__(tasks, id_prefix="vf", seed=seed, shuffle=shuffle, shard=shard)
        self._serving_loop: Any = None
        self._serving_lock = asyncio.Lock()
        self._serving_users = 0
        self._serving_stack = contextlib.AsyncExitStack()

    @contextlib.asynccontextmanager
    async def _shared_serving(self) -> Any:
        """verifiers' serving resources (interception endpoint, shared tools) for the episodes in flight: they live
        on the env object, so the concurrent episodes of one event loop share one, started by the first and
        stopped when the last ends."""
        loop = asyncio.get_running_loop()
        if self._serving_loop is not loop:
            self._serving_lock, self._serving_loop, self._serving_users = asyncio.Lock(), loop, 0
        async with self._serving_lock:
            if self._serving_users == 0:
                self._serving_stack = contextlib.AsyncExitStack()
                await self._serving_stack.enter_async_context(self._vf_env.serving())
            self._serving_users += 1
        try:
            yield
        finally:
            async with self._serving_lock:
                self._serving_users -= 1
                if self._serving_users == 0:
                    await self._serving_stack.aclose()

    async def run_agent(self, client: Any, model: str, task: dict[str, Any]) -> dict[str, Any]:
        """One verifiers episode of ``task`` whose model calls go to ``client.base_url``; its trace reward."""
        endpoint = self._vf.EvalClientConfig(base_url=str(client.base_url), api_key_var=API_KEY_VAR)
        ctx = self._vf.ModelContext(model=model, client=endpoint)
        async with self._shared_serving():
            episode = await self._vf_env.run_episode(self._vf_tasks[task["id"]], ctx)
        if not episode.ok or not episode.traces:
            errors = "; ".join(f"{e.type}: {e.message}" for e in episode.errors) or "no trace"
            trace_errors = "; ".join(f"{e.type}: {e.message}" for t in episode.traces for e in t.errors)
            raise RuntimeError(
                f"verifiers episode of task {task['id']} failed: {errors} {trace_errors}".strip()
            )
        trace = episode.traces[0]
        reward = finite_reward(trace.reward, f"verifiers env {self._vf_env.config.env_id!r}")
        parts = {name: r.value for name, r in trace.rewards.items() if r is not None}
        metrics = {name: value for name, value in trace.metrics.items() if value is not None}
        return {"reward": reward, "correct": reward > 0, "info": {"rewards": parts, "metrics": metrics}}


def _prompt_text(prompt: Any) -> str:
    """A verifiers task prompt as text: the string, or its messages' contents joined."""
    if prompt is None or isinstance(prompt, str):
        return prompt or ""
    return "\n".join(str(getattr(m, "content", m)) for m in prompt)

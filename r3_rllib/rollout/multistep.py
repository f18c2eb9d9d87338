"""Multi-step rollouts: G trajectories per query stepped in lockstep, one batched engine call per step.

A multi-step env hands out independent episodes (``make_episode(query_id)``, e.g.
:meth:`r3_rllib.envs.gridworld.GridWorldEnv.episode`): objects with ``prompt`` (the text of the next step's prompt),
``obs_key`` (the hashable observation HGPO groups by), ``done`` and ``step(response_text) -> (next_prompt, reward,
terminated, truncated, info)``. Every round gathers the prompts of all active episodes of all queries, samples one
response each in ONE ``engine.generate`` call (so a batch of Q queries x G trajectories costs one call per step,
not one per episode), and applies them. Rounds stop when every episode has ended or after ``max_steps``.

Each step becomes a :class:`StepRecord` with what the learner (prompt, response, behaviour log-probs) and HGPO
(trajectory, step index, observation key, discounted return) need. No Ray here: the rollout worker calls this, and
so does the gridworld warm start's evaluation (:mod:`r3_rllib.warmstart.gridworld`); the algorithm turns the records
into training groups (``algorithms/r3/multistep.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from r3_rllib.core.hgpo import discounted_returns
from r3_rllib.engines.base import GenerationEngine, SamplingParams


class Episode(Protocol):
    """What the rollout loop needs from one multi-step episode."""

    @property
    def prompt(self) -> str: ...

    @property
    def obs_key(self) -> Any: ...

    @property
    def done(self) -> bool: ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]: ...


@dataclass
class StepRecord:
    """One step of one trajectory: a training sample of a multi-step task."""

    query_id: str
    traj_id: int  # 0 .. G-1 within its query
    step: int  # 0 .. T-1 within its trajectory
    obs_key: Any
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: np.ndarray  # behaviour log-probs of response_ids
    entropies: np.ndarray  # the sampling distribution's entropy at each response token
    response_text: str
    finish_reason: str
    reward: float
    terminated: bool  # the env ended the episode at this step (goal reached)
    truncated: bool  # the env's horizon, or the loop's max_steps, ended it here
    discounted_return: float = 0.0
    token_versions: np.ndarray | None = None  # partial rollouts: the policy version of each response token


def rollout_multistep(
    engine: GenerationEngine,
    tokenizer: Any,
    make_episode: Callable[[str], Episode],
    query_ids: Sequence[str],
    group_size: int,
    params: SamplingParams,
    *,
    gamma: float = 1.0,
    max_steps: int | None = None,
) -> list[StepRecord]:
    """Roll out ``group_size`` trajectories of every query in lockstep; returns their steps, grouped by query, then
    trajectory, then step (returns filled per trajectory with ``gamma``).

    ``max_steps`` caps the rounds (an episode still running then has its last step marked ``truncated``); None
    relies on the env's own horizon.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be >= 1 or None, got {max_steps}")
    if not query_ids:
        raise ValueError("rollout_multistep needs at least one query")
    episodes = [(qid, g, make_episode(qid)) for qid in query_ids for g in range(group_size)]
    steps: list[list[StepRecord]] = [[] for _ in episodes]
    rounds = 0
    while True:
        active = [i for i, (_, _, ep) in enumerate(episodes) if not ep.done]
        if not active or (max_steps is not None and rounds >= max_steps):
            break
        prompts = [episodes[i][2].prompt for i in active]
        keys = [episodes[i][2].obs_key for i in active]
        prompt_ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        # A new seed every round: a seeded engine would otherwise draw from the same random stream at every step.
        seed = None if params.seed is None else params.seed + rounds
        results = engine.generate(prompt_ids, 1, replace(params, seed=seed))
        for i, ids, key, result in zip(active, prompt_ids, keys, results, strict=True):
            qid, g, ep = episodes[i]
            completion = result[0]
            _, reward, terminated, truncated, _ = ep.step(completion.text)
            steps[i].append(
                StepRecord(
                    query_id=qid,
                    traj_id=g,
                    step=len(steps[i]),
                    obs_key=key,
                    prompt_ids=list(ids),
                    response_ids=list(completion.token_ids),
                    logprobs=np.asarray(completion.logprobs, dtype=np.float64),
                    entropies=np.asarray(completion.entropies, dtype=np.float64),
                    response_text=completion.text,
                    finish_reason=completion.finish_reason,
                    reward=float(reward),
                    terminated=bool(terminated),
                    truncated=bool(truncated),
                    token_versions=completion.token_versions,
                )
            )
        rounds += 1
    for i, (_, _, ep) in enumerate(episodes):
        if not ep.done and steps[i]:
            steps[i][-1].truncated = True  # cut by max_steps
    flat = [rec for traj in steps for rec in traj]
    if flat:
        returns = discounted_returns(
            [r.reward for r in flat], [(r.query_id, r.traj_id) for r in flat], [r.step for r in flat], gamma
        )
        for rec, ret in zip(flat, returns, strict=True):
            rec.discounted_return = float(ret)
    return flat


def supports_episodes(env: Any) -> bool:
    """Whether ``env`` is a multi-step env: it hands out independent episodes with ``episode(query_id)``."""
    return callable(getattr(env, "episode", None))


def episode_totals(records: Sequence[StepRecord]) -> dict[str, float]:
    """What one rollout's trajectories add to the rollout metrics, as sums (beside ``algorithms/r3/groups.py``'s
    ``rollout_totals``)."""
    stats = episode_stats(records)
    successes = stats["success_rate"] * stats["trajectories"]
    return {
        "episodes": stats["trajectories"],
        "episode_successes": successes,
        "episode_steps": stats["mean_length"] * stats["trajectories"],
    }


def episode_stats(records: Sequence[StepRecord]) -> dict[str, float]:
    """Success rate (trajectories that ended ``terminated`` with a positive reward), their count, mean steps of the
    successful ones, and mean trajectory length."""
    trajs: dict[tuple[str, int], list[StepRecord]] = {}
    for r in records:
        trajs.setdefault((r.query_id, r.traj_id), []).append(r)
    if not trajs:
        raise ValueError("no steps to summarise")
    wins = [len(t) for t in trajs.values() if t[-1].terminated and t[-1].reward > 0]
    return {
        "success_rate": len(wins) / len(trajs),
        "steps_to_goal": float(np.mean(wins)) if wins else float("nan"),
        "mean_length": float(np.mean([len(t) for t in trajs.values()])),
        "trajectories": float(len(trajs)),
        "successes": float(len(wins)),
    }

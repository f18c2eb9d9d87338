"""Training groups of a multi-step rollout: the steps :func:`r3_rllib.rollout.multistep.rollout_multistep` records,
one group per query, each step a :class:`Sample` with what step-level estimators (HGPO) group by.

The rollout loop itself is Ray-free and lives in :mod:`r3_rllib.rollout.multistep` (the gridworld warm start's
evaluation runs it too); this module is the algorithm's side: from records to the groups it trains on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from r3_rllib.algorithms.r3.partial_rollout import oldest_version
from r3_rllib.rollout.multistep import StepRecord
from r3_rllib.types.samples import Group, Sample


def step_groups(records: Sequence[StepRecord], policy_version: int) -> list[Group]:
    """One training group per query: the steps of its G trajectories, each a :class:`Sample` carrying its
    trajectory id, step index and observation key (what step-level estimators group by).

    A step's ``reward`` is its own env reward (the estimator discounts with ``step_gamma``), ``correct`` says
    whether its trajectory reached the goal, and ``truncated`` whether its response hit ``max_new_tokens``."""
    success = {
        (r.query_id, r.traj_id): r.terminated and r.reward > 0 for r in records if r.terminated or r.truncated
    }
    by_query: dict[str, list[Sample]] = {}
    for r in records:
        by_query.setdefault(r.query_id, []).append(
            Sample(
                query_id=r.query_id,
                prompt_ids=list(r.prompt_ids),
                response_ids=list(r.response_ids),
                behavior_logprobs=np.asarray(r.logprobs, dtype=np.float32),
                entropies=np.asarray(r.entropies, dtype=np.float32),
                reward=float(r.reward),
                correct=success.get((r.query_id, r.traj_id), False),
                truncated=r.finish_reason == "length",
                # Partial rollouts: a step sampled after a weight pull counts under its own oldest token.
                policy_version=oldest_version(r.token_versions, policy_version),
                token_versions=r.token_versions,
                response_text=r.response_text,
                trajectory_id=f"{r.query_id}#{r.traj_id}",
                step_index=r.step,
                obs_key=r.obs_key,
            )
        )
    return [Group(query_id=qid, samples=samples) for qid, samples in by_query.items()]

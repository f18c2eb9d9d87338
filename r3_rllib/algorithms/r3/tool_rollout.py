"""Training groups of a multi-turn tool-use rollout: one :class:`Sample` per trajectory (model turns and tool outputs
in one response, tool tokens masked out of the loss), one group per query.

The loop itself is Ray-free and lives in :mod:`r3_rllib.rollout.tool_use`; this module is the algorithm's side.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from r3_rllib.algorithms.r3.partial_rollout import oldest_version
from r3_rllib.rollout.tool_use import ToolTrajectory, response_arrays
from r3_rllib.types.samples import Group, Sample


def trajectory_sample(traj: ToolTrajectory, policy_version: int, *, is_reflection: bool = False) -> Sample:
    """The training sample of one trajectory. Its entropies are the model tokens' only (what R^3's ranking reads:
    a tool's output is not the policy's uncertainty); ``truncated`` when a turn or the token budget cut it."""
    logprobs, entropies, mask = response_arrays(traj)
    versions = np.asarray(traj.token_versions, dtype=np.int64)
    tagged = versions if len(versions) == len(mask) else None  # a trajectory built without append has no tags
    return Sample(
        query_id=traj.query_id,
        prompt_ids=list(traj.prompt_ids),
        response_ids=list(traj.response_ids),
        behavior_logprobs=logprobs,
        entropies=entropies[mask],
        reward=float(traj.reward),
        correct=bool(traj.correct),
        truncated=traj.finish_reason in ("length", "budget"),
        # The oldest weights that sampled any of its model tokens (turns may follow a weight pull).
        policy_version=oldest_version(None if tagged is None else tagged[mask], policy_version),
        token_versions=tagged,
        response_text=traj.text,
        is_reflection=is_reflection,
        loss_mask=mask,
    )


def trajectory_groups(
    trajs: Sequence[ToolTrajectory], policy_version: int, *, is_reflection: bool = False
) -> list[Group]:
    """One group per query (its G trajectories), in the order the queries first appear."""
    by_query: dict[str, list[Sample]] = {}
    for t in trajs:
        by_query.setdefault(t.query_id, []).append(
            trajectory_sample(t, policy_version, is_reflection=is_reflection)
        )
    return [Group(query_id=q, samples=s, is_reflection=is_reflection) for q, s in by_query.items()]

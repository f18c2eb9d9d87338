"""From sampled groups to a training batch: R^3's replay and ranking, then group advantages.

Pure functions (no Ray): the algorithm calls them between the EnvRunners' `sample()` and the learners' update.

A *group* is the G responses to one prompt. Fresh groups come from the EnvRunners; reflection groups (R^3's
in-context self-reflection) are groups of their own with the reflection prompt and the original query's gold answer.

Choices the paper leaves open, made here and documented:

- Ranking applies to every group whose own (non-replayed) samples are all wrong, reflection groups included;
  replayed successes keep reward 1, which stays above every ranked failure (R_max < 1), so the ordering
  "correct > better failure > worse failure" holds in G_mix.
- Reflection groups are trained on their own prompt, with advantages within their own group. Their samples do not
  enter the replay buffer: the query's mean past reward measures the policy on the original prompt, and a response
  conditioned on a reflection prompt replayed into the original query's group would mix two contexts.
- A group whose advantages are all zero carries no policy gradient. Without a KL term it is left out of the batch
  (it would only cost compute). With a KL term (``kl_coef > 0``) it is kept, as verl keeps it: its tokens still
  carry the KL penalty to the reference, and leaving them out would shrink the loss's token (or sequence) count and
  so re-weight every other sample's gradient by how many groups happened to collapse.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from r3_rllib.core.advantages import ADVANTAGE_FNS, compute_group_advantages, group_is_degenerate
from r3_rllib.core.ranking import structural_entropy_rewards


@dataclass
class Sample:
    """One response with everything the learner, the ranking reward and the replay buffer need."""

    query_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    behavior_logprobs: np.ndarray
    entropies: np.ndarray
    reward: float
    correct: bool
    truncated: bool
    policy_version: int
    response_text: str = ""
    is_replay: bool = False
    is_reflection: bool = False
    advantage: float = 0.0
    env_reward: float | None = None  # the env's reward, kept when a ranking reward replaces `reward`
    # Identity within a multi-step episode (single-step samples keep the defaults): the trajectory the step belongs
    # to, its index in it, and the observation key that step-level estimators (HGPO) group by.
    trajectory_id: str | None = None
    step_index: int = 0
    obs_key: Hashable | None = None

    def __post_init__(self) -> None:
        if self.env_reward is None:
            self.env_reward = self.reward


@dataclass
class Group:
    query_id: str
    samples: list[Sample]
    is_reflection: bool = False
    replayed: list[Sample] = field(default_factory=list)

    @property
    def is_degenerate(self) -> bool:
        """All its own samples have the same reward: every advantage within the group is zero."""
        return group_is_degenerate([s.reward for s in self.samples])

    @property
    def all_wrong(self) -> bool:
        return not any(s.correct for s in self.samples)

    @property
    def all_right(self) -> bool:
        return all(s.correct for s in self.samples)


@dataclass(frozen=True)
class R3Switches:
    """Which R^3 parts are active this iteration (after their start epochs) and their parameters."""

    replay: bool = False
    replay_k: int = 2
    ranking: bool = False
    ranking_p: float = 0.1
    ranking_r_max: float = 0.5
    advantage_estimator: str = "grpo"
    advantage_params: dict = field(default_factory=dict)
    keep_zero_advantage: bool = False
    """Keep groups whose advantages are all zero in the batch (set when kl_coef > 0: they add KL, no policy
    gradient)."""


def replay_requests(groups: Sequence[Group], k: int) -> list[tuple[str, bool, int]]:
    """(query_id, want_correct, k) for every fresh group that collapsed: all wrong wants successes, all right
    wants failures."""
    requests = []
    for g in groups:
        if g.is_reflection or k <= 0:
            continue
        if g.all_wrong:
            requests.append((g.query_id, True, k))
        elif g.all_right:
            requests.append((g.query_id, False, k))
    return requests


def apply_ranking_rewards(group: Group, *, p: float, r_max: float) -> None:
    """Give the (all wrong) fresh samples of `group` graded rewards in [0, r_max] by entropy structure."""
    rewards = structural_entropy_rewards([s.entropies for s in group.samples], p=p, r_max=r_max)
    for s, r in zip(group.samples, rewards, strict=True):
        s.reward = float(r)


def build_training_batch(
    groups: Sequence[Group],
    switches: R3Switches,
    fetch_replay: Callable[[list[tuple[str, bool, int]]], list[list[Sample]]] | None = None,
) -> tuple[list[Sample], dict[str, float]]:
    """Mix in replayed samples, apply ranking rewards, compute advantages; return (samples, metrics).

    `fetch_replay(requests)` returns, per request, up to k past samples of that query with the wanted outcome.
    Samples of groups that still have zero advantage everywhere are kept out of the batch (they carry no policy
    gradient) unless ``switches.keep_zero_advantage`` (a KL term: see the module docstring); either way they are
    counted in ``zero_adv_frac``, and ``train_zero_adv_samples`` counts those kept.
    """
    fresh = [g for g in groups if not g.is_reflection]
    metrics: dict[str, float] = {
        "groups": float(len(groups)),
        "zero_adv_frac_before": _frac(g.is_degenerate for g in fresh),
        "replay_requests": 0.0,
        "replay_hits": 0.0,
        "replay_samples": 0.0,
        "ranked_groups": 0.0,
    }
    if switches.replay and fetch_replay is not None:
        requests = replay_requests(groups, switches.replay_k)
        if requests:
            by_query = {g.query_id: g for g in fresh}
            for (qid, _want, _k), got in zip(requests, fetch_replay(requests), strict=True):
                by_query[qid].replayed = [_as_replayed(s) for s in got]
            metrics["replay_requests"] = float(len(requests))
            metrics["replay_hits"] = float(sum(1 for qid, _, _ in requests if by_query[qid].replayed))
            metrics["replay_samples"] = float(sum(len(by_query[qid].replayed) for qid, _, _ in requests))

    spreads = []
    if switches.ranking:
        for g in groups:
            if g.all_wrong and len(g.samples) > 1:
                apply_ranking_rewards(g, p=switches.ranking_p, r_max=switches.ranking_r_max)
                spreads.append(float(np.ptp([s.reward for s in g.samples])))
    metrics["ranked_groups"] = float(len(spreads))
    metrics["ranked_reward_spread"] = float(np.mean(spreads)) if spreads else 0.0

    batch: list[Sample] = []
    zero_after = []
    kept_zero = 0
    for g in groups:
        members = g.samples + g.replayed
        rewards = np.asarray([s.reward for s in members], dtype=np.float64)
        inputs = _sample_inputs(switches.advantage_estimator, members)
        advantages = compute_group_advantages(
            switches.advantage_estimator, rewards, **switches.advantage_params, **inputs
        )
        # The estimator's output, not the rewards: mixed groups (fresh + replayed) are judged after mixing.
        degenerate = not np.any(advantages)
        if not g.is_reflection:
            zero_after.append(degenerate)
        if degenerate:
            if not switches.keep_zero_advantage:
                continue
            kept_zero += len(members)
        for s, a in zip(members, advantages, strict=True):
            s.advantage = float(a)
            batch.append(s)
    metrics["zero_adv_frac"] = _frac(zero_after)
    metrics["train_samples"] = float(len(batch))
    metrics["train_zero_adv_samples"] = float(kept_zero)
    metrics["train_replayed"] = float(sum(s.is_replay for s in batch))
    metrics["train_reflected"] = float(sum(s.is_reflection for s in batch))
    return batch, metrics


#: Estimator keyword (a registered ``sample_inputs`` name) -> the Sample field it reads, one value per member.
SAMPLE_INPUT_FIELDS: dict[str, str] = {
    "obs_keys": "obs_key",
    "traj_ids": "trajectory_id",
    "step_indices": "step_index",
}


def _sample_inputs(estimator: str, members: Sequence[Sample]) -> dict[str, list]:
    """The per-sample keys an estimator declared (none for the single-step estimators), from the group's members."""
    out = {}
    for name in ADVANTAGE_FNS.sample_inputs.get(estimator, ()):
        if name not in SAMPLE_INPUT_FIELDS:
            raise ValueError(
                f"advantage estimator {estimator!r} asks for sample input {name!r}; samples carry "
                f"{sorted(SAMPLE_INPUT_FIELDS)}"
            )
        out[name] = [getattr(s, SAMPLE_INPUT_FIELDS[name]) for s in members]
    return out


def _as_replayed(s: Sample) -> Sample:
    s.is_replay = True
    return s


def _frac(flags) -> float:
    flags = list(flags)
    return float(np.mean(flags)) if flags else 0.0

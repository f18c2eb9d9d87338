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
  so re-weight every other sample's gradient by how many groups happened to collapse. An entropy bonus
  (``entropy_coef > 0``) keeps them likewise: their tokens carry it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from r3_rllib.core.advantages import ADVANTAGE_FNS, apply_batch_step, compute_group_advantages
from r3_rllib.core.iteration import IterationSettings
from r3_rllib.core.method import DEFAULT_PHASE
from r3_rllib.core.ranking import rank_rewards, ranked_group_scores, structural_entropy_rewards
from r3_rllib.core.reward_shaping import OverlongShaping, keep_group
from r3_rllib.rollout.kinds import kind_means
from r3_rllib.rollout.kinds.base import ratio
from r3_rllib.types.samples import Group, Sample


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


def shaped_rewards(samples: Sequence[Sample], overlong: OverlongShaping | None) -> np.ndarray:
    """The rewards advantages are computed from: each sample's ``reward`` (the env's, or a ranking reward) minus its
    ``reward_kl_penalty`` (use_kl_in_reward; 0 otherwise), plus DAPO's overlong penalty of its length when
    ``overlong`` is set. Replayed samples are shaped by their own length like fresh ones, so a group mixes like with
    like."""
    rewards = np.asarray([s.reward - s.reward_kl_penalty for s in samples], dtype=np.float64)
    if overlong is not None and len(samples):
        rewards = rewards + overlong.penalties([len(s.response_ids) for s in samples])
    return rewards


def select_dynamic_groups(
    groups: Sequence[Group], *, target: int, metric: str, overlong: OverlongShaping | None = None
) -> tuple[list[Group], int]:
    """DAPO's dynamic sampling on the groups sampled so far (all rounds, in sampling order): (the groups to train on,
    the number of fresh groups that passed the filter).

    A group passes when its ``metric`` varies (:func:`~r3_rllib.core.reward_shaping.keep_group`: 'accuracy' on
    ``correct``, 'reward' on the rewards shaped as for training). The first ``target`` fresh groups that pass
    are kept and the rest dropped, as DAPO trims its refilled batch to the batch size: every update then sees the
    same number of queries. Reflection groups (R^3's extra prompts, not part of the batch size) are kept when they
    pass. The caller samples another round while the count is below ``target``."""
    passed = [
        g
        for g in groups
        if keep_group(
            [s.correct for s in g.samples],
            shaped_rewards(g.samples, overlong),
            metric,
        )
    ]
    fresh = [g for g in passed if not g.is_reflection]
    chosen = {id(g) for g in fresh[:target]}
    return [g for g in passed if g.is_reflection or id(g) in chosen], len(fresh)


def rankable(group: Group) -> bool:
    """Ranking rewards apply to ``group``: its own samples are all wrong and there are at least two to rank."""
    return group.all_wrong and len(group.samples) > 1


def rescore_ranking_entropies(
    groups: Sequence[Group], score: Callable[[list[Sample]], list[np.ndarray]]
) -> tuple[list[Group], dict[str, float]]:
    """``groups`` with the per-token entropies of every rankable group's samples replaced by ``score(samples)``
    (ranking_entropy_source='learner': the learner's exact entropies), one call for all of them; other groups are
    returned as they are. Metrics: ``ranking_entropy_tokens`` (tokens rescored), ``ranking_entropy_bias`` (mean
    engine entropy minus the new one over those tokens: vLLM's top-K estimate is a lower bound) and
    ``ranking_entropy_abs_diff`` (mean absolute difference)."""
    targets = [g for g in groups if rankable(g)]
    samples = [s for g in targets for s in g.samples]
    if not samples:
        return list(groups), {
            "ranking_entropy_tokens": 0.0,
            "ranking_entropy_bias": 0.0,
            "ranking_entropy_abs_diff": 0.0,
        }
    new = score(samples)
    if len(new) != len(samples):
        raise ValueError(f"entropy scoring returned {len(new)} rows for {len(samples)} samples")
    diffs = []
    for s, h in zip(samples, new, strict=True):
        if len(h) != len(s.response_ids):
            raise ValueError(
                f"entropy scoring returned {len(h)} values for a response of {len(s.response_ids)} tokens"
            )
        if len(s.entropies) == len(h):
            diffs.append(np.asarray(s.entropies, np.float64) - np.asarray(h, np.float64))
    rows = iter(new)
    rescored = {
        id(g): replace(
            g, samples=[replace(s, entropies=np.asarray(next(rows), np.float32)) for s in g.samples]
        )
        for g in targets
    }
    cat = np.concatenate(diffs) if diffs else np.zeros(0)
    metrics = {
        "ranking_entropy_tokens": float(sum(len(h) for h in new)),
        "ranking_entropy_bias": float(cat.mean()) if cat.size else 0.0,
        "ranking_entropy_abs_diff": float(np.abs(cat).mean()) if cat.size else 0.0,
    }
    return [rescored.get(id(g), g) for g in groups], metrics


def ranking_rewards(group: Group, *, p: float, r_max: float) -> np.ndarray:
    """Graded rewards in [0, r_max] for the (all wrong) fresh samples of ``group``, by entropy structure; with a
    group judge's scores on the group (ranking_source 'judge' or 'both'), the rank rewards of the judge's order
    (the same rank -> reward mapping and tie sharing) weighted by ``judge_rank_weight`` with the entropy ones."""
    w = group.judge_rank_weight if group.judge_scores is not None else 0.0
    if w >= 1.0:
        return rank_rewards(group.judge_scores, r_max)
    entropy = structural_entropy_rewards([s.entropies for s in group.samples], p=p, r_max=r_max)
    if w <= 0.0:
        return entropy
    return (1.0 - w) * entropy + w * rank_rewards(group.judge_scores, r_max)


def build_training_batch(
    groups: Sequence[Group],
    settings: IterationSettings,
    fetch_replay: Callable[[list[tuple[str, bool, int]]], list[list[Sample]]] | None = None,
) -> tuple[list[Sample], dict[str, float]]:
    """Mix in replayed samples, apply ranking rewards, compute advantages (per group, then the estimator's batch
    step when ``settings.batch_step`` names one); return (samples, metrics).

    ``fetch_replay(requests)`` returns, per request, up to k past samples of that query with the wanted outcome.
    Samples of groups that still have zero advantage everywhere are kept out of the batch (they carry no policy
    gradient) unless ``settings.keep_zero_advantage`` (a KL term or an entropy bonus: see the module docstring);
    either way they are counted in ``zero_adv_frac``, and ``train_zero_adv_samples`` counts those kept.

    The inputs are left as they are: the batch holds copies of the samples with their ``reward`` (a ranking
    reward where one was given; ``env_reward`` keeps the env's), ``advantage`` and ``is_replay`` set.
    """
    batch, metrics, _ = assemble_training_batch(groups, settings, fetch_replay)
    for key in UNRANKED_COUNTS:
        metrics.pop(key)
    return batch, metrics


#: :func:`assemble_training_batch`'s counts of the fresh groups scored on the driver (all, zero-advantage ones),
#: which the deferred ranking's zero-advantage fraction is completed from.
UNRANKED_COUNTS = ("unranked_fresh_groups", "unranked_zero_groups")


def assemble_training_batch(
    groups: Sequence[Group],
    settings: IterationSettings,
    fetch_replay: Callable[[list[tuple[str, bool, int]]], list[list[Sample]]] | None = None,
    *,
    defer_ranking: bool = False,
) -> tuple[list[Sample], dict[str, float], list[tuple[int, Group, list[Sample]]]]:
    """:func:`build_training_batch`, and with ``defer_ranking`` the rankable groups left unranked for the learner
    (ranking_deferred.py): their members enter the batch whole, whatever their advantages turn out to be, with
    placeholder rewards and zero advantages, and are left out of the zero-advantage counts. The third element
    lists them as (first row in the batch, group, members: its own samples then its replayed ones)."""
    fresh = [g for g in groups if not g.is_reflection]
    metrics: dict[str, float] = {
        "groups": float(len(groups)),
        "zero_adv_frac_before": _frac(g.is_degenerate for g in fresh),
        "replay_requests": 0.0,
        "replay_hits": 0.0,
        "replay_samples": 0.0,
        "ranked_groups": 0.0,
    }
    replayed: dict[int, list[Sample]] = {}  # id(group) -> its replayed samples
    if settings.replay and fetch_replay is not None:
        replayed = _fetch_replayed(groups, fresh, settings.replay_k, fetch_replay, metrics)
    ranked: dict[int, np.ndarray] = {}  # id(group) -> its fresh samples' ranking rewards
    later = _left_to_learner(groups, settings) if defer_ranking else set()
    if settings.ranking:
        for g in groups:
            if rankable(g) and id(g) not in later:
                ranked[id(g)] = ranking_rewards(g, p=settings.ranking_p, r_max=settings.ranking_r_max)
    metrics["ranked_groups"] = float(len(ranked) + len(later))
    metrics["ranked_reward_spread"] = float(np.mean([np.ptp(r) for r in ranked.values()])) if ranked else 0.0
    scored = _score_groups(groups, ranked, replayed, settings)

    batch: list[Sample] = []
    zero_after = []
    kept_zero = 0
    deferred: list[tuple[int, Group, list[Sample]]] = []
    for g, members, rewards, advantages in scored:
        if id(g) in later:
            deferred.append((len(batch), g, members))
            batch.extend(
                replace(s, reward=float(r), advantage=0.0) for s, r in zip(members, rewards, strict=True)
            )
            continue
        # The estimator's output, not the rewards (mixed groups judged after mixing); learners' token advantages: all.
        degenerate = not np.any(advantages) and not settings.learner_token_advantages
        if not g.is_reflection:
            zero_after.append(degenerate)
        if degenerate:
            if not (settings.keep_zero_advantage or _distilled(members, settings)):
                continue
            kept_zero += len(members)
        batch.extend(
            replace(s, reward=float(r), advantage=float(a))
            for s, r, a in zip(members, rewards, advantages, strict=True)
        )
    # No fresh group scored (DAPO filtered them all): the fraction is undefined, not 0 (which reads as "all useful").
    metrics["zero_adv_frac"] = _frac(zero_after) if zero_after else float("nan")
    metrics["trained_groups"] = float(len(zero_after) - sum(zero_after))
    if settings.overlong is not None:
        penalties = settings.overlong.penalties([len(s.response_ids) for g in fresh for s in g.samples])
        metrics["overlong_penalty_mean"] = float(penalties.mean()) if penalties.size else 0.0
        metrics["overlong_frac"] = float(np.mean(penalties < 0)) if penalties.size else 0.0
    metrics["train_samples"] = float(len(batch))
    metrics["train_zero_adv_samples"] = float(kept_zero)
    metrics["train_replayed"] = float(sum(s.is_replay for s in batch))
    metrics["train_reflected"] = float(sum(s.is_reflection for s in batch))
    metrics["unranked_zero_groups"] = float(sum(zero_after))  # the deferred ones are counted after the update
    metrics["unranked_fresh_groups"] = float(len(zero_after))
    return batch, metrics, deferred


def _distilled(members: Sequence[Sample], settings: IterationSettings) -> bool:
    """Whether the group's tokens carry a teacher's signal in this update: a sample has teacher log-probs (on-policy
    distillation) and the phase distills (not R^2PO's stage A, :attr:`TrainingPhase.distills`); such a group is
    kept even where the task's advantages are all zero."""
    phase = settings.phase or DEFAULT_PHASE
    return phase.distills and any(s.teacher_logprobs is not None for s in members)


def _left_to_learner(groups: Sequence[Group], settings: IterationSettings) -> set[int]:
    """``id``s of the groups the learner ranks when ranking is deferred: the rankable ones no judge ranked (a
    group judge's ranking is applied here; the learner ranks by its entropies alone)."""
    return {id(g) for g in groups if settings.ranking and rankable(g) and g.judge_scores is None}


def _fetch_replayed(
    groups: Sequence[Group],
    fresh: Sequence[Group],
    k: int,
    fetch_replay: Callable[[list[tuple[str, bool, int]]], list[list[Sample]]],
    metrics: dict[str, float],
) -> dict[int, list[Sample]]:
    """``id(group) -> replayed samples`` for the collapsed fresh groups (see :func:`replay_requests`); counts the
    requests, hits and samples into ``metrics``."""
    replayed: dict[int, list[Sample]] = {}
    requests = replay_requests(groups, k)
    if not requests:
        return replayed
    by_query = {g.query_id: g for g in fresh}
    for (qid, _want, _k), got in zip(requests, fetch_replay(requests), strict=True):
        replayed[id(by_query[qid])] = [replace(s, is_replay=True) for s in got]
    hits = [len(replayed[id(by_query[qid])]) for qid, _, _ in requests]
    metrics["replay_requests"] = float(len(requests))
    metrics["replay_hits"] = float(sum(n > 0 for n in hits))
    metrics["replay_samples"] = float(sum(hits))
    return replayed


def _score_groups(
    groups: Sequence[Group],
    ranked: dict[int, np.ndarray],
    replayed: dict[int, list[Sample]],
    settings: IterationSettings,
) -> list[tuple[Group, list[Sample], np.ndarray, np.ndarray]]:
    """``(group, members, rewards, advantages)`` of every group, before any is left out: members are its own
    samples (with their ranking rewards when ranked) then its replayed ones; advantages after the estimator's
    batch step when it has one."""
    scored = []
    for g in groups:
        own = g.samples
        if (
            id(g) in ranked
            and g.judge_scores is None
            and not ADVANTAGE_FNS.sample_inputs.get(settings.advantage_estimator)
        ):
            scored.append(_score_ranked(g, replayed.get(id(g), []), settings))
            continue
        if id(g) in ranked:
            own = [replace(s, reward=float(r)) for s, r in zip(g.samples, ranked[id(g)], strict=True)]
        members = own + replayed.get(id(g), [])
        rewards = shaped_rewards(members, settings.overlong)
        inputs = _sample_inputs(settings.advantage_estimator, members)
        advantages = compute_group_advantages(
            settings.advantage_estimator, rewards, **settings.advantage_params, **inputs
        )
        scored.append((g, members, rewards, advantages))
    if settings.batch_step is not None and scored:
        # The estimator's batch step (e.g. REINFORCE++'s token whitening) over every member of every group:
        # replayed and ranked samples are trained on, so they count; zero-advantage groups count too (as zeros, as
        # in verl's whole-batch statistics), so the scale does not depend on whether a KL term keeps them.
        members = [s for _, m, *_ in scored for s in m]
        inputs = _batch_sample_inputs(settings.batch_step, members)
        if BATCH_REWARDS in ADVANTAGE_FNS.batch_sample_inputs.get(settings.batch_step, ()):
            # The rewards as the groups used them: shaped, ranked, replayed ones included.
            inputs[BATCH_REWARDS] = np.concatenate([r for _, _, r, _ in scored])
        flat = apply_batch_step(
            settings.batch_step,
            np.concatenate([a for *_, a in scored]),
            **settings.batch_step_params,
            **inputs,
        )
        bounds = np.cumsum([len(a) for *_, a in scored])[:-1]
        scored = [(g, m, r, a) for (g, m, r, _), a in zip(scored, np.split(flat, bounds), strict=True)]
    return scored


def _score_ranked(
    g: Group, replayed: list[Sample], settings: IterationSettings
) -> tuple[Group, list[Sample], np.ndarray, np.ndarray]:
    """:func:`_score_groups`'s entry for a ranked group, through the pure function the learner's deferred ranking
    calls too (:func:`~r3_rllib.core.ranking.ranked_group_scores`)."""
    ranking, rewards, advantages = ranked_group_scores(
        [s.entropies for s in g.samples],
        shaped_rewards([replace(s, reward=0.0) for s in g.samples], settings.overlong),
        shaped_rewards(replayed, settings.overlong),
        p=settings.ranking_p,
        r_max=settings.ranking_r_max,
        estimator=settings.advantage_estimator,
        params=settings.advantage_params,
    )
    own = [replace(s, reward=float(r)) for s, r in zip(g.samples, ranking, strict=True)]
    return g, own + replayed, rewards, advantages


#: Rollout totals that combine by taking the larger value (the others add up).
_MAX_TOTALS = frozenset({"response_len_max"})


def merge_rollout_totals(*totals: dict[str, float]) -> dict[str, float]:
    """Combine the totals of several rollouts (``rollout.kinds.base.rollout_totals`` and each kind's own, from
    several EnvRunners and dynamic-sampling rounds; sums add, maxima take the larger)."""
    out: dict[str, float] = {}
    for t in totals:
        for k, v in t.items():
            out[k] = max(out.get(k, v), v) if k in _MAX_TOTALS else out.get(k, 0.0) + v
    return out


def rollout_means(totals: dict[str, float]) -> dict[str, float]:
    """The reported rollout metrics from merged totals (0 where nothing was sampled), the rollout kinds' own
    included (``rollout.kinds.kind_means``)."""
    return {
        "accuracy": ratio(totals, "correct", "samples"),
        "reward_mean": ratio(totals, "reward", "samples"),
        "response_len_mean": ratio(totals, "response_tokens", "samples"),
        "response_len_max": totals.get("response_len_max", 0.0),
        "truncated_frac": ratio(totals, "truncated", "samples"),
        "entropy_mean": ratio(totals, "entropy", "entropy_samples"),
        "zero_adv_frac_before": ratio(totals, "degenerate_groups", "groups"),
        "reflection_prompts": totals.get("reflection_groups", 0.0),
        "reflection_success": ratio(totals, "reflection_correct", "reflection_samples"),
        # Reflection prompts left out because they would not fit the model's context (envs.context).
        "reflection_dropped_too_long": totals.get("reflection_dropped_too_long", 0.0),
        **kind_means(totals),
    }


#: Estimator keyword (a registered ``sample_inputs`` name) -> the Sample field it reads, one value per member.
SAMPLE_INPUT_FIELDS: dict[str, str] = {
    "obs_keys": "obs_key",
    "traj_ids": "trajectory_id",
    "step_indices": "step_index",
    "outcomes": "correct",
    "baselines": "baseline_reward",
    "env_rewards": "env_reward",
    "reward_parts": "reward_parts",
}


def _sample_inputs(estimator: str, members: Sequence[Sample]) -> dict[str, list]:
    """The per-sample keys an estimator declared (none for most single-step estimators), from the group's
    members: a Sample field (:data:`SAMPLE_INPUT_FIELDS`) or a value read from the sample
    (:data:`BATCH_SAMPLE_INPUTS`: ``token_counts``)."""
    out = {}
    for name in ADVANTAGE_FNS.sample_inputs.get(estimator, ()):
        if name in SAMPLE_INPUT_FIELDS:
            out[name] = [getattr(s, SAMPLE_INPUT_FIELDS[name]) for s in members]
        elif name in BATCH_SAMPLE_INPUTS:
            out[name] = [BATCH_SAMPLE_INPUTS[name](s) for s in members]
        else:
            raise ValueError(
                f"advantage estimator {estimator!r} asks for sample input {name!r}; samples carry "
                f"{sorted([*SAMPLE_INPUT_FIELDS, *BATCH_SAMPLE_INPUTS])}"
            )
    return out


#: Batch-step keyword (a registered ``batch_sample_inputs`` name) -> how it is read from one sample.
BATCH_SAMPLE_INPUTS: dict[str, Callable[[Sample], Any]] = {"token_counts": lambda s: s.trained_tokens}
#: The batch-step keyword for the rewards the groups' advantages were computed from (shaped, ranked), aligned with
#: the concatenated advantages: given by the batch builder itself, not read from a sample.
BATCH_REWARDS = "rewards"


def _batch_sample_inputs(estimator: str, members: Sequence[Sample]) -> dict[str, np.ndarray]:
    """The per-sample sequences an estimator's batch step declared (e.g. each sample's trained tokens), aligned
    with the batch's concatenated advantages."""
    out = {}
    for name in ADVANTAGE_FNS.batch_sample_inputs.get(estimator, ()):
        if name == BATCH_REWARDS:
            continue
        if name not in BATCH_SAMPLE_INPUTS:
            raise ValueError(
                f"the batch step of {estimator!r} asks for {name!r}; the batch builder gives "
                f"{sorted([*BATCH_SAMPLE_INPUTS, BATCH_REWARDS])}"
            )
        out[name] = np.array([BATCH_SAMPLE_INPUTS[name](s) for s in members])
    return out


def _frac(flags) -> float:
    flags = list(flags)
    return float(np.mean(flags)) if flags else 0.0

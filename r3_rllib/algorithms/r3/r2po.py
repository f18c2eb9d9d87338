"""R^2PO inside the R3 algorithm: which stage an iteration is in and what each stage trains on (pure, no Ray).

R^2PO (residual rollout policy optimisation) samples every training rollout with a small residual head added to the
policy's logits (:mod:`r3_rllib.models.rollout_head`) and alternates two stages
(:mod:`r3_rllib.core.rollout_schedule`):

- stage A trains the head only, on the log-probs of the rollout distribution (head on), with the rarity reward
  (``rollout_head_advantage``) of the fresh groups' graded outcomes (``rollout_head_rarity_count``: the samples'
  correct flags, or their exact task rewards) and a k3 KL penalty toward the initial head-less model (or the
  current base; ``rollout_head_kl_coef``, :func:`stage_kl_term`). Replay and ranking are off: they reshape the base
  policy's task signal (past samples, graded failures), and with reward counting ranking's continuous rewards
  would make every reward distinct, which the rarity reward maps to zeros. Reflection groups (prompts of their own) stay in: rarity is
  defined within any group of G responses to one prompt. Every fresh sample of either stage enters the replay buffer
  with its behaviour (head-on) log-probs, so stage B's importance weight also covers replayed ones;
- stage B trains the base only, on base log-probs, with the configured task estimator (R^3's parts included) and
  groups whose reward range is below ``rollout_head_skip_range`` left out. The tokens were drawn with the head on,
  so the behaviour policy is not the trained one: ``rollout_head_stage_b_weight`` says whether the truncated
  importance weight ``min(pi_base_old / pi_rollout_behaviour, is_cap)`` corrects for it.

The skip rule is an advantage estimator wrapper (:func:`stage_b_advantages`, registered as
:data:`STAGE_B_ESTIMATOR`): a skipped group gets all-zero advantages, which the batch builder already leaves out
(or keeps for the KL term only, as for any zero-advantage group). It sees the group's rewards after replay and
ranking, so R^3 can still make a collapsed group informative in stage B.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from r3_rllib.algorithms.r3.iteration_settings import (
    FIRST_STAGES as FIRST_STAGES,  # the stage is a settings field now
)
from r3_rllib.algorithms.r3.iteration_settings import IterationSettings, estimator_settings
from r3_rllib.algorithms.r3.iteration_settings import iteration_stage as iteration_stage
from r3_rllib.core.advantages import compute_group_advantages, register_advantage
from r3_rllib.core.mismatch import RolloutCorrection, correction_from_config
from r3_rllib.core.rarity import skip_flat_group
from r3_rllib.core.rollout_schedule import BASE_STAGE, HEAD_STAGE, Stage

#: Values of ``rollout_head_stage_b_weight``.
STAGE_B_WEIGHTS = ("truncated_is", "none")
#: Internal estimator name of stage B's skip wrapper (refused as a user's ``advantage_estimator``).
STAGE_B_ESTIMATOR = "_r2po_stage_b"
#: ``r2po/stage`` metric values (metrics are numbers).
STAGE_CODES: dict[Stage, float] = {HEAD_STAGE: 0.0, BASE_STAGE: 1.0}


@register_advantage(STAGE_B_ESTIMATOR)
def stage_b_advantages(
    rewards: Sequence[float] | np.ndarray,
    *,
    base: str,
    base_params: dict[str, Any],
    min_range: float,
    **inputs: Any,
) -> np.ndarray:
    """Advantages of estimator ``base`` for one group, or all zeros when the group's rewards span less than
    ``min_range`` (:func:`r3_rllib.core.rarity.skip_flat_group`: the batch builder then leaves it out)."""
    r = np.asarray(rewards, dtype=np.float64)
    if skip_flat_group(r, min_range=min_range):
        return np.zeros(r.size, dtype=np.float64)
    return compute_group_advantages(base, r, **base_params, **inputs)


def stage_settings(settings: IterationSettings, stage: Stage | None, config: Any) -> IterationSettings:
    """The batch settings of an iteration in ``stage`` (``settings`` unchanged when ``stage`` is None).

    Stage A: the head's estimator on the fresh rewards, no replay, no ranking, no zero-advantage groups kept (the
    KL term regularises the base, which stage A does not train). Stage B: the task estimator behind the skip rule.
    """
    if stage is None:
        return settings
    if stage == HEAD_STAGE:
        name = config.rollout_head_advantage
        return dataclasses.replace(
            settings,
            stage=HEAD_STAGE,
            replay=False,
            ranking=False,
            **estimator_settings(name, config),
            keep_zero_advantage=False,
        )
    if stage == BASE_STAGE:
        return dataclasses.replace(
            settings,
            stage=BASE_STAGE,
            # The base's batch step (settings.batch_step) is kept: it runs on the wrapper's outputs, skipped groups
            # included as zeros.
            advantage_estimator=STAGE_B_ESTIMATOR,
            advantage_params={
                "base": settings.advantage_estimator,
                "base_params": dict(settings.advantage_params),
                "min_range": float(config.rollout_head_skip_range),
            },
        )
    raise ValueError(f"unknown R^2PO stage {stage!r}")


#: KL estimator of stage A's penalty: the reference code's k3, unclamped (see `stage_head_kl_coef`);
#: ``rollout_head_kl_clamp=True`` clamps it at 10 as verl's low_var_kl (`stage_head_kl_type`).
HEAD_KL_TYPE = "k3_unclamped"


def stage_head_kl_type(config: Any) -> str:
    """Stage A's KL estimator: the reference's unclamped k3, or with ``rollout_head_kl_clamp`` the k3 clamped to
    [-10, 10] (a token the head moved far from its target then adds 10 and no gradient)."""
    return "k3" if getattr(config, "rollout_head_kl_clamp", False) else HEAD_KL_TYPE


def stage_head_kl_coef(config: Any, stage: Stage | None) -> float:
    """The weight of stage A's KL(rollout || target) penalty in ``stage`` (0 outside stage A).

    Stage A adds ``rollout_head_kl_coef`` times the :data:`HEAD_KL_TYPE` estimate per token, ``exp(d) - d - 1`` with
    ``d = log pi_target - log pi_rollout`` on the sampled tokens, the target being the initial head-less model or
    the current base (:func:`stage_kl_term`): the head is trained to explore while its distribution stays near the
    target's. Stage B trains the base and has the ordinary KL to the reference model (``kl_coef``) instead."""
    return float(config.rollout_head_kl_coef) if stage == HEAD_STAGE else 0.0


@dataclasses.dataclass(frozen=True)
class KLTerm:
    """The KL term of an update: ``coef`` times the ``kind`` estimate of KL(trained || target) per token,
    aggregated with ``agg_mode``. ``target``: "reference", the frozen reference model's log-probs (the initial
    model, loaded from ``model_path``); "base", the current base policy's (head off), from the training forward."""

    coef: float  # 0: no KL term
    kind: str
    agg_mode: str
    target: str


def stage_kl_term(config: Any, stage: Stage | None) -> KLTerm:
    """The KL term of an update in ``stage``.

    Stage A (R^2PO): ``rollout_head_kl_coef`` toward ``rollout_head_kl_target``: 'initial' (default, the reference
    code's: its reference server serves the head-less model it was started with for the whole run) is the frozen
    reference model, 'current' the base as it is now (frozen in stage A, so its log-probs come exactly from the
    training forward, no second model). Aggregated per ``rollout_head_kl_agg_mode``: 'seq-mean-token-mean' (default,
    the reference code's loss is the mean over sequences of each one's token mean, KL included) or 'loss_agg_mode'
    (as the policy term). The reference model's own KL (``kl_coef``) is off in stage A: it would regularise a base
    that does not move. Other stages: ``kl_coef`` toward the reference model, aggregated as the policy term."""
    if stage == HEAD_STAGE:
        agg = getattr(config, "rollout_head_kl_agg_mode", "seq-mean-token-mean")
        target = getattr(config, "rollout_head_kl_target", "initial")
        return KLTerm(
            coef=stage_head_kl_coef(config, stage),
            kind=stage_head_kl_type(config),
            agg_mode=config.loss_agg_mode if agg == "loss_agg_mode" else agg,
            target="reference" if target == "initial" else "base",
        )
    return KLTerm(float(config.kl_coef), config.kl_type, config.loss_agg_mode, "reference")


def needs_reference_model(config: Any) -> bool:
    """Whether the learner holds a frozen reference model (a second copy of the policy's weights, or with LoRA the
    adapter-off base): only when a KL term of some stage compares with it (:func:`stage_kl_term`)."""
    stages = (None, HEAD_STAGE, BASE_STAGE) if getattr(config, "rollout_head", False) else (None,)
    return any((t := stage_kl_term(config, s)).coef > 0 and t.target == "reference" for s in stages)


def stage_is_cap(config: Any, stage: Stage | None) -> float | None:
    """The truncation of the behaviour importance weight in ``stage`` (None: no weight).

    Stage A (and plain training) follows ``off_policy_correction``: behaviour and trained distributions are both
    the rollout one, and the weight only corrects staleness. Stage B follows ``rollout_head_stage_b_weight``."""
    if stage == BASE_STAGE:
        return float(config.is_cap) if config.rollout_head_stage_b_weight == "truncated_is" else None
    return float(config.is_cap) if config.off_policy_correction else None


def stage_correction(config: Any, stage: Stage | None) -> RolloutCorrection:
    """The rollout correction of an update in ``stage``: the importance weight as :func:`stage_is_cap` says
    (truncated at ``is_cap``, at the config's ``rollout_is`` level), rejection and veto as the config's
    ``rollout_rs*`` fields say, in every stage."""
    return correction_from_config(config, weighted=stage_is_cap(config, stage) is not None)

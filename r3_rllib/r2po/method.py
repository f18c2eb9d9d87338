"""R^2PO as a training method (:mod:`r3_rllib.core.method`): which stage an iteration is in and what each stage
trains on (pure, no Ray).

R^2PO (residual rollout policy optimisation) samples every training rollout with a small residual head added to the
policy's logits (:mod:`r3_rllib.models.rollout_head`) and alternates two stages
(:mod:`r3_rllib.r2po.stages`):

- stage A trains the head only, on the log-probs of the rollout distribution (head on), with the rarity reward
  (``rollout_head_advantage``) of the fresh groups' graded outcomes (``rollout_head_rarity_count``: the samples'
  correct flags, or their exact task rewards) and a k3 KL penalty toward the initial head-less model (or the
  current base; ``rollout_head_kl_coef``, :func:`stage_kl_term`). Replay and ranking are off: they reshape the base
  policy's task signal (past samples, graded failures), and with reward counting ranking's continuous rewards
  would make every reward distinct, which the rarity reward maps to zeros. Reflection groups (prompts of their own) stay in: rarity is
  defined within any group of G responses to one prompt. Every fresh sample of either stage enters the replay buffer
  with its behaviour (head-on) log-probs, so stage B's importance weight also covers replayed ones. A distillation
  teacher (``distill_teacher``) adds nothing here: the teacher is distilled into the base, not the head
  (:mod:`r3_rllib.algorithms.r3.learner_distill`, which leaves a phase that scores the rollout logits alone);
- stage B trains the base only, on base log-probs, with the configured task estimator (R^3's parts included) and
  groups whose reward range is below ``rollout_head_skip_range`` left out. The tokens were drawn with the head on,
  so the behaviour policy is not the trained one: ``rollout_head_stage_b_weight`` says whether the truncated
  importance weight ``min(pi_base_old / pi_rollout_behaviour, is_cap)`` corrects for it. A distillation teacher's
  term trains the base here, with the base's proximal log-probs as the student's and the same weight.

Each stage is an :class:`R2POPhase`, the method :data:`R2PO` (selected by ``rollout_head=True``); the learner-side
pieces (the head's own learning rate, scoring with the head on, the ``r2po_kl`` and ``rollout_head_norm`` metrics)
are :class:`R2POLearnerExtras`.

The skip rule is an advantage estimator wrapper (:func:`stage_b_advantages`, registered as
:data:`STAGE_B_ESTIMATOR`): a skipped group gets all-zero advantages, which the batch builder already leaves out
(or keeps for the KL term only, as for any zero-advantage group). It sees the group's rewards after replay and
ranking, so R^3 can still make a collapsed group informative in stage B.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from r3_rllib.core.advantages import compute_group_advantages, register_advantage
from r3_rllib.core.iteration import IterationSettings, estimator_settings
from r3_rllib.core.method import (
    DEFAULT_PHASE,
    KLTerm,
    LearnerExtras,
    Method,
    TrainingPhase,
    config_kl_term,
)
from r3_rllib.core.metric_groups import log_group
from r3_rllib.r2po.rarity import skip_flat_group
from r3_rllib.r2po.stages import (
    BASE_STAGE,
    FIRST_STAGES,
    HEAD_STAGE,
    STAGES,
    Stage,
    active_stage,
    base_iterations,
)

if TYPE_CHECKING:
    import torch

    from r3_rllib.core.mismatch import RolloutCorrection

#: Values of ``rollout_head_stage_b_weight``.
STAGE_B_WEIGHTS = ("truncated_is", "none")
#: Internal estimator name of stage B's skip wrapper (refused as a user's ``advantage_estimator``).
STAGE_B_ESTIMATOR = "_r2po_stage_b"
#: ``r2po/stage`` metric values (metrics are numbers).
STAGE_CODES: dict[Stage, float] = {HEAD_STAGE: 0.0, BASE_STAGE: 1.0}
#: The learner metrics also logged under the stage they belong to (r2po/A/..., r2po/B/...).
STAGE_KEYS = ("loss", "pg_loss", "grad_norm", "entropy", "is_weight_mean", "clip_frac", "rollout_head_norm")


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
    ``min_range`` (:func:`r3_rllib.r2po.rarity.skip_flat_group`: the batch builder then leaves it out)."""
    r = np.asarray(rewards, dtype=np.float64)
    if skip_flat_group(r, min_range=min_range):
        return np.zeros(r.size, dtype=np.float64)
    return compute_group_advantages(base, r, **base_params, **inputs)


def iteration_stage(config: Any, iteration: int) -> Stage | None:
    """The R^2PO stage of 0-based training ``iteration`` (None when ``config.rollout_head`` is off). A function of
    the iteration count alone, so a restored run resumes in its stage."""
    if not config.rollout_head:
        return None
    return active_stage(
        iteration,
        head_iters=config.rollout_head_head_iters,
        base_iters=config.rollout_head_base_iters,
        first=FIRST_STAGES[config.rollout_head_first_stage],
    )


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
            phase=R2POPhase(HEAD_STAGE),
            replay=False,
            ranking=False,
            **estimator_settings(name, config),
            keep_zero_advantage=False,
        )
    if stage == BASE_STAGE:
        return dataclasses.replace(
            settings,
            phase=R2POPhase(BASE_STAGE),
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
    return config_kl_term(config)


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
    from r3_rllib.core.mismatch import correction_from_config

    return correction_from_config(config, weighted=stage_is_cap(config, stage) is not None)


# -- which part trains --------------------------------------------------------------------------------------------
def stage_parameters(model: torch.nn.Module, stage: Stage) -> list[torch.nn.Parameter]:
    """The parameters ``stage`` trains: the attached head's (``"A"``) or every other one (``"B"``, the base)."""
    from r3_rllib.models.rollout_head import get_rollout_head

    if stage not in STAGES:
        raise ValueError(
            f"stage must be one of {tuple(map(str, STAGES))} ({HEAD_STAGE}: head, {BASE_STAGE}: base), got {stage!r}"
        )
    head = get_rollout_head(model)
    if head is None:
        raise ValueError("the model has no rollout head attached (attach_rollout_head)")
    head_ids = {id(p) for p in head.parameters()}
    return [p for p in model.parameters() if (id(p) in head_ids) == (stage == HEAD_STAGE)]


def set_stage_trainable(model: torch.nn.Module, stage: Stage) -> tuple[int, int]:
    """Set ``requires_grad`` for ``stage``: ``"A"`` trains the head only, ``"B"`` the base policy only.

    Frozen parameters get no gradient, and torch optimizers skip parameters whose ``grad`` is None, so one optimizer
    over all parameters can serve both stages provided gradients are cleared with ``zero_grad(set_to_none=True)``
    (torch's default) between steps. Returns ``(trainable, frozen)`` parameter counts (elements).
    """
    on = {id(p) for p in stage_parameters(model, stage)}
    trainable = frozen = 0
    for p in model.parameters():  # tied weights appear once
        p.requires_grad_(id(p) in on)
        if id(p) in on:
            trainable += p.numel()
        else:
            frozen += p.numel()
    return trainable, frozen


# -- the method -----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class R2POPhase(TrainingPhase):
    """An R^2PO stage as a training phase: stage A trains the head on the rollout logits with its KL term and the
    rarity batch settings, stage B the base on the base logits behind the skip rule (see the module docstring)."""

    stage: Stage = HEAD_STAGE

    @property
    def scores_rollout_logits(self) -> bool:
        return self.stage == HEAD_STAGE

    def trainable(self, policy: torch.nn.Module) -> Iterable[torch.nn.Parameter] | None:
        from r3_rllib.models.rollout_head import get_rollout_head

        if get_rollout_head(policy) is None:
            raise ValueError(
                f"R^2PO stage {self.stage!r} given, but the policy has no rollout head (rollout_head=False)"
            )
        return stage_parameters(policy, self.stage)

    def kl_term(self, config: Any) -> KLTerm:
        return stage_kl_term(config, self.stage)

    def correction(self, config: Any) -> RolloutCorrection:
        return stage_correction(config, self.stage)

    def batch_settings(self, settings: IterationSettings, config: Any) -> IterationSettings:
        return stage_settings(settings, self.stage, config)

    def log_metrics(self, logger: Any, r3_metrics: dict, learner_metrics: dict) -> None:
        """The stage (0 = A, head; 1 = B, base) and the update's numbers under the stage they belong to, so a
        stage's curve is not averaged with the other's; the other stage's numbers are absent, not NaN."""
        per_stage = {"train_samples": r3_metrics.get("train_samples", 0.0)}
        zero_adv = r3_metrics.get("zero_adv_frac", math.nan)
        if not math.isnan(zero_adv):  # NaN: no fresh group scored; absent then, as rollout/zero_adv_frac
            per_stage["zero_adv_frac"] = zero_adv
        per_stage |= {key: learner_metrics[key] for key in STAGE_KEYS if key in learner_metrics}
        log_group(logger, "r2po", {"stage": STAGE_CODES[self.stage], str(self.stage): per_stage})


def param_groups(
    policy: torch.nn.Module, head: torch.nn.Module | None, head_lr: float | None
) -> list[dict[str, Any]]:
    """AdamW's parameter groups: the base's, and (with a head of its own learning rate) the head's."""
    if head is None or head_lr is None:  # frozen parameters (a LoRA policy's base) get no optimizer state
        return [{"params": [p for p in policy.parameters() if p.requires_grad]}]
    head_ids = {id(p) for p in head.parameters()}
    base = [p for p in policy.parameters() if id(p) not in head_ids]
    return [{"params": base}, {"params": list(head.parameters()), "lr": float(head_lr)}]


class R2POLearnerExtras(LearnerExtras):
    """R^2PO in the learner: the head's learning rate, scoring with the head on, the ``r2po_kl`` metric (stage A's
    KL term; ``kl`` stays the reference model's) and the head's norm after every update. ``head``: the attached
    head, after sharding (its parameters are then the ones the optimizer holds); None without one."""

    def __init__(self, head: torch.nn.Module | None, head_lr: float | None) -> None:
        self.head = head
        self.head_lr = head_lr

    def param_groups(self, policy: torch.nn.Module) -> list[dict[str, Any]]:
        return param_groups(policy, self.head, self.head_lr)

    def score_kwargs(self, rollout_logits: bool) -> dict[str, Any]:
        return {"rollout_head": self.head if rollout_logits else None}

    @property
    def has_rollout_logits(self) -> bool:
        return self.head is not None

    def pass_metrics(self, metrics: dict[str, Any], phase: TrainingPhase) -> None:
        if self.head is None:
            return
        import torch

        head_kl = getattr(phase, "stage", None) == HEAD_STAGE
        metrics["r2po_kl"] = metrics.pop("kl") if head_kl else torch.zeros(())
        metrics.setdefault("kl", torch.zeros(()))

    def update_metrics(self, global_sum: Callable[[Iterable[Any]], float]) -> dict[str, float]:
        """``rollout_head_norm``: the L2 norm of the head's parameters (collective)."""
        if self.head is None:
            return {}
        # A DTensor's local shard (FSDP2); global_sum adds the other ranks' parts.
        local = (p.to_local() if hasattr(p, "to_local") else p for p in self.head.parameters())
        return {
            "rollout_head_norm": math.sqrt(global_sum(t.detach().double().pow(2).sum().cpu() for t in local))
        }


class R2POMethod(Method):
    """R^2PO (selected by ``rollout_head=True``): stages A and B in turns (:func:`iteration_stage`)."""

    name = "r2po"

    def applies(self, config: Any) -> bool:
        return bool(getattr(config, "rollout_head", False))

    def phase(self, config: Any, iteration: int) -> TrainingPhase:
        return R2POPhase(iteration_stage(config, iteration))

    def policy_updates(self, config: Any, iterations: int) -> int:
        """The base's updates (stage B's iterations): the lr shape warms up and decays the base policy's rate, and a
        head without a rollout_head_lr of its own follows it."""
        return base_iterations(
            iterations,
            head_iters=config.rollout_head_head_iters,
            base_iters=config.rollout_head_base_iters,
            first=FIRST_STAGES[config.rollout_head_first_stage],
        )

    def phases(self, config: Any) -> tuple[TrainingPhase, ...]:
        return (DEFAULT_PHASE, R2POPhase(HEAD_STAGE), R2POPhase(BASE_STAGE))

    def learner_extras(self, policy: torch.nn.Module, config: Any) -> LearnerExtras:
        from r3_rllib.models.rollout_head import get_rollout_head

        return R2POLearnerExtras(get_rollout_head(policy), getattr(config, "rollout_head_lr", None))

    def sync_before_first_rollout(self, config: Any) -> bool:
        """The learner's head (its init_std, its seed) is the one runners must sample with."""
        return True

    def check_step_info(self, config: Any, env_name: str, info: dict) -> None:
        """The rarity reward counting outcomes needs every ``step`` to report ``info['correct']``."""
        counts_outcomes = (
            config.rollout_head_advantage == "rarity" and config.rollout_head_rarity_count == "outcome"
        )
        if "correct" not in info and counts_outcomes:
            raise ValueError(
                f"{env_name}.step() reports no info['correct']: R^2PO's rarity reward "
                "(rollout_head_rarity_count='outcome') counts the graded outcome; report it, or set "
                "rollout_head_rarity_count='reward' for an env whose reward values are its outcomes"
            )


#: The R^2PO method (``METHODS["r2po"]``).
R2PO = R2POMethod()

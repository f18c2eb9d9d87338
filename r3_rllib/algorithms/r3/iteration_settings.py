"""`IterationSettings`: everything one iteration reads from the config, frozen, built by one function.

The config is the user's description of the whole run; an iteration needs a narrower, settled view: which R^3 parts
are on *now* (after their start epochs), the advantage estimator with the parameters it declared
(:mod:`r3_rllib.core.registry`), and the reflection settings the EnvRunners render prompts with. Building that view
in one place (:func:`iteration_settings`) keeps the loop free of per-field plumbing: a new estimator or R^3 option
adds a field here and nothing in ``training_step``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from r3_rllib.core.advantages import ADVANTAGE_FNS, has_batch_step
from r3_rllib.core.reflection import DEFAULT_REFLECTION_TEMPLATE, ReflectionSettings
from r3_rllib.core.reward_shaping import OverlongShaping
from r3_rllib.core.rollout_schedule import BASE_STAGE, HEAD_STAGE, Stage, active_stage

#: Config value of ``rollout_head_first_stage`` -> the schedule's stage.
FIRST_STAGES: dict[str, Stage] = {"head": HEAD_STAGE, "base": BASE_STAGE}


@dataclass(frozen=True)
class IterationSettings:
    """The settled settings of one iteration (see :func:`iteration_settings`)."""

    replay: bool = False
    """Cross-context replay is on: collapsed fresh groups ask the replay actor for ``replay_k`` past samples."""
    replay_k: int = 2
    ranking: bool = False
    """Structural-entropy ranking rewards for all-wrong groups."""
    ranking_p: float = 0.1
    ranking_r_max: float = 0.5
    reflection: ReflectionSettings | None = None
    """How the runners add reflection prompts; None while reflection is off."""
    advantage_estimator: str = "grpo"
    advantage_params: dict[str, Any] = field(default_factory=dict)
    """The keyword arguments the estimator declared it reads from the config."""
    batch_step: str | None = None
    """The estimator whose batch step (e.g. REINFORCE++'s token whitening) the batch builder applies after the per-group
    pass: the estimator's own name, kept as the base's under R^2PO's stage-B wrapper; None: no batch step."""
    batch_step_params: dict[str, Any] = field(default_factory=dict)
    """The keyword arguments the batch step declared it reads from the config."""
    keep_zero_advantage: bool = False
    """Keep groups whose advantages are all zero in the batch (set when kl_coef > 0: they add KL, no policy
    gradient; see groups.py)."""
    overlong: OverlongShaping | None = None
    """DAPO's soft overlong penalty added to every trained sample's reward before advantages; None while off."""
    stage: Stage | None = None
    """The R^2PO stage of the iteration (what the learner trains: head or base); None without a rollout head."""

    @property
    def active_parts(self) -> tuple[str, ...]:
        """The R^3 parts on in this iteration, in the paper's order (for logs and benchmarks)."""
        on = {"replay": self.replay, "reflection": self.reflection is not None, "ranking": self.ranking}
        return tuple(name for name, active in on.items() if active)


def iteration_settings(
    config: Any, *, dataset_epoch: int, policy_version: int, iteration: int | None = None
) -> IterationSettings:
    """The settings of an iteration that samples in data epoch ``dataset_epoch`` with policy ``policy_version``.

    ``config`` is an :class:`~r3_rllib.algorithms.r3.config.R3Config` (any object with its fields). A part is on
    when its switch is set and ``dataset_epoch`` has reached its ``*_start_epoch``. ``iteration`` (0-based) sets
    the R^2PO stage (:func:`iteration_stage`); None leaves it unset."""
    reflection = None
    if config.reflection and dataset_epoch >= config.reflection_start_epoch:
        reflection = ReflectionSettings(
            tau=config.reflection_tau,
            hardness=config.reflection_hardness,
            guidance=config.reflection_guidance,
            template=config.reflection_template or DEFAULT_REFLECTION_TEMPLATE,
            max_per_batch=config.reflection_max_per_batch,
            max_answer_chars=config.reflection_max_answer_chars,
            policy_version=policy_version,
        )
    return IterationSettings(
        replay=bool(config.replay) and dataset_epoch >= config.replay_start_epoch,
        replay_k=config.replay_k,
        ranking=bool(config.ranking) and dataset_epoch >= config.ranking_start_epoch,
        ranking_p=config.ranking_p,
        ranking_r_max=config.ranking_r_max,
        reflection=reflection,
        # Each estimator declares the config fields it reads (core/registry.py): no per-estimator branch here.
        **estimator_settings(config.advantage_estimator, config),
        keep_zero_advantage=config.kl_coef > 0,
        overlong=overlong_shaping(config),
        stage=iteration_stage(config, iteration) if iteration is not None else None,
    )


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


def estimator_settings(name: str, config: Any) -> dict[str, Any]:
    """The :class:`IterationSettings` fields of advantage estimator ``name``: its name, the parameters it declared,
    and its batch step (if it declares one) with that step's parameters."""
    step = name if has_batch_step(name) else None
    return {
        "advantage_estimator": name,
        "advantage_params": ADVANTAGE_FNS.params_from(name, config),
        "batch_step": step,
        "batch_step_params": ADVANTAGE_FNS.batch_params_from(name, config) if step else {},
    }


def overlong_shaping(config: Any) -> OverlongShaping | None:
    """The config's overlong penalty (None while ``overlong_shaping`` is off). The buffer defaults to a fifth of the
    response budget, DAPO's 4,096 of 20,480 tokens."""
    if not getattr(config, "overlong_shaping", False):
        return None
    buffer = config.overlong_buffer_len
    if buffer is None:
        buffer = max(1, config.max_new_tokens // 5)
    return OverlongShaping(
        max_length=int(config.max_new_tokens),
        buffer_length=int(buffer),
        penalty_factor=float(config.overlong_penalty_factor),
    )


def max_staleness_of(config: Any) -> int:
    """The staleness bound in effect: ``max_staleness``, or 1 with ``overlap_generation`` and 0 without."""
    if config.max_staleness is not None:
        return int(config.max_staleness)
    return 1 if config.overlap_generation else 0

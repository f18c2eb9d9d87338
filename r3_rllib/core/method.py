"""Training methods: what a method changes in an iteration, as one object per training phase (pure, no Ray).

A *method* (the GRPO family by default; R^2PO, :mod:`r3_rllib.r2po`) decides, for each training iteration, a
:class:`TrainingPhase`: which parameters train, whether the learner scores the rollout logits or the base ones, the
KL term, the rollout correction, the batch settings and the metrics the driver logs. The phase travels in
:class:`~r3_rllib.core.iteration.IterationSettings` from the driver to the learners (frozen and picklable), so the
loop, the learner and the runners call these methods and never name a method.

Beside its phases a method supplies what lives for the whole run (:class:`Method`): the learner-side pieces
(:class:`LearnerExtras`: optimizer parameter groups, scoring arguments, per-update metrics), whether the runners
need the learner's weights before the first rollout, and a check of what an env's ``step`` reports.

Methods are chosen from the config (:func:`method_for`): every method of :data:`METHODS` (built in, registered with
:func:`register_method`, or declared by an installed package in the entry-point group ``r3_rllib.methods``) says
whether the config selects it (:meth:`Method.applies`); none selected means the default method.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from r3_rllib.core.objects import load_object
from r3_rllib.core.schedules import policy_updates

if TYPE_CHECKING:
    import torch

    from r3_rllib.core.iteration import IterationSettings
    from r3_rllib.core.mismatch import RolloutCorrection


@dataclass(frozen=True)
class KLTerm:
    """The KL term of an update: ``coef`` times the ``kind`` estimate of KL(trained || target) per token,
    aggregated with ``agg_mode``. ``target``: "reference", the frozen reference model's log-probs (the initial
    model, loaded from ``model_path``); "base", the current base policy's (the rollout logits' extra part off), from
    the training forward."""

    coef: float  # 0: no KL term
    kind: str
    agg_mode: str
    target: str


def config_kl_term(config: Any) -> KLTerm:
    """The config's KL term: ``kl_coef`` toward the reference model, aggregated as the policy term."""
    return KLTerm(float(config.kl_coef), config.kl_type, config.loss_agg_mode, "reference")


@dataclass(frozen=True)
class TrainingPhase:
    """One phase of a method: the GRPO family's (every parameter trainable at build trains, on the base logits,
    with the config's KL term and correction and the iteration's batch settings; no metrics of its own). A method
    with phases of its own subclasses it (frozen dataclasses: they are sent to the learner processes)."""

    @property
    def scores_rollout_logits(self) -> bool:
        """Whether the learner scores the rollout logits (those the runners sample from) instead of the base ones
        (the same logits unless the method adds to them: :attr:`LearnerExtras.has_rollout_logits`)."""
        return False

    @property
    def distills(self) -> bool:
        """Whether an on-policy teacher's term trains this phase's update: not where the rollout logits are scored
        (R^2PO's stage A trains the head alone), since the teacher is distilled into the base logits, the policy
        that is evaluated and exported (``r3_rllib.algorithms.r3.learner_distill``)."""
        return not self.scores_rollout_logits

    def trainable(self, policy: torch.nn.Module) -> Iterable[torch.nn.Parameter] | None:
        """The parameters of ``policy`` this phase trains; None: those trainable when the learner was built."""
        return None

    def kl_term(self, config: Any) -> KLTerm:
        """The phase's KL term (:func:`config_kl_term` by default)."""
        return config_kl_term(config)

    def entropy_coef(self, config: Any) -> float:
        """The weight of the phase's entropy bonus: ``entropy_coef`` where the base logits are trained, 0 where the
        rollout logits are scored (R^2PO's stage A trains the head alone; the bonus, like ``kl_coef``, regularises
        the policy, whose base does not move there)."""
        return 0.0 if self.scores_rollout_logits else float(getattr(config, "entropy_coef", 0.0))

    def correction(self, config: Any) -> RolloutCorrection:
        """The rollout correction of the phase's updates: the importance weight when ``off_policy_correction`` is
        on, rejection and veto as configured (:func:`~r3_rllib.core.mismatch.correction_from_config`)."""
        from r3_rllib.core.mismatch import correction_from_config

        return correction_from_config(config, weighted=bool(config.off_policy_correction))

    def batch_settings(self, settings: IterationSettings, config: Any) -> IterationSettings:
        """The settings the phase's batch is built with, from the iteration's (unchanged by default)."""
        return settings

    def log_metrics(self, logger: Any, r3_metrics: dict, learner_metrics: dict) -> None:
        """Log the phase's own metrics with ``logger`` (RLlib's MetricsLogger: ``log_value``, ``log_dict``) from
        the iteration's batch (``r3_metrics``) and update (``learner_metrics``) metrics; nothing by default. A key
        some iterations do not log comes back NaN in them: log such a group with
        :func:`~r3_rllib.core.metric_groups.log_group` (absent there instead)."""


#: The default method's phase.
DEFAULT_PHASE = TrainingPhase()


class LearnerExtras:
    """What a method adds to the learner for the whole run (nothing by default). Built by
    :meth:`Method.learner_extras` once the policy is placed (sharded parameters included)."""

    def param_groups(self, policy: torch.nn.Module) -> list[dict[str, Any]]:
        """AdamW's parameter groups: the policy's trainable parameters (a LoRA policy's frozen base gets no
        optimizer state)."""
        return [{"params": [p for p in policy.parameters() if p.requires_grad]}]

    def score_kwargs(self, rollout_logits: bool) -> dict[str, Any]:
        """Keyword arguments of :func:`~r3_rllib.core.logprobs.token_logprobs` that score the rollout logits
        (``rollout_logits``) or the base ones; none by default (the base logits are the rollout logits)."""
        return {}

    @property
    def has_rollout_logits(self) -> bool:
        """Whether the rollout logits differ from the base ones (then entropies are scored on the rollout ones)."""
        return False

    def pass_metrics(self, metrics: dict[str, Any], phase: TrainingPhase) -> None:
        """Rename or add entries of one forward/backward pass's ``metrics`` (the same keys in every pass)."""

    def update_metrics(self, global_sum: Callable[[Iterable[Any]], float]) -> dict[str, float]:
        """Metrics added to every update's (``global_sum``: a collective sum of per-rank tensor parts)."""
        return {}


class Method:
    """A training method (see the module docstring). The default one is the GRPO family's: one phase."""

    name = "default"

    def applies(self, config: Any) -> bool:
        """Whether ``config`` selects this method (the default method is the one chosen when none applies)."""
        return False

    def phase(self, config: Any, iteration: int) -> TrainingPhase:
        """The phase of 0-based training ``iteration`` (a function of the iteration alone: a restored run resumes
        in its phase)."""
        return DEFAULT_PHASE

    def phases(self, config: Any) -> tuple[TrainingPhase, ...]:
        """Every phase an update of this method may be in (the default phase included: an update given none)."""
        return (DEFAULT_PHASE,)

    def policy_updates(self, config: Any, iterations: int) -> int:
        """How many of the run's first ``iterations`` iterations updated the policy: what lr_scheduler_type's
        warm-up and decay count (core/schedules.py). All of them, but PPO's critic warm-up's."""
        return policy_updates(iterations, int(getattr(config, "critic_warmup", 0)))

    def needs_reference_model(self, config: Any) -> bool:
        """Whether the learner holds a frozen reference model: when a KL term of some phase compares with it, or
        the rewards carry a KL penalty to it (``use_kl_in_reward``)."""
        terms = (phase.kl_term(config) for phase in self.phases(config))
        in_reward = bool(getattr(config, "use_kl_in_reward", False))
        return in_reward or any(t.coef > 0 and t.target == "reference" for t in terms)

    def learner_extras(self, policy: torch.nn.Module, config: Any) -> LearnerExtras:
        """The learner-side pieces of the method for ``policy`` (built and placed)."""
        return LearnerExtras()

    def sync_before_first_rollout(self, config: Any) -> bool:
        """Whether the runners get the learner's weights before the first rollout (they start from the same
        checkpoint as the learner otherwise, so by default they need not)."""
        return False

    def check_step_info(self, config: Any, env_name: str, info: dict) -> None:
        """Raise a ValueError when an env's ``step`` ``info`` lacks what the method reads (nothing by default)."""


DEFAULT_METHOD = Method()

#: Method name -> the method, or the ``"module:attribute"`` path of it (imported on first use, in whichever process
#: asks). Installed packages add methods through the entry-point group ``r3_rllib.methods``.
METHODS: dict[str, Method | str] = {"r2po": "r3_rllib.r2po.method:R2PO"}


def register_method(name: str, method: Method | str) -> None:
    """Add ``method`` (or its ``"module:attribute"`` path) to :data:`METHODS` under ``name``."""
    METHODS[name] = method


@functools.cache
def _declared_methods() -> dict[str, str]:
    """The methods installed packages declare (entry-point group ``r3_rllib.methods``), read once per process:
    reading the installed packages' metadata took ~19 ms, and the loop asks for the method every iteration."""
    return {ep.name: ep.value for ep in entry_points(group="r3_rllib.methods")}


def _methods() -> dict[str, Method]:
    found = {**_declared_methods(), **METHODS}
    return {n: load_object(m, what="method") if isinstance(m, str) else m for n, m in found.items()}


def method_for(config: Any) -> Method:
    """The method ``config`` selects: the one of :data:`METHODS` (and the entry points) whose ``applies(config)``
    holds, else :data:`DEFAULT_METHOD`; a ValueError when several apply."""
    chosen = {name: m for name, m in _methods().items() if m.applies(config)}
    if len(chosen) > 1:
        raise ValueError(f"the config selects several training methods: {sorted(chosen)}")
    return next(iter(chosen.values()), DEFAULT_METHOD)

"""Driver-side stages that score a rollout's groups after the runners return them and before the batch is built:
the reward server (reward models and judges, ``r3_rllib.reward_models.server``) and the on-policy distillation teacher
(``r3_rllib.distill``).

A stage works in two steps so its actors grade while the runners generate: :meth:`RolloutStage.submit` sends the
groups off without waiting; :meth:`RolloutStage.resolve` waits for the answers and returns the groups with them
applied. The coordinators call both once per rollout (``RolloutCoordinator.score``): with overlap_generation or
streaming the runners were already asked for the next rollout, so generation never waits on grading. Every stage is
submitted before the first is resolved; each stage's answers are applied to the groups the previous stage returned
(stages change sample fields, never the groups' structure). A stage whose answers the update will not use is not
called at all (:meth:`RolloutStage.needed_in`: the teacher in R^2PO's stage A, which trains the rollout head alone):
the coordinators score each rollout in the iteration that trains it, so its training phase is known.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from r3_rllib.core.method import TrainingPhase
from r3_rllib.types.samples import Group


class RolloutStage(Protocol):
    """One driver-side scoring stage (see the module docstring)."""

    name: str
    """The metrics' prefix (``<name>/<metric>``)."""

    def needed_in(self, phase: TrainingPhase | None) -> bool:
        """Whether an update in ``phase`` (None: the method has no phases) uses what this stage attaches."""

    def submit(self, groups: Sequence[Group]) -> Any:
        """Send ``groups`` to the stage's actors without waiting; return what :meth:`resolve` needs."""

    def resolve(self, pending: Any, groups: Sequence[Group]) -> tuple[list[Group], dict[str, float]]:
        """Wait for the answers to ``pending`` and return ``groups`` (the submitted ones, as earlier stages left
        them: same groups and samples in the same order) with them applied, and the stage's metrics."""

    def stop(self) -> None:
        """Release the stage's actors."""


def apply_stages(
    stages: Sequence[RolloutStage],
    groups: Sequence[Group],
    log: Callable[[str, str, float], None],
    phase: TrainingPhase | None = None,
) -> list[Group]:
    """``groups`` through every stage an update in ``phase`` needs: all submitted first, then resolved in order;
    ``log(stage, metric, value)`` receives each stage's metrics, and ``skipped`` (1 for a stage not needed, which
    is not called, else 0)."""
    if not stages or not groups:
        return list(groups)
    needed = [stage.needed_in(phase) for stage in stages]
    for stage, need in zip(stages, needed, strict=True):
        log(stage.name, "skipped", 0.0 if need else 1.0)
    stages = [stage for stage, need in zip(stages, needed, strict=True) if need]
    pending = [stage.submit(groups) for stage in stages]
    out = list(groups)
    for stage, ticket in zip(stages, pending, strict=True):
        scored, metrics = stage.resolve(ticket, out)
        if len(scored) != len(out):
            raise RuntimeError(f"rollout stage {stage.name!r} returned {len(scored)} groups for {len(out)}")
        out = scored
        for key, value in metrics.items():
            log(stage.name, key, value)
    return out


def build_rollout_stages(config: Any) -> list[RolloutStage]:
    """The stages ``config`` asks for, in the order they apply: the reward server (``reward_models``), then the
    distillation teacher (``distill_teacher``). None by default."""
    stages: list[RolloutStage] = []
    if getattr(config, "reward_models", None):
        from r3_rllib.reward_models.server import RewardServer

        stages.append(RewardServer.from_config(config))
    if getattr(config, "distill_teacher", None):
        from r3_rllib.distill.teacher import TeacherStage

        stages.append(TeacherStage.from_config(config))
    return stages

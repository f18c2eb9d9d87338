"""A toy training method from outside the package (tests/unit/algorithms/test_method_plugin.py): its own two-phase
schedule, phase 1 training the token embeddings only and phase 2 every parameter, with a metric of its own.

Attaching it takes this folder, one registration line (``register_method("toy", "toy_method:TOY")``, or an entry
point in ``r3_rllib.methods``) and the config field that selects it (``toy_schedule``; a method in the package would
add it to ``config/settings.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from r3_rllib.core.method import LearnerExtras, Method, TrainingPhase

#: Iterations of phase 1 (embeddings only) before phase 2 (everything), per cycle.
EMBEDDING_ITERS = 1
CYCLE = 2


@dataclass(frozen=True)
class ToyPhase(TrainingPhase):
    """Phase 1: only the input embeddings train; phase 2: every parameter."""

    number: int = 1

    def trainable(self, policy):
        return list(policy.get_input_embeddings().parameters()) if self.number == 1 else None

    def log_metrics(self, logger: Any, r3_metrics: dict, learner_metrics: dict) -> None:
        logger.log_value(("toy", "phase"), float(self.number), reduce="mean", window=1)


class ToyExtras(LearnerExtras):
    """Reports the embeddings' L2 norm after every update."""

    def __init__(self, policy) -> None:
        self.embeddings = policy.get_input_embeddings()

    def update_metrics(self, global_sum) -> dict[str, float]:
        sq = global_sum(p.detach().double().pow(2).sum().cpu() for p in self.embeddings.parameters())
        return {"toy_embedding_norm": sq**0.5}


class ToyMethod(Method):
    name = "toy"

    def applies(self, config: Any) -> bool:
        return bool(getattr(config, "toy_schedule", False))

    def phase(self, config: Any, iteration: int) -> TrainingPhase:
        return ToyPhase(1 if iteration % CYCLE < EMBEDDING_ITERS else 2)

    def phases(self, config: Any) -> tuple[TrainingPhase, ...]:
        return (ToyPhase(1), ToyPhase(2))

    def learner_extras(self, policy, config: Any) -> LearnerExtras:
        return ToyExtras(policy)


TOY = ToyMethod()

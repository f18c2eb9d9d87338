"""Partial rollouts: runners take new weights between decoding steps instead of after their rollout.

With ``partial_rollouts`` (and ``max_staleness`` >= 1) the driver publishes each new version on a
:class:`WeightBoard` actor as well as queueing its load behind the runners' requests; a runner's engine asks the
board between decoding steps (:class:`NewerWeightsPuller`, every ``between_steps_every`` steps) and, when a newer
version is there, loads it and goes on with the same responses: the tokens before and after carry their versions
(``Completion.token_versions``), and a sample's ``policy_version`` is its oldest token's, so the staleness bound and
the off-policy correction see the oldest weights a response was sampled with. The queued load of a version already
pulled is then skipped (``update_weights(..., only_if_newer=True)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray


@ray.remote(num_cpus=0)
class WeightBoard:
    """The newest policy version and the object-store reference of its weights."""

    def __init__(self) -> None:
        self._version = 0
        self._weights: list[Any] = []

    def publish(self, version: int, weights: list[Any]) -> None:
        """Post ``weights`` (a one-element list, so that Ray passes the ObjectRef itself, unresolved)."""
        if version > self._version:
            self._version, self._weights = int(version), list(weights)

    def newer_than(self, version: int) -> tuple[int, list[Any]] | None:
        """(version, [weights ref]) when the board holds a version newer than ``version``, else None."""
        return (self._version, self._weights) if self._version > version and self._weights else None


class NewerWeightsPuller:
    """An engine's ``between_steps`` hook: load the board's weights when they are newer than the engine's."""

    def __init__(self, board, load: Callable[[Any, int], Any], current_version: Callable[[], int]) -> None:
        self.board, self.load, self.current_version = board, load, current_version
        self.pulls = 0

    def __call__(self) -> None:
        found = ray.get(self.board.newer_than.remote(self.current_version()))
        if found is not None:
            version, (weights_ref,) = found
            self.load(weights_ref, version)
            self.pulls += 1

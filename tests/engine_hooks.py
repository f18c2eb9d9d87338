"""Partial-rollout hooks for engine tests: load weights between decoding steps of one generate call."""

from __future__ import annotations


def load_weights_at_first_hook(engine, state: dict, version: int, every: int = 4) -> list[int]:
    """Set ``engine.between_steps`` to load ``state`` as ``version`` the first time it runs (after ``every``
    decoding steps); returns the list of the versions the hook saw, filled in as it runs."""
    seen: list[int] = []

    def hook():
        seen.append(engine.version)
        if len(seen) == 1:
            engine.update_weights(state.items(), version)

    engine.between_steps, engine.between_steps_every = hook, every
    return seen

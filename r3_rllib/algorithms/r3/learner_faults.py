"""A learner process that died, named as such.

With ``num_learners >= 2`` the learners run collectives (FSDP2 all-gathers, gradient all-reduces over gloo or
NCCL). When one learner process dies (killed for memory, a node gone), the update call of the others fails inside a
collective ("Connection reset by peer" from gloo), and that traceback says nothing about a learner dying; a restart
would not help either: the survivors' process group is broken. :func:`learner_death_error` reads the update's
per-learner results (RLlib's ``RemoteCallResults``: a dead actor answers with a ``RayActorError``, a learner whose
code raised with a ``RayTaskError``) and gives the error to raise instead: which rank died, why, and how to resume
from the last checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ray

#: How to go on after a learner died: the run's last checkpoint holds the learners' shards and every other state.
RESUME_HINT = (
    "resume from the last checkpoint: `r3 train <config> --resume` (the experiment of the same name), or "
    "`R3.from_checkpoint(path)` in Python (the algorithm rebuilt from the config saved in the checkpoint), or "
    "`algo.restore(path)` into an algorithm built from the run's config"
)


class LearnerDiedError(RuntimeError):
    """Learner rank(s) ``ranks`` died during an update; ``reason`` is the first one's error (``"Type: message"``)."""

    def __init__(self, ranks: tuple[int, ...], reason: str, num_learners: int) -> None:
        self.ranks = tuple(int(r) for r in ranks)
        self.reason = str(reason)
        self.num_learners = int(num_learners)
        which = ", ".join(map(str, self.ranks))
        super().__init__(
            f"learner rank {which} died ({self.reason}) during the update; the other learners' collectives fail "
            f"without it (num_learners={self.num_learners}), so the run stops here. To go on, {RESUME_HINT}"
        )

    def __reduce__(self):
        # Crosses process boundaries (Tune trial -> driver): rebuilt from its fields.
        return (type(self), (self.ranks, self.reason, self.num_learners))


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


def dead_learner_ranks(results: Iterable[Any]) -> dict[int, BaseException]:
    """Rank -> error of the learners whose process died, from the ``RemoteCallResults`` of a call on every learner
    (the actor id of RLlib's actor manager is the learner's rank: the order Ray Train gave the workers)."""
    dead = {}
    for result in results:
        if result.ok:
            continue
        err = result.get()
        # A RayTaskError is code that raised inside a live learner (a collective that lost its peer, too).
        if isinstance(err, ray.exceptions.RayActorError) and not isinstance(err, ray.exceptions.RayTaskError):
            dead[int(result.actor_id)] = err
    return dead


def learner_death_error(
    results: Iterable[Any], num_learners: int
) -> tuple[LearnerDiedError, BaseException] | None:
    """(the error to raise, the dead learner's own error) when a learner died during the call whose per-learner
    ``results`` are given; None when every learner is alive (then the call's own error is the one to raise)."""
    dead = dead_learner_ranks(results)
    if not dead:
        return None
    first = min(dead)
    return LearnerDiedError(tuple(sorted(dead)), _first_line(dead[first]), num_learners), dead[first]

"""How the driver reaches its learners through RLlib's ``LearnerGroup``: what it hands them, what it gets back.

- :func:`to_learners`: a value every learner reads (a training batch): the object itself for a learner in the
  driver's process, which would otherwise copy it into Ray's object store and read it back within the same process
  (the shipped tiny model's learner phase went 85.5 -> 76.5 ms, median of six runs: BENCHMARKS.md section 40); an
  ObjectRef, put once, for remote learners, which each fetch it from the store;
- :func:`all_results` / :func:`first_result`: the values of a ``foreach_learner`` call, raising the first failure;
- :func:`collective_results`: ``foreach_learner`` for a call in which the learners run collectives together (an
  update), which returns as soon as one learner's call failed: the others then wait in a collective for it;
- :func:`stop_stuck_learners`: at shutdown, the learner processes of a group left so, stopped without the graceful
  process-group teardown that would wait for them.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import ray

#: How long each wait of :func:`collective_results` lasts before it looks for a failed learner again.
FAIL_FAST_POLL_S = 1.0
_call_tags = itertools.count()
#: Learner groups a collective call left with learners blocked in a collective (their partner failed).
_stuck_groups: weakref.WeakSet = weakref.WeakSet()


def to_learners(learner_group: Any, value: Any) -> Any:
    """``value`` as the learners of ``learner_group`` take it: itself when the group is local, else its ObjectRef.
    Learner methods accept either (``learner._fetched``)."""
    return value if learner_group.is_local else ray.put(value)


def all_results(results: Any) -> list[Any]:
    """The value of every learner's call, in rank order; the first failed call's error raised."""
    out = []
    for r in results:
        if not r.ok:
            raise r.get()
        out.append(r.get())
    return out


def first_result(results: Any) -> Any:
    """Rank 0's value: what the driver reads of a call every rank makes together (an update, a save)."""
    return all_results(results)[0]


def collective_results(learner_group: Any, func: Any, *, poll_s: float = FAIL_FAST_POLL_S) -> list[Any]:
    """``learner_group.foreach_learner(func)`` for a call whose learners run collectives together: the per-learner
    results (RLlib's ``ResultOrError``, rank order) once every call has returned, or as soon as one has failed while
    others still run, the results so far. Those others are waiting in a collective (an all-gather, a gradient
    all-reduce) for the learner that failed, and would hold the call until the process group's timeout (Ray Train's
    30 minutes) with the failure unseen; the run stops on it (the group is broken). Each call gets a tag of its own,
    so a later call never reads an earlier one's stuck results."""
    if learner_group.is_local:
        return list(learner_group.foreach_learner(func))
    manager = learner_group._worker_manager
    tag = f"r3_collective_{next(_call_tags)}"
    fired = manager.foreach_actor_async(func, tag=tag)
    if fired < len(learner_group):
        raise RuntimeError(
            f"{len(learner_group) - fired} of {len(learner_group)} learners could not be called (marked unhealthy "
            "after an earlier failure, or busy with earlier calls); the others would wait for them in a collective"
        )
    results: list[Any] = []
    while len(results) < fired:
        results += list(manager.fetch_ready_async_reqs(tags=tag, timeout_seconds=poll_s))
        if len(results) < fired and any(not r.ok for r in results):
            _stuck_groups.add(
                learner_group
            )  # the others wait for it: :func:`stop_stuck_learners` at shutdown
            break
    return sorted(results, key=lambda r: r.actor_id)


def stop_stuck_learners(learner_group: Any) -> bool:
    """Stop the learner processes of ``learner_group`` now if a :func:`collective_results` call left some of them
    blocked in a collective; True if it did. ``LearnerGroup.shutdown`` would first ask every learner to tear its
    process group down and wait for the blocked ones (Ray Train's 30-s timeout: ``algo.stop()`` took 30.7 s after one
    learner's update failed, 0.4-0.6 s with this; BENCHMARKS.md section 54); the group is broken anyway, so its processes
    are killed at once."""
    if learner_group is None or learner_group not in _stuck_groups:
        return False
    executor = getattr(learner_group, "_backend_executor", None)
    if executor is not None:
        executor.shutdown(graceful_termination=False)
    _stuck_groups.discard(learner_group)
    return True

"""How the driver reaches its learners through RLlib's ``LearnerGroup``: what it hands them, what it gets back.

- :func:`to_learners`: a value every learner reads (a training batch): the object itself for a learner in the
  driver's process, which would otherwise copy it into Ray's object store and read it back within the same process
  (the shipped tiny model's learner phase went 85.5 -> 76.5 ms, median of six runs: BENCHMARKS.md section 40); an
  ObjectRef, put once, for remote learners, which each fetch it from the store;
- :func:`all_results` / :func:`first_result`: the values of a ``foreach_learner`` call, raising the first failure.
"""

from __future__ import annotations

from typing import Any

import ray


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

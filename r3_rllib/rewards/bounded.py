"""A time limit for reward code the package does not own: a user's reward function, a task's own scorer.

The math grader runs math-verify in a worker subprocess and kills it on timeout (math_grader.py). Arbitrary Python
reward code (an env's scoring, reasoning_gym's ``score_answer``) cannot in general move to a subprocess (closures,
state held by the env), and ``signal.alarm`` works only in a process's main thread. So :func:`bounded_call` runs it
on a daemon thread and waits at most ``timeout_s``: past that the caller gets a graded failure
(``reason="timeout"``) and training goes on. Python cannot stop a thread, so the abandoned call runs on until it
returns; a warning names the callable each time, so such a leak is visible. Exceptions are the callable's own and
propagate (a bug in a reward function is not a wrong answer).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a reward call may take before it is graded as a failure. A rule-based reward takes milliseconds; 30 s
#: leaves room for a slow scorer (a symbolic check) on a loaded machine and is far below rollout_timeout_s, so a
#: hung scorer costs one sample, not the runner.
DEFAULT_REWARD_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Bounded(Generic[T]):
    """The result of a bounded call: ``value`` when it returned in time (``reason="ok"``), else None with
    ``reason="timeout"``."""

    value: T | None
    reason: str

    @property
    def ok(self) -> bool:
        return self.reason == "ok"


def bounded_call(
    fn: Callable[..., T], *args: Any, timeout_s: float = DEFAULT_REWARD_TIMEOUT_S, **kwargs: Any
) -> Bounded[T]:
    """``fn(*args, **kwargs)`` if it returns within ``timeout_s`` seconds, else a ``"timeout"`` result (see the
    module docstring for what happens to the call); an exception raised by ``fn`` in time is re-raised here."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller's thread, which re-raises it
            outcome["error"] = e

    worker = threading.Thread(target=run, name=f"bounded-{getattr(fn, '__name__', 'call')}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        logger.warning(
            "%s did not return within %.1f s: graded as a timeout (the call runs on in a daemon thread)",
            getattr(fn, "__qualname__", repr(fn)),
            timeout_s,
        )
        return Bounded(None, "timeout")
    if "error" in outcome:
        raise outcome["error"]
    return Bounded(outcome["value"], "ok")

"""Runner faults: a runner's error reaches the driver with its cause, and a run with no runner left waits for Ray to
restart them instead of ending.

Two kinds of failure, handled differently:

- **An application error** (the env's ``reset``/``step`` raised, sampling settings the engine refuses, a reward that
  is NaN or infinite: ``rollout.kinds.context.NonFiniteRewardError``): deterministic, so a retry would fail the same way and hide it. :func:`sample_or_error` runs
  the rollout inside the runner and returns a :class:`~rollout_types.RunnerError` (runner index, env, query id, the
  exception's type, message and traceback) instead of raising; the driver raises it (:func:`raise_runner_errors`)
  and the run stops at once with that error. Raising inside the runner would not do: RLlib's ``apply`` logs the
  exception in the runner's own log, sleeps ``delay_between_env_runner_restarts_s`` (60 s) and exits the process,
  and the driver then sees only a dead actor.
- **A crash of the process** (killed for memory, ``os._exit``, a node gone): RLlib marks the runner unhealthy and
  Ray restarts it and ``R3.restore_env_runners`` brings it back at its last data position. With ``runner_loss:
  reask`` (the default) the coordinator waits for it (:func:`wait_for_runner_ids`, at most
  ``env_runner_restore_timeout_s``) and asks it again for the same share, so the batch is the one an uninterrupted
  run trains; with ``skip`` the iteration trains on the others' samples. With no healthy runner left,
  :func:`wait_for_runners` waits (bounded the same way) for Ray to restart them, restores them and the run goes on.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from r3_rllib.algorithms.r3.rollout_types import RolloutResult, RunnerError, RunnerTraceback

#: Seconds between two attempts to restore restarted runners while none is healthy.
RESTORE_POLL_S = 0.5

logger = logging.getLogger(__name__)


def sample_or_error(runner: Any, **kwargs: Any) -> RolloutResult | RunnerError:
    """``runner.sample(**kwargs)``, run inside the runner process; an exception comes back as a RunnerError value
    naming the runner, its env and the query it was on (``runner.query_id``; the error's own ``query_id`` first)."""
    try:
        return runner.sample(**kwargs)
    except Exception as err:  # every application error: the driver decides (it stops the run)
        env = getattr(runner, "env", None)
        query_id = getattr(err, "query_id", None) or getattr(runner, "query_id", None)
        return RunnerError(
            int(runner.worker_index or 0),
            type(err).__name__,
            str(err),
            env=type(env).__name__ if env is not None else None,
            query_id=query_id,
            remote_traceback="".join(traceback.format_exception(err)),
        )


def raise_runner_errors(outputs: Iterable[tuple[int, Any]]) -> None:
    """Raise the RunnerError of the lowest-indexed runner among ``(worker id, answer)`` pairs, from its runner-side
    traceback (the others are logged); nothing when no answer is one."""
    errors = sorted(
        ((wid, out) for wid, out in outputs if isinstance(out, RunnerError)), key=lambda pair: pair[0]
    )
    if not errors:
        return
    for _, other in errors[1:]:
        logger.error("%s", other)
    first = errors[0][1]
    raise first from RunnerTraceback(first.remote_traceback)


def runner_restart_timeout_s(config: Any) -> float:
    """How long a run with no healthy runner waits for Ray to restart one: RLlib's ``env_runner_restore_timeout_s``
    (``config.fault_tolerance(env_runner_restore_timeout_s=...)``, 30 min by default: a restarted runner may have
    to load a large model again)."""
    return float(config.env_runner_restore_timeout_s)


def wait_for_runners(runners: Any, restore: Callable[[], list[int]] | None, config: Any) -> list[int]:
    """The healthy runners' ids, sorted. With none, wait for Ray to restart the crashed ones and ``restore`` them
    (``R3.restore_env_runners``: current weights, data position), for at most :func:`runner_restart_timeout_s`;
    RuntimeError when none comes back, or when nothing can (no restore, restart_failed_env_runners off)."""
    ids = sorted(runners.healthy_worker_ids())
    if ids:
        return ids
    lost = list(range(1, runners.num_remote_env_runners() + 1))  # RLlib numbers remote runners from 1
    if restore is None or not lost or not config.restart_failed_env_runners:
        raise RuntimeError(
            f"no healthy EnvRunner left to sample from (EnvRunner(s) {lost} lost; restart_failed_env_runners="
            f"{config.restart_failed_env_runners}); the crash's cause is in the Ray worker logs"
        )
    timeout_s = runner_restart_timeout_s(config)
    logger.warning(
        "no healthy EnvRunner: waiting up to %.0f s (env_runner_restore_timeout_s) for Ray to restart "
        "EnvRunner(s) %s",
        timeout_s,
        lost,
    )
    t0 = time.monotonic()
    while True:
        restore()
        ids = sorted(runners.healthy_worker_ids())
        if ids:
            logger.warning("EnvRunner(s) %s restored after %.1f s", ids, time.monotonic() - t0)
            return ids
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(
                f"no EnvRunner came back within {timeout_s:.0f} s (env_runner_restore_timeout_s) after all of "
                f"EnvRunner(s) {lost} crashed; the crash's cause is in the Ray worker logs"
            )
        time.sleep(RESTORE_POLL_S)


def wait_for_runner_ids(
    runners: Any, restore: Callable[[], list[int]] | None, config: Any, worker_ids: Iterable[int]
) -> None:
    """Wait until every runner of ``worker_ids`` is healthy again, calling ``restore`` (``R3.restore_env_runners``:
    it puts a restarted runner at its last delivered data position with the current weights) meanwhile, for at
    most :func:`runner_restart_timeout_s`. RuntimeError when one does not come back, or when none can (no restore,
    restart_failed_env_runners off): the caller needs these runners' answers (``runner_loss: reask``)."""
    wanted = set(worker_ids)
    if not wanted:
        return
    if restore is None or not config.restart_failed_env_runners:
        raise RuntimeError(
            f"EnvRunner(s) {sorted(wanted)} crashed during the rollout and cannot be restarted "
            f"(restart_failed_env_runners={config.restart_failed_env_runners}); runner_loss='skip' trains on "
            "the others' samples instead; the crash's cause is in the Ray worker logs"
        )
    timeout_s = runner_restart_timeout_s(config)
    t0 = time.monotonic()
    while True:
        restore()
        missing = wanted - set(runners.healthy_worker_ids())
        if not missing:
            logger.warning(
                "EnvRunner(s) %s restored after %.1f s: asking again", sorted(wanted), time.monotonic() - t0
            )
            return
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(
                f"EnvRunner(s) {sorted(missing)} did not come back within {timeout_s:.0f} s "
                "(env_runner_restore_timeout_s) after crashing; the crash's cause is in the Ray worker logs"
            )
        time.sleep(RESTORE_POLL_S)

"""Runner start-up failures, reported with the runner's own error.

An EnvRunner builds its tokenizer, its TextEnv and its generation engine in its constructor; any of them can fail (a
model path that does not exist, an env_config key the env does not take, a vLLM KV cache that cannot hold one
sequence of ``max_model_len``). RLlib logs such a failure in the runner's own log, takes the runner out of service
and carries on: with every runner down the algorithm's setup then dies in ``EnvRunnerGroup.get_spaces`` with an
``IndexError`` that says nothing about the cause, and with only some runners down the run starts short-handed.

:func:`runner_startup_error` asks every runner, right after RLlib built them, whether it is alive; a runner whose
constructor raised answers with that exception (Ray keeps it as the cause of the actor's death), and the algorithm
raises an :class:`EnvRunnerStartupError` naming the runner and the original message. :func:`find_startup_error`
digs it out of the wrappers Ray Tune puts around a trial's error, for ``r3 train``.
"""

from __future__ import annotations

import logging

import ray

logger = logging.getLogger(__name__)


class EnvRunnerStartupError(RuntimeError):
    """EnvRunner ``worker_index`` could not be built; ``reason`` is its own error (``"Type: message"``)."""

    def __init__(self, worker_index: int, reason: str, others: tuple[int, ...] = ()) -> None:
        self.worker_index = int(worker_index)
        self.reason = str(reason)
        self.others = tuple(int(i) for i in others)
        message = f"EnvRunner {self.worker_index} failed to start: {self.reason}"
        if self.others:
            message += f" (EnvRunner {', '.join(map(str, self.others))} failed to start too)"
        super().__init__(message)

    def __reduce__(self):
        # The error crosses process boundaries (Tune trial -> driver); rebuild it from its fields.
        return (type(self), (self.worker_index, self.reason, self.others))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _failure_cause(err: ray.exceptions.RayError) -> BaseException | None:
    """The exception raised inside the actor: the cause of a RayTaskError (a method that raised) or of the
    RayTaskError that an ActorDiedError wraps (a constructor that raised)."""
    if isinstance(err, ray.exceptions.RayTaskError):
        return err.cause
    if isinstance(err, ray.exceptions.RayActorError) and getattr(err, "actor_init_failed", False):
        inner = err.args[0] if err.args else None
        if isinstance(inner, ray.exceptions.RayTaskError):
            return inner.cause
    return None


def runner_startup_error(env_runner_group) -> tuple[EnvRunnerStartupError, BaseException | None] | None:
    """Probe every remote runner of ``env_runner_group`` once; return ``(error, original exception)`` for the
    lowest-indexed runner that failed to start (the others that failed are named in the message), or None.

    Waits for runners still being constructed (as RLlib's own validation does): the probe is one remote call per
    runner, answered at once by a runner that is up.
    """
    if env_runner_group is None:
        return None
    # RLlib has no public accessor for the actor handles of runners it marked unhealthy.
    handles = dict(env_runner_group._worker_manager.actors())
    probes = {wid: handle.assert_healthy.remote() for wid, handle in handles.items()}
    failures: dict[int, tuple[str, BaseException | None]] = {}
    for wid in sorted(probes):
        try:
            ray.get(probes[wid])
        except ray.exceptions.RayError as err:
            cause = _failure_cause(err)
            reason = _describe(cause) if cause is not None else _describe(err)
            failures[wid] = (reason, cause)
    if not failures:
        return None
    first, *others = sorted(failures)
    reason, cause = failures[first]
    for wid in others:
        logger.error("EnvRunner %d failed to start: %s", wid, failures[wid][0])
    return EnvRunnerStartupError(first, reason, tuple(others)), cause


def find_startup_error(exc: BaseException | None) -> EnvRunnerStartupError | None:
    """The EnvRunnerStartupError inside ``exc`` (a Tune trial's error: Ray wraps the trainable's exception in a
    RayTaskError, or an ActorDiedError around one, whose ``cause`` is the original), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        # Ray's wrappers (a trainable that raised in setup dies as an actor) come before the isinstance test: a
        # RayTaskError of an EnvRunnerStartupError is an instance of both classes, with Ray's traceback as text.
        if isinstance(exc, ray.exceptions.RayError):
            exc = _failure_cause(exc)
            continue
        if isinstance(exc, EnvRunnerStartupError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


#: How long an iteration waits for Ray to bring a crashed replay actor back.
REPLAY_RESTART_TIMEOUT_S = 60.0


def replay_config(config, max_age: int | None):
    """The replay buffer's typed configuration (``replay.ReplayConfig``), built once in the driver from the
    algorithm config; ``max_age`` is the schedule's bound (two epochs of updates when the config leaves it
    None, r3_schedule.py)."""
    from r3_rllib.replay import ReplayConfig

    return ReplayConfig(
        max_per_query=config.replay_max_per_query,
        max_total_samples=config.replay_max_total,
        priority=config.replay_priority,
        recency_decay=config.replay_recency_decay,
        correct_length_power=config.replay_correct_length_power,
        truncated_priority=config.replay_truncated_priority,
        max_age=max_age,
        seed=config.seed,
    )


def start_replay(config, schedule):
    """The replay actor of a run that needs one (``config.needs_replay_actor``), behind the supervisor that waits
    for Ray to restart it after a crash and refills it (replay/supervisor.py); None otherwise."""
    if not config.needs_replay_actor:
        return None
    from r3_rllib.replay import ReplayBufferClient, create_replay_actor
    from r3_rllib.replay.supervisor import ReplaySupervisor

    max_age = schedule.max_age if schedule else config.replay_max_age
    client = ReplayBufferClient(create_replay_actor(replay_config(config, max_age), max_restarts=-1))
    supervisor = ReplaySupervisor(client, restart_timeout_s=REPLAY_RESTART_TIMEOUT_S)
    supervisor.check()
    return supervisor

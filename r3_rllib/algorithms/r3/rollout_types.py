"""What crosses between an EnvRunner and the driver: typed, versioned, frozen.

- :class:`RunnerState`: where a runner stands in its data and its sampling seed (a restarted runner resumes there);
- :class:`RolloutResult`: one runner's answer to one rollout request (``LLMEnvRunner.sample``);
- :class:`Rollout`: the driver's merge of the runners' results, in worker-id order (:func:`merge_results`), and of
  several rounds of one iteration (dynamic sampling, :meth:`Rollout.merge`);
- :class:`RunnerError`: a runner's answer when its rollout raised (the driver raises it: runner_faults.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from r3_rllib.algorithms.r3.checkpoint import (
    FORMAT_KEY,
    RUNNER_STATE_VERSION,
    SUPPORTED_RUNNER_STATE_VERSIONS,
    checked_version,
)
from r3_rllib.algorithms.r3.groups import merge_rollout_totals
from r3_rllib.types.samples import Group

#: Format version of :class:`RolloutResult` (driver and runners run the same package; a mismatch is a bug).
ROLLOUT_RESULT_VERSION = 1


@dataclass(frozen=True)
class RunnerState:
    """A runner's position in its data (its env's ``state()``) and the seed of its last training draw. Weights are
    not part of it: they live in the learner's checkpoint and arrive through the weight sync."""

    env: Any
    sample_seed: int

    def to_dict(self) -> dict[str, Any]:
        """The versioned dict RLlib's ``Checkpointable.get_state`` returns and checkpoints store."""
        return {FORMAT_KEY: RUNNER_STATE_VERSION, "env": self.env, "sample_seed": int(self.sample_seed)}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any], *, source: str = "runner state") -> RunnerState:
        """Read a :meth:`to_dict` (or a legacy unversioned) state; CheckpointFormatError for an unknown version."""
        checked_version(state, supported=SUPPORTED_RUNNER_STATE_VERSIONS, source=source)
        return cls(env=state["env"], sample_seed=int(state["sample_seed"]))


@dataclass(frozen=True)
class RolloutTimings:
    """Seconds a runner spent on one rollout: generating (env steps included for multi-step), grading, in all; and
    how long it sat idle before it (since its previous call, a rollout or a weight load, ended)."""

    generate_s: float = 0.0
    grade_s: float = 0.0
    sample_s: float = 0.0
    idle_s: float = 0.0


@dataclass(frozen=True)
class RolloutResult:
    """One runner's rollout: its groups, the data epoch its env reached, timings, token count, the rollout's
    statistics as sums (``groups.rollout_totals``), the runner's state after these draws and the id of the runner
    process (``incarnation``: it changes when Ray restarts the process)."""

    worker_id: int
    groups: tuple[Group, ...]
    env_epoch: int
    timings: RolloutTimings
    generated_tokens: int
    totals: Mapping[str, float]
    runner_state: RunnerState
    incarnation: str = ""
    format_version: int = ROLLOUT_RESULT_VERSION


@dataclass(frozen=True)
class Rollout:
    """Groups to train on and what the driver logs about the rollout(s) that produced them."""

    groups: tuple[Group, ...] = ()
    generate_s: float = 0.0
    """The slowest runner's generation time (runners generate in parallel); rounds add up."""
    grade_s: float = 0.0
    generated_tokens: float = 0.0
    totals: Mapping[str, float] = field(default_factory=dict)
    runner_idle_s: float = 0.0
    """The runners' idle time before their rollouts, summed over runners (and rounds)."""

    def merge(self, other: Rollout) -> Rollout:
        """Two rollouts (dynamic sampling's rounds) as one: groups concatenate, times and tokens add, totals merge."""
        return Rollout(
            groups=self.groups + other.groups,
            generate_s=self.generate_s + other.generate_s,
            grade_s=self.grade_s + other.grade_s,
            generated_tokens=self.generated_tokens + other.generated_tokens,
            totals=merge_rollout_totals(self.totals, other.totals),
            runner_idle_s=self.runner_idle_s + other.runner_idle_s,
        )

    @classmethod
    def from_legacy(cls, value: Any) -> Rollout | None:
        """A rollout saved by an older checkpoint (a ``(groups, info dict)`` tuple), or ``value`` itself."""
        if value is None or isinstance(value, Rollout):
            return value
        groups, info = value
        return cls(
            groups=tuple(groups),
            generate_s=float(info.get("generate_s", 0.0)),
            grade_s=float(info.get("grade_s", 0.0)),
            generated_tokens=float(info.get("generated_tokens", 0.0)),
            totals=dict(info.get("totals", {})),
        )


class RunnerError(RuntimeError):
    """A runner's rollout raised: which runner, its env, the query it was grading (None when unknown, e.g. the
    env's ``reset`` raised), the exception's type and message, and the runner-side traceback (the driver raises it
    as the error's cause, :class:`RunnerTraceback`).

    The runner returns it as a value instead of raising (RLlib's ``apply`` would log the exception in the runner's
    own log, sleep ``delay_between_env_runner_restarts_s`` and exit the process, and the driver would only see a
    dead actor); the driver raises it, so the cause reaches the user within seconds."""

    def __init__(
        self,
        worker_index: int,
        error_type: str,
        message: str,
        *,
        env: str | None = None,
        query_id: str | None = None,
        remote_traceback: str = "",
    ) -> None:
        self.worker_index = int(worker_index)
        self.error_type = str(error_type)
        self.message = str(message)
        self.env = env
        self.query_id = query_id
        self.remote_traceback = str(remote_traceback)
        where = ", ".join(
            part for part in (env and f"env {env}", query_id is not None and f"query {query_id!r}") if part
        )
        # One line (``r3 train`` shows a failed trial's last line); the traceback is raised as its cause.
        label = f"EnvRunner {self.worker_index}" + (f" ({where})" if where else "")
        super().__init__(f"{label} failed: {error_type}: {message}")

    def __reduce__(self):
        # Crosses process boundaries (runner -> driver, Tune trial -> driver): rebuilt from its fields.
        return (
            _rebuild_runner_error,
            (
                self.worker_index,
                self.error_type,
                self.message,
                self.env,
                self.query_id,
                self.remote_traceback,
            ),
        )


class RunnerTraceback(Exception):
    """The traceback of a runner's exception, as text: raised as a RunnerError's cause, so that a printed traceback
    shows where in the runner the error happened."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0]).rstrip() if self.args else ""


def _rebuild_runner_error(*fields: Any) -> RunnerError:
    worker_index, error_type, message, env, query_id, remote_traceback = fields
    return RunnerError(
        worker_index, error_type, message, env=env, query_id=query_id, remote_traceback=remote_traceback
    )


def merge_results(results: Sequence[RolloutResult]) -> Rollout:
    """The runners' results of one request as one rollout, in the order given (worker-id order: the batch, and so
    a seeded run's minibatch split, must not depend on which runner finished first)."""
    if not results:
        return Rollout()
    return Rollout(
        groups=tuple(g for r in results for g in r.groups),
        generate_s=max(r.timings.generate_s for r in results),
        grade_s=max(r.timings.grade_s for r in results),
        generated_tokens=float(sum(r.generated_tokens for r in results)),
        totals=merge_rollout_totals(*(r.totals for r in results)),
        runner_idle_s=float(sum(r.timings.idle_s for r in results)),
    )

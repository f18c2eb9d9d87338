"""Versioned state files: the algorithm's driver state (``r3_state.pkl``) and each runner's state inside it.

Both carry a ``format_version``; :func:`checked_version` is the one reader of that field, and it refuses a version
this package does not know with a :class:`CheckpointFormatError` that names the file, the version found and the
versions supported. A state without the field predates versioning: it reads as :data:`LEGACY_VERSION` (same keys as
version 1, minus the field itself). Pure (stdlib only): no Ray, no torch.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Key of the format version in every versioned state dict.
FORMAT_KEY = "format_version"
#: A state written before states carried a version.
LEGACY_VERSION = 0
#: Version written by this package: the algorithm state file and a runner's state.
ALGORITHM_STATE_VERSION = 1
RUNNER_STATE_VERSION = 1
#: Versions each reader understands.
SUPPORTED_ALGORITHM_STATE_VERSIONS = (LEGACY_VERSION, ALGORITHM_STATE_VERSION)
SUPPORTED_RUNNER_STATE_VERSIONS = (LEGACY_VERSION, RUNNER_STATE_VERSION)
#: The driver's state file inside an algorithm checkpoint directory.
R3_STATE_FILE = "r3_state.pkl"


class CheckpointFormatError(ValueError):
    """A state written in a format this package cannot read (a newer package's, or not a state at all)."""


def checked_version(state: Any, *, supported: tuple[int, ...], source: str) -> int:
    """The format version of ``state`` (a dict read from ``source``), or CheckpointFormatError if it is not one of
    ``supported``. A dict without the field is :data:`LEGACY_VERSION`."""
    if not isinstance(state, Mapping):
        raise CheckpointFormatError(f"{source}: expected a state dict, found a {type(state).__name__}")
    found = state.get(FORMAT_KEY, LEGACY_VERSION)
    if found not in supported:
        raise CheckpointFormatError(
            f"{source}: state format version {found!r} is not supported (this r3_rllib reads versions "
            f"{', '.join(map(str, supported))}); it was written by a different r3_rllib version"
        )
    return int(found)


@dataclass(frozen=True)
class AlgorithmState:
    """The driver's part of an algorithm checkpoint (the learners' weights are in their DCP folder)."""

    iteration: int
    policy_version: int
    dataset_epoch: int
    runner_epochs: dict[int, int]
    rng: dict[str, Any]
    runners: dict[int, dict[str, Any]]
    """Each runner's state (its ``get_state()``, a versioned dict), keyed by worker id."""
    replay: Any
    metrics: Any
    r3_settings: Any = None
    ready_rollout: Any = None
    """The rollout gathered ahead of its iteration (overlap_generation), or None."""
    stream_queue: Any = None
    """Streaming rollouts (max_staleness >= 2): the delivered requests not yet trained (streaming.QueuedRollout)."""


def write_algorithm_state(checkpoint_dir: str, state: AlgorithmState) -> str:
    """Write ``state`` to ``checkpoint_dir/r3_state.pkl`` with the current format version; return the path."""
    path = os.path.join(checkpoint_dir, R3_STATE_FILE)
    data = {FORMAT_KEY: ALGORITHM_STATE_VERSION, **{k: getattr(state, k) for k in _FIELDS}}
    with open(path, "wb") as f:
        pickle.dump(data, f)
    return path


def read_algorithm_state(checkpoint_dir: str) -> AlgorithmState:
    """The driver state of the checkpoint in ``checkpoint_dir``; CheckpointFormatError for a format version (of
    the file or of a runner state in it) this package does not read."""
    path = os.path.join(checkpoint_dir, R3_STATE_FILE)
    with open(path, "rb") as f:
        data = pickle.load(f)
    checked_version(data, supported=SUPPORTED_ALGORITHM_STATE_VERSIONS, source=path)
    runners = dict(data["runners"])
    for wid, runner in runners.items():
        checked_version(runner, supported=SUPPORTED_RUNNER_STATE_VERSIONS, source=f"{path} (runner {wid})")
    return AlgorithmState(
        iteration=data["iteration"],
        policy_version=data["policy_version"],
        dataset_epoch=data["dataset_epoch"],
        runner_epochs=dict(data.get("runner_epochs", {})),
        rng=data["rng"],
        runners=runners,
        replay=data["replay"],
        metrics=data["metrics"],
        r3_settings=data.get("r3_settings"),
        ready_rollout=data.get("ready_rollout"),
        stream_queue=data.get("stream_queue"),
    )


_FIELDS = (
    "iteration",
    "policy_version",
    "dataset_epoch",
    "runner_epochs",
    "rng",
    "runners",
    "replay",
    "metrics",
    "r3_settings",
    "ready_rollout",
    "stream_queue",
)

"""Versioned state files: the algorithm's driver state (``r3_state.pkl``) and each runner's state inside it; which
checkpoint of a trial is complete.

Both states carry a ``format_version``; :func:`checked_version` is the one reader of that field, and it refuses a
version this package does not know with a :class:`CheckpointFormatError` that names the file, the version found and
the versions supported. A state without the field predates versioning: it reads as :data:`LEGACY_VERSION` (same keys
as version 1, minus the field itself). Version 2 has the same keys as 1; its checkpoint directory has a
``manifest.json`` (checkpoint_files.py), so a version-2 directory without one is an interrupted save. The state file is
read with an allow-list unpickler (safe_pickle.py): it cannot run code. Pure (stdlib only): no Ray, no torch.
"""

from __future__ import annotations

import logging
import numbers
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from r3_rllib.algorithms.r3.checkpoint_files import (
    MANIFEST_FILE,
    CheckpointFormatError,
    CorruptCheckpointError,
    Manifest,
    atomic_open,
    quarantine,
    short_repr,
    trial_checkpoints,
    verify_checkpoint,
)
from r3_rllib.algorithms.r3.safe_pickle import safe_load, safe_loads

__all__ = [
    "CheckpointFormatError",
    "CorruptCheckpointError",
]  # re-exported: their home is checkpoint_files.py

logger = logging.getLogger(__name__)

#: Key of the format version in every versioned state dict.
FORMAT_KEY = "format_version"
#: A state written before states carried a version.
LEGACY_VERSION = 0
#: Version written by this package: the algorithm state file (2: its checkpoint has a manifest) and a runner's state.
ALGORITHM_STATE_VERSION = 2
RUNNER_STATE_VERSION = 1
#: The last algorithm state version whose checkpoints have no manifest.
UNMANIFESTED_VERSION = 1
#: Versions each reader understands.
SUPPORTED_ALGORITHM_STATE_VERSIONS = (LEGACY_VERSION, UNMANIFESTED_VERSION, ALGORITHM_STATE_VERSION)
SUPPORTED_RUNNER_STATE_VERSIONS = (LEGACY_VERSION, RUNNER_STATE_VERSION)
#: The driver's state file inside an algorithm checkpoint directory.
R3_STATE_FILE = "r3_state.pkl"
#: The learners' DCP folder inside an algorithm checkpoint directory (PolicyState.save_dcp).
LEARNER_DIR = "learner_dcp"


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
    reward_kl_coef: float | None = None
    """use_kl_in_reward: the KL controller's beta for the next iteration (reward_kl.py); None without it."""


def write_algorithm_state(checkpoint_dir: str, state: AlgorithmState) -> str:
    """Write ``state`` to ``checkpoint_dir/r3_state.pkl`` with the current format version, atomically (the file
    appears only complete); return the path. CheckpointFormatError, before anything is written, for a state that
    holds a type :func:`read_algorithm_state` would refuse."""
    path = os.path.join(checkpoint_dir, R3_STATE_FILE)
    data = {FORMAT_KEY: ALGORITHM_STATE_VERSION, **{k: getattr(state, k) for k in _FIELDS}}
    blob = pickle.dumps(data, protocol=4)
    # A state that would not load is refused now, naming the type, not after a crash when it is needed.
    try:
        safe_loads(blob, f"{path} (being written)")
    except CheckpointFormatError as e:
        raise CheckpointFormatError(
            f"{e}. Add the type to safe_pickle.DRIVER_STATE_GLOBALS if it is data"
        ) from e
    with atomic_open(path) as f:
        f.write(blob)
    return path


def read_algorithm_state(checkpoint_dir: str) -> AlgorithmState:
    """The driver state of the checkpoint in ``checkpoint_dir``; CheckpointFormatError for a format version (of
    the file or of a runner state in it) this package does not read, or for a file that references a type other
    than data (safe_pickle.py); CorruptCheckpointError for a truncated or corrupt file, or a state missing a field
    or holding one of the wrong type (naming the file and the field). The file is not checked against the manifest
    here: :func:`verify_algorithm_checkpoint` does that for the whole directory."""
    path = os.path.join(checkpoint_dir, R3_STATE_FILE)
    if not os.path.isfile(path):
        raise CorruptCheckpointError(f"{path}: missing (not an r3_rllib checkpoint, or an interrupted save)")
    data = _read_state_dict(path)
    checked_version(data, supported=SUPPORTED_ALGORITHM_STATE_VERSIONS, source=path)
    runners = dict(_field(data, "runners", Mapping, path))
    for wid, runner in runners.items():
        if not isinstance(runner, Mapping):
            raise _bad_field(path, f"runners[{wid!r}]", "a runner state dict", runner)
        checked_version(runner, supported=SUPPORTED_RUNNER_STATE_VERSIONS, source=f"{path} (runner {wid})")
    return AlgorithmState(
        iteration=_count(data, "iteration", path),
        policy_version=_count(data, "policy_version", path),
        dataset_epoch=_count(data, "dataset_epoch", path),
        runner_epochs=dict(_field(data, "runner_epochs", Mapping, path, default={})),
        rng=_field(data, "rng", Mapping, path),
        runners=runners,
        replay=_field(data, "replay", object, path),  # any type: only their presence is checked
        metrics=_field(data, "metrics", object, path),
        r3_settings=_field(data, "r3_settings", (Mapping, type(None)), path, default=None),
        ready_rollout=data.get("ready_rollout"),
        stream_queue=data.get("stream_queue"),
        reward_kl_coef=_field(data, "reward_kl_coef", (numbers.Real, type(None)), path, default=None),
    )


def _read_state_dict(path: str) -> Mapping[str, Any]:
    """The dict pickled in the state file ``path`` (safe_pickle.safe_load); CorruptCheckpointError when the file
    holds anything else (its first bytes damaged)."""
    data = safe_load(path)
    if not isinstance(data, Mapping):
        raise CorruptCheckpointError(
            f"{path}: not a readable checkpoint file: expected a state dict, found a {type(data).__name__}"
        )
    return data


_REQUIRED = object()
#: How an error names the types state fields must have.
_TYPE_NAMES: dict[type, str] = {Mapping: "dict", numbers.Integral: "int", type(None): "None"}


def _field(
    data: Mapping[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    path: str,
    default: Any = _REQUIRED,
) -> Any:
    """``data[key]``, which must be an instance of ``kind`` (``default`` when absent and there is one: a field that
    older formats lack); CorruptCheckpointError naming ``path`` and the field otherwise."""
    if key not in data:
        if default is _REQUIRED:
            raise CorruptCheckpointError(f"{path}: not a complete checkpoint state: field {key!r} is missing")
        return default
    value = data[key]
    if not isinstance(value, kind):
        names = " or ".join(
            _TYPE_NAMES.get(t, t.__name__) for t in (kind if isinstance(kind, tuple) else (kind,))
        )
        raise _bad_field(path, key, f"of type {names}", value)
    return value


def _count(data: Mapping[str, Any], key: str, path: str) -> int:
    """``data[key]`` as an int >= 0 (iteration, version, epoch); numpy integers too. A bool is refused: it is an int
    to Python, but never a count in a state this package wrote."""
    value = _field(data, key, numbers.Integral, path)
    if isinstance(value, bool) or value < 0:
        raise _bad_field(path, key, "an int >= 0", value)
    return int(value)


def _bad_field(path: str, key: str, expected: str, value: Any) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{path}: not a readable checkpoint state: field {key!r} should be {expected}, found "
        f"{type(value).__name__} {short_repr(value, 80)}"
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
    "reward_kl_coef",
)


def verify_algorithm_checkpoint(checkpoint_dir: str, *, hashes: bool = True) -> Manifest | None:
    """Check that the checkpoint in ``checkpoint_dir`` is complete and unchanged before anything is loaded from it:
    every file its manifest lists present with the listed size and (``hashes``) sha256. Return the manifest; None
    for a checkpoint of format 0/1 (written before manifests existed: loaded with a warning). CorruptCheckpointError
    naming the file and what differs, or for a manifest that does not list the state file; for a directory without
    a manifest whose state file is of format 2 or unreadable (a save that did not finish)."""
    manifest = verify_checkpoint(checkpoint_dir, hashes=hashes)
    if manifest is not None:
        # A manifest that does not list the state file (damaged, or written over another directory) would let a
        # restore read a state nothing vouches for, or none at all.
        if R3_STATE_FILE not in {entry.path for entry in manifest.files}:
            raise CorruptCheckpointError(
                f"{os.path.join(checkpoint_dir, MANIFEST_FILE)}: does not list {R3_STATE_FILE}, which every "
                f"algorithm checkpoint has: not the manifest of this checkpoint"
            )
        return manifest
    state_path = os.path.join(checkpoint_dir, R3_STATE_FILE)
    try:
        version = checked_version(
            _read_state_dict(state_path), supported=SUPPORTED_ALGORITHM_STATE_VERSIONS, source=state_path
        )
    except (FileNotFoundError, IsADirectoryError):  # no state file: reported as the interrupted save below
        version = None
    if version is None or version > UNMANIFESTED_VERSION:
        raise CorruptCheckpointError(
            f"{checkpoint_dir}: no {MANIFEST_FILE}: the save that wrote it did not finish (a full disk, a killed "
            f"process), so it is not a complete checkpoint"
        )
    logger.warning(
        "%s has no %s (format version %d, written by an older r3_rllib): its files are not verified",
        checkpoint_dir,
        MANIFEST_FILE,
        version,
    )
    return None


@dataclass(frozen=True)
class CheckpointChoice:
    """The newest complete checkpoint of a trial (None if there is none), its manifest (None for a format 0/1
    checkpoint), the highest checkpoint index in the trial (complete or not) and why newer ones were refused."""

    path: str | None
    manifest: Manifest | None
    max_index: int
    refused: tuple[str, ...]


def newest_complete_checkpoint(
    trial_dir: str, *, set_aside: bool = True, hashes: bool = True
) -> CheckpointChoice:
    """Verify the checkpoints of a Tune trial (``trial_dir/checkpoint_NNNNNN``) newest first and return the first
    complete one. A refused (incomplete or corrupt) one is moved aside when ``set_aside`` (``<name>.incomplete``,
    never deleted: see checkpoint_files.quarantine), so neither Tune nor a later resume takes it, and a new
    checkpoint cannot be written into it. A checkpoint of an unknown format version stops the search (a newer
    r3_rllib wrote it: resuming from an older one would silently drop progress). ``hashes=False`` checks presence
    and sizes only (a quick look, e.g. to name the last good checkpoint in an error)."""
    found = trial_checkpoints(trial_dir)
    refused: list[str] = []
    for _index, path in found:
        try:
            manifest = verify_algorithm_checkpoint(path, hashes=hashes)
        except CorruptCheckpointError as e:
            moved = quarantine(path, str(e)) if set_aside else None
            refused.append(f"{e}" + (f" (moved to {moved})" if moved else ""))
            continue
        return CheckpointChoice(path, manifest, found[0][0], tuple(refused))
    return CheckpointChoice(None, None, found[0][0] if found else -1, tuple(refused))

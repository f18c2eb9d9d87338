"""How `R3` saves and restores checkpoints through Ray Tune's Trainable API, so a checkpoint cannot lie.

Saving: ``Trainable.save`` calls ``R3.save_checkpoint`` on a directory (a temporary one under Tune), then Tune copies
it into the trial's ``checkpoint_NNNNNN`` (pyarrow, in any file order, no fsync). The manifest (checkpoint_files.py)
is computed from the temporary directory and written into the copy only after Tune's copy returned
(:func:`commit_checkpoint`): a copy cut short has no manifest. A full disk is reported with the path and the last
complete checkpoint (:func:`disk_full_error`).

Restoring inside a Tune trial: Tune restores the checkpoint its experiment state names, which lags the disk (the
state is synced less often than checkpoints are written: after a driver crash it can name checkpoint 15 while 25 is
complete on disk), or which may be corrupt. :func:`resume_target` takes the trial's newest *complete* checkpoint
instead, sets the refused newer ones aside and moves the trial's checkpoint index past every existing directory.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Any

from r3_rllib.algorithms.r3.checkpoint import newest_complete_checkpoint, verify_algorithm_checkpoint
from r3_rllib.algorithms.r3.checkpoint_files import (
    MANIFEST_FILE,
    CheckpointDiskFullError,
    CorruptCheckpointError,
    Manifest,
    build_manifest,
    is_disk_full,
    write_manifest,
)

logger = logging.getLogger(__name__)

#: Tune's counters a restore takes from the checkpoint's metrics (Trainable.restore), kept in the manifest's meta.
_TUNE_COUNTERS = {
    "time_total_s": "_time_total",
    "timesteps_total": "_timesteps_total",
    "episodes_total": "_episodes_total",
}


def build_algorithm_manifest(algo: Any, checkpoint_dir: str) -> Manifest:
    """The manifest of the files ``algo`` (an R3) has just written into ``checkpoint_dir``."""
    return build_manifest(checkpoint_dir, manifest_meta(algo))


def verify_unless_verified(checkpoint_dir: str, verified: str | None) -> None:
    """Verify the checkpoint in ``checkpoint_dir`` against its manifest, unless it is ``verified`` (the path
    :func:`resume_target` has just verified: a multi-GB checkpoint is hashed once per restore)."""
    if verified != os.path.normpath(checkpoint_dir):
        verify_algorithm_checkpoint(checkpoint_dir)


def manifest_meta(algo: Any) -> dict[str, Any]:
    """What the manifest records about the checkpoint of ``algo`` (a Trainable): its iteration and Tune's counters
    (so a restore of this checkpoint in place of another one continues them)."""
    meta = {"iteration": int(algo.iteration)}
    for key, attr in _TUNE_COUNTERS.items():
        value = getattr(algo, attr, None)
        if value is not None:
            meta[key] = value
    return meta


def commit_checkpoint(checkpoint: Any, manifest: Manifest) -> None:
    """Write ``manifest`` into the saved checkpoint (a ``ray.tune.Checkpoint``, after every other file is there):
    atomically, after fsync, on a local disk; as one object, uploaded last, on other storage."""
    fs = checkpoint.filesystem
    if fs is None or fs.type_name == "local":
        write_manifest(checkpoint.path, manifest)
        return
    with fs.open_output_stream(f"{checkpoint.path.rstrip('/')}/{MANIFEST_FILE}") as f:
        f.write(manifest.to_json().encode())


def raise_if_disk_full(error: BaseException, algo: Any, checkpoint_dir: str | None) -> None:
    """Raise :func:`disk_full_error` for ``error`` if it is a full disk during ``algo.save(checkpoint_dir)``: the
    target is the trial's new checkpoint when Tune's copy failed, else the directory save_checkpoint wrote."""
    if isinstance(error, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        return
    storage = getattr(algo, "_storage", None)
    copying = (
        getattr(algo, "_saved_manifest", None) is not None and storage is not None and checkpoint_dir is None
    )
    target = storage.checkpoint_fs_path if copying else getattr(algo, "_checkpoint_target", checkpoint_dir)
    target = str(target or "(checkpoint directory)")
    if not is_disk_full(error, target):
        return
    trial_dir = storage.trial_fs_path if storage is not None else os.path.dirname(target)
    raise disk_full_error(error, target, trial_dir) from error


def disk_full_error(error: BaseException, target: str, trial_dir: str | None) -> CheckpointDiskFullError:
    """The error that stops a run whose checkpoint hit a full disk: which disk and path, that the interrupted
    checkpoint is not complete (it has no manifest), and which complete checkpoint of the trial is still usable."""
    path = getattr(error, "filename", None) or target
    last = None
    if trial_dir and os.path.isdir(trial_dir):
        last = newest_complete_checkpoint(trial_dir, set_aside=False, hashes=False)
    if last is not None and last.path is not None:
        iteration = (last.manifest.meta if last.manifest else {}).get("iteration", "?")
        usable = (
            f"the last complete checkpoint, {last.path} (iteration {iteration}), is still usable: free space, then "
            f"`r3 train --resume` (or Algorithm.restore on it)"
        )
    else:
        usable = "there is no earlier complete checkpoint of this run"
    cause = getattr(error, "strerror", None) or "No space left on device"
    return CheckpointDiskFullError(
        errno.ENOSPC,
        f"disk full while writing checkpoint {target} ({path}: {cause}); that checkpoint is "
        f"incomplete (no {MANIFEST_FILE}) and no restore will take it; {usable}",
    )


def trial_restores_itself(storage: Any) -> bool:
    """Whether a trainable with Tune ``storage`` (None outside Tune) is a trial that already has a complete checkpoint
    of its own on local disk: one restarted after a failure or resumed (``r3 train --resume``), which Tune restores
    from that checkpoint right after ``setup``. Checked by presence and sizes (the restore hashes it)."""
    if storage is None:
        return False
    trial_dir = os.path.normpath(storage.trial_fs_path)
    return newest_complete_checkpoint(trial_dir, set_aside=False, hashes=False).path is not None


def resume_target(checkpoint: Any, storage: Any) -> tuple[Any, str | None]:
    """What ``Trainable.restore`` should restore when asked for ``checkpoint`` (a path, a ``ray.tune.Checkpoint`` or
    Tune's ``_TrainingResult``) by a trainable with Tune ``storage`` (None outside Tune). A checkpoint of the
    trainable's own trial (local disk) is replaced by the trial's newest complete checkpoint, with Tune's counters
    from its manifest; refused newer ones are logged and set aside. Any other local checkpoint is verified as it
    is. Returns the argument for ``Trainable.restore`` and the local path of the verified checkpoint (None when
    nothing was verified here). CorruptCheckpointError
    when the trial has no complete checkpoint."""
    from ray.train._internal.session import _TrainingResult
    from ray.tune import Checkpoint

    ckpt = checkpoint.checkpoint if isinstance(checkpoint, _TrainingResult) else checkpoint
    if isinstance(ckpt, str):
        ckpt = Checkpoint.from_directory(ckpt)
    if ckpt.filesystem.type_name != "local":  # remote: verified once downloaded (load_checkpoint)
        return checkpoint, None
    trial_dir = os.path.normpath(storage.trial_fs_path) if storage is not None else None
    if os.path.dirname(os.path.normpath(ckpt.path)) != trial_dir:  # not Tune's, or another trial's (PBT)
        # Verified before Trainable.restore sets its counters: a refused checkpoint changes nothing.
        verify_algorithm_checkpoint(ckpt.path)
        return checkpoint, os.path.normpath(ckpt.path)
    choice = newest_complete_checkpoint(trial_dir)
    for reason in choice.refused:
        logger.warning("checkpoint refused: %s", reason)
    # The next save must not land in an existing directory (Tune's index comes from its lagging state).
    storage.current_checkpoint_index = max(storage.current_checkpoint_index, choice.max_index)
    if choice.path is None:
        raise CorruptCheckpointError(
            f"{trial_dir}: no complete checkpoint to restore ({'; '.join(choice.refused)})"
        )
    if choice.path == os.path.normpath(ckpt.path):
        return checkpoint, choice.path
    meta = dict(choice.manifest.meta) if choice.manifest else {}
    metrics = {k: meta[k] for k in _TUNE_COUNTERS if k in meta}
    if "iteration" in meta:
        metrics["training_iteration"] = meta["iteration"]
    logger.warning(
        "restoring %s (iteration %s), the newest complete checkpoint of this trial, instead of %s",
        choice.path,
        meta.get("iteration", "?"),
        ckpt.path,
    )
    return _TrainingResult(checkpoint=Checkpoint(choice.path, ckpt.filesystem), metrics=metrics), choice.path

"""Checkpoint files that cannot lie: atomic writes, a manifest that commits a checkpoint, verification on restore.

A checkpoint directory is *complete* when its ``manifest.json`` exists and every file it lists has the listed size
and sha256. The manifest is written last, atomically (temporary name, fsync, rename, fsync of the directory), after
every other file is on disk: a save that stopped part way (a full disk, a killed process, a copy cut short) leaves a
directory without a manifest, which no restore takes for a checkpoint. A directory written before manifests existed
(format version 0/1) has none either: :func:`verify_checkpoint` lets it through with a warning.

Pure (stdlib only): no Ray, no torch.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import reprlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

logger = logging.getLogger(__name__)

#: The commit record of a checkpoint directory.
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "r3_rllib checkpoint manifest"
MANIFEST_VERSION = 1
#: Suffix of a file being written (renamed to its real name when complete).
TMP_SUFFIX = ".tmp-r3"
#: Tune's checkpoint directories inside a trial directory.
CHECKPOINT_DIR = re.compile(r"^checkpoint_(\d+)$")
_CHUNK = 1 << 20


class CheckpointFormatError(ValueError):
    """A state written in a format this package cannot read (a newer package's, or not a state at all)."""


class CorruptCheckpointError(CheckpointFormatError):
    """A checkpoint whose files differ from its manifest: a file missing, truncated or changed, or no manifest in a
    checkpoint of a format that has one (an interrupted save); a manifest or state file that does not decode, or
    lacks a field (a damaged file)."""


class CheckpointDiskFullError(OSError):
    """A checkpoint could not be written because its disk is full (ENOSPC); the message says which path and which
    earlier checkpoint is still usable."""


# -- atomic writes -----------------------------------------------------------------------------------------------
def fsync_dir(path: str) -> None:
    """Make the entries of directory ``path`` (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_open(path: str) -> Iterator[IO[bytes]]:
    """A binary file that appears at ``path`` only once complete: written under a temporary name, fsynced, renamed.
    On an error the temporary file is removed and the error re-raised (``path`` keeps its old content, if any)."""
    tmp = f"{path}{TMP_SUFFIX}"
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_open`)."""
    with atomic_open(path) as f:
        f.write(data)


#: Free space below which a failed write is taken for a full disk (a write fails with less left than it needed).
NEARLY_FULL_BYTES = 16 << 20


def is_disk_full(error: BaseException, path: str | None = None) -> bool:
    """True for an ENOSPC (or quota) error, also when a library reports it only in its message (pyarrow's copy), or
    when ``path``'s file system has under :data:`NEARLY_FULL_BYTES` free after the error (torch's zip writer, inside
    DCP, turns ENOSPC into "RuntimeError: unexpected pos", measured on a full tmpfs)."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error)
    if "No space left on device" in text or f"[errno {errno.ENOSPC}]" in text.lower():
        return True
    free = free_bytes(path) if path else None
    return free is not None and free < NEARLY_FULL_BYTES


def free_bytes(path: str) -> int | None:
    """Bytes available to this user on the file system of ``path`` (its nearest existing parent); None if unknown."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


# -- manifest ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its path relative to the checkpoint directory, size in bytes and sha256 (hex)."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """Every file of a checkpoint, and what the checkpoint is of (``meta``: e.g. its training iteration)."""

    files: tuple[FileEntry, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        files = [{"path": e.path, "size": e.size, "sha256": e.sha256} for e in self.files]
        data = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "meta": dict(self.meta),
            "files": files,
        }
        return json.dumps(data, indent=1, sort_keys=True)


def sha256_file(path: str) -> str:
    """The sha256 (hex) of the file at ``path``, read in 1 MiB chunks (a multi-GB shard never sits in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_file_paths(directory: str) -> list[str]:
    """The files of the checkpoint in ``directory`` (relative, '/'-separated, sorted): all but the manifest and
    files still being written."""
    found = []
    for root, _dirs, files in os.walk(directory):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
            if rel != MANIFEST_FILE and not name.endswith(TMP_SUFFIX):
                found.append(rel)
    return sorted(found)


def build_manifest(directory: str, meta: Mapping[str, Any] | None = None) -> Manifest:
    """The manifest of every file now in ``directory`` (sizes and sha256s)."""
    entries = []
    for rel in checkpoint_file_paths(directory):
        full = os.path.join(directory, rel)
        entries.append(FileEntry(rel, os.path.getsize(full), sha256_file(full)))
    return Manifest(tuple(entries), dict(meta or {}))


def write_manifest(directory: str, manifest: Manifest) -> str:
    """Commit the checkpoint in ``directory``: check that its files have the manifest's sizes, fsync them, then
    write ``manifest.json`` atomically. Return the manifest's path. Call it only when every file is written."""
    for entry in manifest.files:
        full = os.path.join(directory, entry.path)
        size = os.path.getsize(full)
        if size != entry.size:  # e.g. a copy to storage cut short
            raise CorruptCheckpointError(f"{full}: {size} bytes written, {entry.size} expected")
        fd = os.open(full, os.O_RDONLY)
        try:
            os.fsync(fd)  # the data before the commit record
        finally:
            os.close(fd)
    path = os.path.join(directory, MANIFEST_FILE)
    atomic_write_bytes(path, manifest.to_json().encode())
    return path


def read_manifest(directory: str) -> Manifest | None:
    """The manifest of the checkpoint in ``directory``; None when it has none; CorruptCheckpointError when it is not
    a manifest: not a file, not JSON, another format or version, no files listed, an entry without a path, a size
    (an int >= 0) or a sha256 (64 hex digits), or a path outside the directory."""
    path = os.path.join(directory, MANIFEST_FILE)
    if not os.path.lexists(path):
        return None
    if not os.path.isfile(path):
        raise CorruptCheckpointError(f"{path}: not a readable checkpoint manifest (not a regular file)")
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        if data.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"format is {data.get('format')!r}, not {MANIFEST_FORMAT!r}")
        if data.get("version") != MANIFEST_VERSION:
            raise ValueError(
                f"manifest version {data.get('version')!r} (this r3_rllib reads {MANIFEST_VERSION})"
            )
        listed = data["files"]
        # A manifest is built from the files of the directory it commits, and a checkpoint has at least its state
        # file: one that lists nothing would vouch for whatever the directory holds.
        if not isinstance(listed, list) or not listed:
            raise ValueError(f"'files' should be a non-empty list, found {short_repr(listed)}")
        files = tuple(_file_entry(e) for e in listed)
        meta = data.get("meta") or {}
        if not isinstance(meta, dict):
            raise ValueError(f"'meta' should be an object, found {short_repr(meta)}")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        detail = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        raise CorruptCheckpointError(f"{path}: not a readable checkpoint manifest ({detail})") from e
    for entry in files:
        parts = entry.path.split("/")
        if os.path.isabs(entry.path) or ".." in parts or entry.path in ("", MANIFEST_FILE):
            raise CorruptCheckpointError(
                f"{path}: lists {entry.path!r}, which is not a file inside the checkpoint"
            )
    return Manifest(files, dict(meta))


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _file_entry(raw: Any) -> FileEntry:
    """One entry of a manifest's ``files`` as written by :meth:`Manifest.to_json`; ValueError saying which part is
    not (a size of 1e400 is a float, infinity: refused here rather than an OverflowError later)."""
    if not isinstance(raw, dict):
        raise ValueError(f"a file entry should be an object, found {short_repr(raw)}")
    path, size, sha256 = raw["path"], raw["size"], raw["sha256"]
    if not isinstance(path, str):
        raise ValueError(f"a file path should be a string, found {short_repr(path)}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"{path!r}: size should be an int >= 0, found {short_repr(size)}")
    if not isinstance(sha256, str) or not _SHA256_HEX.fullmatch(sha256):
        raise ValueError(f"{path!r}: sha256 should be 64 hex digits, found {short_repr(sha256)}")
    return FileEntry(path, size, sha256)


def unreadable_file(source: str, what: str) -> CorruptCheckpointError:
    """The error for a checkpoint file ``source`` that cannot be decoded, saying ``what`` is wrong."""
    return CorruptCheckpointError(f"{source}: not a readable checkpoint file (truncated or corrupt?): {what}")


def short_repr(value: Any, limit: int = 60) -> str:
    """repr of a value read from a damaged checkpoint file, cut to ``limit`` characters (reprlib: a long list is
    not rendered whole first)."""
    text = reprlib.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: Files of a checkpoint directory that Tune's ``Trainable.restore`` reads with (cloud)pickle before our
#: ``load_checkpoint`` runs (``ray/tune/trainable/trainable.py``: a class trainable's dict checkpoint). R3 saves to
#: a directory and never writes them, so one found there was put there by someone else.
TUNE_PICKLED_FILES = ("_dict_checkpoint.pkl",)


def verify_checkpoint(directory: str, *, hashes: bool = True) -> Manifest | None:
    """Check the checkpoint in ``directory`` against its manifest: every listed file present with its size and
    (``hashes``) its sha256. Return the manifest, or None for a directory without one (the caller decides: a
    checkpoint written before manifests existed, or an interrupted save). CorruptCheckpointError naming the file and what differs otherwise.
    Sizes are checked for all files before any is hashed, so a truncated checkpoint is refused without reading it.
    A file Tune would unpickle on restore (:data:`TUNE_PICKLED_FILES`) is refused whatever the manifest says."""
    for name in TUNE_PICKLED_FILES:
        if os.path.exists(os.path.join(directory, name)):
            raise CorruptCheckpointError(
                f"{os.path.join(directory, name)}: R3 never writes this file, and Tune's restore would unpickle it "
                "(running any code it names): refused"
            )
    manifest = read_manifest(directory)
    if manifest is None:
        return None
    for entry in manifest.files:
        full = os.path.join(directory, entry.path)
        if not os.path.isfile(full):
            raise CorruptCheckpointError(f"{full}: listed in {MANIFEST_FILE} but missing")
        size = os.path.getsize(full)
        if size != entry.size:
            raise CorruptCheckpointError(
                f"{full}: {size} bytes, {MANIFEST_FILE} says {entry.size} (truncated?)"
            )
    if hashes:
        for entry in manifest.files:
            full = os.path.join(directory, entry.path)
            if (found := sha256_file(full)) != entry.sha256:
                raise CorruptCheckpointError(
                    f"{full}: content changed since it was saved (sha256 {found[:16]}..., {MANIFEST_FILE} says "
                    f"{entry.sha256[:16]}...)"
                )
    extra = set(checkpoint_file_paths(directory)) - {e.path for e in manifest.files}
    if extra:  # not read by a restore: harmless, but worth a look
        logger.warning("%s: files not in its %s: %s", directory, MANIFEST_FILE, ", ".join(sorted(extra)))
    return manifest


# -- a trial's checkpoints ---------------------------------------------------------------------------------------
def trial_checkpoints(trial_dir: str) -> list[tuple[int, str]]:
    """Tune's checkpoint directories (``checkpoint_000007``) in ``trial_dir`` as (index, path), newest first."""
    try:
        names = os.listdir(trial_dir)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), os.path.join(trial_dir, n)) for n in names if (m := CHECKPOINT_DIR.match(n))]
    return sorted((c for c in found if os.path.isdir(c[1])), reverse=True)


def quarantine(path: str, reason: str) -> str:
    """Move the refused checkpoint ``path`` aside (renamed, never deleted: it may still be worth a look) to
    ``<path>.incomplete`` (``.incomplete.1``, ... if taken) with the reason in a REFUSED.txt inside; return the new
    path. Tune's checkpoint names no longer match it, so neither Tune nor a later resume takes it again."""
    target, n = f"{path}.incomplete", 0
    while os.path.exists(target):
        n += 1
        target = f"{path}.incomplete.{n}"
    os.rename(path, target)
    try:
        with open(os.path.join(target, "REFUSED.txt"), "w") as f:
            f.write(reason + "\n")
    except OSError:  # a full disk: the rename is what matters
        pass
    return target

"""Distinct user ids for the sandbox runs alive at once on one machine.

Under the "namespaces" isolation each run's program runs as a user id of its own (:mod:`r3_rllib.tools.sandbox`),
and ``RLIMIT_NPROC`` counts that user's processes: two runs that drew the same id would share one process budget,
so one run's fork bomb could make the other's forks fail (drawn at random from 60,000 ids, about 3 % at 64
concurrent runs). :func:`lease_uid` hands out an id that no other live run on this machine holds: a write lock on
byte ``uid - lo`` of one lock file, held for the run's lifetime.

Why this form:

- *Nothing leaks*: the kernel drops the lock when the last descriptor of its open file description closes, so a
  run whose processes die (SIGKILL of the caller, the OOM killer) frees its id with them; there is nothing to clean
  up and no stale state to recognise.
- *Open-file-description locks* (``F_OFD_SETLK``), not classic POSIX ``lockf`` locks: those belong to the process,
  so two threads of one rollout worker would not exclude each other, and closing any descriptor of the file would
  drop every lock the process holds on it.
- *One file with a byte per id*, not a file per id: the directory never fills up with 60,000 lock files, and no
  lock file is ever deleted (deleting one that another process has open lets two holders lock "the same" path).
- *In /dev/shm*: every process of the machine (of the container) sees the same file whatever its ``TMPDIR``, and
  Ray needs /dev/shm anyway. The sandboxed programs never see it (they get a /dev/shm of their own).
- *A random start, then every id in turn*: a run gives up only when every id of the range is held, so the answer
  never depends on luck; with a few hundred runs among 60,000 ids the first try almost always succeeds.

The caller creates the file 0600 without following a symlink (namespaces need root, so every run locks as root).
A file it cannot trust (another user's, a symlink, a hard link, one other users may open, which could hold locks
on ids) is not used: each run then draws its id at random as before, and a warning says why (once per path and
process). Why not refuse to run: the lock only guards against the small chance of two runs sharing a process
budget, a matter of reliability, and a file name in a world-writable directory that any local user can take first
must not stop every tool call.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import stat
import struct
import threading
from dataclasses import dataclass

logger = logging.getLogger(__name__)

#: The lock file every sandbox run of this machine leases its user id in (read at each lease, so it can be moved).
LOCK_PATH = "/dev/shm/r3-rllib-sandbox-uids.lock"
#: ``struct flock`` of 64-bit Linux (x86_64 and aarch64): l_type, l_whence, l_start, l_len, l_pid, padding.
_FLOCK = struct.Struct("@hhqqi4x")
_warned: set[str] = set()
_warned_lock = threading.Lock()


class UidsInUse(OSError):
    """Every user id of the range is held by another live sandbox run on this machine."""


class _Unusable(Exception):
    """The lock file cannot be trusted or locked; the message says why."""


@dataclass
class UidLease:
    """A user id held for one sandbox run: no other run leasing from the same lock file gets it until every
    descriptor of `fd` is closed (this one by :meth:`release`, copies in child processes when they end)."""

    uid: int
    #: The open lock file whose byte ``uid - lo`` this lease write-locks; None when the lock file could not be used
    #: (the id was drawn at random, as a run without this module would).
    fd: int | None

    def release(self) -> None:
        """Close this process's descriptor of the lock (the lock itself goes once no child holds a copy)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> UidLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lease_uid(lo: int, hi: int, path: str | None = None) -> UidLease:
    """A user id in ``[lo, hi)`` that no other live lease of `path` (default :data:`LOCK_PATH`) holds.

    Tries a random id first, then each following one (wrapping around), each with a non-blocking lock. Raises
    :class:`UidsInUse` when every id of the range is held. Where the lock file cannot be used (see the module
    docstring) the id is drawn at random, with a warning."""
    if not 0 <= lo < hi:
        raise ValueError(f"the user id range must satisfy 0 <= lo < hi, got [{lo}, {hi})")
    path = LOCK_PATH if path is None else path
    n = hi - lo
    start = secrets.randbelow(n)
    try:
        fd = _open_lock_file(path)
    except _Unusable as e:
        return _unlocked(lo, start, path, str(e))
    try:
        for i in range(n):
            if _try_lock(fd, (start + i) % n):
                return UidLease(lo + (start + i) % n, fd)
    except _Unusable as e:
        os.close(fd)
        return _unlocked(lo, start, path, str(e))
    os.close(fd)
    raise UidsInUse(f"every sandbox user id in [{lo}, {hi}) is held by another live run (lock file {path})")


def _open_lock_file(path: str) -> int:
    """Open (creating it 0600 if absent) the lock file at `path`, refusing one this user cannot trust."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        raise _Unusable(
            "it is a symbolic link" if e.errno == errno.ELOOP else f"cannot open it: {e}"
        ) from None
    try:
        problem = _distrust(os.fstat(fd))
    except OSError as e:
        problem = f"cannot stat it: {e}"
    if problem:
        os.close(fd)
        raise _Unusable(problem)
    return fd


def _distrust(st: os.stat_result) -> str | None:
    """Why a lock file with status `st` must not be used, or None: others able to open it could hold locks on
    ids (or release them through a descriptor of their own), and a link to another file is not ours to lock."""
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_uid != os.geteuid():
        return f"it belongs to user {st.st_uid}, not to this user ({os.geteuid()})"
    if st.st_mode & 0o077:
        return f"its mode {stat.S_IMODE(st.st_mode):04o} lets other users open it"
    if st.st_nlink != 1:
        return f"it has {st.st_nlink} hard links"
    return None


def _try_lock(fd: int, offset: int) -> bool:
    """Write-lock byte `offset` of the lock file without waiting; False when another open file description holds
    it."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0))
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise _Unusable(f"cannot lock it: {e}") from None  # e.g. EINVAL: a kernel before 3.15
    return True


def _unlocked(lo: int, offset: int, path: str, reason: str) -> UidLease:
    """The fallback lease: the randomly drawn id, unlocked, with a warning the first time for `path`."""
    with _warned_lock:
        first = path not in _warned
        _warned.add(path)
    if first:
        logger.warning(
            "sandbox user ids: not using the lock file %s (%s); each run draws its user id at random, and two "
            "concurrent runs may then share one, and so one process-count limit",
            path,
            reason,
        )
    return UidLease(lo + offset, None)

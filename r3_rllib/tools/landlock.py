"""Landlock: confine a process's files, TCP sockets and signals without root, for the "rlimits" sandbox.

Why: where the sandbox cannot build a filesystem of its own (no namespaces: Docker's default capabilities), the
program would read and write whatever its user can: the checkout, run checkpoints, ``/tmp``, ``/dev/shm``, Ray's 0777
session folders under ``/tmp/ray`` (its runtime_env caches among them), and as the calling user it could signal the
launcher. Landlock (Linux 5.13+) lets an unprivileged process drop access rights for itself and every process it
starts, irrevocably: :func:`restrict_self` keeps read and execute access beneath the system and interpreter
directories, read and write access to a few device files, read access to the process's own ``/proc`` entry, full
access beneath the scratch directory (and ``/dev/shm``, where the sandbox asks), and nothing else of the filesystem
(other processes' ``/proc`` entries and ``/sys`` included). From ABI 4 it also refuses every TCP ``bind`` and
``connect``; from ABI 6 it refuses signals to processes outside the sandbox (the launcher and the caller among them)
and connections to abstract unix sockets bound outside it. Root is held to the same rules.

What Landlock does not cover: UDP and sockets bound to a path (the sandbox's seccomp filter refuses every socket
under "rlimits": :mod:`r3_rllib.tools.seccomp`), and files reached through a descriptor opened before the
restriction (the launcher closes all of them but the standard three).

Each ABI version adds rights; a kernel refuses rights it does not know, so the handled rights are those of
``min(abi, KNOWN_ABI)`` (:func:`handled_rights`). Stdlib only: the sandbox launcher imports this module in an
interpreter started with ``-I -S``.
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct
from dataclasses import dataclass

# System call numbers: the same on every architecture (they were added after the tables were unified).
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem rights (linux/landlock.h), with the ABI version that added them.
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
#: ABI 1's rights: the four above and remove/make of every kind of file (bits 4 to 12).
FS_ABI1 = (1 << 13) - 1
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
#: Rights a rule on a file (not a directory) may grant; any other right makes the kernel refuse the rule.
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
#: The newest ABI whose rights this module knows; a newer kernel is given these.
KNOWN_ABI = 7


@dataclass(frozen=True)
class Rights:
    """The access a ruleset handles (everything not granted by a rule is refused) at one ABI version."""

    fs: int
    net: int
    scoped: int


def handled_rights(abi: int) -> Rights:
    """Every right Landlock ABI `abi` can refuse: files from 1 (``REFER`` from 2, ``TRUNCATE`` from 3,
    ``IOCTL_DEV`` from 5), TCP bind and connect from 4, signal and abstract-socket scopes from 6."""
    if abi < 1:
        raise ValueError(f"Landlock ABI {abi}: no rights to handle")
    abi = min(abi, KNOWN_ABI)
    fs = (
        FS_ABI1
        | (FS_REFER if abi >= 2 else 0)
        | (FS_TRUNCATE if abi >= 3 else 0)
        | (FS_IOCTL_DEV if abi >= 5 else 0)
    )
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    return Rights(fs, net, scoped)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 where it has none (too old, not enabled at boot, or the call is
    refused, e.g. by a container's seccomp profile)."""
    libc = _libc()
    version = libc.syscall(ctypes.c_long(_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(version), 0)


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"landlock {what}: {os.strerror(errno)}")
    return result


def _add_path_rule(libc: ctypes.CDLL, ruleset: int, path: str, allowed: int) -> None:
    """Grant `allowed` beneath `path` (a file: only the file rights among them); a path that does not exist or
    cannot be opened is skipped."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            allowed &= FILE_RIGHTS
        attr = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd), 12)  # packed: 8 + 4 bytes
        _check(
            libc.syscall(ctypes.c_long(_ADD_RULE), ruleset, _RULE_PATH_BENEATH, attr, 0), f"rule for {path}"
        )
    finally:
        os.close(fd)


def restrict_self(abi: int, read: list[str], write: list[str], devices: list[str]) -> None:
    """Confine this process and everything it starts from now on (see the module docstring): read and execute
    beneath `read`, every right beneath `write`, read and write of the files `devices`, reading this process's own
    ``/proc`` entry; every other file, TCP bind/connect (ABI >= 4), signals and abstract unix sockets leaving the
    sandbox (ABI >= 6) refused. Sets no-new-privileges (Landlock requires it of an unprivileged process). Raises
    OSError when the kernel refuses."""
    rights = handled_rights(abi)
    libc = _libc()
    attr = struct.pack("=QQQ", rights.fs, rights.net, rights.scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # older kernels refuse a longer struct with E2BIG
    buf = ctypes.create_string_buffer(attr[:size], size)
    ruleset = _check(libc.syscall(ctypes.c_long(_CREATE_RULESET), buf, ctypes.c_size_t(size), 0), "ruleset")
    try:
        reading = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
        device = (FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV) & rights.fs
        # Its own /proc entry, read-only (its status, its descriptors): not another process's (the caller's
        # environment and command line, when they share a user). A process it starts has another pid: not its own.
        own = [f"/proc/{os.getpid()}"]
        for paths, allowed in (
            (read, reading),
            (own, FS_READ_FILE | FS_READ_DIR),
            (devices, device),
            (write, rights.fs),
        ):
            for path in paths:
                _add_path_rule(libc, ruleset, path, allowed)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            _check(-1, "no-new-privileges")
        _check(libc.syscall(ctypes.c_long(_RESTRICT_SELF), ruleset, 0), "restrict_self")
    finally:
        os.close(ruleset)

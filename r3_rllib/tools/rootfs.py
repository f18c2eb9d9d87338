"""The sandbox's root filesystem: a minimal read-only tree built inside a fresh mount namespace.

Why: a mount namespace alone leaves the host's whole tree visible. A hostile program could read every
world-readable host path (the checkout with ``.git/config``, run checkpoints, Ray's logs under ``/tmp/ray``) and
write every world-writable one (``/run/lock`` persisted from one run to the next). So the program gets a new root
(``pivot_root``, then the old root is detached: there is no path back to it, unlike ``chroot``) that holds only:

- ``/usr``, ``/bin``, ``/sbin``, ``/lib*`` (symlinks kept as symlinks on merged-/usr systems), the interpreter's
  prefixes (the venv and the base installation it points to) and a few ``/etc`` files the dynamic loader and
  ``time`` read; all bind mounts, read-only, ``nosuid``, ``nodev``. Directories created only to reach a prefix
  (e.g. ``/root`` on the way to ``/root/.pyenv/...``) are mode 0711: they can be crossed but not listed;
- ``/dev`` with ``null``, ``zero``, ``full``, ``random``, ``urandom`` (bound from the host) and the ``fd`` links;
- a fresh ``/proc`` of the sandbox's PID namespace (only its own processes);
- one tmpfs of ``disk_mb`` and a bounded number of inodes, owned by the sandbox user, that holds the working
  directory ``/scratch``, ``/tmp`` and ``/dev/shm``: the only writable places, together bounded in size and inodes
  (a full disk is ENOSPC inside, never a full host disk), and their pages are freed with the namespace;
- the root itself, a tiny tmpfs remounted read-only once built.

:func:`root_layout` decides the tree (on the host, before the run; no side effects); :func:`build_root` builds it
(in the sandbox's PID 1, as root, inside the new mount namespace). Stdlib only: the launcher runs with ``-I -S``.
"""

from __future__ import annotations

import ctypes
import os
import sys

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")
DEVICES = ("null", "zero", "full", "random", "urandom")
#: The working directory inside: the program's main.py lives here.
WORKDIR = "/scratch"

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
_MNT_DETACH = 0x2
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

Op = list[str]


def interpreter_prefixes(python: str) -> list[str]:
    """The directories `python` needs: the prefix of every hop of its symlink chain (a venv's ``bin/python`` points
    at the base installation) and, for the running interpreter, its ``sys`` prefixes (the venv's packages)."""
    dirs, path = [], os.path.abspath(python)
    for _ in range(40):  # a symlink loop ends here instead of spinning
        parent = os.path.dirname(path)
        dirs.append(os.path.dirname(parent) if os.path.basename(parent) == "bin" else parent)
        if not os.path.islink(path):
            break
        path = os.path.normpath(os.path.join(parent, os.readlink(path)))
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        dirs += [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    return dirs


def root_layout(prefixes: list[str]) -> list[Op]:
    """The tree of the sandbox's root as a list of operations, in order: ``["dir", path, mode]``,
    ``["bind", source, path]`` (read-only), ``["symlink", target, path]`` and ``["dev", name]``."""
    ops: list[Op] = [["dir", d, "755"] for d in ("/dev", "/etc", "/proc", "/tmp", WORKDIR)]
    bound: list[str] = []
    for top in SYSTEM_DIRS:
        if os.path.islink(top):
            ops.append(["symlink", os.readlink(top), top])
        elif os.path.isdir(top):
            ops.append(["bind", top, top])
            bound.append(top)
    ops += [["bind", os.path.realpath(f), f] for f in ETC_FILES if os.path.exists(f)]
    ops += [["dev", name] for name in DEVICES if os.path.exists(f"/dev/{name}")]
    ops += [
        ["symlink", f"/proc/self/fd/{i}", f"/dev/{n}"] for i, n in enumerate(("stdin", "stdout", "stderr"))
    ]
    ops += [["symlink", "/proc/self/fd", "/dev/fd"], ["dir", "/dev/shm", "755"]]
    for prefix in sorted({p for d in prefixes for p in (os.path.abspath(d), os.path.realpath(d))}, key=len):
        if prefix == "/" or any(_is_under(prefix, b) for b in bound + ["/proc", "/dev", "/tmp", WORKDIR]):
            continue
        if os.path.isdir(prefix):
            ops += [["dir", parent, "711"] for parent in _parents(prefix)]
            ops.append(["bind", os.path.realpath(prefix), prefix])
            bound.append(prefix)
    return ops


def _is_under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    if _libc().mount(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target} ({fstype}, flags {flags:#x}): {os.strerror(errno)}")


def _bind(source: str, target: str, flags: int) -> None:
    # A bind mount takes its flags from the source mount; read-only/nosuid/nodev need a second, remounting call.
    _mount(source, target, None, _MS_BIND)
    _mount(None, target, None, _MS_BIND | _MS_REMOUNT | flags)


def _apply(root: str, op: Op) -> None:
    kind = op[0]
    if kind == "dir":
        path = root + op[1]
        os.makedirs(path, exist_ok=True)
        os.chmod(path, int(op[2], 8))
    elif kind == "symlink":
        path = root + op[2]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(op[1], path)
    elif kind == "dev":
        path = f"{root}/dev/{op[1]}"
        open(path, "w").close()  # a bind mount needs a target of the source's type: an empty file
        _bind(f"/dev/{op[1]}", path, _MS_NOSUID | _MS_NOEXEC)  # not nodev: these are the device nodes
    else:
        path = root + op[2]
        if os.path.isdir(op[1]):
            os.makedirs(path, exist_ok=True)
        else:
            open(path, "a").close()
        _bind(op[1], path, _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def build_root(root: str, layout: list[Op], disk_mb: int, inodes: int, uid: int) -> None:
    """Build the tree `layout` on an empty directory `root`, mount the scratch tmpfs (`disk_mb`, `inodes`, owned by
    `uid`) and /proc, then make it the root of this mount namespace, read-only. Needs root in a new mount namespace
    and, for /proc, to be in the new PID namespace."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here propagates back to the host
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,nr_inodes=512,mode=755")
    for op in layout:
        _apply(root, op)
    stage = root + "/.stage"
    os.mkdir(stage)
    opts = f"size={disk_mb}m,nr_inodes={inodes},mode=700,uid={uid},gid={uid}"
    _mount("tmpfs", stage, "tmpfs", _MS_NOSUID | _MS_NODEV, opts)
    for sub, target in (("work", WORKDIR), ("tmp", "/tmp"), ("shm", "/dev/shm")):
        os.mkdir(f"{stage}/{sub}", 0o700)
        os.chown(f"{stage}/{sub}", uid, uid)
        # One tmpfs behind all three: the size and inode bounds hold for their sum.
        _mount(f"{stage}/{sub}", root + target, None, _MS_BIND)
    _libc().umount2(stage.encode(), _MNT_DETACH)
    os.rmdir(stage)
    _mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _pivot(root)
    _mount(None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def _pivot(root: str) -> None:
    # pivot_root(".", "."): the old root ends up stacked on the new one and is then detached: nothing of the host's
    # tree stays reachable (a chroot could be left with a directory fd or a second chroot).
    os.chdir(root)
    libc = _libc()
    number = _PIVOT_ROOT.get(os.uname().machine)
    if number is None or libc.syscall(number, b".", b".") != 0:
        raise OSError(ctypes.get_errno(), f"pivot_root into {root} failed")
    if libc.umount2(b".", _MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), "detaching the old root failed")
    os.chdir("/")

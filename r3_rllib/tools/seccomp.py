"""A seccomp filter that denies the system calls a sandboxed program could use to escape its limits.

Why a filter at all: the resource limits of :mod:`r3_rllib.tools.sandbox` count address space (``RLIMIT_AS``), but
memory held by a file descriptor or a filesystem is not in any process's address space: ``memfd_create`` files, SysV
shared memory and a tmpfs mounted in a user namespace the program made for itself all grow host memory without
bound (measured: 60 memfd files of 16 MB raised host shared memory from 8 to 968 MB under ``memory_mb=128``). The
kernel can refuse those calls before they happen, for any user, with no root needed: a classic-BPF program attached
with ``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)`` after ``prctl(PR_SET_NO_NEW_PRIVS)``. It is inherited by every
process the program starts and cannot be removed.

What the filter does (the same for x86_64 and aarch64; a system call made under any other architecture value, e.g.
the 32-bit ``int 0x80`` entry on x86_64, or an x32 call, kills the process, so no second table is a way around it):

- denied with ``EPERM``: memory held outside the address space (``memfd_create``, ``memfd_secret``, ``userfaultfd``
  and all of System V IPC and POSIX message queues: ``shm*``, ``sem*``, ``msg*``, ``mq_*``; measured: 150 SysV
  semaphore sets of 32000 took 300 MB of kernel memory under ``memory_mb=128``, 32000 sets would take ~64 GB, and
  under "rlimits" they live in the host's IPC namespace and outlast the run), namespaces (``unshare``, ``setns``,
  and ``clone`` whose flags ask for a new namespace, ``CLONE_NEWUSER`` included), mounts and root changes
  (``mount``, ``umount2``, ``pivot_root``, ``chroot`` and the new mount API), kernel keyrings, other processes'
  memory (``ptrace``, ``process_vm_*``, ``pidfd_getfd``, ``kcmp``), ``bpf``, ``perf_event_open``, ``io_uring`` (its
  operations bypass seccomp), Linux AIO (``io_setup`` and the rest: 16 contexts took the host's whole ``aio-max-nr``
  for the run, ``io_setup`` failing with EAGAIN for every other process meanwhile), kernel modules and ``kexec``,
  ``open_by_handle_at`` and the kernel log (``syslog``);
- ``socket`` of any family but ``AF_UNIX`` is denied with ``EPERM``: no UDP, TCP, raw or netlink socket, whatever
  the Landlock ABI (Landlock governs TCP from ABI 4 and never UDP). With ``unix_sockets=False`` (the sandbox's
  "rlimits" isolation, where the program sees the host's files) ``AF_UNIX`` is denied too, and ``socketpair`` is
  allowed for ``SOCK_STREAM`` only: a path-bound unix socket of the host (a service's, an agent's, Ray's) is reached
  by ``connect`` on a new socket or by ``sendto`` a path from a datagram socket, and Landlock governs neither
  (measured before: a sandboxed program connected to a host socket and sent a datagram to another). A stream
  socketpair is connected from birth, so it can address nothing else; multiprocessing's pipes and queues and
  asyncio's wake-up pair use one. Under "namespaces" (``unix_sockets=True``) the host's sockets are not in the
  program's root, and its unix sockets are its own;
- ``clone3`` fails with ``ENOSYS``: it passes its flags in a struct that a filter cannot read, and on ``ENOSYS`` the C
  library falls back to ``clone``, whose flags the filter checks: threads, ``fork`` and ``subprocess`` keep working;
- everything else is allowed (a deny list: a system call added to the kernel later is allowed until listed here).

Stdlib only: the sandbox launcher imports this module in an interpreter started with ``-I -S``.
"""

from __future__ import annotations

import ctypes
import os
import struct

# Classic BPF opcodes (linux/filter.h) and seccomp constants (linux/seccomp.h, linux/audit.h).
_LD_W_ABS, _JEQ_K, _JSET_K, _JGE_K, _RET_K = 0x20, 0x15, 0x45, 0x35, 0x06
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38
# struct seccomp_data: the call's number, its architecture, and its arguments' low 32 bits (little endian).
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0, _OFFSET_ARG1 = 0, 4, 16, 24
_ALU_AND_K = 0x54
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_X32_SYSCALL_BIT = 0x40000000

#: clone() flags that create a namespace (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET).
NAMESPACE_CLONE_FLAGS = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
)

#: The one socket family a program may open where its unix sockets are its own (``unix_sockets=True``).
AF_UNIX = 1
#: The one socketpair type allowed with ``unix_sockets=False`` (the type's low bits; SOCK_NONBLOCK and SOCK_CLOEXEC
#: are flags above them).
SOCK_STREAM, SOCK_TYPE_MASK = 1, 0xF

#: Per architecture: its AUDIT_ARCH value, the numbers of `clone`, `clone3` and `socket`, and the denied system
#: calls.
ARCHES: dict[str, dict] = {
    "x86_64": {
        "audit_arch": 0xC000003E,
        "clone": 56,
        "clone3": 435,
        "socket": 41,
        "socketpair": 53,
        "denied": {
            "memfd_create": 319,
            "memfd_secret": 447,
            "shmget": 29,
            "shmat": 30,
            "shmctl": 31,
            "shmdt": 67,
            "semget": 64,
            "semop": 65,
            "semctl": 66,
            "semtimedop": 220,
            "msgget": 68,
            "msgsnd": 69,
            "msgrcv": 70,
            "msgctl": 71,
            "mq_open": 240,
            "mq_unlink": 241,
            "mq_timedsend": 242,
            "mq_timedreceive": 243,
            "mq_notify": 244,
            "mq_getsetattr": 245,
            "userfaultfd": 323,
            "unshare": 272,
            "setns": 308,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "pidfd_getfd": 438,
            "kcmp": 312,
            "bpf": 321,
            "perf_event_open": 298,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "io_setup": 206,
            "io_destroy": 207,
            "io_getevents": 208,
            "io_submit": 209,
            "io_cancel": 210,
            "io_pgetevents": 333,
            "kexec_load": 246,
            "kexec_file_load": 320,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "name_to_handle_at": 303,
            "open_by_handle_at": 304,
            "syslog": 103,
        },
    },
    "aarch64": {
        "audit_arch": 0xC00000B7,
        "clone": 220,
        "clone3": 435,
        "socket": 198,
        "socketpair": 199,
        "denied": {
            "memfd_create": 279,
            "memfd_secret": 447,
            "shmget": 194,
            "shmat": 196,
            "shmctl": 195,
            "shmdt": 197,
            "semget": 190,
            "semop": 193,
            "semctl": 191,
            "semtimedop": 192,
            "msgget": 186,
            "msgsnd": 189,
            "msgrcv": 188,
            "msgctl": 187,
            "mq_open": 180,
            "mq_unlink": 181,
            "mq_timedsend": 182,
            "mq_timedreceive": 183,
            "mq_notify": 184,
            "mq_getsetattr": 185,
            "userfaultfd": 282,
            "unshare": 97,
            "setns": 268,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "chroot": 51,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "pidfd_getfd": 438,
            "kcmp": 272,
            "bpf": 280,
            "perf_event_open": 241,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "io_setup": 0,
            "io_destroy": 1,
            "io_getevents": 4,
            "io_submit": 2,
            "io_cancel": 3,
            "io_pgetevents": 292,
            "kexec_load": 104,
            "kexec_file_load": 294,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "name_to_handle_at": 264,
            "open_by_handle_at": 265,
            "syslog": 116,
        },
    },
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _allow_only_if(number: int, offset: int, value: int, *, mask: int | None = None) -> list[bytes]:
    """Instructions deciding system call ``number`` on one argument: allowed when the argument's low word at
    ``offset`` (masked with ``mask``) equals ``value``, else EPERM; any other call goes on to what follows."""
    test = [_insn(_LD_W_ABS, 0, 0, offset)]
    if mask is not None:
        test.append(_insn(_ALU_AND_K, 0, 0, mask))
    decide = [
        _insn(_JEQ_K, 1, 0, value),
        _insn(_RET_K, 0, 0, RET_ERRNO | EPERM),
        _insn(_RET_K, 0, 0, RET_ALLOW),
    ]
    return [_insn(_JEQ_K, 0, len(test) + len(decide), number), *test, *decide]


def filter_program(arch: str, *, unix_sockets: bool = True) -> bytes:
    """The filter for `arch` ('x86_64' or 'aarch64') as packed ``struct sock_filter`` instructions; with
    ``unix_sockets=False`` no ``socket`` at all and stream socketpairs only (see the module docstring).

    Layout: check the architecture (else kill), refuse x32 calls, one compare-and-return pair per denied call,
    then ``clone3`` (ENOSYS), ``socket`` with its family tested (or denied), ``socketpair`` with its type tested
    (without unix sockets), ``clone`` with its flags tested, and allow the rest. Every jump is forward and short (at
    most 5), so no offset can overflow the 8-bit jump fields however long the list grows.
    """
    table = ARCHES[arch]
    prog = [
        _insn(_LD_W_ABS, 0, 0, _OFFSET_ARCH),
        _insn(_JEQ_K, 1, 0, table["audit_arch"]),
        _insn(_RET_K, 0, 0, RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0, 0, _OFFSET_NR),
    ]
    if arch == "x86_64":  # the x32 ABI: the same numbers with bit 30 set, a second door into the same calls
        prog += [_insn(_JGE_K, 0, 1, _X32_SYSCALL_BIT), _insn(_RET_K, 0, 0, RET_KILL_PROCESS)]
    for number in sorted(table["denied"].values()):
        prog += [_insn(_JEQ_K, 0, 1, number), _insn(_RET_K, 0, 0, RET_ERRNO | EPERM)]
    prog += [
        _insn(_JEQ_K, 0, 1, table["clone3"]),
        _insn(_RET_K, 0, 0, RET_ERRNO | ENOSYS),
    ]
    if unix_sockets:
        prog += _allow_only_if(table["socket"], _OFFSET_ARG0, AF_UNIX)
    else:
        prog += [_insn(_JEQ_K, 0, 1, table["socket"]), _insn(_RET_K, 0, 0, RET_ERRNO | EPERM)]
        prog += _allow_only_if(table["socketpair"], _OFFSET_ARG1, SOCK_STREAM, mask=SOCK_TYPE_MASK)
    prog += [
        _insn(_JEQ_K, 0, 3, table["clone"]),
        _insn(_LD_W_ABS, 0, 0, _OFFSET_ARG0),
        _insn(_JSET_K, 0, 1, NAMESPACE_CLONE_FLAGS),
        _insn(_RET_K, 0, 0, RET_ERRNO | EPERM),
        _insn(_RET_K, 0, 0, RET_ALLOW),
    ]
    return b"".join(prog)


def native_arch() -> str | None:
    """This machine's architecture name in :data:`ARCHES`, or None when the filter has no table for it."""
    machine = os.uname().machine.lower()  # not platform.machine(): platform imports re, ~10 ms at start-up
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return machine if machine in ARCHES else None


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def install_filter(*, unix_sockets: bool = True) -> None:
    """Attach the filter to the calling process (and so to everything it executes or starts), for good;
    ``unix_sockets``: see :func:`filter_program`.

    Raises OSError when the kernel refuses (no seccomp support) and RuntimeError on an architecture with no table.
    """
    arch = native_arch()
    if arch is None:
        raise RuntimeError(f"no seccomp table for architecture {os.uname().machine!r}")
    program = filter_program(arch, unix_sockets=unix_sockets)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    # No new privileges: required for an unprivileged filter, and a setuid binary can then gain nothing.
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    fprog = _SockFprog(len(program) // 8, program)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")

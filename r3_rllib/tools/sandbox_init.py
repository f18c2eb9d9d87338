"""The sandbox launcher: the process :func:`r3_rllib.tools.sandbox.run_python` starts, which starts the program.

Run as ``python -I -S sandbox_init.py`` with its configuration on stdin, a :mod:`marshal`-ed dict (stdlib only,
no site, no json/re/enum imports: it starts in ~15 ms). Why a
launcher of our own instead of util-linux ``unshare``/``setpriv`` and a shell script: the seccomp filter must be
installed between the last privileged step and ``execve``, which no util-linux tool does; the program must not be
PID 1 of its PID namespace (a PID 1 ignores every signal it has no handler for, its own SIGTERM/SIGKILL included),
so a waiter of ours is PID 1; and the exact exit status must come back (a shell as PID 1 reports 128+N for both
``exit(128+N)`` and death by signal N).

Under ``"namespaces"`` (root): the launcher creates new mount, PID, network, IPC, UTS and cgroup namespaces and
forks PID 1, which builds the read-only root (:mod:`r3_rllib.tools.rootfs`), forks the program (PID 2) and reaps
until the program ends; then PID 1 exits, and the kernel kills every process left in the namespace. The program
drops to its own user id (no groups), gets its resource limits, the parent-death signal and the seccomp filter
(:mod:`r3_rllib.tools.seccomp`), and executes the interpreter. PID 1 sends the program's raw wait status to the
launcher through a pipe; the launcher exits the same way (same code, or the same signal), so the caller sees the
program's own status. SIGTERM to the launcher kills PID 1 (and so the namespace) at once: that is the timeout.

Under ``"rlimits"`` (any user): no namespaces; the launcher is a child subreaper (orphans of the program are
re-parented to it, ``setsid`` or not), forks the program with the same limits, parent-death signal and seccomp
filter (where the kernel allows one), and once the program ends, or on SIGTERM, kills every descendant left. A root
caller's program drops to its leased user id (no groups, no new privileges) as under namespaces; before it starts,
every process still running as that id (orphans of an earlier run whose caller and launcher were killed) is killed,
so the run's process count, scratch directory and signals are its own.

Setup errors go to the launcher's stderr (exit code 125), never into the program's output.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import signal
import struct
import sys

try:
    from r3_rllib.tools import landlock, rootfs, seccomp
except (
    ImportError
):  # run as a script with -I -S: the package is not importable, its directory holds the siblings
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import landlock  # type: ignore[no-redef]
    import rootfs  # type: ignore[no-redef]
    import seccomp  # type: ignore[no-redef]

_CLONE_NEW = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x20000000 | 0x40000000
)  # NS CGROUP UTS IPC PID NET
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 1, 36, 38
SETUP_FAILED = 125


def _prctl(option: int, value: int) -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _exec_program(cfg: dict) -> None:
    """In the forked program process: drop privileges, apply the limits and the filter, execute. Never returns."""
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the launcher (or PID 1) gone: the program goes too
        os.chdir(cfg["cwd"])
        uid = cfg["uid"]
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            # Set here, not only by the seccomp filter (which "rlimits" may run without): a setuid or file-capability
            # binary the program executes gains nothing.
            _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        # "rlimits": the files, TCP sockets and signals the program may reach (tools/landlock.py).
        rules = cfg["landlock"]
        if rules is not None:
            landlock.restrict_self(rules["abi"], rules["read"], rules["write"], rules["devices"])
        for which, value in cfg["limits"]:
            resource.setrlimit(which, (value, value))
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])  # execve keeps the mask: the program starts with none
        try:
            seccomp.install_filter(unix_sockets=cfg["unix_sockets"])
        except (OSError, RuntimeError):
            if cfg["require_seccomp"]:
                raise
    except BaseException as e:  # noqa: BLE001 - any failure here is a setup failure, reported on stderr
        os.write(2, f"sandbox setup failed: {type(e).__name__}: {e}\n".encode())
        os._exit(SETUP_FAILED)
    try:
        os.dup2(1, 2)  # the program's stderr joins its stdout, interleaved as written
        os.closerange(3, 1 << 16)
        os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
    except BaseException as e:  # noqa: BLE001
        os.write(2, f"sandbox could not execute {cfg['argv'][0]}: {e}\n".encode())
    os._exit(127)


def _start_program(cfg: dict) -> int:
    """Write main.py into the working directory and fork the program; its pid."""
    path = os.path.join(cfg["cwd"], "main.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(cfg["code"])
    if cfg["uid"] is not None:
        os.chown(path, cfg["uid"], cfg["uid"])
    pid = os.fork()
    if pid == 0:
        _exec_program(cfg)
    return pid


def _reap_until(pid: int) -> int:
    """Reap children (orphans are ours: PID 1 or subreaper) until `pid` ends; its raw wait status."""
    while True:
        child, status = os.waitpid(-1, 0)
        if child == pid:
            return status


def _children() -> list[int]:
    me = os.getpid()
    with open(f"/proc/{me}/task/{me}/children") as f:
        return [int(c) for c in f.read().split()]


def _kill_descendants() -> None:
    """Kill every descendant: killed children's own children are re-parented to us (subreaper), so repeat until
    no child is left."""
    while True:
        kids = _children()
        for kid in kids:
            try:
                os.kill(kid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            if not kids:
                return


def _pid1(cfg: dict, status_fd: int) -> None:
    """PID 1 of the new namespaces: build the root, run the program, send its wait status. Never returns."""
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the launcher killed: the whole namespace dies with us
        os.umask(0o022)
        rootfs.build_root(cfg["root"], cfg["layout"], cfg["disk_mb"], cfg["inodes"], cfg["uid"])
        pid = _start_program(cfg)
    except BaseException as e:  # noqa: BLE001
        os.write(2, f"sandbox setup failed: {type(e).__name__}: {e}\n".encode())
        os._exit(SETUP_FAILED)
    os.write(status_fd, struct.pack("=i", _reap_until(pid)))
    os._exit(0)  # the kernel now kills whatever the program left running in the namespace


def _run_in_namespaces(cfg: dict) -> int:
    if ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEW) != 0:
        raise OSError(ctypes.get_errno(), "unshare of the sandbox namespaces failed (needs root)")
    read_end, write_end = os.pipe()
    # SIGTERM (the caller's timeout) waits until its handler knows PID 1: a SIGTERM that killed the launcher
    # between fork and PID 1's parent-death signal would leave PID 1 running unsupervised.
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _pid1(cfg, write_end)
    os.close(write_end)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
    _, status = os.waitpid(pid, 0)
    reported = os.read(read_end, 4)
    return struct.unpack("=i", reported)[0] if len(reported) == 4 else status


def _kill_user(uid: int) -> None:
    """Kill every process running as `uid` (a leased sandbox id no other live run holds, so only orphans of dead
    runs) and return once the signal is sent. A helper dropped to `uid` sends one ``kill(-1, SIGKILL)``: it reaches
    every process that user may signal, the helper itself and PID 1 excepted, and none forks past it (the kernel
    sends it holding the task list lock that fork needs). The launcher stays root, out of that user's reach."""
    if uid <= 0:
        raise ValueError(f"refusing to kill the processes of user id {uid}")
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            # kill(-1) as root would end every process of the machine: only once the drop has certainly happened.
            if os.getresuid() == (uid, uid, uid):
                os.kill(-1, signal.SIGKILL)
        except BaseException:  # noqa: BLE001 - ESRCH (no process left) or a failed drop: nothing to kill
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def _run_with_subreaper(cfg: dict) -> int:
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    if cfg.get("sweep_uid"):
        # Orphans of an earlier run of this id outlive it when its caller and launcher are killed (they are no
        # descendants of ours to kill): left alive they would share this run's process count and scratch directory.
        _kill_user(cfg["uid"])
    signal.signal(signal.SIGTERM, lambda *_: (_kill_descendants(), os._exit(128 + signal.SIGKILL)))
    status = _reap_until(_start_program(cfg))
    _kill_descendants()  # daemons the program left behind end with it
    return status


def _exit_like(status: int) -> None:
    """Exit with `status`: the same exit code, or death by the same signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal whose default action is to be ignored
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else SETUP_FAILED)


def main() -> None:
    """Read the configuration from stdin and run the program under its isolation; exit as it exited."""
    try:
        cfg = marshal.loads(sys.stdin.buffer.read())
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the caller gone: stop (and so kill everything below)
        if os.getppid() != cfg["parent_pid"]:
            os._exit(SETUP_FAILED)  # the caller died before the line above
        run = _run_in_namespaces if cfg["mode"] == "namespaces" else _run_with_subreaper
        status = run(cfg)
    except Exception as e:  # noqa: BLE001
        print(f"sandbox setup failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(SETUP_FAILED)
    _exit_like(status)


if __name__ == "__main__":
    main()

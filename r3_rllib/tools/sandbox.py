"""Run model-written Python in a sandbox: a separate process with resource limits, a throwaway scratch directory,
no network and no writes outside that directory.

Model-written code is hostile until proven otherwise. :func:`run_python` runs it as follows.

- **Isolation ``"namespaces"``** (used when the process may create Linux namespaces, e.g. as root, and
  ``unshare``/``setpriv`` exist): the program runs in fresh PID, network and mount namespaces (util-linux
  ``unshare``), as an unprivileged user id of its own (``setpriv``, no new privileges, no supplementary groups).
  The network namespace has no interface but a down loopback, so no connection leaves it (a local server included).
  The world-writable directories (``/tmp``, ``/var/tmp``, ``/dev/shm``) are mounted read-only inside it and every
  other path is owned by other users, so the only writable place is the scratch directory. The program is PID 1 of
  its PID namespace: when it ends or is killed, the kernel kills every process it started (fork bombs, daemons,
  ``setsid`` escapes included).
- **Isolation ``"rlimits"``** (the weaker fallback, where namespaces are not available): the same resource limits,
  scratch directory and process group, but the program runs as the calling user, can reach the network, can write
  wherever that user can, and a process that leaves the group with ``setsid`` survives the timeout kill. Pass
  ``isolation="namespaces"`` to refuse to run without the strong form.

Resource limits in both: CPU seconds (``RLIMIT_CPU``), address space (``memory_mb``, ``RLIMIT_AS``), processes
(``RLIMIT_NPROC``; per sandbox user under namespaces), file size (``RLIMIT_FSIZE``), open files, no core dumps; a
wall-clock timeout (the whole process tree is killed when it passes), and output capped at ``max_output_bytes``
(the program is killed when it writes more). The scratch directory is removed afterwards, whatever the program did.
"""

from __future__ import annotations

import functools
import os
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

Isolation = Literal["auto", "namespaces", "rlimits"]

#: Sandboxed programs run as a user id drawn from this range (ids with no account: they own nothing but the
#: scratch directory, and two concurrent sandboxes almost never share one).
SANDBOX_UID_RANGE = (200_000, 260_000)

# Inside the namespaces: make the world-writable directories read-only, re-open the scratch directory for
# writing, mount a /proc of the new PID namespace, drop to the sandbox user and run the program.
_INNER_SCRIPT = """set -e
scratch="$1"; uid="$2"; shift 2
mount --make-rprivate /
for d in /tmp /var/tmp /dev/shm; do
  if [ -d "$d" ]; then mount --bind "$d" "$d"; mount -o remount,bind,ro "$d"; fi
done
mount --bind "$scratch" "$scratch"
mount -o remount,bind,rw "$scratch"
mount -t proc proc /proc
cd "$scratch"
exec setpriv --reuid="$uid" --regid="$uid" --clear-groups --no-new-privs -- "$@" 2>&1
"""


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run gave back."""

    #: stdout and stderr, interleaved as written, decoded as UTF-8 (invalid bytes replaced), at most the cap.
    output: str
    #: True when the wall-clock timeout killed the program.
    timed_out: bool
    #: The program's exit code; a negative number -N when signal N ended it (e.g. -9 after a kill); None when the
    #: sandbox itself could not start.
    exit_code: int | None
    #: True when the program wrote more than the output cap (it was killed then).
    output_truncated: bool
    #: Which isolation ran: "namespaces" or "rlimits" (see the module docstring).
    isolation: str
    #: Wall-clock seconds of the run.
    duration_s: float
    #: The user id the program ran as under "namespaces" (each run draws its own); None under "rlimits".
    uid: int | None = None

    @property
    def ok(self) -> bool:
        """The program ran to completion and exited 0."""
        return self.exit_code == 0 and not self.timed_out and not self.output_truncated


@functools.cache
def namespaces_available() -> bool:
    """Whether this process can run programs under the "namespaces" isolation (probed once, by running it)."""
    if not (shutil.which("unshare") and shutil.which("setpriv")) or os.geteuid() != 0:
        return False
    try:
        scratch = tempfile.mkdtemp(prefix="r3-sandbox-probe-")
        try:
            probe = subprocess.run(
                _namespace_prefix(scratch, SANDBOX_UID_RANGE[0]) + ["/bin/true"],
                capture_output=True,
                timeout=10,
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def resolve_isolation(isolation: Isolation) -> str:
    """The isolation a run with `isolation` uses: 'auto' picks namespaces where available, else rlimits;
    'namespaces' raises where they are not available."""
    if isolation not in ("auto", "namespaces", "rlimits"):
        raise ValueError(f"isolation must be 'auto', 'namespaces' or 'rlimits', got {isolation!r}")
    if isolation == "rlimits":
        return "rlimits"
    if namespaces_available():
        return "namespaces"
    if isolation == "namespaces":
        raise RuntimeError(
            "sandbox isolation 'namespaces' is not available here: it needs root (or CAP_SYS_ADMIN) and "
            "util-linux's unshare and setpriv; use isolation='auto' to fall back to 'rlimits'"
        )
    return "rlimits"


def run_python(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_output_bytes: int = 16_384,
    max_processes: int = 16,
    max_file_mb: int = 16,
    isolation: Isolation = "auto",
    python: str | None = None,
) -> SandboxResult:
    """Run `code` as a Python program in a sandbox (see the module docstring) and return its output.

    `timeout_s` bounds the wall-clock time (the run returns within it plus process start-up and teardown, well under
    a second); `memory_mb` the address space of each process; `max_processes` the processes alive at once;
    `max_file_mb` the size of any file written; `max_output_bytes` the output kept (the program is killed when it
    writes more). `python`: the interpreter (default: this one, so the program sees the same installed packages).
    Never raises for anything the program does; raises ValueError for invalid limits and RuntimeError when
    ``isolation="namespaces"`` is asked for where it is not available.
    """
    _check_limits(timeout_s, memory_mb, max_output_bytes, max_processes, max_file_mb)
    mode = resolve_isolation(isolation)
    scratch = Path(tempfile.mkdtemp(prefix="r3-sandbox-"))
    uid = secrets.randbelow(SANDBOX_UID_RANGE[1] - SANDBOX_UID_RANGE[0]) + SANDBOX_UID_RANGE[0]
    try:
        (scratch / "main.py").write_text(code, encoding="utf-8")
        command = [python or sys.executable, "-I", "main.py"]
        if mode == "namespaces":
            os.chown(scratch, uid, uid)
            os.chown(scratch / "main.py", uid, uid)
            os.chmod(scratch, 0o700)
            command = _namespace_prefix(str(scratch), uid) + command
        limits = _limits(timeout_s, memory_mb, max_processes, max_file_mb, per_user=mode == "namespaces")
        result = _run(command, scratch, limits, timeout_s, max_output_bytes, mode)
        return replace(result, uid=uid) if mode == "namespaces" else result
    finally:
        _remove_tree(scratch)


def _check_limits(
    timeout_s: float, memory_mb: int, max_output_bytes: int, max_processes: int, max_file_mb: int
) -> None:
    for name, value in (
        ("timeout_s", timeout_s),
        ("memory_mb", memory_mb),
        ("max_output_bytes", max_output_bytes),
        ("max_processes", max_processes),
        ("max_file_mb", max_file_mb),
    ):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"{name} must be a number > 0, got {value!r}")
    if memory_mb < 64:
        raise ValueError(f"memory_mb must be >= 64 (the interpreter alone needs ~30 MB), got {memory_mb}")


def _namespace_prefix(scratch: str, uid: int) -> list[str]:
    # --kill-child: if the sandbox's unshare process is killed, its child (PID 1 of the namespace) gets SIGKILL,
    # and with it every process in the namespace.
    return [
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        "--net",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        _INNER_SCRIPT,
        "r3-sandbox",
        scratch,
        str(uid),
    ]


def _limits(
    timeout_s: float, memory_mb: int, max_processes: int, max_file_mb: int, *, per_user: bool
) -> list[tuple[int, int]]:
    cpu = int(timeout_s) + 1  # a backstop: the wall-clock timeout normally ends the run first
    limits = [
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, int(memory_mb) * 2**20),
        (resource.RLIMIT_FSIZE, int(max_file_mb) * 2**20),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_CORE, 0),
    ]
    if per_user:
        # Counted per user id: under namespaces the sandbox user runs nothing else. As the calling user the count
        # would include all of that user's processes, so the fallback leaves it to the timeout kill.
        limits.append((resource.RLIMIT_NPROC, int(max_processes)))
    return limits


def _run(
    command: list[str],
    scratch: Path,
    limits: list[tuple[int, int]],
    timeout_s: float,
    max_output_bytes: int,
    mode: str,
) -> SandboxResult:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(scratch),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
    }
    t0 = time.monotonic()
    # Under namespaces the program's stderr joins its stdout inside the namespace (see _INNER_SCRIPT); what the
    # sandbox's own tools (unshare, mount, setpriv) print goes to a file and is shown only when the run failed.
    setup_log = tempfile.TemporaryFile() if mode == "namespaces" else None
    try:
        proc = subprocess.Popen(
            command,
            cwd=scratch,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=setup_log or subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed as a whole
            preexec_fn=functools.partial(_apply_limits, limits),
        )
    except OSError as e:
        return SandboxResult(f"sandbox could not start: {e}", False, None, False, mode, 0.0)
    reader = _OutputReader(proc, max_output_bytes)
    reader.start()
    timed_out = not reader.finished.wait(timeout_s)
    if timed_out or reader.overflowed:
        _kill_tree(proc, mode)
    reader.join(timeout=5.0)
    try:
        exit_code = proc.wait(timeout=5.0)
    except (
        subprocess.TimeoutExpired
    ):  # unreachable after SIGKILL unless the kernel is stuck; do not hang on it
        exit_code = None
    output = bytes(reader.data[:max_output_bytes]).decode("utf-8", errors="replace")
    killed = timed_out or reader.overflowed
    if setup_log is not None:
        setup_log.seek(0)
        setup_errors = setup_log.read(4096).decode("utf-8", errors="replace")
        setup_log.close()
        if killed:
            exit_code = -signal.SIGKILL  # unshare reports its killed child as a plain failure
        elif exit_code and setup_errors:
            output += setup_errors
    return SandboxResult(output, timed_out, exit_code, reader.overflowed, mode, time.monotonic() - t0)


class _OutputReader(threading.Thread):
    """Reads the program's output until it closes, keeping at most `cap` bytes; `overflowed` when it wrote more."""

    def __init__(self, proc: subprocess.Popen, cap: int) -> None:
        super().__init__(daemon=True)
        self.proc, self.cap = proc, cap
        self.data = bytearray()
        self.overflowed = False
        self.finished = threading.Event()

    def run(self) -> None:
        assert self.proc.stdout is not None
        try:
            while chunk := self.proc.stdout.read1(65536):
                self.data += chunk
                if len(self.data) > self.cap:
                    self.overflowed = True
                    break
        finally:
            self.finished.set()


def _apply_limits(limits: list[tuple[int, int]]) -> None:
    # Runs in the child between fork and exec; every process the program starts inherits the limits.
    for which, value in limits:
        resource.setrlimit(which, (value, value))


def _kill_tree(proc: subprocess.Popen, mode: str) -> None:
    """Kill the program and every process it started, and return once they are gone."""
    if mode == "namespaces":
        # Kill PID 1 of the namespace (unshare's child), not unshare: the kernel then kills every other process
        # of the namespace and reaps them before unshare's wait returns, so none is left when the run returns.
        for pid in _children(proc.pid):
            _signal(pid, os.kill)
        try:
            proc.wait(timeout=5.0)
            return
        except subprocess.TimeoutExpired:
            pass
    _signal(proc.pid, os.killpg)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _signal(pid: int, kill) -> None:
    try:
        kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_tree(path: Path) -> None:
    """Remove the scratch directory even if the program made parts of it unreadable or unwritable."""

    def make_writable(func, target, _exc) -> None:
        try:
            os.chmod(os.path.dirname(target), stat.S_IRWXU)
            os.chmod(target, stat.S_IRWXU)
            func(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable)

"""Under the "rlimits" isolation a root caller's program runs as a leased sandbox user id of its own, not as root,
wherever that user can start the interpreter; where it cannot (an interpreter under /root, mode 0700), it runs as
root, and the result says so (``uid`` None)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sandbox_marks import needs_seccomp

from r3_rllib.envs import python_tool
from r3_rllib.tools import sandbox, sandbox_init, sandbox_uids

#: An interpreter outside any private home folder (the system's), which a sandbox user can start.
SYSTEM_PYTHON = next(
    (os.path.realpath(p) for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.exists(p)), None
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only a root caller switches the program's user id")
needs_system_python = pytest.mark.skipif(
    SYSTEM_PYTHON is None
    or os.geteuid() != 0
    or sandbox.sandbox_user_unavailable_reason(SYSTEM_PYTHON) is not None,
    reason="no interpreter here that a sandbox user can start (/usr/bin/python3 or /usr/local/bin/python3)",
)
pytestmark = [needs_root, needs_seccomp]


def _run(code: str, **kw) -> sandbox.SandboxResult:
    return sandbox.run_python(code, isolation="rlimits", python=SYSTEM_PYTHON, timeout_s=20.0, **kw)


def _pids_of(uid: int) -> list[int]:
    """The processes whose real user id is `uid` (read from /proc)."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            uid_line = next(line for line in status.read_text().splitlines() if line.startswith("Uid:"))
        except (OSError, StopIteration):  # the process ended while we looked
            continue
        if int(uid_line.split()[1]) == uid:
            pids.append(int(status.parent.name))
    return pids


def _stray(uid: int) -> subprocess.Popen:
    """A process running as `uid` that no sandbox run started: what a run whose caller was killed leaves."""
    return subprocess.Popen(["sleep", "60"], user=uid, group=uid, extra_groups=[], cwd="/")


@needs_system_python
def test_the_program_runs_as_its_leased_user_with_no_groups():
    r = _run("import os\nprint(os.getuid(), os.getgid(), os.getgroups())")
    assert r.ok, r.output
    lo, hi = sandbox.SANDBOX_UID_RANGE
    assert r.uid is not None and lo <= r.uid < hi
    assert r.output.split() == [str(r.uid), str(r.uid), "[]"]


@needs_system_python
def test_root_only_files_are_out_of_reach_and_the_scratch_directory_is_the_programs(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("token")
    secret.chmod(0o600)  # a root-owned file only root may read (a token, a checkpoint)
    os.chmod(tmp_path, 0o755)  # the folder may be entered: the file's own mode is what keeps it
    code = (
        "import os\n"
        "try:\n"
        f"    open({str(secret)!r}).read()\n"
        "    print('read')\n"
        "except PermissionError:\n"
        "    print('denied')\n"
        "open('scratch.txt', 'w').write('x')\n"  # the working directory: the run's scratch folder
        "print(os.listdir('.'))\n"
    )
    r = _run(code)
    assert r.ok, r.output
    assert r.output.splitlines()[0] == "denied" and "scratch.txt" in r.output.splitlines()[1]


@needs_system_python
def test_a_fork_bomb_stops_at_max_processes():
    """RLIMIT_NPROC counts the leased user's processes, which are this run's alone: forks fail at the limit (root
    would not be held to it). The children wait to be killed with the run."""
    code = (
        "import os, signal\n"
        "n = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        signal.pause()\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print(n)\n"
    )
    r = _run(code, max_processes=8)
    assert r.ok, r.output
    assert int(r.output.strip()) < 8  # the program itself is one of the 8


@pytest.mark.skipif(
    sandbox.sandbox_user_unavailable_reason(sys.executable) is None,
    reason="this interpreter can be started by a sandbox user (it is not under a private home folder)",
)
def test_an_interpreter_the_sandbox_user_cannot_start_runs_as_root():
    """This interpreter (e.g. a virtual environment under /root, mode 0700): the probe says why, and the run goes on
    as root, which the result's uid (None) says."""
    reason = sandbox.sandbox_user_unavailable_reason(sys.executable)
    assert os.path.abspath(sys.executable) in reason or sys.executable in reason
    r = sandbox.run_python("import os\nprint(os.getuid())", isolation="rlimits", timeout_s=20.0)
    assert r.uid is None and r.output.strip() == "0", r.output


@needs_system_python
def test_the_callers_private_folders_and_files_are_out_of_reach(tmp_path):
    """A 0700 folder of the caller's (a home, a checkpoint folder) can be neither listed nor entered, and a folder
    root owns is not the program's to write in, whatever the modes of the files inside."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "weights.txt").write_text("w")
    (private / "weights.txt").chmod(0o644)
    os.chmod(tmp_path, 0o755)
    code = (
        "def attempt(what, f):\n"
        "    try:\n"
        "        f()\n"
        "        print(what, 'done')\n"
        "    except PermissionError:\n"
        "        print(what, 'denied')\n"
        f"attempt('list', lambda: __import__('os').listdir({str(private)!r}))\n"
        f"attempt('read', lambda: open({str(private / 'weights.txt')!r}).read())\n"
        f"attempt('write', lambda: open({str(tmp_path / 'planted.py')!r}, 'w'))\n"
        "attempt('read /root', lambda: __import__('os').listdir('/root'))\n"
    )
    r = _run(code)
    assert r.ok, r.output
    assert r.output.splitlines() == ["list denied", "read denied", "write denied", "read /root denied"]
    assert not (tmp_path / "planted.py").exists()


@needs_system_python
def test_no_new_privileges_and_the_launcher_out_of_reach():
    """The program cannot gain privileges through a setuid binary, nor kill its launcher (root) to leave orphans."""
    code = (
        "import os, signal\n"
        "status = open('/proc/self/status').read()\n"
        "print(status.split('NoNewPrivs:')[1].split()[0])\n"
        "try:\n"
        "    os.kill(os.getppid(), signal.SIGKILL)\n"
        "    print('killed')\n"
        "except PermissionError:\n"
        "    print('denied')\n"
    )
    r = _run(code)
    assert r.ok, r.output
    assert r.output.split() == ["1", "denied"]


@needs_system_python
def test_no_process_of_the_run_outlives_it():
    """Forks up to the limit, and daemons that left the session: all gone when the run returns."""
    code = (
        "import os, signal\n"
        "for _ in range(50):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            os.setsid()\n"
        "            if os.fork() == 0:\n"
        "                signal.pause()\n"
        "            os._exit(0)\n"
        "    except OSError:\n"
        "        break\n"
        "print('ok')\n"
    )
    r = _run(code, max_processes=6)
    assert r.ok and r.uid is not None, r.output
    assert _pids_of(r.uid) == []


#: An id outside SANDBOX_UID_RANGE (and other than the uid tests' 190,000): no other run, here or in a concurrent
#: test process, can lease it, so the sweep below meets only this test's stray.
ORPHAN_UID = 195_000


@needs_system_python
def test_what_the_program_leaves_in_dev_shm_is_removed_after_the_run():
    """/dev/shm is the one shared place the program may write (POSIX semaphores live there): its files, a folder of
    them and a named semaphore it never unlinks go with the run; another user's file there stays."""
    mark = f"r3-left-{os.getpid()}"
    keep = Path("/dev/shm") / f"{mark}-callers"
    keep.write_text("mine")
    code = (
        "import os, ctypes\n"
        f"open('/dev/shm/{mark}', 'w').write('x')\n"
        f"os.mkdir('/dev/shm/{mark}-dir'); open('/dev/shm/{mark}-dir/f', 'w').write('x')\n"
        "libc = ctypes.CDLL(None)\nlibc.sem_open.restype = ctypes.c_void_p\n"
        f"print(libc.sem_open(b'/{mark}-sem', 0o100, 0o600, 1) not in (None, 0))\n"
        "print(sorted(n for n in os.listdir('/dev/shm') if n.startswith('r3-left') or n.startswith('sem.r3-left')))\n"
    )
    try:
        r = _run(code)
        left = sorted(p.name for p in Path("/dev/shm").iterdir() if mark in p.name)
    finally:
        keep.unlink(missing_ok=True)
    assert r.ok, r.output
    made = [mark, f"{mark}-callers", f"{mark}-dir", f"sem.{mark}-sem"]
    assert r.output.splitlines() == ["True", str(sorted(made))]
    assert left == [f"{mark}-callers"]


@needs_system_python
def test_orphans_of_an_earlier_run_of_the_id_die_before_the_program_starts(monkeypatch, tmp_path):
    """A run whose caller was killed (its launcher with it) leaves its daemons running as its id, freed with the
    lock: the next run leasing the id kills them first, so its process count and files are its own."""
    uid = ORPHAN_UID
    monkeypatch.setattr(sandbox_uids, "LOCK_PATH", str(tmp_path / "uids.lock"))  # this test's leases only
    monkeypatch.setattr(sandbox, "SANDBOX_UID_RANGE", (uid, uid + 1))  # the next run gets this id
    stray = _stray(uid)
    try:
        r = _run("import os\nprint(os.getuid())")
        assert r.ok and r.output.split() == [str(uid)], r.output
        assert stray.wait(timeout=10) == -9
    finally:
        stray.kill()
        stray.wait()


@needs_system_python
def test_the_callers_sweep_kills_every_process_of_the_id():
    """What runs when the launcher itself had to be killed: every process of the id ends."""
    with sandbox_uids.lease_uid(*sandbox.SANDBOX_UID_RANGE) as lease:
        strays = [_stray(lease.uid) for _ in range(3)]
        try:
            sandbox._kill_user(SYSTEM_PYTHON, lease.uid)
            assert [s.wait(timeout=10) for s in strays] == [-9, -9, -9]
        finally:
            for s in strays:
                s.kill()
                s.wait()


def test_neither_sweep_ever_runs_as_root():
    """kill(-1) as root would end every process of the machine: the launcher's sweep and the caller's refuse it."""
    with pytest.raises(ValueError, match="user id 0"):
        sandbox_init._kill_user(0)
    with pytest.raises(ValueError, match="user id 0"):
        sandbox._kill_user(sys.executable, 0)


@pytest.mark.skipif(
    sandbox.sandbox_user_unavailable_reason(sys.executable) is None,
    reason="this interpreter can be started by a sandbox user (it is not under a private home folder)",
)
def test_the_fallback_warning_says_why_the_code_runs_as_root_and_what_would_change_it(monkeypatch, caplog):
    """The python_tool env's warning, with this machine's own probe (not a stand-in)."""
    monkeypatch.setattr(sandbox, "namespaces_available", lambda: False)
    monkeypatch.setattr(python_tool, "_warned_fallback", False)
    with caplog.at_level(logging.WARNING, logger="r3_rllib.envs.python_tool"):
        assert python_tool._isolation_for_tools("auto") == "rlimits"
    (message,) = [r.getMessage() for r in caplog.records if "rlimits" in r.getMessage()]
    assert "as root (not a sandbox user id:" in message
    assert os.path.abspath(sys.executable) in message and "not under a home folder of mode 0700" in message

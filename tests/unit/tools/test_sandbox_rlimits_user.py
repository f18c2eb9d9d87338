"""Under the "rlimits" isolation a root caller's program runs as a leased sandbox user id of its own, not as root,
wherever that user can start the interpreter; where it cannot (an interpreter under /root, mode 0700), it runs as
root, and the result says so (``uid`` None)."""

from __future__ import annotations

import os
import sys

import pytest
from sandbox_marks import needs_seccomp

from r3_rllib.tools import sandbox

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

"""Under the "rlimits" isolation (no namespaces) Landlock confines the program: it reads only the system and
interpreter directories, writes only its scratch directory and /dev/shm, opens no TCP socket (ABI 4) and signals no
process outside the sandbox (ABI 6), whichever user it runs as; root included (the venv interpreter here lives under
/root, so these programs run as root, where nothing but Landlock keeps them out)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from sandbox_marks import needs_seccomp

from r3_rllib.tools import landlock, sandbox

ABI = sandbox.landlock_abi()
needs_landlock = pytest.mark.skipif(
    ABI < 1, reason="this kernel has no Landlock (Linux 5.13+, enabled at boot)"
)
REPO = Path(__file__).resolve().parents[3]


def _run(code: str, **kw) -> sandbox.SandboxResult:
    return sandbox.run_python(code, isolation="rlimits", timeout_s=20.0, **kw)


def _attempts(targets: dict[str, str]) -> str:
    """A program that tries each `name: expression` and prints `name ok` or `name <error type>`."""
    lines = ["import os, socket, signal"]
    for name, expression in targets.items():
        lines += [
            "try:",
            f"    {expression}",
            f"    print({name!r}, 'ok', flush=True)",
            "except OSError as e:",
        ]
        lines += [f"    print({name!r}, type(e).__name__, flush=True)"]
    return "\n".join(lines) + "\n"


def test_handled_rights_per_abi_version():
    """Hand-computed from linux/landlock.h: ABI 1 handles bits 0-12 of the filesystem rights, 2 adds REFER (bit
    13), 3 TRUNCATE (14), 5 IOCTL_DEV (15); 4 adds TCP bind and connect, 6 the signal and abstract-socket scopes;
    a newer ABI gets the newest rights known here."""
    expected = {
        1: (0x1FFF, 0, 0),
        2: (0x3FFF, 0, 0),
        3: (0x7FFF, 0, 0),
        4: (0x7FFF, 3, 0),
        5: (0xFFFF, 3, 0),
        6: (0xFFFF, 3, 3),
        7: (0xFFFF, 3, 3),
        12: (0xFFFF, 3, 3),
    }
    for abi, (fs, net, scoped) in expected.items():
        assert landlock.handled_rights(abi) == landlock.Rights(fs, net, scoped), abi
    with pytest.raises(ValueError, match="ABI 0"):
        landlock.handled_rights(0)


@needs_landlock
@needs_seccomp
def test_host_files_outside_the_system_and_interpreter_directories_are_unreadable(tmp_path):
    """Before: a world-readable file of the caller's (the checkout, a checkpoint) and /etc/passwd were readable,
    and as root (this venv) every file was."""
    secret = tmp_path / "checkpoint.pt"
    secret.write_text("weights")
    os.chmod(tmp_path, 0o755)
    os.chmod(secret, 0o600)  # root's own file: only Landlock keeps a root program out
    targets = {
        "secret": f"open({str(secret)!r}).read()",
        "listing": f"os.listdir({str(tmp_path)!r})",
        "checkout": f"open({str(REPO / 'README.md')!r}).read()",
        "passwd": "open('/etc/passwd').read()",
        "other proc": f"open('/proc/{os.getpid()}/environ').read()",
        "sys": "os.listdir('/sys')",
        "own proc": "open('/proc/self/status').read()",
        "stdlib": "open(os.__file__).read()",
        "urandom": "os.urandom(8)",
    }
    r = _run(_attempts(targets))
    assert r.ok and r.landlock_abi == ABI, r.output
    got = dict(line.rsplit(" ", 1) for line in r.output.splitlines())
    refused = ("secret", "listing", "checkout", "passwd", "other proc", "sys")
    assert got == {
        **{k: "PermissionError" for k in refused},
        "own proc": "ok",
        "stdlib": "ok",
        "urandom": "ok",
    }


@needs_landlock
@needs_seccomp
def test_writes_reach_only_the_scratch_directory_and_dev_shm(tmp_path):
    """Before: /tmp, /var/tmp and any world-writable folder (Ray's 0777 session folders) took the program's files."""
    ray_like = tmp_path / "session" / "runtime_resources"
    ray_like.mkdir(parents=True)
    os.chmod(ray_like, 0o777)
    mark = f"r3-landlock-{os.getpid()}"
    shm = Path("/dev/shm") / mark
    outside = [ray_like / "planted.py", Path("/tmp") / mark, Path("/var/tmp") / mark]
    outside = [p for p in outside if p.parent.is_dir()]  # /var/tmp may be missing in a slim container
    targets = {f"w{i}": f"open({str(p)!r}, 'w').write('x')" for i, p in enumerate(outside)}
    targets |= {
        "mkdir": f"os.mkdir({str(tmp_path / 'made')!r})",
        "scratch": "open('mine.txt', 'w').write('x')",
    }
    targets |= {"shm": f"open({str(shm)!r}, 'w').write('x'); os.unlink({str(shm)!r})"}
    try:
        r = _run(_attempts(targets))
        written = [p for p in outside if p.exists()]
    finally:
        for path in [shm, *outside]:
            path.unlink(missing_ok=True)
    assert r.ok, r.output
    got = dict(line.rsplit(" ", 1) for line in r.output.splitlines())
    assert got == {f"w{i}": "PermissionError" for i in range(len(outside))} | {
        "mkdir": "PermissionError",
        "scratch": "ok",
        "shm": "ok",
    }
    assert not written and not (tmp_path / "made").exists()


@needs_landlock
@needs_seccomp
@pytest.mark.skipif(ABI < 4, reason="Landlock refuses TCP from ABI 4")
def test_no_tcp_connection_or_listening_socket():
    """Before: the program reached any local service (Ray's GCS and dashboard listen on TCP)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    targets = {
        "connect": f"socket.create_connection(('127.0.0.1', {port}), timeout=2)",
        "bind": "socket.socket().bind(('127.0.0.1', 0))",
    }
    try:
        r = _run(_attempts(targets))
        server.setblocking(False)  # a connection made during the run would wait in the backlog now
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
    assert r.ok and r.output == "connect PermissionError\nbind PermissionError\n", r.output


@needs_landlock
@needs_seccomp
@pytest.mark.skipif(ABI < 6, reason="Landlock scopes signals from ABI 6")
def test_no_signal_leaves_the_sandbox_but_the_programs_own_processes_take_them():
    """Before, as the calling user (or root), the program could kill its launcher and the caller."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    code = _attempts(
        {
            "launcher": "os.kill(os.getppid(), signal.SIGKILL)",
            "bystander": f"os.kill({bystander.pid}, signal.SIGKILL)",
            # the child never returns into the program: a signal that ended its pause made it print again once
            "own child": "pid = os.fork()\n    if pid == 0:\n        try:\n            while True: os.pause()\n"
            "        finally:\n            os._exit(0)\n    os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0)",
        }
    )
    try:
        r = _run(code)
        alive = bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
    assert r.ok and alive, r.output
    assert r.output == "launcher PermissionError\nbystander PermissionError\nown child ok\n"


@needs_seccomp
def test_without_landlock_the_run_says_so(monkeypatch):
    """A kernel without Landlock: the program runs as before, and the result's landlock_abi is None."""
    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 0)
    r = _run(f"print(len(open({str(REPO / 'README.md')!r}).read()) > 0)")
    assert r.ok and r.output == "True\n" and r.landlock_abi is None, r.output

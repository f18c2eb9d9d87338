"""The private Ray that `r3 train` starts (r3_rllib.ray_session.init_ray) keeps strangers out.

A child process starts Ray exactly as the CLI does; clients in other processes then try to join it through the
machine's own non-loopback address (the one a host on the network would use): without the token, with a wrong one,
and with auth switched off on the client's side (the attacker's choice) they are refused; with the token (the
control, so the test can tell a refusal from a broken setup) the client runs a task.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SERVER = textwrap.dedent(
    """
    import json, os, sys
    from r3_rllib.ray_session import init_ray
    init_ray(num_cpus=1, log_to_driver=False)
    import ray
    node = ray.nodes()[0]
    print(json.dumps({"gcs": ray.get_runtime_context().gcs_address, "node_ip": node["NodeManagerAddress"],
                      "auth_mode": os.environ.get("RAY_AUTH_MODE")}), flush=True)
    sys.stdin.read()  # serve until the test closes stdin
    """
)

CLIENT = textwrap.dedent(
    """
    import sys, ray
    ray.init(address=sys.argv[1], log_to_driver=False)
    @ray.remote
    def whoami():
        import os
        return os.getpid()
    print("RAN", ray.get(whoami.remote(), timeout=30))
    """
)


def _external_ip() -> str | None:
    """An address of this machine other than loopback (what another host would connect to), or None."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    candidates = out + [socket.gethostbyname(socket.gethostname())]
    return next((ip for ip in candidates if ":" not in ip and not ip.startswith("127.")), None)


def _clients(address: str, envs: dict[str, dict[str, str]]) -> dict[str, tuple[int, str, str]]:
    """Run one client per environment, side by side (a refused client retries for ~20 s before it gives up):
    name -> (exit code, stdout, stderr)."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", CLIENT, address],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, env in envs.items()
    }
    out = {}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # left waiting forever is refused too, if less politely
            proc.kill()
            stdout, stderr = proc.communicate()
        out[name] = (proc.returncode, stdout, stderr)
    return out


@pytest.fixture(scope="module")
def private_ray():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    env["OMP_NUM_THREADS"] = "1"
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        info = json.loads(server.stdout.readline())
        yield info
    finally:
        server.stdin.close()
        server.wait(timeout=60)


def test_private_ray_runs_with_token_auth(private_ray):
    assert private_ray["auth_mode"] == "token"  # what Ray set for the new local cluster
    token_file = Path.home() / ".ray" / "auth_token"
    assert token_file.stat().st_mode & 0o077 == 0, "other local users can read the cluster's token"


def test_a_client_without_the_token_is_refused_and_one_with_it_runs(private_ray, tmp_path):
    ip = _external_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect through")
    port = private_ray["gcs"].rsplit(":", 1)[1]
    address = f"{ip}:{port}"
    stranger_home = tmp_path / "stranger"  # no ~/.ray/auth_token there
    stranger_home.mkdir()
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    attempts = {
        "no token": {**base, "HOME": str(stranger_home)},
        "wrong token": {
            **base,
            "HOME": str(stranger_home),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": "0" * 32,
        },
        "client auth off": {**base, "HOME": str(stranger_home), "RAY_AUTH_MODE": "disabled"},
    }
    token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    attempts["token holder"] = {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    results = _clients(address, attempts)
    code, stdout, stderr = results.pop("token holder")  # the control: the address and the setup work
    assert "RAN" in stdout, f"the token holder could not join: {stderr[-3000:]}"
    for name, (code, stdout, stderr) in results.items():
        assert "RAN" not in stdout and code != 0, f"{name}: a client ran a task on the private Ray:\n{stdout}"
        # Refused by the cluster's token check, not by some other failure to connect.
        assert "InvalidAuthToken" in stderr, f"{name}: {stderr[-3000:]}"

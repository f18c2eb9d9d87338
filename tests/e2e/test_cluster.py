"""`r3 train --address` on a real two-node Ray cluster started with `ray start` (both nodes on loopback).

The cluster is this test's own: its own ports and temp folder, the driver in a subprocess, and at the end only the
processes of this cluster are stopped (found by the temp folder on their command lines). Plain `ray stop` is not
used because it stops every Ray process of the machine, including other test sessions'.

Each node offers one CPU and a trial needs two (its main process, which holds the learner, and one EnvRunner), so
a finished trial means the work really ran on both nodes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from repo_paths import REPO

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
RAY = str(BIN / "ray")
R3 = str(BIN / "r3")
# Prints [address, alive, CPUs] of every node of the cluster at argv[1].
NODES_PROBE = (
    "import json, sys, ray\n"
    "ray.init(address=sys.argv[1], log_to_driver=False)\n"
    "print(json.dumps([[n['NodeManagerAddress'], n['Alive'], n['Resources'].get('CPU')] for n in ray.nodes()]))\n"
)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports free now, drawn below the kernel's range for outgoing connections (32768-60999 on Linux)
    and above Ray's default worker range (10002-19999): a port the OS hands out (port 0) can be taken by any
    client's outgoing connection or by a worker (``--min-worker-port=0``) before the node binds it."""
    picked: list[int] = []
    draw = random.SystemRandom()
    while len(picked) < n:
        port = draw.randrange(20_000, 32_768)
        if port in picked:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        picked.append(port)
    return picked


def _node_ports(ports: list[int]) -> list[str]:
    """Every port a node opens, set explicitly so no default (e.g. 52365) collides with other Ray instances."""
    names = (
        "--node-manager-port",
        "--object-manager-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
        "--metrics-export-port",
    )
    return [f"{name}={port}" for name, port in zip(names, ports, strict=True)]


def _stop_cluster(temp_dir: str) -> None:
    """SIGTERM, then SIGKILL, every process whose command line names this cluster's temp folder."""
    import psutil

    def ours() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.info["cmdline"] and any(temp_dir in arg for arg in p.info["cmdline"]):
                    found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    procs = ours()
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive + ours():
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _run(cmd: list[str], env: dict, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_tiny_default_trains_across_two_ray_start_nodes(tmp_path):
    # Ray's socket paths live under the temp folder and must stay short (108 bytes): not under pytest's tmp_path.
    temp_dir = tempfile.mkdtemp(prefix="r3c_", dir="/tmp")
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",  # as examples/cluster.md starts one
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    gcs_port, client_port, *ports = _free_ports(8)
    address = f"127.0.0.1:{gcs_port}"
    common = [
        "--node-ip-address=127.0.0.1",
        "--num-cpus=1",
        "--num-gpus=0",
        f"--temp-dir={temp_dir}",
        "--object-store-memory=100000000",
        "--min-worker-port=0",  # 0/0: workers bind random free ports instead of the shared 10002-19999 range
        "--max-worker-port=0",
        "--disable-usage-stats",
    ]
    try:
        _run(
            [
                RAY,
                "start",
                "--head",
                f"--port={gcs_port}",
                f"--ray-client-server-port={client_port}",
                "--include-dashboard=false",
                *common,
                *_node_ports(ports),
            ],
            env,
            timeout=120,
        )
        _run([RAY, "start", f"--address={address}", *common, *_node_ports(_free_ports(6))], env, timeout=120)

        t0 = time.perf_counter()
        train = _run(
            [
                R3,
                "train",
                "examples/tiny_arithmetic_cpu.yaml",
                "--address",
                address,
                "--set",
                "stop.training_iteration=1",
                "--set",
                f"run.storage_path={tmp_path / 'runs'}",
                "--set",
                "run.verbose=0",
                "--set",
                "training.queries_per_iteration=4",
                "--set",
                "training.group_size=4",
                "--set",
                "training.eval_interval=0",
                "--set",
                "env_runners.num_cpus_per_env_runner=1",
                "--set",
                "resources.num_cpus_for_main_process=1",
            ],
            env,
            timeout=400,
            cwd=REPO,
        )
        train_s = time.perf_counter() - t0
        assert "iterations=1" in train.stdout and "error=None" in train.stdout, train.stdout[-2000:]

        probe = _run([sys.executable, "-c", NODES_PROBE, address], env, timeout=120)
        nodes = json.loads(probe.stdout.strip().splitlines()[-1])
        alive = [n for n in nodes if n[1]]
        assert len(alive) == 2, nodes
        assert all(cpu == 1.0 for _, _, cpu in alive), nodes
        print(f"two-node r3 train: {train_s:.1f} s")
    finally:
        _stop_cluster(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)

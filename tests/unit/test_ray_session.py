"""r3_rllib.ray_session without starting Ray: which addresses start a private cluster, and the token file's mode."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from r3_rllib.ray_session import local_cluster_requested, private_token_file


@pytest.mark.parametrize(
    ("address", "env", "private"),
    [
        (None, None, True),
        ("local", None, True),
        (None, "10.0.0.5:6379", False),  # RAY_ADDRESS names a cluster (ray job submit sets it)
        ("local", "10.0.0.5:6379", True),
        ("auto", None, False),
        ("10.0.0.5:6379", None, False),
    ],
)
def test_which_addresses_start_a_private_cluster(monkeypatch, address, env, private):
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    assert local_cluster_requested(address) is private


def test_the_token_file_becomes_readable_by_its_owner_only(tmp_path):
    token = tmp_path / "auth_token"
    token.write_text("secret")
    token.chmod(0o644)  # as Ray writes it under a 022 umask
    private_token_file(token)
    assert token.stat().st_mode & 0o777 == 0o600
    private_token_file(tmp_path / "absent")  # no file: nothing to do, no error


#: Code that switches token authentication off: a dict entry, setdefault or assignment, or a shell export.
DISABLING = re.compile(
    r"""RAY_AUTH_MODE["']?\s*(\]\s*=|,|:)\s*["']disabled|export\s[^\n]*RAY_AUTH_MODE=disabled"""
)


def test_the_disabling_pattern_matches_the_ways_of_switching_auth_off():
    for code in (
        'os.environ.setdefault("RAY_AUTH_MODE", "disabled")',
        'env = {"RAY_AUTH_MODE": "disabled"}',
        'os.environ["RAY_AUTH_MODE"] = "disabled"',
        "export RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1",
    ):
        assert DISABLING.search(code), code
    assert not DISABLING.search("Nothing in this package sets ``RAY_AUTH_MODE=disabled``.")


#: Files that switch auth off on purpose: this one (its patterns) and the security test's attacking client.
ATTACKERS = {"test_ray_session.py", "test_ray_security.py"}


def test_nothing_in_the_package_examples_benchmarks_or_scripts_switches_token_auth_off():
    root = Path(__file__).resolve().parents[2]
    offenders = [
        str(path.relative_to(root))
        for folder in ("r3_rllib", "examples", "bench", "scripts", "tests")
        for path in sorted((root / folder).rglob("*"))
        if path.suffix in (".py", ".sh") and path.name not in ATTACKERS and DISABLING.search(path.read_text())
    ]
    assert not offenders, offenders

"""MKL's strict reproducibility mode: set by importing r3_rllib, missed when a torch product ran first, and warned
about then. Each case runs in a new process: MKL reads its mode once per process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from r3_rllib.core.mkl_mode import mkl_strict

pytestmark = pytest.mark.skipif(mkl_strict() is None, reason="this torch has no MKL")

PRODUCT = "import torch; a = torch.ones(64, 64); a @ a"
REPORT = (
    "import logging; logging.basicConfig(level=logging.WARNING); "
    "from r3_rllib.core.mkl_mode import mkl_strict, warn_if_mkl_not_strict; "
    "print(mkl_strict(), warn_if_mkl_not_strict('The learner'))"
)


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**clean, **env}
    )


def test_importing_the_package_first_makes_mkl_strict():
    done = _run(f"import r3_rllib; {PRODUCT}; {REPORT}")
    assert done.stdout.split() == ["True", "False"], done.stderr[-2000:]
    assert "MKL" not in done.stderr


@pytest.mark.parametrize(
    "code, env",
    [
        (f"{PRODUCT}; import r3_rllib; {REPORT}", {}),  # MKL started before the package set MKL_CBWR
        (f"import r3_rllib; {PRODUCT}; {REPORT}", {"MKL_CBWR": "AUTO"}),  # the user's value, not strict
    ],
    ids=["product-first", "user-mode-without-strict"],
)
def test_mkl_without_strict_mode_is_read_and_warned_about(code, env):
    done = _run(code, **env)
    assert done.stdout.split() == ["False", "True"], done.stderr[-2000:]
    assert "MKL_CBWR=AUTO,STRICT" in done.stderr and "The learner" in done.stderr

"""Skip marks for the sandbox tests (tests/unit/tools/): which isolations this machine can run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from r3_rllib.tools import seccomp
from r3_rllib.tools.sandbox import namespaces_available


def _seccomp_supported() -> bool:
    probe = "from r3_rllib.tools.seccomp import install_filter\ninstall_filter()"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


needs_namespaces = pytest.mark.skipif(
    not namespaces_available(), reason="namespaces isolation needs Linux and root/CAP_SYS_ADMIN"
)
needs_seccomp = pytest.mark.skipif(
    seccomp.native_arch() is None or not _seccomp_supported(),
    reason="the kernel refuses a seccomp filter here",
)
#: Both isolations, each skipped where this machine cannot run it (rlimits: where no seccomp filter installs).
ISOLATIONS = [
    pytest.param("namespaces", marks=needs_namespaces),
    pytest.param("rlimits", marks=needs_seccomp),
]

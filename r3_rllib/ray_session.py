"""Start or join Ray the secure way: token authentication on for the private cluster a run starts.

:func:`init_ray` is what ``r3 train``, the examples and the benchmarks call instead of a bare ``ray.init``:

- **No address** (and no ``RAY_ADDRESS`` in the environment): a private single-node cluster. Token authentication
  is on (Ray 2.60 switches it on for a new local cluster when ``RAY_AUTH_MODE`` is unset, and generates
  ``~/.ray/auth_token``; its log line inviting users to switch it off is not shown), and the dashboard is off.
  Ray 2.60 cannot keep a cluster on loopback: its gRPC servers (GCS, raylet, core workers) listen on every
  interface (measured with ``ss -ltnp`` during a run; no setting confines them), and ``ray.init`` replaces a
  loopback ``_node_ip_address`` with the machine's reachable address (``services.resolve_ip_for_localhost``). The
  token is what keeps other hosts out: ``tests/e2e/test_ray_security.py`` connects through the machine's
  network address and is refused without it. A firewall on Ray's ports adds a second wall. The token file is
  made readable by its owner only (Ray writes it world-readable).
- **An address** (``"auto"``, ``"HOST:PORT"``, or ``RAY_ADDRESS``): join that cluster as it was started; its own
  authentication setting applies (see ``examples/cluster.md`` for starting one with token auth).

Nothing in this package switches token authentication off. A user who does gets Ray's own warning, and one more
from here when the cluster is ours.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: The environment variable that selects Ray's authentication mode ("token" or "disabled").
AUTH_MODE_ENV = "RAY_AUTH_MODE"


def local_cluster_requested(address: str | None) -> bool:
    """Whether ``ray.init(address=address)`` starts a new private cluster rather than joining one."""
    if address is None:
        return not os.environ.get("RAY_ADDRESS")
    return address == "local"


def init_ray(address: str | None = None, **kwargs: Any) -> bool:
    """``ray.init`` with token authentication for a private cluster (see the module docstring).

    ``address``: None or ``"local"`` start a private cluster (None joins ``RAY_ADDRESS`` when that is set); any
    other value joins that cluster. ``kwargs`` go to ``ray.init`` (``num_cpus``, ``runtime_env``, ...; the
    dashboard is off unless ``include_dashboard`` says otherwise). Returns False (and does nothing) when Ray is
    already initialised in this process, True otherwise.
    """
    import ray

    if ray.is_initialized():
        return False
    kwargs.setdefault("include_dashboard", False)
    if local_cluster_requested(address):
        mode = os.environ.get(AUTH_MODE_ENV, "")
        if mode and mode.lower() != "token":
            logger.warning(
                "%s=%s: this private Ray cluster runs without token authentication, and Ray's ports listen on "
                "every interface: anyone who can reach this machine can run code as you. Unset it to keep "
                "token authentication on.",
                AUTH_MODE_ENV,
                mode,
            )
        # Unset, Ray switches token authentication on for a new local cluster itself (the variable cannot be set
        # here instead: Ray reads it when it is imported, and the caller may have imported it already), with a
        # warning that invites switching it off: not shown.
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        address = "local"
    ray.init(address=address, **kwargs)
    if local_cluster_requested(address):
        private_token_file()
    return True


def private_token_file(path: Path | None = None) -> None:
    """Make the token file (default ``~/.ray/auth_token``) readable by its owner only, where it is ours: Ray
    writes it with the process umask (0644 measured here), and a token other local users can read lets them in."""
    path = path or Path.home() / ".ray" / "auth_token"
    try:
        st = path.stat()
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            path.chmod(0o600)
    except OSError:  # no token file (auth off, or a token from RAY_AUTH_TOKEN), or not ours to change
        pass

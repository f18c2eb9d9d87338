"""The EnvRunnerGroup R3 builds its runners with: the runner actors get the config by value, not as an ObjectRef.

RLlib's EnvRunnerGroup (Ray 2.60) puts the algorithm config into the object store once, in its constructor
(``self._remote_config_obj_ref = ray.put(config)``), and ``add_workers`` passes that ObjectRef to every runner
actor's constructor; the actors are created with ``max_restarts=max_num_env_runner_restarts`` (R3's runner fault
handling needs Ray's restart: runner_faults.py). Ray's core worker (``CoreWorker::CreateActor``) logs an
error-level line for an actor created with ``max_restarts != 0`` and a constructor argument in the object store
("... has constructor arguments in the object store and max_restarts > 0 ..."): a restart runs the constructor
again with the same arguments, and Ray does not keep such an argument alive, or rebuild it, for the restart
(ray-project/ray#53727).

:class:`R3EnvRunnerGroup` hands the runners the config itself (about 14 KB pickled): Ray inlines an argument below
``max_direct_call_object_size`` (100 KiB) into the actor-creation task, which the GCS keeps and replays on every
restart, so a restart depends on no object at all. A config too large to inline keeps RLlib's ObjectRef (Ray would
put the value into the object store anyway, and RLlib's ref at least lives as long as the group).

RLlib's ``Algorithm.setup`` names the group class directly (``EnvRunnerGroup(...)``, a global of
``ray.rllib.algorithms.algorithm``; no config field selects it), so :func:`r3_env_runner_group` binds
:class:`R3EnvRunnerGroup` there while ``R3.setup`` runs ``Algorithm.setup``. The subclass changes nothing but how
the config travels, so another algorithm built in the same process meanwhile gets a group that behaves as RLlib's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from typing import Any

import ray
from ray.rllib.algorithms import algorithm as rllib_algorithm
from ray.rllib.env.env_runner_group import EnvRunnerGroup
from ray.rllib.utils.annotations import override

#: Ray's default ``max_direct_call_object_size``: a task argument up to this size travels inside the task spec.
DEFAULT_INLINE_LIMIT = 100 * 1024


def inline_limit() -> int:
    """The largest argument Ray inlines into a task (``RAY_max_direct_call_object_size``, 100 KiB by default)."""
    return int(os.environ.get("RAY_max_direct_call_object_size", DEFAULT_INLINE_LIMIT))


def fits_inline(value: Any) -> bool:
    """Whether ``value`` pickles small enough to travel inside an actor-creation task rather than as an object."""
    return len(ray.cloudpickle.dumps(value)) <= inline_limit()


class R3EnvRunnerGroup(EnvRunnerGroup):
    """RLlib's EnvRunnerGroup, whose remote runners get the config by value (module docstring)."""

    @override(EnvRunnerGroup)
    def _make_worker(self, *, config, worker_index: int, **kwargs):
        # add_workers passes the group's ObjectRef of `self._remote_config`; the local runner (index 0) gets a value.
        if worker_index > 0 and config is self._remote_config_obj_ref and self._config_fits_inline:
            config = self._remote_config
        return super()._make_worker(config=config, worker_index=worker_index, **kwargs)

    @functools.cached_property
    def _config_fits_inline(self) -> bool:
        return fits_inline(self._remote_config)


_lock = threading.Lock()
_active = 0
_rllib_class: type | None = None


@contextlib.contextmanager
def r3_env_runner_group() -> Iterator[None]:
    """Within: RLlib's ``Algorithm.setup`` builds :class:`R3EnvRunnerGroup` (module docstring). Nests and may run in
    several threads at once: the first to enter binds the class, the last to leave restores RLlib's."""
    global _active, _rllib_class
    with _lock:
        if _active == 0:
            _rllib_class = rllib_algorithm.EnvRunnerGroup
            rllib_algorithm.EnvRunnerGroup = R3EnvRunnerGroup
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                rllib_algorithm.EnvRunnerGroup = _rllib_class

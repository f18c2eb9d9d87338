"""Reading pickled checkpoint files without running code from them: an unpickler with an explicit allow-list.

``pickle.load`` calls whatever callable a file names (``os.system``, ``builtins.exec``...), so a checkpoint from
elsewhere could run code when loaded. :func:`safe_load` resolves only the globals an allow-list names: builtin
containers, numpy arrays, dtypes and scalars, and this package's own state dataclasses (whose constructors only
store fields). Any other global is refused *before* it is imported or called, with a CheckpointFormatError naming the
file and the global. Two allow-lists: :data:`DRIVER_STATE_GLOBALS` (``r3_state.pkl``) and :func:`dcp_metadata_global`
(the ``.metadata`` file of a torch.distributed.checkpoint folder, which DCP reads with plain ``pickle.load``: it is
checked here first). Stdlib only; numpy and torch are imported only when a file names them.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
from collections.abc import Callable
from typing import IO, Any

from r3_rllib.algorithms.r3.checkpoint_files import CheckpointFormatError, CorruptCheckpointError

#: (module, name) pairs the driver state may reference. Names of numpy 1.x (``numpy.core``) and 2.x
#: (``numpy._core``) both: an old checkpoint may have been written under either.
DRIVER_STATE_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        *(
            ("builtins", n)
            for n in ("dict", "list", "tuple", "set", "frozenset", "bytearray", "complex", "slice")
        ),
        ("_codecs", "encode"),  # bytes under pickle protocol 2
        *(("collections", n) for n in ("OrderedDict", "deque", "defaultdict", "Counter")),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        *((f"numpy.{core}.multiarray", n) for core in ("core", "_core") for n in ("_reconstruct", "scalar")),
        *((f"numpy.{core}.numeric", "_frombuffer") for core in ("core", "_core")),
        *(("r3_rllib.types.samples", n) for n in ("Group", "Sample", "ReplaySample")),
        *(
            ("r3_rllib.algorithms.r3.rollout_types", n)
            for n in ("Rollout", "RolloutResult", "RolloutTimings", "RunnerState")
        ),
        ("r3_rllib.algorithms.r3.streaming", "QueuedRollout"),
    }
)

#: Where a type a checkpoint may reference lived when older checkpoints were written -> where it lives now.
MOVED_GLOBALS: dict[tuple[str, str], tuple[str, str]] = {
    ("r3_rllib.algorithms.r3.groups", "Group"): ("r3_rllib.types.samples", "Group"),
    ("r3_rllib.algorithms.r3.groups", "Sample"): ("r3_rllib.types.samples", "Sample"),
}

_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_DCP_GLOBALS = frozenset(
    {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath")}
)


def driver_state_global(module: str, name: str) -> bool:
    """Whether ``r3_state.pkl`` may reference ``module.name`` (see :data:`DRIVER_STATE_GLOBALS`)."""
    return (module, name) in DRIVER_STATE_GLOBALS


def dcp_metadata_global(module: str, name: str) -> bool:
    """Whether a DCP ``.metadata`` file may reference ``module.name``: DCP's metadata dataclasses and enums,
    ``torch.Size``, torch dtypes and layouts, ``pathlib`` paths (its checkpoint id)."""
    if (module, name) in _DCP_GLOBALS:
        return True
    if module == "torch" and name.isidentifier() and not name.startswith("_"):
        import torch

        return isinstance(getattr(torch, name, None), torch.dtype)
    if module in _DCP_MODULES and name.isidentifier():
        import dataclasses
        import enum

        obj = getattr(importlib.import_module(module), name, None)
        return isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))
    return False


class _AllowListUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals ``allowed(module, name)`` accepts (every way pickle names a
    global, GLOBAL, STACK_GLOBAL, INST, OBJ and extension codes, goes through ``find_class``); persistent ids are
    refused by the base class."""

    def __init__(self, file, *, allowed: Callable[[str, str], bool], source: str):
        super().__init__(file)
        self._allowed, self._source = allowed, source

    def find_class(self, module: str, name: str) -> Any:
        module, name = MOVED_GLOBALS.get((module, name), (module, name))
        if not self._allowed(module, name):
            raise CheckpointFormatError(
                f"{self._source}: refused to load: it references {module}.{name}, which is not a type a checkpoint "
                f"may contain (loading it could run code); only data types are read from checkpoints"
            )
        return super().find_class(module, name)


def safe_load(path: str, allowed: Callable[[str, str], bool] = driver_state_global) -> Any:
    """Unpickle the file at ``path`` resolving only the globals ``allowed`` accepts. CheckpointFormatError, naming
    ``path``, for a refused global; CorruptCheckpointError (a subclass) for a file that is not a complete pickle
    (truncated, corrupt)."""
    with open(path, "rb") as f:
        return _load(f, allowed, path)


def safe_loads(data: bytes, source: str, allowed: Callable[[str, str], bool] = driver_state_global) -> Any:
    """:func:`safe_load` of pickled bytes (``source`` names them in errors): a writer checks that what it is about
    to save will load."""
    return _load(io.BytesIO(data), allowed, source)


def _load(f: IO[bytes], allowed: Callable[[str, str], bool], source: str) -> Any:
    try:
        return _AllowListUnpickler(f, allowed=allowed, source=source).load()
    except CheckpointFormatError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as e:
        raise CorruptCheckpointError(
            f"{source}: not a readable checkpoint file (truncated or corrupt?): {type(e).__name__}: {e}"
        ) from e


def check_dcp_metadata(dcp_dir: str) -> None:
    """Read ``dcp_dir/.metadata`` with the DCP allow-list before DCP reads it with ``pickle.load``; a missing file is
    left for DCP to report."""
    path = os.path.join(dcp_dir, ".metadata")
    if os.path.exists(path):
        safe_load(path, dcp_metadata_global)

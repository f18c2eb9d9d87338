"""Reading pickled checkpoint files without running code from them: an unpickler with an explicit allow-list.

``pickle.load`` calls whatever callable a file names (``os.system``, ``builtins.exec``...), so a checkpoint from
elsewhere could run code when loaded. :func:`safe_load` resolves only the globals an allow-list names: builtin
containers, numpy arrays, dtypes and scalars, and this package's own state dataclasses (whose constructors only
store fields). Any other global is refused *before* it is imported or called, with a CheckpointFormatError naming the
file and the global. Two allow-lists: :data:`DRIVER_STATE_GLOBALS` (``r3_state.pkl``) and :func:`dcp_metadata_global`
(the ``.metadata`` file of a torch.distributed.checkpoint folder, which DCP reads with plain ``pickle.load``: it is
checked here first). Before the unpickler sees a file, :func:`check_declared_sizes` checks every length and memo
index it declares against the file's size: a corrupt length field (a byte flipped in a FRAME or BINBYTES8 length) is a
CorruptCheckpointError, not a multi-GB allocation, a MemoryError or the OOM killer. numpy trusts the state its own
pickles hand back (one changed byte of a dtype's state tuple can crash the process inside ``dtype.__setstate__``), so
the numpy objects a file builds are checked first (:class:`NumpyGuard`). Stdlib only; numpy and torch are imported
only when a file names them.
"""

from __future__ import annotations

import _compat_pickle
import dataclasses
import enum
import importlib
import io
import os
import pickle
import pickletools
import types
from collections.abc import Callable
from typing import Any

from r3_rllib.algorithms.r3.checkpoint_files import (
    CheckpointFormatError,
    CorruptCheckpointError,
    short_repr,
    unreadable_file,
)
from r3_rllib.algorithms.r3.safe_pickle_numpy import NumpyGuard

#: (module, name) pairs the driver state may reference. Names of numpy 1.x (``numpy.core``) and 2.x
#: (``numpy._core``) both: an old checkpoint may have been written under either.
DRIVER_STATE_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        *(
            ("builtins", n)
            for n in ("dict", "list", "tuple", "set", "frozenset", "bytes", "bytearray", "complex", "slice")
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
        obj = getattr(importlib.import_module(module), name, None)
        # Defined there, not only imported there (the filesystem module imports enum.Enum and the planner's types).
        defined_here = isinstance(obj, type) and obj.__module__ == module
        return defined_here and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))
    return False


class _AllowListUnpickler(pickle._Unpickler):
    """An unpickler that resolves only the globals ``allowed(module, name)`` accepts (every way pickle names a
    global, GLOBAL, STACK_GLOBAL, INST, OBJ and extension codes, goes through ``find_class``); persistent ids are
    refused by the base class. The pure-Python unpickler (``pickle._Unpickler``, several times slower per opcode than
    the C one): its BUILD can be checked, which numpy's dtype needs (:class:`NumpyGuard`); the C unpickler calls
    ``__setstate__`` itself."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: io.BytesIO, *, allowed: Callable[[str, str], bool], source: str):
        super().__init__(file)
        self._allowed, self._source, self._file_size = allowed, source, file.getbuffer().nbytes
        self._numpy: NumpyGuard | None = None  # made when the file names a numpy global

    def find_class(self, module: str, name: str) -> Any:
        # Protocol 2 writes Python 2's names (__builtin__.bytes): mapped as pickle maps them, then checked.
        if self.proto < 3 and self.fix_imports:
            module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        module, name = MOVED_GLOBALS.get((module, name), (module, name))
        if not self._allowed(module, name):
            raise CheckpointFormatError(
                f"{self._source}: refused to load: it references {module}.{name}, which is not a type a checkpoint "
                f"may contain (loading it could run code); only data types are read from checkpoints"
            )
        found = _CHECKED_CALLS.get((module, name)) or super().find_class(module, name)
        if module == "numpy" or module.startswith("numpy."):  # every numpy object's BUILD is checked
            if self._numpy is None:
                self._numpy = NumpyGuard(self._source, self._file_size)
            found = self._numpy.resolve(module, name, found)
        return found

    def load_build(self) -> None:
        """BUILD (``inst.__setstate__(state)``, or an update of its attributes) of a data object only: a numpy dtype
        or array once, after the call that made it, with its state checked (:class:`NumpyGuard`); never a class or
        function the file named (setting attributes of this process's classes)."""
        stack = self.stack
        inst = stack[-2]  # an IndexError for a stack too short, like the base class's
        if self._numpy is not None and isinstance(inst, self._numpy.types):
            self._numpy.build(inst, stack.pop())
            return
        if isinstance(inst, _NEVER_BUILT):
            raise unreadable_file(
                self._source, f"BUILD applied to {short_repr(inst)}, which is no data object"
            )
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build

    def load_reduce(self) -> None:
        """REDUCE (``func(*args)``), never of a dataclass: pickle writes those as NEWOBJ and BUILD, which store
        fields, while calling one runs its ``__post_init__`` (a ReplaySample's turns nested lists that share one
        memo entry into an array of 2**depth items: a few hundred bytes asking for gigabytes)."""
        self._refuse_dataclass_call(self.stack[-2] if len(self.stack) >= 2 else None)
        super().load_reduce()

    dispatch[pickle.REDUCE[0]] = load_reduce

    def _instantiate(self, klass: Any, args: Any) -> None:  # INST and OBJ (protocols 0 and 1): klass(*args)
        self._refuse_dataclass_call(klass)
        super()._instantiate(klass, args)

    def _refuse_dataclass_call(self, func: Any) -> None:
        if isinstance(func, type) and dataclasses.is_dataclass(func):
            raise unreadable_file(self._source, f"a call of {func.__qualname__}, which pickle never writes")


def _bytearray(data: Any = b"") -> bytearray:
    """``builtins.bytearray`` as pickle writes it (protocols 3 and 4): a copy of bytes, never ``bytearray(n)``, which
    would allocate n bytes that the file does not hold."""
    if type(data) not in (bytes, bytearray):
        raise pickle.UnpicklingError(f"bytearray of {short_repr(data)}, not of bytes")
    return bytearray(data)


def _bytes(data: Any = b"") -> bytes:
    """``builtins.bytes`` as protocol 2 writes an empty bytes object (``bytes()``), never ``bytes(n)``."""
    if type(data) is not bytes:
        raise pickle.UnpicklingError(f"bytes of {short_repr(data)}, not of bytes")
    return data


def _latin1_bytes(text: Any, encoding: Any) -> bytes:
    """``_codecs.encode(text, 'latin1')``, how protocol 2 writes bytes; no other codec (hex, base64 and the like
    would let a few bytes of file grow without bound by nesting)."""
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"_codecs.encode of {short_repr((text, encoding))}, not a latin1 string")
    return text.encode("latin1")


#: Allow-listed callables that are called only through a check of their arguments.
_CHECKED_CALLS: dict[tuple[str, str], Callable[..., Any]] = {
    ("builtins", "bytearray"): _bytearray,
    ("builtins", "bytes"): _bytes,
    ("_codecs", "encode"): _latin1_bytes,
}


def safe_load(path: str, allowed: Callable[[str, str], bool] = driver_state_global) -> Any:
    """Unpickle the file at ``path`` resolving only the globals ``allowed`` accepts. CheckpointFormatError, naming
    ``path``, for a refused global; CorruptCheckpointError (a subclass) for a file that is not a complete pickle
    (truncated, corrupt, or declaring sizes larger than the file)."""
    # Read whole (memory of a small multiple of the file's size is all it may cost) so that the sizes checked are
    # those of the bytes unpickled; the unpickler reads from memory, where a read never returns more than is there.
    with open(path, "rb") as f:
        data = f.read()
    return _load(data, allowed, path)


def safe_loads(data: bytes, source: str, allowed: Callable[[str, str], bool] = driver_state_global) -> Any:
    """:func:`safe_load` of pickled bytes (``source`` names them in errors): a writer checks that what it is about
    to save will load."""
    return _load(data, allowed, source)


def _load(data: bytes, allowed: Callable[[str, str], bool], source: str) -> Any:
    """Unpickle ``data`` once its declared sizes are checked; every decoding failure a CorruptCheckpointError."""
    check_declared_sizes(data, source)
    try:
        return _AllowListUnpickler(io.BytesIO(data), allowed=allowed, source=source).load()
    except CheckpointFormatError:
        raise
    except (MemoryError, ImportError):
        # Not the file's fault, so not "corrupt" (which sets a checkpoint aside): check_declared_sizes and the
        # checked calls (_CHECKED_CALLS, no dataclass call, numpy's sizes) keep a file from asking for more memory
        # than a small multiple of its own size, so a MemoryError means this process is short of memory;
        # an ImportError, an allowed module this environment lacks (numpy 1.x reading numpy 2's numpy._core).
        raise
    except Exception as e:
        # Anything else raised while decoding comes from the bytes: the unpickler (UnpicklingError, EOFError, a
        # KeyError for a memo reference to nothing, OverflowError) or the allowed data constructors it calls
        # (numpy's ValueError, RuntimeError "the pickle file may be corrupted?"): all mean the file is not a
        # readable checkpoint.
        raise CorruptCheckpointError(
            f"{source}: not a readable checkpoint file (truncated or corrupt?): {type(e).__name__}: {e}"
        ) from e


#: What a file can reach but never BUILD: classes and functions (its globals) and Enum members (one per process).
_NEVER_BUILT = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, enum.Enum)


# -- sizes a pickle declares ---------------------------------------------------------------------------------------
# How each opcode's argument is laid out, from pickletools' table (every protocol this Python reads): no argument,
# a fixed number of bytes, newline-terminated lines, or a length field followed by that many bytes. FRAME declares
# the length of the opcodes that follow (checked, not skipped); PUT, BINPUT and LONG_BINPUT name a memo index, which
# the unpickler grows its memo list to (LONG_BINPUT 0xFFFFFFFF: 64 GiB, zero-filled).
_NO_ARG, _FIXED, _LINES, _COUNTED, _FRAME, _MEMO, _MEMO_LINE = range(7)
#: Width in bytes and signedness of each kind of length field (pickletools' TAKEN_FROM_ARGUMENT* markers).
_LENGTH_FIELDS = {
    pickletools.TAKEN_FROM_ARGUMENT1: (1, False),
    pickletools.TAKEN_FROM_ARGUMENT4: (4, True),
    pickletools.TAKEN_FROM_ARGUMENT4U: (4, False),
    pickletools.TAKEN_FROM_ARGUMENT8U: (8, False),
}


def _opcode_layouts() -> list[tuple[int, int, bool, str] | None]:
    """Per opcode byte: (kind, width of its argument or length field, or number of lines; whether that field is
    signed; opcode name); None for a byte that is no opcode."""
    layouts: list[tuple[int, int, bool, str] | None] = [None] * 256
    for op in pickletools.opcodes:
        arg, signed = op.arg, False
        if arg is None:
            kind, width = _NO_ARG, 0
        elif op.name == "FRAME":
            kind, width = _FRAME, arg.n
        elif op.name in ("BINPUT", "LONG_BINPUT"):
            kind, width = _MEMO, arg.n
        elif op.name == "PUT":
            kind, width = _MEMO_LINE, 1
        elif arg.n >= 0:
            kind, width = _FIXED, arg.n
        elif arg.n == pickletools.UP_TO_NEWLINE:  # GLOBAL and INST: a module line and a name line
            kind, width = _LINES, 2 if arg is pickletools.stringnl_noescape_pair else 1
        else:
            kind, (width, signed) = _COUNTED, _LENGTH_FIELDS[arg.n]
        layouts[ord(op.code.encode("latin-1"))] = (kind, width, signed, op.name)
    return layouts


_LAYOUTS = _opcode_layouts()
#: Per opcode byte, how far an opcode that declares no size moves (1 + its fixed argument); 0 for the others (and
#: STOP): the fast path of :func:`check_declared_sizes`, which most opcodes of a state file take.
_STEPS = bytes(
    1 + layout[1] if layout and layout[0] in (_NO_ARG, _FIXED) and layout[3] != "STOP" else 0
    for layout in _LAYOUTS
)


def check_declared_sizes(data: bytes, source: str) -> None:
    """CorruptCheckpointError, naming ``source``, unless every size the pickle ``data`` declares fits in it: each
    length field (FRAME, BINBYTES8, BINUNICODE, LONG4...) at most the bytes left after it, each memo index (PUT,
    LONG_BINPUT) below the file's length (a writer numbers memo entries from 0, one per object written), each byte
    where an opcode belongs an opcode, up to a STOP. Then nothing the unpickler allocates for the stream itself
    exceeds a small multiple of ``len(data)``. Builds nothing: one pass over the opcodes in Python, at every save
    (the writer's test load) and every load of a checkpoint, never in an iteration."""
    end, pos, steps, layouts = len(data), 0, _STEPS, _LAYOUTS
    while pos < end:
        step = steps[data[pos]]
        if step:
            pos += step
            continue
        start, layout = pos, layouts[data[pos]]
        if layout is None:
            raise _declared(source, start, f"byte {data[pos]:#04x} where an opcode belongs")
        kind, width, signed, name = layout
        pos += 1
        if kind == _NO_ARG:  # STOP, the only opcode without an argument that the fast path leaves here
            return
        if kind in (_LINES, _MEMO_LINE):
            pos = _after_lines(data, pos, width, source, start, name if kind == _MEMO_LINE else None)
            continue
        if pos + width > end:
            break
        value = int.from_bytes(data[pos : pos + width], "little", signed=signed)
        pos += width
        _check_size(kind, value, end - pos, end, source, start, name)
        if kind == _COUNTED:
            pos += value
    raise _declared(source, end, "the data ends before the pickle's STOP")


def _check_size(kind: int, value: int, remaining: int, end: int, source: str, start: int, name: str) -> None:
    """The check of one declared size: a memo index below ``end`` (the file's length), a length at most the
    ``remaining`` bytes."""
    if kind == _MEMO:
        if not 0 <= value < end:
            raise _declared(
                source, start, f"{name} names memo entry {value}, more than a {end}-byte file holds"
            )
    elif value < 0 or value > remaining:
        raise _declared(source, start, f"{name} declares {value} bytes, {remaining} remain in the file")


def _after_lines(data: bytes, pos: int, count: int, source: str, start: int, memo_op: str | None) -> int:
    """Where the ``count`` newline-terminated lines from ``pos`` end (``len(data)`` when one is cut off: the caller
    reports the truncation). ``memo_op`` (PUT): the line is a memo index, checked like LONG_BINPUT's; one that does
    not parse is left for the unpickler to refuse."""
    for _ in range(count):
        newline = data.find(b"\n", pos)
        if newline < 0:
            return len(data)
        if memo_op is not None:
            try:
                index = int(data[pos:newline])
            except ValueError:
                index = 0
            _check_size(_MEMO, index, 0, len(data), source, start, memo_op)
        pos = newline + 1
    return pos


def _declared(source: str, offset: int, what: str) -> CorruptCheckpointError:
    return unreadable_file(source, f"at byte {offset}: {what}")


def check_dcp_metadata(dcp_dir: str) -> Any:
    """Read ``dcp_dir/.metadata`` with the DCP allow-list before DCP reads it with ``pickle.load``; what it holds
    (DCP's ``Metadata``: each saved entry's name and size), or None where there is no file (left for DCP to
    report)."""
    path = os.path.join(dcp_dir, ".metadata")
    if os.path.exists(path):
        return safe_load(path, dcp_metadata_global)
    return None

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
the numpy objects a file builds are checked first (:class:`_NumpyGuard`). Stdlib only; numpy and torch are imported
only when a file names them.
"""

from __future__ import annotations

import _compat_pickle
import dataclasses
import enum
import importlib
import io
import math
import os
import pickle
import pickletools
import sys
import types
from collections.abc import Callable
from typing import Any

from r3_rllib.algorithms.r3.checkpoint_files import CheckpointFormatError, CorruptCheckpointError, short_repr

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
    the C one): its BUILD can be checked, which numpy's dtype needs (:class:`_NumpyGuard`); the C unpickler calls
    ``__setstate__`` itself."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: io.BytesIO, *, allowed: Callable[[str, str], bool], source: str):
        super().__init__(file)
        self._allowed, self._source, self._file_size = allowed, source, file.getbuffer().nbytes
        self._numpy: _NumpyGuard | None = None  # made when the file names a numpy global

    def find_class(self, module: str, name: str) -> Any:
        if (
            self.proto < 3 and self.fix_imports
        ):  # protocol 2 writes Python 2's names (__builtin__.bytes), as pickle
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
                self._numpy = _NumpyGuard(self._source, self._file_size)
            found = self._numpy.resolve(module, name, found)
        return found

    def load_build(self) -> None:
        """BUILD (``inst.__setstate__(state)``, or an update of its attributes) of a data object only: a numpy dtype
        or array once, after the call that made it, with its state checked (:class:`_NumpyGuard`); never a class or
        function the file named (setting attributes of this process's classes)."""
        stack = self.stack
        inst = stack[-2]  # an IndexError for a stack too short, like the base class's
        if self._numpy is not None and isinstance(inst, self._numpy.types):
            self._numpy.build(inst, stack.pop())
            return
        if isinstance(inst, _GLOBAL_TYPES) or isinstance(
            inst, enum.Enum
        ):  # an Enum member is process-wide too
            raise _corrupt(self._source, f"BUILD applied to {short_repr(inst)}, which is no data object")
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
            raise _corrupt(self._source, f"a call of {func.__qualname__}, which pickle never writes")


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
    # Read whole (memory of a small multiple of the file's size is all it may cost) so that the sizes checked are those of the
    # bytes unpickled; the unpickler reads from memory, where a read never returns more than is there.
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
        # Not the file's fault, so not "corrupt" (which sets a checkpoint aside): check_declared_sizes, the checked calls
        # (_CHECKED_CALLS, no dataclass call, numpy's sizes) keep a file from asking for more memory than a small
        # multiple of its own size, so a MemoryError means this process is short of memory;
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


# -- numpy objects -------------------------------------------------------------------------------------------------
#: The numpy globals whose results :class:`_NumpyGuard` checks (names of numpy 1.x and 2.x), and what each becomes.
_NUMPY_CHECKED: dict[tuple[str, str], str] = {("numpy", "dtype"): "dtype", ("numpy", "ndarray"): "ndarray"}
for _core in ("numpy.core", "numpy._core"):
    _NUMPY_CHECKED[f"{_core}.multiarray", "_reconstruct"] = "reconstruct"
    _NUMPY_CHECKED[f"{_core}.multiarray", "scalar"] = "scalar"
    _NUMPY_CHECKED[f"{_core}.numeric", "_frombuffer"] = "frombuffer"
#: What a file can name but never BUILD: classes and functions (its globals).
_GLOBAL_TYPES = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
#: numpy dtype flags: items hold object references (NPY_ITEM_REFCOUNT), arrays pickle as a list (NPY_LIST_PICKLE), a
#: struct laid out with align=True (NPY_ALIGNED_STRUCT).
_NPY_ITEM_REFCOUNT, _NPY_LIST_PICKLE, _NPY_ALIGNED_STRUCT = 0x01, 0x02, 0x80
_DATETIME_UNITS = frozenset("Y M W D h m s ms us ns ps fs as generic".split())


class _ArrayClass:
    """What ``numpy.ndarray`` resolves to: accepted only as ``_reconstruct``'s first argument, so that a file cannot
    call the ndarray constructor (with a dtype whose state is still to come)."""

    __slots__ = ()


class _NumpyGuard:
    """The numpy dtypes, arrays and scalars a file builds, checked before numpy sees them. numpy trusts the state its
    pickles hand back: ``dtype.__setstate__`` stores what the tuple holds (a 6-item tuple leaves the field names a
    NULL pointer, flags can mark float items as object references, a fields dict can hold anything where a dtype
    belongs), so one changed byte crashes the process. Here a dtype is made fresh from a type string; its BUILD, once,
    gets numpy's own state of the dtype the file's state describes (made with numpy's public constructors), only if
    that equals the file's. An array's BUILD, once, gets a checked shape, a finished dtype and exactly shape x itemsize
    bytes (or a list of as many objects). Anything else: CorruptCheckpointError naming what is wrong."""

    def __init__(self, source: str, file_size: int):
        import numpy

        self._np, self._source, self._file_size = numpy, source, file_size
        self.types = (numpy.dtype, numpy.ndarray, numpy.generic)
        self._unbuilt: dict[int, Any] = {}  # id -> the dtypes and arrays made, awaiting their BUILD
        self._real: dict[str, Any] = {}

    def resolve(self, module: str, name: str, found: Any) -> Any:
        checked = _NUMPY_CHECKED.get((module, name))
        if checked is None:  # a global that an allow-list other than this module's admits
            return found
        if checked == "ndarray":
            return _ArrayClass()
        self._real[checked] = found
        return getattr(self, checked)

    def dtype(self, obj: Any, align: Any = False, copy: Any = False) -> Any:
        """``numpy.dtype('f4', False, True)`` as numpy pickles it: a new dtype from the type string numpy writes."""
        made = None
        if type(obj) is str and type(align) in (bool, int) and type(copy) in (bool, int):
            made = self._np.dtype(obj, bool(align), True)
        if made is None or made.__reduce__()[1][0] != obj:
            raise self._bad(f"numpy.dtype called with {short_repr((obj, align, copy))}, not a type string")
        self._unbuilt[id(made)] = made
        return made

    def reconstruct(self, cls: Any, shape: Any, typecode: Any) -> Any:
        """``_reconstruct(ndarray, (0,), b'b')``, the empty array numpy's array pickle fills by BUILD."""
        if not (isinstance(cls, _ArrayClass) and type(shape) is tuple and shape == (0,) and typecode == b"b"):
            raise self._bad(f"numpy _reconstruct called with {short_repr((cls, shape, typecode))}")
        made = self._real["reconstruct"](self._np.ndarray, (0,), b"b")
        self._unbuilt[id(made)] = made
        return made

    def scalar(self, dtype: Any, obj: Any = None) -> Any:
        """A numpy scalar from its dtype and bytes (a structured one holding objects: from its 0-d array)."""
        self._finished(dtype, "a numpy scalar's dtype")
        if dtype.flags & _NPY_LIST_PICKLE:
            fits = type(obj) is self._np.ndarray and obj.shape == () and obj.dtype == dtype
            fits = fits and id(obj) not in self._unbuilt
        else:
            fits = type(obj) is bytes and len(obj) == dtype.itemsize and not dtype.flags & _NPY_ITEM_REFCOUNT
        if not fits:
            raise self._bad(f"a numpy scalar of dtype {dtype} holds {short_repr(obj)}")
        return self._real["scalar"](dtype, obj)

    def frombuffer(self, buf: Any, dtype: Any, shape: Any, order: Any, *axis_order: Any) -> Any:
        """``_frombuffer(buffer, dtype, shape, order[, axis_order])``, numpy's array pickle of protocol 5."""
        self._array_dtype(dtype)
        shape = self._shape(shape, "a numpy array's shape")
        size = memoryview(buf).nbytes if type(buf) in (bytes, bytearray, memoryview) else None
        if size != math.prod(shape) * dtype.itemsize or dtype.flags & _NPY_ITEM_REFCOUNT:
            raise self._bad(f"a numpy array buffer of {size} bytes for {shape} x {dtype}")
        axes = axis_order[0] if len(axis_order) == 1 else None
        axes_fit = axes is None or sorted(self._shape(axes, "an axis order")) == list(range(len(shape)))
        if order not in ("C", "F", "K") or len(axis_order) > 1 or not axes_fit:
            raise self._bad(f"numpy array order {short_repr(order)}, {short_repr(axis_order)} for {shape}")
        return self._real["frombuffer"](buf, dtype, shape, order, *axis_order)

    def build(self, inst: Any, state: Any) -> None:
        """BUILD of ``inst``: a dtype or array made by this file and not yet built, with a checked state."""
        if self._unbuilt.pop(id(inst), None) is not inst:
            raise self._bad(f"BUILD of {short_repr(inst)}, which is not a new numpy dtype or array")
        if isinstance(inst, self._np.dtype):
            self._build_dtype(inst, state)
        else:
            self._build_array(inst, state)

    def _build_dtype(self, made: Any, state: Any) -> None:
        try:
            described = self._described_dtype(made, state)
        except (ValueError, TypeError, OverflowError) as e:  # numpy's constructors refusing the parts
            raise self._bad(f"numpy.dtype state {short_repr(state)} describes no dtype: {e}") from e
        func, args, canonical = described.__reduce__()
        if func is not self._np.dtype or args != made.__reduce__()[1] or canonical != state:
            raise self._bad(f"numpy.dtype state {short_repr(state, 160)} is not that of a {made.str} dtype")
        made.__setstate__(canonical)  # numpy's own objects: nothing from the file reaches numpy unchecked

    def _described_dtype(self, made: Any, state: Any) -> Any:
        """The dtype a dtype state describes, made with numpy's public constructors from the state's parts."""
        np = self._np
        if type(state) is not tuple or len(state) not in (8, 9):
            raise self._bad(
                f"a numpy.dtype state should be a tuple of 8 or 9 items, found {short_repr(state)}"
            )
        _version, order, subarray, names, fields, itemsize, _alignment, flags = state[:8]
        metadata = state[8] if len(state) == 9 else None
        if type(order) is not str or order not in ("<", ">", "|", "=") or type(flags) is not int:
            raise self._bad(f"numpy.dtype byte order {short_repr(order)}, flags {short_repr(flags)}")
        if made.kind in "mM":
            described, metadata = self._datetime(made, order, metadata), metadata[0]
        elif subarray is not None:
            if type(subarray) is not tuple or len(subarray) != 2:
                raise self._bad(f"a numpy.dtype subarray should be (dtype, shape): {short_repr(subarray)}")
            base = self._finished(subarray[0], "a numpy subarray's dtype")
            described = np.dtype((base, self._shape(subarray[1], "a numpy subarray's shape")))
        elif names is not None or fields is not None:
            described = np.dtype(self._struct(names, fields, itemsize, flags))
        else:
            described = made if order == "|" else made.newbyteorder(order)
        if metadata is not None:
            if type(metadata) is not dict:
                raise self._bad(f"numpy.dtype metadata should be a dict, found {short_repr(metadata)}")
            described = np.dtype(described, metadata=metadata)
        return described

    def _struct(self, names: Any, fields: Any, itemsize: Any, flags: int) -> dict[str, Any]:
        """The ``numpy.dtype`` argument for a structured dtype's names and fields."""
        if type(names) is not tuple or type(fields) is not dict or any(type(n) is not str for n in names):
            raise self._bad(f"numpy.dtype field names {short_repr(names)}, fields {short_repr(fields)}")
        spec: dict[str, Any] = {"names": list(names), "formats": [], "offsets": [], "titles": []}
        for name in names:
            field = fields.get(name)
            if type(field) is not tuple or len(field) not in (2, 3):
                raise self._bad(f"numpy.dtype field {name!r} should be (dtype, offset[, title]): {field!r}")
            spec["formats"].append(self._finished(field[0], f"numpy.dtype field {name!r}"))
            spec["offsets"].append(field[1])
            spec["titles"].append(field[2] if len(field) == 3 else None)
        return {**spec, "itemsize": itemsize, "aligned": bool(flags & _NPY_ALIGNED_STRUCT)}

    def _datetime(self, made: Any, order: str, metadata: Any) -> Any:
        """A datetime64 / timedelta64 dtype from its state's metadata: (dict or None, (unit, count, 1, 1))."""
        unit = count = None
        if type(metadata) is tuple and len(metadata) == 2 and type(metadata[1]) is tuple:
            unit, count = (metadata[1] + (None, None))[:2]
        if type(unit) is not bytes or unit.decode("latin-1") not in _DATETIME_UNITS or type(count) is not int:
            raise self._bad(f"numpy {made.str} metadata should be (dict, (unit, count, 1, 1)): {metadata!r}")
        unit = unit.decode("latin-1")
        return self._np.dtype(f"{order}{made.char}8" + ("" if unit == "generic" else f"[{count}{unit}]"))

    def _build_array(self, made: Any, state: Any) -> None:
        if type(state) is not tuple or len(state) != 5 or type(state[0]) is not int or state[0] != 1:
            raise self._bad(
                f"a numpy array state should be (1, shape, dtype, fortran, data): {short_repr(state)}"
            )
        _version, shape, dtype, fortran, data = state
        shape = self._shape(shape, "a numpy array's shape")
        self._array_dtype(dtype)
        count, size = math.prod(shape), math.prod(max(n, 1) for n in shape) * max(dtype.itemsize, 1)
        # Items of 0 bytes ('V0', 'S0') take no data, so the data's length bounds nothing: a count past the file's
        # own length is no array a writer made (numpy would then loop over 2**40 empty items).
        empty_items = dtype.itemsize == 0 and count > self._file_size
        if size > sys.maxsize or empty_items or type(fortran) not in (bool, int):
            raise self._bad(f"a numpy array of shape {shape} x {dtype}, fortran {short_repr(fortran)}")
        if dtype.flags & _NPY_LIST_PICKLE:
            if type(data) is not list or len(data) != count:
                raise self._bad(
                    f"a numpy {dtype} array of shape {shape} should hold a list of {count} objects"
                )
        elif (
            type(data) is not bytes or len(data) != count * dtype.itemsize or dtype.flags & _NPY_ITEM_REFCOUNT
        ):
            found = f"{len(data)} bytes" if type(data) is bytes else short_repr(data)
            raise self._bad(
                f"a numpy {dtype} array of shape {shape} should hold {count * dtype.itemsize} bytes: {found}"
            )
        made.__setstate__((1, shape, dtype, bool(fortran), data))

    def _array_dtype(self, dtype: Any) -> None:
        """An array's dtype: finished, and no subarray dtype (numpy makes ``zeros(3, ('f4', (2,)))`` a (3, 2) 'f4'
        array, so no array it pickles has one; one loaded anyway converts and sorts wrongly)."""
        self._finished(dtype, "a numpy array's dtype")
        if dtype.subdtype is not None:
            raise self._bad(f"a numpy array of subarray dtype {dtype}, which numpy never writes")

    def _finished(self, value: Any, what: str) -> Any:
        """``value``, which must be a numpy dtype whose state, if it has one, has been read."""
        if not isinstance(value, self._np.dtype) or id(value) in self._unbuilt:
            raise self._bad(f"{what} should be a finished numpy dtype, found {short_repr(value)}")
        return value

    def _shape(self, value: Any, what: str) -> tuple[int, ...]:
        if type(value) is not tuple or len(value) > 64 or any(type(n) is not int or n < 0 for n in value):
            raise self._bad(f"{what} should be a tuple of at most 64 ints >= 0, found {short_repr(value)}")
        return value

    def _bad(self, what: str) -> CorruptCheckpointError:
        return _corrupt(self._source, what)


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
    return _corrupt(source, f"at byte {offset}: {what}")


def _corrupt(source: str, what: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{source}: not a readable checkpoint file (truncated or corrupt?): {what}")


def check_dcp_metadata(dcp_dir: str) -> None:
    """Read ``dcp_dir/.metadata`` with the DCP allow-list before DCP reads it with ``pickle.load``; a missing file is
    left for DCP to report."""
    path = os.path.join(dcp_dir, ".metadata")
    if os.path.exists(path):
        safe_load(path, dcp_metadata_global)

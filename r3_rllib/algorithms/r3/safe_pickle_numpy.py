"""The numpy objects a checkpoint pickle builds, checked before numpy sees them (:class:`NumpyGuard`, used by
:mod:`r3_rllib.algorithms.r3.safe_pickle`'s unpickler for every numpy global a file names).

numpy trusts the state its own pickles hand back: one changed byte of a dtype's state tuple can crash the process
inside ``dtype.__setstate__``, which no ``except`` catches. numpy is imported only when a file names it.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from r3_rllib.algorithms.r3.checkpoint_files import CorruptCheckpointError, short_repr, unreadable_file

#: The numpy globals whose results :class:`NumpyGuard` checks (names of numpy 1.x and 2.x), and what each becomes.
_NUMPY_CHECKED: dict[tuple[str, str], str] = {("numpy", "dtype"): "dtype", ("numpy", "ndarray"): "ndarray"}
for _core in ("numpy.core", "numpy._core"):
    _NUMPY_CHECKED[f"{_core}.multiarray", "_reconstruct"] = "reconstruct"
    _NUMPY_CHECKED[f"{_core}.multiarray", "scalar"] = "scalar"
    _NUMPY_CHECKED[f"{_core}.numeric", "_frombuffer"] = "frombuffer"
#: numpy dtype flags: items hold object references (NPY_ITEM_REFCOUNT), arrays pickle as a list (NPY_LIST_PICKLE), a
#: struct laid out with align=True (NPY_ALIGNED_STRUCT).
_NPY_ITEM_REFCOUNT, _NPY_LIST_PICKLE, _NPY_ALIGNED_STRUCT = 0x01, 0x02, 0x80
_DATETIME_UNITS = frozenset("Y M W D h m s ms us ns ps fs as generic".split())


class _ArrayClass:
    """What ``numpy.ndarray`` resolves to: accepted only as ``_reconstruct``'s first argument, so that a file cannot
    call the ndarray constructor (with a dtype whose state is still to come)."""

    __slots__ = ()


class NumpyGuard:
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
        return unreadable_file(self._source, what)

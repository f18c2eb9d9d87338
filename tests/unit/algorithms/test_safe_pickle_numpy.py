"""numpy objects in a damaged or crafted checkpoint never crash the reader (safe_pickle_numpy.py, NumpyGuard): numpy
trusts the state its pickles hand back, and one changed byte of a dtype's state made numpy 2.3 segfault inside
``dtype.__setstate__`` (a crash of the whole process, which no ``except`` catches), so the reader checks every dtype,
array and scalar state first. The byte sweeps load each variant in a worker subprocess, restarted after a crash, so a
crash is a failed assertion (a return code -11), not the end of the test run. The crafted states are loaded in this
process: on a reader without those checks some of them crash it."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from r3_rllib.algorithms.r3.checkpoint_files import CorruptCheckpointError
from r3_rllib.algorithms.r3.safe_pickle import safe_loads
from r3_rllib.types.samples import Sample

REPO = Path(__file__).resolve().parents[3]

#: Loads every variant of the pickle in argv[1] with one byte set to another value, from variant argv[2] on; prints
#: each variant's number before loading it (so the parent knows which one a crash was) and any error other than the
#: reader's own.
_WORKER = r"""
import sys
from r3_rllib.algorithms.r3.checkpoint_files import CheckpointFormatError
from r3_rllib.algorithms.r3.safe_pickle import safe_loads
blob = open(sys.argv[1], "rb").read()
for variant in range(int(sys.argv[2]), len(blob) * 256):
    offset, value = divmod(variant, 256)
    if blob[offset] == value:
        continue
    print(variant, flush=True)
    damaged = bytearray(blob)
    damaged[offset] = value
    try:
        safe_loads(bytes(damaged), "variant")
    except CheckpointFormatError:
        pass
    except BaseException as e:
        print(f"variant {variant}: {type(e).__name__}: {e}", flush=True)
print("done", flush=True)
"""


def _sweep(blob: bytes, tmp_path: Path, max_crashes: int = 3) -> tuple[list[str], list[str]]:
    """Every one-byte change of ``blob`` loaded by safe_loads in worker subprocesses, one at a time: the crashes
    (offset, byte values, return code; at most ``max_crashes``, then the sweep stops) and the errors other than
    CheckpointFormatError."""
    path = tmp_path / "blob.pkl"
    path.write_bytes(blob)
    crashes, errors, start = [], [], 0
    while len(crashes) < max_crashes:
        run = subprocess.run(
            [sys.executable, "-c", _WORKER, str(path), str(start)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        lines = run.stdout.splitlines()
        errors += [line for line in lines if line.startswith("variant ")]
        if run.returncode == 0 and lines[-1:] == ["done"]:
            break
        numbers = [line for line in lines if line.isdigit()]
        assert numbers, f"the worker failed before loading anything: {run.returncode} {run.stderr[-2000:]}"
        offset, value = divmod(int(numbers[-1]), 256)
        crashes.append(f"byte {offset} {blob[offset]:#04x} -> {value:#04x}: return code {run.returncode}")
        start = int(numbers[-1]) + 1
    return crashes, errors


def test_no_one_byte_change_of_an_array_pickle_crashes_the_reader(tmp_path):
    """All 255 other values of each byte of a float32 array's pickle (protocol 4, as R3 writes): each variant
    loads or is a CheckpointFormatError. The reader before the check crashed (-11) on e.g. a NONE of the dtype state
    (3, '<', None, None, None, -1, -1, 0) turned into POP, which leaves a 6-item tuple."""
    crashes, errors = _sweep(pickle.dumps(np.arange(2, dtype=np.float32), protocol=4), tmp_path)
    assert not crashes and not errors, crashes + errors[:10]


@pytest.mark.slow
@pytest.mark.parametrize("protocol", [2, 4])
def test_no_one_byte_change_of_a_numpy_state_pickle_crashes_the_reader(tmp_path, protocol):
    """The same sweep over arrays of several dtypes (a structured one among them) and a scalar (20-35 CPU-s each),
    in protocol 2 (the most kinds of crash before: memo stores turned into ints, 'f8' into 'S8' or 'O8', besides the
    dtype states) and 4 (what format 0-1 wrote). Protocols 3 and 5 differ from these only in how bytes and frames
    are written; the byte-by-byte sweeps of all four found 27-30 crashing variants each before the check, none
    after it."""
    value = {
        "f4": np.arange(2, dtype=np.float32),
        "i8": np.arange(1, dtype=np.int64),
        "rec": np.zeros(1, dtype=[("a", "<f4"), ("b", "<i8")]),
        "s": np.float32(1.5),
    }
    crashes, errors = _sweep(pickle.dumps(value, protocol=protocol), tmp_path)
    assert not crashes and not errors, crashes + errors[:10]


# -- every dtype numpy pickles still reads ---------------------------------------------------------------------------
_DTYPES = [
    *("f2 f4 f8 >f8 g i1 <u2 >i4 i8 ? c8 c16 U5 S3 V4 O M8[ns] m8[3s] M8".split()),
    [("a", "<f4"), ("b", ">i8", (2,))],
    np.dtype([("a", "f4"), ("b", "i8")], align=True),
    {"names": ["x"], "formats": ["u1"], "titles": ["T"], "offsets": [2], "itemsize": 8},
    [("a", "O"), ("b", "f4")],
    np.dtype([("n", [("x", "f4"), ("y", "O")]), ("z", "u1")], align=True),
    np.dtype([("a", "f4"), ("b", "i2")], metadata={"m": 1}),
    np.dtype("f4", metadata={"k": 1}),
]


@pytest.mark.parametrize("dtype", _DTYPES, ids=lambda d: str(np.dtype(d)))
@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_arrays_scalars_and_dtypes_of_every_kind_read_as_pickle_reads_them(dtype, protocol):
    """Contiguous, transposed and strided arrays (numpy pickles each differently under protocol 5), empty ones, a
    scalar and the dtype itself: what safe_loads returns equals what pickle.loads does."""
    dtype = np.dtype(dtype)
    array = np.zeros((2, 3), dtype)
    value = {
        "dtype": dtype,
        "a": array,
        "t": array.T,
        "strided": array[:, ::2],
        "empty": np.zeros((0, 4), dtype),
    }
    value["scalar"] = array.ravel()[0]
    blob = pickle.dumps(value, protocol=protocol)
    want, got = pickle.loads(blob), safe_loads(blob, "blob")
    assert got["dtype"].__reduce__() == want["dtype"].__reduce__()
    for key in ("a", "t", "strided", "empty"):
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape
        if not dtype.hasobject:
            assert got[key].tobytes() == want[key].tobytes()
    assert type(got["scalar"]) is type(want["scalar"])


# -- crafted states ----------------------------------------------------------------------------------------------
class _Reduce:
    """Pickles as numpy's own objects do, ``func(*args)`` then BUILD ``state``, with any arguments and state."""

    def __init__(self, func, args, state=None):
        self.reduce = (func, args) if state is None else (func, args, state)

    def __reduce__(self):
        return self.reduce


_RECONSTRUCT = np.zeros(1).__reduce__()[0]
_SCALAR = np.float32(0).__reduce__()[0]
_F4_STATE = (3, "<", None, None, None, -1, -1, 0)


def _dtype(code: str = "f4", state=_F4_STATE) -> _Reduce:
    return _Reduce(np.dtype, (code, False, True), state)


def _array(state) -> _Reduce:
    return _Reduce(_RECONSTRUCT, (np.ndarray, (0,), b"b"), state)


def _struct(fields: dict, names=("a",)) -> _Reduce:
    return _dtype("V8", (3, "|", None, names, fields, 8, 1, 0))


@pytest.mark.parametrize(
    "value, match",
    [
        # numpy 2.3 segfaulted on each of these four: a NULL tuple of names, object flags on float items...
        (_dtype(state=(3, "<", None, -1, -1, 0)), r"numpy.dtype state should be a tuple of 8 or 9 items"),
        (_dtype(state=(3, "<", None, None, None, -1, -1, 63)), r"is not that of a <f4 dtype"),
        (_struct({"a": ("f4", 0)}), r"numpy.dtype field 'a' should be a finished numpy dtype, found 'f4'"),
        (_struct({1: (np.dtype("f4"), 0)}, names=(1,)), r"numpy.dtype field names \(1,\)"),
        (_dtype("M8"), r"numpy <M8 metadata should be \(dict, \(unit, count, 1, 1\)\): None"),
        (_dtype(state=(3, "x", None, None, None, -1, -1, 0)), r"numpy.dtype byte order 'x'"),
        (_dtype(state=(3, "<", None, None, None, 99, 4, 0)), r"is not that of a <f4 dtype"),
        (_struct({"a": (np.dtype("f4"), 6)}), r"describes no dtype"),
        (_Reduce(np.dtype, ("f4,i8", False, True)), r"numpy.dtype called with .*not a type string"),
        (_array((1, (3,), np.dtype("f4"), False, b"\0" * 8)), r"should hold 12 bytes: 8 bytes"),
        (_array((1, (2,), np.dtype("f4"), False, [1.0, 2.0])), r"should hold 8 bytes: \[1.0, 2.0\]"),
        (_array((1, (2,), np.dtype("O"), False, b"\0" * 16)), r"should hold a list of 2 objects"),
        (
            _array((1, (-1,), np.dtype("f4"), False, b"\0")),
            r"shape should be a tuple of at most 64 ints >= 0",
        ),
        (_array((1, (2,), "f4", False, b"\0" * 8)), r"array's dtype should be a finished numpy dtype"),
        (_Reduce(_RECONSTRUCT, (np.ndarray, (1 << 40,), b"b")), r"numpy _reconstruct called with"),
        (_Reduce(_SCALAR, (np.dtype("f4"), b"\0\0")), r"a numpy scalar of dtype float32 holds b'\\x00\\x00'"),
        # A dtype whose BUILD never came (or is still to come) is used by nothing.
        (
            _Reduce(_SCALAR, (_Reduce(np.dtype, ("f4", False, True)), b"\0" * 4)),
            r"should be a finished numpy",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_malformed_numpy_state_is_corrupt_naming_what_is_wrong(value, match):
    for protocol in (2, 4, 5):
        with pytest.raises(CorruptCheckpointError, match=rf"^blob: not a readable checkpoint file .*{match}"):
            safe_loads(pickle.dumps(value, protocol=protocol), "blob")


def _spliced(first: object, then: bytes) -> bytes:
    """Protocol-2 opcodes of ``first`` followed by ``then`` (pushing a state, BUILD), then STOP."""
    return pickle.dumps(first, protocol=2)[:-1] + then + pickle.STOP


def test_a_dtype_or_array_is_built_once():
    """A second BUILD would change a dtype already in use (an array's items turned into object references)."""
    state = pickle.dumps(_F4_STATE, protocol=2)[2:-1]
    with pytest.raises(
        CorruptCheckpointError, match=r"BUILD of dtype\('float32'\), which is not a new numpy dtype or array"
    ):
        safe_loads(_spliced(np.dtype("f4"), state + pickle.BUILD), "blob")
    state = pickle.dumps((1, (1,), np.dtype("u1"), False, b"x"), protocol=2)[2:-1]
    with pytest.raises(
        CorruptCheckpointError, match=r"BUILD of array\(\[0\], dtype=uint8\), which is not a new"
    ):
        safe_loads(_spliced(np.zeros(1, np.uint8), state + pickle.BUILD), "blob")


def test_build_of_a_class_the_file_names_is_refused_not_applied():
    """BUILD on a global sets attributes of this process's class (the C unpickler did: any later Sample had it)."""
    slot_state = pickle.dumps((None, {"_set_by_a_checkpoint": 1}), protocol=2)[2:-1]
    try:
        with pytest.raises(
            CorruptCheckpointError, match=r"BUILD applied to <class .*Sample'>, which is no data"
        ):
            safe_loads(_spliced(Sample, slot_state + pickle.BUILD), "blob")
        assert not hasattr(Sample, "_set_by_a_checkpoint")
    finally:
        if hasattr(Sample, "_set_by_a_checkpoint"):
            delattr(Sample, "_set_by_a_checkpoint")

"""What an allow-listed global may do when a checkpoint file calls it (safe_pickle.py): a few bytes of file must not
ask for gigabytes (``bytearray(n)``, a codec nested in itself, a dataclass's ``__post_init__`` over a list that
shares one memo entry at every level), change a process-wide object (BUILD of an Enum member), or reach a type a
DCP module only imports. Each case was read by the previous reader: the allocations succeeded (or, past memory, an
uncaught MemoryError), the Enum member was renamed for the rest of the process."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest

from r3_rllib.algorithms.r3.checkpoint_files import CheckpointFormatError, CorruptCheckpointError
from r3_rllib.algorithms.r3.safe_pickle import dcp_metadata_global, safe_loads
from r3_rllib.types.samples import ReplaySample, Sample

_CORRUPT = r"^blob: not a readable checkpoint file \(truncated or corrupt\?\): "


def _global(module: str, name: str) -> bytes:
    return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def _call(func: bytes, *args: bytes) -> bytes:
    """Protocol-2 opcodes calling ``func`` on ``args`` (each already opcodes), then STOP."""
    return (
        pickle.PROTO
        + b"\x02"
        + func
        + pickle.MARK
        + b"".join(args)
        + pickle.TUPLE
        + pickle.REDUCE
        + pickle.STOP
    )


def _int(n: int) -> bytes:
    return pickle.BININT + struct.pack("<i", n)


def _str(s: str) -> bytes:
    return pickle.BINUNICODE + struct.pack("<I", len(s)) + s.encode()


def test_bytearray_copies_bytes_and_never_allocates_a_count():
    """``bytearray(400 MiB)`` was a 30-byte file; pickle writes bytearray only as a copy of bytes."""
    with pytest.raises(CorruptCheckpointError, match=_CORRUPT + r"UnpicklingError: bytearray of 419430400"):
        safe_loads(_call(_global("builtins", "bytearray"), _int(400 * 2**20)), "blob")
    for protocol in (3, 4, 5):
        value = [bytearray(b"ab"), bytearray()]
        assert safe_loads(pickle.dumps(value, protocol=protocol), "blob") == value


def test_codecs_encode_reads_protocol_2_bytes_only():
    """Protocol 2 writes bytes as ``_codecs.encode(text, 'latin1')``; 'hex' nested in itself doubled a value per 14
    bytes of file."""
    assert safe_loads(pickle.dumps([b"\x00\xffab", b""], protocol=2), "blob") == [b"\x00\xffab", b""]
    hexed = _call(_global("_codecs", "encode"), pickle.SHORT_BINBYTES + b"\x01a", _str("hex"))
    with pytest.raises(CorruptCheckpointError, match=_CORRUPT + r"UnpicklingError: _codecs.encode of"):
        safe_loads(hexed, "blob")


def _nested_shared(depth: int) -> bytes:
    """A list whose two items are one memo entry, ``depth`` levels deep: 2**depth leaves in ~6 bytes per level."""
    ops = pickle.BININT1 + b"\x00" + pickle.BINPUT + b"\x00"
    for level in range(depth):
        ops += pickle.MARK + pickle.BINGET + bytes([level]) + pickle.BINGET + bytes([level]) + pickle.LIST
        ops += pickle.BINPUT + bytes([level + 1])
    return ops


def test_a_dataclass_is_filled_by_build_never_called():
    """REDUCE of ReplaySample ran its ``__post_init__``, whose ``np.asarray`` turned a 2**22-leaf list of shared memo
    entries (a few hundred bytes) into 16 MiB; 2**33 leaves would have asked for 32 GiB. Pickle writes dataclasses
    as NEWOBJ and BUILD (fields stored, nothing called): those still load, at every protocol."""
    args = [_str("q"), _nested_shared(22), pickle.EMPTY_LIST, pickle.EMPTY_LIST, pickle.BINFLOAT + bytes(8)]
    args += [pickle.NEWFALSE, _int(0)]
    with pytest.raises(
        CorruptCheckpointError, match=_CORRUPT + r"a call of ReplaySample, which pickle never"
    ):
        safe_loads(_call(_global("r3_rllib.types.samples", "ReplaySample"), *args), "blob")
    # OBJ (protocol 1's instance opcode) calls the class too.
    obj = pickle.PROTO + b"\x02" + pickle.MARK + _global("r3_rllib.types.samples", "Sample") + pickle.OBJ
    with pytest.raises(
        CorruptCheckpointError, match=_CORRUPT + r"a call of Sample, which pickle never writes"
    ):
        safe_loads(obj + pickle.STOP, "blob")
    stored = ReplaySample("q", np.arange(3), np.arange(2), np.zeros(2), 1.0, True, 4)
    fresh = Sample(
        "q", [1, 2], [3], np.array([-0.5], np.float32), np.array([0.25], np.float32), 1.0, True, False, 2
    )
    for protocol in (2, 4, 5):
        got, again = safe_loads(pickle.dumps([stored, fresh], protocol=protocol), "blob")
        assert got.query_id == "q" and got.prompt_ids.dtype == np.int32 and list(got.prompt_ids) == [0, 1, 2]
        assert (again.prompt_ids, again.response_ids, again.policy_version) == ([1, 2], [3], 2)
        assert again.behavior_logprobs.tolist() == [-0.5] and again.entropies.tolist() == [0.25]


def test_build_of_an_enum_member_is_refused():
    """An Enum member is one object for the whole process: a BUILD renamed it for every later reader."""
    from torch.distributed.checkpoint import metadata

    member = next(iter(metadata._MEM_FORMAT_ENCODING))
    name = member.name
    state = pickle.EMPTY_DICT + _str("_name_") + _str("HACKED") + pickle.SETITEM
    ops = pickle.dumps(member, protocol=2)[:-1] + state + pickle.BUILD + pickle.STOP
    with pytest.raises(
        CorruptCheckpointError, match=_CORRUPT + r"BUILD applied to .*, which is no data object"
    ):
        safe_loads(ops, "blob", dcp_metadata_global)
    assert member.name == name


def test_dcp_metadata_admits_the_types_its_modules_define_not_what_they_import():
    """``torch.distributed.checkpoint.filesystem`` imports ``enum.Enum`` (a file could make new Enum classes from
    it) and the planner's types; only what the two modules define is metadata."""
    metadata, filesystem = "torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem"
    assert dcp_metadata_global(metadata, "Metadata") and dcp_metadata_global(filesystem, "_StorageInfo")
    for name in ("Enum", "WriteItemType", "SavePlan", "Metadata"):
        assert not dcp_metadata_global(filesystem, name), name
    with pytest.raises(
        CheckpointFormatError, match="references torch.distributed.checkpoint.filesystem.Enum"
    ):
        safe_loads(_call(_global(filesystem, "Enum"), _str("Evil"), _str("a b")), "blob", dcp_metadata_global)


def test_arrays_of_empty_items_or_a_subarray_dtype_are_refused():
    """Items of 0 bytes take no data, so any shape fit its (empty) data: 2**40 of them loaded, and numpy then
    looped over them. A subarray dtype is no array numpy writes (``zeros(3, ('f4', (2,)))`` is a (3, 2) 'f4'
    array); one loaded anyway converted to 3 of its 6 values. Small arrays of empty items still load."""
    reconstruct = np.zeros(1).__reduce__()[0]

    class _Array:
        def __init__(self, state):
            self.state = state

        def __reduce__(self):
            return reconstruct, (np.ndarray, (0,), b"b"), self.state

    with pytest.raises(CorruptCheckpointError, match=_CORRUPT + r"a numpy array of shape \(1099511627776,\)"):
        safe_loads(pickle.dumps(_Array((1, (2**40,), np.dtype("V0"), False, b"")), protocol=4), "blob")
    subarray = np.dtype(("f4", (2,)))
    with pytest.raises(CorruptCheckpointError, match=_CORRUPT + r"a numpy array of subarray dtype"):
        safe_loads(pickle.dumps(_Array((1, (3,), subarray, False, bytes(24))), protocol=4), "blob")
    for protocol in (2, 4, 5):
        empty = safe_loads(pickle.dumps(np.zeros(3, "V0"), protocol=protocol), "blob")
        assert empty.shape == (3,) and empty.dtype == np.dtype("V0")

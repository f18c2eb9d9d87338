"""Damaged checkpoint files are reported, never crash the reader (safe_pickle.py, checkpoint.py, checkpoint_files.py):
a state file whose length fields claim gigabytes is refused before anything is allocated; byte flips and truncations
of a real state file give a read or CorruptCheckpointError, nothing else, so a trial's newest complete checkpoint is
still found; state fields and manifests of the wrong shape name the file and the field. Pure: no Ray actors."""

from __future__ import annotations

import json
import os
import pickle
import random
import struct
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from r3_rllib.algorithms.r3.checkpoint import (
    FORMAT_KEY,
    R3_STATE_FILE,
    AlgorithmState,
    CheckpointFormatError,
    newest_complete_checkpoint,
    read_algorithm_state,
    verify_algorithm_checkpoint,
    write_algorithm_state,
)
from r3_rllib.algorithms.r3.checkpoint_files import (
    MANIFEST_FILE,
    CorruptCheckpointError,
    build_manifest,
    write_manifest,
)
from r3_rllib.algorithms.r3.rollout_types import Rollout, RunnerState
from r3_rllib.algorithms.r3.safe_pickle import safe_loads
from r3_rllib.types.samples import Group, Sample


def _state(iteration: int = 3) -> AlgorithmState:
    """A state with every kind of content R3 saves: numpy arrays and scalars, runner states, samples in a rollout."""
    sample = Sample("q", [1, 2], [3], np.zeros(2, np.float32), np.ones(2, np.float32), 1.0, True, False, 2)
    return AlgorithmState(
        iteration=iteration,
        policy_version=iteration,
        dataset_epoch=1,
        runner_epochs={1: 1},
        rng=np.random.default_rng(0).bit_generator.state,
        runners={1: RunnerState(env={"pos": 4}, sample_seed=1005).to_dict()},
        replay={"samples": {"x": np.arange(4, dtype=np.int64)}, "stats": {"q": [0.5]}},
        metrics={"m": np.float32(1.5), "n": np.int64(2)},
        r3_settings={"replay": True},
        ready_rollout=Rollout(groups=(Group("q", [sample]),)),
    )


def _checkpoint(path: Path, iteration: int = 3, *, manifest: bool = True) -> Path:
    """A checkpoint directory as R3 writes it: the state file, a learner shard, the manifest over both."""
    (path / "learner_dcp").mkdir(parents=True)
    write_algorithm_state(str(path), _state(iteration))
    (path / "learner_dcp" / "__0_0.distcp").write_bytes(os.urandom(1024))
    if manifest:
        write_manifest(str(path), build_manifest(str(path), {"iteration": iteration}))
    return path


def _refused(fn: Callable[[], object], match: str) -> CorruptCheckpointError:
    """Run ``fn`` under tracemalloc and check that it raises CorruptCheckpointError matching ``match`` within 10 s
    (milliseconds here; reading a declared multi-GB length would take far longer), having allocated under 4 MiB (the
    old reader allocated, or failed to allocate, what the file declared)."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(CorruptCheckpointError, match=match) as err:
            fn()
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 10.0
    assert peak < 4 << 20, f"{peak} bytes allocated reading a damaged file"
    return err.value


# -- length fields that claim more than the file holds -------------------------------------------------------------
_PROTO4 = pickle.PROTO + b"\x04"


@pytest.mark.parametrize("length", [4 << 30, 1 << 63], ids=["4GiB", "2**63"])
def test_state_file_whose_frame_claims_gigabytes_is_corrupt_without_allocating(tmp_path, length):
    """A byte flipped in the FRAME length of a real state file: the old reader asked for the declared length
    (MemoryError, OverflowError, or the OOM killer)."""
    path = write_algorithm_state(str(tmp_path), _state())
    blob = Path(path).read_bytes()
    assert blob[2:3] == pickle.FRAME  # protocol 4 opens with a frame: its 8-byte length follows
    Path(path).write_bytes(blob[:3] + struct.pack("<Q", length) + blob[11:])
    assert os.path.getsize(path) < 4096
    err = _refused(lambda: read_algorithm_state(str(tmp_path)), rf"FRAME declares {length} bytes")
    assert path in str(err)


@pytest.mark.parametrize(
    "stream, match",
    [
        (
            pickle.BINBYTES8 + struct.pack("<Q", 1 << 40) + b"xx" + pickle.STOP,
            "BINBYTES8 declares 1099511627776",
        ),
        (pickle.BYTEARRAY8 + struct.pack("<Q", 1 << 62) + pickle.STOP, "BYTEARRAY8 declares"),
        (pickle.BINUNICODE8 + struct.pack("<Q", 1 << 63) + pickle.STOP, "BINUNICODE8 declares"),
        (pickle.BINBYTES + struct.pack("<I", 0xFFFFFFF0) + pickle.STOP, "BINBYTES declares 4294967280"),
        (pickle.LONG4 + struct.pack("<i", -5) + pickle.STOP, "LONG4 declares -5 bytes"),
        # The memo grows to the index a PUT names, zero-filled: LONG_BINPUT 0xFFFFFFFF asked for 64 GiB.
        (pickle.NONE + pickle.LONG_BINPUT + struct.pack("<I", 0xFFFFFFFF) + pickle.STOP, "names memo entry"),
        (pickle.NONE + pickle.PUT + b"99999999999\n" + pickle.STOP, "PUT names memo entry 99999999999"),
        (pickle.NONE + b"\xff" + pickle.STOP, "byte 0xff where an opcode belongs"),
        (pickle.EMPTY_DICT + pickle.BINUNICODE, "ends before the pickle's STOP"),
    ],
    ids=[
        "bytes8",
        "bytearray8",
        "unicode8",
        "bytes4",
        "long4-negative",
        "memo",
        "memo-text",
        "opcode",
        "cut",
    ],
)
def test_declared_sizes_beyond_the_data_are_refused_before_unpickling(tmp_path, stream, match):
    data = _PROTO4 + stream
    _refused(lambda: safe_loads(data, "blob"), rf"blob: not a readable checkpoint file .*{match}")
    (tmp_path / R3_STATE_FILE).write_bytes(data)
    err = _refused(lambda: read_algorithm_state(str(tmp_path)), match)
    assert str(tmp_path / R3_STATE_FILE) in str(err)


def test_size_check_accepts_what_every_protocol_writes():
    """The opcode walk must not refuse a real pickle: every protocol, text opcodes (PUT, GLOBAL), frames, long
    bytes and strings, big ints, shared references through the memo."""
    shared = [1, 2]
    value = {"b": b"x" * 70_000, "s": "é" * 70_000, "big": 7**900, "f": 1.5, "shared": (shared, shared)}
    value["arr"] = np.arange(10, dtype=np.float32)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        loaded = safe_loads(pickle.dumps(value, protocol=protocol), f"protocol {protocol}")
        assert loaded["big"] == value["big"] and loaded["b"] == value["b"] and loaded["s"] == value["s"]
        assert loaded["shared"][0] is loaded["shared"][1]
        np.testing.assert_array_equal(loaded["arr"], value["arr"])


# -- random damage ---------------------------------------------------------------------------------------------------
def _damaged(blob: bytes, rng: random.Random) -> bytes:
    """``blob`` cut short (1 in 6) or with 1 to 4 bytes set to random values."""
    if rng.random() < 1 / 6:
        return blob[: rng.randrange(len(blob))]
    damaged = bytearray(blob)
    for _ in range(rng.randint(1, 4)):
        damaged[rng.randrange(len(damaged))] = rng.randrange(256)
    return bytes(damaged)


def _only_corrupt_or_read(fn: Callable[[], object]) -> str:
    """The outcome of ``fn`` on a damaged file: "read" or "corrupt". A plain CheckpointFormatError is accepted only
    for what a flipped byte can legitimately turn into: a format version this package does not know (a newer one's:
    it stops the search by design) or a global name outside the allow-list (refused as possibly hostile)."""
    try:
        fn()
    except CorruptCheckpointError:
        return "corrupt"
    except CheckpointFormatError as e:
        assert "is not supported" in str(e) or "refused to load" in str(e), str(e)
        return "format"
    return "read"


@pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnraisableExceptionWarning"
)  # numpy freeing a damaged array
def test_flipped_and_truncated_state_files_read_or_are_corrupt_nothing_else(tmp_path):
    """300 seeded damages of a real state file. The old reader let KeyError, MemoryError and OverflowError out (and
    was OOM-killed without a memory limit). numpy 2.3's ``dtype.__setstate__`` segfaults on some malformed state
    tuples (one flipped byte can make one, e.g. ``(3, '<', None, -1, -1, 0)``): the reader checks numpy's states
    first, and test_safe_pickle_numpy.py sweeps every one-byte change in subprocesses."""
    path = write_algorithm_state(str(tmp_path), _state())
    blob = Path(path).read_bytes()
    rng, outcomes = random.Random(20240611), {"read": 0, "corrupt": 0, "format": 0}
    for _ in range(300):
        Path(path).write_bytes(_damaged(blob, rng))
        outcomes[_only_corrupt_or_read(lambda: read_algorithm_state(str(tmp_path)))] += 1
    assert outcomes["corrupt"] > 200 and outcomes["read"] > 0, outcomes


@pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnraisableExceptionWarning"
)  # numpy freeing a damaged array
def test_newest_complete_checkpoint_skips_a_damaged_unmanifested_state(tmp_path, caplog):
    """A format-1 checkpoint (no manifest: its state file is all there is to check) with a damaged state file is
    refused as corrupt, and the search goes on to the previous complete checkpoint."""
    trial = tmp_path / "trial"
    _checkpoint(trial / "checkpoint_000000", 1)
    newer = _checkpoint(trial / "checkpoint_000001", 2, manifest=False)
    blob = pickle.dumps({**vars(_state(2)), FORMAT_KEY: 1}, protocol=4)
    rng, seen = random.Random(7), set()
    for _ in range(150):
        (newer / R3_STATE_FILE).write_bytes(_damaged(blob, rng))
        outcome = _only_corrupt_or_read(lambda: _checked_choice(trial, newer))
        seen.add(outcome)
    assert "corrupt" in seen and "read" in seen


def _checked_choice(trial: Path, newer: Path) -> None:
    """newest_complete_checkpoint (nothing set aside, so the loop can go on), turned back into the outcome of the
    newer checkpoint: raise its refusal as CorruptCheckpointError, after checking that the older one was taken."""
    choice = newest_complete_checkpoint(str(trial), set_aside=False)
    if choice.path == str(newer):
        return
    assert choice.path == str(trial / "checkpoint_000000") and len(choice.refused) == 1
    raise CorruptCheckpointError(choice.refused[0])


# -- state fields of the wrong shape -------------------------------------------------------------------------------
_GOOD = {
    FORMAT_KEY: 2,
    "iteration": 3,
    "policy_version": 3,
    "dataset_epoch": 0,
    "runner_epochs": {},
    "rng": {},
    "runners": {},
    "replay": None,
    "metrics": {},
}


@pytest.mark.parametrize(
    "state, match",
    [
        ({FORMAT_KEY: 2, "runners": {}}, "field 'iteration' is missing"),
        ({k: v for k, v in _GOOD.items() if k != "metrics"}, "field 'metrics' is missing"),
        ({**_GOOD, "runners": [1, 2]}, "field 'runners' should be of type dict, found list"),
        ({**_GOOD, "runners": None}, "field 'runners' should be of type dict, found NoneType"),
        ({**_GOOD, "runners": {1: [1]}}, r"field 'runners\[1\]' should be a runner state dict"),
        ({**_GOOD, "iteration": "3"}, "field 'iteration' should be of type int, found str"),
        ({**_GOOD, "iteration": True}, "field 'iteration' should be an int >= 0"),
        ({**_GOOD, "dataset_epoch": -1}, "field 'dataset_epoch' should be an int >= 0"),
        ({**_GOOD, "runner_epochs": 5}, "field 'runner_epochs' should be of type dict, found int"),
        ({**_GOOD, "r3_settings": [1]}, "field 'r3_settings' should be of type dict or None"),
        ([1, 2], "expected a state dict, found a list"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_state_with_a_missing_or_mistyped_field_is_corrupt_naming_the_field(tmp_path, state, match):
    (tmp_path / R3_STATE_FILE).write_bytes(pickle.dumps(state, protocol=4))
    with pytest.raises(CorruptCheckpointError, match=match) as err:
        read_algorithm_state(str(tmp_path))
    assert str(tmp_path / R3_STATE_FILE) in str(err.value)


def test_state_fields_of_the_right_shape_still_read(tmp_path):
    """numpy integers count as ints; optional fields of older formats may be absent."""
    state = {**_GOOD, "iteration": np.int64(4)}
    del state["runner_epochs"]
    (tmp_path / R3_STATE_FILE).write_bytes(pickle.dumps(state, protocol=4))
    read = read_algorithm_state(str(tmp_path))
    assert read.iteration == 4 and type(read.iteration) is int and read.runner_epochs == {}


# -- manifests ------------------------------------------------------------------------------------------------------
def _entries(ckpt: Path) -> list[dict]:
    return json.loads((ckpt / MANIFEST_FILE).read_text())["files"]


def _rewrite(ckpt: Path, raw: str | None = None, **fields) -> None:
    """Replace top-level fields of the checkpoint's manifest; ``raw``: write that string value unquoted (a JSON
    number json.dumps would not write, 1e400)."""
    data = json.loads((ckpt / MANIFEST_FILE).read_text())
    text = json.dumps({**data, **fields})
    (ckpt / MANIFEST_FILE).write_text(text.replace(f'"{raw}"', raw) if raw else text)


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda c: _rewrite(c, files=[]), "'files' should be a non-empty list, found \\[\\]"),
        (lambda c: _rewrite(c, files={"r3_state.pkl": 1}), "'files' should be a non-empty list"),
        (
            lambda c: _rewrite(c, files=[{**e, "size": "1e400"} for e in _entries(c)], raw="1e400"),
            "found inf",
        ),
        (lambda c: _rewrite(c, files=[{**e, "size": -1} for e in _entries(c)]), "size should be an int >= 0"),
        (
            lambda c: _rewrite(c, files=[{**e, "size": "9"} for e in _entries(c)]),
            "size should be an int >= 0",
        ),
        (
            lambda c: _rewrite(c, files=[{**e, "size": 2.0} for e in _entries(c)]),
            "size should be an int >= 0",
        ),
        (lambda c: _rewrite(c, files=[{**e, "sha256": "x"} for e in _entries(c)]), "sha256 should be 64 hex"),
        (lambda c: _rewrite(c, files=[["r3_state.pkl", 1, "x"]]), "a file entry should be an object"),
        (lambda c: _rewrite(c, files=[{"path": "r3_state.pkl"}]), "missing field 'size'"),
        (lambda c: _rewrite(c, meta=[1, 2]), "'meta' should be an object"),
        (lambda c: (c / MANIFEST_FILE).write_text("[1]"), "a JSON list, not an object"),
        (lambda c: (c / MANIFEST_FILE).write_text("[" * 100_000 + "]" * 100_000), "recursion"),
        (lambda c: ((c / MANIFEST_FILE).unlink(), (c / MANIFEST_FILE).mkdir()), "not a regular file"),
    ],
    ids=[
        "no-files",
        "files-dict",
        "size-1e400",
        "size-negative",
        "size-str",
        "size-float",
        "sha-short",
        "entry-list",
        "entry-no-size",
        "meta-list",
        "not-object",
        "deep",
        "directory",
    ],
)
def test_malformed_manifest_is_corrupt_naming_it(tmp_path, damage, match):
    ckpt = _checkpoint(tmp_path / "c")
    damage(ckpt)
    with pytest.raises(CorruptCheckpointError, match=match) as err:
        verify_algorithm_checkpoint(str(ckpt))
    assert f"{ckpt / MANIFEST_FILE}: not a readable checkpoint manifest" in str(err.value)


def test_manifest_without_the_state_file_is_refused_and_the_previous_checkpoint_taken(tmp_path):
    """A manifest listing only the learner files vouches for no state: the checkpoint is set aside and the search
    goes on."""
    trial = tmp_path / "trial"
    _checkpoint(trial / "checkpoint_000000", 1)
    newer = _checkpoint(trial / "checkpoint_000001", 2)
    _rewrite(newer, files=[e for e in _entries(newer) if e["path"] != R3_STATE_FILE])
    with pytest.raises(CorruptCheckpointError, match=f"does not list {R3_STATE_FILE}"):
        verify_algorithm_checkpoint(str(newer))
    choice = newest_complete_checkpoint(str(trial))
    assert choice.path == str(trial / "checkpoint_000000")
    assert (trial / "checkpoint_000001.incomplete" / "REFUSED.txt").exists()

"""Checkpoints that cannot lie (checkpoint_files.py, safe_pickle.py, checkpoint.py): the manifest commits a checkpoint
and catches missing, truncated and changed files; state files load without running code; writes are atomic; a
trial's newest complete checkpoint is found and refused ones are set aside; a full disk is reported with the path and
the last good checkpoint. Pure: no Ray actors."""

from __future__ import annotations

import builtins
import errno
import os
import pickle
import sys
import types
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from r3_rllib.algorithms.r3 import checkpoint as checkpoint_module
from r3_rllib.algorithms.r3 import checkpoint_files, checkpoint_tune
from r3_rllib.algorithms.r3.checkpoint import (
    ALGORITHM_STATE_VERSION,
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
    TMP_SUFFIX,
    CheckpointDiskFullError,
    CorruptCheckpointError,
    atomic_open,
    atomic_write_bytes,
    build_manifest,
    is_disk_full,
    read_manifest,
    verify_checkpoint,
    write_manifest,
)
from r3_rllib.algorithms.r3.checkpoint_tune import disk_full_error
from r3_rllib.algorithms.r3.rollout_types import Rollout, RunnerState
from r3_rllib.algorithms.r3.safe_pickle import check_dcp_metadata
from r3_rllib.types.samples import Group, Sample


def _state(**overrides) -> AlgorithmState:
    sample = Sample("q", [1, 2], [3], np.zeros(1, np.float32), np.ones(1, np.float32), 1.0, True, False, 2)
    fields = {
        "iteration": 3,
        "policy_version": 3,
        "dataset_epoch": 1,
        "runner_epochs": {1: 1},
        "rng": np.random.default_rng(0).bit_generator.state,
        "runners": {1: RunnerState(env={"pos": 4}, sample_seed=1005).to_dict()},
        "replay": {"samples": {"x": np.arange(4, dtype=np.int64)}, "stats": {"q": [0.5]}},
        "metrics": {"m": np.float32(1.5), "n": np.int64(2)},
        "ready_rollout": Rollout(groups=(Group("q", [sample]),)),
    }
    return AlgorithmState(**{**fields, **overrides})


def _checkpoint(path, iteration: int = 3, *, manifest: bool = True) -> str:
    """A checkpoint directory like R3's: a state file and a learner folder (fake shards), with its manifest."""
    os.makedirs(path / "learner_dcp", exist_ok=True)
    write_algorithm_state(str(path), _state(iteration=iteration))
    (path / "learner_dcp" / "__0_0.distcp").write_bytes(os.urandom(64 * 1024))
    torch.save({"torch": torch.get_rng_state(), "version": 3}, path / "learner_dcp" / "rank0_extra.pt")
    if manifest:
        write_manifest(str(path), build_manifest(str(path), {"iteration": iteration}))
    return str(path)


# -- manifest and verification -----------------------------------------------------------------------------------
def test_manifest_lists_every_file_with_size_and_sha256_and_verifies(tmp_path):
    ckpt = _checkpoint(tmp_path / "c")
    manifest = read_manifest(ckpt)
    assert [e.path for e in manifest.files] == [
        "learner_dcp/__0_0.distcp",
        "learner_dcp/rank0_extra.pt",
        R3_STATE_FILE,
    ]
    assert manifest.files[0].size == 64 * 1024 and len(manifest.files[0].sha256) == 64
    assert manifest.meta == {"iteration": 3}
    assert verify_algorithm_checkpoint(ckpt) == manifest
    assert read_algorithm_state(ckpt).iteration == 3


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: os.remove(p), "listed in manifest.json but missing"),
        (lambda p: open(p, "r+b").truncate(1000), "1000 bytes, manifest.json says 65536 (truncated?)"),
        (lambda p: _flip(p, 4096, 4096), "content changed since it was saved (sha256"),
    ],
    ids=["missing", "truncated", "flipped"],
)
def test_damaged_file_is_refused_naming_it_and_what_differs(tmp_path, damage, message):
    ckpt = _checkpoint(tmp_path / "c")
    shard = os.path.join(ckpt, "learner_dcp", "__0_0.distcp")
    damage(shard)
    with pytest.raises(CorruptCheckpointError) as err:
        verify_algorithm_checkpoint(ckpt)
    assert shard in str(err.value) and message in str(err.value)


def _flip(path: str, offset: int, length: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(length)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


def test_manifest_that_leaves_the_directory_or_is_garbage_is_refused(tmp_path):
    ckpt = _checkpoint(tmp_path / "c")
    text = (tmp_path / "c" / MANIFEST_FILE).read_text().replace('"r3_state.pkl"', '"../../etc/passwd"')
    (tmp_path / "c" / MANIFEST_FILE).write_text(text)
    with pytest.raises(CorruptCheckpointError, match="not a file inside the checkpoint"):
        verify_checkpoint(ckpt)
    (tmp_path / "c" / MANIFEST_FILE).write_text('{"files": [')
    with pytest.raises(CorruptCheckpointError, match=f"{MANIFEST_FILE}: not a readable checkpoint manifest"):
        verify_checkpoint(ckpt)


def test_format_2_checkpoint_without_manifest_is_an_interrupted_save(tmp_path):
    ckpt = _checkpoint(tmp_path / "c", manifest=False)
    with pytest.raises(
        CorruptCheckpointError, match=r"no manifest.json: the save that wrote it did not finish"
    ):
        verify_algorithm_checkpoint(ckpt)


def test_old_checkpoint_without_manifest_loads_with_a_warning(tmp_path, caplog):
    ckpt = _checkpoint(tmp_path / "c", manifest=False)
    legacy = {**vars(_state()), FORMAT_KEY: 1}
    with open(os.path.join(ckpt, R3_STATE_FILE), "wb") as f:
        pickle.dump(legacy, f)
    assert verify_algorithm_checkpoint(ckpt) is None
    assert "has no manifest.json (format version 1, written by an older r3_rllib)" in caplog.text
    assert read_algorithm_state(ckpt).ready_rollout == _state().ready_rollout


# -- loading without running code --------------------------------------------------------------------------------
class _Exec:
    def __init__(self, call, arg):
        self.call, self.arg = call, arg

    def __reduce__(self):
        return (self.call, (self.arg,))


@pytest.mark.parametrize("call", [os.system, builtins.exec], ids=["os.system", "builtins.exec"])
def test_state_file_that_would_run_code_is_refused_without_running_it(tmp_path, call):
    marker = tmp_path / "pwned"
    payload = f"touch {marker}" if call is os.system else f"open({str(marker)!r}, 'w').close()"
    hostile = {**vars(_state()), FORMAT_KEY: ALGORITHM_STATE_VERSION, "metrics": _Exec(call, payload)}
    (tmp_path / "c").mkdir()
    with open(tmp_path / "c" / R3_STATE_FILE, "wb") as f:
        pickle.dump(hostile, f)
    with pytest.raises(CheckpointFormatError) as err:
        read_algorithm_state(str(tmp_path / "c"))
    name = "posix.system" if call is os.system else "builtins.exec"
    assert str(tmp_path / "c" / R3_STATE_FILE) in str(err.value) and f"references {name}" in str(err.value)
    assert not marker.exists()


def test_state_keeps_its_types_through_the_safe_reader(tmp_path):
    write_algorithm_state(str(tmp_path), _state())
    state = read_algorithm_state(str(tmp_path))
    assert state.metrics["m"] == np.float32(1.5) and state.metrics["m"].dtype == np.float32
    np.testing.assert_array_equal(state.replay["samples"]["x"], np.arange(4))
    assert state.ready_rollout == _state().ready_rollout
    assert state.rng == _state().rng


def test_a_state_naming_the_former_home_of_sample_and_group_loads(tmp_path, monkeypatch):
    """Checkpoints written before Sample and Group moved to the types layer name them
    ``r3_rllib.algorithms.r3.groups.Sample`` / ``.Group``: safe_pickle.MOVED_GLOBALS reads them as today's classes."""
    old_home = types.ModuleType("r3_rllib.algorithms.r3.groups")
    old_home.Sample, old_home.Group = Sample, Group
    monkeypatch.setitem(sys.modules, old_home.__name__, old_home)
    for cls in (Sample, Group):
        monkeypatch.setattr(cls, "__module__", old_home.__name__)
    blob = pickle.dumps({**vars(_state()), FORMAT_KEY: ALGORITHM_STATE_VERSION}, protocol=4)
    monkeypatch.undo()
    assert b"r3_rllib.algorithms.r3.groups" in blob and b"r3_rllib.types.samples" not in blob
    (tmp_path / R3_STATE_FILE).write_bytes(blob)
    state = read_algorithm_state(str(tmp_path))
    assert state.ready_rollout == _state().ready_rollout
    [group] = state.ready_rollout.groups
    assert type(group) is Group and type(group.samples[0]) is Sample


def test_state_with_a_type_the_reader_would_refuse_is_refused_at_save(tmp_path):
    with pytest.raises(
        CheckpointFormatError, match=r"references pathlib.PosixPath.*Add the type to safe_pickle"
    ):
        write_algorithm_state(str(tmp_path), _state(metrics={"where": tmp_path}))
    assert os.listdir(tmp_path) == []


def test_truncated_state_file_names_the_path(tmp_path):
    path = write_algorithm_state(str(tmp_path), _state())
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(CorruptCheckpointError, match=rf"{path}: not a readable checkpoint file \(truncated"):
        read_algorithm_state(str(tmp_path))


def test_dcp_metadata_is_checked_before_dcp_unpickles_it(tmp_path):
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.ones(3)}, checkpoint_id=str(tmp_path / "ok"))
    check_dcp_metadata(str(tmp_path / "ok"))  # DCP's own metadata types pass
    (tmp_path / "bad").mkdir()
    with open(tmp_path / "bad" / ".metadata", "wb") as f:
        pickle.dump(_Exec(os.system, f"touch {tmp_path / 'pwned'}"), f)
    with pytest.raises(CheckpointFormatError, match="references posix.system"):
        check_dcp_metadata(str(tmp_path / "bad"))
    assert not (tmp_path / "pwned").exists()


def test_learner_extra_file_loads_with_weights_only(tmp_path):
    # What save_dcp writes (and what older versions wrote): a ByteTensor and an int.
    torch.save({"torch": torch.get_rng_state(), "version": 7}, tmp_path / "rank0_extra.pt")
    extra = torch.load(tmp_path / "rank0_extra.pt", weights_only=True)
    assert extra["version"] == 7 and torch.equal(extra["torch"], torch.get_rng_state())


# -- atomic writes and a full disk -------------------------------------------------------------------------------
def test_atomic_write_leaves_old_content_when_the_write_fails(tmp_path):
    path = str(tmp_path / "f")
    atomic_write_bytes(path, b"old")
    with pytest.raises(OSError) as err, atomic_open(path) as f:
        f.write(b"new, half")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert is_disk_full(err.value)
    assert open(path, "rb").read() == b"old" and not os.path.exists(path + TMP_SUFFIX)


def test_disk_full_midway_leaves_no_checkpoint_that_looks_complete(tmp_path, monkeypatch):
    trial = tmp_path / "trial"
    _checkpoint(trial / "checkpoint_000000", iteration=5)
    new = trial / "checkpoint_000001"
    real_open = checkpoint_module.atomic_open

    @contextmanager
    def filling_up(path):  # the state file's writer: half of it written, then the disk is full
        with real_open(path) as f:

            class HalfThenFull:
                def write(self, data):
                    f.write(data[: len(data) // 2])
                    raise OSError(errno.ENOSPC, "No space left on device", path)

            yield HalfThenFull()

    monkeypatch.setattr(checkpoint_module, "atomic_open", filling_up)
    with pytest.raises(OSError) as err:
        _checkpoint(new, iteration=10)
    monkeypatch.undo()
    assert not (new / MANIFEST_FILE).exists() and not (new / R3_STATE_FILE).exists()
    error = disk_full_error(err.value, str(new), str(trial))
    assert isinstance(error, CheckpointDiskFullError) and error.errno == errno.ENOSPC
    message = str(error)
    assert f"disk full while writing checkpoint {new}" in message and str(new / R3_STATE_FILE) in message
    assert f"{trial / 'checkpoint_000000'} (iteration 5), is still usable" in message
    assert "r3 train --resume" in message
    # A resume takes the complete one and sets the interrupted one aside.
    choice = newest_complete_checkpoint(str(trial))
    assert choice.path == str(trial / "checkpoint_000000") and choice.max_index == 1
    assert os.path.isdir(str(new) + ".incomplete") and not new.exists()


def test_disk_full_is_recognised_from_errno_message_or_free_space(tmp_path, monkeypatch):
    assert is_disk_full(OSError("Error writing bytes to file. Detail: [errno 28] No space left on device"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    # torch's zip writer inside DCP reports a full disk as this (measured on a full tmpfs): the free space tells.
    lost = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    monkeypatch.setattr(checkpoint_files, "free_bytes", lambda path: 4096)
    assert is_disk_full(lost, str(tmp_path / "checkpoint_000001"))
    monkeypatch.setattr(checkpoint_files, "free_bytes", lambda path: 10 << 30)
    assert not is_disk_full(lost, str(tmp_path / "checkpoint_000001"))


# -- a trial's newest complete checkpoint --------------------------------------------------------------------------
def test_newest_complete_checkpoint_skips_and_sets_aside_corrupt_newer_ones(tmp_path):
    trial = tmp_path / "trial"
    for i, iteration in enumerate((5, 10, 15)):
        _checkpoint(trial / f"checkpoint_{i:06d}", iteration=iteration)
    _flip(str(trial / "checkpoint_000002" / "learner_dcp" / "__0_0.distcp"), 0, 4096)
    choice = newest_complete_checkpoint(str(trial))
    assert choice.path == str(trial / "checkpoint_000001") and choice.manifest.meta["iteration"] == 10
    assert len(choice.refused) == 1 and "__0_0.distcp: content changed" in choice.refused[0]
    moved = trial / "checkpoint_000002.incomplete"
    assert moved.is_dir() and "content changed" in (moved / "REFUSED.txt").read_text()
    # Nothing is deleted, and a second look finds the same.
    assert newest_complete_checkpoint(str(trial)).path == choice.path


def test_checkpoint_of_a_newer_format_stops_the_search(tmp_path):
    trial = tmp_path / "trial"
    _checkpoint(trial / "checkpoint_000000")
    _checkpoint(trial / "checkpoint_000001", manifest=False)
    with open(trial / "checkpoint_000001" / R3_STATE_FILE, "wb") as f:
        pickle.dump({FORMAT_KEY: 99}, f)
    with pytest.raises(CheckpointFormatError, match="version 99 is not supported"):
        newest_complete_checkpoint(str(trial))
    assert (trial / "checkpoint_000001").is_dir()


@pytest.mark.parametrize("with_manifest", [True, False], ids=["manifest", "legacy"])
def test_a_pickle_tune_would_load_before_us_is_refused(tmp_path, with_manifest):
    """Tune's Trainable.restore unpickles `_dict_checkpoint.pkl` from a checkpoint before load_checkpoint runs: a
    hostile one would run code even though every file the manifest lists is intact."""
    ckpt = _checkpoint(tmp_path / "c")
    if not with_manifest:
        os.remove(os.path.join(ckpt, "manifest.json"))
    with open(os.path.join(ckpt, "_dict_checkpoint.pkl"), "wb") as f:
        pickle.dump({"iteration": 1}, f)
    with pytest.raises(CorruptCheckpointError, match="Tune's restore would unpickle it"):
        checkpoint_files.verify_checkpoint(ckpt)


def test_a_trial_with_a_checkpoint_of_its_own_restores_itself(tmp_path):
    """A restarted or resumed Tune trial (a complete checkpoint in its folder) is restored by Tune from that, so
    resume_from_checkpoint is not restored before it; a new trial, an incomplete checkpoint only, or no Tune at all
    restores resume_from_checkpoint."""

    class Storage:
        trial_fs_path = str(tmp_path / "trial")

    os.makedirs(Storage.trial_fs_path)
    assert not checkpoint_tune.trial_restores_itself(None)
    assert not checkpoint_tune.trial_restores_itself(Storage())
    _checkpoint(tmp_path / "trial" / "checkpoint_000000", manifest=False)  # cut short: no manifest
    assert not checkpoint_tune.trial_restores_itself(Storage())
    assert os.path.isdir(tmp_path / "trial" / "checkpoint_000000")  # a look only: nothing set aside
    _checkpoint(tmp_path / "trial" / "checkpoint_000001")
    assert checkpoint_tune.trial_restores_itself(Storage())

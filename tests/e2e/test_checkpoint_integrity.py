"""Checkpoints that cannot lie, on a real R3: flipped bytes in a learner shard are refused naming the file (before
anything changes); a full disk (a real small tmpfs, when this process may mount one) stops the save with a message
that names the path and the last complete checkpoint; a Tune resume takes the trial's newest complete checkpoint,
also one Tune's experiment state does not know (a driver killed between a checkpoint and the next state sync), and
sets a corrupt newer one aside."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest
import ray

from r3_rllib.algorithms.r3 import R3
from r3_rllib.algorithms.r3.checkpoint_files import (
    MANIFEST_FILE,
    CheckpointDiskFullError,
    CorruptCheckpointError,
    read_manifest,
)

pytestmark = pytest.mark.slow
HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
from resume_child import make_config  # noqa: E402

SHARD = os.path.join("learner_dcp", "__0_0.distcp")


def _flip(path: str, offset: int = 4096, length: int = 4096) -> None:
    """Invert ``length`` bytes of the file at ``offset`` (a disk's bit rot, a bad copy)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(length)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


@pytest.fixture(scope="module")
def algo(ray_session, tiny_random_model):
    algo = make_config(tiny_random_model).build_algo()
    algo.train()
    yield algo
    algo.stop()


def test_flipped_bytes_in_a_learner_shard_are_refused_naming_the_file(algo, tmp_path):
    path = algo.save(str(tmp_path / "ckpt")).checkpoint.path
    manifest = read_manifest(path)
    assert {e.path for e in manifest.files} >= {SHARD, "r3_state.pkl", "learner_dcp/rank0_extra.pt"}
    assert manifest.meta["iteration"] == 1
    before = algo.learner_call(lambda lr: lr.parameter_checksum())[0]
    _flip(os.path.join(path, SHARD))
    with pytest.raises(CorruptCheckpointError) as err:
        algo.restore(path)
    assert f"{os.path.join(path, SHARD)}: content changed since it was saved" in str(err.value)
    assert (
        algo.learner_call(lambda lr: lr.parameter_checksum())[0] == before
    )  # refused before anything changed
    assert algo.iteration == 1  # Tune's counters too


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs (one tiny-model checkpoint is ~10 MiB), or a skip where this process may not mount one."""
    mount = tmp_path / "small_disk"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_full_disk_stops_the_save_naming_the_path_and_the_last_good_checkpoint(algo, small_disk):
    good = algo.save(str(small_disk / "checkpoint_000000")).checkpoint.path
    with pytest.raises(CheckpointDiskFullError) as err:
        algo.save(str(small_disk / "checkpoint_000001"))
    message = str(err.value)
    assert f"disk full while writing checkpoint {small_disk / 'checkpoint_000001'}" in message
    assert f"the last complete checkpoint, {good} (iteration 1), is still usable" in message
    assert not (small_disk / "checkpoint_000001" / MANIFEST_FILE).exists()
    # The good one still restores.
    algo.restore(good)
    assert algo.iteration == 1


class R3CrashOnce(R3):
    """In its 4th iteration: saves a checkpoint Tune is not told about, then fails (once per trial). Tune's state
    then names the checkpoint before it, as after a driver killed between a checkpoint and Tune's next state sync."""

    def training_step(self):
        marker = os.path.join(self._storage.trial_fs_path, "crashed_once")
        if self.iteration == 3 and not os.path.exists(marker):
            open(marker, "w").close()
            self.save()
            raise RuntimeError("injected crash after a checkpoint Tune does not know")
        return super().training_step()


def test_tune_resume_takes_the_newest_complete_checkpoint(ray_session, tiny_random_model, tmp_path):
    from ray import tune

    ray.cloudpickle.register_pickle_by_value(
        sys.modules[__name__]
    )  # the trial's process cannot import tests/
    name = f"R3CrashOnce_{uuid.uuid4().hex[:6]}"
    tune.register_trainable(name, R3CrashOnce)
    config = (
        make_config(tiny_random_model)
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
        .resources(num_cpus_for_main_process=0.5)
    )
    run_config = tune.RunConfig(
        name="resume",
        storage_path=str(tmp_path),
        stop={"training_iteration": 5},
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2, checkpoint_at_end=False),
        verbose=0,
    )
    first = tune.Tuner(name, param_space=config, run_config=run_config).fit()
    assert first.errors and "injected crash" in str(first.errors[0])
    trial = first[0].path
    # Tune knows checkpoint_000000 (iteration 2); checkpoint_000001 (iteration 3) is complete on disk. A newer,
    # corrupt one must be refused and set aside.
    assert read_manifest(os.path.join(trial, "checkpoint_000001")).meta["iteration"] == 3
    shutil.copytree(os.path.join(trial, "checkpoint_000001"), os.path.join(trial, "checkpoint_000002"))
    _flip(os.path.join(trial, "checkpoint_000002", SHARD))

    exp_dir = os.path.join(str(tmp_path), "resume")
    second = tune.Tuner.restore(exp_dir, trainable=name, resume_errored=True, param_space=config).fit()
    assert not second.errors, second.errors
    rows = [json.loads(line) for line in open(os.path.join(trial, "result.json"))]
    resumed = next(r for r in rows if r["iterations_since_restore"] == 1 and r["training_iteration"] > 3)
    assert rows[-1]["training_iteration"] == 5
    assert resumed["training_iteration"] == 4  # from iteration 3, not from Tune's iteration-2 checkpoint
    refused = os.path.join(trial, "checkpoint_000002.incomplete")
    assert "__0_0.distcp: content changed" in open(os.path.join(refused, "REFUSED.txt")).read()
    # The next checkpoint went past every existing directory, and is complete.
    assert read_manifest(os.path.join(trial, "checkpoint_000003")).meta["iteration"] == 4
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])

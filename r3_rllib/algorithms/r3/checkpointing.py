"""`R3`'s checkpoints: what a save writes, what a restore reads, and the algorithm rebuilt from a checkpoint alone.

A base class of `R3` (r3.py), placed before RLlib's ``Algorithm``. RLlib's checkpoint paths all lead to one format:
``Trainable.save``/``restore`` (Tune, ``algo.save(path)``), RLlib's ``save_to_path``/``restore_from_path`` and
``from_checkpoint``: the learners' DCP shards, the versioned driver state (checkpoint.py), the saved config
(checkpoint_config.py) and the manifest that commits them (checkpoint_files.py, checkpoint_tune.py). None of it is
read with pickle's code-running loader.
"""

from __future__ import annotations

import glob
import logging
import os
from typing import Any

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.utils.annotations import override

from r3_rllib.algorithms.r3 import checkpoint_config, checkpoint_tune
from r3_rllib.algorithms.r3.checkpoint import (
    LEARNER_DIR,
    AlgorithmState,
    read_algorithm_state,
    write_algorithm_state,
)
from r3_rllib.algorithms.r3.learner_calls import all_results, collective_results

logger = logging.getLogger(__name__)


class R3Checkpoints(Algorithm):
    """Save, restore and rebuild an R3 algorithm (see the module docstring)."""

    @classmethod
    @override(Algorithm)
    def from_checkpoint(
        cls, path, filesystem=None, *, config_overrides=None, trust_object_paths=False
    ) -> Any:
        """The algorithm saved at `path` (a checkpoint, a Tune trial's folder or an experiment's with one trial),
        built from the config saved in it (read as data; code it names is refused unless `trust_object_paths`), with
        `config_overrides` ({setting: value}) over it, and restored (checkpoint_config.py). Local folders only."""
        if filesystem is not None:
            raise ValueError("R3.from_checkpoint reads a local folder: copy the checkpoint here first")
        return checkpoint_config.algorithm_from_checkpoint(
            cls, path, config_overrides, trust_object_paths=trust_object_paths
        )

    @override(Algorithm)
    def save(self, checkpoint_dir: str | None = None, *args, **kwargs):
        """Trainable.save (save_checkpoint, then Tune's copy into the trial), then the manifest that commits the
        saved checkpoint: only a complete checkpoint has one. A full disk stops with CheckpointDiskFullError."""
        self._saved_manifest = None
        try:
            result = super().save(checkpoint_dir, *args, **kwargs)
            checkpoint_tune.commit_checkpoint(result.checkpoint, self._saved_manifest)
            return result
        except BaseException as err:  # DCP's CheckpointException is a BaseException
            checkpoint_tune.raise_if_disk_full(err, self, checkpoint_dir)
            raise

    @override(Algorithm)
    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Learner shards via DCP (every rank writes its part) + driver, runner and replay state in a versioned
        state file (checkpoint.py); then the manifest of these files, which save() writes once they are in place."""
        self._checkpoint_target = checkpoint_dir
        path = os.path.abspath(os.path.join(checkpoint_dir, LEARNER_DIR))
        # Every rank writes its shard in DCP's collectives: one rank's error stops the save at once, not after the
        # others' wait for it in a collective (learner_calls.collective_results).
        all_results(collective_results(self.learner_group, lambda learner, _p=path: learner.save_dcp(_p)))
        # The rollout in flight: its queries are already consumed from the runners' env order, keep its samples.
        self.coordinator.drain()
        replay = self._replay.client.get_state() if self._replay_available else None
        state = AlgorithmState(
            iteration=self.iteration,
            policy_version=self.weights.version,
            dataset_epoch=self.coordinator.epoch.value,
            runner_epochs=dict(self.coordinator.epoch.runner_epochs),
            rng=self._rng.bit_generator.state,
            runners={wid: s.to_dict() for wid, s in self.coordinator.current_runner_states().items()},
            replay=replay,
            metrics=self.metrics.get_state(),
            r3_settings=self.config.r3_settings(),
            ready_rollout=self.coordinator.ready,
            stream_queue=self.coordinator.saved_queue,
            reward_kl_coef=self._reward_kl.coef if self._reward_kl is not None else None,
        )
        write_algorithm_state(checkpoint_dir, state)
        checkpoint_config.write_checkpoint_config(checkpoint_dir, self.config)  # R3.from_checkpoint reads it
        if replay is not None:
            self._replay.remember(replay)
        self._saved_manifest = checkpoint_tune.build_algorithm_manifest(self, checkpoint_dir)

    @override(Algorithm)
    def restore(self, checkpoint_path, *args, **kwargs):
        """Trainable.restore; inside a Tune trial, from the trial's newest complete checkpoint (Tune's record of the
        latest one lags the disk after a crash, or may name a corrupt one: checkpoint_tune.resume_target)."""
        checkpoint_path, self._verified = checkpoint_tune.resume_target(
            checkpoint_path, getattr(self, "_storage", None)
        )
        return super().restore(checkpoint_path, *args, **kwargs)

    @override(Algorithm)
    def load_checkpoint(self, checkpoint_dir: str) -> None:
        # Every file checked against the manifest, then the state read (refusing an unknown format version and
        # anything but data), all before anything is changed.
        checkpoint_tune.verify_unless_verified(checkpoint_dir, getattr(self, "_verified", None))
        self._verified = None
        state = read_algorithm_state(checkpoint_dir)
        path = os.path.abspath(os.path.join(checkpoint_dir, LEARNER_DIR))
        # Another model's or LoRA setup's weights: refused by name, with the settings behind them, not by DCP's
        # error on its first differing tensor from inside a learner.
        per_learner = all_results(
            collective_results(self.learner_group, lambda learner, _p=path: learner.dcp_model_mismatch(_p))
        )
        mismatch = next((m for m in per_learner if m is not None), None)
        if mismatch is not None:
            raise checkpoint_config.ModelMismatchError(
                checkpoint_config.model_mismatch_message(checkpoint_dir, mismatch, self.config)
            )
        saved_ranks, learners = len(glob.glob(os.path.join(path, "rank*_extra.pt"))), len(per_learner)
        if saved_ranks != learners:
            logger.warning(
                "%s was saved by %d learner(s) and is restored into %d: the weights and the optimizer state are "
                "resharded (DCP), every learner without a saved RNG state of its own takes rank 0's, so the run "
                "goes on from the same state but not with the same random numbers as an unchanged one",
                checkpoint_dir,
                saved_ranks,
                learners,
            )
        all_results(collective_results(self.learner_group, lambda learner, _p=path: learner.load_dcp(_p)))
        self.weights.version = state.policy_version
        self._rng.bit_generator.state = state.rng
        self._iteration = state.iteration
        self.coordinator.restore(state)
        if self._replay is not None and state.replay is not None:
            self._replay.client.set_state(state.replay)
            self._replay.remember(state.replay)
        self.metrics.set_state(state.metrics)
        # use_kl_in_reward: the KL controller goes on with the beta it had.
        if self._reward_kl is not None and state.reward_kl_coef is not None:
            self._reward_kl.coef = float(state.reward_kl_coef)
        self.weights.sync()

    @override(Algorithm)
    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack=False) -> str:
        """RLlib's Checkpointable save, as :meth:`save` (the whole algorithm, our format); the folder's path."""
        if state is not None or filesystem is not None or use_msgpack:
            raise ValueError(
                "R3.save_to_path saves the whole algorithm to a local folder: pass only the path"
            )
        return self.save(None if path is None else str(path)).checkpoint.path

    @override(Algorithm)
    def restore_from_path(self, path, *, component=None, filesystem=None, **kwargs) -> None:
        """RLlib's Checkpointable restore, as :meth:`restore` (verified first; no pickle code runs)."""
        if component is not None or filesystem is not None or kwargs:
            raise ValueError(
                "R3.restore_from_path restores a whole R3 checkpoint from a local folder: pass the path"
            )
        self.restore(os.fspath(path))

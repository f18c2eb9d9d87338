"""Tune's W&B and MLflow logger callbacks as the run file's trackers use them (trackers.py builds them).

- :class:`R3WandbLoggerCallback`: Tune's WandbLoggerCallback that needs no API key offline (``mode: offline`` in the
  run file, or WANDB_MODE), and logs a table of sample records (``samples``) with each iteration that has some.
- :class:`R3MLflowLoggerCallback`: Tune's MLflowLoggerCallback with the config and each iteration's metrics logged
  in batches (two requests instead of one per key: a remote server sees ~500 keys per result), parameter values
  cut to MLflow's limit instead of failing the run, step = training_iteration, and the sample table as a JSON
  artifact (``samples/iteration_000001.json``). A file store (``file://``) is allowed (MLflow refuses it unless
  MLFLOW_ALLOW_FILE_STORE is set).

Importing this module imports Ray Tune's integrations; wandb and mlflow are imported when a callback is built.
"""

from __future__ import annotations

import numbers
import os
import re
import warnings
from typing import Any

import ray
from ray.air.integrations.mlflow import MLflowLoggerCallback
from ray.air.integrations.wandb import WandbLoggerCallback, _clean_log, _QueueItem, _WandbLoggingActor
from ray.air.util.node import _force_on_current_node
from ray.tune.utils import flatten_dict

from r3_rllib.algorithms.r3.trackers import SAMPLE_TABLE_ROWS, sample_rows

#: The key that carries the sample rows from the callback to its W&B actor (never a logged metric).
SAMPLES_KEY = "__r3_samples__"
#: MLflow's limits: a parameter value's length, keys per log_batch request.
MLFLOW_PARAM_LENGTH = 6000
MLFLOW_BATCH = 100
_MLFLOW_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")


class _R3WandbLoggingActor(_WandbLoggingActor):
    """Tune's W&B actor, which also turns the sample rows of a result into a ``wandb.Table``, and returns only once
    W&B has written everything."""

    def run(self):
        try:
            super().run()
        finally:
            # wandb.finish() returns before W&B's service process has written the run's last records (its log says
            # "finishing up" after finish returned), and Tune kills this actor, and the service with it, as soon as
            # run() returns: an offline run lost its last iteration and its exit record. teardown() waits.
            self._wandb.teardown()

    def _handle_result(self, result: dict) -> tuple[dict, dict]:
        rows = result.pop(SAMPLES_KEY, None)
        log, config_update = super()._handle_result(result)
        if rows:
            columns = list(rows[0])
            log["samples"] = self._wandb.Table(
                columns=columns, data=[[row.get(c) for c in columns] for row in rows]
            )
        return log, config_update


class R3WandbLoggerCallback(WandbLoggerCallback):
    _logger_actor_cls = _R3WandbLoggingActor

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._unsent: dict = {}  # trial -> the items not sent to its queue yet (_send)
        self._in_flight: dict = {}  # trial -> the ObjectRef of its send in flight

    def setup(self, *args, **kwargs):
        mode = self.kwargs.get("mode") or os.environ.get("WANDB_MODE")
        if mode in ("offline", "disabled"):
            # Offline: no API key needed (Tune's setup only skips the check for WANDB_MODE).
            self.api_key_file = os.path.expanduser(self.api_key_path) if self.api_key_path else None
            return
        super().setup(*args, **kwargs)

    def _start_logging_actor(self, trial, exclude_results, **wandb_init_kwargs):
        if not self._remote_logger_class:
            # As Tune's, but: the driver's WANDB_* settings reach the actor also on a cluster that another shell
            # started (its workers inherit that shell's environment); no restarts (a logger that died is not worth
            # one, and a restartable actor whose arguments sit in the object store, as the trial's config does,
            # makes Ray print an error line at every start).
            env_vars = {k: v for k, v in os.environ.items() if k.startswith("WANDB_")}
            self._remote_logger_class = ray.remote(
                num_cpus=0, **_force_on_current_node(), runtime_env={"env_vars": env_vars}, max_restarts=0
            )(self._logger_actor_cls)
        if "dir" not in self.kwargs and not os.environ.get("WANDB_DIR") and _local(trial):
            # The trial's own folder (runs/<name>/<trial>/wandb), not Tune's staging folder in Ray's session
            # directory, where Tune would start the actor and nothing copies the W&B files back.
            wandb_init_kwargs["dir"] = trial.path
        super()._start_logging_actor(trial, exclude_results, **wandb_init_kwargs)

    def log_trial_result(self, iteration: int, trial, result: dict):
        """As Tune's, with the sample rows, and without waiting for the queue (see :meth:`_send`)."""
        if trial not in self._trial_logging_actors:
            self.log_trial_start(trial)
        rows = _trial_samples(trial, result.get("training_iteration"))
        result = _clean_log(result, video_kwargs=self.video_kwargs, image_kwargs=self.image_kwargs)
        self._send(trial, (_QueueItem.RESULT, {**result, SAMPLES_KEY: rows} if rows else result))

    def _signal_logging_actor_stop(self, trial):
        # A trial that failed before its logging actor started (its EnvRunners could not start, say) has no queue:
        # nothing to stop, and a KeyError here would hide the trial's own error behind Tune's.
        if trial not in self._trial_queues:
            return
        self._send(trial, (_QueueItem.END, None), wait=True)

    def _send(self, trial, item, *, wait: bool = False) -> None:
        """Queue ``item`` for the trial's W&B actor after the items not sent yet, in order. Tune's blocking put
        waits for the queue actor to start at a trial's first result (16.8 s measured on 2 busy cores: Tune's loop
        and the progress line stalled, and Tune printed its "operation took" warnings); here, while the previous
        send is in flight, items wait in this process for the next call (``wait``: send them all now). One send
        at a time: the queue is an async actor, whose calls may run out of order (W&B then drops the earlier
        step)."""
        unsent, in_flight = self._unsent.setdefault(trial, []), self._in_flight
        unsent.append(item)
        last = in_flight.get(trial)
        if last is not None:
            if wait:
                ray.get(last)
            elif not ray.wait([last], timeout=0)[0]:
                return
        batch, unsent[:] = list(unsent), []
        in_flight[trial] = self._trial_queues[trial].actor.put_nowait_batch.remote(batch)
        if wait:
            ray.get(in_flight[trial])


class R3MLflowLoggerCallback(MLflowLoggerCallback):
    def setup(self, *args, **kwargs):
        if str(self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")).startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        super().setup(*args, **kwargs)

    def _client(self):
        return self.mlflow_util._get_client()

    def log_trial_start(self, trial):
        if trial not in self._trial_runs:
            tags = {**self.tags, "trial_name": str(trial)}
            run = self.mlflow_util.start_run(tags=tags, run_name=str(trial))
            self._trial_runs[trial] = run.info.run_id
        if not self.log_params_on_trial_end:
            self._log_params(self._trial_runs[trial], trial.config)

    def log_trial_end(self, trial, failed: bool = False):
        # A trial that failed before it started (its EnvRunners could not start, say) has no MLflow run: nothing
        # to end, and a KeyError here would hide the trial's own error behind Tune's.
        run_id = self._trial_runs.get(trial)
        if run_id is None:
            return
        if self.should_save_artifact:
            self.mlflow_util.save_artifacts(run_id=run_id, dir=trial.local_path)
        if self.log_params_on_trial_end:
            self._log_params(run_id, trial.config)
        self.mlflow_util.end_run(run_id=run_id, status="FAILED" if failed else "FINISHED")

    def _log_params(self, run_id: str, config: dict) -> None:
        from mlflow.entities import Param

        params = [
            Param(_mlflow_key(k), str(v)[:MLFLOW_PARAM_LENGTH])
            for k, v in flatten_dict(dict(config)).items()
            if k != "callbacks"
        ]
        for start in range(0, len(params), MLFLOW_BATCH):
            self._client().log_batch(run_id, params=params[start : start + MLFLOW_BATCH])

    def log_trial_result(self, iteration: int, trial, result: dict):
        import time

        from mlflow.entities import Metric

        if trial not in self._trial_runs:  # as W&B's: a result before Tune's trial start (a restored trial)
            self.log_trial_start(trial)
        run_id = self._trial_runs[trial]
        step = int(result.get("training_iteration") or iteration)
        now = int(time.time() * 1000)
        metrics = [
            Metric(_mlflow_key(k), value, now, step)
            for k, v in flatten_dict(result).items()
            if k != "config" and not k.startswith("config/") and (value := _number(v)) is not None
        ]
        for start in range(0, len(metrics), MLFLOW_BATCH * 10):
            self._client().log_batch(run_id, metrics=metrics[start : start + MLFLOW_BATCH * 10])
        rows = _trial_samples(trial, step)
        if rows:
            columns = {c: [row.get(c) for row in rows] for c in rows[0]}
            with warnings.catch_warnings():  # pandas 3 on MLflow's own check of the table's column types
                warnings.filterwarnings("ignore", "For backward compatibility, 'str' dtypes")
                self._client().log_table(
                    run_id, data=columns, artifact_file=f"samples/iteration_{step:06d}.json"
                )


def _trial_samples(trial, iteration: int | None) -> list[dict[str, Any]]:
    """The sample rows of ``iteration`` that ``trial`` wrote in its folder on Tune's storage."""
    return sample_rows(trial.path, iteration, SAMPLE_TABLE_ROWS, filesystem=trial.storage.storage_filesystem)


def _local(trial) -> bool:
    """Whether the trial's folder on Tune's storage is a local folder."""
    from pyarrow.fs import LocalFileSystem

    return isinstance(trial.storage.storage_filesystem, LocalFileSystem)


def _mlflow_key(key: str) -> str:
    """``key`` with the characters MLflow refuses in a name replaced by ``_``."""
    return _MLFLOW_BAD_KEY_CHARS.sub("_", key)


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a number (numpy's included, a bool not), else None."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return None

"""Trackers from a run file (trackers.py, tracker_callbacks.py): ``run.loggers`` and its options checked before Ray
starts, Tune's callbacks built from them, and the MLflow callback driven as Tune drives it against a local file
store (no Ray, no network)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from r3_rllib.algorithms.r3.trackers import KNOWN_LOGGERS, sample_rows, tracker_callbacks, tracker_errors
from r3_rllib.train_config import ConfigError, load_run_file

RUN_FILE = """\
environment: {env: arithmetic, env_config: {digits: 2}}
training: {group_size: 4}
run:
  name: tiny
"""


def _run_file(tmp_path: Path, run_lines: str = "") -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(RUN_FILE + "".join(f"  {line}\n" for line in run_lines.splitlines()))
    return path


@pytest.fixture
def tune_loggers_env(monkeypatch):
    """tracker_callbacks switches Tune's automatic loggers off in the process: undone after the test."""
    monkeypatch.delenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_an_unknown_logger_is_refused_naming_the_known_ones(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_run_file(_run_file(tmp_path, "loggers: [tensorboard, comet]"))
    assert "unknown logger 'comet'" in str(e.value)
    assert all(name in str(e.value) for name in KNOWN_LOGGERS)


def test_loggers_must_be_a_list(tmp_path):
    with pytest.raises(ConfigError, match="run.loggers must be a list"):
        load_run_file(_run_file(tmp_path, "loggers: wandb"))


@pytest.mark.parametrize(
    "lines, message",
    [
        ("wandb: {project: p}", "run.wandb is set, but run.loggers does not name 'wandb'"),
        ("loggers: [wandb]\nwandb: {api_key: abc}", "run.wandb.api_key: a secret does not belong"),
        ("loggers: [mlflow]\nmlflow: {tracking_token: abc}", "MLFLOW_TRACKING_TOKEN"),
        ("loggers: [mlflow]\nmlflow: {trackin_uri: x}", "did you mean 'tracking_uri'"),
        ("loggers: [wandb]\nwandb: {mode: sometimes}", "run.wandb.mode must be one of"),
    ],
)
def test_tracker_options_are_checked(tmp_path, lines, message):
    with pytest.raises(ConfigError, match=message):
        load_run_file(_run_file(tmp_path, lines))


def test_a_tracker_whose_package_is_missing_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
    assert tracker_errors({"loggers": ["wandb"]}) == [
        "run.loggers names 'wandb', but wandb is not installed: pip install 'r3-rllib[trackers]'"
    ]


@pytest.mark.slow
def test_loggers_and_options_reach_the_run_settings(tmp_path):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    spec = load_run_file(
        _run_file(tmp_path, "loggers: [csv, wandb]\nwandb: {project: p, mode: offline}"),
        ["run.loggers=[csv, wandb, mlflow]", "run.mlflow={experiment_name: e}"],
    )
    assert spec.run["loggers"] == ["csv", "wandb", "mlflow"]
    assert spec.run["wandb"] == {"project": "p", "mode": "offline"}
    assert spec.run["mlflow"] == {"experiment_name": "e"}


def test_without_loggers_tune_keeps_its_defaults(tune_loggers_env):
    assert tracker_callbacks({}, experiment="x", exp_dir="/tmp/x") is None
    assert "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS" not in os.environ


def test_named_loggers_only_and_json_always(tune_loggers_env, tmp_path):
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    callbacks = tracker_callbacks({"loggers": ["csv"]}, experiment="x", exp_dir=str(tmp_path))
    assert [type(c) for c in callbacks] == [CSVLoggerCallback, JsonLoggerCallback]
    assert os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] == "1"


def test_tracker_defaults_stay_on_this_machine(tune_loggers_env, tmp_path):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from r3_rllib.algorithms.r3.tracker_callbacks import R3MLflowLoggerCallback, R3WandbLoggerCallback

    run = {"loggers": ["wandb", "mlflow"], "wandb": {"mode": "offline"}}
    _json, wandb_cb, mlflow_cb = tracker_callbacks(run, experiment="tiny", exp_dir=str(tmp_path / "tiny"))
    assert isinstance(wandb_cb, R3WandbLoggerCallback) and wandb_cb.project == "tiny"
    wandb_cb.setup()  # offline: no API key asked for
    assert isinstance(mlflow_cb, R3MLflowLoggerCallback)
    assert mlflow_cb.experiment_name == "tiny"
    assert mlflow_cb.tracking_uri == "file://" + str(tmp_path / "tiny" / "mlruns")


class _Trial(SimpleNamespace):
    def __str__(self) -> str:
        return self.name

    def __hash__(self) -> int:
        return hash(self.name)


def _records(tmp_path: Path, iteration: int) -> Path:
    records = pytest.importorskip("r3_rllib.rollout.records")
    rows = [
        records.SampleRecord(
            iteration=iteration,
            group=g,
            sample=s,
            query_id=f"q{g}",
            prompt_text=f"{g}+{g}=",
            response_text=str(2 * g + s),
            prompt_ids=[1, 2],
            response_ids=[3],
            reward=float(s == 0),
            correct=s == 0,
            truncated=False,
            policy_version=iteration - 1,
            staleness=0,
            behavior_logprobs=[-0.5],
        )
        for g in range(3)
        for s in range(2)
    ]
    trial_dir = tmp_path / "trial"
    records.write_iteration(records.records_table(rows), str(trial_dir / records.SAMPLES_DIR), iteration)
    return trial_dir


def test_sample_rows_show_every_group_first(tmp_path):
    trial_dir = _records(tmp_path, 2)
    rows = sample_rows(str(trial_dir), 2, 4)
    assert [(r["group"], r["sample"]) for r in rows] == [(0, 0), (1, 0), (2, 0), (0, 1)]
    assert rows[1]["prompt_text"] == "1+1=" and rows[1]["response_text"] == "2" and rows[1]["reward"] == 1.0
    assert sample_rows(str(trial_dir), 3, 4) == []  # no records of that iteration


def test_mlflow_callback_logs_config_metrics_and_samples_to_a_file_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from pyarrow.fs import LocalFileSystem

    from r3_rllib.algorithms.r3.tracker_callbacks import R3MLflowLoggerCallback

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    trial_dir = _records(tmp_path, 1)
    uri = "file://" + str(tmp_path / "mlruns")
    trial = _Trial(
        name="grpo_0",
        config={"group_size": 4, "env_config": {"digits": 2}, "reflection_guidance": "x" * 7000},
        path=str(trial_dir),
        storage=SimpleNamespace(storage_filesystem=LocalFileSystem()),
    )
    callback = R3MLflowLoggerCallback(tracking_uri=uri, experiment_name="tiny")
    callback.setup()
    callback.log_trial_start(trial)
    for it in (1, 2):
        result = {"training_iteration": it, "rollout": {"accuracy": 0.25 * it, "note": "text"}, "done": False}
        callback.log_trial_result(it, trial, result)
    callback.log_trial_end(trial)

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["trial_name"] == "grpo_0"
    assert run.data.params["group_size"] == "4" and run.data.params["env_config/digits"] == "2"
    assert len(run.data.params["reflection_guidance"]) == 6000  # cut to MLflow's limit, not a failed run
    history = client.get_metric_history(run.info.run_id, "rollout/accuracy")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5)]
    assert "rollout/note" not in run.data.metrics
    assert [a.path for a in client.list_artifacts(run.info.run_id, "samples")] == [
        "samples/iteration_000001.json"
    ]


def test_a_trial_that_failed_before_logging_ends_without_hiding_its_error():
    """Tune calls log_trial_end for a trial whose actor never started (its EnvRunners failed): with no W&B queue
    for it, ending it is a no-op (it raised KeyError, which replaced the trial's own error on the console)."""
    from r3_rllib.algorithms.r3.tracker_callbacks import R3WandbLoggerCallback

    callback = R3WandbLoggerCallback.__new__(R3WandbLoggerCallback)
    callback._trial_queues, callback._trial_logging_futures, callback._trial_logging_actors = {}, {}, {}
    callback._unsent, callback._in_flight = {}, {}
    callback._signal_logging_actor_stop("trial_0")  # no KeyError
    assert callback._unsent == {} and callback._in_flight == {}


def test_mlflow_ends_a_trial_that_failed_before_it_started_without_hiding_its_error(tmp_path, monkeypatch):
    """Tune's on_trial_error for a trial that never started (an unknown env, a reward module that cannot be
    imported) calls log_trial_end with no MLflow run for it: a no-op, with no run written (it raised KeyError,
    an 86-line traceback in place of the trial's own one-line error). A trial that did start still ends FAILED."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from r3_rllib.algorithms.r3.tracker_callbacks import R3MLflowLoggerCallback

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = "file://" + str(tmp_path / "mlruns")
    callback = R3MLflowLoggerCallback(tracking_uri=uri, experiment_name="tiny")
    callback.setup()
    never_started = _Trial(name="grpo_0", config={}, path=str(tmp_path / "t0"))
    callback.on_trial_error(iteration=0, trials=[never_started], trial=never_started)  # no KeyError
    callback.on_trial_complete(iteration=0, trials=[never_started], trial=never_started)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tiny").experiment_id
    assert client.search_runs([experiment]) == []

    started = _Trial(name="grpo_1", config={"group_size": 4}, path=str(tmp_path / "t1"))
    callback.log_trial_start(started)
    callback.on_trial_error(iteration=0, trials=[started], trial=started)
    (run,) = client.search_runs([experiment])
    assert run.info.status == "FAILED" and run.data.tags["trial_name"] == "grpo_1"

    # A result before Tune's trial start (as W&B's callback allows) starts the trial's MLflow run.
    from pyarrow.fs import LocalFileSystem

    storage = SimpleNamespace(storage_filesystem=LocalFileSystem())
    late = _Trial(name="grpo_2", config={}, path=str(tmp_path / "t2"), storage=storage)
    callback.log_trial_result(1, late, {"training_iteration": 1, "rollout": {"accuracy": 0.5}})
    callback.log_trial_end(late)
    statuses = {r.data.tags["trial_name"]: r.info.status for r in client.search_runs([experiment])}
    assert statuses == {"grpo_1": "FAILED", "grpo_2": "FINISHED"}

"""What a Tune run of R3 writes and prints: progress.csv's columns grow with the metrics (held-out accuracy from its
first evaluation on), the driver's progress line, trials named after their method, the callbacks `r3 train` uses."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.tune")

from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback  # noqa: E402

from r3_rllib.algorithms.r3.health_monitor import HealthWarningCallback
from r3_rllib.algorithms.r3.tune_output import (  # noqa: E402
    ProgressLineCallback,
    R3CSVLoggerCallback,
    read_csv_header,
    rewrite_csv_columns,
    run_callbacks,
    trial_name,
)


class FakeTrial:
    """The attributes Tune's CSV writer reads from a trial."""

    def __init__(self, path: Path, config: dict | None = None, trial_id: str = "fca17_00000"):
        self.local_path = str(path)
        self.path = str(path)
        self.checkpoint = None  # nothing to restore from remote storage
        self.config = config or {}
        self.trial_id = trial_id

    def init_local_path(self):
        Path(self.local_path).mkdir(parents=True, exist_ok=True)

    def __str__(self):
        return trial_name(self)


def result(iteration: int, eval_every: int = 5) -> dict:
    """A nested result as the algorithm reports it; eval/* in the iterations that evaluate (absent in the others)."""
    out = {
        "training_iteration": iteration,
        "time_this_iter_s": 2.0,
        "rollout": {"accuracy": 0.1 * iteration, "reward_mean": 0.1 * iteration},
        "config": {"lr": 1e-4},  # left out of progress.csv, as Tune's writer does
    }
    if iteration % eval_every == 0:
        out["eval"] = {"accuracy": 0.05 * iteration, "num_queries": 500.0}
    return out


def read_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_held_out_accuracy_first_measured_at_iteration_5_is_a_column(tmp_path):
    trial = FakeTrial(tmp_path / "trial")
    writer = R3CSVLoggerCallback()
    for it in range(1, 11):
        writer.log_trial_result(it, trial, result(it))
    writer.log_trial_end(trial)
    header, rows = read_rows(tmp_path / "trial" / "progress.csv")
    assert header[:4] == ["training_iteration", "time_this_iter_s", "rollout/accuracy", "rollout/reward_mean"]
    assert header[4:] == ["eval/accuracy", "eval/num_queries"] and "config/lr" not in header
    assert [r["training_iteration"] for r in rows] == [str(i) for i in range(1, 11)]
    assert [r["eval/accuracy"] for r in rows] == ["", "", "", "", "0.25", "", "", "", "", "0.5"]
    assert rows[0]["rollout/accuracy"] == "0.1"


def test_tunes_own_writer_drops_the_column_that_ours_keeps(tmp_path):
    """The bug this writer fixes, shown with Tune's: its columns are the first row's."""
    trial = FakeTrial(tmp_path / "tune")
    writer = CSVLoggerCallback()
    for it in range(1, 6):
        writer.log_trial_result(it, trial, result(it))
    writer.log_trial_end(trial)
    assert "eval/accuracy" not in read_csv_header(tmp_path / "tune" / "progress.csv")


def test_a_resumed_trial_appends_under_the_files_header_and_widens_it(tmp_path):
    trial = FakeTrial(tmp_path / "trial")
    first = R3CSVLoggerCallback()
    for it in range(1, 4):
        first.log_trial_result(it, trial, result(it))
    first.log_trial_end(trial)
    # A new writer (a resumed experiment) whose first result has the keys in another order, then a new one.
    second = R3CSVLoggerCallback()
    r = result(4)
    r["rollout"] = dict(reversed(list(r["rollout"].items())))
    second.log_trial_result(4, trial, r)
    second.log_trial_result(5, trial, result(5))
    second.log_trial_end(trial)
    header, rows = read_rows(tmp_path / "trial" / "progress.csv")
    assert header[:4] == ["training_iteration", "time_this_iter_s", "rollout/accuracy", "rollout/reward_mean"]
    assert "eval/accuracy" in header
    assert [(r["training_iteration"], r["rollout/accuracy"]) for r in rows][3] == ("4", "0.4")
    assert [r["eval/accuracy"] for r in rows] == ["", "", "", "", "0.25"]


def test_rewrite_keeps_every_value_and_leaves_new_cells_empty(tmp_path):
    path = tmp_path / "progress.csv"
    path.write_text("a,b\n1,x\n2,\n")
    rewrite_csv_columns(path, ["a", "b", "c"])
    assert path.read_text().splitlines() == ["a,b,c", "1,x,", "2,,"]
    assert not (tmp_path / "progress.csv.tmp").exists()
    assert read_csv_header(tmp_path / "missing.csv") == []


def test_trial_named_after_its_method_and_env(tmp_path):
    assert trial_name(FakeTrial(tmp_path, {"advantage_estimator": "grpo", "env": "arithmetic"})) == (
        "grpo_arithmetic_fca17_00000"
    )
    assert trial_name(FakeTrial(tmp_path, {"replay": True, "env": "my_pkg.envs:Digits"})) == (
        "r3_my_pkg.envs_Digits_fca17_00000"
    )
    assert trial_name(FakeTrial(tmp_path, {"dynamic_sampling": True})) == "dapo_fca17_00000"


def test_progress_callback_prints_one_line_per_result_and_where_results_are(tmp_path):
    out = io.StringIO()
    callback = ProgressLineCallback(total=10, stream=out)
    trial = FakeTrial(tmp_path / "grpo_trial", {"advantage_estimator": "grpo", "env": "arithmetic"})
    callback.on_trial_start(0, [trial], trial)
    for it in (1, 5):
        callback.on_trial_result(it, [trial], trial, result(it))
    lines = out.getvalue().splitlines()
    assert lines[0] == f"grpo_arithmetic_fca17_00000: results in {tmp_path / 'grpo_trial'}"
    assert lines[1] == "iter  1/10  2.0 s/it  reward 0.100  acc 0.100"
    assert "eval_acc" not in lines[1] and "eval_acc 0.250" in lines[2] and len(lines) == 3
    # With two trials each line names its trial.
    other = FakeTrial(tmp_path / "b", {"advantage_estimator": "grpo"}, trial_id="fca17_00001")
    callback.on_trial_result(2, [trial, other], other, result(2))
    assert out.getvalue().splitlines()[-1].startswith("grpo_fca17_00001: iter  2/10")


def _spec(progress=True, stop=None):
    return SimpleNamespace(config=SimpleNamespace(progress=progress), stop=stop or {"training_iteration": 7})


def test_run_callbacks_replace_tunes_csv_writer_and_add_the_progress_line_and_health_warnings(monkeypatch):
    monkeypatch.delenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", raising=False)
    # No trackers: ours replaces the CSV writer Tune would add (Tune still adds its JSON and TensorBoard ones).
    callbacks = run_callbacks(None, _spec())
    assert [type(c) for c in callbacks] == [R3CSVLoggerCallback, ProgressLineCallback, HealthWarningCallback]
    assert callbacks[1].total == 7
    assert [type(c) for c in run_callbacks(None, _spec(progress=False))] == [
        R3CSVLoggerCallback,
        HealthWarningCallback,
    ]
    # Trackers named in the run file (Tune's automatic loggers off): the csv one is ours, the others stay.
    monkeypatch.setenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    json_writer = JsonLoggerCallback()
    callbacks = run_callbacks([CSVLoggerCallback(), json_writer], _spec())
    assert [type(c) for c in callbacks][:3] == [R3CSVLoggerCallback, JsonLoggerCallback, ProgressLineCallback]
    assert callbacks[1] is json_writer
    assert [type(c) for c in run_callbacks([json_writer], _spec())] == [
        JsonLoggerCallback,
        ProgressLineCallback,
        HealthWarningCallback,
    ]


def test_the_ray_internals_r3s_console_relies_on_are_still_there():
    """Private or textual things of Ray this output relies on (none of them a promise of Ray's): fail here first
    after a Ray upgrade, not as a missing column or a notice back on the console."""
    import inspect

    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.tune.trainable import trainable
    from ray.tune.utils import util

    from r3_rllib.algorithms.r3.console import TRAINABLE_START_NOTICES

    # R3CSVLoggerCallback: Tune's CSV writer's per-trial state and its set-up.
    source = inspect.getsource(CSVLoggerCallback)
    for attribute in ("_trial_continue", "_trial_files", "_trial_csv"):
        assert f"self.{attribute}[trial]" in source
    assert callable(CSVLoggerCallback._setup_trial)
    # print_progress: a Tune trial is an algorithm built with a storage context.
    assert "self._storage = storage" in inspect.getsource(trainable.Trainable.__init__)
    # R3Config.validate spends RLlib's log-once key of its new-API-stack notice.
    assert 'log_once(f"{self.algo_class.__name__}_on_new_api_stack")' in inspect.getsource(AlgorithmConfig)
    # console.quiet_trainable_start: the loggers and texts of the two notices it drops.
    modules = {"ray.tune.utils.util": util, "ray.tune.trainable.trainable": trainable}
    for name, text in TRAINABLE_START_NOTICES:
        assert modules[name].logger.name == name and text in inspect.getsource(modules[name])

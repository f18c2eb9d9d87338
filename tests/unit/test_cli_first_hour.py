"""`r3 train`'s first-hour mistakes answered before Ray starts, in one line each: an env name no registry knows
(with the closest known name), a section's key written at the top level (with its section), a stop changed on
``--resume`` (which Tune does not apply), and a second run of the same name (which Tune adds beside the first).
The MLflow callback's end of a trial that never started is in tests/unit/algorithms/test_trackers.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import r3_rllib.ray_session
from r3_rllib import cli
from r3_rllib.cli import main
from r3_rllib.train_config import ConfigError, load_run_file

RUN_FILE = """\
preset: grpo
environment: {env: arithmetic, env_config: {digits: 2}}
training: {group_size: 4}
stop: {training_iteration: 40}
run: {name: tiny}
"""


class _RayStarted(Exception):
    """Raised in place of starting Ray: everything the test looks at happened before."""


@pytest.fixture
def no_ray(monkeypatch):
    def init_ray(*args, **kwargs):
        raise _RayStarted

    monkeypatch.setattr(r3_rllib.ray_session, "init_ray", init_ray)


@pytest.fixture
def run_file(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(RUN_FILE.replace("{name: tiny}", f"{{name: tiny, storage_path: {tmp_path / 'runs'}}}"))
    return path


# -- an unknown env name ---------------------------------------------------------------------------------------------


def test_an_unknown_env_name_is_refused_with_the_closest_known_one(run_file):
    with pytest.raises(ConfigError) as e:
        load_run_file(run_file, ["environment.env=arithmatic"])
    message = str(e.value)
    assert message.startswith("environment.env: unknown text env 'arithmatic'; known: ")
    assert "did you mean 'arithmetic'?" in message and "'module:Class'" in message


def test_r3_train_refuses_an_unknown_env_before_ray_starts(run_file, no_ray, capsys):
    assert main(["train", str(run_file), "--set", "environment.env=arithmatic"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("r3 train: environment.env: unknown text env 'arithmatic'")
    assert "did you mean 'arithmetic'?" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "env",
    [
        "arithmetic",  # built in
        "r3_rllib.envs.arithmetic:ArithmeticEnv",  # an object path: imported, not looked up
        "tiny_entry_point",  # declared by an installed package's entry point (not loaded to check it)
    ],
)
def test_names_the_registry_resolves_pass(run_file, monkeypatch, env):
    from importlib.metadata import EntryPoint

    from r3_rllib.envs import registry

    declared = {
        "tiny_entry_point": EntryPoint("tiny_entry_point", "no_such_module:Env", registry.ENTRY_POINT_GROUP)
    }
    monkeypatch.setattr(registry, "_entry_points", lambda: declared)
    assert load_run_file(run_file, [f"environment.env={env}"]).config.env == env


def test_a_name_registered_in_this_process_passes(run_file):
    """A name user code registered before the run file is read (a module a run file imports, a driver script), in
    the text-env registry or in Ray Tune's env registry, is known."""
    from ray.tune.registry import ENV_CREATOR, _global_registry, register_env

    from r3_rllib.envs import register_text_env
    from r3_rllib.envs.arithmetic import ArithmeticEnv
    from r3_rllib.envs.registry import _REGISTRY

    register_text_env("first_hour_registered", ArithmeticEnv, overwrite=True)
    register_env("first_hour_tune_registered", ArithmeticEnv)
    try:
        for name in ("first_hour_registered", "first_hour_tune_registered"):
            assert load_run_file(run_file, [f"environment.env={name}"]).config.env == name
    finally:
        _REGISTRY.pop("first_hour_registered", None)
        _global_registry._to_flush.pop((ENV_CREATOR, "first_hour_tune_registered"), None)


def test_joining_a_cluster_an_unknown_env_is_a_warning(run_file, no_ray, capsys):
    """The runners of a cluster joined with --address may run where a package this process lacks is installed (its
    entry point declares the name there): the name is not refused, and a warning says it is unknown here."""
    with pytest.raises(_RayStarted):
        main(["train", str(run_file), "--address", "auto", "--set", "environment.env=only_on_workers"])
    err = capsys.readouterr().err
    assert "r3 train: warning: environment.env: unknown text env 'only_on_workers'" in err
    assert "the cluster's EnvRunners must know it" in err
    assert load_run_file(run_file, ["environment.env=only_on_workers"], check_env=False).config.env


# -- a section's key at the top level ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, hint",
    [
        ("lr=1e-4", "did you mean 'training.lr'?"),
        ("group_size=4", "did you mean 'training.group_size'?"),
        ("replay=true", "did you mean 'r3.replay'?"),
        ("num_env_runners=2", "did you mean 'env_runners.num_env_runners'?"),
        ("training_iteration=5", "did you mean 'stop.training_iteration'?"),
        ("storage_path=x", "did you mean 'run.storage_path'?"),
        ("trainig={}", "did you mean 'training'?"),  # a misspelt section: as before
    ],
)
def test_a_section_key_at_the_top_level_is_named_with_its_section(run_file, override, hint):
    key = override.split("=")[0]
    with pytest.raises(ConfigError) as e:
        load_run_file(run_file, [override])
    assert str(e.value) == f"unknown key '{key}' in the run file's top level; {hint}"


# -- --resume with another stop --------------------------------------------------------------------------------------


def _experiment(tmp_path: Path, stop: dict) -> Path:
    """An experiment folder as Tune leaves it: its Tuner state, one trial folder, and an experiment state whose trial
    records ``stop`` (written by Tune's own Trial.get_json_state)."""
    from ray.train._internal.storage import StorageContext
    from ray.tune.experiment import Trial

    exp = tmp_path / "runs" / "tiny"
    exp.mkdir(parents=True)
    (exp / "tuner.pkl").write_bytes(b"")
    storage = StorageContext(storage_path=str(tmp_path / "runs"), experiment_dir_name="tiny")
    trial = Trial("R3", stopping_criterion=stop, storage=storage, stub=True)
    # The trial's folder, named as Tune's init_local_path names it when the trial starts (which needs Ray).
    trial.relative_logdir = storage.trial_dir_name = "R3_abc_00000_0_2026-11-28_10-00-00"
    (exp / trial.relative_logdir).mkdir()
    state = {"trial_data": [trial.get_json_state()], "runner_data": {}, "stats": {}}
    (exp / "experiment_state-2026-11-28_10-00-00.json").write_text(json.dumps(state))
    return exp


def test_restored_stops_are_read_from_tunes_experiment_state(tmp_path):
    exp = _experiment(tmp_path, {"training_iteration": 40})
    assert cli.restored_stops(str(exp)) == [{"training_iteration": 40}]
    assert cli.restored_stops(str(tmp_path / "nowhere")) is None


def test_resume_with_another_stop_warns_that_the_run_keeps_its_own(tmp_path, run_file, no_ray, capsys):
    _experiment(tmp_path, {"training_iteration": 40})
    with pytest.raises(_RayStarted):
        main(["train", str(run_file), "--resume", "--set", "stop.training_iteration=45"])
    err = capsys.readouterr().err
    assert (
        "r3 train: warning: --resume keeps the stop condition the run was started with (training_iteration=40), "
        "not the one given now (training_iteration=45)"
    ) in err
    assert "To train longer" in err


def test_resume_with_the_same_stop_says_nothing_of_it(tmp_path, run_file, no_ray, capsys):
    _experiment(tmp_path, {"training_iteration": 40})
    with pytest.raises(_RayStarted):
        main(["train", str(run_file), "--resume"])
    err = capsys.readouterr().err
    assert "stop condition" not in err and "already holds" not in err


def test_resume_checks_only_the_trials_tune_restores(tmp_path, capsys):
    """An earlier run of the same name left its trial beside the newest run's: Tune restores the trials of the newest
    experiment state only, and only their checkpoints are checked (and set aside when incomplete)."""
    from r3_rllib.algorithms.r3.checkpoint import AlgorithmState, write_algorithm_state
    from r3_rllib.algorithms.r3.checkpoint_files import build_manifest, write_manifest

    exp = _experiment(tmp_path, {"training_iteration": 40})
    (newest,) = [
        json.loads(t[0])["relative_logdir"] for t in json.loads(_state(exp).read_text())["trial_data"]
    ]
    for trial, complete in ((newest, True), ("R3_earlier_00000", False)):
        path = exp / trial / "checkpoint_000000"
        path.mkdir(parents=True)
        write_algorithm_state(str(path), AlgorithmState(5, 5, 0, {}, {}, {}, None, {}))
        if complete:
            write_manifest(str(path), build_manifest(str(path), {"iteration": 5}))
    assert cli.check_resume(str(exp))
    out, err = capsys.readouterr()
    assert f"r3 train: {newest} resumes from" in out and "R3_earlier_00000" not in out + err
    assert (exp / "R3_earlier_00000" / "checkpoint_000000").is_dir()  # not set aside: not Tune's to restore


def _state(exp: Path) -> Path:
    (path,) = exp.glob("experiment_state-*.json")
    return path


# -- a second run of the same name -----------------------------------------------------------------------------------


def test_a_new_run_in_a_folder_holding_an_earlier_one_says_so(tmp_path, run_file, no_ray, capsys):
    exp = _experiment(tmp_path, {"training_iteration": 40})
    (exp / "mlruns").mkdir()  # the MLflow file store beside the trials is not a trial
    before = {p.name for p in exp.iterdir()}
    with pytest.raises(_RayStarted):
        main(["train", str(run_file)])
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "already holds" in line]
    assert line.startswith(f"r3 train: note: {exp} already holds an earlier run (1 trial folder(s))")
    assert "--set run.name=" in line and f"r3 train {run_file} --resume" in line
    assert before <= {p.name for p in exp.iterdir()}  # nothing moved or deleted


def test_the_resume_command_keeps_the_overrides_that_place_the_folder(tmp_path, run_file, no_ray, capsys):
    _experiment(tmp_path, {"training_iteration": 40}).rename(tmp_path / "runs" / "renamed")
    with pytest.raises(_RayStarted):
        main(["train", str(run_file), "--set", "run.name=renamed", "--set", "training.lr=3e-4"])
    err = capsys.readouterr().err
    assert f"`r3 train {run_file} --resume --set run.name=renamed`" in err


def test_a_first_run_says_nothing_of_earlier_runs(run_file, no_ray, capsys):
    with pytest.raises(_RayStarted):
        main(["train", str(run_file)])
    assert "already holds" not in capsys.readouterr().err


# -- the run section's defaults --------------------------------------------------------------------------------------


def test_a_null_run_name_is_the_run_files_name_and_storage_expands_home(tmp_path, monkeypatch, capsys):
    """``run.name: null`` is documented as the run file's name (it was a TypeError); ``~`` in storage_path is the
    home folder (it was a folder named '~' in the working directory)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = tmp_path / "my_run.yaml"
    path.write_text(RUN_FILE.replace("{name: tiny}", "{name: null, storage_path: ~/runs}"))
    assert main(["train", str(path), "--resume"]) == 2
    assert f"nothing to resume in {tmp_path / 'home' / 'runs' / 'my_run'}" in capsys.readouterr().err


def test_a_null_stop_value_is_no_stop(run_file):
    """``stop: {training_iteration: null}`` passes the schema; Tune compared it with an int at the first result."""
    spec = load_run_file(run_file, ["stop.training_iteration=null", "stop.time_total_s=60"])
    config = cli._run_config(spec, "tiny", str(run_file.parent), str(run_file.parent / "tiny"), verbose=False)
    assert config.stop == {"time_total_s": 60}

"""`r3 train --resume`'s checks before Tune restores (cli.check_resume): the checkpoint each trial resumes from is
the newest complete one (an interrupted newer one is set aside, never deleted), and an experiment state truncated by
a full disk stops the resume (Tune would start again from iteration 1) naming the file and the good checkpoints, and
a refused resume sets nothing aside."""

from __future__ import annotations

import json
import os

import pytest

from r3_rllib.algorithms.r3.checkpoint import AlgorithmState, write_algorithm_state
from r3_rllib.algorithms.r3.checkpoint_files import build_manifest, write_manifest
from r3_rllib.cli import check_resume


def _checkpoint(path, iteration: int, *, complete: bool) -> None:
    os.makedirs(path / "learner_dcp")
    (path / "learner_dcp" / "__0_0.distcp").write_bytes(b"x" * 1000)
    state = AlgorithmState(iteration, iteration, 0, {}, {}, {}, None, {})
    write_algorithm_state(str(path), state)
    if complete:
        write_manifest(str(path), build_manifest(str(path), {"iteration": iteration}))


#: An experiment state naming the trial R3_abc_00000 (Tune writes each trial as its JSON state and a pickled part).
NAMED = json.dumps({"trial_data": [[json.dumps({"relative_logdir": "R3_abc_00000"}), ""]]})


def _experiment(tmp_path, state_text: str | None, name: str = "exp"):
    exp = tmp_path / name
    trial = exp / "R3_abc_00000"
    _checkpoint(trial / "checkpoint_000000", 5, complete=True)
    _checkpoint(trial / "checkpoint_000001", 10, complete=False)  # the save a full disk interrupted
    if state_text is not None:
        (exp / "experiment_state-2026-11-26_04-00-00.json").write_text(state_text)
    return exp, trial


@pytest.mark.parametrize("name", ["exp", "lr[3e-4]"])  # glob's characters in a run name are a folder name too
def test_resume_takes_the_newest_complete_checkpoint_and_sets_the_partial_one_aside(tmp_path, capsys, name):
    exp, trial = _experiment(tmp_path, NAMED, name)
    assert check_resume(str(exp))
    out, err = capsys.readouterr()
    assert f"R3_abc_00000 resumes from {trial / 'checkpoint_000000'} (iteration 5)" in out
    assert f"checkpoint refused: {trial / 'checkpoint_000001'}: no manifest.json: the save" in err
    assert (trial / "checkpoint_000001.incomplete" / "r3_state.pkl").exists()


def test_truncated_experiment_state_stops_the_resume_naming_file_and_good_checkpoints(tmp_path, capsys):
    exp, trial = _experiment(tmp_path, '{"trial_data": [["{\\"trial_id')
    assert not check_resume(str(exp))
    err = capsys.readouterr().err
    assert f"Tune's experiment state {exp / 'experiment_state-2026-11-26_04-00-00.json'} is unreadable" in err
    assert (
        f"still usable (R3.restore / Algorithm.restore, which check the files' hashes): {trial / 'checkpoint_000000'}"
        in err
    )
    assert (trial / "checkpoint_000001").is_dir()  # the resume stops: nothing is set aside


def test_no_experiment_state_stops_the_resume_saying_so_and_sets_nothing_aside(tmp_path, capsys):
    """Tune saves its experiment state after the run starts; a run stopped before has a Tuner file only."""
    exp, trial = _experiment(tmp_path, None)
    assert not check_resume(str(exp))
    err = capsys.readouterr().err
    assert f"cannot resume: {exp} holds no experiment state (experiment_state-*.json)" in err
    assert "unreadable" not in err and (trial / "checkpoint_000001").is_dir()


def test_a_state_naming_no_started_trial_sets_no_other_runs_checkpoint_aside(tmp_path, capsys):
    """Trials that never started have no folder (relative_logdir None): the trial folder beside them is an earlier
    run's, which this resume does not restore."""
    pending = json.dumps({"trial_data": [[json.dumps({"relative_logdir": None}), ""]]})
    exp, trial = _experiment(tmp_path, pending)
    assert check_resume(str(exp))
    assert (trial / "checkpoint_000001").is_dir() and "resumes from" not in capsys.readouterr().out

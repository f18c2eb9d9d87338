"""`r3 train --resume`'s checks before Tune restores (cli.check_resume): the checkpoint each trial resumes from is
the newest complete one (an interrupted newer one is set aside, never deleted), and an experiment state truncated by
a full disk stops the resume (Tune would start again from iteration 1) naming the file and the good checkpoints."""

from __future__ import annotations

import os

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


def _experiment(tmp_path, state_text: str):
    exp = tmp_path / "exp"
    trial = exp / "R3_abc_00000"
    _checkpoint(trial / "checkpoint_000000", 5, complete=True)
    _checkpoint(trial / "checkpoint_000001", 10, complete=False)  # the save a full disk interrupted
    (exp / "experiment_state-2026-11-26_04-00-00.json").write_text(state_text)
    return exp, trial


def test_resume_takes_the_newest_complete_checkpoint_and_sets_the_partial_one_aside(tmp_path, capsys):
    exp, trial = _experiment(tmp_path, '{"trial_data": []}')
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
    assert f"still usable (R3.restore / Algorithm.restore): {trial / 'checkpoint_000000'}" in err

"""`r3 samples RUN`: a run's records found under an experiment, trial or samples folder, filtered by iteration,
reward, grade reason and group, printed one line per row (r3_rllib/eval/samples.py)."""

from __future__ import annotations

import numpy as np
import pytest

from r3_rllib.cli import main as r3_main
from r3_rllib.rollout.records import SampleRecord, records_table, write_iteration


def _record(iteration, group, sample, reward, reason=None) -> SampleRecord:
    return SampleRecord(
        iteration=iteration,
        group=group,
        sample=sample,
        query_id=f"q{group}",
        prompt_text=f"question {group}?",
        response_text=f"answer {iteration}.{group}.{sample}",
        prompt_ids=[1],
        response_ids=[2, 3],
        reward=reward,
        correct=reward >= 1.0,
        truncated=False,
        policy_version=iteration - 1,
        staleness=0,
        behavior_logprobs=np.zeros(2, np.float32),
        grade_reason=reason,
        trained=True,
        advantage=reward - 0.5,
    )


@pytest.fixture
def run(tmp_path):
    """runs/exp with two trials: A with iterations 1-3 (two groups of two samples), B with iteration 1."""
    exp = tmp_path / "exp"
    for it in (1, 2, 3):
        rows = [
            _record(it, g, k, float(k == 0), "no_answer" if (g, k) == (1, 1) else None)
            for g in (0, 1)
            for k in (0, 1)
        ]
        write_iteration(records_table(rows), str(exp / "R3_A" / "samples"), it)
    write_iteration(records_table([_record(1, 0, 0, 0.5)]), str(exp / "R3_B" / "samples"), 1)
    (exp / "R3_A" / "progress.csv").write_text("training_iteration\n1\n")
    return exp


def _samples(capsys, *args) -> tuple[int, list[str]]:
    rc = r3_main(["samples", *map(str, args)])
    return rc, capsys.readouterr().out.splitlines()


@pytest.mark.slow
def test_every_trial_of_an_experiment_and_the_filters(run, capsys):
    rc, out = _samples(capsys, run, "-n", "3")
    assert rc == 0
    assert out[0] == f"{run / 'R3_A'}: 12 of 12 rows match (iterations 1-3), showing 3"
    assert out[1] == '  [1:0.0] "question 0?" -> "answer 1.0.0" -> reward 1 (correct) adv +0.5'
    assert out[4] == f"{run / 'R3_B'}: 1 of 1 rows match (iterations 1-1), showing 1"
    rc, out = _samples(capsys, run / "R3_A", "--iteration", "2", "--max-reward", "0.5")
    assert out == [
        f"{run / 'R3_A'}: 2 of 4 rows match (iterations 2-2), showing 2",
        '  [2:0.1] "question 0?" -> "answer 2.0.1" -> reward 0 (wrong) adv -0.5',
        '  [2:1.1] "question 1?" -> "answer 2.1.1" -> reward 0 (no_answer) adv -0.5',
    ]
    # --reason: the env's grade reason, or correct / wrong where it gives none; --iteration -1: the last one.
    rc, out = _samples(capsys, run / "R3_A" / "samples", "--reason", "no_answer", "--iteration", "-1")
    assert out[1:] == ['  [3:1.1] "question 1?" -> "answer 3.1.1" -> reward 0 (no_answer) adv -0.5']
    rc, out = _samples(capsys, run / "R3_A", "--reason", "wrong", "--min-reward", "0", "-n", "0")
    assert len(out) == 1 + 3 and all("(wrong)" in line for line in out[1:])
    rc, out = _samples(capsys, run / "R3_A", "--group", "2:1")
    assert [line.split(" ")[2] for line in out[1:]] == ["[2:1.0]", "[2:1.1]"]
    rc, out = _samples(capsys, run / "R3_A", "--group", "0", "--min-reward", "1")
    assert [line.split(" ")[2] for line in out[1:]] == ["[1:0.0]", "[2:0.0]", "[3:0.0]"]


def test_full_texts_and_a_single_file(run, capsys):
    rc, out = _samples(capsys, run / "R3_A" / "samples" / "iter_000001.parquet", "--full", "-n", "1")
    assert rc == 0
    assert out[1:] == [
        "[1:0.0] query q0: reward 1 (correct) adv +0.5",
        "--- prompt ---",
        "question 0?",
        "--- completion ---",
        "answer 1.0.0",
        "",
    ]


def test_a_folder_without_records_exits_2(tmp_path, capsys):
    assert r3_main(["samples", str(tmp_path)]) == 2
    assert f"no sample records under {tmp_path}" in capsys.readouterr().err


def test_r3_train_log_samples_needs_recorded_samples(capsys):
    from repo_paths import REPO

    run_file = REPO / "examples" / "tiny_arithmetic_cpu.yaml"
    args = ["train", str(run_file), "--log-samples", "2", "--set", "training.sample_log_fraction=0"]
    assert r3_main(args) == 2  # before Ray starts
    assert (
        "log_samples=2 prints recorded samples, but sample_log_fraction=0 records none"
        in capsys.readouterr().err
    )


def _show(run, **filters) -> list[str]:
    """`show_samples` with the CLI's defaults and ``filters``, its printed lines."""
    import argparse
    import io

    from r3_rllib.eval.samples import show_samples

    args = {"iteration": None, "min_reward": None, "max_reward": None, "reason": None, "group": None, "n": 20}
    out = io.StringIO()
    assert show_samples(run, argparse.Namespace(full=False, **{**args, **filters}), out=out) == 0
    return out.getvalue().splitlines()


def test_a_filter_that_matches_nothing_names_what_the_rows_have(run):
    """A --reason or --group that no row has is answered with the reasons (counts) and the groups recorded."""
    out = _show(run / "R3_A", reason="timeout", group="2:7")
    assert out == [
        f"{run / 'R3_A'}: 0 of 12 rows match (iterations 1-3), showing 0",
        "  no row has grade reason 'timeout'; reasons here: correct (6), no_answer (3), wrong (3)",
        "  no row is in group 2:7; groups recorded in iteration 2: 0, 1",
    ]
    assert _show(run / "R3_A", group="9:0")[1:] == [
        "  no row is of iteration 9 (--group 9:0); rows here are of iterations 1-3"
    ]
    # The rows read are those of --iteration; a group without an iteration is looked for in all of them.
    assert _show(run / "R3_A", group="5", iteration=3)[1:] == [
        "  no row is in group 5; groups recorded here: 0, 1"
    ]
    # Each filter alone matches rows, together none: nothing to hint at. No rows read: the count says so.
    assert _show(run / "R3_A", reason="no_answer", group="0")[1:] == []
    assert _show(run / "R3_A", reason="timeout", iteration=9) == [
        f"{run / 'R3_A'}: 0 of 0 rows match (no iteration), showing 0"
    ]
    # Rows that match print no hint, whatever the filters.
    assert all("no row" not in line for line in _show(run / "R3_A", reason="no_answer"))


def test_hints_list_at_most_hint_max_groups_groups():
    from r3_rllib.eval.samples import HINT_MAX_GROUPS, missing_filter_hints

    rows = [{"iteration": 1, "group": g, "reward": 0.0, "correct": False} for g in range(HINT_MAX_GROUPS + 5)]
    (hint,) = missing_filter_hints(rows, group="1:99")
    assert hint.endswith(f", {HINT_MAX_GROUPS - 1}, ... ({HINT_MAX_GROUPS + 5} groups)")
    assert missing_filter_hints([], reason="x", group="1") == []

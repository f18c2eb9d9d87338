"""Sample records (r3_rllib/rollout/records.py): the seeded choice of whole groups, the Parquet write/read round trip
(atomic, one file per iteration, the folder one dataset), and the printed row."""

from __future__ import annotations

import errno
import math
import os

import numpy as np
import pandas as pd
import pytest

from r3_rllib.rollout.records import (
    SCHEMA,
    SampleRecord,
    choose_groups,
    clip,
    format_row,
    iteration_file,
    preview,
    read_rows,
    records_table,
    write_iteration,
)


def _record(iteration=1, group=0, sample=0, **kw) -> SampleRecord:
    values = dict(
        iteration=iteration,
        group=group,
        sample=sample,
        query_id=f"q{group}",
        prompt_text="12+34=",
        response_text="46",
        prompt_ids=[1, 2, 3],
        response_ids=[4, 5],
        reward=1.0,
        correct=True,
        truncated=False,
        policy_version=3,
        staleness=0,
        behavior_logprobs=np.array([-0.5, -1.0], np.float32),
        entropies=np.array([0.25, 0.75], np.float32),
        grade_reason="correct",
        reward_parts={"correctness": 1.0, "length_bonus": 0.0},
        train_reward=1.0,
        advantage=0.5,
        learner_logprobs=np.array([-0.25, -1.0], np.float32),
        is_weights=np.exp(np.array([0.25, 0.0], np.float32)),
        trained=True,
    )
    return SampleRecord(**(values | kw))


# -- which groups --------------------------------------------------------------------------------------------------
def test_choose_groups_takes_the_ceiling_of_the_fraction_capped_and_seeded():
    assert choose_groups(10, 1.0, None, seed=0, iteration=1) == list(range(10))
    assert choose_groups(10, 0.0, None, seed=0, iteration=1) == []
    assert choose_groups(0, 0.5, None, seed=0, iteration=1) == []
    picked = choose_groups(10, 0.25, None, seed=7, iteration=4)
    assert len(picked) == 3 and picked == sorted(set(picked)) and all(0 <= i < 10 for i in picked)
    assert choose_groups(10, 0.25, None, seed=7, iteration=4) == picked  # reproducible
    assert (
        len(choose_groups(10, 0.01, None, seed=7, iteration=4)) == 1
    )  # a small fraction still shows a group
    assert len(choose_groups(100, 0.5, 8, seed=7, iteration=4)) == 8  # the cap
    # Another iteration, another seed: other groups (over many draws, not always the same ones).
    draws = {tuple(choose_groups(100, 0.05, None, seed=s, iteration=i)) for s in range(3) for i in range(3)}
    assert len(draws) == 9


# -- the file ------------------------------------------------------------------------------------------------------
def test_parquet_round_trip_keeps_every_field(tmp_path):
    records = [
        _record(group=0),
        _record(
            group=1,
            sample=0,
            trained=False,
            advantage=None,
            train_reward=None,
            learner_logprobs=None,
            is_weights=None,
            grade_reason=None,
            reward_parts={},
            reward=0.0,
            correct=False,
        ),
    ]
    path = write_iteration(records_table(records), str(tmp_path / "samples"), 12)
    assert (
        path
        == str(tmp_path / "samples" / "iter_000012.parquet")
        == str(tmp_path / "samples" / iteration_file(12))
    )
    assert os.listdir(tmp_path / "samples") == ["iter_000012.parquet"]  # the hidden name is gone
    rows = read_rows(path)
    first, second = rows
    assert first["group_id"] == "1:0" and second["group_id"] == "1:1"
    assert first["reward_parts"] == {"correctness": 1.0, "length_bonus": 0.0}
    assert first["prompt_ids"] == [1, 2, 3] and first["response_ids"] == [4, 5]
    assert first["behavior_logprobs"] == [-0.5, -1.0] and first["learner_logprobs"] == [-0.25, -1.0]
    assert first["is_weights"] == pytest.approx([math.exp(0.25), 1.0])
    assert first["is_weight_mean"] == pytest.approx((math.exp(0.25) + 1.0) / 2)
    assert first["behavior_logprob_mean"] == -0.75 and first["learner_logprob_mean"] == -0.625
    assert first["entropy_mean"] == 0.5 and first["response_len"] == 2
    assert first["trained"] and first["advantage"] == 0.5 and first["grade_reason"] == "correct"
    assert (
        second["advantage"] is None
        and second["learner_logprobs"] is None
        and second["is_weight_mean"] is None
    )
    assert second["grade_reason"] is None and second["reward_parts"] == {} and not second["trained"]
    assert set(first) == set(SCHEMA.names)


def test_a_folder_of_iterations_reads_as_one_dataset_and_a_rerun_replaces_its_file(tmp_path):
    folder = str(tmp_path / "samples")
    for it in (1, 2):
        write_iteration(records_table([_record(iteration=it, group=g) for g in range(2)]), folder, it)
    write_iteration(
        records_table([_record(iteration=2, group=0, reward=0.25)]), folder, 2
    )  # iteration 2 again
    (tmp_path / "samples" / ".iter_000003.parquet.tmp").write_bytes(b"half a file")  # a crash mid-write
    df = pd.read_parquet(folder)
    assert sorted(zip(df["iteration"], df["group"], strict=True)) == [(1, 0), (1, 1), (2, 0)]
    assert df.loc[df["iteration"] == 2, "reward"].tolist() == [0.25]


def test_a_failed_write_leaves_no_file_and_raises(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    def full_disk(table, where, **kw):
        with open(where, "wb") as f:
            f.write(b"PAR1")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full_disk)
    with pytest.raises(OSError) as err:
        write_iteration(records_table([_record()]), str(tmp_path), 1)
    assert err.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path) == []


# -- printing ------------------------------------------------------------------------------------------------------
def test_format_row_clips_long_texts_and_names_the_reason():
    row = _record(
        iteration=3,
        group=2,
        sample=1,
        prompt_text="x" * 100 + "What is 12+34?",
        response_text="line one\nline two " + "y" * 200,
    ).row()
    line = format_row(row, prompt_width=30, response_width=40)
    assert line.startswith('[3:2.1] "...' + "x" * 13 + 'What is 12+34?" -> "line one\\nline two ')
    assert line.endswith('..." -> reward 1 (correct) adv +0.5')
    assert len(clip("a" * 100, 40)) == 40
    # No grade reason from the env: its correct/wrong outcome; a sample not trained and its flags say so.
    row = _record(
        grade_reason=None, correct=False, reward=0.0, trained=False, advantage=None, replayed=True
    ).row()
    assert format_row(row).endswith('"46" -> reward 0 (wrong) [replayed, not trained]')


def test_preview_shows_a_sample_of_each_group_first():
    rows = [_record(group=g, sample=k).row() for g in range(3) for k in range(2)]
    assert [(r["group"], r["sample"]) for r in preview(rows, 4)] == [(0, 0), (1, 0), (2, 0), (0, 1)]

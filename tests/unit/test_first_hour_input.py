"""A first hour's bad input, answered with what is wrong and where, and without losing work: data files saved with a
byte-order mark or with other column names, damaged sample records, output paths that name a folder, and run files
whose env options, data path or run name cannot work (refused before Ray starts)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from r3_rllib.cli import main
from r3_rllib.envs.data import DataError, load_math_problems, read_rows
from r3_rllib.eval.evaluate import BenchmarkResult, EvalReport, _print_report, report_path
from r3_rllib.eval.plot import output_path
from r3_rllib.eval.report import render_report, write_report
from r3_rllib.rollout.records import SampleRecord, records_table, write_iteration
from r3_rllib.train_config import ConfigError, load_run_file

BOM = "\ufeff"


# -- data files -----------------------------------------------------------------------------------------------------
def test_a_byte_order_mark_is_not_taken_for_row_0s_json(tmp_path):
    # Notepad and Excel's "UTF-8" export start the file with a BOM: row 0 was "invalid JSON: Unexpected UTF-8 BOM",
    # and with on_bad_row="skip" the first problem was dropped.
    rows = '{"problem": "1+1", "answer": "2"}\n{"problem": "2+2", "answer": "4"}\n'
    jsonl = tmp_path / "bom.jsonl"
    jsonl.write_text(BOM + rows, encoding="utf-8")
    assert [p.answer for p in load_math_problems(jsonl)] == ["2", "4"]
    assert [p.answer for p in load_math_problems(jsonl, on_bad_row="skip")] == ["2", "4"]
    as_json = tmp_path / "bom.json"
    as_json.write_text(BOM + json.dumps([{"problem": "1+1", "answer": 2}]), encoding="utf-8")
    assert [p.answer for p in load_math_problems(as_json)] == ["2"]
    _, _, located = read_rows(jsonl)  # the reward_fn env's reader
    assert located[0][1]["problem"] == "1+1"


def test_a_missing_column_names_the_columns_the_row_has_and_the_option(tmp_path):
    # A dataset with other column names (GSM8K's question/answer): "field 'problem': missing" said nothing of why.
    path = tmp_path / "gsm.jsonl"
    path.write_text('{"question": "1+1?", "solution": "2"}\n')
    with pytest.raises(
        DataError,
        match=r"gsm\.jsonl: row 0 \(line 1\): field 'problem': missing; the row's columns "
        r"are 'question', 'solution' \(set problem_key to read another column\)",
    ):
        load_math_problems(path)
    with pytest.raises(
        DataError, match=r"field 'answer': missing; .*'question', 'solution' \(set answer_key"
    ):
        load_math_problems(path, problem_key="question")
    assert load_math_problems(path, problem_key="question", answer_key="solution")[0].answer == "2"
    path.write_text('{"problem": null, "answer": "2"}\n')  # present but null: said so, no column list
    with pytest.raises(DataError, match=r"field 'problem': missing \(null\)$"):
        load_math_problems(path)


# -- r3 samples / r3 report: damaged records ------------------------------------------------------------------------
def _record(iteration: int) -> SampleRecord:
    return SampleRecord(
        iteration=iteration,
        group=0,
        sample=0,
        query_id="q0",
        prompt_text="question?",
        response_text=f"answer {iteration}",
        prompt_ids=[1],
        response_ids=[2, 3],
        reward=1.0,
        correct=True,
        truncated=False,
        policy_version=iteration - 1,
        staleness=0,
        behavior_logprobs=np.zeros(2, np.float32),
        trained=True,
        advantage=0.5,
    )


@pytest.fixture
def damaged_run(tmp_path) -> Path:
    """A trial whose iteration 1 has good records and whose iteration 2's file was cut short (a full disk, a copy)."""
    trial = tmp_path / "exp" / "R3_A"
    write_iteration(records_table([_record(1)]), str(trial / "samples"), 1)
    good = trial / "samples" / "iter_000001.parquet"
    (trial / "samples" / "iter_000002.parquet").write_bytes(good.read_bytes()[:40])
    (trial / "progress.csv").write_text("training_iteration,rollout/accuracy\n1,0.5\n2,0.6\n")
    return trial


def test_r3_samples_leaves_a_damaged_records_file_out_naming_it(damaged_run, capsys):
    # Was: pyarrow.lib.ArrowInvalid: ... Parquet magic bytes not found in footer (a traceback, no rows shown).
    assert main(["samples", str(damaged_run)]) == 0
    out, err = capsys.readouterr()
    assert "iter_000002.parquet: not a readable records file, left out (ArrowInvalid" in err
    assert "1 of 1 rows match" in out and "answer 1" in out


def test_r3_samples_refuses_a_file_that_is_not_a_records_file(damaged_run, capsys):
    assert main(["samples", str(damaged_run / "progress.csv")]) == 2
    assert "progress.csv is not a records file (iter_*.parquet)" in capsys.readouterr().err


def test_r3_report_survives_a_damaged_records_file(damaged_run, tmp_path, capsys):
    # Was: "r3 report: Could not open Parquet input source ..." and no report at all.
    out = tmp_path / "report.html"
    assert main(["report", str(damaged_run), "-o", str(out)]) == 0
    assert "r3 report: warning: " in capsys.readouterr().err
    page = out.read_text(encoding="utf-8")
    assert (
        '"prompt": "question?"' in page and "1 file(s) left out: " in page and "iter_000002.parquet" in page
    )


# -- output paths ---------------------------------------------------------------------------------------------------
def test_report_out_naming_a_folder_writes_report_html_inside_it(damaged_run, tmp_path):
    # Was: IsADirectoryError after the page was rendered.
    folder = tmp_path / "reports"
    folder.mkdir()
    with pytest.warns(UserWarning, match="iter_000002.parquet: not a readable records file"):
        assert write_report(damaged_run, folder) == folder / "report.html"
    assert (folder / "report.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_report_max_samples_below_zero_is_refused(damaged_run, tmp_path, capsys):
    # Was: rows[:-2], no row at all, silently.
    assert main(["report", str(damaged_run), "-o", str(tmp_path / "r.html"), "--max-samples", "-2"]) == 2
    assert "--max-samples must be an integer >= 0, got -2" in capsys.readouterr().err
    assert render_report(damaged_run, 0)  # 0 stays allowed: a page without samples


def test_plot_out_is_the_file_actually_written(tmp_path):
    # Was: "--out runs/" wrote runs.png beside the folder and printed "wrote runs"; "--out curves" wrote curves.png.
    folder = tmp_path / "figs"
    folder.mkdir()
    assert output_path(folder) == folder / "curves.png"
    assert output_path(tmp_path / "curves") == tmp_path / "curves.png"
    assert output_path(tmp_path / "a.pdf") == tmp_path / "a.pdf"


def test_eval_out_naming_a_folder_is_settled_before_the_evaluation(tmp_path):
    # Was: IsADirectoryError after the whole evaluation, and the JSON report lost.
    assert report_path(str(tmp_path)) == str(tmp_path / "results.json")
    assert report_path(str(tmp_path / "r.json")) == str(tmp_path / "r.json")
    assert report_path(None) is None


def test_eval_report_that_cannot_be_written_says_the_table_is_the_result(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    report = EvalReport([BenchmarkResult.from_samples("math500", ["p0"], [[True]], [[3]], [[False]])])
    assert _print_report(report, str(blocker / "results.json")) == 1
    out, err = capsys.readouterr()
    assert "| math500 |" in out
    assert "r3 eval: error: cannot write --out" in err and "the table above is the result" in err


def test_eval_table_that_cannot_be_written_says_the_json_was(tmp_path, capsys):
    # Was: "cannot write --out" although the JSON (every number of the table) had been written.
    (tmp_path / "results.md").mkdir()  # the table's path is taken by a folder
    report = EvalReport([BenchmarkResult.from_samples("math500", ["p0"], [[True]], [[3]], [[False]])])
    assert _print_report(report, str(tmp_path / "results.json")) == 1
    err = capsys.readouterr().err
    assert f"wrote {tmp_path / 'results.json'}; r3 eval: error: cannot write the table" in err
    assert "cannot write --out" not in err and (tmp_path / "results.json").stat().st_size > 0


# -- run files ------------------------------------------------------------------------------------------------------
def _run_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_an_env_option_the_env_does_not_take_is_named_before_ray_starts(tmp_path, capsys):
    # Was: loaded, then every EnvRunner failed with "__init__() got an unexpected keyword argument 'digitz'".
    path = _run_file(tmp_path, "environment: {env: arithmetic, env_config: {digitz: 3}}\n")
    with pytest.raises(
        ConfigError,
        match=r"environment\.env_config: env 'arithmetic' takes no option 'digitz'; "
        r"did you mean 'digits'\?",
    ):
        load_run_file(path)
    assert main(["train", str(path)]) == 2
    assert "takes no option 'digitz'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="takes no option 'num_querys'"):
        load_run_file(
            _run_file(tmp_path, "environment: {env: arithmetic}\n"), ["environment.env_config.num_querys=5"]
        )
    assert load_run_file(path, ["environment.env_config={digits: 3}"]).config.env_config == {"digits": 3}


def test_a_data_folder_is_refused_for_the_envs_that_read_one_file(tmp_path):
    # Was: loaded, then "DataError: ...: not a file" in every EnvRunner.
    (tmp_path / "shards").mkdir()
    path = _run_file(tmp_path, "environment: {env: math, env_config: {data: ./shards}}\n")
    with pytest.raises(
        ConfigError, match=r"env_config\.data: .*shards is a folder; name a \.json, \.jsonl or"
    ):
        load_run_file(path)


@pytest.mark.parametrize("name", ["..", "../other", "a/../..", "/tmp/elsewhere", "~/runs"])
def test_a_run_name_that_leaves_the_storage_folder_is_refused(tmp_path, name):
    # Was: run.name ".." put the experiment into the storage folder's parent, beside other runs.
    path = _run_file(tmp_path, f"run: {{name: {json.dumps(name)}}}\n")
    with pytest.raises(ConfigError, match=r"run\.name must be a folder name under run\.storage_path"):
        load_run_file(path)


def test_plain_and_nested_run_names_still_load(tmp_path):
    for name in ("tiny", "sweep/lr-3e-4", "exp.v2"):
        assert load_run_file(_run_file(tmp_path, f"run: {{name: {name}}}\n")).run["name"] == name


def test_a_data_file_given_as_the_run_file_is_named_so(tmp_path, capsys):
    # Was: "unknown key 'problem' in the run file's top level" (a one-line .jsonl is a YAML mapping).
    data = tmp_path / "train.jsonl"
    data.write_text('{"problem": "1+1", "answer": "2"}\n')
    assert main(["train", str(data)]) == 2
    assert "train.jsonl: a data file, not a run file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--n", "0", "expected an integer >= 1, got 0"),
        ("--batch-size", "-4", "expected an integer >= 1, got -4"),
        ("--max-problems", "ten", "expected an integer >= 1, got 'ten'"),
        ("--max-new-tokens", "0", "expected an integer >= 1, got 0"),
        ("--temperature", "-0.5", "expected a number in [0.0, inf], got '-0.5'"),
        ("--temperature", "nan", "expected a number in [0.0, inf], got 'nan'"),
        ("--top-p", "0", "expected a number in (0.0, 1.0], got '0'"),
        ("--top-p", "1.5", "expected a number in (0.0, 1.0], got '1.5'"),
    ],
)
def test_eval_numbers_out_of_range_are_refused_when_the_command_line_is_read(capsys, option, value, expected):
    """Refused by the argument parser (exit 2, the option named), before any model is loaded: ``--n 0`` was
    refused only inside the evaluation, after the engine was built."""
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--model", "no-such-model", option, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: {expected}" in err

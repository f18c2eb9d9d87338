"""Loading math problems: formats, answer normalisation, every bad-input case, skip counting, hub path."""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path

import pytest

from r3_rllib.envs.data import (
    DataError,
    LoadReport,
    MathProblem,
    load_math_problems,
    load_math_problems_with_report,
)

ROWS = [
    {"id": "a", "problem": "What is 1+1?", "answer": "2"},
    {"id": "b", "problem": "Half of one?", "answer": "\\frac{1}{2}", "answers": ["0.5", "1/2"]},
    {"id": 7, "problem": "AMC style", "answer": 142.0},
]
EXPECTED = [
    MathProblem("a", "What is 1+1?", ("2",)),
    MathProblem("b", "Half of one?", ("\\frac{1}{2}", "0.5", "1/2")),
    MathProblem("7", "AMC style", ("142",)),
]


def write_jsonl(path: Path, rows: list, *, raw_lines: dict[int, str] | None = None) -> Path:
    lines = [json.dumps(r) for r in rows]
    for index, text in (raw_lines or {}).items():
        lines.insert(index, text)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# -- formats -----------------------------------------------------------------------------------------------------
def test_jsonl_json_and_data_wrapper_give_the_same_problems(tmp_path):
    jsonl = write_jsonl(tmp_path / "set.jsonl", ROWS)
    plain = tmp_path / "set.json"
    plain.write_text(json.dumps(ROWS))
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"data": ROWS}))
    for source in (jsonl, str(jsonl), plain, wrapped):
        assert load_math_problems(source) == EXPECTED


def test_parquet(tmp_path):
    rows = [
        {"id": "a", "problem": "p1", "answer": 142.0},
        {"id": "b", "problem": "p2", "answer": 0.25},
    ]
    problems = load_math_problems(write_parquet(tmp_path / "set.parquet", rows))
    assert [p.answers for p in problems] == [("142",), ("0.25",)]


def test_blank_lines_are_ignored_and_ids_default_to_stem_and_row(tmp_path):
    path = tmp_path / "noid.jsonl"
    path.write_text('\n{"problem": "p0", "answer": "1"}\n\n{"problem": "p1", "answer": 2}\n')
    problems = load_math_problems(path)
    assert [p.id for p in problems] == ["noid:0", "noid:1"]
    assert [p.answers for p in problems] == [("1",), ("2",)]


@pytest.mark.parametrize(
    "value, expected",
    [
        ("  142.0 ", ("142.0",)),  # strings stay as given (stripped)
        (142, ("142",)),
        (142.0, ("142",)),  # integral floats are integers (AMC stores 142.0)
        (-3.0, ("-3",)),
        (0.5, ("0.5",)),
        (["1", 1, 1.0, "x"], ("1", "x")),  # several forms, duplicates dropped
        (("a", "b"), ("a", "b")),
    ],
)
def test_answer_normalisation(tmp_path, value, expected):
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"problem": "p", "answer": value}]))
    assert load_math_problems(path)[0].answers == expected


def test_answers_column_adds_forms_and_can_stand_alone(tmp_path):
    path = write_jsonl(
        tmp_path / "forms.jsonl",
        [
            {"problem": "p", "answer": "2", "answers": ["2", "two"]},
            {"problem": "q", "answers": ["3", 3.0]},
            {"problem": "r", "answer": "4", "answers": None},
        ],
    )
    assert [p.answers for p in load_math_problems(path)] == [("2", "two"), ("3",), ("4",)]


def test_custom_keys(tmp_path):
    path = write_jsonl(tmp_path / "custom.jsonl", [{"uid": "q1", "question": "Q?", "final": 5}])
    problems = load_math_problems(path, problem_key="question", answer_key="final", id_key="uid")
    assert problems == [MathProblem("q1", "Q?", ("5",))]


def test_max_rows_counts_loaded_problems(tmp_path):
    rows = [{"problem": f"p{i}", "answer": str(i)} for i in range(10)]
    rows[1]["answer"] = None
    path = write_jsonl(tmp_path / "many.jsonl", rows)
    problems = load_math_problems(path, max_rows=3, on_bad_row="skip")
    assert [p.id for p in problems] == ["many:0", "many:2", "many:3"]
    assert load_math_problems(path, max_rows=0) == []


# -- bad rows ----------------------------------------------------------------------------------------------------
BAD_ROWS = [
    ({"answer": "1"}, "problem", "missing"),
    ({"problem": "", "answer": "1"}, "problem", "empty"),
    ({"problem": "   ", "answer": "1"}, "problem", "empty"),
    ({"problem": 3, "answer": "1"}, "problem", "expected a string"),
    ({"problem": "p"}, "answer", "missing"),
    ({"problem": "p", "answer": None}, "answer", "missing"),
    ({"problem": "p", "answer": ""}, "answer", "empty"),
    ({"problem": "p", "answer": "  "}, "answer", "empty"),
    ({"problem": "p", "answer": {"value": 1}}, "answer", "got dict"),
    ({"problem": "p", "answer": True}, "answer", "True is not an answer"),
    ({"problem": "p", "answer": []}, "answer", "empty list"),
    ({"problem": "p", "answer": ["1", None]}, "answer", "None is not an answer"),
    ({"problem": "p", "answer": "1", "answers": [{"x": 1}]}, "answers", "got dict"),
    ({"problem": "p", "answer": "1", "id": ["x"]}, "id", "expected a string or integer"),
    ({"problem": "p", "answer": "1", "id": ""}, "id", "empty"),
    (["not", "an", "object"], "<row>", "expected an object"),
]


@pytest.mark.parametrize("row, field, detail", BAD_ROWS)
def test_bad_row_error_names_file_row_and_field(tmp_path, row, field, detail):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"problem": "ok", "answer": "1"}, row])
    with pytest.raises(DataError) as err:
        load_math_problems(path)
    message = str(err.value)
    assert str(path) in message and "row 1 (line 2)" in message and f"field {field!r}" in message
    assert detail in message


def test_nan_answer_in_parquet(tmp_path):
    path = write_parquet(
        tmp_path / "nan.parquet", [{"problem": "p", "answer": 1.0}, {"problem": "q", "answer": None}]
    )
    with pytest.raises(DataError, match=r"nan\.parquet: row 1: field 'answer': missing"):
        load_math_problems(path)
    path.unlink()
    write_parquet(path, [{"problem": "p", "answer": float("nan")}])
    with pytest.raises(DataError, match=r"row 0: field 'answer': nan is not a finite number"):
        load_math_problems(path)


def test_duplicate_ids_are_bad_rows(tmp_path):
    path = write_jsonl(tmp_path / "dup.jsonl", [{"id": 1, "problem": "p", "answer": "1"}] * 2)
    with pytest.raises(
        DataError, match=r"row 1 \(line 2\): field 'id': duplicate id '1' \(first seen in row 0\)"
    ):
        load_math_problems(path)


def test_bad_json_line_names_path_and_line(tmp_path):
    path = write_jsonl(
        tmp_path / "broken.jsonl", ROWS[:2], raw_lines={0: "", 2: '{"problem": "p", "answer":'}
    )
    with pytest.raises(DataError) as err:
        load_math_problems(path)
    assert f"{path}: row 1 (line 3): field '<json>': invalid JSON" in str(err.value)


def test_json_file_errors_name_the_path(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"problem": "p",\n "answer": }]')
    with pytest.raises(DataError, match=r"bad\.json: invalid JSON at line 2"):
        load_math_problems(bad)
    scalar = tmp_path / "scalar.json"
    scalar.write_text("3")
    with pytest.raises(DataError, match=r"scalar\.json: expected a JSON list"):
        load_math_problems(scalar)
    row_in_list = tmp_path / "rows.json"
    row_in_list.write_text(json.dumps([{"problem": "p", "answer": "1"}, {"problem": "q"}]))
    with pytest.raises(DataError, match=r"rows\.json: row 1: field 'answer': missing"):
        load_math_problems(row_in_list)


def test_skip_counts_logs_and_drops_bad_rows(tmp_path, caplog):
    rows = (
        [{"problem": "ok0", "answer": "1"}]
        + [row for row, _, _ in BAD_ROWS]
        + [{"problem": "ok1", "answer": 2}]
    )
    path = write_jsonl(tmp_path / "mixed.jsonl", rows, raw_lines={3: "{not json"})
    with caplog.at_level(logging.WARNING, logger="r3_rllib.envs.data"):
        problems, report = load_math_problems_with_report(path, on_bad_row="skip")
    assert [p.problem for p in problems] == ["ok0", "ok1"]
    n_bad = len(BAD_ROWS) + 1
    assert report == LoadReport(str(path), len(rows) + 1, 2, n_bad, report.skip_reasons)
    assert len(report.skip_reasons) == n_bad
    assert report.skip_reasons[0] == (
        f"{path}: row 1 (line 2): field 'problem': missing; the row's columns are 'answer' (set problem_key to read "
        "another column)"
    )
    assert "row 3 (line 4): field '<json>'" in report.skip_reasons[2]
    [record] = [r for r in caplog.records if r.name == "r3_rllib.envs.data"]
    assert f"skipped {n_bad} bad row(s) of {len(rows) + 1}" in record.getMessage()
    assert "field 'problem': missing" in record.getMessage()
    # load_math_problems returns the same list
    assert load_math_problems(path, on_bad_row="skip") == problems


def test_clean_load_reports_nothing_skipped(tmp_path, caplog):
    path = write_jsonl(tmp_path / "clean.jsonl", ROWS)
    with caplog.at_level(logging.WARNING):
        _, report = load_math_problems_with_report(path, on_bad_row="skip")
    assert (report.rows_read, report.loaded, report.skipped, report.skip_reasons) == (3, 3, 0, ())
    assert not caplog.records


# -- file-level errors -------------------------------------------------------------------------------------------
def test_missing_file(tmp_path):
    for source in (tmp_path / "nope.jsonl", str(tmp_path / "nope.jsonl"), "data/nope.parquet", "./nope"):
        with pytest.raises(DataError, match="file not found"):
            load_math_problems(source)


def test_unknown_extension_and_directory(tmp_path):
    csv = tmp_path / "set.csv"
    csv.write_text("problem,answer\np,1\n")
    with pytest.raises(
        DataError, match=r"set\.csv: unknown extension '\.csv'; expected one of \.json, \.jsonl"
    ):
        load_math_problems(csv)
    with pytest.raises(DataError, match="not a file"):
        load_math_problems(tmp_path)


def test_unreadable_files(tmp_path):
    binary = tmp_path / "latin.jsonl"
    binary.write_bytes(b'{"problem": "\xff", "answer": "1"}\n')
    with pytest.raises(DataError, match=r"latin\.jsonl: not UTF-8"):
        load_math_problems(binary)
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"corrupt\.parquet: cannot read parquet"):
        load_math_problems(corrupt)


def test_bad_options(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", ROWS)
    with pytest.raises(ValueError, match="on_bad_row must be"):
        load_math_problems(path, on_bad_row="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_rows"):
        load_math_problems(path, max_rows=-1)


# -- hub datasets (datasets.load_dataset is replaced: tests never reach the network) -------------------------------
@pytest.fixture
def fake_hub(monkeypatch):
    calls = []

    def load_dataset(name, split=None, **kwargs):
        calls.append((name, split, kwargs))
        if name == "org/missing":
            raise FileNotFoundError("Dataset 'org/missing' doesn't exist on the Hub")
        return [{"problem": "hub p", "answer": 42.0, "id": "h0"}, {"problem": "hub q", "answer": None}]

    fake = types.ModuleType("datasets")
    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    return calls


def test_hub_dataset_by_name(fake_hub, caplog):
    problems, report = load_math_problems_with_report("org/DeepMath", split="test", on_bad_row="skip")
    assert fake_hub == [("org/DeepMath", "test", {})]
    assert problems == [MathProblem("h0", "hub p", ("42",))]
    assert report.skipped == 1 and report.skip_reasons == (
        "org/DeepMath[test]: row 1: field 'answer': missing (null)",
    )
    with pytest.raises(DataError, match=r"org/DeepMath\[train\]: row 1: field 'answer'"):
        load_math_problems("org/DeepMath")


def test_hub_errors_name_the_dataset(fake_hub):
    with pytest.raises(
        DataError, match=r"hub dataset 'org/missing' \(split 'train'\): cannot load: .*doesn't exist"
    ):
        load_math_problems("org/missing")


def test_default_ids_of_hub_rows_use_the_dataset_name(fake_hub, monkeypatch):
    sys.modules["datasets"].load_dataset = lambda name, split=None: [{"problem": "p", "answer": "1"}]
    assert load_math_problems("org/some-set")[0].id == "some-set:0"


HUGE = "9" * 5001  # past Python's int/str conversion limit (4300 digits)


def test_an_over_long_json_integer_is_read_as_its_digit_string(tmp_path):
    # json.loads raised "Exceeds the limit (4300 digits)" with neither file nor row; an answer is a string anyway.
    jsonl = tmp_path / "big.jsonl"
    jsonl.write_text(f'{{"id": "a", "problem": "p", "answer": 1}}\n{{"problem": "q", "answer": {HUGE}}}\n')
    assert load_math_problems(jsonl)[1].answers == (HUGE,)
    whole = tmp_path / "big.json"
    whole.write_text(f'[{{"problem": "q", "answer": {HUGE}, "id": {HUGE}}}]')
    assert load_math_problems(whole)[0] == MathProblem(HUGE, "q", (HUGE,))


def test_an_over_long_int_handed_over_as_an_int_is_a_bad_row_naming_file_row_and_field(tmp_path, monkeypatch):
    import r3_rllib.envs.data as data

    huge = int("1" + "0" * 4000) ** 2  # an int too long to print
    monkeypatch.setattr(data, "_loads", lambda text: [{"problem": "q", "answer": huge}])
    path = tmp_path / "rows.json"
    path.write_text("[]")
    with pytest.raises(DataError, match=r"rows\.json: row 0: field 'answer': an integer with more digits"):
        load_math_problems(path)

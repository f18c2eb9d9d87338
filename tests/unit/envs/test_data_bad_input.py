"""Bad data that used to fail late or unnamed: lone surrogates, JSON nested too deeply, duplicate JSON keys,
prompt specs that fail on a row, and argument values of the wrong type (audit items 3, 4, 6, 11 and 12)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from r3_rllib.envs.data import (
    DataError,
    QueryOrder,
    load_math_problems,
    load_math_problems_with_report,
    read_rows,
)
from r3_rllib.envs.rows import Row, format_prompt, load_rows, user_text

GOOD = '{"problem": "p", "answer": "1"}\n'
# A JSON escape for a lone surrogate: it parses to a str that no tokenizer or parquet writer accepts.
SURROGATE_ROW = '{"problem": "\\ud800", "answer": "1"}\n'
# Far deeper than the JSON decoder's recursion allows.
DEEP_LINE = "[" * 100_000 + "]" * 100_000 + "\n"


def _write(tmp_path: Path, name: str, text: str) -> str:
    """Write ``text`` to ``tmp_path/name`` and return the path as a string."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_lone_surrogate_is_a_bad_row_naming_file_row_and_field(tmp_path: Path) -> None:
    path = _write(tmp_path, "sur.jsonl", GOOD + SURROGATE_ROW)
    with pytest.raises(DataError, match=r"sur\.jsonl: row 1 \(line 2\): field 'problem': not valid Unicode"):
        load_math_problems(path)
    problems, report = load_math_problems_with_report(path, on_bad_row="skip")
    assert [p.problem for p in problems] == ["p"] and report.skipped == 1


def test_a_lone_surrogate_in_an_answer_or_a_row_column_is_refused(tmp_path: Path) -> None:
    answer = _write(tmp_path, "ans.jsonl", '{"problem": "p", "answer": ["1", "\\udc00"]}\n')
    with pytest.raises(DataError, match=r"field 'answer': not valid Unicode"):
        load_math_problems(answer)
    column = _write(tmp_path, "rows.jsonl", '{"q": "ok", "meta": {"note": ["\\ud800"]}}\n')
    with pytest.raises(DataError, match=r"rows\.jsonl: row 0 \(line 1\): field 'meta': not valid Unicode"):
        load_rows(column)


def test_json_nested_too_deeply_is_a_bad_row_that_skip_mode_skips(tmp_path: Path) -> None:
    path = _write(tmp_path, "deep.jsonl", GOOD + DEEP_LINE + '{"problem": "q", "answer": "2"}\n')
    with pytest.raises(DataError, match=r"deep\.jsonl: row 1 \(line 2\): .*nested too deeply"):
        load_math_problems(path)
    problems, report = load_math_problems_with_report(path, on_bad_row="skip")
    assert [p.problem for p in problems] == ["p", "q"] and report.skipped == 1
    with pytest.raises(DataError, match=r"deep\.jsonl: row 1 \(line 2\): .*nested too deeply"):
        read_rows(path)


def test_a_json_file_nested_too_deeply_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "deep.json", DEEP_LINE)
    with pytest.raises(DataError, match=r"deep\.json: invalid JSON: nested too deeply"):
        load_math_problems(path)


def test_a_key_written_twice_in_a_json_row_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "dup.jsonl", '{"problem": "p", "answer": "1", "answer": "2"}\n')
    with pytest.raises(DataError, match=r"row 0 \(line 1\): field 'answer': the key appears twice"):
        load_math_problems(path)
    with pytest.raises(DataError, match=r"field 'answer': the key appears twice"):
        load_rows(path)


def test_a_template_indexing_a_string_column_names_the_row() -> None:
    row = Row("r0", {"q": "text"}, "rows: row 0")
    with pytest.raises(DataError, match=r"rows: row 0: prompt template '\{q\[x\]\}': TypeError"):
        format_prompt("{q[x]}", row)


def test_a_prompt_callable_that_raises_is_a_data_error_naming_the_row() -> None:
    row = Row("r0", {"q": "text"}, "rows: row 3")

    def prompt(values: dict) -> str:
        """Reads a column the row lacks."""
        return values["missing"]

    with pytest.raises(
        DataError, match=r"rows: row 3: prompt callable .*prompt raised KeyError: 'missing'"
    ) as info:
        format_prompt(prompt, row)
    assert isinstance(info.value.__cause__, KeyError)  # the user's traceback is kept


def test_a_prompt_callable_returning_a_lone_surrogate_is_refused() -> None:
    row = Row("r0", {"q": "text"}, "rows: row 0")
    with pytest.raises(DataError, match=r"rows: row 0: the prompt is not valid Unicode"):
        format_prompt(lambda values: "\ud800", row)


def test_user_text_of_no_messages_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="non-empty list of messages"):
        user_text([])


def test_max_rows_of_the_wrong_type_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "ok.jsonl", GOOD)
    with pytest.raises(TypeError, match=r"max_rows must be an int >= 0 or None, got str '3'"):
        load_math_problems(path, max_rows="3")  # type: ignore[arg-type]


@pytest.mark.parametrize("source", [None, 5])
def test_a_source_that_is_not_a_path_or_name_is_refused_without_a_hub_lookup(
    source: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_hub(*args: object, **kwargs: object) -> None:
        """The hub must not be asked (it retries for ~25 s before failing)."""
        raise AssertionError("looked up on the hub")

    monkeypatch.setattr("r3_rllib.envs.data._read_hub", no_hub)
    with pytest.raises(TypeError, match="a data source is a file path or a hub dataset name"):
        load_math_problems(source)  # type: ignore[arg-type]


def test_shuffle_must_be_a_bool_and_seed_an_integer() -> None:
    with pytest.raises(TypeError, match=r"shuffle must be true or false, got str 'false'"):
        QueryOrder(3, shuffle="false")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"seed must be an integer, got str 'abc'"):
        QueryOrder(3, seed="abc")  # type: ignore[arg-type]
    assert QueryOrder(3, shuffle=False).global_order(0) == [0, 1, 2]


@pytest.mark.parametrize(
    ("state", "says"),
    [
        ([1, 2], "must be a mapping"),
        ({"cursor": 1.7, "epoch": 0}, "'cursor' must be a whole number"),
        ({"cursor": 1, "epoch": "0"}, "'epoch' must be a whole number"),
        ({"cursor": True, "epoch": 0}, "'cursor' must be a whole number"),
        ({"epoch": 0}, "lacks 'cursor' or 'epoch'"),
    ],
)
def test_a_damaged_data_order_state_is_named(state, says):
    """A checkpoint's data position is restored exactly or refused: 1.7 was truncated to 1, a missing key was a
    bare KeyError."""
    from r3_rllib.envs.data import QueryOrder

    order = QueryOrder(8, seed=0)
    with pytest.raises(ValueError, match=says):
        order.set_state(state)
    order.set_state({"cursor": np.int64(3), "epoch": 1, "size": 8})  # numpy integers, as a state may hold
    assert (order.cursor, order.epoch) == (3, 1)

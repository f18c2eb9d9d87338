"""Bad input to the data loaders and the math/reward_fn envs that used to pass silently or fail with a bare
traceback: a key written twice in a nested JSON object, a ``split_seed`` that is not an integer, a data source that
gives no problem among several, and env options of the wrong type (``length_bonus_max_tokens="5"`` and its
siblings)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from char_tokenizer import CharTokenizer

from r3_rllib.envs.data import DataError, load_math_problems, load_math_problems_with_report
from r3_rllib.envs.math_env import MathEnv
from r3_rllib.envs.reward_fn import RewardFnEnv
from r3_rllib.envs.rows import load_rows, split_rows

GOOD = '{"problem": "p", "answer": "1"}\n'
NESTED_DUP = (
    '{"problem": "q", "answer": "2", "prompt": [{"role": "user", "role": "system", "content": "x"}]}\n'
)
ROWS = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(10)]


def _write(tmp_path: Path, name: str, text: str) -> str:
    """Write ``text`` to ``tmp_path/name`` and return the path as a string."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _reward(prompt: str, completion: str, **row: object) -> float:
    return 1.0


# -- 1. a key written twice at any depth of a JSON row ----------------------------------------------------------
def test_a_key_written_twice_in_a_nested_object_names_the_row_and_the_key_path(tmp_path: Path) -> None:
    path = _write(tmp_path, "nested.jsonl", GOOD + NESTED_DUP)
    says = r"nested\.jsonl: row 1 \(line 2\): field 'prompt\[0\]\.role': the key appears twice"
    with pytest.raises(DataError, match=says):
        load_math_problems(path)
    with pytest.raises(DataError, match=says):
        load_rows(path)
    problems, report = load_math_problems_with_report(path, on_bad_row="skip")
    assert [p.problem for p in problems] == ["p"] and report.skipped == 1


@pytest.mark.parametrize(
    ("row", "key_path"),
    [
        ({"meta": '{"a": {"b": 1, "b": 2}}'}, r"meta\.a\.b"),
        ({"meta": '[[{"x": 1}], [{"y": 1, "y": 2}]]'}, r"meta\[1\]\[0\]\.y"),
        ({"meta": '{"the key": {"k k": 1, "k k": 2}}'}, r'meta\["the key"\]\["k k"\]'),
    ],
)
def test_the_key_path_names_objects_and_list_positions_at_any_depth(tmp_path: Path, row, key_path) -> None:
    line = '{"problem": "p", "answer": "1", "meta": ' + row["meta"] + "}\n"
    path = _write(tmp_path, "deep.jsonl", line)
    with pytest.raises(DataError, match=rf"row 0 \(line 1\): field '{key_path}': the key appears twice"):
        load_math_problems(path)


def test_a_nested_duplicate_in_a_json_file_names_the_row(tmp_path: Path) -> None:
    rows = [json.loads(GOOD), json.loads(GOOD.replace('"1"', '"2"'))]
    text = json.dumps({"data": rows})[:-2] + ", " + NESTED_DUP.strip() + "]}"
    path = _write(tmp_path, "rows.json", text)
    with pytest.raises(
        DataError, match=r"rows\.json: row 2: field 'prompt\[0\]\.role': the key appears twice"
    ):
        load_math_problems(path)


def test_a_data_key_written_twice_at_the_top_of_a_json_file_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "twice.json", '{"data": [' + GOOD.strip() + '], "data": []}')
    with pytest.raises(DataError, match=r"twice\.json: the top-level key 'data' appears twice"):
        load_math_problems(path)


def test_nested_objects_without_duplicates_load_as_plain_dicts(tmp_path: Path) -> None:
    line = '{"q": "x", "prompt": [{"role": "user", "content": "x"}], "meta": {"a": [1, [2, {"b": 3}]]}}\n'
    (row,) = load_rows(_write(tmp_path, "ok.jsonl", line))
    assert row.values["meta"] == {"a": [1, [2, {"b": 3}]]}
    assert type(row.values["prompt"][0]) is dict


# -- 2. split_seed ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [[1], "1", 1.5, True, None])
def test_a_split_seed_that_is_not_an_integer_is_named(bad) -> None:
    with pytest.raises(
        ValueError, match=r"^split_seed \(the draw of the held-out rows\) must be an integer, got "
    ):
        split_rows(ROWS, split="train", split_seed=bad)
    with pytest.raises(ValueError, match=r"^split_seed .* must be an integer"):
        RewardFnEnv(data=ROWS, reward=_reward, split_seed=bad)


def test_a_numpy_integer_split_seed_draws_as_the_int() -> None:
    ids = [r.id for r in split_rows(ROWS, split="test", split_seed=np.int64(3))]
    assert ids == [r.id for r in split_rows(ROWS, split="test", split_seed=3)]


# -- 3. a source that gives no problem --------------------------------------------------------------------------
def test_an_empty_source_among_several_is_named(tmp_path: Path) -> None:
    good = _write(tmp_path, "good.jsonl", GOOD)
    empty = _write(tmp_path, "empty.jsonl", "\n")
    for data in ([good, empty], [empty, good], {"train": [good, empty]}):
        with pytest.raises(DataError, match=r"empty\.jsonl: no problems: the source has no rows"):
            MathEnv(data=data)
    with pytest.raises(DataError, match=r"empty\.jsonl: no problems: the source has no rows"):
        MathEnv(data=empty)


def test_a_source_whose_rows_are_all_skipped_is_named(tmp_path: Path) -> None:
    good = _write(tmp_path, "good.jsonl", GOOD)
    bad = _write(tmp_path, "bad.jsonl", '{"problem": "p"}\n{"answer": "1"}\n')
    says = (
        r"bad\.jsonl: no problems: all 2 row\(s\) are bad and were skipped.*first: .*field 'answer': missing"
    )
    with pytest.raises(DataError, match=says):
        MathEnv(data=[good, bad], on_bad_row="skip")


def test_several_sources_with_problems_still_load(tmp_path: Path) -> None:
    one = _write(tmp_path, "one.jsonl", GOOD)
    two = _write(tmp_path, "two.jsonl", GOOD)
    assert MathEnv(data=[one, two]).query_ids == ["one:0", "two:0"]


# -- 4. env options of the wrong type ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("option", "bad", "says"),
    [
        (
            "length_bonus_max_tokens",
            "5",
            "length_bonus_max_tokens must be an integer >= 1 or None, got str '5'",
        ),
        (
            "length_bonus_max_tokens",
            True,
            "length_bonus_max_tokens must be an integer >= 1 or None, got bool",
        ),
        ("length_bonus_max_tokens", float("nan"), "length_bonus_max_tokens must be an integer >= 1 or None"),
        ("length_bonus_max_tokens", 0, "length_bonus_max_tokens must be an integer >= 1 or None, got int 0"),
        ("max_prompt_tokens", "5", "max_prompt_tokens must be an integer >= 1 or None, got str"),
        ("max_prompt_tokens", True, "max_prompt_tokens must be an integer >= 1 or None, got bool"),
        ("max_prompt_tokens", float("nan"), "max_prompt_tokens must be an integer >= 1 or None, got float"),
        ("model_max_positions", "100", "model_max_positions must be an integer >= 1 or None, got str"),
        (
            "model_max_positions",
            float("nan"),
            "model_max_positions must be an integer >= 1 or None, got float",
        ),
        ("max_new_tokens", "5", "max_new_tokens must be an integer >= 0, got str '5'"),
        ("max_new_tokens", 2.7, "max_new_tokens must be an integer >= 0, got float"),
        ("max_new_tokens", True, "max_new_tokens must be an integer >= 0, got bool"),
        ("max_new_tokens", None, "max_new_tokens must be an integer >= 0, got NoneType"),
        ("prompt_template", 5, r"prompt_template must contain '\{problem\}' \(a string\), got 5"),
        ("system_prompt", 5, "system_prompt must be a string or None, got int 5"),
        ("think_in_prompt", "no", "think_in_prompt must be true, false or None .*got str 'no'"),
    ],
)
def test_math_env_options_of_the_wrong_type_are_named(tmp_path: Path, option, bad, says) -> None:
    path = _write(tmp_path, "rows.jsonl", GOOD)
    with pytest.raises(ValueError, match=f"^{says}"):
        MathEnv(data=path, tokenizer=CharTokenizer(), apply_chat_template="none", **{option: bad})


def test_math_env_options_of_the_right_type_still_build(tmp_path: Path) -> None:
    env = MathEnv(
        data=_write(tmp_path, "rows.jsonl", GOOD),
        tokenizer=CharTokenizer(),
        apply_chat_template="none",
        length_bonus_max_tokens=np.int64(8),
        max_prompt_tokens=500,
        model_max_positions=1000,
        max_new_tokens=0,
        system_prompt="Be brief.",
        think_in_prompt=False,
    )
    assert env.length_bonus_max_tokens == 8 and len(env) == 1


@pytest.mark.parametrize(
    ("option", "bad", "says"),
    [
        (
            "length_bonus_max_tokens",
            "5",
            "length_bonus_max_tokens must be an integer >= 1 or None, got str '5'",
        ),
        ("length_bonus_max_tokens", float("nan"), "length_bonus_max_tokens must be an integer >= 1 or None"),
        ("num_queries", 2.0, "num_queries must be an integer >= 1, got float 2.0"),
    ],
)
def test_arithmetic_env_options_of_the_wrong_type_are_named(option, bad, says) -> None:
    from r3_rllib.envs.arithmetic import ArithmeticEnv

    with pytest.raises(ValueError, match=f"^{says}"):
        ArithmeticEnv(**{option: bad})


@pytest.mark.parametrize(
    ("option", "bad", "says"),
    [
        ("max_new_tokens", "5", "max_new_tokens must be an integer >= 0, got str '5'"),
        ("model_max_positions", "100", "model_max_positions must be an integer >= 1 or None, got str"),
        (
            "model_max_positions",
            float("nan"),
            "model_max_positions must be an integer >= 1 or None, got float",
        ),
        ("system_prompt", 5, "env_config 'system_prompt' must be a string or None, got int 5"),
    ],
)
def test_reward_fn_env_context_options_of_the_wrong_type_are_named(option, bad, says) -> None:
    with pytest.raises(ValueError, match=f"^{says}"):
        RewardFnEnv(data=ROWS, reward=_reward, **{option: bad})

"""The judges' verdict parsing (r3_rllib/core/verdicts.py) on hand-written judge texts: the accepted forms, garbage,
two verdicts, numbers out of range, NaN, empty texts."""

from __future__ import annotations

import pytest

from r3_rllib.core.verdicts import parse_group_scores, parse_verdict, unit_score


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Verdict: correct", 1.0),
        ("Verdict: incorrect", 0.0),
        ("The response says 12, the gold is 12.\nVerdict: correct", 1.0),
        ("It says 11 but the answer is 12.\n\nVerdict: incorrect\n", 0.0),
        ("verdict: CORRECT", 1.0),
        ("VERDICT:incorrect.", 0.0),
        ("**Verdict:** Correct", 1.0),
        ("**Verdict: incorrect**", 0.0),
        ("> Verdict: `correct`", 1.0),
        ("### Verdict: correct!", 1.0),
        ("  Verdict :  correct  ", 1.0),
        ("Verdict: 0.75", 0.75),
        ("Verdict: 1", 1.0),
        ("Verdict: 0", 0.0),
        ("Verdict: .5", 0.5),
        ("Verdict: 1.0.", 1.0),
        ("Verdict: 0.0", 0.0),
        # two verdicts: the last line that begins with Verdict: decides, text after it is ignored
        ("Verdict: correct\nOn second thought, no.\nVerdict: incorrect", 0.0),
        ("Verdict: incorrect\nWait, 3 + 4 is 7.\nVerdict: correct", 1.0),
        ("Verdict: correct\nThe response is well written.", 1.0),
    ],
)
def test_accepted_verdicts(text, expected):
    assert parse_verdict(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n\n",
        "correct",
        "The answer is correct.",
        "I think it is right. Score: 1",
        "Verdict:",
        "Verdict: ",
        "Verdict: correct or incorrect",
        "Verdict: correct (the answer is 12)",
        "Verdict: right",
        "Verdict: 1.5",
        "Verdict: -0.1",
        "Verdict: 7/10",
        "Verdict: 80%",
        "Verdict: nan",
        "Verdict: NaN",
        "Verdict: inf",
        "Verdict: 1e-3",
        "Verdict: correct correct",
        # the last verdict line decides even when an earlier one parsed
        "Verdict: correct\nVerdict: maybe",
        "The verdict: correct",
        "#$%^&*(\x00\x01 garbage \ufffd",
        "ਹਾਂ Verdict correct",
    ],
)
def test_unparsable_verdicts(text):
    assert parse_verdict(text) is None


def test_parse_verdict_takes_only_strings():
    assert parse_verdict(None) is None  # type: ignore[arg-type]
    assert parse_verdict(1.0) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value, expected",
    [(0, 0.0), (1, 1.0), (0.25, 0.25), (True, None), (False, None), ("0.5", None), (None, None)]
    + [(float("nan"), None), (float("inf"), None), (1.0000001, None), (-1e-9, None)],
)
def test_unit_score(value, expected):
    assert unit_score(value) == expected


@pytest.mark.parametrize(
    "text, n, expected",
    [
        ('{"scores": [0.1, 0.9, 0.5]}', 3, [0.1, 0.9, 0.5]),
        ('Reasoning first.\n```json\n{"scores": [1, 0]}\n```', 2, [1.0, 0.0]),
        ('{"scores": [{"id": 2, "score": 0.3}, {"id": 1, "score": 0.8}]}', 2, [0.8, 0.3]),
        ('{"scores": [{"id": "1", "score": 0.2}, {"id": "2", "score": 0.4}]}', 2, [0.2, 0.4]),
        ('{"scores": [{"score": 0.6, "explanation": "ok"}, {"score": 0.1}]}', 2, [0.6, 0.1]),
        ("[0.5, 0.25, 1]", 3, [0.5, 0.25, 1.0]),
        ('{"1": 0.7, "2": 0.0}', 2, [0.7, 0.0]),
        ('{"2": 0.7, "1": 0.0}', 2, [0.0, 0.7]),
        # the last JSON value of an accepted shape is the answer; other JSON is skipped
        ('{"scores": [0, 0]} no, revised: {"scores": [1, 0.5]}', 2, [1.0, 0.5]),
        ('{"scores": [0.3, 0.4]}\n{"note": "done"}', 2, [0.3, 0.4]),
        # the fallback: one line per response
        ("Response 1: 0.9\nResponse 2: 0.1\n**Response 3:** 0.5", 3, [0.9, 0.1, 0.5]),
        ("response #2 = 1\nresponse #1 = 0", 2, [0.0, 1.0]),
        ('{"scores": [0.5]}', 1, [0.5]),
    ],
)
def test_accepted_group_scores(text, n, expected):
    assert parse_group_scores(text, n) == expected


@pytest.mark.parametrize(
    "text, n",
    [
        ("", 2),
        ("garbage \x00 {{{ [[[", 2),
        ('{"scores": [0.1, 0.9]}', 3),  # wrong count
        ('{"scores": [0.1, 0.9, 0.5, 0.2]}', 3),
        ('{"scores": [0.1, 1.5]}', 2),  # out of range
        ('{"scores": [0.1, -0.5]}', 2),
        ('{"scores": [0.1, NaN]}', 2),  # json accepts NaN; a score must be finite
        ('{"scores": [0.1, Infinity]}', 2),
        ('{"scores": [true, false]}', 2),
        ('{"scores": ["0.1", "0.2"]}', 2),
        ('{"scores": [0.1, null]}', 2),
        ('{"scores": "0.1, 0.2"}', 2),
        ('{"scores": [{"id": 1, "score": 0.1}, {"id": 1, "score": 0.2}]}', 2),  # repeated id
        ('{"scores": [{"id": 1, "score": 0.1}, {"id": 3, "score": 0.2}]}', 2),
        ('{"1": 0.5, "3": 0.5}', 2),
        # a well-formed last answer with the wrong count is not rescued by an earlier one
        ('{"scores": [0.2, 0.3]} then {"scores": [0.2]}', 2),
        ("Response 1: 0.9\nResponse 1: 0.2\nResponse 2: 0.1", 2),  # a response named twice
        ("Response 1: 0.9", 2),  # one missing
        ("Response 1: 0.9\nResponse 2: 2", 2),
        ('{"scores": [0.5, 0.5]}', 0),
    ],
)
def test_unparsable_group_scores(text, n):
    assert parse_group_scores(text, n) is None

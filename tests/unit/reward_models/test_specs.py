"""The config's reward_models list parsed into specs (reward_models/specs.py) and the scorer dispatch."""

import pytest

from r3_rllib.reward_models import SCORER_CLASSES, build_scorer
from r3_rllib.reward_models.specs import (
    SCORER_TYPES,
    RewardModelsError,
    RewardModelSpec,
    parse_reward_models,
)

RULE = {"name": "fmt", "type": "rule", "function": "tests.unit.reward_models.scorers:length_score"}


def test_parses_entries_in_order_with_defaults():
    specs = parse_reward_models([RULE, {"name": "j", "type": "judge", "model": "m", "weight": 2}])
    assert [s.name for s in specs] == ["fmt", "j"]
    assert specs[0] == RewardModelSpec(name="fmt", type="rule", function=RULE["function"])
    assert specs[1].weight == 2.0 and isinstance(specs[1].weight, float)
    assert parse_reward_models([{"name": "m", "type": "rule", "function": "math"}])[0].function == "math"
    assert parse_reward_models(None) == []
    assert parse_reward_models([specs[0]]) == [specs[0]]


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"name": "x"}, "reward_models must be a list"),
        (["x"], r"reward_models\[0\] must be a dict"),
        ([{**RULE, "wieght": 1}], r"reward_models\[0\] \('fmt'\): unknown field\(s\) \['wieght'\]"),
        ([{"type": "rule", "function": "a:b"}], r"reward_models\[0\]: field 'name' is missing"),
        ([{**RULE, "type": "oracle"}], r"\('fmt'\): field 'type' must be one of"),
        ([{"name": "j", "type": "judge"}], r"\('j'\): a 'judge' term needs field 'model'"),
        ([{"name": "r", "type": "rule"}], r"\('r'\): a 'rule' term needs field 'function'"),
        ([{**RULE, "function": "nocolon"}], "must be 'module:name'"),
        ([{**RULE, "weight": "high"}], r"field 'weight' must be a finite number, got 'high'"),
        ([{**RULE, "weight": float("inf")}], r"field 'weight' must be a finite number"),
        ([{**RULE, "weight": True}], r"field 'weight' must be a finite number"),
        ([{**RULE, "gate": "yes"}], r"field 'gate' must be true or false"),
        ([{**RULE, "batch_size": 0}], r"field 'batch_size' must be an int >= 1"),
        ([{**RULE, "engine": "tgi"}], r"field 'engine' must be 'hf' or 'vllm'"),
        ([RULE, RULE], r"reward_models\[1\]: the name 'fmt' is used by an earlier term"),
    ],
)
def test_errors_name_the_entry_and_the_field(entries, message):
    with pytest.raises(RewardModelsError, match=message):
        parse_reward_models(entries)


def test_every_type_has_a_scorer_class():
    assert set(SCORER_CLASSES) == set(SCORER_TYPES)


def test_build_scorer_refuses_an_unknown_type():
    with pytest.raises(ValueError, match="unknown type 'oracle'"):
        build_scorer(RewardModelSpec(name="x", type="oracle"))

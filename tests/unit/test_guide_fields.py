"""The guide for TRL and verl users (docs/coming_from_trl_and_verl.md) names our settings in its tables: every
``training.<field>`` it names is a field, and every ``<field>: <value>`` it gives passes that field's own rule (a
choice it accepts, a number in its range), so a row cannot send a user to a setting that is gone or renamed."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from r3_rllib import R3Config
from r3_rllib.config.field import field_rule
from r3_rllib.config.settings import RLLIB_FIELD_RULES, R3Settings

GUIDE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "coming_from_trl_and_verl.md")
FIELDS = {f.name: f for f in dataclasses.fields(R3Settings)}
#: What `.training()` takes: our fields and RLlib's own (lr, num_epochs, grad_clip, ...).
KNOWN = set(FIELDS) | {name for name in vars(R3Config()) if not name.startswith("_")}


def _rule(name: str):
    return field_rule(FIELDS[name]) if name in FIELDS else RLLIB_FIELD_RULES.get(name)


#: ``training.name`` (a trailing ``*`` names a family of fields by their prefix).
QUALIFIED = re.compile(r"training\.([a-z_]+)(\*?)")
#: ``name: value`` with a plain word or number as the value (structured values are left to the prose).
SETTING = re.compile(r"^(?:training\.)?([a-z_]+): ([A-Za-z0-9_.+-]+)$")


def _code_spans() -> list[str]:
    """The backticked spans of the guide's table rows (their our-side and note columns)."""
    spans = []
    with open(GUIDE) as f:
        for line in f:
            if line.startswith("|") and not line.startswith("|---"):
                cells = line.split(" | ")
                spans += re.findall(r"`([^`]+)`", " | ".join(cells[1:]))
    return spans


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "null": None}.get(text, text)


def test_the_guide_names_fields_that_exist():
    spans = _code_spans()
    assert len(spans) > 50, "the guide's tables were not found"
    named = [(m.group(1), m.group(2)) for span in spans for m in QUALIFIED.finditer(span)]
    missing = [
        name
        for name, star in named
        if not (name in KNOWN or (star and any(f.startswith(name) for f in KNOWN)))
    ]
    assert named and not missing, f"the guide names training fields that do not exist: {missing}"


def test_the_guides_settings_pass_their_fields_rules():
    checked, broken = 0, []
    for span in _code_spans():
        m = SETTING.match(span.strip())
        if m is None or m.group(1) not in KNOWN:
            continue  # another object's key (`rollout_is: token` is a field; `env: reward_fn` is not)
        name, value = m.group(1), _value(m.group(2))
        rule = _rule(name)
        checked += 1
        message = None if rule is None else rule.error(name, value)
        if message is not None:
            broken.append(message)
    assert checked >= 10 and not broken, broken


@pytest.mark.parametrize("span", ["training.kl_coefs", "loss_agg_mode: token-means"])
def test_a_wrong_name_or_value_would_be_caught(span):
    m = QUALIFIED.search(span)
    if m is not None:
        assert m.group(1) not in KNOWN
        return
    name, value = SETTING.match(span).groups()
    assert _rule(name).error(name, value) is not None

"""The one registry implementation: declarations, non-decorator registration, entry points, copies."""

from __future__ import annotations

import json
from importlib.metadata import EntryPoint

import pytest

from r3_rllib.core.registry import Registry


def double(x):
    return 2 * x


def triple(x):
    return 3 * x


def test_register_declares_and_refuses_a_second_entry():
    reg = Registry("thing")
    reg.register("double", config_params={"x": "field"})(double)
    assert reg.get_fn("double") is double and reg.config_params["double"] == {"x": "field"}
    with pytest.raises(ValueError, match="thing 'double' is already registered"):
        reg.register("double")(triple)
    with pytest.raises(KeyError, match=r"unknown thing 'nope'; known: \['double'\]"):
        reg.get_fn("nope")


def test_add_is_idempotent_and_overwrites_only_when_asked():
    reg = Registry("thing")
    reg.add("f", double)
    reg.add("f", double)  # the same function again: a no-op
    with pytest.raises(
        ValueError, match=r"thing 'f' is already registered \(.*double\); pass overwrite=True"
    ):
        reg.add("f", triple)
    reg.add("f", triple, overwrite=True)
    assert reg["f"] is triple and reg.config_params["f"] == {}


def test_entry_points_are_listed_loaded_once_and_protected():
    ep = EntryPoint(name="plugin", value="json:dumps", group="g")
    reg = Registry("thing", entry_points=lambda: {"plugin": ep})
    assert reg.names() == ["plugin"] and "plugin" not in reg
    assert reg.load_declared("plugin") is json.dumps and "plugin" not in reg
    assert reg.get_fn("plugin") is json.dumps and "plugin" in reg
    fresh = Registry("thing", entry_points=lambda: {"plugin": ep})
    with pytest.raises(ValueError, match="already registered"):
        fresh.add("plugin", triple)


def test_copy_and_pop_keep_declarations_in_step():
    reg = Registry("thing")
    reg.register("d", sample_inputs=("obs_keys",))(double)
    other = reg.copy()
    assert isinstance(other, Registry) and other.sample_inputs == {"d": ("obs_keys",)}
    assert other.pop("d") is double and "d" not in other.sample_inputs
    assert "d" in reg and reg.sample_inputs["d"] == ("obs_keys",)
    assert other.pop("missing", None) is None

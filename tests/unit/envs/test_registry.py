"""The text-env registry: registration rules, entry-point discovery, unknown-name errors."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from r3_rllib.envs import registry
from r3_rllib.envs.arithmetic import ArithmeticEnv
from r3_rllib.envs.math_env import MathEnv
from r3_rllib.envs.registry import (
    ENTRY_POINT_GROUP,
    get_text_env_factory,
    make_text_env,
    register_text_env,
    registered_text_envs,
)


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", registry.new_text_env_registry())


def tiny_arithmetic(**config):
    return ArithmeticEnv(num_queries=3, **config)


def test_builtin_envs_are_known_without_installed_metadata(monkeypatch):
    """A checkout on PYTHONPATH, or shipped by Ray's runtime_env working_dir, has no installed entry points: the
    package's own envs are found from its code, in every process, without a register call. (Found on a GPU
    machine where the checkout ran from PYTHONPATH: every EnvRunner failed with "unknown text env 'arithmetic'".)"""
    monkeypatch.setattr(registry, "_entry_points", dict)
    assert set(registry.BUILT_IN_TEXT_ENVS) == set(registered_text_envs())
    assert {"arithmetic", "math", "gridworld", "reward_fn"} <= set(registered_text_envs())
    assert get_text_env_factory("arithmetic") is ArithmeticEnv
    assert get_text_env_factory("math") is MathEnv
    env = make_text_env("arithmetic", num_queries=4, digits=1)
    assert isinstance(env, ArithmeticEnv) and len(env) == 4


def test_register_and_make():
    register_text_env("tiny", tiny_arithmetic)
    assert "tiny" in registered_text_envs()
    env = make_text_env("tiny", seed=5)
    assert isinstance(env, ArithmeticEnv) and len(env) == 3
    register_text_env("tiny", tiny_arithmetic)  # the same factory again: a no-op


def test_conflicting_registration_needs_overwrite():
    register_text_env("tiny", tiny_arithmetic)
    other = lambda **config: ArithmeticEnv(num_queries=5, **config)  # noqa: E731
    with pytest.raises(ValueError, match=r"text env 'tiny' is already registered .*overwrite=True"):
        register_text_env("tiny", other)
    register_text_env("tiny", other, overwrite=True)
    assert len(make_text_env("tiny")) == 5


def test_entry_point_names_are_protected_too():
    with pytest.raises(
        ValueError, match=r"text env 'math' is already registered \(r3_rllib\.envs\.math_env\.MathEnv\)"
    ):
        register_text_env("math", tiny_arithmetic)
    register_text_env("math", MathEnv)  # the entry point's own factory is fine
    register_text_env("math", tiny_arithmetic, overwrite=True)
    assert get_text_env_factory("math") is tiny_arithmetic


def test_unknown_name_lists_known_names_and_the_closest_match():
    register_text_env("countdown", tiny_arithmetic)
    with pytest.raises(ValueError) as err:
        make_text_env("arithmatic")
    message = str(err.value)
    # Every name: this registration and the installed entry points (arithmetic, math and the package's others).
    known = ", ".join(registered_text_envs())
    assert "countdown" in known and "arithmetic" in known
    assert "unknown text env 'arithmatic'" in message
    assert f"known: {known};" in message
    assert "did you mean 'arithmetic'?" in message
    with pytest.raises(
        ValueError, match=rf"unknown text env 'zzz'; known: {known} \(an env of your own .*'module:Class'\)$"
    ):
        make_text_env("zzz")


def test_plugin_entry_points_are_discovered(monkeypatch):
    plugin = EntryPoint(
        name="plugin", value="r3_rllib.envs.arithmetic:ArithmeticEnv", group=ENTRY_POINT_GROUP
    )
    broken = EntryPoint(name="broken", value="no_such_package.envs:Env", group=ENTRY_POINT_GROUP)
    taken = EntryPoint(name="math", value="no_such_package.envs:Math", group=ENTRY_POINT_GROUP)
    monkeypatch.setattr(
        registry, "_entry_points", lambda: {"plugin": plugin, "broken": broken, "math": taken}
    )
    assert registered_text_envs() == sorted({"broken", "plugin", *registry.BUILT_IN_TEXT_ENVS})
    assert get_text_env_factory("math") is MathEnv  # a plugin does not take a built-in name
    assert isinstance(make_text_env("plugin", num_queries=2), ArithmeticEnv)
    with pytest.raises(
        ImportError, match=r"text env 'broken': cannot load entry point 'no_such_package\.envs:Env'"
    ):
        make_text_env("broken")


def test_bad_factories():
    with pytest.raises(TypeError, match="must be callable"):
        register_text_env("x", "not callable")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty string"):
        register_text_env("", tiny_arithmetic)
    register_text_env("not_an_env", lambda **config: object())
    with pytest.raises(TypeError, match="factory returned object, not a TextEnv"):
        make_text_env("not_an_env")

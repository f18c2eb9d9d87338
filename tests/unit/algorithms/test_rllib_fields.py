"""Every inherited RLlib setting is either read by an R3 run or refused when changed (config/rllib_fields.py)."""

from __future__ import annotations

import pytest
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

from r3_rllib import R3Config
from r3_rllib.config.rllib_fields import (
    DEPRECATED_VALUE,
    IGNORED_RLLIB_FIELDS,
    USED_RLLIB_FIELDS,
    ignored_field_errors,
    rllib_field_defaults,
)

_RLLIB_DEFAULTS = vars(AlgorithmConfig())


def _is_deprecated(value: object) -> bool:
    return type(value) is int and value == DEPRECATED_VALUE


def _changed(value: object) -> object:
    """A value other than ``value`` of a plausible type (what a user might set)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 7
    if isinstance(value, str):
        return value + "_other"
    if isinstance(value, dict):
        return {**value, "r3_test_key": 1}
    if isinstance(value, list):
        return [*value, "r3_test_item"]
    return "r3_test_value"  # None, a class or a function: any other object


def test_every_rllib_setting_is_classified():
    """A setting RLlib adds in an upgrade fails here until it is declared used (with what reads it) or ignored
    (with what to use instead)."""
    unclassified = sorted(
        name
        for name, value in _RLLIB_DEFAULTS.items()
        if name not in USED_RLLIB_FIELDS and name not in IGNORED_RLLIB_FIELDS and not _is_deprecated(value)
    )
    assert unclassified == [], (
        f"classify these RLlib settings in r3_rllib/config/rllib_fields.py: {unclassified}"
    )
    assert not set(USED_RLLIB_FIELDS) & set(IGNORED_RLLIB_FIELDS)
    stale = sorted((set(USED_RLLIB_FIELDS) | set(IGNORED_RLLIB_FIELDS)) - set(_RLLIB_DEFAULTS))
    assert stale == [], f"no longer RLlib settings: {stale}"


@pytest.mark.parametrize("name", sorted(IGNORED_RLLIB_FIELDS))
def test_ignored_setting_is_refused_with_what_to_use(name):
    config = R3Config()
    setattr(config, name, _changed(getattr(config, name)))
    with pytest.raises(ValueError, match=rf"RLlib's {name}=.*no effect on an R3 run.*instead: "):
        config.validate()


def test_deprecated_settings_are_refused_when_changed():
    deprecated = [n for n, v in _RLLIB_DEFAULTS.items() if _is_deprecated(v) and n not in USED_RLLIB_FIELDS]
    assert deprecated
    defaults = rllib_field_defaults(vars(R3Config()))
    config = R3Config()
    for name in deprecated:
        setattr(config, name, 5)
    errors = ignored_field_errors(config, defaults)
    assert len(errors) == len(deprecated)
    assert all("a deprecated RLlib setting that nothing reads" in e for e in errors)


@pytest.mark.parametrize(
    ("builder", "kwargs", "instead"),
    [
        ("training", {"train_batch_size": 4096}, "queries_per_iteration x group_size"),
        ("training", {"minibatch_size": 64}, "num_minibatches"),
        ("training", {"gamma": 0.9}, "step_gamma"),
        ("env_runners", {"sample_timeout_s": 5.0}, "rollout_timeout_s"),
        ("evaluation", {"evaluation_interval": 2}, "eval_interval"),
    ],
)
def test_builder_methods_refuse_ignored_settings_at_validate(builder, kwargs, instead):
    config = getattr(R3Config.grpo_preset(), builder)(**kwargs)
    with pytest.raises(ValueError, match=instead):
        config.validate()


def test_a_default_config_and_its_copies_validate():
    """RLlib copies a config (Algorithm.__init__: from_state(get_state()); Tune: to_dict/from_dict); the copies
    must not look changed (RLlib turns each PolicySpec into a tuple in the state)."""
    config = R3Config.grpo_preset().training(group_size=4, queries_per_iteration=4)
    config.validate()
    R3Config.from_state(config.get_state()).validate()
    R3Config.from_dict(config.to_dict()).validate()


def test_rllibs_evaluation_copy_validates():
    """Algorithm.setup validates RLlib's evaluation copy (batch_mode, rollout_fragment_length set by RLlib)."""
    R3Config.grpo_preset().get_evaluation_config_object().validate()


@pytest.mark.parametrize("top_k", [1, 20])
def test_r3_settings_are_not_taken_for_deprecated_rllib_ones(top_k):
    """``top_k``'s default -1 ("off") equals RLlib's deprecated marker; R3's own settings stay settable (a run
    file's ``training: {top_k: 20}`` was refused as a deprecated RLlib setting before)."""
    from r3_rllib.config import default_values

    config = R3Config().training(top_k=top_k)
    config.validate()
    assert config.top_k == top_k
    defaults = rllib_field_defaults(vars(R3Config()))
    own_markers = [n for n, v in default_values().items() if _is_deprecated(v)]
    assert own_markers == ["top_k"]
    assert not ignored_field_errors(config, {n: v for n, v in defaults.items() if n not in default_values()})

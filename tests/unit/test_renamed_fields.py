"""A setting that was renamed (config.settings.RENAMED_FIELDS) is still read under its former name, with one warning
per process: builder methods, restored config states, Tune's saved trial configs and run files."""

from __future__ import annotations

import warnings

import pytest

from r3_rllib.config import field as field_module
from r3_rllib.config.field import renamed_keys
from r3_rllib.config.settings import R3_FIELDS, RENAMED_FIELDS
from r3_rllib.train_config import ConfigError, build_run_spec


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    """Each test sees the first use of a former name in its process."""
    monkeypatch.setattr(field_module, "_WARNED_RENAMES", set())


def test_every_former_name_maps_to_a_field_and_is_no_field_itself():
    assert RENAMED_FIELDS["replay_max_staleness"] == "replay_max_age"
    assert set(RENAMED_FIELDS.values()) <= R3_FIELDS and not set(RENAMED_FIELDS) & R3_FIELDS


def test_renamed_keys_warns_once_per_name_and_refuses_both_names():
    renames = {"old": "new"}
    with pytest.warns(FutureWarning, match="here: 'old' is now called 'new'"):
        assert renamed_keys({"old": 1, "x": 2}, renames, "here") == {"new": 1, "x": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert renamed_keys({"old": 3}, renames, "here") == {"new": 3}  # warned already
        assert renamed_keys({"new": 4}, renames, "here") == {"new": 4}
    with pytest.raises(ValueError, match="give only 'new'"):
        renamed_keys({"old": 1, "new": 2}, renames, "here")


def test_builder_methods_read_the_former_name():
    from r3_rllib.algorithms.r3 import R3Config

    with pytest.warns(FutureWarning, match="'replay_max_staleness' is now called 'replay_max_age'") as caught:
        config = R3Config().r3(replay_max_staleness=12)
    # The warning points at the line above (the user's), not at the config code in between.
    assert [w.filename for w in caught] == [__file__]
    assert config.replay_max_age == 12 and "replay_max_staleness" not in vars(config)
    assert R3Config().training(replay_max_staleness=7, lr=1e-4).replay_max_age == 7


def test_a_saved_config_state_or_trial_config_with_the_former_name_restores():
    """``Algorithm.__init__`` rebuilds its config with ``from_state`` (a checkpoint's config state) or
    ``update_from_dict`` (Tune's saved trial config)."""
    from r3_rllib.algorithms.r3 import R3Config

    state = R3Config().r3(replay=True).get_state()
    del state["replay_max_age"]
    state["replay_max_staleness"] = 9  # as an older version saved it
    with pytest.warns(FutureWarning):
        restored = R3Config.from_state(state)
    assert restored.replay_max_age == 9 and restored.replay and "replay_max_staleness" not in vars(restored)
    assert R3Config().update_from_dict({"replay_max_staleness": 5}).replay_max_age == 5


def test_a_run_file_with_the_former_name_loads(tmp_path):
    with pytest.warns(FutureWarning, match="run file section 'r3'"):
        spec = build_run_spec({"preset": "r3", "r3": {"replay_max_staleness": 40}})
    assert spec.config.replay_max_age == 40
    with pytest.raises(ConfigError, match="give only 'replay_max_age'"):
        build_run_spec({"r3": {"replay_max_staleness": 40, "replay_max_age": 40}})

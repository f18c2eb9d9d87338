"""The rollout-correction fields: single-field rules, cross-field rules, and the correction a config gives per
R^2PO stage."""

from __future__ import annotations

import dataclasses

import pytest

from r3_rllib.config.rules import config_errors
from r3_rllib.config.settings import R3Settings


def _config(**fields):
    defaults = {f.name: getattr(R3Settings(), f.name) for f in dataclasses.fields(R3Settings)}
    return type("Config", (), {**defaults, "num_env_runners": 1, **fields})()


def test_the_defaults_are_todays_token_level_truncated_weight():
    from r3_rllib.r2po.method import stage_correction

    cfg = _config()
    assert config_errors(cfg) == []
    corr = stage_correction(cfg, None)
    assert (corr.is_level, corr.is_threshold, corr.rs_level, corr.veto_threshold) == (
        "token",
        2.0,
        None,
        None,
    )
    assert not corr.rejects


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"rollout_is": "seq"}, "rollout_is must be one of"),
        ({"rollout_rs": "tokens"}, "rollout_rs must be one of"),
        ({"is_cap": 0.0}, "is_cap must be finite and > 0"),
        (
            {"rollout_rs": "token", "rollout_rs_threshold": -1.0},
            "rollout_rs_threshold must be finite and > 0",
        ),
        ({"rollout_token_veto_threshold": 1.5}, "rollout_token_veto_threshold must be in (0, 1)"),
        (
            {"rollout_rs": "token", "rollout_rs_threshold": 1.1, "rollout_rs_threshold_lower": 1.2},
            "rollout_rs needs rollout_rs_threshold_lower < rollout_rs_threshold",
        ),
        # is_cap 0.8 as the upper bound and its reciprocal 1.25 as the lower: an empty band.
        ({"rollout_rs": "geometric", "is_cap": 0.8}, "got [1.25, 0.8]"),
        ({"rollout_rs_threshold": 1.001}, "rollout_rs_threshold given but rollout_rs is None"),
        ({"rollout_is": "sequence", "off_policy_correction": False}, "no importance weight is applied"),
    ],
)
def test_inconsistent_corrections_are_refused_with_their_reason(fields, message):
    errors = config_errors(_config(**fields))
    assert any(message in e for e in errors), errors


@pytest.mark.parametrize(
    "fields",
    [
        {"rollout_is": "sequence"},
        {"rollout_rs": "geometric", "rollout_rs_threshold": 1.001, "rollout_rs_threshold_lower": 0.999},
        {"rollout_rs": "icepop", "rollout_rs_threshold": 2.0, "rollout_rs_threshold_lower": 0.5},
        {"rollout_rs": "token", "rollout_token_veto_threshold": 1e-4, "off_policy_correction": False},
        # R^2PO's stage B weight uses the level even without off_policy_correction.
        {"rollout_is": "sequence", "off_policy_correction": False, "rollout_head": True},
    ],
)
def test_consistent_corrections_pass(fields):
    assert config_errors(_config(**fields)) == []


def test_stage_b_follows_its_own_weight_switch_and_keeps_rejection():
    from r3_rllib.r2po.method import stage_correction

    cfg = _config(rollout_rs="token", rollout_head_stage_b_weight="none", is_cap=3.0, rollout_is="sequence")
    b, a = stage_correction(cfg, "B"), stage_correction(cfg, "A")
    assert b.is_level is None and b.rs_level == "token" and b.rs_band == (1 / 3, 3.0)
    assert (a.is_level, a.is_threshold) == ("sequence", 3.0)

"""The run's settings without Ray: the fields of `R3Config` with their rules, and the check of a whole config.

- :mod:`r3_rllib.config.field`: a field's own rule (choices, range, int-ness) declared beside it, one check loop;
- :mod:`r3_rllib.config.settings`: :class:`R3Settings`, every field with its default, rule and documentation;
- :mod:`r3_rllib.config.rules`: the rules between fields, one named function each, and :func:`check_config`;
- :mod:`r3_rllib.config.mode_options`: the table of options one mode reads, refused while their mode is off (one of
  those rules).

The RLlib builder (`R3Config`, in :mod:`r3_rllib.algorithms.r3.config`) holds these fields as attributes and
validates with :func:`check_config`; nothing here imports Ray, transformers or vLLM.
"""

from r3_rllib.config.field import Rule, field_errors, field_rule, mapping_errors, setting
from r3_rllib.config.rules import CROSS_FIELD_RULES, ConfigRule, check_config, config_errors, setting_error
from r3_rllib.config.settings import (
    R3_FIELDS,
    RANKING_ENTROPY_SOURCES,
    RLLIB_FIELD_RULES,
    R3Settings,
    RunSettings,
    StopCriteria,
    default_values,
)

__all__ = [
    "CROSS_FIELD_RULES",
    "R3_FIELDS",
    "RANKING_ENTROPY_SOURCES",
    "RLLIB_FIELD_RULES",
    "ConfigRule",
    "R3Settings",
    "Rule",
    "RunSettings",
    "StopCriteria",
    "check_config",
    "config_errors",
    "default_values",
    "field_errors",
    "field_rule",
    "mapping_errors",
    "setting",
    "setting_error",
]

"""YAML run files -> `R3Config` + Tune run settings, with errors that name the bad key.

A run file has one section per builder method of `R3Config` plus `preset`, `stop` and `run`::

    preset: grpo                      # grpo | dapo | r3 (optional)
    environment: {env: arithmetic, env_config: {digits: 2}}
    env_runners: {num_env_runners: 1}
    learners: {num_learners: 0}
    training: {group_size: 8, lr: 1.0e-4}
    r3: {replay: true}
    stop: {training_iteration: 20}
    run: {name: tiny, storage_path: runs, checkpoint_frequency: 5, max_failures: 0}

Paths written as relative paths (``./...``, ``../...``) in `training.model_path`, `training.tokenizer_path`,
`environment.env_config.data`, `.heldout`, `.tokenizer` and `.tasks` (an agent env's task rows) are resolved
against the run file's folder; other strings are left as they are (they may be hub names).
"""

from __future__ import annotations

import copy
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

BUILDER_SECTIONS = (
    "environment",
    "env_runners",
    "learners",
    "training",
    "r3",
    "resources",
    "debugging",
    "reporting",
)
#: The sections that are not builder calls, with their declared keys and rules (r3_rllib/config/settings.py).
SCHEMA_SECTIONS = ("run", "stop")
TOP_KEYS = set(BUILDER_SECTIONS) | {"preset", "stop", "run"}
PRESETS = {"grpo": "grpo_preset", "dapo": "dapo_preset", "r3": "r3_preset"}


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads `1e-4` (no dot) as a string; learning rates are written that way, so read it as a float."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def _load_yaml(text: str):
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


class ConfigError(ValueError):
    """A run file or --set override that cannot become a config; the message names the key."""


@dataclass
class RunSpec:
    config: Any  # R3Config
    stop: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)


def _unknown(key: str, known, where: str) -> ConfigError:
    from r3_rllib.config.field import unknown_key_message

    return ConfigError(unknown_key_message(key, known, where))


def _schema(section: str) -> type:
    """The settings class declaring the keys of ``run`` or ``stop``."""
    from r3_rllib.config import RunSettings, StopCriteria

    return RunSettings if section == "run" else StopCriteria


def key_errors(section: str, values: dict) -> list[str]:
    """What breaks a rule among ``values``, the keys of run-file ``section``: every key of ``run``/``stop`` against
    its declared schema (unknown keys too), a builder section's keys against the rules of the settings they name
    (the rules ``R3Config.validate`` applies; a key without one is the builder's to check)."""
    from r3_rllib.config import mapping_errors, setting_error

    if section in SCHEMA_SECTIONS:
        return mapping_errors(_schema(section), values, section)
    return [m for key, value in values.items() if (m := setting_error(str(key), value)) is not None]


def parse_override(text: str) -> tuple[list[str], Any]:
    """'training.lr=1e-4' -> (['training', 'lr'], 1e-4); values are parsed as YAML scalars/lists/maps."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, value = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set has an empty key in {text!r}")
    try:
        parsed = _load_yaml(value)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"--set {text}: not a YAML value ({problem})") from None
    return parts, parsed


def _check_override(text: str, parts: list[str], value: Any) -> None:
    """Refuse ``--set section.key=value`` whose value breaks the key's rule, naming the override as typed."""
    if len(parts) == 2 and (parts[0] in BUILDER_SECTIONS or parts[0] in SCHEMA_SECTIONS):
        errors = key_errors(parts[0], {parts[1]: value})
        if errors:
            raise ConfigError(f"--set {text}: " + "; ".join(errors))


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """``raw`` with each ``--set key=value`` applied (a value that breaks its key's rule is refused here, named
    as typed)."""
    raw = copy.deepcopy(raw)
    for text in overrides:
        parts, value = parse_override(text)
        _check_override(text, parts, value)
        node = raw
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: {p!r} is not a section")
        node[parts[-1]] = value
    return raw


def load_run_file(path: str | Path, overrides: list[str] | None = None) -> RunSpec:
    path = Path(path)
    try:
        raw = _load_yaml(path.read_text()) or {}
    except FileNotFoundError as e:
        raise ConfigError(f"run file not found: {path}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    raw = apply_overrides(raw, overrides or [])
    return build_run_spec(raw, base_dir=path.parent)


def build_run_spec(raw: dict, base_dir: Path | None = None) -> RunSpec:
    """The config, stop criteria and run settings of a parsed run file (``base_dir``: its folder, against which
    ``./`` paths are resolved); every unknown key and invalid value is a :class:`ConfigError` naming it."""
    for key in raw:
        if key not in TOP_KEYS:
            raise _unknown(key, TOP_KEYS, "the run file's top level")
    try:
        config = _preset_config(raw.get("preset"))
    except ConfigError:
        raise
    except ValueError as e:  # a default read from the environment (R3_CPU_THREADS) that is not a valid value
        raise ConfigError(str(e)) from e
    for section in BUILDER_SECTIONS:
        if raw.get(section) is not None:
            _apply_section(config, section, raw[section], base_dir)
    stop, run = _schema_section(raw, "stop"), _schema_section(raw, "run")
    _check_paths(config)
    try:
        config.validate()
    except ValueError as e:
        raise ConfigError(str(e)) from e
    return RunSpec(config=config, stop=dict(stop), run=dict(run))


def _schema_section(raw: dict, section: str) -> dict:
    """Section ``run`` or ``stop`` of the run file, every key checked against its declared schema."""
    values = raw.get(section) or {}
    if not isinstance(values, dict):
        raise ConfigError(f"section {section!r} must be a mapping")
    errors = key_errors(section, values)
    if section == "run" and not errors:
        from r3_rllib.algorithms.r3.trackers import tracker_errors

        errors = tracker_errors(values)
    if errors:
        raise ConfigError("; ".join(errors))
    return values


def _preset_config(preset: Any):
    """A fresh `R3Config`, or the named preset's."""
    from r3_rllib.algorithms.r3.config import R3Config

    if preset is None:
        return R3Config()
    if preset in PRESETS:
        return getattr(R3Config, PRESETS[preset])()
    raise _unknown(str(preset), PRESETS, "preset")


def _section_keys(config: Any, section: str) -> set[str]:
    """The keywords the builder method ``section`` accepts."""
    from r3_rllib.config import R3_FIELDS

    if section == "r3":
        return set(R3_FIELDS)
    # Keywords of every definition along the MRO: R3Config.training takes **kwargs and forwards RLlib's own
    # keywords (lr, num_epochs, grad_clip, ...) to AlgorithmConfig.training.
    known = {
        n
        for klass in type(config).__mro__
        if section in vars(klass)
        for n, p in inspect.signature(vars(klass)[section]).parameters.items()
        if (p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD) and n != "self"
    }
    return known | R3_FIELDS if section == "training" else known


def _apply_section(config: Any, section: str, values: Any, base_dir: Path | None) -> None:
    """Call the builder method ``section`` of ``config`` with the section's keys."""
    if not isinstance(values, dict):
        raise ConfigError(f"section {section!r} must be a mapping")
    values = _current_names(section, values)
    if base_dir is not None:
        _resolve_paths(section, values, base_dir)
    known = _section_keys(config, section)
    for key in values:
        if key not in known:
            raise _unknown(key, known, f"section {section!r}")
    errors = key_errors(section, values)
    if errors:
        raise ConfigError(f"section {section!r}: " + "; ".join(errors))
    try:
        getattr(config, section)(**values)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"section {section!r}: {e}") from e


def _current_names(section: str, values: dict) -> dict:
    """The section's keys with a setting's former name (``RENAMED_FIELDS``, e.g. ``replay_max_staleness``) replaced
    by its current one, with a warning: older run files keep working."""
    from r3_rllib.config.field import renamed_keys
    from r3_rllib.config.settings import RENAMED_FIELDS

    try:
        return renamed_keys(values, RENAMED_FIELDS, f"run file section {section!r}")
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _resolve_paths(section: str, values: dict, base_dir: Path) -> None:
    def fix(p):
        if isinstance(p, str) and (p.startswith("./") or p.startswith("../")):
            return str((base_dir / p).resolve())
        return p

    if section == "training":
        for key in ("model_path", "tokenizer_path"):
            if key in values:
                values[key] = fix(values[key])
    if section == "environment" and isinstance(values.get("env_config"), dict):
        env_config = dict(values["env_config"])
        for key in ("data", "heldout", "tokenizer", "tasks"):
            if key in env_config:
                env_config[key] = fix(env_config[key])
        values["env_config"] = env_config


def _check_paths(config) -> None:
    """Local paths that do not exist are named now, not deep inside a remote actor."""
    data = (config.env_config or {}).get("data")
    if isinstance(data, str) and _looks_local(data) and not Path(data).exists():
        raise ConfigError(f"environment.env_config.data: file not found: {data}")
    for key in ("model_path", "tokenizer_path"):
        value = getattr(config, key)
        if isinstance(value, str) and _looks_local(value) and not Path(value).exists():
            raise ConfigError(f"training.{key}: folder not found: {value}")


def _looks_local(value: str) -> bool:
    # Hub names look like "org/name"; local paths are absolute, relative with ./, or have a file extension.
    return value.startswith(("/", "./", "../", "~")) or Path(value).suffix in {".json", ".jsonl", ".parquet"}

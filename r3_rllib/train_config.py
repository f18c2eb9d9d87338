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
against the run file's folder, and ``~/...`` against the home folder; other strings are left as they are (they may
be hub names). A key written twice in one mapping (two ``training:`` sections) is an error naming it and its line.
"""

from __future__ import annotations

import copy
import inspect
import os
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
PRESETS = {
    "grpo": "grpo_preset",
    "ppo": "ppo_preset",
    "dapo": "dapo_preset",
    "hgpo": "hgpo_preset",
    "r3": "r3_preset",
}
#: Data files given where a run file belongs (a ``.json`` may be a run file: JSON is YAML).
DATA_SUFFIXES = (".jsonl", ".parquet")
#: The built-in envs whose ``env_config.data`` is one file (or a hub name) read by r3_rllib/envs/data.py.
FILE_DATA_ENVS = ("math", "reward_fn")
#: The settings a top-level key is pointed to section ``r3`` for (R^3's switches and parameters; R3Config.r3).
R3_SECTION_PREFIXES = ("replay", "reflection", "ranking", "adv_alpha", "adv_lambda")


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping of a run file (or a ``--set`` value) names the same key twice: the later one would silently
    replace the earlier (a second ``training:`` section drops every key of the first)."""

    def __init__(self, key: Any, line: int, first_line: int, mark: yaml.Mark) -> None:
        super().__init__(None, None, f"duplicate key {key!r} (first at line {first_line})", mark)
        self.key, self.line, self.first_line = key, line, first_line


class _Loader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate mapping keys (PyYAML keeps the last one silently) and reads `1e-4` as a
    float (YAML 1.1 reads it, with no dot, as a string; learning rates are written that way)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        """The mapping of ``node``, refusing a key written twice; merge keys (``<<: *anchor``) are left to YAML,
        whose rule is that explicit keys override merged ones."""
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in first:
                        raise DuplicateKeyError(key, line, first[key], key_node.start_mark)
                    first[key] = line
                except TypeError:  # an unhashable key: SafeConstructor raises its own clear error for it
                    continue
        return super().construct_mapping(node, deep=deep)


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


def load_run_file(path: str | Path, overrides: list[str] | None = None, *, check_env: bool = True) -> RunSpec:
    """The run file at ``path`` with ``overrides`` (``--set``) applied, checked (:func:`build_run_spec`)."""
    path = Path(path)
    # A one-line .jsonl parses as YAML, and "unknown key 'problem' in the run file's top level" would mislead.
    if path.suffix.lower() in DATA_SUFFIXES:
        raise ConfigError(
            f"{path}: a data file, not a run file (YAML, see examples/); name it in a run file as "
            "environment.env_config.data"
        )
    try:
        raw = _load_yaml(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError as e:
        raise ConfigError(f"run file not found: {path}") from e
    except IsADirectoryError as e:
        raise ConfigError(f"{path}: is a folder, not a run file") from e
    except OSError as e:  # permissions, a socket, ...: say which file and why, not a traceback
        raise ConfigError(f"{path}: cannot read the run file: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}): a run file is UTF-8 YAML") from e
    except DuplicateKeyError as e:
        raise ConfigError(
            f"{path}: line {e.line}: duplicate key {e.key!r} (first at line {e.first_line}); the later one "
            "would replace the earlier: merge them into one"
        ) from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    raw = apply_overrides(raw, overrides or [])
    return build_run_spec(raw, base_dir=path.parent, check_env=check_env)


def build_run_spec(raw: dict, base_dir: Path | None = None, *, check_env: bool = True) -> RunSpec:
    """The config, stop criteria and run settings of a parsed run file (``base_dir``: its folder, against which
    ``./`` paths are resolved); every unknown key and invalid value is a :class:`ConfigError` naming it, and so is
    an env option the env does not take (:func:`~r3_rllib.config.rules.env_config_fits_the_env`) and an env name
    this process does not know (``check_env``; see :func:`env_name_error`)."""
    from r3_rllib.config.rules import env_config_fits_the_env

    for key in raw:
        if key not in TOP_KEYS:
            raise _unknown_top_key(key)
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
    _lr_total_from_stop(config, stop)
    # validate() refuses an env option the env does not take too (for a config built in Python), among the config's
    # other problems; checked first here, the run file's mistake is named alone, as a key of its section.
    if (error := env_config_fits_the_env(config)) is not None:
        raise ConfigError(error)
    try:
        config.validate()
    except ValueError as e:
        raise ConfigError(str(e)) from e
    # After the sections and validate(): a module they imported (a "module:Class" env, a plugin) may have
    # registered the name.
    if check_env and (error := env_name_error(config)) is not None:
        raise ConfigError(error)
    return RunSpec(config=config, stop=dict(stop), run=dict(run))


def _lr_total_from_stop(config, stop: dict) -> None:
    """A learning-rate decay or a warm-up ratio left without lr_total_steps ends with the run file's stop
    iteration, as verl derives total_training_steps from its run: the policy's updates in that many iterations
    (every iteration's, but PPO's critic warm-up's and R^2PO's head stage's: the method's count)."""
    from r3_rllib.core.method import method_for

    iterations = stop.get("training_iteration")
    shaped = config.lr_scheduler_type != "constant" or (
        config.lr_warmup_steps is None and config.lr_warmup_steps_ratio > 0
    )
    if shaped and config.lr_total_steps is None and isinstance(iterations, int) and iterations >= 1:
        updates = method_for(config).policy_updates(config, iterations)
        config.training(lr_total_steps=max(1, updates))


def env_name_error(config) -> str | None:
    """Why ``config.env`` names no env, or None: a plain name that neither the text-env registry of this process
    (built-in envs, installed entry points, names registered here) nor Ray Tune's env registry knows. Found here,
    before Ray starts, rather than by every EnvRunner of a failed trial. An env class, a ``"module:Class"`` path
    (imported by ``R3Config.environment``) and a known name pass; so does no env."""
    from r3_rllib.envs.registry import is_known_text_env, is_object_path, unknown_text_env_message

    env = config.env
    if not isinstance(env, str) or is_object_path(env) or is_known_text_env(env):
        return None
    # Private: Tune's cluster-wide registry has no public lookup (tests/unit/test_rllib_private_api.py guards it).
    from ray.tune.registry import ENV_CREATOR, _global_registry

    if _global_registry.contains(ENV_CREATOR, env):
        return None
    return f"environment.env: {unknown_text_env_message(env)}"


def _unknown_top_key(key: Any) -> ConfigError:
    """An unknown top-level key; one that is a key of a section (``lr``: ``--set lr=1e-4`` for
    ``--set training.lr=1e-4``) is named with its section."""
    import dataclasses

    from r3_rllib.algorithms.r3.config import R3Config

    where = "the run file's top level"
    # "training" takes every R3 setting too; R^3's own parts are named in "r3", as R3Config.r3 describes them.
    r3_part = str(key).startswith(R3_SECTION_PREFIXES) and key in _section_keys(R3Config, "r3")
    homes = ["r3"] if r3_part else []
    homes += [s for s in BUILDER_SECTIONS if s != "r3" and not r3_part and key in _section_keys(R3Config, s)]
    homes += [s for s in SCHEMA_SECTIONS if key in {f.name for f in dataclasses.fields(_schema(s))}]
    if not homes:
        return _unknown(key, TOP_KEYS, where)
    meant = " or ".join(repr(f"{s}.{key}") for s in homes)
    return ConfigError(f"unknown key {key!r} in {where}; did you mean {meant}?")


def _schema_section(raw: dict, section: str) -> dict:
    """Section ``run`` or ``stop`` of the run file, every key checked against its declared schema."""
    values = raw.get(section) or {}
    if not isinstance(values, dict):
        raise ConfigError(f"section {section!r} must be a mapping")
    errors = key_errors(section, values)
    if section == "run" and not errors:
        from r3_rllib.algorithms.r3.trackers import tracker_errors

        errors = _run_name_errors(values.get("name")) + tracker_errors(values)
    if errors:
        raise ConfigError("; ".join(errors))
    return values


def _run_name_errors(name: Any) -> list[str]:
    """``run.name`` is a folder under ``run.storage_path``: an absolute path or one with a ``.``/``..`` part would
    put the run elsewhere (``..``: into the storage folder's parent, beside other runs; an absolute one outside
    the storage folder that ``--resume`` and the earlier-run check look in)."""
    if not isinstance(name, str) or not name:
        return []  # None or "": the run file's name (the type is the schema's to check)
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or name.startswith("~") or any(p in (".", "..") for p in parts):
        return [
            f"run.name must be a folder name under run.storage_path (no leading '/' or '~', no '.' or '..' part), "
            f"got {name!r}; set run.storage_path to place the run elsewhere"
        ]
    return []


def _preset_config(preset: Any):
    """A fresh `R3Config`, or the named preset's."""
    from r3_rllib.algorithms.r3.config import R3Config

    if preset is None:
        return R3Config()
    if not isinstance(preset, str):  # a list or mapping is unhashable: `in PRESETS` would raise a TypeError
        raise ConfigError(f"preset must be one of {', '.join(PRESETS)} (a name), got {preset!r}")
    if preset in PRESETS:
        return getattr(R3Config, PRESETS[preset])()
    raise _unknown(str(preset), PRESETS, "preset")


def _section_keys(config: Any, section: str) -> set[str]:
    """The keywords the builder method ``section`` of ``config`` (an R3Config or its class) accepts."""
    from r3_rllib.config import R3_FIELDS

    if section == "r3":
        return set(R3_FIELDS)
    # Keywords of every definition along the MRO: R3Config.training takes **kwargs and forwards RLlib's own
    # keywords (lr, num_epochs, grad_clip, ...) to AlgorithmConfig.training.
    known = {
        n
        for klass in (config if isinstance(config, type) else type(config)).__mro__
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
    except AttributeError as e:
        # RLlib's builders deep-merge dict-valued keys (``optimizer``, ...) with ``deep_update``, which calls
        # ``.items()`` on whatever the run file gave: a list there must not end in a traceback.
        raise ConfigError(
            f"section {section!r}: a value has the wrong type (a mapping expected?): {e}"
        ) from e


def _current_names(section: str, values: dict) -> dict:
    """The section's keys with a setting's former name (``RENAMED_FIELDS``, e.g. ``replay_max_staleness``) replaced
    by its current one, with a warning: older run files keep working."""
    from r3_rllib.config.field import renamed_keys
    from r3_rllib.config.settings import RENAMED_FIELDS

    try:
        return renamed_keys(values, RENAMED_FIELDS, f"run file section {section!r}")
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _resolve_paths(section: str, values: dict, base_dir: Path | None) -> None:
    """The section's path keys made absolute: ``./``/``../`` against ``base_dir`` (the run file's folder), ``~``
    against the home folder. ``~`` is expanded here, once, so that the existence check and every loader (some of
    them another package's) see the same path."""

    def fix(p: Any) -> Any:
        if not isinstance(p, str):
            return p
        if p.startswith("~"):
            return os.path.expanduser(p)
        if base_dir is not None and (p.startswith("./") or p.startswith("../")):
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
    # `~` is expanded as the loaders expand it (a config set in code may still hold one, unlike a run file's).
    data = (config.env_config or {}).get("data")
    if isinstance(data, str) and _looks_local(data) and not Path(data).expanduser().exists():
        raise ConfigError(f"environment.env_config.data: file not found: {data}")
    folder = isinstance(data, str) and _looks_local(data) and Path(data).expanduser().is_dir()
    if folder and config.env in FILE_DATA_ENVS:
        # A folder (``data: ./``, or one of shards) passed here and failed in every EnvRunner after Ray started.
        # An env of one's own may read a folder: only the envs that read data.py's files are held to a file.
        raise ConfigError(
            f"environment.env_config.data: {data} is a folder; name a .json, .jsonl or .parquet file in it"
        )
    for key in ("model_path", "tokenizer_path"):
        value = getattr(config, key)
        if isinstance(value, str) and _looks_local(value) and not Path(value).expanduser().exists():
            raise ConfigError(f"training.{key}: folder not found: {value}")


def _looks_local(value: str) -> bool:
    # Hub names look like "org/name"; local paths are absolute, relative with ./, or have a file extension.
    return value.startswith(("/", "./", "../", "~")) or Path(value).suffix in {".json", ".jsonl", ".parquet"}

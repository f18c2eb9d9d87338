"""The config a run was built with, saved in each of its checkpoints (``r3_config.json``), and read back to rebuild
the algorithm from the checkpoint alone: ``R3.from_checkpoint(path)``.

Why a file of our own: RLlib's ``Algorithm.from_checkpoint`` rebuilds from a pickled config
(``class_and_ctor_args.pkl``), and unpickling can run any code. Ours is JSON, read as data: every setting whose value
is plain data (numbers, strings, lists, dicts), which is every setting a run file can hold. A setting holding code
(a callbacks class, an env passed as a class or function) cannot be saved so: its name is listed under ``unsaved``,
and rebuilding needs it in ``config_overrides``.

Names of code are data too, and dangerous ones: a ``"module:attribute"`` path (an env, a reward function, an
estimator, anywhere in the settings) is imported and called by the rebuilt algorithm, so a checkpoint from elsewhere
could name any importable function (``subprocess:run``, its arguments among the env's options), and
``trust_remote_code`` would run the model folder's code. :func:`config_from_checkpoint` refuses both unless the
caller overrides the setting or passes ``trust_object_paths=True``.

The file is listed in the checkpoint's manifest like every other file; it is checked against it before it is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from r3_rllib.algorithms.r3.checkpoint_files import CorruptCheckpointError, atomic_write_bytes, read_manifest
from r3_rllib.core.typo_hints import closest_name

#: The config's file inside an algorithm checkpoint directory.
CONFIG_FILE = "r3_config.json"
CONFIG_FORMAT_VERSION = 1
#: ``package.module:attribute`` written with identifiers only (a prompt with a colon in it is not one).
_OBJECT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


#: RLlib's algorithm class: R3.from_checkpoint is called on the class to build.
_NOT_SAVED = frozenset({"class"})


class CheckpointConfigError(ValueError):
    """A checkpoint's saved config that cannot rebuild the algorithm as it is: missing, holding code, or refused by
    this r3_rllib's rules; the message says which setting, and what to pass instead."""


class ModelMismatchError(ValueError):
    """A checkpoint whose model tensors differ from the learners' (another model, LoRA rank or target modules, or
    a rollout head on one side only): refused before anything is restored."""


#: The settings that decide which tensors a learner's checkpoint holds.
MODEL_SETTINGS = ("model_path", "lora_rank", "lora_target_modules", "rollout_head")


def model_mismatch_message(checkpoint_dir: str, mismatch: str, config: Any) -> str:
    """The refusal of :class:`ModelMismatchError`: what differs (``mismatch``, from the learner), and the
    settings of :data:`MODEL_SETTINGS` where the checkpoint's saved config and ``config`` disagree."""
    try:
        saved = read_checkpoint_config(checkpoint_dir)["settings"]
    except CheckpointConfigError:  # saved before configs were: the tensors alone say it
        saved = {}
    differ = [
        f"{key}={saved[key]!r} there, {getattr(config, key)!r} here"
        for key in MODEL_SETTINGS
        if key in saved and not _same(saved[key], _plain(getattr(config, key)))
    ]
    settings = f" Its settings: {'; '.join(differ)}." if differ else ""
    return (
        f"{checkpoint_dir} holds weights that do not fit this run's model: {mismatch}.{settings} Restore a "
        f"checkpoint of this model, or give this run the checkpoint's {', '.join(MODEL_SETTINGS)} "
        "(`R3.from_checkpoint(path)` rebuilds the run it came from)."
    )


def _plain(value: Any) -> Any:
    """A setting as its saved record holds it (a path as a string)."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _is_data(value: Any) -> bool:
    """Whether ``value`` survives JSON unchanged (a tuple, a class or a function does not)."""
    try:
        return json.loads(json.dumps(value, allow_nan=False)) == value
    except (TypeError, ValueError):
        return False


def config_record(config: Any) -> dict[str, Any]:
    """What :func:`write_checkpoint_config` saves of ``config`` (an R3Config): its plain-data settings, and the
    names of the settings that hold something else and differ from a fresh config's (``unsaved``)."""
    defaults = type(config)().to_dict()
    settings: dict[str, Any] = {}
    unsaved: list[str] = []
    for key, value in config.to_dict().items():
        if key in _NOT_SAVED:
            continue
        value = _numpy_scalars_as_python(value)
        if _is_data(value):
            settings[key] = value
        elif not _same(value, defaults.get(key)):
            unsaved.append(key)
    return {"format_version": CONFIG_FORMAT_VERSION, "settings": settings, "unsaved": sorted(unsaved)}


def _numpy_scalars_as_python(value: Any) -> Any:
    """``value`` with numpy scalars (an lr drawn by a sweep as ``np.float64``) as the Python numbers they hold, in
    lists and dicts too: data, which JSON holds."""
    if isinstance(value, dict):
        return {k: _numpy_scalars_as_python(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numpy_scalars_as_python(v) for v in value]
    item = getattr(value, "item", None)
    if type(value).__module__ == "numpy" and callable(item) and getattr(value, "ndim", None) == 0:
        return item()
    return value


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an object whose == raises (an array) is not the default
        return False


def write_checkpoint_config(checkpoint_dir: str, config: Any) -> str:
    """Write ``config``'s record (:func:`config_record`) into ``checkpoint_dir``, atomically; its path."""
    path = os.path.join(checkpoint_dir, CONFIG_FILE)
    atomic_write_bytes(path, (json.dumps(config_record(config), indent=1, sort_keys=True) + "\n").encode())
    return path


def read_checkpoint_config(checkpoint_dir: str) -> dict[str, Any]:
    """The record saved in ``checkpoint_dir``, checked against the checkpoint's manifest (size and sha256).
    CheckpointConfigError when there is none (a checkpoint of an older r3_rllib); CorruptCheckpointError when it
    differs from the manifest or is not a record."""
    path = os.path.join(checkpoint_dir, CONFIG_FILE)
    manifest = read_manifest(checkpoint_dir)
    entry = next((e for e in manifest.files if e.path == CONFIG_FILE), None) if manifest else None
    if entry is None or not os.path.isfile(path):
        raise CheckpointConfigError(
            f"{checkpoint_dir} holds no saved config ({CONFIG_FILE}; checkpoints written before R3.from_checkpoint "
            f"existed have none): build the algorithm from the run's config and restore the checkpoint into it, "
            f"`algo = config.build_algo(); algo.restore({checkpoint_dir!r})` (for an `r3 train` run, "
            "`config = load_run_file(<its run file>).config`, from r3_rllib.train_config)"
        )
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
        raise CorruptCheckpointError(f"{path}: differs from the checkpoint's manifest (changed or damaged)")
    try:
        record = json.loads(data)
        if record.get("format_version") != CONFIG_FORMAT_VERSION:
            raise ValueError(f"format version {record.get('format_version')!r}, this r3_rllib reads 1")
        if not isinstance(record.get("settings"), dict) or not isinstance(record.get("unsaved"), list):
            raise ValueError("no 'settings' object or 'unsaved' list")
    except (ValueError, AttributeError) as e:
        raise CorruptCheckpointError(f"{path}: not a saved config ({e})") from e
    return record


def code_names(settings: Mapping[str, Any], where: str = "") -> Iterator[tuple[str, Any]]:
    """Each ``(setting, value)`` in ``settings`` (nested ones dotted) that names code to import: a
    ``"module:attribute"`` path, or ``trust_remote_code`` switched on."""
    for key, value in settings.items():
        name = f"{where}{key}"
        if key == "trust_remote_code" and value:
            yield name, value
        elif isinstance(value, str) and _OBJECT_PATH.fullmatch(value):
            yield name, value
        elif isinstance(value, Mapping):
            yield from code_names(value, f"{name}.")
        elif isinstance(value, list):
            yield from code_names({str(i): v for i, v in enumerate(value)}, f"{name}.")


def _check_override_names(overrides: Mapping[str, Any], config_class: type) -> None:
    """CheckpointConfigError for a key of ``overrides`` that names no setting (``update_from_dict`` would keep it
    as a stray attribute, and the run would go on with the saved value)."""
    from r3_rllib.config.settings import RENAMED_FIELDS

    known = set(config_class().to_dict()) | set(RENAMED_FIELDS)
    for key in overrides:
        if key not in known:
            close = closest_name(str(key), known)
            hint = f"; did you mean {close!r}?" if close else ""
            raise CheckpointConfigError(f"config_overrides: no setting named {key!r}{hint}")


def config_from_checkpoint(
    config_class: type,
    checkpoint_dir: str,
    config_overrides: Mapping[str, Any] | None = None,
    *,
    trust_object_paths: bool = False,
) -> Any:
    """A validated ``config_class`` (R3Config) with the settings saved in ``checkpoint_dir``, ``config_overrides``
    (setting name -> value, as ``AlgorithmConfig.update_from_dict`` takes them) over them. CheckpointConfigError
    naming the settings that held code and need an override, the code paths a checkpoint may not name unless
    ``trust_object_paths``, or what this r3_rllib's rules refuse of the saved config (a rule added since the run)."""
    record = read_checkpoint_config(checkpoint_dir)
    overrides = dict(config_overrides or {})
    _check_override_names(overrides, config_class)
    source = os.path.join(checkpoint_dir, CONFIG_FILE)
    missing = [name for name in record["unsaved"] if name not in overrides]
    if missing:
        raise CheckpointConfigError(
            f"{source}: {', '.join(missing)} held code when the checkpoint was saved, which is not saved: pass "
            f"{'them' if len(missing) > 1 else 'it'} in config_overrides, e.g. "
            f"R3.from_checkpoint(path, config_overrides={{{missing[0]!r}: ...}})"
        )
    named = [(n, v) for n, v in code_names(record["settings"]) if n.split(".")[0] not in overrides]
    if named and not trust_object_paths:
        listed = "; ".join(f"{n} = {v!r}" for n, v in named)
        raise CheckpointConfigError(
            f"{source} names code the rebuilt algorithm would import and run ({listed}): a checkpoint from elsewhere "
            "could name any function. Pass trust_object_paths=True if you trust where it came from, or give these "
            "settings in config_overrides"
        )
    # The checkpoint the saved run started from was restored already, and is in this checkpoint's state.
    settings = {**record["settings"], "resume_from_checkpoint": None}
    config = config_class().update_from_dict({**settings, **overrides})
    try:
        config.validate()
    except ValueError as e:
        raise CheckpointConfigError(
            f"{source}: this r3_rllib refuses the saved config ({e}). Change what it names with config_overrides, "
            "e.g. R3.from_checkpoint(path, config_overrides={'group_size': 8})"
        ) from e
    return config


def checkpoint_folder(path: str | os.PathLike) -> str:
    """The checkpoint folder ``path`` names, as ``r3 export`` and ``r3 eval`` read it (export.py
    ``find_checkpoint``): itself, a trial's newest complete checkpoint, or that of an experiment's only trial (none is
    moved aside). An ExportError (a ValueError) says why there is none."""
    from r3_rllib.algorithms.r3.export import find_checkpoint

    return find_checkpoint(path, verify=False, who="restore")[1]


def algorithm_from_checkpoint(
    algo_class: Any,
    path: str | os.PathLike,
    config_overrides: Mapping[str, Any] | None = None,
    *,
    trust_object_paths: bool = False,
) -> Any:
    """``algo_class`` (R3) built from the config saved in the checkpoint at ``path`` (:func:`config_from_checkpoint`)
    and restored from it. ``path``: a checkpoint folder, a Tune trial's folder or an experiment's with one trial
    (:func:`checkpoint_folder`). The algorithm is stopped again when the restore fails."""
    path = checkpoint_folder(path)
    config = config_from_checkpoint(
        type(algo_class.get_default_config()), path, config_overrides, trust_object_paths=trust_object_paths
    )
    algo = algo_class(config=config)
    try:
        algo.restore(path)
    except BaseException:
        algo.stop()
        raise
    return algo

"""Model folders from a local path, a named model of this package, or a Hugging Face hub name (used by training,
evaluation and export).

Named models (``smollm2-135m``, ``gridworld-tiny-sft``) are folders the package builds and caches itself, from
sources that need no model hub; :func:`named_models` lists them and :func:`register_named_model` adds more. A name
*resolves* to its cached folder here and never trains anything: a model made by training (``gridworld-tiny-sft``,
a warm start) is built by :func:`r3_rllib.warmstart.build_named_model` (``r3 build-model NAME``), which training,
``r3 train`` and ``r3 eval`` call before they resolve the name. SmolLM2 is converted from a local GGUF file on
first resolution (a conversion, not a training run; see :mod:`r3_rllib.models.smollm2`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from r3_rllib.core.registry import Registry

#: The tiny model warm-started on gridworld expert moves (built by :mod:`r3_rllib.warmstart.gridworld`).
GRIDWORLD_TINY_SFT = "gridworld-tiny-sft"
#: SmolLM2-135M-Instruct warm-started on TextWorld walkthroughs (built by :mod:`r3_rllib.warmstart.textworld`).
SMOLLM2_TEXTWORLD_SFT = "smollm2-135m-textworld-sft"


class NamedModelNotBuiltError(FileNotFoundError):
    """A named model made by training has no cached folder yet; the message says how to build it."""


def _smollm2() -> Path:
    from r3_rllib.models.smollm2 import smollm2_path

    return smollm2_path()


def named_model_folder(name: str) -> Path:
    """Where a named model built by this package is cached (``$R3_RLLIB_CACHE/models/<name>``); it may not exist."""
    from r3_rllib.models.smollm2 import cache_root

    return cache_root() / name


def built_folder(name: str) -> Path:
    """The cached folder of a named model made by training, or :class:`NamedModelNotBuiltError` saying how to
    build it. A folder with a ``config.json`` is complete: builders move a finished folder into place."""
    folder = named_model_folder(name)
    if not (folder / "config.json").is_file():
        raise NamedModelNotBuiltError(
            f"named model {name!r} is not built yet (expected at {folder}): build it once with "
            f"`r3 build-model {name}` or r3_rllib.warmstart.build_named_model({name!r}) "
            "(r3 train and r3 eval build it themselves)"
        )
    return folder


# name -> resolver returning the model's folder. Imports are deferred so that listing names costs nothing.
NAMED_MODELS = Registry("named model")
NAMED_MODELS.register("smollm2-135m")(_smollm2)
NAMED_MODELS.register(GRIDWORLD_TINY_SFT)(lambda: built_folder(GRIDWORLD_TINY_SFT))
NAMED_MODELS.register(SMOLLM2_TEXTWORLD_SFT)(lambda: built_folder(SMOLLM2_TEXTWORLD_SFT))


def named_models() -> list[str]:
    """Names :func:`resolve_model_path` accepts besides folders and hub names."""
    return sorted(NAMED_MODELS)


def register_named_model(name: str, resolver: Callable[[], Path], *, overwrite: bool = False) -> None:
    """Make ``model_path: name`` resolve to ``resolver()`` (a folder). Hub-style names ("org/model") are refused:
    they would shadow the hub. A model that must be trained first registers its builder with
    :func:`r3_rllib.warmstart.register_named_model_builder` too, and its resolver only finds the folder."""
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"a named model needs a non-empty name without '/', got {name!r}")
    if not callable(resolver):
        raise TypeError(f"resolver for named model {name!r} must be callable")
    if name in NAMED_MODELS and NAMED_MODELS[name] is not resolver:
        if not overwrite:
            raise ValueError(f"named model {name!r} is already registered; pass overwrite=True to replace it")
        del NAMED_MODELS[name]
    if name not in NAMED_MODELS:
        NAMED_MODELS.register(name)(resolver)


def resolve_model_path(model: str | Path) -> Path:
    """A local model folder as is; a named model (see :func:`named_models`) as its cached folder; otherwise a hub
    name, fetched into (or found in) the Hugging Face cache. A leading ``~`` is the user's home, as in a shell."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise NotADirectoryError(f"a model must be a folder or a hub name, got the file {path}")
    if isinstance(model, str) and model in NAMED_MODELS:
        return Path(NAMED_MODELS[model]())
    if str(model).count("/") != 1:
        raise FileNotFoundError(
            f"no model folder at {path} (and {model!r} is neither a named model ({', '.join(named_models())}) "
            "nor a hub name like 'org/model')"
        )
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(str(model), allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"])
        )
    except Exception as e:  # offline without a cached copy, unknown repo, no access: say which
        raise FileNotFoundError(f"could not get model {model!r} from the hub or its cache: {e}") from e


def policy_path(model_path: str | Path | None) -> str:
    """The policy folder of a config's ``model_path`` (see :func:`resolve_model_path`); None: the shipped tiny
    arithmetic model."""
    if not model_path:
        from r3_rllib.models import default_tiny_model_path

        return str(default_tiny_model_path())
    return str(resolve_model_path(model_path))

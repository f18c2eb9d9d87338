"""Model folders from a local path, a named model of this package, or a Hugging Face hub name (used by training,
evaluation and export).

Named models (``smollm2-135m``) are folders the package builds and caches itself, from sources that need no model
hub; :func:`named_models` lists them and :func:`register_named_model` adds more.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def _smollm2() -> Path:
    from r3_rllib.models.smollm2 import smollm2_path

    return smollm2_path()


def _gridworld_sft() -> Path:
    from r3_rllib.models.gridworld_sft import build_warm_start
    from r3_rllib.models.smollm2 import cache_root

    # The tiny model warm-started on gridworld expert moves ('hgpo' preset; about 30 s of SFT on first use).
    return build_warm_start(cache_root() / "gridworld-tiny-sft", log=lambda message: None)


# name -> function returning the model's folder (building it on first use); imports are deferred so that listing
# names costs nothing.
_NAMED_MODELS: dict[str, Callable[[], Path]] = {
    "smollm2-135m": _smollm2,
    "gridworld-tiny-sft": _gridworld_sft,
}


def named_models() -> list[str]:
    """Names :func:`resolve_model_path` accepts besides folders and hub names."""
    return sorted(_NAMED_MODELS)


def register_named_model(name: str, resolver: Callable[[], Path], *, overwrite: bool = False) -> None:
    """Make ``model_path: name`` resolve to ``resolver()`` (a folder). Hub-style names ("org/model") are refused:
    they would shadow the hub."""
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"a named model needs a non-empty name without '/', got {name!r}")
    if not callable(resolver):
        raise TypeError(f"resolver for named model {name!r} must be callable")
    if name in _NAMED_MODELS and _NAMED_MODELS[name] is not resolver and not overwrite:
        raise ValueError(f"named model {name!r} is already registered; pass overwrite=True to replace it")
    _NAMED_MODELS[name] = resolver


def resolve_model_path(model: str | Path) -> Path:
    """A local model folder as is; a named model (see :func:`named_models`) as its cached folder; otherwise a hub
    name, fetched into (or found in) the Hugging Face cache."""
    path = Path(model)
    if path.is_dir():
        return path
    if path.exists():
        raise NotADirectoryError(f"a model must be a folder or a hub name, got the file {path}")
    if isinstance(model, str) and model in _NAMED_MODELS:
        return Path(_NAMED_MODELS[model]())
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

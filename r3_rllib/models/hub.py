"""Model folders from a local path or a Hugging Face hub name (used by training, evaluation and export)."""

from __future__ import annotations

from pathlib import Path


def resolve_model_path(model: str | Path) -> Path:
    """A local model folder as is; otherwise a hub name, fetched into (or found in) the Hugging Face cache."""
    path = Path(model)
    if path.is_dir():
        return path
    if path.exists():
        raise NotADirectoryError(f"a model must be a folder or a hub name, got the file {path}")
    if str(model).count("/") != 1:
        raise FileNotFoundError(
            f"no model folder at {path} (and {model!r} is not a hub name like 'org/model')"
        )
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(str(model), allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"])
        )
    except Exception as e:  # offline without a cached copy, unknown repo, no access: say which
        raise FileNotFoundError(f"could not get model {model!r} from the hub or its cache: {e}") from e

"""A warm start built once per configuration: a model folder with a metadata file holding the hash of the config that
made it, reused while the hash matches and rebuilt (written beside the folder, then moved into place) otherwise."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

Trained = tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]


def config_hash(config: dict[str, Any]) -> str:
    """A short, order-independent hash of a JSON-serialisable config."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def read_metadata(path: str | Path, metadata_file: str) -> dict[str, Any] | None:
    """The metadata :func:`save_checkpoint` wrote into ``path``, or None."""
    file = Path(path) / metadata_file
    return json.loads(file.read_text()) if file.is_file() else None


def save_checkpoint(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    path: Path,
    config: dict[str, Any],
    metrics: dict[str, Any],
    *,
    metadata_file: str,
) -> None:
    """Save model, tokenizer and metadata (into ``metadata_file``): written next to ``path`` and moved into place,
    so an interrupted save never leaves a half-written checkpoint that a later build would reuse."""
    from r3_rllib.models.tiny import save_tiny

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    save_tiny(model, tokenizer, tmp)
    meta = {"config_hash": config_hash(config), "config": config, **metrics}
    (tmp / metadata_file).write_text(json.dumps(meta, indent=2) + "\n")
    tmp.chmod(
        0o755
    )  # mkdtemp's folder is private; engines and Ray actors of other users may read a checkpoint
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def build_cached(
    path: str | Path,
    config: dict[str, Any],
    train: Callable[[dict[str, Any]], Trained],
    *,
    name: str,
    metadata_file: str,
    log: Callable[[str], Any] = print,
) -> Path:
    """``path`` holding the model ``train(config)`` makes, trained only when ``path`` does not already hold one of
    the same config (``name`` labels the log lines)."""
    key = config_hash(config)
    path = Path(path)
    meta = read_metadata(path, metadata_file)
    if meta is not None and meta.get("config_hash") == key:
        log(f"{name} warm start: reusing {path} (config {key})")
        return path
    model, tokenizer, metrics = train(config)
    save_checkpoint(model, tokenizer, path, config, metrics, metadata_file=metadata_file)
    log(
        f"{name} warm start: saved {path} ({metrics['train_seconds']:.0f} s, loss {metrics['final_loss']:.3f})"
    )
    return path

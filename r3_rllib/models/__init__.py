"""Models: the tiny ones for CPU-scale experiments (a character tokenizer, a small Qwen2, a shipped checkpoint), named
cached models (``hub.py``: a name resolves to a folder, it never trains), R^2PO's rollout head.

Warm-start SFT and the builders of named models made by training live in :mod:`r3_rllib.warmstart`, a layer below
this one; this package only needs torch and transformers.
"""

from __future__ import annotations

from pathlib import Path

from r3_rllib.models.rollout_head import (
    RolloutHead,
    attach_rollout_head,
    detach_rollout_head,
    get_rollout_head,
    load_policy_with_head,
    load_rollout_head,
    rollout_logits_enabled,
    rollout_token_logprobs,
    save_rollout_head,
)
from r3_rllib.models.tiny import (
    build_tiny_model,
    build_tiny_model_for_tokenizer,
    build_tiny_tokenizer,
    load_tiny,
    load_tokenizer,
    save_tiny,
)

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
DEFAULT_TINY_MODEL = "tiny-arith-add2"


def default_tiny_model_path() -> Path:
    """Folder of the shipped tiny model warm-started on 2-digit addition (see ``assets/README.md``)."""
    path = ASSETS_DIR / DEFAULT_TINY_MODEL
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"the shipped checkpoint is missing from {path}; is the package data installed?"
        )
    return path


__all__ = [
    "RolloutHead",
    "attach_rollout_head",
    "detach_rollout_head",
    "get_rollout_head",
    "load_policy_with_head",
    "load_rollout_head",
    "rollout_logits_enabled",
    "rollout_token_logprobs",
    "save_rollout_head",
    "build_tiny_model",
    "build_tiny_model_for_tokenizer",
    "build_tiny_tokenizer",
    "default_tiny_model_path",
    "load_tiny",
    "load_tokenizer",
    "save_tiny",
]

"""Warm starts: supervised fine-tuning of the tiny model before RL (``arithmetic.py``: ``r3 sft``; ``gridworld.py``:
expert moves), and the builders of the named models made that way (``named.py``: ``r3 build-model NAME``).

This package imports ``models``, ``envs``, ``engines`` and ``rollout``; none of them imports it. Only ``named`` is
imported here (it needs neither torch nor transformers); the SFT modules are imported on demand.
"""

from __future__ import annotations

from r3_rllib.warmstart.named import (
    NAMED_MODEL_BUILDERS,
    build_model_path,
    build_named_model,
    build_named_models,
    register_named_model_builder,
)

__all__ = [
    "NAMED_MODEL_BUILDERS",
    "build_model_path",
    "build_named_model",
    "build_named_models",
    "register_named_model_builder",
]

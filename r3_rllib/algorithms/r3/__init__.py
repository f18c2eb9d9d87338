"""The R3 algorithm: GRPO, DAPO-style dynamic sampling, R^3, HGPO and R^2PO for causal LMs on RLlib's new API stack.

``R3`` and ``R3Config`` are imported on first use, so that importing a module of this package (the config, a pure
helper) does not import the algorithm, its learner and its engines.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"R3": "r3_rllib.algorithms.r3.r3", "R3Config": "r3_rllib.algorithms.r3.config"}

__all__ = ["R3", "R3Config"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""r3-rllib: R^3 and GRPO for large reasoning models as a Ray RLlib plugin algorithm.

Importing the package registers the algorithm with Ray Tune as ``"R3"``, so ``tune.Tuner("R3", ...)`` works.
Submodules that need no Ray (``r3_rllib.core``, ``r3_rllib.envs``, ``r3_rllib.rewards``) are usable on their own;
``R3`` and ``R3Config`` are imported on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {"R3": "r3_rllib.algorithms.r3", "R3Config": "r3_rllib.algorithms.r3"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'r3_rllib' has no attribute {name!r}")


def register_with_tune() -> None:
    """Register `R3` as the Tune trainable "R3" (done on import when Ray is installed)."""
    from ray.tune.registry import register_trainable

    from r3_rllib.algorithms.r3 import R3

    register_trainable("R3", R3)


def _register_lazily() -> None:
    # Tune resolves string trainables through RLlib's algorithm registry; adding an importer there makes "R3"
    # resolvable without importing RLlib now (keeps `import r3_rllib.envs` fast and Ray-free).
    try:
        from ray.rllib.algorithms import registry
    except ImportError:  # Ray not installed: the pure parts still work.
        return

    def _import_r3():
        from r3_rllib.algorithms.r3 import R3, R3Config

        return R3, R3Config()

    registry.ALGORITHMS.setdefault("R3", _import_r3)
    registry.ALGORITHMS_CLASS_TO_NAME.setdefault("R3", "R3")


_register_lazily()

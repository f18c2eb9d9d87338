"""r3-rllib: R^3 and GRPO for large reasoning models as a Ray RLlib plugin algorithm.

R^3 here is Replay-Reflection-Ranking (arXiv 2601.19620), not Rollout Routing Replay (the MoE routing technique
of verl, SkyRL and vLLM, also called R3).

Importing the package makes ``"R3"`` a Ray Tune trainable name, so ``tune.Tuner("R3", ...)`` works (the ``r3``
command relies on this too), without importing RLlib now: submodules that need no Ray (``r3_rllib.core``,
``r3_rllib.envs``, ``r3_rllib.rewards``) stay fast to import. ``R3`` and ``R3Config`` are imported on first use.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys

__version__ = "0.1.0"

# MKL's strict conditional numerical reproducibility: its matrix products give the same bits at every thread count,
# which cpu_threads='auto' relies on (core/threads.py). Without it some shapes round differently at 1 and 2
# threads (12 of 96 small ones tried, e.g. 10 x 100 @ 100 x 128), which gave a seeded HGPO update other last bits
# (BENCHMARKS.md section 40); large products ran as fast with it. MKL reads it when it starts, at its first call, so
# it is set on import, before any product; a value the user set wins. A product run before this import keeps MKL's
# default mode in that process: the learner then warns (core/mkl_mode.py).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

_LAZY = {"R3": "r3_rllib.algorithms.r3", "R3Config": "r3_rllib.algorithms.r3"}
_TUNE_REGISTRY = "ray.tune.registry"
_TRAINABLE = "R3"


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'r3_rllib' has no attribute {name!r}")


def _answer_for_r3(registry) -> None:
    """Make Tune's registry module resolve ``"R3"`` itself: on the first lookup of that name, the algorithm is imported
    and registered with ``tune.register_trainable``; other unknown names still go to RLlib.

    Tune resolves a name it does not know (``_has_rllib_trainable``) by registering every RLlib algorithm, which
    imports them all, and one of them (DreamerV3) builds a gymnasium env at import time that prints float32/float64
    ``Box`` warnings unrelated to the run.
    """
    ask_rllib = registry._has_rllib_trainable
    if getattr(ask_rllib, "answers_r3", False):
        return

    def has_trainable(trainable_name: str) -> bool:
        if trainable_name != _TRAINABLE:
            return ask_rllib(trainable_name)
        from r3_rllib.algorithms.r3 import R3

        registry.register_trainable(_TRAINABLE, R3)
        return True

    has_trainable.answers_r3 = True
    registry._has_rllib_trainable = has_trainable


class _AnswerWhenTuneLoads(importlib.abc.MetaPathFinder):
    """Runs ``_answer_for_r3`` right after Tune's registry module is first imported (by ``from ray import tune``)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _TUNE_REGISTRY:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_answer(module):
            exec_module(module)
            _answer_for_r3(module)

        spec.loader.exec_module = exec_and_answer
        return spec


def _make_r3_a_tune_name() -> None:
    if _TUNE_REGISTRY in sys.modules:
        _answer_for_r3(sys.modules[_TUNE_REGISTRY])
    elif not any(isinstance(f, _AnswerWhenTuneLoads) for f in sys.meta_path):
        sys.meta_path.insert(0, _AnswerWhenTuneLoads())


_make_r3_a_tune_name()

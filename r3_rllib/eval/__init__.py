"""Evaluation on math benchmarks and on any text env (``r3 eval``, ``r3 eval --env``) and training-curve plots
(``r3 plot``).

The names below are imported from their modules on first use: evaluation loads models (torch, transformers), which
reading a run's files (``r3 plot``, ``r3 report``, ``r3 samples``) does not need.
"""

from __future__ import annotations

import importlib
import sys
import types

_MODULE_OF = {
    **dict.fromkeys(
        (
            "BENCHMARKS",
            "PAPER_BENCHMARKS",
            "Benchmark",
            "get_benchmark",
            "load_benchmark",
            "parse_benchmark_names",
        ),
        "r3_rllib.eval.benchmarks",
    ),
    "evaluate_env": "r3_rllib.eval.env_eval",
    **dict.fromkeys(
        (
            "BenchmarkResult",
            "EvalReport",
            "add_eval_args",
            "evaluate",
            "pass_at_k",
            "render_prompts",
            "run_eval",
        ),
        "r3_rllib.eval.evaluate",
    ),
    **dict.fromkeys(
        ("DEFAULT_METRICS", "add_plot_args", "build_figure", "load_runs", "plot_runs", "run_plot"),
        "r3_rllib.eval.plot",
    ),
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(_MODULE_OF[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'r3_rllib.eval' has no attribute {name!r}")


class _Package(types.ModuleType):
    """The package's ``evaluate`` is the function of that name, whenever the submodule ``r3_rllib.eval.evaluate``
    is imported: the import system sets the package's attribute to the submodule once it has loaded it, which the
    eager imports this package had before replaced with the function."""

    def __setattr__(self, name: str, value) -> None:
        if name == "evaluate" and isinstance(value, types.ModuleType):
            value = value.evaluate
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))

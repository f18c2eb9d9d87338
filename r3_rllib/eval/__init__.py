"""Evaluation on math benchmarks and on any text env (``r3 eval``, ``r3 eval --env``) and training-curve plots
(``r3 plot``)."""

from r3_rllib.eval.benchmarks import (
    BENCHMARKS,
    PAPER_BENCHMARKS,
    Benchmark,
    get_benchmark,
    load_benchmark,
    parse_benchmark_names,
)
from r3_rllib.eval.env_eval import evaluate_env
from r3_rllib.eval.evaluate import (
    BenchmarkResult,
    EvalReport,
    add_eval_args,
    evaluate,
    pass_at_k,
    render_prompts,
    run_eval,
)
from r3_rllib.eval.plot import DEFAULT_METRICS, add_plot_args, build_figure, load_runs, plot_runs, run_plot

__all__ = [
    "BENCHMARKS",
    "DEFAULT_METRICS",
    "PAPER_BENCHMARKS",
    "Benchmark",
    "BenchmarkResult",
    "EvalReport",
    "add_eval_args",
    "add_plot_args",
    "build_figure",
    "evaluate",
    "evaluate_env",
    "get_benchmark",
    "load_benchmark",
    "load_runs",
    "parse_benchmark_names",
    "pass_at_k",
    "plot_runs",
    "render_prompts",
    "run_eval",
    "run_plot",
]

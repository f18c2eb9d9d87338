"""Training curves from Ray Tune trial folders: metrics against iterations and against wall-clock time.

Tune writes every trial's results twice: ``progress.csv`` (nested keys flattened with ``/``, one row per
iteration) and ``result.json`` (one JSON object per line, nested). Either is enough here; ``progress.csv`` wins
when both exist because it is what Tune keeps flat and small.

The figure has one column per metric and two rows: against ``training_iteration`` (top) and against
``time_total_s`` (bottom), so runs with different throughput can be compared both per update and per second.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import json
import math
import re
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ITERATION_KEY = "training_iteration"
TIME_KEY = "time_total_s"
PROGRESS_FILE = "progress.csv"
RESULT_FILE = "result.json"

# Column names the R^3 / GRPO algorithm logs (see r3_rllib/algorithms). The optional ones below exist only in some
# runs, so their absence from the default list is not worth a warning (a metric named with --metrics always is).
DEFAULT_METRICS: tuple[str, ...] = (
    "rollout/accuracy",
    "rollout/reward_mean",
    "rollout/zero_adv_frac",
    "rollout/response_len_mean",
    "eval/accuracy",
    "learner/critic_vf_explained_var",
    "r3/reward_kl_penalty",
    "learner/vespo_phi_mean",
)
#: Drawn when a run logs them, with no warning when none does: the held-out accuracy (periodic evaluation on), how
#: much of the returns PPO's critic explains (advantage_estimator 'gae'), the KL in the reward (verl's current_kl,
#: use_kl_in_reward) and VESPO's mean kernel weight (policy_loss 'vespo': how far off-policy the steps were).
OPTIONAL_METRICS: frozenset[str] = frozenset(
    {"eval/accuracy", "learner/critic_vf_explained_var", "r3/reward_kl_penalty", "learner/vespo_phi_mean"}
)
#: A metric's value before training, logged once by the first iteration (``eval_before_train``): drawn as the
#: curve's point at iteration 0 and time 0.
START_POINTS: dict[str, str] = {"eval/accuracy": "eval_start/accuracy"}


@dataclass
class RunCurves:
    """All numeric columns of one trial, as float arrays of equal length (NaN where a row lacks the key)."""

    label: str
    path: Path
    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0


# -- reading ----------------------------------------------------------------------------------------------------------
def _is_trial_dir(path: Path) -> bool:
    return (path / PROGRESS_FILE).is_file() or (path / RESULT_FILE).is_file()


def _collect_trial_dirs(root: Path) -> list[Path]:
    if _is_trial_dir(root):
        return [root]
    found: list[Path] = []
    for child in sorted(p for p in root.iterdir() if p.is_dir()):
        found.extend(
            _collect_trial_dirs(child)
        )  # a trial folder's own subfolders (checkpoints) are not entered
    return found


def find_trial_dirs(path: str | Path) -> list[Path]:
    """``path`` itself if it is a trial folder, else every trial folder below it (sorted)."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"run folder does not exist: {root}")
    if not root.is_dir():
        raise NotADirectoryError(f"not a folder (pass a Tune trial or experiment folder): {root}")
    found = _collect_trial_dirs(root)
    if not found:
        raise FileNotFoundError(f"no {PROGRESS_FILE} or {RESULT_FILE} in {root} or any folder below it")
    return found


def _to_float(value: Any) -> float:
    # Booleans and numbers plot; strings, lists and empty cells become NaN (Tune leaves cells empty for keys a row
    # lacks, e.g. evaluation metrics logged every k iterations).
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def _flatten(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, prefix=f"{name}/"))
        else:
            flat[name] = value
    return flat


def _columns_from_rows(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    columns = {k: np.array([_to_float(row.get(k)) for row in rows], dtype=np.float64) for k in keys}
    # Keep only columns with at least one number: text columns (trial ids, dates, hostnames) cannot be plotted.
    return {k: v for k, v in columns.items() if not np.all(np.isnan(v))}


def read_progress_csv(path: str | Path) -> dict[str, np.ndarray]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return _columns_from_rows(rows)


def read_result_json(path: str | Path) -> dict[str, np.ndarray]:
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append(_flatten(json.loads(line)))
            except json.JSONDecodeError as e:
                # A trial killed mid-write leaves a partial last line; everything before it is still good.
                warnings.warn(f"{path}:{lineno}: skipping a line that is not JSON ({e.msg})", stacklevel=2)
    return _columns_from_rows(rows)


def load_trial(trial_dir: str | Path, label: str | None = None) -> RunCurves:
    trial_dir = Path(trial_dir)
    if (trial_dir / PROGRESS_FILE).is_file():
        columns = read_progress_csv(trial_dir / PROGRESS_FILE)
    elif (trial_dir / RESULT_FILE).is_file():
        columns = read_result_json(trial_dir / RESULT_FILE)
    else:
        raise FileNotFoundError(f"no {PROGRESS_FILE} or {RESULT_FILE} in {trial_dir}")
    return RunCurves(label=label or trial_dir.name, path=trial_dir, columns=columns)


_TUNE_DATE_SUFFIX = re.compile(r"_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}$")
MAX_LABEL_CHARS = 60


def _short_trial_name(rel: Path) -> str:
    """Tune trial folders are ``<trainable>_<id>_<index>_<params>_<date>``: drop the date, cap the length."""
    name = _TUNE_DATE_SUFFIX.sub("", str(rel))
    return name if len(name) <= MAX_LABEL_CHARS else name[: MAX_LABEL_CHARS - 3] + "..."


def load_runs(run_dirs: Sequence[str | Path], labels: Sequence[str] | None = None) -> list[RunCurves]:
    """Every trial under ``run_dirs``; a label stands for all trials of its folder (suffixed with the trial name)."""
    if isinstance(run_dirs, str | Path):
        run_dirs = [run_dirs]
    if not run_dirs:
        raise ValueError("no run folder given")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"{len(labels)} labels given for {len(run_dirs)} run folders")
    runs: list[RunCurves] = []
    for i, run_dir in enumerate(run_dirs):
        trials = find_trial_dirs(run_dir)
        base = labels[i] if labels is not None else Path(run_dir).resolve().name
        for trial in trials:
            label = base if len(trials) == 1 else f"{base}/{_short_trial_name(trial.relative_to(run_dir))}"
            runs.append(load_trial(trial, label=label))
    return runs


# -- drawing ----------------------------------------------------------------------------------------------------------
def resolve_column(columns: dict[str, np.ndarray], metric: str) -> str | None:
    """The column for ``metric``: exact name, else the only column ending in ``/metric`` (RLlib may nest it)."""
    if metric in columns:
        return metric
    matches = [c for c in columns if c.endswith("/" + metric)]
    return matches[0] if len(matches) == 1 else None


def _with_start_point(
    run: RunCurves, metric: str, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` with the metric's value before training (:data:`START_POINTS`) first, at x = 0, where the run
    logged one."""
    start_name = resolve_column(run.columns, START_POINTS[metric]) if metric in START_POINTS else None
    start = run.columns[start_name][~np.isnan(run.columns[start_name])] if start_name else np.zeros(0)
    if not len(start):
        return x, y
    return np.concatenate([[0.0], x]), np.concatenate([start[:1], y])


def _x_values(run: RunCurves, key: str) -> np.ndarray | None:
    if key in run.columns:
        return run.columns[key]
    if key == ITERATION_KEY:
        return np.arange(1, len(run) + 1, dtype=np.float64)  # rows are iterations in order
    return None


def _columns_text(runs: Sequence[RunCurves], limit: int = 40) -> str:
    available = sorted({c for run in runs for c in run.columns})
    return ", ".join(available[:limit]) + (
        f" ... ({len(available)} in all)" if len(available) > limit else ""
    )


def _missing_metric_message(metric: str, runs: Sequence[RunCurves]) -> str:
    """Names the metric, the likeliest columns meant, and the columns the runs have."""
    available = sorted({c for run in runs for c in run.columns})
    group = metric.rpartition("/")[0]
    same_group = [c for c in available if group and c.rpartition("/")[0] == group]
    # The likeliest first: of the metric's own group (eval/, rollout/, ...) if it has columns, else of all of them.
    close = difflib.get_close_matches(metric, same_group or available, n=3, cutoff=0.0 if same_group else 0.8)
    hint = f" (closest: {', '.join(close)})" if close else ""
    return f"metric {metric!r} is in no run; skipping it{hint}. Columns there: {_columns_text(runs)}"


def build_figure(
    runs: Sequence[RunCurves],
    metrics: Sequence[str] = DEFAULT_METRICS,
    optional: frozenset[str] = OPTIONAL_METRICS,
):
    """A matplotlib Figure: one column per metric found in any run, rows against iteration and time. A metric no
    run has is skipped with a warning naming it and the columns there, except those in ``optional``."""
    import matplotlib

    matplotlib.use("Agg")  # no display on clusters and CI; must precede pyplot's first import
    import matplotlib.pyplot as plt

    present: list[str] = []
    for metric in metrics:
        if any(resolve_column(run.columns, metric) is not None for run in runs):
            present.append(metric)
        elif metric not in optional:
            warnings.warn(_missing_metric_message(metric, runs), stacklevel=2)
    if not present:
        shown = _columns_text(runs)
        raise ValueError(
            f"none of the metrics {list(metrics)} is in {[str(r.path) for r in runs]}; columns there: {shown}"
        )
    for run in runs:
        if TIME_KEY not in run.columns:
            warnings.warn(f"{run.path}: no {TIME_KEY!r} column; left out of the time row", stacklevel=2)

    ncols = len(present)
    fig, axes = plt.subplots(2, ncols, figsize=(4.2 * ncols, 6.6), squeeze=False)
    for col, metric in enumerate(present):
        for row, x_key in enumerate((ITERATION_KEY, TIME_KEY)):
            ax = axes[row][col]
            for run in runs:
                name = resolve_column(run.columns, metric)
                x = _x_values(run, x_key)
                if name is None or x is None:
                    continue
                y = run.columns[name]
                keep = ~(np.isnan(x) | np.isnan(y))  # sparse metrics (eval every k iterations) leave gaps
                x, y = _with_start_point(run, metric, x[keep], y[keep])
                ax.plot(x, y, marker="." if len(x) < 30 else None, label=run.label)
            ax.set_xlabel(x_key)
            ax.set_ylabel(metric)
            ax.set_title(f"{metric} vs {'iteration' if x_key == ITERATION_KEY else 'time (s)'}")
            ax.grid(True, alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    if handles:
        # As many legend columns as the figure width holds (~11 characters per inch), rows above the grid.
        width_chars = int(fig.get_figwidth() * 11)
        legend_cols = max(1, min(len(names), width_chars // (max(len(x) for x in names) + 6)))
        legend_rows = math.ceil(len(names) / legend_cols)
        fig.legend(handles, names, loc="upper center", ncol=legend_cols, frameon=False)
        fig.tight_layout(rect=(0, 0, 1, max(0.6, 1 - 0.045 * (legend_rows + 0.5))))
    else:
        fig.tight_layout()
    return fig


#: The file written when ``--out`` names an existing folder.
DEFAULT_PNG = "curves.png"


def output_path(out: str | Path) -> Path:
    """The file ``out`` names: an existing folder gets ``curves.png`` inside it, a name without an extension gets
    ``.png``. Matplotlib adds that extension itself, so the path said to be written was another file's
    (``--out runs/`` wrote ``runs.png`` beside the folder and printed ``wrote runs``)."""
    path = Path(out)
    if path.is_dir():
        return path / DEFAULT_PNG
    return path if path.suffix else path.with_name(path.name + ".png")


def plot_runs(
    run_dirs: Sequence[str | Path] | str | Path,
    out_png: str | Path,
    *,
    metrics: Sequence[str] = DEFAULT_METRICS,
    labels: Sequence[str] | None = None,
    optional: frozenset[str] = OPTIONAL_METRICS,
) -> Path:
    """Plot ``metrics`` of every trial under ``run_dirs`` into ``out_png``; return its path. A metric no run has is
    skipped with a warning (none for those in ``optional``)."""
    import matplotlib.pyplot as plt

    if isinstance(run_dirs, str | Path):
        run_dirs = [run_dirs]
    out = output_path(out_png)
    runs = load_runs(run_dirs, labels)
    fig = build_figure(runs, metrics, optional)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(out, dpi=100)
    finally:
        plt.close(fig)
    return out


# -- command line -----------------------------------------------------------------------------------------------------
def _split_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def add_plot_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("run_dirs", nargs="+", help="Ray Tune trial folders or experiment folders")
    parser.add_argument("--out", default="curves.png", help="PNG to write (default: curves.png)")
    parser.add_argument(
        "--metrics",
        type=_split_list,
        default=None,
        help=f"comma-separated metric columns (default: {','.join(DEFAULT_METRICS)}); one no run has is named in a "
        "warning with the columns there",
    )
    parser.add_argument(
        "--labels", type=_split_list, default=None, help="comma-separated legend labels, one per folder"
    )
    return parser


def run_plot(args: argparse.Namespace) -> int:
    # Metrics named on the command line are all expected: a missing one is warned about, eval/accuracy included.
    metrics = args.metrics if args.metrics is not None else DEFAULT_METRICS
    optional = OPTIONAL_METRICS if args.metrics is None else frozenset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = plot_runs(args.run_dirs, args.out, metrics=metrics, labels=args.labels, optional=optional)
        except (OSError, ValueError) as e:
            out = e
    for warning in caught:
        if issubclass(warning.category, UserWarning):
            print(f"r3 plot: warning: {warning.message}", file=sys.stderr)
        else:  # not the plot's (a ResourceWarning of an object collected meanwhile): the usual route and filters
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if isinstance(out, Exception):
        print(f"r3 plot: error: {out}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0

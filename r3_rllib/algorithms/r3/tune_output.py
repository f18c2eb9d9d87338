"""What a Tune run of `R3` prints and writes: the progress line on the driver, a ``progress.csv`` that holds every
metric, and trials named after their method.

- :class:`ProgressLineCallback` prints one line per trial result (:func:`~.progress.format_progress_line`) on the
  driver: a trial actor's own output does not reach the console (``r3 train`` starts Ray without it).
- :class:`R3CSVLoggerCallback` replaces Tune's ``CSVLoggerCallback``, which fixes the columns by a trial's first
  result and silently drops every key that appears later: the held-out ``eval/accuracy`` (first measured at
  iteration ``eval_interval``), R^2PO's stage-B numbers, a learner metric of the first update after an empty batch.
  Here a new key widens the file: it is rewritten once with the new header (earlier rows leave the cell empty).
- :func:`trial_name` names a trial ``<method>_<env>_<trial id>`` (``grpo_arithmetic_fca17_00000``) instead of
  Tune's ``R3_<env>_<trial id>``; the trial folder starts with it.

``r3 train`` uses all three (:func:`run_callbacks`, :func:`tune_config`); in Python, pass them to ``tune.RunConfig(callbacks=[...])`` and
``tune.TuneConfig(trial_name_creator=trial_name)``.
"""

from __future__ import annotations

import csv
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ray.air.constants import EXPR_PROGRESS_FILE
from ray.tune import Callback
from ray.tune.logger import CSVLoggerCallback
from ray.tune.utils import flatten_dict

from r3_rllib.algorithms.r3.health_monitor import HealthWarningCallback
from r3_rllib.algorithms.r3.progress import format_progress_line, method_name


class ProgressLineCallback(Callback):
    """Prints each trial result's progress line on the driver, and where each trial's results are written.

    ``total``: the run's length in iterations (``stop.training_iteration``) for ``x/N`` and the ETA. With more than
    one trial in the experiment, each line starts with the trial's name."""

    def __init__(self, total: int | None = None, stream: Any = None) -> None:
        self.total = total
        self.stream = stream

    def _print(self, text: str) -> None:
        print(text, file=self.stream or sys.stdout, flush=True)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._print(f"{trial}: results in {shown_path(getattr(trial, 'path', None) or trial.local_path)}")

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        line = format_progress_line(result, self.total)
        self._print(f"{trial}: {line}" if len(trials) > 1 else line)


def shown_path(path: str) -> str:
    """``path`` relative to the working folder when it lies below it (``runs/<name>/<trial>``), else as it is."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive, or a URI
        return path
    return path if relative.startswith("..") or "://" in path else relative


class R3CSVLoggerCallback(CSVLoggerCallback):
    """Tune's ``progress.csv`` writer with columns that grow as new metrics appear (see the module docstring). A
    resumed trial appends under the file's own header (widened if the resumed run has more keys)."""

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        if trial not in self._trial_files:
            self._setup_trial(trial)
        flat = dict(result)
        flat.pop("config", None)
        row = flatten_dict(flat, delimiter="/")
        writer = self._trial_csv[trial]
        if writer is None:
            path = Path(trial.local_path, EXPR_PROGRESS_FILE)
            header = read_csv_header(path) if self._trial_continue[trial] else []
            writer = self._open_writer(trial, header or list(row), write_header=not header)
        new = [key for key in row if key not in writer.fieldnames]
        if new:
            writer = self._widen(trial, [*writer.fieldnames, *new])
        writer.writerow({key: value for key, value in row.items() if key in writer.fieldnames})
        self._trial_files[trial].flush()

    def _open_writer(self, trial: Any, fields: Sequence[str], *, write_header: bool) -> csv.DictWriter:
        writer = csv.DictWriter(self._trial_files[trial], list(fields))
        if write_header:
            writer.writeheader()
        self._trial_csv[trial] = writer
        return writer

    def _widen(self, trial: Any, fields: list[str]) -> csv.DictWriter:
        """Rewrite the trial's file under ``fields`` (its rows kept, the new cells empty) and append to it from now."""
        self._trial_files[trial].close()
        path = Path(trial.local_path, EXPR_PROGRESS_FILE)
        rewrite_csv_columns(path, fields)
        self._trial_files[trial] = path.open("a", newline="")
        return self._open_writer(trial, fields, write_header=False)


def read_csv_header(path: str | Path) -> list[str]:
    """The column names of the CSV file at ``path`` (empty when it has none)."""
    try:
        with open(path, newline="") as f:
            return next(csv.reader(f), [])
    except FileNotFoundError:
        return []


def rewrite_csv_columns(path: str | Path, fields: Sequence[str]) -> None:
    """Rewrite the CSV file at ``path`` with the columns ``fields`` (a superset of its own, in that order): each row
    keeps its values, the new columns stay empty. Written beside it and renamed over it, so a reader sees the old or
    the new file, never a half-written one."""
    path = Path(path)
    rows: list[dict[str, str]] = []
    if path.exists():
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, list(fields), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def trial_name(trial: Any) -> str:
    """``<method>_<env>_<trial id>`` (:func:`~.progress.method_name`), e.g. ``grpo_arithmetic_fca17_00000``; Tune's
    ``trial_name_creator`` (the trial's folder name starts with it)."""
    config = trial.config if isinstance(trial.config, Mapping) else {}
    env = config.get("env")
    env = env.__name__ if isinstance(env, type) else env
    parts = [method_name(config), str(env) if env else None, trial.trial_id]
    return re.sub(r"[^A-Za-z0-9_.=-]", "_", "_".join(p for p in parts if p))


def run_callbacks(callbacks: list | None, spec: Any) -> list:
    """``callbacks`` (a run's trackers, or None) as an ``r3 train`` run of ``spec`` (a run file's ``RunSpec``) needs
    them: Tune's CSV writer replaced by :class:`R3CSVLoggerCallback` (added where Tune would add its own: Tune then
    keeps adding its JSON and TensorBoard writers), the progress line when the config's ``progress`` is on, with
    ``stop.training_iteration`` as the run's length, and the health warnings (:class:`HealthWarningCallback`)."""
    # An exact Tune CSV writer only: a subclass of it is someone's own.
    out = [R3CSVLoggerCallback() if type(c) is CSVLoggerCallback else c for c in callbacks or []]
    auto_loggers = os.environ.get("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "0") != "1"
    if auto_loggers and not any(isinstance(c, CSVLoggerCallback) for c in out):
        out.append(R3CSVLoggerCallback())
    if getattr(spec.config, "progress", True):
        out.append(ProgressLineCallback((spec.stop or {}).get("training_iteration")))
    # The trial's own warning lines stay in its worker's log under `r3 train`: the driver prints them from results.
    out.append(HealthWarningCallback())
    return out


def tune_config(run: Mapping[str, Any]) -> Any:
    """Tune's TuneConfig for a run file's ``run`` section: its ``num_samples``, trials named by :func:`trial_name`."""
    from ray import tune

    return tune.TuneConfig(num_samples=int(run.get("num_samples", 1)), trial_name_creator=trial_name)

"""Experiment trackers named in a run file: ``run.loggers: [tensorboard, csv, json, wandb, mlflow]`` become Ray
Tune's logger callbacks, each tracker with its options from ``run.wandb`` / ``run.mlflow``::

    run:
      loggers: [tensorboard, csv, wandb, mlflow]
      wandb: {project: my-project, mode: offline}      # keywords of WandbLoggerCallback and wandb.init
      mlflow: {tracking_uri: "http://mlflow:5000"}      # keywords of MLflowLoggerCallback

Without ``loggers`` Tune writes its defaults (tensorboard, csv, json). With it, exactly the named ones are written
(Tune's automatic loggers are switched off), and always ``json``: ``result.json`` is the run's own record that
``r3 export`` reads the final metrics from.

- **W&B** (``wandb``): one W&B run per trial in ``project`` (default: the run's name; Tune's WandbLoggerCallback: a
  small actor beside the trial), with the trial's config, every numeric result per iteration (step = training_iteration) and, when the trial writes sample
  records, a table of a few of them. Offline runs are written in the trial's folder (``<trial>/wandb/``; set
  ``mode: offline`` or ``WANDB_MODE=offline``; ``wandb sync <trial>/wandb/offline-run-*`` uploads them later).
  Online, W&B needs ``wandb login`` or ``WANDB_API_KEY``; a key is never read from the run file.
- **MLflow** (``mlflow``): one MLflow run per trial in the experiment ``experiment_name`` (default: the run's name),
  its params the trial's config, its metrics the numeric results per iteration, and the sample table as a JSON
  artifact. Without ``tracking_uri`` (and no ``MLFLOW_TRACKING_URI``) it writes a local file store beside the run,
  ``<storage>/<name>/mlruns``: nothing leaves the machine unless a server is named.

The trackers need the ``trackers`` extra (``pip install 'r3-rllib[trackers]'``: wandb and mlflow-skinny).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

#: The names ``run.loggers`` accepts, in the order their callbacks run.
KNOWN_LOGGERS = ("tensorboard", "csv", "json", "wandb", "mlflow")
#: What Tune writes when ``run.loggers`` is not given.
DEFAULT_LOGGERS = ("tensorboard", "csv", "json")
#: Written whatever ``run.loggers`` names: the run's own record of every result.
ALWAYS_LOGGED = ("json",)
#: The package each tracker imports (checked before Ray starts).
TRACKER_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}
#: Keywords of ``run.wandb``: WandbLoggerCallback's own, then wandb.init's that Tune leaves to the user.
WANDB_OPTIONS = (
    "project",
    "group",
    "api_key_file",
    "excludes",
    "log_config",
    "upload_checkpoints",
    "upload_timeout",
    "entity",
    "mode",
    "dir",
    "name",
    "notes",
    "tags",
    "job_type",
    "save_code",
)
WANDB_MODES = ("online", "offline", "disabled")
#: Keywords of ``run.mlflow`` (MLflowLoggerCallback's, less the token: MLFLOW_TRACKING_TOKEN holds it).
MLFLOW_OPTIONS = (
    "tracking_uri",
    "registry_uri",
    "experiment_name",
    "tags",
    "save_artifact",
    "log_params_on_trial_end",
)
#: Secrets that a run file (often committed, copied into the run's params.json) must not hold.
SECRET_OPTIONS = {
    "wandb": {"api_key": "`wandb login`, WANDB_API_KEY or api_key_file"},
    "mlflow": {"tracking_token": "MLFLOW_TRACKING_TOKEN"},
}
#: Sample records per iteration in a tracker's table, and their columns (r3_rllib/rollout/records.py).
SAMPLE_TABLE_ROWS = 8
SAMPLE_COLUMNS = (
    "iteration",
    "group",
    "sample",
    "prompt_text",
    "response_text",
    "reward",
    "correct",
    "grade_reason",
    "advantage",
    "trained",
    "response_len",
    "policy_version",
)


def tracker_errors(run: Mapping[str, Any]) -> list[str]:
    """What is wrong with the tracker keys of a run file's ``run`` section (``loggers``, ``wandb``, ``mlflow``):
    unknown logger names (the known ones named), options for a tracker the loggers do not name, unknown or secret
    options, a tracker whose package is not installed. The types of the three keys are RunSettings' to check."""
    names = run.get("loggers")
    errors: list[str] = []
    if isinstance(names, list):
        for name in names:
            if name not in KNOWN_LOGGERS:
                errors.append(f"run.loggers: unknown logger {name!r}; known: {', '.join(KNOWN_LOGGERS)}")
    chosen = set(names) if isinstance(names, list) else set(DEFAULT_LOGGERS)
    for tracker, known in (("wandb", WANDB_OPTIONS), ("mlflow", MLFLOW_OPTIONS)):
        options = run.get(tracker)
        if not isinstance(options, Mapping):
            continue
        if options and tracker not in chosen:
            errors.append(f"run.{tracker} is set, but run.loggers does not name {tracker!r}")
        errors += _option_errors(tracker, options, known)
    for tracker, package in TRACKER_PACKAGES.items():
        if tracker in chosen and importlib.util.find_spec(package) is None:
            errors.append(
                f"run.loggers names {tracker!r}, but {package} is not installed: pip install 'r3-rllib[trackers]'"
            )
    return errors


def _option_errors(tracker: str, options: Mapping[str, Any], known: tuple[str, ...]) -> list[str]:
    from r3_rllib.config.field import unknown_key_message

    errors = []
    for key in options:
        if key in SECRET_OPTIONS[tracker]:
            errors.append(
                f"run.{tracker}.{key}: a secret does not belong in a run file; use {SECRET_OPTIONS[tracker][key]}"
            )
        elif key not in known:
            errors.append(unknown_key_message(key, known, f"section 'run.{tracker}'"))
    mode = options.get("mode") if tracker == "wandb" else None
    if mode is not None and mode not in WANDB_MODES:
        errors.append(f"run.wandb.mode must be one of {list(WANDB_MODES)}, got {mode!r}")
    return errors


def tracker_callbacks(run: Mapping[str, Any], *, experiment: str, exp_dir: str) -> list | None:
    """Tune's logger callbacks for a run file's ``run`` section (checked by :func:`tracker_errors`); None when it
    names no ``loggers`` (Tune's defaults). Switches off Tune's automatic loggers in this process
    (TUNE_DISABLE_AUTO_CALLBACK_LOGGERS), so only the named ones write: call it before ``Tuner.fit``, for a new
    run and a resumed one alike."""
    names = run.get("loggers")
    if names is None:
        return None
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    chosen = set(names) | set(ALWAYS_LOGGED)
    return [_callback(name, run, experiment, exp_dir) for name in KNOWN_LOGGERS if name in chosen]


def _callback(name: str, run: Mapping[str, Any], experiment: str, exp_dir: str):
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback

    if name == "tensorboard":
        return TBXLoggerCallback()
    if name == "csv":
        return CSVLoggerCallback()
    if name == "json":
        return JsonLoggerCallback()
    from r3_rllib.algorithms.r3 import tracker_callbacks as tc

    if name == "wandb":
        options = {"project": experiment, **dict(run.get("wandb") or {})}
        return tc.R3WandbLoggerCallback(**options)
    options = dict(run.get("mlflow") or {})
    options.setdefault("experiment_name", experiment)
    if not options.get("tracking_uri") and not os.environ.get("MLFLOW_TRACKING_URI"):
        options["tracking_uri"] = "file://" + os.path.join(os.path.abspath(exp_dir), "mlruns")
    return tc.R3MLflowLoggerCallback(**options)


def sample_rows(
    trial_dir: str, iteration: int | None, limit: int, filesystem: Any = None
) -> list[dict[str, Any]]:
    """Up to ``limit`` of the sample records the trial wrote for ``iteration`` (``<trial>/samples/``, on the pyarrow
    ``filesystem``; None: the local one), as rows of :data:`SAMPLE_COLUMNS` for a tracker's table: every group's
    first sample first. Empty when the trial wrote none, or they cannot be read (a table is not worth a failed
    run)."""
    if iteration is None or limit <= 0:
        return []
    try:
        from r3_rllib.rollout.records import SAMPLES_DIR, iteration_file, preview, read_rows
    except ImportError:  # a package without sample records
        return []
    path = f"{trial_dir}/{SAMPLES_DIR}/{iteration_file(iteration)}"
    try:
        rows = read_rows(path, filesystem=filesystem)
    except (OSError, ValueError) as e:
        if not isinstance(e, FileNotFoundError):
            logger.warning("sample table of iteration %s not logged: %s: %s", iteration, path, e)
        return []
    return [{c: row.get(c) for c in SAMPLE_COLUMNS} for row in preview(rows, limit)]

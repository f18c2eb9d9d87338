"""The `r3` command: train (through Ray Tune), build-model (a named model into its cache), sft (tiny warm
start), eval (benchmarks), plot (learning curves), report (a run's HTML page), samples (its recorded
completions), export (a Hugging Face folder of a checkpoint)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any

PROGRESS_COLUMNS = {
    "training_iteration": "iter",
    "rollout/accuracy": "acc",
    "rollout/reward_mean": "reward",
    "rollout/zero_adv_frac": "zero_adv",
    "eval/accuracy": "eval_acc",
    "rollout/gen_tokens_per_s": "gen_tok/s",
}


def _train(args) -> int:
    from r3_rllib.ray_session import local_cluster_requested
    from r3_rllib.train_config import ConfigError, load_run_file

    # A private cluster's runners see the packages this process sees: an env name unknown here is an error now.
    local = local_cluster_requested(args.address)
    try:
        spec = load_run_file(args.config, [*(args.set or []), *_log_samples(args)], check_env=local)
    except ConfigError as e:
        print(f"r3 train: {e}", file=sys.stderr)
        return 2
    if not local:
        _warn_env_unknown_here(spec)
    if args.address and args.num_cpus is not None:
        print("r3 train: --num-cpus sizes a local Ray; it cannot be combined with --address", file=sys.stderr)
        return 2
    if not _check_schedule(spec):
        return 2
    run = spec.run
    name = run.get("name") or Path(args.config).stem  # None, as the settings document: the run file's name
    storage = os.path.abspath(os.path.expanduser(run.get("storage_path") or "runs"))
    exp_dir = os.path.join(storage, name)
    # Ray's newer console output ignores custom progress columns; the classic reporter shows ours.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    if not args.verbose:
        # Tune logs each failed trial's whole traceback (Tune's and Ray's frames first); the summary below says what
        # failed, and the traceback stays in the trial's error.txt.
        os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
    from ray import tune

    from r3_rllib.algorithms.r3.tune_output import tune_config
    from r3_rllib.ray_session import init_ray

    if args.resume and not tune.Tuner.can_restore(exp_dir):
        print(f"r3 train: nothing to resume in {exp_dir}", file=sys.stderr)
        return 2
    if args.resume and not check_resume(exp_dir):
        return 2
    if args.resume:
        _warn_kept_stop(spec.stop, exp_dir)
    else:
        _note_earlier_run(exp_dir, _resume_command(args))
    # A private cluster keeps token authentication on (ray_session.py).
    init_ray(args.address, log_to_driver=args.verbose, num_cpus=args.num_cpus)
    run_config = _run_config(spec, name, storage, exp_dir, args.verbose)
    # "R3" is a Tune name since this package was imported (r3_rllib/__init__.py).
    if args.resume:
        # Tune restores the experiment as it was started (stop criteria and run settings included).
        tuner = tune.Tuner.restore(exp_dir, trainable="R3", resume_errored=True, param_space=spec.config)
    else:
        tuner = tune.Tuner(
            "R3",
            param_space=spec.config,
            tune_config=tune_config(run),
            run_config=run_config,
        )
    return _fit_and_report(tuner, args.config, storage, exp_dir)


def _warn_env_unknown_here(spec) -> None:
    """Joining a cluster: an env name this process does not know may still be known where the runners run (a
    package installed on those nodes only), so it is a warning, not an error."""
    from r3_rllib.train_config import env_name_error

    error = env_name_error(spec.config)
    if error is not None:
        print(f"r3 train: warning: {error}; the cluster's EnvRunners must know it", file=sys.stderr)


def _restored_trials(exp_dir: str) -> list[dict] | None:
    """The trials of ``exp_dir``'s newest experiment state (Tune's saved Trial states: the ones ``Tuner.restore``
    restores; an earlier run of the same name has its own state file), or None when it cannot be read."""
    import json

    states = _state_files(exp_dir)
    try:
        with open(states[-1], "rb") as f:
            trials = [json.loads(trial_json) for trial_json, _ in json.loads(f.read())["trial_data"]]
    except (IndexError, KeyError, TypeError, ValueError, OSError):
        return None
    return trials if all(isinstance(t, dict) for t in trials) else None


def restored_stops(exp_dir: str) -> list[dict] | None:
    """The stop criteria each trial of ``exp_dir``'s newest experiment state was started with (what Tune's restore
    keeps), without None values; None when the state cannot be read (check_resume reports that)."""
    trials = _restored_trials(exp_dir)
    if trials is None:
        return None
    stops = [t.get("stopping_criterion") or {} for t in trials]
    return [{k: v for k, v in stop.items() if v is not None} for stop in stops if isinstance(stop, dict)]


def _resumed_trial_dirs(exp_dir: str) -> list[str]:
    """The trial folders ``--resume`` continues: those the newest experiment state names that exist (not an earlier
    run's of the same name beside them; none for trials that never started)."""
    named = [t.get("relative_logdir") for t in _restored_trials(exp_dir) or []]
    dirs = sorted(os.path.join(exp_dir, n) for n in named if isinstance(n, str) and n)
    return [d for d in dirs if os.path.isdir(d)]


def _state_files(exp_dir: str) -> list[str]:
    """Tune's experiment states in ``exp_dir``, oldest first (the newest is the one ``Tuner.restore`` reads)."""
    import glob

    # Escaped: a run name may hold glob's characters ("lr[3e-4]").
    return sorted(glob.glob(os.path.join(glob.escape(exp_dir), "experiment_state-*.json")))


def _trial_dirs(exp_dir: str) -> list[str]:
    """Every folder in ``exp_dir`` (trials of every run of this name, and a tracker's folder such as mlruns)."""
    return (
        sorted(entry.path for entry in os.scandir(exp_dir) if entry.is_dir())
        if os.path.isdir(exp_dir)
        else []
    )


def _warn_kept_stop(stop: dict | None, exp_dir: str) -> None:
    """--resume: Tune restores each trial with the stop criteria it was started with (they are part of its saved
    state, and a trial that met them is finished): a different stop in the run file or ``--set`` is not applied."""
    wanted = {k: v for k, v in (stop or {}).items() if v is not None}
    kept = [s for s in restored_stops(exp_dir) or [] if s != wanted]
    if not kept:
        return
    print(
        f"r3 train: warning: --resume keeps the stop condition the run was started with ({_stop_text(kept[0])}), "
        f"not the one given now ({_stop_text(wanted)}): Tune restores an experiment as it was started, and a trial "
        f"that reached its stop stays finished. To train longer, start a new run (another run.name) with the longer "
        f"stop from this one's newest checkpoint: --set training.resume_from_checkpoint=<its trial's folder> "
        f"(README: r3 train --resume).",
        file=sys.stderr,
    )


def _stop_text(stop: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(stop.items())) or "none"


def _resume_command(args) -> str:
    """The command that resumes this run: its run file, and the overrides that place its folder."""
    import shlex

    where = [
        o for o in args.set or [] if o.split("=", 1)[0].strip() in ("run", "run.name", "run.storage_path")
    ]
    return shlex.join(["r3", "train", args.config, "--resume", *(a for o in where for a in ("--set", o))])


def _note_earlier_run(exp_dir: str, resume_command: str) -> None:
    """A new run in a folder that holds an earlier one (the same run.name): Tune adds its trial beside the earlier
    trials (nothing is moved or deleted); one line says so, and how to start fresh or continue instead."""
    if not _state_files(exp_dir):
        return
    trials = [p for p in _trial_dirs(exp_dir) if os.path.basename(p) != "mlruns"]
    print(
        f"r3 train: note: {exp_dir} already holds an earlier run ({len(trials)} trial folder(s)); this run adds its "
        f"trial beside them (r3 samples shows them all, r3 export needs the trial's folder). Start fresh with "
        f"another name (--set run.name=...) or another run.storage_path, or continue the earlier run with "
        f"`{resume_command}`.",
        file=sys.stderr,
    )


def _run_config(spec, name: str, storage: str, exp_dir: str, verbose: bool):
    """Tune's RunConfig of the run file's ``run`` section: checkpoints, failures, our progress columns and line,
    the named trackers and (log_samples) the sample rows."""
    from ray import tune

    from r3_rllib.algorithms.r3.trackers import tracker_callbacks
    from r3_rllib.algorithms.r3.tune_output import run_callbacks

    run = spec.run
    run_config = tune.RunConfig(
        name=name,
        storage_path=storage,
        stop={k: v for k, v in (spec.stop or {}).items() if v is not None} or None,  # None: no such stop
        checkpoint_config=tune.CheckpointConfig(
            checkpoint_frequency=int(run.get("checkpoint_frequency", 0)),
            checkpoint_at_end=bool(run.get("checkpoint_at_end", True)),
            num_to_keep=run.get("keep_checkpoints_num"),
        ),
        progress_reporter=tune.CLIReporter(metric_columns=PROGRESS_COLUMNS, max_report_frequency=5),
        # run.loggers: the named trackers only (a resumed run keeps its own, and needs Tune's automatic ones off).
        callbacks=tracker_callbacks(run, experiment=name, exp_dir=exp_dir),
        # A trial that failed (a learner died) restarts from its newest complete checkpoint (R3.restore).
        failure_config=tune.FailureConfig(max_failures=int(run.get("max_failures", 0))),
        verbose=int(run.get("verbose", 0)),
    )
    run_config.callbacks = run_callbacks(run_config.callbacks, spec)  # progress line, progress.csv's columns
    _print_sample_rows(run_config, spec.config.log_samples, verbose)
    return run_config


def _log_samples(args) -> list[str]:
    """``--log-samples N`` as the override ``training.log_samples=N`` (checked with the run file's settings)."""
    return [] if args.log_samples is None else [f"training.log_samples={args.log_samples}"]


def _print_sample_rows(run_config, n: int, verbose: bool) -> None:
    """log_samples > 0: the driver prints each iteration's recorded rows (sample_log.py); the trials' own output,
    where the algorithm prints them too, shows only with --verbose."""
    if n and not verbose:
        from r3_rllib.algorithms.r3.sample_log import SampleRowsCallback

        run_config.callbacks = [*(run_config.callbacks or []), SampleRowsCallback(n)]


def _fit_and_report(tuner, config_path: str, storage: str, exp_dir: str) -> int:
    """Run the experiment and print one line per trial (and its error); 1 if a trial failed or the disk filled."""
    try:
        results = tuner.fit()
    # Tune's driver writes results and its experiment state itself: a full disk there lands here.
    except Exception as e:
        if not _disk_full(e, storage):
            raise
        print(
            f"r3 train: the disk holding {storage} is full ({type(e).__name__}: {e}). Free space, then continue "
            f"with `r3 train {config_path} --resume`: it resumes each trial from its newest complete checkpoint.",
            file=sys.stderr,
        )
        return 1
    failed = [r for r in results if r.error]
    for r in results:
        m = r.metrics or {}
        acc = (m.get("rollout") or {}).get("accuracy")
        error = _error_summary(r.error) if r.error else None
        print(f"trial {r.path}: iterations={m.get('training_iteration')} accuracy={acc} error={error}")
        if error:
            print(f"r3 train: {error} (traceback: {os.path.join(r.path, 'error.txt')})", file=sys.stderr)
    from r3_rllib.algorithms.r3.tune_output import shown_path

    print(f"results in {shown_path(exp_dir)}")
    if any(r.metrics for r in results):  # a run that failed before its first iteration has nothing to show
        print("\n".join(next_steps(exp_dir, [str(r.path) for r in results])))
    return 1 if failed else 0


def next_steps(exp_dir: str, trials: list[str]) -> list[str]:
    """The commands that show, export and continue a finished run, as ``r3 train`` prints them at its end (the
    export and the Python line for the first trial with a checkpoint); paths below the working folder relative."""
    import shlex

    from r3_rllib.algorithms.r3.checkpoint_files import trial_checkpoints
    from r3_rllib.algorithms.r3.tune_output import shown_path

    run = shlex.quote(shown_path(exp_dir))
    lines = [
        "next:",
        f"  r3 report {run} -o report.html   # one HTML page: curves, health checks, samples",
        f"  r3 samples {run}   # the completions, with rewards",
        f"  tensorboard --logdir {run}   # the curves",
    ]
    saved = next((t for t in trials if os.path.isdir(t) and trial_checkpoints(t)), None)
    if saved is not None:
        lines += [
            f"  r3 export {shlex.quote(shown_path(saved))} --out <folder>   # a Hugging Face folder of its newest "
            "checkpoint",
            f"  in Python: R3.from_checkpoint({shown_path(saved)!r})   # the algorithm back (from r3_rllib import R3)",
        ]
    return lines


def _disk_full(error: BaseException, storage: str) -> bool:
    from r3_rllib.algorithms.r3.checkpoint_files import is_disk_full

    return is_disk_full(error, storage)


def check_resume(exp_dir: str) -> bool:
    """Before Tune restores ``exp_dir``: its experiment state must be readable (Tune would otherwise log "Failed to
    restore the run state" and start every trial again from iteration 1, e.g. after a full disk truncated it), and
    the checkpoints of each trial it restores (not an earlier run's of the same name) are verified newest first
    (checkpoint.newest_complete_checkpoint): refused ones are set aside (renamed ``<name>.incomplete``), and the one
    each trial resumes from is printed. Nothing is set aside when the resume is refused. The trial itself restores
    its newest complete checkpoint (R3.restore), also one newer than Tune's experiment state records."""
    from r3_rllib.algorithms.r3.checkpoint import CheckpointFormatError, newest_complete_checkpoint

    unreadable = _unreadable_state(exp_dir)
    if unreadable is not None:
        # A quick look, moving nothing: the folder may hold other runs' trials, and this resume stops here.
        good = [
            newest_complete_checkpoint(d, set_aside=False, hashes=False).path for d in _trial_dirs(exp_dir)
        ]
        listed = ", ".join(p for p in good if p) or "none"
        print(
            f"r3 train: cannot resume: {unreadable}, and Tune would start the run again from iteration 1. The "
            f"newest checkpoint of each trial with every file present at its recorded size is still usable "
            f"(R3.restore / Algorithm.restore, which check the files' hashes): {listed}",
            file=sys.stderr,
        )
        return False
    choices, ok = {}, True
    for trial in _resumed_trial_dirs(exp_dir):
        try:
            choices[trial] = newest_complete_checkpoint(trial)
        except CheckpointFormatError as e:
            print(f"r3 train: {e}", file=sys.stderr)
            ok = False
    for trial, choice in choices.items():
        for reason in choice.refused:
            print(f"r3 train: checkpoint refused: {reason}", file=sys.stderr)
        if choice.path is not None:
            iteration = (choice.manifest.meta if choice.manifest else {}).get("iteration", "?")
            print(f"r3 train: {os.path.basename(trial)} resumes from {choice.path} (iteration {iteration})")
        elif choice.refused:
            print(f"r3 train: {trial}: no complete checkpoint left", file=sys.stderr)
    return ok


def _unreadable_state(exp_dir: str) -> str | None:
    """What is wrong with ``exp_dir``'s newest experiment state, or None when it reads as JSON."""
    import json

    states = _state_files(exp_dir)
    if not states:
        return (
            f"{exp_dir} holds no experiment state (experiment_state-*.json): the run stopped before Tune first "
            f"saved it"
        )
    try:
        with open(states[-1], "rb") as f:
            json.loads(f.read())
    except (ValueError, OSError) as e:
        why = f"{type(e).__name__}: {e}; truncated by a full disk?"
        return f"Tune's experiment state {states[-1]} is unreadable ({why})"
    return None


def _check_schedule(spec) -> bool:
    """With a stop iteration in the run file: print when each R^3 part switches on (r3_schedule.py) and warn about
    parts the run never reaches; False on settings that make a part pointless. The data size comes from building
    the train env once here (as a runner would); when that fails, the runs' setup checks what needs no stop."""
    stop = (spec.stop or {}).get("training_iteration")
    config = spec.config
    if stop is None or not (config.replay or config.reflection or config.ranking):
        return True
    from r3_rllib.algorithms.r3.r3_schedule import schedule_for_config
    from r3_rllib.algorithms.r3.runner_setup import build_env, load_policy_tokenizer
    from r3_rllib.warmstart import build_named_models

    try:
        build_named_models(config.model_paths)  # a name resolves only once built
        size = len(build_env(config.env, dict(config.env_config), load_policy_tokenizer(config)))
    except Exception as e:  # the runners will report it with their own error; here it only skips the check
        print(f"r3 train: R^3 schedule not checked here (data size unknown: {e})", file=sys.stderr)
        return True
    schedule = schedule_for_config(config, size, stop_iteration=int(stop))
    print(f"r3 train: R^3 schedule: {schedule.summary()}")
    for warning in schedule.warnings:
        print(f"r3 train: warning: {warning}", file=sys.stderr)
    for error in schedule.errors:
        print(f"r3 train: {error}", file=sys.stderr)
    return not schedule.errors


def _error_summary(error: BaseException) -> str:
    """One line for a failed trial: a runner that could not start as 'EnvRunner i failed to start: <its error>',
    anything else as the last line of Ray's error text (the original 'Type: message')."""
    from r3_rllib.algorithms.r3.startup import find_startup_error

    startup = find_startup_error(error)
    if startup is not None:
        return str(startup)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def _build_model(args) -> int:
    """``r3 build-model NAME``: build (or find up to date) a named model's cached folder and print its path."""
    from r3_rllib.warmstart import build_named_model

    try:
        print(build_named_model(args.name))
    except (OSError, ValueError) as e:
        print(f"r3 build-model: {e}", file=sys.stderr)
        return 2
    return 0


#: The commands whose options and code live in their own module: (module, its add-options function, its run
#: function, help). A module is imported only when its command runs: together they import torch and transformers
#: (~6 CPU-s), which `r3 --help`, `r3 samples` or a typo in a run file then waited for.
MODULE_COMMANDS = {
    "sft": (
        "r3_rllib.warmstart.arithmetic",
        "add_sft_args",
        "run_sft",
        "warm-start the tiny arithmetic model (supervised)",
    ),
    "eval": (
        "r3_rllib.cli",
        "add_eval_args",
        "run_eval_command",
        "pass@1 over n samples on math benchmarks (the base policy; --with-head: R^2PO's rollout head on)",
    ),
    "plot": (
        "r3_rllib.eval.plot",
        "add_plot_args",
        "run_plot",
        "learning curves of one or more runs into a PNG",
    ),
    "report": (
        "r3_rllib.eval.report",
        "add_report_args",
        "run_report",
        "one self-contained HTML page of a run: curves, health checks, samples",
    ),
    "samples": (
        "r3_rllib.eval.samples",
        "add_samples_args",
        "run_samples",
        "a run's recorded completions, filtered (iteration, reward, reason, group)",
    ),
    "export": (
        "r3_rllib.algorithms.r3.export",
        "add_export_args",
        "run_export",
        "a Hugging Face folder (model, tokenizer, card) of a run's checkpoint",
    ),
}


def add_eval_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``r3 eval``'s arguments (eval/evaluate.py)."""
    from r3_rllib.eval.evaluate import add_eval_args as add

    return add(parser)


def run_eval_command(args: argparse.Namespace, *, engine_factory: Any = None) -> int:
    """``r3 eval``; ``--model`` may also name a run of ours (an experiment with one trial, a trial or a checkpoint
    folder): its newest complete checkpoint (or that checkpoint) is exported to a temporary Hugging Face folder, as
    ``r3 export`` would, and evaluated (eval/evaluate.py ``run_eval``)."""
    import tempfile

    from r3_rllib.algorithms.r3.export import ExportError, export_run, is_run_folder
    from r3_rllib.eval.evaluate import run_eval

    if not is_run_folder(args.model):
        return run_eval(args, engine_factory=engine_factory)
    if getattr(args, "with_head", False):
        print(
            f"r3 eval: error: --with-head: {args.model} is a run, whose export is the inference policy without its "
            "rollout head; export it with the head (algo.export_policy(path, with_head=True)) and pass that folder",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="r3-eval-") as tmp:
        try:
            folder = export_run(args.model, Path(tmp) / "policy")
        except ExportError as e:
            print(f"r3 eval: error: --model {args.model}: {e}", file=sys.stderr)
            return 2
        print(
            f"r3 eval: {args.model} is a run: its checkpoint exported to {folder} for this evaluation",
            file=sys.stderr,
        )
        exported = argparse.Namespace(**{**vars(args), "model": str(folder)})
        return run_eval(exported, engine_factory=engine_factory, model_label=str(args.model))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="r3", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train from a YAML run file through Ray Tune")
    p.add_argument("config", help="YAML run file (see examples/)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. training.lr=1e-4")
    p.add_argument("--resume", action="store_true", help="continue the experiment of the same name")
    p.add_argument("--address", default=None, help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray")
    p.add_argument("--verbose", action="store_true", help="show actor logs")
    p.add_argument(
        "--log-samples",
        type=int,
        metavar="N",
        help="print N prompt -> completion -> reward rows per iteration",
    )
    p.set_defaults(func=_train)

    p = sub.add_parser("build-model", help="build a named model into its cache (e.g. gridworld-tiny-sft)")
    p.add_argument("name", help="a named model (see r3_rllib.models.hub.named_models)")
    p.set_defaults(func=_build_model)

    # The first argument that names a command is the chosen one (not merely the first without a dash: a top-level
    # option's value would be taken for it).
    commands = {*sub.choices, *MODULE_COMMANDS}
    chosen = next((a for a in (sys.argv[1:] if argv is None else argv) if a in commands), None)
    for name, (module, add_args, run, help_text) in MODULE_COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == chosen:  # only the command that runs imports its module
            loaded = importlib.import_module(module)
            getattr(loaded, add_args)(p)
            p.set_defaults(func=getattr(loaded, run))

    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

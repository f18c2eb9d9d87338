"""The `r3` command: "R3" resolves in Tune without importing all of RLlib's algorithms (one of them, DreamerV3, prints
gymnasium warnings at import time), and Tune's own failures end with a message."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray.tune")


def test_tune_resolves_r3_without_importing_every_rllib_algorithm(monkeypatch):
    """The registration `import r3_rllib` sets up (the one `r3 train` uses): the first lookup of "R3" registers it
    with Tune itself, so RLlib's register-everything path is never taken for it."""
    import ray.rllib
    import ray.tune.registry as registry

    import r3_rllib  # noqa: F401  (makes "R3" a Tune name)
    from r3_rllib.algorithms.r3 import R3

    def fail():
        raise AssertionError("Tune imported every RLlib algorithm to resolve 'R3'")

    monkeypatch.setattr(ray.rllib, "_register_all", fail)
    # Another test in this process may have resolved "R3" already: start from an unregistered name.
    registry._global_registry.unregister(registry.TRAINABLE_CLASS, "R3")
    assert not registry._has_trainable("R3")
    assert registry.get_trainable_cls("R3") is R3
    assert registry._has_trainable("R3")


def test_other_unknown_names_still_go_to_rllib(monkeypatch):
    import ray.rllib
    from ray.tune.registry import TuneError, validate_trainable

    import r3_rllib  # noqa: F401

    asked = []
    monkeypatch.setattr(ray.rllib, "_register_all", lambda: asked.append(True))
    with pytest.raises(TuneError, match="Unknown trainable"):
        validate_trainable("NoSuchAlgorithm")
    assert asked == [True]


def test_a_full_disk_under_tunes_own_writes_ends_with_a_message_not_a_traceback(
    monkeypatch, tmp_path, capsys
):
    """Tune's driver writes result files and its experiment state itself, outside our checkpoint code: a full disk
    there reaches `r3 train` from `Tuner.fit`, which says so and how to resume (exit 1)."""
    import errno

    import ray.tune

    import r3_rllib.ray_session
    from r3_rllib.cli import main

    class FullDiskTuner:
        def __init__(self, *args, **kwargs):
            pass

        def fit(self):
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "runs" / "result.json"))

    monkeypatch.setattr(ray.tune, "Tuner", FullDiskTuner)
    monkeypatch.setattr(r3_rllib.ray_session, "init_ray", lambda *a, **k: False)
    run_file = Path(__file__).resolve().parents[2] / "examples" / "tiny_arithmetic_cpu.yaml"
    args = ["train", str(run_file), "--set", f"run.storage_path={tmp_path / 'runs'}"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "is full" in err and "--resume" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["samples", "--help"], ["report", "--help"], ["plot", "--help"]],
    ids=["help", "samples", "report", "plot"],
)
def test_commands_that_read_files_import_no_torch_or_transformers(argv):
    """`r3 --help` and the commands that read a run's files start without torch and transformers (~6 CPU-s of
    imports): each command's module is imported only when that command runs (cli.MODULE_COMMANDS)."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from r3_rllib.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps([m for m in ('torch', 'transformers', 'ray') if m in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "usage: r3" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_each_module_command_parses_its_own_options():
    """Every command's table entry names a module with its argument adder and its run function, and the chosen
    command's options parse through `main`."""
    import argparse
    import importlib

    from r3_rllib import cli

    seen = {}

    def parse(args):
        seen.update(vars(args))
        return 0

    for name, (module, add_args, run, _help) in cli.MODULE_COMMANDS.items():
        loaded = importlib.import_module(module)
        assert callable(getattr(loaded, run, None)), f"{name}: {module} has no {run}"
        sub = argparse.ArgumentParser()
        getattr(loaded, add_args)(sub)
        own = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
        assert own, f"{name}: {add_args} adds no argument"
    import r3_rllib.eval.samples as samples

    original = samples.run_samples
    samples.run_samples = parse
    try:
        assert cli.main(["samples", "some_run", "--full"]) == 0
    finally:
        samples.run_samples = original
    assert seen["full"] is True and seen["command"] == "samples"


def test_the_end_of_a_run_names_its_report_samples_curves_export_and_the_way_on(tmp_path):
    """What `r3 train` prints after "results in": a command per way to look at the run, then the export and the
    Python call for the first trial that saved a checkpoint (one without is skipped). Each command ran on a real
    run's folder when this was written: r3 report, r3 samples, r3 export (tests/e2e/test_cli_train.py runs
    r3 train to its end)."""
    from r3_rllib.cli import next_steps

    exp = tmp_path / "my run"
    bare, saved = exp / "trial_a", exp / "trial_b"
    bare.mkdir(parents=True)
    (saved / "checkpoint_000002").mkdir(parents=True)
    lines = next_steps(str(exp), [str(bare), str(saved)])  # tmp_path: outside the working folder, absolute
    quoted = f"'{exp}'"  # a folder with a space, quoted for the shell
    assert lines[:4] == [
        "next:",
        f"  r3 report {quoted} -o report.html   # one HTML page: curves, health checks, samples",
        f"  r3 samples {quoted}   # the completions, with rewards",
        f"  tensorboard --logdir {quoted}   # the curves",
    ]
    assert lines[4].startswith(f"  r3 export '{saved}' --out <folder>")
    assert lines[5].startswith(f"  in Python: R3.from_checkpoint({str(saved)!r})")
    assert len(next_steps(str(exp), [str(bare)])) == 4


def test_a_run_that_failed_before_its_first_iteration_shows_its_error_not_the_next_steps(tmp_path, capsys):
    """Before: a run refused at start (e.g. a checkpoint of another model) ended with report, samples and tensorboard
    commands for a run that had nothing to show. A trial with results still gets them."""
    from types import SimpleNamespace

    from r3_rllib.cli import _fit_and_report

    refused = SimpleNamespace(
        path=str(tmp_path / "t0"), metrics={}, error=ValueError("ModelMismatchError: no fit")
    )
    trained = SimpleNamespace(path=str(tmp_path / "t1"), metrics={"training_iteration": 2}, error=None)

    def report(*results) -> tuple[int, str]:
        tuner = SimpleNamespace(fit=lambda: list(results))
        code = _fit_and_report(tuner, "run.yaml", str(tmp_path), str(tmp_path / "exp"))
        return code, capsys.readouterr().out

    code, out = report(refused)
    assert code == 1 and "error=ModelMismatchError: no fit" in out and "next:" not in out
    code, out = report(refused, trained)
    assert code == 1 and "\nnext:\n" in out


def test_the_next_steps_show_paths_below_the_working_folder_relative(tmp_path, monkeypatch):
    from r3_rllib.cli import next_steps

    (tmp_path / "runs" / "x" / "t" / "checkpoint_000001").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    lines = next_steps(str(tmp_path / "runs" / "x"), [str(tmp_path / "runs" / "x" / "t")])
    assert (
        lines[1].startswith("  r3 report runs/x -o report.html")
        and "R3.from_checkpoint('runs/x/t')" in lines[5]
    )

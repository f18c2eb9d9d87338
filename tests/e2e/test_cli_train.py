"""`r3 train`: a run on the tiny default, interrupted and resumed, in subprocesses; `--set` overrides; bad run files
and overrides fail before Ray starts, with exit code 2 and a message that names the key (and the likely intended
one) or the missing path."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from numeric import EPS32, f64_tol, forward_atol
from repo_paths import REPO

from r3_rllib.cli import main as r3_main
from r3_rllib.train_config import ConfigError, load_run_file

TINY = REPO / "examples" / "tiny_arithmetic_cpu.yaml"
R3 = str(Path(sys.executable).parent / "r3")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _train_in_process(capsys, *args: str) -> tuple[int, str]:
    """`r3 train ARGS` in this process; only for runs that must fail before Ray starts."""
    rc = r3_main(["train", *args])
    return rc, capsys.readouterr().err


# -- a real run, interrupted and resumed ---------------------------------------------------------------------------
@pytest.mark.slow
def test_train_interrupt_and_resume_from_checkpoint(tmp_path):
    iterations = (
        20  # the interrupt comes a few iterations after the first checkpoint (5); the resume runs the rest
    )
    args = [
        R3,
        "train",
        str(TINY),
        "--num-cpus",
        "2",
        "--set",
        f"stop.training_iteration={iterations}",
        "--set",
        f"run.storage_path={tmp_path}",
        "--set",
        "run.name=cli",
        "--set",
        "run.checkpoint_frequency=5",
        "--set",
        "training.queries_per_iteration=4",
        "--set",
        "training.group_size=4",
        "--set",
        "training.eval_interval=5",  # held-out accuracy first at iteration 5: a column of progress.csv
        "--set",
        "training.eval_num_queries=8",
        # Every group's samples recorded (samples/iter_*.parquet), two rows printed per iteration.
        "--set",
        "training.sample_log_fraction=1.0",
        "--set",
        "training.sample_log_max_groups=null",
        "--log-samples",
        "2",
    ]
    first = subprocess.Popen(
        args, env=ENV, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 300
        # Interrupt once the first checkpoint is complete (its manifest is written last): an interrupt while its
        # folder was still being written could leave the resume nothing to restore.
        while not glob.glob(str(tmp_path / "cli" / "*" / "checkpoint_000000" / "manifest.json")):
            assert first.poll() is None, first.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.1)
        first.send_signal(signal.SIGINT)  # Tune saves the experiment state and stops
        out, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    (trial_dir,) = glob.glob(str(tmp_path / "cli" / "*_00000_*"))  # <method>_<env>_<id>_00000_...
    done_before = [json.loads(line)["training_iteration"] for line in open(Path(trial_dir) / "result.json")]
    assert 5 <= max(done_before) < iterations, out[-3000:]

    resumed = subprocess.run(
        [*args, "--resume"], env=ENV, cwd=tmp_path, capture_output=True, text=True, timeout=400
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"iterations={iterations}" in resumed.stdout
    # check_resume found the trial in Tune's saved experiment state (a private format: trial_data, each trial's
    # relative_logdir) and verified its checkpoints: a change of that format would leave this line out.
    resumed_from = f"r3 train: {Path(trial_dir).name} resumes from {trial_dir}"
    assert resumed_from in resumed.stdout, resumed.stdout[-3000:]
    rows = [json.loads(line) for line in open(Path(trial_dir) / "result.json")]
    assert rows[-1]["training_iteration"] == iterations
    # The resumed trial started from a checkpoint (iteration 5, 10, ...), not from scratch.
    seen = [(r["training_iteration"], r["iterations_since_restore"]) for r in rows]
    restored = [r for r in rows[len(done_before) :] if r["iterations_since_restore"] == 1]
    assert restored, f"no restored row after the {len(done_before)} before the interrupt: {seen}"
    first_after = restored[0]
    assert first_after["training_iteration"] > 1
    assert (first_after["training_iteration"] - 1) % 5 == 0
    # --set values reached the trial's config
    params = json.loads((Path(trial_dir) / "params.json").read_text())
    assert params["queries_per_iteration"] == 4 and params["group_size"] == 4
    _check_progress_output(
        Path(trial_dir), out, done_before, resumed.stdout, first_after["training_iteration"], iterations
    )
    _check_sample_records(Path(trial_dir), rows, out + resumed.stdout)


def _check_sample_records(trial_dir: Path, results: list[dict], printed: str) -> None:
    """Every iteration's records are in the trial's folder, with the records' columns; each fully recorded
    iteration's rows agree with its metrics (the last result of an iteration run again after the resume); the
    rows were printed and `r3 samples` finds them."""
    import pandas as pd

    from r3_rllib.rollout.records import SCHEMA

    last = {r["training_iteration"]: r for r in results}
    files = sorted((trial_dir / "samples").glob("iter_*.parquet"))
    assert [int(f.stem.split("_")[1]) for f in files] == sorted(last)
    for f in files:
        df = pd.read_parquet(f)
        assert list(df.columns) == SCHEMA.names
        result = last[int(df["iteration"].iloc[0])]
        fresh = df[~df["replayed"] & ~df["reflection"]]
        assert len(fresh) == 16  # 4 queries x G = 4
        # Two float64 means of the same 16 rewards in other orders: 16 float64 ulps of the largest reward. The
        # accuracy is k/16, exact in binary on both sides.
        reward_tol = f64_tol(max(1.0, fresh["reward"].abs().max()), len(fresh))
        assert fresh["reward"].mean() == pytest.approx(result["rollout"]["reward_mean"], abs=reward_tol)
        assert fresh["correct"].mean() == result["rollout"]["accuracy"]
        assert (df.groupby("group").size() == 4).all()  # whole groups of G = 4
        trained = df[df["trained"]]
        assert len(trained) == result["r3"]["train_samples"]
        # The learner's log-probs of the samples it trained: the sampling policy's, up to the engine's numerics.
        assert trained["learner_logprobs"].map(len).tolist() == trained["response_len"].tolist()
        # exp(learner - behaviour) of the same weights on the same tokens: |log-ratio| <= x, the forward tolerance
        # of the largest |log-prob| compared, so |w - 1| <= x e^x; a lost weight sync moves it by 0.3 and more.
        if len(trained):  # an iteration whose groups all had equal rewards trains on nothing
            x = forward_atol(np.concatenate(trained["learner_logprobs"].map(np.asarray).tolist()))
            assert np.allclose(trained["is_weight_mean"], 1.0, rtol=0, atol=x * np.exp(x) + EPS32)
        # Sampled by the weights the batch was trained from (one version behind the one logged after the sync).
        trained_from = result["rollout"]["policy_version"] - (len(trained) > 0)
        assert (df["staleness"] == 0).all() and (df["policy_version"] == trained_from).all()
    assert printed.count("recorded samples; all: r3 samples") >= len(last) // 2
    assert '" -> reward ' in printed
    listing = subprocess.run(
        [R3, "samples", str(trial_dir.parent), "--iteration", "-1", "-n", "3"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listing.returncode == 0, listing.stderr
    assert (
        listing.stdout.splitlines()[0]
        == f"{trial_dir}: 16 of 16 rows match (iterations {max(last)}-{max(last)}), showing 3"
    )


def _check_progress_output(
    trial_dir: Path, first: str, done_before: list[int], resumed: str, restart: int, total: int
) -> None:
    """One progress line per iteration in each run's output (from the driver; the resumed run from its checkpoint
    on), none of Tune's status tables, and the held-out accuracy, first measured at iteration 5, a column of
    progress.csv with its values at the evaluation iterations (the file widened when it appeared, across the
    resume)."""
    import csv
    import re

    def iterations(text: str) -> list[int]:
        return [int(m) for m in re.findall(rf"^iter +(\d+)/{total}  [\d.]+ s/it  ", text, flags=re.MULTILINE)]

    assert iterations(first) == done_before, first[-3000:]
    assert iterations(resumed) == list(range(restart, total + 1)), resumed[-3000:]
    assert "eval_acc " in resumed and "nan" not in "".join(re.findall(r"^iter .*$", resumed, flags=re.M))
    # The run file's eval_before_train: the accuracy before the first update on iteration 1's line alone, not again
    # in the resumed run.
    started = [
        int(m) for m in re.findall(rf"^iter +(\d+)/{total} .*  start_acc ", first + resumed, flags=re.M)
    ]
    assert started == [1], first[-3000:]
    for text in (first, resumed):
        assert "== Status ==" not in text and "Result logdir" not in text and "Trial name" not in text
    # The trial is named after its method (the run file's grpo preset) and says where its results are (relative to
    # the working folder, the storage path here).
    assert re.search(rf"^grpo_arithmetic_\w+_00000: results in cli/{re.escape(trial_dir.name)}$", first, re.M)
    # The resumed run ends with what to run next: the report, samples and curves, the export and the Python way on.
    steps = resumed[resumed.index("\nnext:\n") :]
    for command in (
        "r3 report ",
        "r3 samples ",
        "tensorboard --logdir ",
        "r3 export ",
        "R3.from_checkpoint(",
    ):
        assert command in steps, steps
    with open(trial_dir / "progress.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert "eval/accuracy" in rows[0]
    for row in rows:
        value = row["eval/accuracy"]
        if int(row["training_iteration"]) % 5 == 0:
            assert 0.0 <= float(value) <= 1.0, row["training_iteration"]
        else:
            assert value in ("", "nan"), (row["training_iteration"], value)


@pytest.mark.slow
def test_resume_without_an_experiment_exits_2(tmp_path):
    # A subprocess: the CLI starts Ray before it looks for the experiment.
    proc = subprocess.run(
        [R3, "train", str(TINY), "--resume", "--num-cpus", "1", "--set", f"run.storage_path={tmp_path}"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert f"nothing to resume in {tmp_path / 'tiny_arithmetic_cpu'}" in proc.stderr


# -- mistakes fail fast with exit code 2 ---------------------------------------------------------------------------
def test_typo_in_run_file_exits_2_naming_the_key_in_a_subprocess(tmp_path):
    bad = _write(tmp_path / "bad.yaml", TINY.read_text().replace("group_size:", "group_sise:"))
    proc = subprocess.run([R3, "train", str(bad)], env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown key 'group_sise' in section 'training'; did you mean 'group_size'?" in proc.stderr
    assert "Started a local Ray" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "training:",
            "trainig:",
            "unknown key 'trainig' in the run file's top level; did you mean 'training'?",
        ),
        (
            "num_epochs:",
            "num_epoch:",
            "unknown key 'num_epoch' in section 'training'; did you mean 'num_epochs'?",
        ),
        ("num_env_runners:", "num_env_runner:", "did you mean 'num_env_runners'?"),
        (
            "storage_path:",
            "storage_pth:",
            "unknown key 'storage_pth' in section 'run'; did you mean 'storage_path'?",
        ),
        ("preset: grpo", "preset: gpro", "unknown key 'gpro' in preset; did you mean 'grpo'?"),
    ],
)
def test_typo_names_the_key_and_suggests_the_right_one(tmp_path, capsys, old, new, message):
    bad = _write(tmp_path / "bad.yaml", TINY.read_text().replace(old, new, 1))
    rc, err = _train_in_process(capsys, str(bad))
    assert rc == 2
    assert message in err


def test_typo_in_set_override_exits_2(capsys):
    rc, err = _train_in_process(capsys, str(TINY), "--set", "training.temprature=0.7")
    assert rc == 2
    assert "unknown key 'temprature' in section 'training'; did you mean 'temperature'?" in err
    rc, err = _train_in_process(capsys, str(TINY), "--set", "training.lr")
    assert rc == 2
    assert "--set expects key=value" in err


def test_missing_data_file_names_the_resolved_path(tmp_path, capsys):
    run_file = _write(
        tmp_path / "math.yaml",
        "environment:\n  env: math\n  env_config: {data: ./data/no_such_file.jsonl}\n",
    )
    rc, err = _train_in_process(capsys, str(run_file))
    assert rc == 2
    assert f"file not found: {tmp_path / 'data' / 'no_such_file.jsonl'}" in err


def test_missing_model_folder_and_run_file_are_named(tmp_path, capsys):
    rc, err = _train_in_process(capsys, str(TINY), "--set", f"training.model_path={tmp_path / 'no_model'}")
    assert rc == 2
    assert f"training.model_path: folder not found: {tmp_path / 'no_model'}" in err
    rc, err = _train_in_process(capsys, str(tmp_path / "missing.yaml"))
    assert rc == 2
    assert f"run file not found: {tmp_path / 'missing.yaml'}" in err


# -- --set overrides -------------------------------------------------------------------------------------------------
def test_set_overrides_reach_config_stop_and_run():
    spec = load_run_file(
        TINY,
        [
            "training.lr=3.0e-4",
            "training.group_size=6",
            "env_runners.num_env_runners=2",
            "environment.env_config.digits=3",  # nested: other env_config keys stay
            "r3.replay=true",
            "stop.training_iteration=3",
            "run.name=override",
        ],
    )
    c = spec.config
    assert c.lr == 3e-4 and c.group_size == 6 and c.num_env_runners == 2
    assert c.env_config["digits"] == 3 and c.env_config["num_queries"] == 2000
    assert c.replay is True
    assert spec.stop == {"training_iteration": 3}
    assert spec.run["name"] == "override" and spec.run["checkpoint_frequency"] == 10
    with pytest.raises(ConfigError, match="group_size must be >= 2"):
        load_run_file(TINY, ["training.group_size=1"])


def test_set_accepts_scientific_notation_without_a_dot():
    # YAML 1.1 would read 1e-4 as a string; the run-file loader reads it as a float.
    spec = load_run_file(TINY, ["training.lr=1e-4", "training.kl_coef=1E-3", "run.name=1e5x"])
    assert spec.config.lr == 1e-4 and spec.config.kl_coef == 1e-3 and spec.run["name"] == "1e5x"

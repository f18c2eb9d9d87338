"""The README's "first hour" page as one test: your rows (examples/sums.jsonl) and your reward function
(examples/my_rewards.py) in, through the run file examples/first_hour.yaml: train with W&B (offline) and MLflow (a
local file store), read the completions (`r3 samples`), the report (`r3 report`), export (`r3 export`) and load the
export with plain transformers. Nothing reaches the network."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO

pytestmark = pytest.mark.slow

R3 = str(Path(sys.executable).parent / "r3")
ITERATIONS = 3


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    home = tmp_path / "wandb_home"  # W&B's own config, cache and data folders: none in the user's home
    env |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env |= {f"WANDB_{d}_DIR": str(home / d.lower()) for d in ("CONFIG", "CACHE", "DATA", "ARTIFACT")}
    # The page's command: my_rewards.py sits in examples/, which the runners import it from.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "examples"), env.get("PYTHONPATH")) if p)
    return env


def _r3(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    done = subprocess.run([R3, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_rows_and_a_reward_function_to_a_model_transformers_loads(tmp_path):
    env = _env(tmp_path)
    mlruns = tmp_path / "mlruns"
    out = _r3(
        env,
        "train",
        "examples/first_hour.yaml",
        "--num-cpus",
        "2",
        "--set",
        f"run.storage_path={tmp_path}",
        "--set",
        f"stop.training_iteration={ITERATIONS}",
        "--set",
        "training.eval_interval=3",
        "--set",
        f"run.mlflow={{tracking_uri: 'file://{mlruns}'}}",
    )
    assert out.count("/3  ") == ITERATIONS  # one progress line per iteration
    assert '" -> reward ' in out  # log_samples: completions under the progress lines
    run = tmp_path / "first_hour"
    (trial,) = [p for p in run.iterdir() if (p / "params.json").is_file()]

    listing = _r3(env, "samples", str(run), "--iteration", "-1", "-n", "3")
    assert "showing 3" in listing and listing.count(" -> reward ") == 3

    report = tmp_path / "report.html"
    _r3(env, "report", str(run), "-o", str(report))
    assert "<svg" in report.read_text() and "samples-data" in report.read_text()

    assert list((trial / "wandb").glob("offline-run-*"))  # W&B, offline, in the trial's folder
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=f"file://{mlruns}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "first_hour"]
    (mlflow_run,) = client.search_runs([experiment.experiment_id])
    steps = [m.step for m in client.get_metric_history(mlflow_run.info.run_id, "rollout/accuracy")]
    assert sorted(steps) == list(range(1, ITERATIONS + 1))

    model_dir = tmp_path / "my_policy"
    _r3(env, "export", str(run), "--out", str(model_dir))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    assert tok.decode(tok("12+7=")["input_ids"]) == "12+7="
    generated = model.generate(**tok("12+7=", return_tensors="pt"), max_new_tokens=4, do_sample=False)
    answer = tok.decode(generated[0, 5:], skip_special_tokens=True)
    assert answer and answer.isdigit()  # the warm-started model answers sums with digits
    assert "grpo" in (model_dir / "README.md").read_text().lower()  # the model card names the method

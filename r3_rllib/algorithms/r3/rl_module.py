"""The learners' RLModule (the policy: a transformers causal LM) and the packing of training rows into its input."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.util import log_once

from r3_rllib.models.hub import policy_path
from r3_rllib.types import TrainableSample, TrainingBatch

# RLlib's own RLModule.__init__ (ray 2.60) builds the deprecated RLModuleConfig for old custom modules even when a
# module is constructed the current way (keywords, as RLModuleSpec.build does for this one and for the MultiRLModule
# around it), and that class warns once per process under this log_once key. The notice is about RLlib's internal
# back-compat object, so it is consumed when this module is imported (before any RLModule of the run is built: the
# spec names CausalLMModule, so unpickling it imports this module first).
_RLMODULE_CONFIG_NOTICE = "RLModule(config=[RLModuleConfig object])"
log_once(_RLMODULE_CONFIG_NOTICE)


class CausalLMModule(TorchRLModule):
    """RLModule holding the policy: a transformers causal LM loaded from `model_config["model_path"]`."""

    def setup(self):
        from transformers import AutoModelForCausalLM

        from r3_rllib.models.progress_bars import no_progress_bars

        path = policy_path(self.model_config.get("model_path"))
        kwargs = {}
        if self.model_config.get("attn_implementation"):
            kwargs["attn_implementation"] = self.model_config["attn_implementation"]
        with no_progress_bars():
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)
        if self.model_config.get("rollout_head"):
            # R^2PO: the head is a submodule of the policy from the start, so the optimizer, FSDP2 sharding, DCP
            # checkpoints and the weight sync carry it (as rollout_head.*) with no code of their own. Seeded: every
            # learner rank builds the same head (FSDP2 then shards identical values).
            from r3_rllib.models.rollout_head import RolloutHead, attach_rollout_head

            head = RolloutHead.for_model(
                self.model,
                float(self.model_config.get("rollout_head_init_std", 1e-6)),
                seed=int(self.model_config.get("rollout_head_seed", 0)),
            )
            attach_rollout_head(self.model, head)

    def _forward(self, batch, **kwargs):
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))
        return {"logits": out.logits}


def lora_policy(model: torch.nn.Module, config) -> object | None:
    """LoRA (``config.lora_rank > 0``): inject the adapter into the policy ``model`` in place and return the peft
    wrapper kept beside it (see r3_rllib/models/lora.py); None with LoRA off. Call before sharding and before the
    optimizer is built, on every learner rank: the adapter's init is seeded with ``config.seed``, so all ranks
    build the same one."""
    if not getattr(config, "lora_rank", 0):
        return None
    from r3_rllib.models.lora import add_lora

    return add_lora(
        model,
        config.lora_rank,
        config.lora_alpha,
        config.lora_dropout,
        config.lora_target_modules,
        seed=int(config.seed or 0),
    )


def pack_batch(
    batch: TrainingBatch, rows: Sequence[int] | np.ndarray, pad_id: int, device
) -> dict[str, torch.Tensor]:
    """Rows `rows` of `batch` right-padded into tensors on `device` (see `TrainingBatch.padded`).

    `response_mask[b, t]` marks positions t of `logprobs[b, t]`, which scores token `input_ids[b, t + 1]`.
    """
    return {k: torch.from_numpy(v).to(device) for k, v in batch.padded(rows, pad_id).items()}


def pack_samples(samples: Sequence[TrainableSample], pad_id: int, device) -> dict[str, torch.Tensor]:
    """`pack_batch` of all of `samples` (tests and benchmarks that start from sample objects)."""
    batch = TrainingBatch.from_samples(samples)
    return pack_batch(batch, np.arange(len(batch)), pad_id, device)

"""Pure algorithm pieces (numpy / torch, no Ray): advantages, policy losses, structural-entropy ranking, reflection
prompts, HGPO's step advantages, reward shaping, the training-method seam (``method.py``). Each concept lives in its own
module; estimators and losses are chosen by name through small registries (``registry.py``)."""

# Names resolve on first use (PEP 562): importing one module of core (e.g. the registry, from a Ray-free
# process such as the replay actor) must not import torch through the others.
from __future__ import annotations

import importlib
from typing import Any

_HOMES: dict[str, str] = {
    "ADVANTAGE_FNS": "advantages",
    "AGG_MODES": "losses",
    "COMPACT_REFLECTION_TEMPLATE": "reflection",
    "DEFAULT_REFLECTION_GUIDANCE": "reflection",
    "DEFAULT_REFLECTION_TEMPLATE": "reflection",
    "HGPO_SETTINGS": "hgpo",
    "KL_KINDS": "losses",
    "LOSS_FNS": "losses",
    "ReflectionSettings": "reflection",
    "aggregate_loss": "losses",
    "apply_batch_step": "advantages",
    "build_reflection_prompt": "reflection",
    "cispo_policy_loss": "losses",
    "clipped_policy_loss": "losses",
    "compute_advantages_by_group": "advantages",
    "compute_group_advantages": "advantages",
    "discounted_returns": "hgpo",
    "dominance_counts": "ranking",
    "drgrpo_advantages": "advantages",
    "entropy_from_logits": "losses",
    "entropy_structure": "ranking",
    "expand_to_tokens": "advantages",
    "get_loss_fn": "losses",
    "group_is_degenerate": "advantages",
    "grpo_advantages": "advantages",
    "gspo_policy_loss": "losses",
    "gspo_token_policy_loss": "losses",
    "has_batch_step": "advantages",
    "hgpo_advantages": "hgpo",
    "hgpo_advantages_by_query": "hgpo",
    "hgpo_settings": "hgpo",
    "kl_penalty": "losses",
    "mixed_group_advantages": "advantages",
    "rank_rewards": "ranking",
    "register_advantage": "advantages",
    "register_loss": "losses",
    "reinforce_plus_plus_advantages": "advantages",
    "reinforce_plus_plus_baseline_advantages": "advantages",
    "rloo_advantages": "advantages",
    "select_reflection_queries": "reflection",
    "strip_think": "reflection",
    "structural_entropy_rewards": "ranking",
    "token_whiten": "advantages",
    "truncated_importance_weights": "losses",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))

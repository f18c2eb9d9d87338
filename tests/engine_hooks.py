"""Partial rollouts in engine tests: a hook that loads weights between decoding steps of one generate call, and the
log-probs expected after such a load."""

from __future__ import annotations

import numpy as np
import torch


def load_weights_at_first_hook(engine, state: dict, version: int, every: int = 4) -> list[int]:
    """Set ``engine.between_steps`` to load ``state`` as ``version`` the first time it runs (after ``every``
    decoding steps); returns the list of the versions the hook saw, filled in as it runs."""
    seen: list[int] = []

    def hook():
        seen.append(engine.version)
        if len(seen) == 1:
            engine.update_weights(state.items(), version)

    engine.between_steps, engine.between_steps_every = hook, every
    return seen


def rescore_after_update(
    old_model, new_model, prompt, tokens, update_at: int, temperature: float = 1.0
) -> np.ndarray:
    """Log-probs of ``tokens[update_at:]`` (at ``temperature``) when the weights change after ``update_at``
    decoding steps and the KV cache is kept: the prompt and the first ``update_at - 1`` tokens keep the old model's
    keys and values (token ``update_at - 1`` is fed to the new model, which samples token ``update_at`` from it)."""
    ids = list(prompt) + list(tokens)
    split = len(prompt) + update_at - 1
    with torch.no_grad():
        cache = old_model(torch.tensor([ids[:split]]), use_cache=True).past_key_values
        logits = new_model(torch.tensor([ids[split:]]), past_key_values=cache).logits[0, :-1].float()
    logp = torch.log_softmax(logits / temperature, -1)
    return logp.gather(-1, torch.tensor(tokens[update_at:])[:, None]).squeeze(-1).numpy()

"""Response-only scoring: the log-probs of given next tokens under a causal LM (pure torch, no Ray).

One implementation for every caller: the learner's policy, proximal, reference and entropy passes, and R^2PO's
rollout-head scoring (:func:`r3_rllib.models.rollout_head.rollout_token_logprobs`), where the scored logits are
``lm_head(h) + rollout_head(h)`` and the base ones (head off) come from the same forward.

The LM head runs only on the scored positions, ``chunk`` positions at a time: for a SmolLM2-sized model the
``[B, T, V]`` fp32 logits of a whole batch were most of the learner's memory. The head is swapped for one call inside
the model's own forward (not called from outside), so an FSDP2-sharded root, which gathers the head/embedding weights
around its forward, needs nothing special. Models whose forward changes the logits after the head (soft-capped or
scaled logits) or takes no ``logits_to_keep`` fall back to full logits, scored with the same selection.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch.utils.checkpoint import checkpoint

from r3_rllib.core.losses import entropy_from_logits

#: Config fields of model families whose logits are not plain ``lm_head(hidden)``.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier")

HeadFn = Callable[[torch.Tensor], torch.Tensor]


class RowScores(NamedTuple):
    """Per scored position (``[N]``, fp32): log-probs, entropies (or None; no-grad unless asked for with gradients),
    base log-probs (or None)."""

    logp: torch.Tensor
    entropy: torch.Tensor | None
    base: torch.Tensor | None


def _head_swap_supported(model) -> bool:
    """Whether `model.forward` ends in ``lm_head(hidden_states[:, slice])`` and nothing after it that changes the
    logits (the transformers causal LMs that take ``logits_to_keep``; soft-capped or scaled logits do not qualify),
    so the head can be replaced for one call by the response-only scoring below."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear):
        return False
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        return False
    cfg = getattr(model, "config", None)
    text_cfg = cfg.get_text_config() if cfg is not None and hasattr(cfg, "get_text_config") else cfg
    return all(getattr(text_cfg, name, None) in (None, 1, 1.0) for name in LOGIT_TRANSFORMS)


def _picked_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # log p = z_t - logsumexp(z): no full log-softmax tensor next to the logits (nor in the backward).
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _score_rows(
    head_fn: HeadFn,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk: int,
    with_entropy: bool,
    base_fn: HeadFn | None = None,
    base_grad: bool = False,
    entropy_grad: bool = False,
) -> RowScores:
    """Log-probs of `targets` [N] (and no-grad entropies) under softmax(head_fn(hidden) / temperature), `hidden`
    [N, H], `chunk` rows at a time; with `base_fn`, also the log-probs of `targets` under
    softmax(base_fn(hidden) / temperature) (R^2PO's base logits next to the rollout ones), without gradients unless
    `base_grad`. `entropy_grad`: the entropies (computed whatever `with_entropy`) carry gradients (an entropy bonus
    in the loss).

    With gradients and more than one chunk each chunk runs under activation checkpointing: autograd then keeps only
    the chunk's hidden rows and recomputes its [chunk, V] logits in backward, so the fp32 logits of all scored
    positions (5 GB for 8k positions of a 151k vocabulary) never exist at once. The outputs with gradients (log-probs,
    and entropies or base log-probs when asked with gradients) leave a chunk stacked in one tensor, so that
    recomputing the chunk recomputes all of them from the same logits.
    """
    entropies: dict[int, torch.Tensor] = {}
    base: dict[int, torch.Tensor] = {}

    def one(k: int, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = head_fn(h).float() / temperature
        rows = [_picked_logprobs(logits, t)]
        if entropy_grad:
            rows.append(entropy_from_logits(logits))
        elif with_entropy and k not in entropies:
            # No-grad outputs once per chunk, not again when checkpointing recomputes it.
            with torch.no_grad():
                entropies[k] = entropy_from_logits(logits)
        if base_fn is not None and base_grad:
            rows.append(_picked_logprobs(base_fn(h).float() / temperature, t))
        elif base_fn is not None and k not in base:
            with torch.no_grad():
                base[k] = _picked_logprobs(base_fn(h).float() / temperature, t)
        return torch.stack(rows)

    starts = list(range(0, hidden.shape[0], chunk)) or [0]
    recompute = torch.is_grad_enabled() and len(starts) > 1
    parts = []
    for k, s in enumerate(starts):
        h, t = hidden[s : s + chunk], targets[s : s + chunk]
        parts.append(checkpoint(one, k, h, t, use_reentrant=False) if recompute else one(k, h, t))
    scored = iter(torch.cat(parts, dim=-1))  # [outputs with gradients, N]: log-probs first
    logp = next(scored)
    entropy = next(scored) if entropy_grad else None
    if with_entropy and not entropy_grad:
        entropy = torch.cat([entropies[k] for k in range(len(starts))])
    if base_fn is not None and base_grad:
        return RowScores(logp, entropy, next(scored))
    base_logp = torch.cat([base[k] for k in range(len(starts))]) if base_fn is not None else None
    return RowScores(logp, entropy, base_logp)


def _with_head(lm_fn: HeadFn, rollout_head: torch.nn.Module | None) -> HeadFn:
    """The scored logits' function of the hidden rows: the LM head's, plus R^2PO's rollout head when given (added
    in the LM logits' dtype, as the attached head's hook adds it for sampling)."""
    if rollout_head is None:
        return lm_fn

    def rollout_fn(h: torch.Tensor) -> torch.Tensor:
        lm = lm_fn(h)
        return lm + rollout_head(h).to(lm.dtype)

    return rollout_fn


def _score_by_head_swap(
    model, forward_kwargs: dict, mask: torch.Tensor, score: Callable[[HeadFn, torch.Tensor], RowScores]
) -> RowScores:
    """Run the model's own forward with its LM head replaced, for this one call, by `score(lm_fn, rows)` on the
    scored rows of the head's input, `lm_fn` being the LM head's own (class) forward."""
    head = model.get_output_embeddings()
    lm_fn = head.forward  # the class's forward, bound: calling it runs no hooks (an attached head's included)
    result: dict[str, RowScores] = {}

    def scoring_head(hidden: torch.Tensor) -> torch.Tensor:
        result["scores"] = score(lm_fn, hidden[:, :-1][mask])
        return result["scores"].logp

    head.forward = scoring_head  # an instance attribute shadows the class's forward for this one call
    try:
        model(**forward_kwargs, logits_to_keep=0)
    finally:
        del head.forward
    return result["scores"]


def _score_full_logits(
    model,
    forward_kwargs: dict,
    mask: torch.Tensor,
    rollout_head: torch.nn.Module | None,
    score: Callable[[HeadFn, HeadFn, torch.Tensor], RowScores],
) -> RowScores:
    """The fallback: one forward with full logits, scored on the selected rows. With a rollout head its input (the
    LM head's, captured by a pre-hook) gives the rollout logits of the scored rows, beside the base ones."""
    captured: dict[str, torch.Tensor] = {}
    handle = None
    if rollout_head is not None:
        handle = model.get_output_embeddings().register_forward_pre_hook(
            lambda module, args: captured.__setitem__("hidden", args[0])
        )
    try:
        logits = model(**forward_kwargs).logits
    finally:
        if handle is not None:
            handle.remove()
    rows = logits[:, :-1][mask]
    if rollout_head is None:
        return score(_identity, _identity, rows)
    hidden = captured["hidden"][:, :-1][mask]
    both = torch.stack((rows + rollout_head(hidden).to(rows.dtype), rows), dim=1)  # [N, 2 (rollout, base), V]
    return score(lambda x: x[:, 0], lambda x: x[:, 1], both)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _scored_mask(
    input_ids: torch.Tensor, response_mask: torch.Tensor | None, temperature: float, chunk: int
) -> torch.Tensor:
    """The validated boolean ``[B, T - 1]`` selection of scored positions (all of them when None)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to score tokens, got {temperature}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    batch, width = input_ids.shape
    if response_mask is None:
        return torch.ones((batch, width - 1), dtype=torch.bool, device=input_ids.device)
    if tuple(response_mask.shape) != (batch, width - 1):
        raise ValueError(
            f"response_mask must have shape {(batch, width - 1)} (one entry per scored position), "
            f"got {tuple(response_mask.shape)}"
        )
    return response_mask.bool()


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    response_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk: int = 1024,
    rollout_head: torch.nn.Module | None = None,
    with_base: bool = False,
    base_grad: bool = False,
    position_ids: torch.Tensor | None = None,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None] | tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Log-probs of each next token under softmax(logits / temperature) (and optionally the entropy of each of
    those next-token distributions, no-grad unless ``entropy_grad``), fp32, shape ``[B, T - 1]``; see the module
    docstring for how.

    ``logp[b, t]`` scores ``input_ids[b, t + 1]``. Only positions where ``response_mask`` (``[B, T - 1]`` bool,
    default all) is set are scored; the others are 0 (entropy 0). ``temperature`` is the rollout's sampling
    temperature: the engines sample from (and report) the tempered distribution, so the learner's ratio and
    importance weight are taken under the same one (as verl does). ``position_ids``: passed to the model when given
    (left-padded rows); by default the model's own.

    ``rollout_head`` (R^2PO, the model's :class:`~r3_rllib.models.rollout_head.RolloutHead`): score under the
    rollout logits ``lm_head(h) + rollout_head(h)`` instead of the base logits, the head too on the scored rows
    only. Its hook must be off (it is unless switched on). ``with_base`` (with ``rollout_head``): also return, as a
    third element, the log-probs under the base logits from the same forward, without gradients (R^2PO stage A's
    KL term) unless ``base_grad``.

    ``entropy_grad`` (an entropy bonus in the loss): the entropies are returned (whatever ``with_entropy``) with
    their gradients, recomputed chunk by chunk in backward as the log-probs are.
    """
    if with_base and rollout_head is None:
        raise ValueError("with_base needs a rollout_head: without one the scored log-probs are the base ones")
    mask = _scored_mask(input_ids, response_mask, temperature, chunk)
    targets = input_ids[:, 1:][mask]
    with_entropy = with_entropy or entropy_grad

    def score(head_fn: HeadFn, base_fn: HeadFn, rows: torch.Tensor) -> RowScores:
        base_fn = base_fn if with_base else None
        return _score_rows(
            head_fn, rows, targets, temperature, chunk, with_entropy, base_fn, base_grad, entropy_grad
        )

    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    if _head_swap_supported(model):
        scores = _score_by_head_swap(
            model, kwargs, mask, lambda lm_fn, rows: score(_with_head(lm_fn, rollout_head), lm_fn, rows)
        )
    else:
        scores = _score_full_logits(model, kwargs, mask, rollout_head, score)
    zeros = torch.zeros(mask.shape, dtype=torch.float32, device=input_ids.device)
    logp = zeros.masked_scatter(mask, scores.logp)
    entropy = zeros.masked_scatter(mask, scores.entropy) if with_entropy else None
    if with_base:
        return logp, entropy, zeros.masked_scatter(mask, scores.base)
    return logp, entropy

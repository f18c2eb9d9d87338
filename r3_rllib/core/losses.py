"""Policy-gradient losses for sequence-level RL of language models (torch, token-level tensors ``[B, T]``).

Conventions: ``mask[b, t]`` is 1 for response tokens that count in the loss and 0 for padding (and for prompt
tokens, if the tensors include them); log-probabilities are those of the sampled tokens; advantages are one number
per sequence ``[B]`` and are broadcast over its tokens.

Off-policy correction (decoupled PPO). A sample may come from a *behaviour* policy several versions older than the
learner (R^3 replays past successes into all-wrong groups; asynchronous rollouts lag). We split the correction in two:

- the PPO ratio ``exp(logp - old_logp)`` is taken against the *proximal* policy: the learner's own log-probs
  recomputed at the start of the update (``old_logprobs``), so clipping bounds the step from the current weights, as
  in on-policy PPO, whatever the sample's age;
- the remaining gap proximal/behaviour is corrected by a per-token importance weight
  ``min(exp(prox - behav), cap)`` (:func:`truncated_importance_weights`), detached so it scales the gradient without
  being optimised. Truncating at ``cap`` bounds the variance one stale token can inject (the weight is unbounded
  above otherwise); tokens the behaviour policy found *more* likely than the current one are down-weighted exactly.
  :mod:`r3_rllib.core.mismatch` generalises it (sequence-level weights, rejection of tokens or sequences, a veto,
  diagnostics of the gap), following verl's rollout correction; :func:`rl_objective` applies it.

Clipping against the behaviour policy instead would clip almost every token of an old sample (its ratio is far from
1 before any update) and so silently drop its gradient, which defeats replay.

Two guards of verl's ``compute_policy_loss`` (vanilla PPO), both on by default here because our GRPO/DAPO defaults
follow verl, where both are always applied (``clip_ratio_c = 3.0``; the log-ratio clamp to +-20):

- dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL"): for a negative advantage the
  clipped surrogate ``max(-A r, -A clip(r))`` grows without bound in ``r``; it is capped at ``-A * clip_ratio_c``
  (a token whose ratio passed ``clip_ratio_c`` then gives no gradient). Positive advantages are unaffected;
- log-ratio clamp: ``logp - old_logp`` is clamped to ``[-log_ratio_clamp, log_ratio_clamp]`` before ``exp``, so a
  token whose log-prob moved far (or an inf/garbage old log-prob) cannot overflow the ratio to inf (e^20 ~ 4.9e8 is
  finite in fp32 and bf16, e^89 is not); outside the clamp the token gives no gradient.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping

import torch

from r3_rllib.core.mismatch import PREFIX, RolloutCorrection, rollout_correction
from r3_rllib.core.reductions import invariant_masked_mean, invariant_sum
from r3_rllib.core.registry import Registry, entry_point_group

AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)

#: verl's defaults for the dual clip (``clip_ratio_c``) and the log-ratio clamp (module docstring).
DEFAULT_CLIP_RATIO_C = 3.0
DEFAULT_LOG_RATIO_CLAMP = 20.0


def _check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"shape mismatch: {shapes}")


def aggregate_loss(
    per_token: torch.Tensor, mask: torch.Tensor, mode: str, *, norm_len: float | None = None
) -> torch.Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar.

    - ``"token-mean"``: sum over all valid tokens / number of valid tokens (long responses weigh more; DAPO).
    - ``"seq-mean-token-mean"``: each sequence's mean over its valid tokens, then the mean over sequences that have
      at least one valid token (original GRPO; every sequence weighs the same whatever its length).
    - ``"seq-mean-token-sum"``: each sequence's token sum, then the mean over sequences that have at least one valid
      token (verl's mode of that name, whose mean is over every row: the same whenever each row has a trained
      token, as all do unless a rollout correction rejected a whole sequence).
    - ``"seq-mean-token-sum-norm"``: each sequence's token sum / ``norm_len``, then the mean over all ``B``
      sequences (Dr.GRPO: a constant normaliser removes the length bias of per-sequence means). ``norm_len`` should
      be a constant such as the maximum response length; it defaults to ``T``.

    A batch with no valid token gives 0 (still attached to the graph).
    """
    _check_same_shape(per_token=per_token, mask=mask)
    if per_token.dim() != 2:
        raise ValueError(f"per_token must be [B, T], got shape {tuple(per_token.shape)}")
    m = mask.to(per_token.dtype)
    masked = per_token * m
    if mode == "token-mean":
        return invariant_sum(masked) / invariant_sum(m).clamp(min=1.0)
    if mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        lens = m.sum(dim=-1)
        per_seq = masked.sum(dim=-1)
        if mode == "seq-mean-token-mean":
            per_seq = per_seq / lens.clamp(min=1.0)
        n_seq = (lens > 0).to(per_token.dtype).sum()
        return invariant_sum(per_seq) / n_seq.clamp(min=1.0)
    if mode == "seq-mean-token-sum-norm":
        norm = float(per_token.shape[-1]) if norm_len is None else float(norm_len)
        if not norm > 0:
            raise ValueError(f"norm_len must be > 0, got {norm_len}")
        return (masked.sum(dim=-1) / norm).mean()
    raise ValueError(f"unknown aggregation mode {mode!r}; known: {list(AGG_MODES)}")


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return invariant_masked_mean(x, m)


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg_mode: str,
    norm_len: float | None = None,
    is_weights: torch.Tensor | None = None,
    clip_ratio_c: float | None = None,
    log_ratio_clamp: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with asymmetric clipping ``[1 - clip_low, 1 + clip_high]`` (DAPO clip-higher).

    Per token: ``max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))`` with ``r = exp(logprobs - old_logprobs)``
    and ``A`` the sequence's advantage (``[B]``) or the token's (``[B, T]``: PPO's GAE); for ``A < 0`` capped at
    ``-A * clip_ratio_c`` when ``clip_ratio_c`` is set (dual clip, > 1); the log-ratio clamped to ``+-log_ratio_clamp`` before ``exp`` when that is set (see the module
    docstring; the function's own defaults are off, the config's are verl's). Then optionally times a detached
    importance weight ``is_weights[b, t]`` (off-policy correction), then reduced with :func:`aggregate_loss`.

    Returns ``(loss, metrics)``; metrics are detached scalars over valid tokens: ``clip_frac_low`` (share of tokens
    where the lower clip is active: ``r < 1 - clip_low`` and ``A < 0``), ``clip_frac_high`` (``r > 1 + clip_high``
    and ``A > 0``), ``clip_frac_dual`` (``A < 0`` and ``r > clip_ratio_c``: the dual clip is active; 0 when off),
    ``approx_kl`` (k3 estimate of KL(old || new)), ``ratio_mean``, and ``is_weight_mean`` when weights are given.
    """
    _check_clipped_inputs(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        clip_low,
        clip_high,
        is_weights,
        clip_ratio_c,
        log_ratio_clamp,
    )
    m = mask.to(logprobs.dtype)
    adv = token_advantages(advantages, logprobs)  # one per sequence, or one per token ('gae')
    log_ratio = logprobs - old_logprobs.detach()
    if log_ratio_clamp is not None:
        log_ratio = torch.clamp(log_ratio, -log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if clip_ratio_c is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * clip_ratio_c), per_token)
    if is_weights is not None:
        per_token = per_token * is_weights.detach().to(per_token.dtype)
    loss = aggregate_loss(per_token, mask, agg_mode, norm_len=norm_len)
    return loss, _clip_metrics(ratio, log_ratio, adv, m, clip_low, clip_high, clip_ratio_c, is_weights)


def _check_clipped_inputs(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    is_weights: torch.Tensor | None,
    clip_ratio_c: float | None,
    log_ratio_clamp: float | None,
) -> None:
    """Refuse what :func:`clipped_policy_loss` cannot take: shapes that disagree, clip bounds out of range."""
    _check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, mask=mask)
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    if advantages.shape not in (logprobs.shape[:1], logprobs.shape):
        raise ValueError(
            f"advantages must be [B]={tuple(logprobs.shape[:1])} or [B, T]={tuple(logprobs.shape)}, got "
            f"{tuple(advantages.shape)}"
        )
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (or None: no dual clip), got {clip_ratio_c}")
    if log_ratio_clamp is not None and not log_ratio_clamp > 0.0:
        raise ValueError(f"log_ratio_clamp must be > 0 (or None: no clamp), got {log_ratio_clamp}")
    if is_weights is not None:
        _check_same_shape(logprobs=logprobs, is_weights=is_weights)


@torch.no_grad()
def _clip_metrics(
    ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    adv: torch.Tensor,
    m: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None,
    is_weights: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """:func:`clipped_policy_loss`'s metrics: detached means over the valid tokens ``m`` (see its docstring)."""
    low = ((ratio < 1.0 - clip_low) & (adv < 0)).to(m.dtype)
    high = ((ratio > 1.0 + clip_high) & (adv > 0)).to(m.dtype)
    dual = (
        ((ratio > clip_ratio_c) & (adv < 0)).to(m.dtype) if clip_ratio_c is not None else torch.zeros_like(m)
    )
    metrics = {
        "clip_frac_low": _masked_mean(low, m),
        "clip_frac_high": _masked_mean(high, m),
        "clip_frac_dual": _masked_mean(dual, m),
        # k3 with samples from the old policy: E_old[r - 1 - log r] = KL(old || new), always >= 0.
        "approx_kl": _masked_mean(ratio - 1.0 - log_ratio, m),
        "ratio_mean": _masked_mean(ratio, m),
    }
    if is_weights is not None:
        metrics["is_weight_mean"] = _masked_mean(is_weights.to(m.dtype), m)
    return metrics


KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3", "k3_unclamped", "abs")

#: k3 clamps, as verl's ``low_var_kl``: the log-ratio ``ref - logp`` to +-20 before ``exp`` (e^20 ~ 4.9e8 stays finite
#: in fp32/bf16; e^89 overflows fp32 to inf and its backward to nan), then the k3 value to +-10.
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled-token log-probs (Schulman's k1/k2/k3).

    - ``"k1"``: ``logp - ref`` (unbiased, can be negative, high variance);
    - ``"k2"``: ``0.5 * (logp - ref)^2`` (biased, low variance, its gradient is the true KL's gradient to first order);
    - ``"k3"``: ``exp(d) - d - 1`` with ``d = clamp(ref - logp, -20, 20)``, then clamped to ``[-10, 10]`` (unbiased
      before the clamps, always >= 0). The clamps follow verl's ``low_var_kl``: one token the policy has moved far
      from the reference (``d`` of a few units gives ``e^d`` in the tens, and ``e^d`` grows without bound) would
      otherwise dominate the batch's KL term and its gradient; a clamped token contributes 10 and no gradient. The
      k3 value reaches 10 at ``d ~ 2.611`` and ``d ~ -11.0``.
    - ``"k3_unclamped"``: ``exp(d) - d - 1`` with ``d = ref - logp`` as it is (R^2PO's reference code: its head's KL
      to the head-less model has no clamp); only the log-ratio is bounded at +-20, so ``exp`` stays finite.
    - ``"abs"``: ``|logp - ref|`` (verl's ``abs``; >= 0, its gradient the sign of the gap).
    """
    _check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    if kind == "k1":
        return logprobs - ref_logprobs
    if kind == "k2":
        return 0.5 * (logprobs - ref_logprobs) ** 2
    if kind == "k3":
        d = torch.clamp(ref_logprobs - logprobs, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        return torch.clamp(torch.exp(d) - d - 1.0, -K3_VALUE_CLAMP, K3_VALUE_CLAMP)
    if kind == "abs":
        return (logprobs - ref_logprobs).abs()
    if kind == "k3_unclamped":
        d = torch.clamp(ref_logprobs - logprobs, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        return torch.exp(d) - d - 1.0
    raise ValueError(f"unknown KL kind {kind!r}; known: {list(KL_KINDS)}")


def truncated_importance_weights(
    proximal_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-token ``min(exp(proximal - behavior), cap)``, detached: the behaviour-to-proximal correction of
    decoupled PPO (see the module docstring). ``cap`` (> 0, typically 2..10) truncates the weight to bound the
    variance of stale samples at the price of a small bias.
    """
    _check_same_shape(proximal_logprobs=proximal_logprobs, behavior_logprobs=behavior_logprobs)
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    with torch.no_grad():
        w = torch.exp(proximal_logprobs.detach() - behavior_logprobs.detach())
        return torch.clamp(w, max=cap)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dimension, ``logsumexp(z) - sum(softmax(z) * z)`` (stable in z).

    ``-inf`` logits (masked vocabulary entries) are allowed: they have zero probability and contribute nothing.
    """
    probs = torch.softmax(logits, dim=-1)
    # 0 * -inf is nan: replace masked logits by 0 before the product (their probability is 0 anyway).
    finite = torch.where(torch.isfinite(logits), logits, torch.zeros_like(logits))
    return torch.logsumexp(logits, dim=-1) - (probs * finite).sum(dim=-1)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """The tokens whose entropy is at or above the ``1 - quantile`` quantile of the valid tokens' (``mask``), as
    TRL's ``get_high_entropy_mask`` (``top_entropy_quantile``; Wang et al. 2025 train on the top 0.2): a bool
    ``[B, T]``, False off ``mask`` and everywhere when no token is valid. ``torch.quantile`` interpolates linearly
    between the two order statistics around the quantile's position, so ties at the threshold are all kept."""
    _check_same_shape(entropy=entropy, mask=mask)
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must be in (0, 1], got {quantile}")
    valid = mask.bool()
    values = entropy[valid].float()
    if values.numel() == 0:
        return torch.zeros_like(valid)
    threshold = torch.quantile(values, 1.0 - quantile)
    return (entropy.float() >= threshold) & valid


def policy_token_weights(
    is_weights: torch.Tensor | None,
    entropy: torch.Tensor | None,
    mask: torch.Tensor,
    top_entropy_quantile: float,
    dtype: torch.dtype,
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """The policy term's detached per-token weights: the importance weights (None: none) and, with
    ``top_entropy_quantile`` < 1 (TRL's), times :func:`high_entropy_mask` of ``entropy``, as TRL multiplies the
    per-token loss by it before the importance ratio: the normaliser keeps every token, and the KL term and the
    entropy bonus are not weighted. Returns the weights and ``{"entropy_mask_frac": share of mask kept}`` (empty
    without the mask)."""
    if top_entropy_quantile >= 1.0:
        return is_weights, {}
    if entropy is None:
        raise ValueError(f"top_entropy_quantile={top_entropy_quantile} needs the tokens' entropies")
    high = high_entropy_mask(entropy.detach(), mask, top_entropy_quantile)
    weights = high.to(dtype) if is_weights is None else is_weights * high
    return weights, {"entropy_mask_frac": high.sum() / mask.bool().sum().clamp(min=1)}


def entropy_bonus(
    entropy: torch.Tensor, mask: torch.Tensor, agg_mode: str, *, norm_len: float | None = None
) -> torch.Tensor:
    """The entropy bonus's aggregate (an objective subtracts a coefficient times it): the per-token entropies
    ``entropy`` ``[B, T]`` (of the tempered next-token distributions, with their gradients), reduced over ``mask``
    by ``agg_mode`` as the policy loss is (:func:`aggregate_loss`), so each token weighs in both terms alike."""
    return aggregate_loss(entropy, mask, agg_mode, norm_len=norm_len)


LossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

#: Name -> policy loss ``fn(logprobs, old_logprobs, advantages, mask, *, is_weights, **params) -> (loss, metrics)``,
#: with the config fields each reads its parameters from (see :mod:`r3_rllib.core.registry`). The learner calls
#: the one named by the config's ``policy_loss``; installed packages add more through the entry-point group
#: ``r3_rllib.losses``, and a ``"module:function"`` path names one without registering it.
LOSS_FNS = Registry("policy loss", entry_points=entry_point_group("r3_rllib.losses"))


def register_loss(name: str, *, config_params: Mapping[str, str] | None = None) -> Callable[[LossFn], LossFn]:
    """Decorator adding a policy loss to :data:`LOSS_FNS` under ``name`` (names are unique); ``config_params``
    maps its keyword parameters to config fields."""
    return LOSS_FNS.register(name, config_params=config_params)


register_loss(
    "clipped_pg",
    config_params={
        "clip_low": "clip_low",
        "clip_high": "clip_high",
        "agg_mode": "loss_agg_mode",
        "norm_len": "max_new_tokens",
        "clip_ratio_c": "clip_ratio_c",
        "log_ratio_clamp": "log_ratio_clamp",
    },
)(clipped_policy_loss)


def _check_loss_inputs(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    is_weights: torch.Tensor | None,
    log_ratio_clamp: float | None,
) -> None:
    _check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, mask=mask)
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    if log_ratio_clamp is not None and not log_ratio_clamp > 0.0:
        raise ValueError(f"log_ratio_clamp must be > 0 (or None: no clamp), got {log_ratio_clamp}")
    if is_weights is not None:
        _check_same_shape(logprobs=logprobs, is_weights=is_weights)


#: The built-in losses that read one advantage per token (``[B, T]``, PPO's GAE) as well as one per sequence:
#: 'gspo' is a sequence's term (its ratio and clip are the sequence's), so it takes one per sequence only.
TOKEN_ADVANTAGE_LOSSES: frozenset[str] = frozenset(
    {"clipped_pg", "gspo_token", "cispo", "gpg", "sapo", "kl_cov", "clip_cov"}
)


def token_advantages(advantages: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """``advantages`` on every token, ``[B, T]``, detached, in the log-probs' dtype: a sequence's one advantage
    (``[B]``, the group estimators') on each of its tokens, or per-token ones as given (``[B, T]``: PPO's GAE)."""
    adv = advantages.to(logprobs.dtype).detach()
    if adv.shape == logprobs.shape:
        return adv
    if adv.shape == logprobs.shape[:1]:
        return adv.unsqueeze(-1).expand_as(logprobs)
    raise ValueError(
        f"advantages must be [B]={tuple(logprobs.shape[:1])} or [B, T]={tuple(logprobs.shape)}, got "
        f"{tuple(advantages.shape)}"
    )


def _sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, m: torch.Tensor, log_ratio_clamp: float | None
) -> torch.Tensor:
    """``mean_t(logprobs - old_logprobs)`` over each sequence's valid tokens ``[B]`` (0 for an empty sequence),
    clamped to ``+-log_ratio_clamp`` when set: the log of GSPO's length-normalised sequence ratio."""
    lens = m.sum(dim=-1).clamp(min=1.0)
    seq = ((logprobs - old_logprobs.detach()) * m).sum(dim=-1) / lens
    if log_ratio_clamp is not None:
        seq = torch.clamp(seq, -log_ratio_clamp, log_ratio_clamp)
    return seq


def _sequence_metrics(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    m: torch.Tensor,
    clip_low: float,
    clip_high: float,
    is_weights: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """The clipped loss's metric keys for a sequence-level ratio and advantage, given per sequence ``[B]`` or
    already per token ``[B, T]``, as shares of valid tokens (every token of a clipped sequence counts as clipped, as
    GSPO's paper counts them)."""
    with torch.no_grad():
        r = (ratio if ratio.dim() == 2 else ratio.unsqueeze(-1)).detach().expand_as(m)
        a = (adv if adv.dim() == 2 else adv.unsqueeze(-1)).detach().expand_as(m)
        token_log_ratio = logprobs.detach() - old_logprobs.detach()
        metrics = {
            "clip_frac_low": _masked_mean(((r < 1.0 - clip_low) & (a < 0)).to(m.dtype), m),
            "clip_frac_high": _masked_mean(((r > 1.0 + clip_high) & (a > 0)).to(m.dtype), m),
            "clip_frac_dual": torch.zeros((), dtype=m.dtype, device=m.device),
            # The token-level k3 estimate, as for the clipped loss: a KL, whatever ratio the loss clips.
            "approx_kl": _masked_mean(torch.exp(token_log_ratio) - 1.0 - token_log_ratio, m),
            "ratio_mean": _masked_mean(r, m),
        }
        if is_weights is not None:
            metrics["is_weight_mean"] = _masked_mean(is_weights.to(m.dtype), m)
    return metrics


#: The aggregations GSPO's objective takes: its own mean over sequences (verl forces it), or each sequence's term
#: times its length, then that mean (LUSPO, TRL's loss_type 'luspo' with sequence-level importance sampling).
GSPO_AGG_MODES = ("seq-mean-token-mean", "seq-mean-token-sum")


def _check_gspo(agg_mode: str, clip_low: float, clip_high: float) -> None:
    if agg_mode not in GSPO_AGG_MODES:
        # The objective is a mean over sequences of a per-sequence term; a token mean over the batch would weigh
        # a sequence by its length in a way neither GSPO nor LUSPO defines.
        raise ValueError(
            f"GSPO needs agg_mode 'seq-mean-token-mean' (a mean over sequences) or 'seq-mean-token-sum' (LUSPO: "
            f"each sequence's term times its length), got {agg_mode!r}"
        )
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")


#: GSPO's clip range (Zheng et al. 2025, arXiv 2507.18071, section 5.1): ``[1 - 3e-4, 1 + 4e-4]`` on the
#: length-normalised sequence ratio, two orders of magnitude below PPO's token clip (a mean of T log-ratios moves
#: far less than one of them).
GSPO_CLIP_LOW = 3e-4
GSPO_CLIP_HIGH = 4e-4


def gspo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = GSPO_CLIP_LOW,
    clip_high: float = GSPO_CLIP_HIGH,
    agg_mode: str = "seq-mean-token-mean",
    is_weights: torch.Tensor | None = None,
    log_ratio_clamp: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (Group Sequence Policy Optimization, Zheng et al. 2025, arXiv 2507.18071): PPO's clipped surrogate on
    the sequence ratio ``s_i = exp(mean_t(logprobs - old_logprobs))`` over sequence ``i``'s valid tokens (the
    geometric mean of its token ratios), clipped as a sequence to ``[1 - clip_low, 1 + clip_high]``:

        loss = (1/N) sum_i max(-A_i s_i, -A_i clip(s_i, 1 - clip_low, 1 + clip_high))

    over the ``N`` sequences with a valid token (``agg_mode`` ``'seq-mean-token-mean'``; ``'seq-mean-token-sum'``
    weighs each sequence's term by its number of valid tokens: LUSPO, TRL's ``loss_type='luspo'``). A clipped
    sequence gives no gradient to any of its tokens. ``log_ratio_clamp`` bounds the mean log-ratio before ``exp``.

    With token importance weights ``is_weights[b, t]`` (the behaviour-to-proximal correction) this is verl's GSPO:
    each token's term is multiplied by its own detached weight, and each token's gradient is scaled by its own
    weight, which needs the per-token form: the call is :func:`gspo_token_policy_loss`'s (same value). Weighting
    the sequence's term instead would scale every token's gradient by the mean of the sequence's weights.

    Returns ``(loss, metrics)`` with the keys of :func:`clipped_policy_loss`; ``clip_frac_low/high`` are shares of
    valid tokens in sequences whose ratio is clipped (with ``A < 0`` / ``A > 0``), ``ratio_mean`` the token-weighted
    mean of ``s_i``, ``clip_frac_dual`` 0 (no dual clip), ``approx_kl`` the token-level k3 estimate.
    """
    _check_loss_inputs(logprobs, old_logprobs, mask, is_weights, log_ratio_clamp)
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(
            f"GSPO needs one advantage per sequence [B]={tuple(logprobs.shape[:1])}, got "
            f"{tuple(advantages.shape)}"
        )
    _check_gspo(agg_mode, clip_low, clip_high)
    if is_weights is not None:
        return gspo_token_policy_loss(
            logprobs,
            old_logprobs,
            advantages,
            mask,
            clip_low=clip_low,
            clip_high=clip_high,
            agg_mode=agg_mode,
            is_weights=is_weights,
            log_ratio_clamp=log_ratio_clamp,
        )
    m = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype).detach()
    seq_ratio = torch.exp(_sequence_log_ratio(logprobs, old_logprobs, m, log_ratio_clamp))
    seq_loss = torch.maximum(-adv * seq_ratio, -adv * torch.clamp(seq_ratio, 1.0 - clip_low, 1.0 + clip_high))
    per_token = seq_loss.unsqueeze(-1).expand_as(logprobs)
    loss = aggregate_loss(per_token, mask, agg_mode)
    return loss, _sequence_metrics(seq_ratio, adv, logprobs, old_logprobs, m, clip_low, clip_high, is_weights)


def gspo_token_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = GSPO_CLIP_LOW,
    clip_high: float = GSPO_CLIP_HIGH,
    agg_mode: str = "seq-mean-token-mean",
    is_weights: torch.Tensor | None = None,
    log_ratio_clamp: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO-token (arXiv 2507.18071, section 4.3): the clipped surrogate per token with the ratio
    ``s_{i,t} = sg(s_i) * pi(y_t) / sg(pi(y_t))``, whose value is GSPO's sequence ratio ``s_i`` at every token and
    whose gradient flows through the token's own log-prob only; advantages may be per token ``[B, T]`` (or per
    sequence ``[B]``, broadcast).

    With per-sequence advantages its value, clipping and gradient equal :func:`gspo_policy_loss`'s (the paper's
    statement; the tests check it); with per-token advantages each token's gradient is scaled by its own
    ``A_{i,t}``, which GSPO cannot express. ``agg_mode`` must be ``'seq-mean-token-mean'``; ``is_weights``,
    ``log_ratio_clamp`` and the metrics are as for :func:`gspo_policy_loss` (``clip_frac_low/high`` per token:
    a token is clipped when ``s_i`` is outside the range with its own advantage's sign).
    """
    _check_loss_inputs(logprobs, old_logprobs, mask, is_weights, log_ratio_clamp)
    if advantages.shape == logprobs.shape[:1]:
        adv = advantages.unsqueeze(-1).expand_as(logprobs)
    elif advantages.shape == logprobs.shape:
        adv = advantages
    else:
        raise ValueError(
            f"advantages must be [B] or [B, T]={tuple(logprobs.shape)}, got {tuple(advantages.shape)}"
        )
    _check_gspo(agg_mode, clip_low, clip_high)
    m = mask.to(logprobs.dtype)
    adv = adv.to(logprobs.dtype).detach()
    seq_log_ratio = _sequence_log_ratio(logprobs, old_logprobs, m, log_ratio_clamp).detach()
    # exp(sg(log s_i) + logp - sg(logp)): the value is s_i, the gradient is s_i * grad(logp) for this token only.
    ratio = torch.exp(seq_log_ratio.unsqueeze(-1) + logprobs - logprobs.detach())
    per_token = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high))
    if is_weights is not None:
        per_token = per_token * is_weights.detach().to(per_token.dtype)
    loss = aggregate_loss(per_token, mask, agg_mode)
    metrics = _sequence_metrics(ratio, adv, logprobs, old_logprobs, m, clip_low, clip_high, is_weights)
    return loss, metrics


def cispo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_high: float,
    clip_low: float | None = None,
    agg_mode: str = "token-mean",
    norm_len: float | None = None,
    is_weights: torch.Tensor | None = None,
    log_ratio_clamp: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4-5): REINFORCE weighted by a truncated, detached token ratio,

        per token: -sg(min(r, 1 + clip_high)) * A * logprobs,   r = exp(logprobs - old_logprobs),

    with ``max(., 1 - clip_low)`` inside as well when ``clip_low`` is set (the paper leaves the lower bound off).
    Unlike PPO's clip, which drops the gradient of a token whose ratio left the range, the truncation only caps the
    token's weight: every token keeps its gradient ``sg(w) * A * grad(logprobs)`` (the paper's motivation: rare
    high-ratio "fork" tokens were being clipped out of every update). Then times the detached ``is_weights`` when
    given, reduced with :func:`aggregate_loss` (the paper normalises by the batch's token count: 'token-mean').

    The value is not a surrogate of the return (its scale follows ``logprobs``); only its gradient is meaningful.
    Returns ``(loss, metrics)`` with the keys of :func:`clipped_policy_loss`: ``clip_frac_high`` is the share of
    valid tokens whose weight is truncated above (``r > 1 + clip_high``, any advantage sign), ``clip_frac_low``
    below (0 without ``clip_low``), ``clip_frac_dual`` 0.
    """
    _check_loss_inputs(logprobs, old_logprobs, mask, is_weights, log_ratio_clamp)
    adv = token_advantages(advantages, logprobs)
    if not 0.0 <= clip_high < float("inf"):
        raise ValueError(f"clip_high must be finite and >= 0, got {clip_high}")
    if clip_low is not None and not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1) (or None: no lower bound), got {clip_low}")
    m = mask.to(logprobs.dtype)
    with torch.no_grad():
        log_ratio = logprobs.detach() - old_logprobs.detach()
        if log_ratio_clamp is not None:
            log_ratio = torch.clamp(log_ratio, -log_ratio_clamp, log_ratio_clamp)
        ratio = torch.exp(log_ratio)
        weight = torch.clamp(ratio, min=None if clip_low is None else 1.0 - clip_low, max=1.0 + clip_high)
    per_token = -weight * adv * logprobs
    if is_weights is not None:
        per_token = per_token * is_weights.detach().to(per_token.dtype)
    loss = aggregate_loss(per_token, mask, agg_mode, norm_len=norm_len)
    with torch.no_grad():
        low = (ratio < 1.0 - clip_low) if clip_low is not None else torch.zeros_like(ratio, dtype=torch.bool)
        metrics = {
            "clip_frac_low": _masked_mean(low.to(m.dtype), m),
            "clip_frac_high": _masked_mean((ratio > 1.0 + clip_high).to(m.dtype), m),
            "clip_frac_dual": torch.zeros((), dtype=m.dtype, device=m.device),
            "approx_kl": _masked_mean(ratio - 1.0 - log_ratio, m),
            "ratio_mean": _masked_mean(ratio, m),
        }
        if is_weights is not None:
            metrics["is_weight_mean"] = _masked_mean(is_weights.to(m.dtype), m)
    return loss, metrics


def gpg_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    agg_mode: str = "token-mean",
    norm_len: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GPG (Chu et al. 2025, arXiv 2504.02546; verl's ``loss_mode: gpg``): the plain policy gradient, no ratio and
    no clip,

        per token: -A * logprobs,

    times the detached ``is_weights`` when given, reduced with :func:`aggregate_loss`. Its gradient is REINFORCE's
    on the batch's own samples; on later epochs or minibatches (the policy moved since sampling) nothing corrects
    for the change but ``is_weights`` (the behaviour weight). ``old_logprobs`` only feed the metrics: the keys of
    :func:`clipped_policy_loss`, every clip fraction 0.
    """
    _check_loss_inputs(logprobs, old_logprobs, mask, is_weights, None)
    per_token = -token_advantages(advantages, logprobs) * logprobs
    return _weighted_unclipped_loss(per_token, logprobs - old_logprobs, mask, agg_mode, norm_len, is_weights)


def _weighted_unclipped_loss(
    per_token: torch.Tensor,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    agg_mode: str,
    norm_len: float | None,
    is_weights: torch.Tensor | None,
    **extra: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The shared end of the losses without a clip (GPG, KL-Cov, SAPO): ``per_token`` times the detached
    ``is_weights`` when given, :func:`aggregate_loss`, and the metrics of :func:`clipped_policy_loss` with every
    clip fraction 0 (``approx_kl`` and ``ratio_mean`` from ``log_ratio``), plus ``extra`` (detached scalars)."""
    if is_weights is not None:
        per_token = per_token * is_weights.detach().to(per_token.dtype)
    loss = aggregate_loss(per_token, mask, agg_mode, norm_len=norm_len)
    with torch.no_grad():
        m = mask.to(per_token.dtype)
        log_ratio = log_ratio.detach()
        ratio = torch.exp(log_ratio)
        zero = torch.zeros((), dtype=m.dtype, device=m.device)
        metrics = {
            "clip_frac_low": zero,
            "clip_frac_high": zero,
            "clip_frac_dual": zero,
            "approx_kl": _masked_mean(ratio - 1.0 - log_ratio, m),
            "ratio_mean": _masked_mean(ratio, m),
            **extra,
        }
        if is_weights is not None:
            metrics["is_weight_mean"] = _masked_mean(is_weights.to(m.dtype), m)
    return loss, metrics


def _token_covariance(adv: torch.Tensor, logprobs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(A_t - mean A) * (logprobs_t - mean logprobs)`` per token ``[B, T]``, the means over the ``valid`` tokens
    (detached): the covariance KL-Cov and Clip-Cov select tokens by (arXiv 2505.22617). Call with a valid token."""
    lp = logprobs.detach()
    return (adv - adv[valid].mean()) * (lp - lp[valid].mean())


#: KL-Cov's share of a micro-batch's tokens that get the KL penalty, and its weight (verl's PolicyLossConfig).
KL_COV_RATIO, KL_COV_COEF = 0.0002, 0.1


def kl_cov_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl_cov_ratio: float = KL_COV_RATIO,
    kl_coef: float = KL_COV_COEF,
    agg_mode: str = "token-mean",
    norm_len: float | None = None,
    is_weights: torch.Tensor | None = None,
    log_ratio_clamp: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617; verl's
    ``kl_cov``): the unclipped surrogate ``-A * r`` on every token, plus ``kl_coef * |logprobs - old_logprobs|`` on
    the ``max(1, int(kl_cov_ratio * n))`` valid tokens of largest covariance
    ``(A_t - mean A) * (logprobs_t - mean logprobs)`` over the ``n`` valid tokens of the micro-batch (detached; the
    tokens whose confidence rises with their advantage, which drive entropy down). Times the detached
    ``is_weights`` when given, reduced with :func:`aggregate_loss`. Metrics: the keys of :func:`clipped_policy_loss`
    (clip fractions 0) and ``kl_cov_frac``, the share of valid tokens penalised.
    """
    _check_loss_inputs(logprobs, old_logprobs, mask, is_weights, log_ratio_clamp)
    adv = token_advantages(advantages, logprobs)
    if not (0.0 < kl_cov_ratio <= 1.0 and 0.0 <= kl_coef < float("inf")):
        raise ValueError(
            f"kl_cov_ratio must be in (0, 1] and kl_coef finite and >= 0, got {kl_cov_ratio}, {kl_coef}"
        )
    log_ratio = logprobs - old_logprobs.detach()
    if log_ratio_clamp is not None:
        log_ratio = torch.clamp(log_ratio, -log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    penalised = torch.zeros_like(mask, dtype=torch.bool)
    valid = mask.bool()
    n = int(valid.sum())
    if n:
        cov = _token_covariance(adv, logprobs, valid)[valid]
        top = torch.topk(cov, max(1, int(n * kl_cov_ratio))).indices
        flat = torch.zeros(n, dtype=torch.bool, device=mask.device)
        flat[top] = True
        penalised[valid] = flat
    per_token = -adv * ratio + kl_coef * log_ratio.abs() * penalised.to(logprobs.dtype)
    frac = _masked_mean(penalised.to(logprobs.dtype), mask.to(logprobs.dtype))
    return _weighted_unclipped_loss(
        per_token, log_ratio, mask, agg_mode, norm_len, is_weights, kl_cov_frac=frac
    )


#: Clip-Cov's share of a micro-batch's tokens whose gradient it drops, and the covariance band they are drawn from
#: (verl's PolicyLossConfig).
CLIP_COV_RATIO, CLIP_COV_LB, CLIP_COV_UB = 0.0002, 1.0, 5.0


def clip_cov_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_cov_ratio: float = CLIP_COV_RATIO,
    clip_cov_lb: float = CLIP_COV_LB,
    clip_cov_ub: float = CLIP_COV_UB,
    agg_mode: str = "token-mean",
    norm_len: float | None = None,
    is_weights: torch.Tensor | None = None,
    log_ratio_clamp: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617; verl's ``clip_cov``): PPO's clipped surrogate
    (:func:`clipped_policy_loss`, no dual clip), with the gradient of up to ``max(1, int(clip_cov_ratio * n))`` of
    the micro-batch's ``n`` valid tokens dropped: drawn at random (``torch.randperm`` on torch's global generator,
    which the learner seeds from the run's seed and checkpoints) among the tokens PPO did not clip whose covariance
    ``(A_t - mean A) * (logprobs_t - mean logprobs)`` lies strictly between ``clip_cov_lb`` and ``clip_cov_ub``,
    leaving out tokens of weight 0 in ``is_weights`` (no gradient to drop: top_entropy_quantile's masked tokens).
    Metrics: :func:`clipped_policy_loss`'s and ``clip_cov_frac``, the share of valid tokens dropped.
    """
    _check_clipped_inputs(
        logprobs, old_logprobs, advantages, mask, clip_low, clip_high, is_weights, None, log_ratio_clamp
    )
    if not (0.0 < clip_cov_ratio <= 1.0 and clip_cov_lb < clip_cov_ub):
        raise ValueError(
            f"clip_cov_ratio must be in (0, 1] and clip_cov_lb < clip_cov_ub, got {clip_cov_ratio}, "
            f"{clip_cov_lb}, {clip_cov_ub}"
        )
    with torch.no_grad():
        valid = mask.bool()
        a = token_advantages(advantages, logprobs)
        log_ratio = logprobs.detach() - old_logprobs.detach()
        if log_ratio_clamp is not None:
            log_ratio = torch.clamp(log_ratio, -log_ratio_clamp, log_ratio_clamp)
        ratio = torch.exp(log_ratio)
        clipped_by_ppo = -a * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) > -a * ratio
        keep = torch.ones_like(logprobs)
        if valid.any():
            cov = _token_covariance(a, logprobs, valid)
            # A token of weight 0 (out of top_entropy_quantile's mask, or IcePop's band) has no gradient to drop.
            carries = valid if is_weights is None else valid & (is_weights.detach() != 0)
            band = carries & ~clipped_by_ppo & (cov > clip_cov_lb) & (cov < clip_cov_ub)
            where = torch.nonzero(band)
            drawn = where[torch.randperm(len(where))[: max(1, int(clip_cov_ratio * int(valid.sum())))]]
            keep[drawn[:, 0], drawn[:, 1]] = 0.0
    weights = keep if is_weights is None else is_weights.detach() * keep
    loss, metrics = clipped_policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        agg_mode=agg_mode,
        norm_len=norm_len,
        is_weights=weights,
        log_ratio_clamp=log_ratio_clamp,
    )
    m = mask.to(logprobs.dtype)
    metrics["clip_cov_frac"] = _masked_mean(1.0 - keep, m)
    metrics.pop("is_weight_mean", None)
    if is_weights is not None:
        metrics["is_weight_mean"] = _masked_mean(is_weights.detach().to(m.dtype), m)
    return loss, metrics


#: SAPO's gate temperatures for positive and negative advantages (the paper's, and verl's and TRL's defaults).
SAPO_TAU_POS, SAPO_TAU_NEG = 1.0, 1.05


def sapo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    tau_pos: float = SAPO_TAU_POS,
    tau_neg: float = SAPO_TAU_NEG,
    agg_mode: str = "seq-mean-token-mean",
    norm_len: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO (Soft Adaptive Policy Optimization, Gao et al. 2025, arXiv 2511.20347; verl's and TRL's ``sapo``): a
    smooth gate on the token ratio in place of PPO's hard clip,

        per token: -f(r; tau) * A,   f(r; tau) = sigmoid(tau * (r - 1)) * 4 / tau,   r = exp(logprobs - old),

    with ``tau = tau_pos`` where ``A > 0`` and ``tau_neg`` elsewhere (the log-ratio clamped at +-20 first, as
    verl). At ``r = 1`` the gate's slope is 1, so an on-policy step is the policy gradient's; away from it the
    gradient fades smoothly instead of stopping at a clip edge. Times the detached ``is_weights`` when given, then
    :func:`aggregate_loss` (the paper's objective is a mean over sequences: 'seq-mean-token-mean', which the config
    requires). Metrics: the keys of :func:`clipped_policy_loss`, every clip fraction 0.
    """
    _check_loss_inputs(logprobs, old_logprobs, mask, is_weights, None)
    adv = token_advantages(advantages, logprobs)
    if not (0.0 < tau_pos < float("inf") and 0.0 < tau_neg < float("inf")):
        raise ValueError(f"tau_pos and tau_neg must be finite and > 0, got {tau_pos}, {tau_neg}")
    log_ratio = torch.clamp(
        logprobs - old_logprobs.detach(), -DEFAULT_LOG_RATIO_CLAMP, DEFAULT_LOG_RATIO_CLAMP
    )
    ratio = torch.exp(log_ratio)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    per_token = -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv
    return _weighted_unclipped_loss(per_token, log_ratio, mask, agg_mode, norm_len, is_weights)


#: VESPO's kernel shapes and rates for responses of non-negative / negative advantage (TRL's vespo_k_pos,
#: vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg defaults).
VESPO_K_POS, VESPO_LAMBDA_POS, VESPO_K_NEG, VESPO_LAMBDA_NEG = 2.0, 3.0, 3.0, 2.0
#: The sequence log-weight's bounds before ``exp`` (TRL's: ``log(1e-8)`` below, 20 above).
_VESPO_LOG_W_MIN, _VESPO_LOG_W_MAX = math.log(1e-8), 20.0


def vespo_sequence_weights(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    k_pos: float = VESPO_K_POS,
    lambda_pos: float = VESPO_LAMBDA_POS,
    k_neg: float = VESPO_K_NEG,
    lambda_neg: float = VESPO_LAMBDA_NEG,
    is_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """VESPO's reshaping kernel on each sequence's importance weight, ``[B]``, detached:

        phi(w) = exp(lambda + k log w - lambda w) = e^lambda w^k e^(-lambda w),   phi(1) = 1,

    ``w`` the sequence's whole importance weight, not length-normalised: ``log w`` is the sum over its valid tokens
    of ``log_ratio`` (each clamped to +-20) plus, when given, of ``log is_weights`` (the behaviour-to-proximal
    token weights, each clamped to ``[log 1e-8, 20]``, so a zero weight all but silences its sequence), the sum
    clamped to ``[log 1e-8, 20]``; padding counts nothing, even a NaN there. ``(k, lambda)`` are ``(k_pos,
    lambda_pos)`` for ``A >= 0`` and ``(k_neg, lambda_neg)`` below. The kernel peaks at ``w = k / lambda`` and falls to 0 at both ends, so a sequence the
    policy has moved far from (either way) gets little weight. A non-finite ``phi`` is 0 (TRL's ``nan_to_num``)."""
    with torch.no_grad():
        valid = mask.bool()
        zero = torch.zeros((), dtype=torch.float64, device=log_ratio.device)
        # torch.where, not a product with the mask: a padding position's NaN must not reach its row's sum.
        bounded = torch.clamp(log_ratio.detach().double(), -DEFAULT_LOG_RATIO_CLAMP, DEFAULT_LOG_RATIO_CLAMP)
        log_w = torch.where(valid, bounded, zero).sum(-1)
        if is_weights is not None:
            log_is = torch.log(is_weights.detach().double()).clamp(_VESPO_LOG_W_MIN, _VESPO_LOG_W_MAX)
            log_w = log_w + torch.where(valid, log_is, zero).sum(-1)
        log_w = log_w.clamp(_VESPO_LOG_W_MIN, _VESPO_LOG_W_MAX)
        nonneg = advantages.detach() >= 0
        k = torch.where(nonneg, k_pos, k_neg).double()
        lam = torch.where(nonneg, lambda_pos, lambda_neg).double()
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
        return torch.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0).to(log_ratio.dtype)


def _check_vespo(logprobs: torch.Tensor, advantages: torch.Tensor, **kernel: float) -> None:
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(
            f"VESPO needs one advantage per sequence [B]={tuple(logprobs.shape[:1])}, got "
            f"{tuple(advantages.shape)}"
        )
    for name, value in kernel.items():
        if not 0.0 < value < float("inf"):
            raise ValueError(f"VESPO's {name} must be finite and > 0, got {value}")


def vespo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    k_pos: float = VESPO_K_POS,
    lambda_pos: float = VESPO_LAMBDA_POS,
    k_neg: float = VESPO_K_NEG,
    lambda_neg: float = VESPO_LAMBDA_NEG,
    agg_mode: str = "token-mean",
    norm_len: float | None = None,
    is_weights: torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """VESPO (Variational sEquence-level Soft Policy Optimization, arXiv 2602.10693; its authors' verl recipe and
    TRL's ``loss_type='vespo'``, which agree): REINFORCE scaled by a detached kernel of the sequence's importance
    weight, no clip,

        per token: -phi(w_i) * A_i * logprobs,   phi: :func:`vespo_sequence_weights`,

    reduced with :func:`aggregate_loss` (both references' default is 'token-mean'). On-policy (``w = 1``) it is the
    policy gradient (:func:`gpg_policy_loss`'s); off-policy each sequence's step is scaled by the kernel of its
    weight, a smooth and bounded alternative to PPO's hard clip (with the defaults and ``A >= 0``: at most
    e 4 / 9 = 1.21, at ``w = 2/3``; 0.5 at ``w = 0.22`` and ``1.5``; toward 0 beyond), so staleness and engine
    mismatch cost weight rather than stability. The behaviour weights ``is_weights`` are folded into ``w`` (TRL
    folds its vLLM correction there too) rather than multiplying each token's term, so they must be per-token
    importance weights (rollout_is 'token'; the config refuses a sequence weight). ``token_weights`` (the entropy
    mask of top_entropy_quantile, detached) multiply each token's term after the kernel, as TRL multiplies its
    per-token loss by the mask; the normaliser keeps every token. They reach the sequence's weight only through
    ``is_weights``, so they stay apart (:func:`takes_token_weights`). Staleness and engine mismatch enter ``w``
    only through ``is_weights``: with ``off_policy_correction`` off (``preset: grpo``), ``w`` is the current
    policy against the proximal one alone. One advantage per sequence: the kernel's side is chosen by its sign.

    The value is not a surrogate of the return (its scale follows ``logprobs``); only its gradient is meaningful.
    Metrics: the keys of :func:`clipped_policy_loss` (every clip fraction 0; ``approx_kl``, ``ratio_mean`` of the
    token ratios) and ``vespo_phi_mean``, the mean over valid tokens of their sequence's kernel weight.
    """
    _check_loss_inputs(logprobs, old_logprobs, mask, is_weights, None)
    _check_vespo(logprobs, advantages, k_pos=k_pos, lambda_pos=lambda_pos, k_neg=k_neg, lambda_neg=lambda_neg)
    log_ratio = logprobs.detach() - old_logprobs.detach()
    phi = vespo_sequence_weights(
        log_ratio,
        mask,
        advantages,
        k_pos=k_pos,
        lambda_pos=lambda_pos,
        k_neg=k_neg,
        lambda_neg=lambda_neg,
        is_weights=is_weights,
    )
    adv = advantages.to(logprobs.dtype).detach()
    per_token = -(phi * adv).unsqueeze(-1) * logprobs
    if token_weights is not None:
        _check_same_shape(logprobs=logprobs, token_weights=token_weights)
        per_token = per_token * token_weights.detach().to(per_token.dtype)
    with torch.no_grad():  # per trained token: micro-batches and ranks then combine it exactly (token-mean)
        phi_mean = _masked_mean(phi.unsqueeze(-1).expand_as(logprobs), mask.to(logprobs.dtype))
    loss, metrics = _weighted_unclipped_loss(
        per_token, log_ratio, mask, agg_mode, norm_len, None, vespo_phi_mean=phi_mean
    )
    if is_weights is not None:
        metrics["is_weight_mean"] = _masked_mean(
            is_weights.detach().to(logprobs.dtype), mask.to(logprobs.dtype)
        )
    return loss, metrics


_GSPO_PARAMS = {
    "clip_low": "gspo_clip_low",
    "clip_high": "gspo_clip_high",
    "agg_mode": "loss_agg_mode",
    "log_ratio_clamp": "log_ratio_clamp",
}
register_loss("gspo", config_params=_GSPO_PARAMS)(gspo_policy_loss)
register_loss("gspo_token", config_params=_GSPO_PARAMS)(gspo_token_policy_loss)
register_loss(
    "cispo",
    config_params={
        "clip_high": "cispo_clip_high",
        "clip_low": "cispo_clip_low",
        "agg_mode": "loss_agg_mode",
        "norm_len": "max_new_tokens",
        "log_ratio_clamp": "log_ratio_clamp",
    },
)(cispo_policy_loss)
register_loss("gpg", config_params={"agg_mode": "loss_agg_mode", "norm_len": "max_new_tokens"})(
    gpg_policy_loss
)
register_loss(
    "clip_cov",
    config_params={
        "clip_low": "clip_low",
        "clip_high": "clip_high",
        "clip_cov_ratio": "clip_cov_ratio",
        "clip_cov_lb": "clip_cov_lb",
        "clip_cov_ub": "clip_cov_ub",
        "agg_mode": "loss_agg_mode",
        "norm_len": "max_new_tokens",
        "log_ratio_clamp": "log_ratio_clamp",
    },
)(clip_cov_policy_loss)
register_loss(
    "kl_cov",
    config_params={
        "kl_cov_ratio": "kl_cov_ratio",
        "kl_coef": "kl_cov_coef",
        "agg_mode": "loss_agg_mode",
        "norm_len": "max_new_tokens",
        "log_ratio_clamp": "log_ratio_clamp",
    },
)(kl_cov_policy_loss)
register_loss(
    "sapo",
    config_params={
        "tau_pos": "sapo_tau_pos",
        "tau_neg": "sapo_tau_neg",
        "agg_mode": "loss_agg_mode",
        "norm_len": "max_new_tokens",
    },
)(sapo_policy_loss)

register_loss(
    "vespo",
    config_params={
        "k_pos": "vespo_k_pos",
        "lambda_pos": "vespo_lambda_pos",
        "k_neg": "vespo_k_neg",
        "lambda_neg": "vespo_lambda_neg",
        "agg_mode": "loss_agg_mode",
        "norm_len": "max_new_tokens",
    },
)(vespo_policy_loss)


@functools.cache  # asked per micro-batch; a loss's signature does not change
def takes_token_weights(fn: LossFn) -> bool:
    """Whether a policy loss takes per-token weights that are not importance weights (the entropy mask of
    top_entropy_quantile) as ``token_weights``, apart from ``is_weights``: a loss that reads the importance weights
    as more than a per-token factor (VESPO folds them into each sequence's weight) declares it, and the objective
    then passes the two separately; the others get their product as ``is_weights``."""
    return "token_weights" in inspect.signature(fn).parameters


def _loss_weights(
    fn: LossFn,
    is_w: torch.Tensor | None,
    entropy: torch.Tensor | None,
    mask: torch.Tensor,
    top_entropy_quantile: float,
    dtype: torch.dtype,
) -> tuple[dict[str, torch.Tensor | None], dict[str, torch.Tensor]]:
    """The weight keywords of policy loss ``fn`` (:func:`policy_token_weights`'s product as ``is_weights``, or the
    importance weights and the entropy mask apart for a loss that :func:`takes_token_weights`) and the mask's
    metrics."""
    if takes_token_weights(fn):
        token_w, masked = policy_token_weights(None, entropy, mask, top_entropy_quantile, dtype)
        return {"is_weights": is_w, "token_weights": token_w}, masked
    token_w, masked = policy_token_weights(is_w, entropy, mask, top_entropy_quantile, dtype)
    return {"is_weights": token_w}, masked


def get_loss_fn(name: str) -> LossFn:
    """The policy loss registered as ``name``."""
    return LOSS_FNS.get_fn(name)


def rl_objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    policy_loss: str = "clipped_pg",
    loss_params: Mapping[str, object] | None = None,
    correction: RolloutCorrection | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_type: str = "k3",
    agg_mode: str = "token-mean",
    norm_len: float | None = None,
    kl_agg_mode: str | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    top_entropy_quantile: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The learner's whole objective on one micro-batch: the policy loss named ``policy_loss`` (from
    :data:`LOSS_FNS`, with ``loss_params``), weighted per token by the behaviour importance weight, plus
    ``kl_coef`` times the KL to a reference policy when ``ref_logprobs`` is given, minus ``entropy_coef`` times the
    :func:`entropy_bonus` of ``entropy`` (``[B, T]``, the tokens' entropies with their gradients) when it is > 0.

    The behaviour-to-proximal correction is ``correction`` (:mod:`r3_rllib.core.mismatch`: importance weights,
    rejection, veto; its diagnostics are added to the metrics as ``mismatch_*``); None: no correction. Rejected
    tokens leave the policy loss, the KL term and the entropy bonus, numerator and this micro-batch's normaliser
    (the loss is aggregated over ``mask & keep``); the caller's rescaling to the minibatch's count must use the kept
    count too (:func:`~r3_rllib.core.mismatch.micro_batch_share`, :func:`~r3_rllib.core.mismatch.normaliser_share`).

    The reduction over tokens is the micro-batch's own (``agg_mode``; the KL term's is ``kl_agg_mode``, None: the
    same); the caller rescales it to the global token or sequence count of the minibatch, which only it knows
    (ranks and micro-batches split one minibatch). Returns
    ``(loss, metrics)`` with detached scalar metrics: the policy loss's own (``clip_frac_low``, ...), plus
    ``pg_loss``, ``kl``, ``is_weight_mean`` (with a weight) and ``entropy_bonus`` (the term subtracted; only when
    ``entropy_coef`` > 0). ``top_entropy_quantile`` < 1: the policy term's tokens are weighted by
    :func:`policy_token_weights` (``entropy_mask_frac`` added to the metrics).
    """
    is_w, diagnostics = None, {}
    if correction is not None:
        w, keep, diag = rollout_correction(old_logprobs, behavior_logprobs, mask, correction)
        if correction.is_level is not None or correction.rs_level == "icepop":
            is_w = w
        mask = mask.bool() & keep
        diagnostics = {PREFIX + k: v for k, v in diag.items()}
    fn = get_loss_fn(policy_loss)
    weights, masked = _loss_weights(fn, is_w, entropy, mask, top_entropy_quantile, logprobs.dtype)
    diagnostics |= masked
    pg, metrics = fn(logprobs, old_logprobs, advantages, mask, **weights, **dict(loss_params or {}))
    loss = pg
    kl = torch.zeros((), device=logprobs.device)
    if ref_logprobs is not None:
        per_token_kl = kl_penalty(logprobs, ref_logprobs, kl_type)
        kl = aggregate_loss(per_token_kl, mask, kl_agg_mode or agg_mode, norm_len=norm_len)
        loss = loss + kl_coef * kl
    # The entropy mask is a token weight, not an importance weight: no is_weight_mean without one.
    out = {k: v.detach() for k, v in metrics.items() if is_w is not None or k != "is_weight_mean"}
    if entropy_coef > 0:
        if entropy is None:
            raise ValueError(f"entropy_coef={entropy_coef} needs the tokens' entropies (with gradients)")
        bonus = entropy_coef * entropy_bonus(entropy, mask, agg_mode, norm_len=norm_len)
        loss = loss - bonus
        out["entropy_bonus"] = bonus.detach()
    out["pg_loss"] = pg.detach()
    out["kl"] = kl.detach()
    if is_w is not None:
        out["is_weight_mean"] = _masked_mean(is_w, mask.to(is_w.dtype))
    return loss, out | diagnostics

"""Rollout/trainer mismatch: importance weights, rejection masks and diagnostics (torch, tensors ``[B, T]``).

The tokens a learner trains on were sampled by a *behaviour* policy: an engine (vLLM, the HF engine) with other
kernels, another dtype or older weights than the learner's *proximal* ("old", trainer) policy. The per-token ratio
``r_t = pi_trainer(y_t) / pi_behaviour(y_t)`` measures that gap; following verl's rollout correction, two
independent mechanisms act on it:

- importance weights (``rollout_is``): ``"token"``: ``min(r_t, C)`` per token; ``"sequence"``:
  ``min(prod_t r_t, C)`` per sequence, broadcast over its tokens (unbiased for the sequence-level objective, far
  higher variance); None: no weight. ``C`` is the config's ``is_cap`` (verl's ``rollout_is_threshold``);
- rejection (``rollout_rs``): tokens or whole sequences whose ratio leaves ``[lo, hi]`` are removed from the loss
  *and* from its normalising count (their gradient is dropped, not down-weighted): ``"token"`` tests ``r_t``,
  ``"sequence"`` the product ``prod_t r_t``, ``"geometric"`` the geometric mean ``exp(mean_t log r_t)`` (a
  length-independent sequence test, so its band is narrow: 1 +- 1e-3 or so); ``"icepop"`` (IcePop, Ring-1T)
  weights each token by ``M(r_t) = r_t`` inside ``[lo, hi]`` and 0 outside, every token kept in the count, as
  IcePop's objective is normalised by all of the group's tokens. IcePop's weight *is* its importance weight: it
  replaces ``rollout_is``'s truncated one and applies whether or not ``off_policy_correction`` asks for a weight
  (a band above ``is_cap`` keeps ``r_t`` up to ``hi``). ``lo`` defaults to ``1 / hi``;
- veto (``rollout_token_veto_threshold``): a sequence with any token whose (unclamped) ratio is below it is
  rejected whole: one token the engine sampled but the trainer finds near impossible signals a broken sample.

Diagnostics (detached scalars, always computed, whatever is switched on): ``k1`` = mean of
``log pi_behaviour - log pi_trainer`` (the k1 estimate of KL(behaviour || trainer): the tokens are behaviour
samples; it can be negative), ``k3`` = mean of ``r - 1 - log r`` (the k3 estimate of the same KL, >= 0),
``ppl_ratio`` = verl's: per sequence, trainer perplexity / behaviour perplexity (``exp`` of the mean over the
sequence's tokens of ``log pi_behaviour - log pi_trainer``), averaged over sequences (> 1: the trainer finds the
samples less likely than the engine did), ``token_masked_frac`` (valid tokens rejected),
``seq_masked_frac`` (sequences left without any token), ``token_zeroed_frac`` (IcePop's zero-weight tokens),
``veto_frac`` (sequences vetoed), ``is_weight_mean`` and ``is_weight_max`` over the tokens kept (a weight of 1 when
no weight is applied). Means are over valid tokens (sequences for the sequence shares); ``is_weight_max`` is a
maximum (:data:`MAX_KEYS`: reduce it with max, not a mean, across micro-batches and ranks). Among the loss's
and the learner's metrics the names carry :data:`PREFIX` (``learner/mismatch_k1``, ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from r3_rllib.core.reductions import invariant_masked_mean

IS_LEVELS: tuple[str, ...] = ("token", "sequence")
RS_LEVELS: tuple[str, ...] = ("token", "sequence", "geometric", "icepop")
#: Log-ratios are clamped to +-20 before ``exp`` (e^20 ~ 4.9e8 is finite in fp32 and bf16), as verl bounds them.
LOG_RATIO_BOUND = 20.0
#: Prefix of the diagnostics among the loss's (and the learner's) metrics: ``mismatch_k1``, ...
PREFIX = "mismatch_"
#: Metrics that are maxima: reduced with max over micro-batches, steps and ranks.
MAX_KEYS: frozenset[str] = frozenset({PREFIX + "is_weight_max"})


@dataclass(frozen=True)
class RolloutCorrection:
    """What to do about the behaviour/trainer gap (see the module docstring; verl's names).

    ``is_level``: ``"token"``, ``"sequence"`` or None (no importance weight); ``is_threshold``: its truncation
    ``C`` (> 0). ``rs_level``: one of :data:`RS_LEVELS` or None (no rejection); ``rs_threshold`` (None:
    ``is_threshold``) and ``rs_threshold_lower`` (None: ``1 / rs_threshold``) bound the accepted band.
    ``veto_threshold``: in (0, 1), or None (no veto).
    """

    is_level: str | None = "token"
    is_threshold: float = 2.0
    rs_level: str | None = None
    rs_threshold: float | None = None
    rs_threshold_lower: float | None = None
    veto_threshold: float | None = None

    def __post_init__(self) -> None:
        if self.is_level is not None and self.is_level not in IS_LEVELS:
            raise ValueError(f"rollout_is must be one of {list(IS_LEVELS)} or None, got {self.is_level!r}")
        if self.rs_level is not None and self.rs_level not in RS_LEVELS:
            raise ValueError(f"rollout_rs must be one of {list(RS_LEVELS)} or None, got {self.rs_level!r}")
        if not self.is_threshold > 0:
            raise ValueError(f"the importance weight's threshold must be > 0, got {self.is_threshold}")
        lo, hi = self.rs_band
        if not 0 < lo < hi:
            raise ValueError(f"the rejection band must satisfy 0 < lower < upper, got [{lo}, {hi}]")
        if self.veto_threshold is not None and not 0 < self.veto_threshold < 1:
            raise ValueError(f"rollout_token_veto_threshold must be in (0, 1), got {self.veto_threshold}")

    @property
    def rs_band(self) -> tuple[float, float]:
        """The accepted ratio band ``[lo, hi]`` of rejection (defaults resolved)."""
        hi = float(self.rs_threshold if self.rs_threshold is not None else self.is_threshold)
        lo = float(self.rs_threshold_lower) if self.rs_threshold_lower is not None else 1.0 / hi
        return lo, hi

    @property
    def rejects(self) -> bool:
        """Whether tokens can leave the loss's normalising count (rejection other than IcePop's, or a veto)."""
        return self.rs_level not in (None, "icepop") or self.veto_threshold is not None


def correction_from_config(config, weighted: bool) -> RolloutCorrection:
    """The correction a config's fields describe (verl's names; ``is_cap`` is the weight's threshold and the
    default upper bound of rejection); ``weighted`` False: no importance weight (the caller decides whether the
    weight applies, e.g. per R^2PO stage), rejection and veto as configured."""
    return RolloutCorrection(
        is_level=getattr(config, "rollout_is", "token") if weighted else None,
        is_threshold=float(config.is_cap),
        rs_level=getattr(config, "rollout_rs", None),
        rs_threshold=getattr(config, "rollout_rs_threshold", None),
        rs_threshold_lower=getattr(config, "rollout_rs_threshold_lower", None),
        veto_threshold=getattr(config, "rollout_token_veto_threshold", None),
    )


def _seq_sum(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return (x * m).sum(dim=-1)


def _mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return invariant_masked_mean(x, m)


@torch.no_grad()
def rollout_correction(
    trainer_logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    mask: torch.Tensor,
    correction: RolloutCorrection,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """``(weights, keep, diagnostics)`` for tokens ``mask`` ``[B, T]``; all detached.

    ``weights`` ``[B, T]``: the importance weight of each token (1 at invalid positions and where no weight is
    applied; 0 for IcePop's out-of-band tokens). ``keep`` ``[B, T]`` (bool): the valid tokens left after rejection
    and veto: the loss and its normaliser must use ``mask & keep``. ``diagnostics``: see the module docstring.
    """
    if not (trainer_logprobs.shape == behavior_logprobs.shape == mask.shape) or mask.dim() != 2:
        raise ValueError(
            f"expected three [B, T] tensors of one shape, got {tuple(trainer_logprobs.shape)}, "
            f"{tuple(behavior_logprobs.shape)}, {tuple(mask.shape)}"
        )
    valid = mask.bool()
    m = valid.to(torch.float32)
    log_r = torch.where(valid, trainer_logprobs.detach().float() - behavior_logprobs.detach().float(), 0.0)
    bounded = log_r.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    seq_log_r = _seq_sum(log_r, m).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    keep, zeroed, vetoed = _rejection(log_r, bounded, seq_log_r, m, valid, correction)
    if correction.rs_level == "icepop":
        # IcePop's M(r) = r in the band, 0 outside: the ratio itself, not rollout_is's truncated weight.
        in_band = valid & ~zeroed
        weights = torch.where(in_band, torch.exp(bounded), torch.where(valid, 0.0, 1.0))
    else:
        weights = _is_weights(bounded, seq_log_r, valid, correction)
    kept = (valid & keep).to(torch.float32)
    has_tokens = m.sum(dim=-1) > 0
    n_seq = has_tokens.to(torch.float32).sum().clamp(min=1.0)
    ratio = torch.exp(bounded)
    lens = m.sum(dim=-1)
    seq_log_ppl_ratio = -_seq_sum(log_r, m) / lens.clamp(min=1.0)  # log(ppl_trainer / ppl_behaviour) per row
    diagnostics = {
        "k1": _mean(-log_r, m),
        "k3": _mean(ratio - 1.0 - bounded, m),
        "ppl_ratio": (torch.exp(seq_log_ppl_ratio) * has_tokens).sum() / n_seq,
        "token_masked_frac": 1.0 - kept.sum() / m.sum().clamp(min=1.0),
        "seq_masked_frac": (has_tokens & (kept.sum(dim=-1) == 0)).to(torch.float32).sum() / n_seq,
        "token_zeroed_frac": _mean(zeroed.to(torch.float32), m),
        "veto_frac": (vetoed & has_tokens).to(torch.float32).sum() / n_seq,
        "is_weight_mean": _mean(weights, kept),
        "is_weight_max": torch.where(kept.bool(), weights, 0.0).max() if weights.numel() else m.new_zeros(()),
    }
    return weights, keep & valid, diagnostics


def _is_weights(
    bounded: torch.Tensor, seq_log_r: torch.Tensor, valid: torch.Tensor, correction: RolloutCorrection
) -> torch.Tensor:
    """Truncated importance weights per token (1 at invalid positions and without a weight)."""
    if correction.is_level is None:
        return torch.ones_like(bounded)
    cap = correction.is_threshold
    if correction.is_level == "token":
        w = torch.exp(bounded).clamp(max=cap)
    else:
        w = torch.exp(seq_log_r).clamp(max=cap).unsqueeze(-1).expand_as(bounded)
    return torch.where(valid, w, torch.ones_like(w))


def _rejection(
    log_r: torch.Tensor,
    bounded: torch.Tensor,
    seq_log_r: torch.Tensor,
    m: torch.Tensor,
    valid: torch.Tensor,
    correction: RolloutCorrection,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(keep [B, T], zeroed [B, T], vetoed [B])``: the tokens kept in the loss, IcePop's zero-weight tokens,
    the vetoed sequences."""
    lo, hi = correction.rs_band
    log_lo, log_hi = math.log(lo), math.log(hi)
    keep = torch.ones_like(valid)
    zeroed = torch.zeros_like(valid)
    level = correction.rs_level

    def outside(x: torch.Tensor) -> torch.Tensor:  # compared in log space: no overflow of long products
        return (x < log_lo) | (x > log_hi)

    if level == "token":
        keep = ~outside(bounded)
    elif level == "icepop":
        zeroed = outside(bounded) & valid
    elif level in ("sequence", "geometric"):
        seq = seq_log_r if level == "sequence" else _seq_sum(log_r, m) / m.sum(dim=-1).clamp(min=1.0)
        keep = (~outside(seq)).unsqueeze(-1).expand_as(valid)
    vetoed = torch.zeros(valid.shape[0], dtype=torch.bool, device=valid.device)
    if correction.veto_threshold is not None:
        # The true ratio, before any bound: a token 1e-9 times as likely to the trainer vetoes its sequence.
        vetoed = ((log_r < math.log(correction.veto_threshold)) & valid).any(dim=-1)
        keep = keep & ~vetoed.unsqueeze(-1)
    return keep, zeroed, vetoed


def normaliser_share(metrics: dict, agg_mode: str):
    """The share of the loss's normalising count left after rejection, from the reduced diagnostics of a
    minibatch (keys with :data:`PREFIX`): its valid tokens kept (``"token-mean"``) or its sequences with a token left (the sequence modes).
    Dividing the gradient by it makes rejected tokens leave the count as they left the loss."""
    key = "token_masked_frac" if agg_mode == "token-mean" else "seq_masked_frac"
    return 1.0 - metrics[PREFIX + key]


def micro_batch_share(metrics: dict, agg_mode: str):
    """The count a micro-batch's loss is divided by after rejection, as a share of the count before it (the
    learner weighs micro-batches by the latter): kept tokens, kept sequences, or 1 for
    ``"seq-mean-token-sum-norm"`` (its constant normaliser divides by all of the micro-batch's rows)."""
    if agg_mode == "seq-mean-token-sum-norm":
        return 1.0
    return normaliser_share(metrics, agg_mode)


class RunningMax:
    """Maxima of :data:`MAX_KEYS` metrics over the passes of an update (tensors kept on their device: no host
    sync per pass)."""

    def __init__(self) -> None:
        self._values: dict[str, torch.Tensor] = {}

    def take(self, metrics: dict, real: bool) -> None:
        """Move the :data:`MAX_KEYS` entries of ``metrics`` into the running maxima (a padding pass, not
        ``real``, adds 0: every rank then reports the same keys; the maxima here are >= 0)."""
        for key in sorted(MAX_KEYS & metrics.keys()):
            value = metrics.pop(key).detach().double()
            value = value if real else torch.zeros_like(value)
            self._values[key] = torch.maximum(self._values[key], value) if key in self._values else value

    def read(self) -> dict[str, float]:
        """The maxima as floats (one host transfer)."""
        keys = sorted(self._values)
        values = torch.stack([self._values[k].cpu() for k in keys]).tolist() if keys else []
        return dict(zip(keys, values, strict=True))


#: The metrics that are values of the objective (or of its terms): scaled like the loss whose value they report.
LOSS_KEYS: tuple[str, ...] = ("loss", "pg_loss", "kl", "r2po_kl", "entropy_bonus")


def scale_loss_metrics(metrics: dict, factor: float) -> None:
    """Multiply the :data:`LOSS_KEYS` entries of a pass's ``metrics`` by ``factor`` (its kept share, as its
    backward was), so that the reported loss is the objective's value and not a function of the micro-batching."""
    if factor != 1.0:
        for key in LOSS_KEYS:
            if key in metrics:
                metrics[key] = metrics[key] * factor


def rescale_to_kept(params, metrics: dict, agg_mode: str) -> None:
    """Divide the gradients of ``params`` and the :data:`LOSS_KEYS` of the minibatch's reduced ``metrics`` by its
    :func:`normaliser_share` when it is in (0, 1): the passes were weighed by the minibatch's count before
    rejection, the loss must be divided by the count after it (a minibatch rejected whole has no gradient: nothing
    to rescale)."""
    share = float(normaliser_share(metrics, agg_mode))
    if 0.0 < share < 1.0:
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(1.0 / share)
        scale_loss_metrics(metrics, 1.0 / share)

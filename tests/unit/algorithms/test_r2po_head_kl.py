"""R^2PO stage A's KL term: its target (the initial head-less model by default, the current base as an option), its
aggregation (seq-mean-token-mean by default, as the policy term as an option), and when the learner holds a
reference model for it. The learner-level checks are in test_learner_update.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from numeric import f32_tol, f64_tol

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.learner_kl import kl_weight_ratio
from r3_rllib.core.losses import rl_objective
from r3_rllib.core.method import KLTerm
from r3_rllib.r2po.method import needs_reference_model, stage_kl_term


def _cfg(**overrides) -> SimpleNamespace:
    fields = dict(
        rollout_head=True,
        rollout_head_kl_coef=0.04,
        rollout_head_kl_clamp=False,
        rollout_head_kl_target="initial",
        rollout_head_kl_agg_mode="seq-mean-token-mean",
        kl_coef=0.0,
        kl_type="k3",
        loss_agg_mode="token-mean",
    )
    return SimpleNamespace(**(fields | overrides))


def test_defaults_are_the_reference_codes():
    config = R3Config()
    assert config.rollout_head_kl_target == "initial"
    assert config.rollout_head_kl_agg_mode == "seq-mean-token-mean"
    assert stage_kl_term(config, "A") == KLTerm(0.04, "k3_unclamped", "seq-mean-token-mean", "reference")


def test_stage_kl_term_options():
    assert stage_kl_term(_cfg(rollout_head_kl_target="current"), "A").target == "base"
    assert stage_kl_term(_cfg(rollout_head_kl_agg_mode="loss_agg_mode"), "A").agg_mode == "token-mean"
    # Stage B and plain updates: kl_coef's term toward the reference model, aggregated as the policy term.
    for stage in ("B", None):
        assert stage_kl_term(_cfg(kl_coef=0.1), stage) == KLTerm(0.1, "k3", "token-mean", "reference")


@pytest.mark.parametrize(
    "overrides, needed",
    [
        ({}, True),  # stage A toward the initial model
        ({"rollout_head_kl_target": "current"}, False),  # the current base comes from the training forward
        ({"rollout_head_kl_coef": 0.0}, False),  # no stage-A term
        ({"rollout_head": False}, False),  # no R^2PO, no kl_coef
        ({"rollout_head": False, "kl_coef": 0.1}, True),
        ({"rollout_head_kl_target": "current", "kl_coef": 0.1}, True),  # stage B's term
    ],
)
def test_reference_model_only_when_a_term_compares_with_it(overrides, needed):
    assert needs_reference_model(_cfg(**overrides)) is needed


# Two sequences of unequal length, log-probs 0 and reference log-probs d per token (k3 = e^d - d - 1):
# row 0: one token, d = ln 3 -> k3 = 2 - ln 3; row 1: three tokens (and one pad), d = 0, ln 2, 0 -> k3 = 0,
# 1 - ln 2, 0.
_REF = torch.tensor([[math.log(3.0), 0.0, 0.0, 0.0], [0.0, math.log(2.0), 0.0, 0.0]])
_MASK = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0]])
_K3 = (2 - math.log(3.0), 1 - math.log(2.0))
#: seq-mean-token-mean: (row 0's mean + row 1's mean) / 2 = ((2 - ln 3) + (1 - ln 2) / 3) / 2 = 0.50184;
#: token-mean: ((2 - ln 3) + (1 - ln 2)) / 4 tokens = 0.30206.
SEQ_MEAN = (_K3[0] + _K3[1] / 3) / 2
TOKEN_MEAN = (_K3[0] + _K3[1]) / 4
#: float32 roundings of exp(d) (up to e^d = 3) and of the means' sums and divisions: 16 ulps of 3.
TOL = f32_tol(3.0, 16)


def _kl(rows: slice, kl_agg_mode: str | None = None) -> float:
    """The KL term rl_objective reports for `rows`, beside a token-mean policy term (advantages 0)."""
    zeros = torch.zeros_like(_REF[rows])
    _, metrics = rl_objective(
        zeros,
        zeros,
        zeros,
        torch.zeros(zeros.shape[0]),
        _MASK[rows],
        loss_params={"clip_low": 0.2, "clip_high": 0.2, "agg_mode": "token-mean"},
        ref_logprobs=_REF[rows],
        kl_coef=0.04,
        kl_type="k3_unclamped",
        agg_mode="token-mean",
        kl_agg_mode=kl_agg_mode,
    )
    return float(metrics["kl"])


def test_kl_term_aggregation_worked_by_hand():
    assert abs(SEQ_MEAN - TOKEN_MEAN) > 0.1  # the two modes are other numbers here
    both = slice(0, 2)
    assert _kl(both, "seq-mean-token-mean") == pytest.approx(SEQ_MEAN, abs=TOL)
    assert _kl(both) == pytest.approx(TOKEN_MEAN, abs=TOL)  # kl_agg_mode None: the policy term's mode


def test_micro_batches_weigh_the_kl_term_by_its_own_count():
    # The two rows in two micro-batches. Token-mean policy term: the learner weighs them 1/4 and 3/4 (their tokens
    # over the minibatch's 4); the seq-mean KL term needs 1/2 each: ratios (1/2) / (1/4) = 2 and (1/2) / (3/4) = 2/3.
    assert kl_weight_ratio((1, 1), (4, 2)) == 2.0
    assert kl_weight_ratio((3, 1), (4, 2)) == pytest.approx(2 / 3, abs=f64_tol(1.0, 4))  # float64 division
    total = 0.0
    for rows, tokens in ((slice(0, 1), 1), (slice(1, 2), 3)):
        kl = _kl(rows, "seq-mean-token-mean")
        total += (tokens / 4) * kl_weight_ratio((tokens, 1), (4, 2)) * kl
    assert total == pytest.approx(SEQ_MEAN, abs=TOL)
    # Same modes: weight 1; a pass with no policy count (no trained token) too.
    assert kl_weight_ratio((3, 3), (4, 4)) == 1.0 and kl_weight_ratio((0, 1), (4, 2)) == 1.0


def test_config_fields_and_the_rejection_rule():
    base = R3Config.grpo_preset().training(rollout_head=True)
    for name, value in (("rollout_head_kl_target", "base"), ("rollout_head_kl_agg_mode", "token-mean")):
        with pytest.raises(ValueError, match=f"{name} must be one of"):
            base.copy(copy_frozen=False).training(**{name: value}).validate()
    rejecting = base.copy(copy_frozen=False).training(rollout_rs="token")
    with pytest.raises(ValueError, match="rollout_head_kl_agg_mode 'seq-mean-token-mean' with loss_agg_mode"):
        rejecting.validate()
    rejecting.copy(copy_frozen=False).training(rollout_head_kl_agg_mode="loss_agg_mode").validate()
    rejecting.copy(copy_frozen=False).training(loss_agg_mode="seq-mean-token-mean").validate()
    rejecting.copy(copy_frozen=False).training(rollout_head_kl_coef=0.0).validate()

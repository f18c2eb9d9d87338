"""verl's KL penalty in the reward (core/kl_reward.py): the summed token KL, the penalised rewards, current_kl and
the controllers' beta, checked on hand-computed numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from r3_rllib.core.kl_reward import (
    VERL_KL_PENALTY,
    mean_token_kl,
    next_kl_coef,
    penalised_rewards,
    sequence_kl,
)
from r3_rllib.core.losses import KL_KINDS

# Two rows of three positions; the third of each is masked out (its values, 9.0 included, must not count).
LOGP = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 9.0]])
REF = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -0.2, 0.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 0]])


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        # logp - ref: row 0 has 0.5 and -1.0, row 1 -0.2 and -0.5.
        ("k1", [-0.5, -0.7]),
        # 0.5 (logp - ref)^2: 0.5 (0.25 + 1.0), 0.5 (0.04 + 0.25).
        ("k2", [0.625, 0.145]),
        ("abs", [1.5, 0.7]),
        # exp(d) - d - 1 with d = ref - logp: row 0 d = -0.5, 1.0; row 1 d = 0.2, 0.5.
        ("k3", [math.exp(-0.5) - 0.5 + math.exp(1.0) - 2.0, math.exp(0.2) - 1.2 + math.exp(0.5) - 1.5]),
    ],
)
def test_sequence_kl_sums_the_masked_tokens(kind, expected):
    got = sequence_kl(LOGP, REF, MASK, kind)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)


def test_verl_names_map_to_our_estimators():
    assert VERL_KL_PENALTY == {"kl": "k1", "abs": "abs", "mse": "k2", "low_var_kl": "k3"}
    assert set(VERL_KL_PENALTY.values()) <= set(KL_KINDS)


def test_penalised_rewards_subtract_beta_times_the_sum():
    np.testing.assert_allclose(penalised_rewards([1.0, 0.0, 1.0], [2.0, -0.5, 10.0], 0.1), [0.8, 0.05, 0.0])
    with pytest.raises(ValueError, match="kl_sums"):
        penalised_rewards([1.0], [1.0, 2.0], 0.1)


def test_current_kl_is_the_token_mean_averaged_over_rows():
    # Token means 0.6 / 3 = 0.2, 1.0 / 2 = 0.5 and 0 for a row without a token: (0.2 + 0.5 + 0) / 3.
    assert mean_token_kl([0.6, 1.0, 0.0], [3, 2, 0]) == pytest.approx(0.7 / 3)
    assert math.isnan(mean_token_kl([], []))


def test_adaptive_controller_moves_beta_by_the_clipped_error():
    kw = dict(kind="adaptive", target_kl=0.1, horizon=10000)
    # current 0.15: error 0.5, clipped to 0.2; 100 rows of a 10000 horizon: x (1 + 0.2 x 0.01).
    assert next_kl_coef(0.001, 0.15, 100, **kw) == pytest.approx(0.001 * 1.002)
    # current 0.09: error -0.1 (inside the clip): x (1 - 0.1 x 0.01).
    assert next_kl_coef(0.001, 0.09, 100, **kw) == pytest.approx(0.001 * 0.999)
    # current 0: error -1, clipped to -0.2.
    assert next_kl_coef(0.001, 0.0, 100, **kw) == pytest.approx(0.001 * 0.998)
    # At the target beta stays.
    assert next_kl_coef(0.001, 0.1, 100, **kw) == pytest.approx(0.001)


def test_fixed_controller_keeps_beta():
    assert next_kl_coef(0.001, 5.0, 100, kind="fixed", target_kl=0.1, horizon=10000) == 0.001
    with pytest.raises(ValueError, match="unknown KL controller"):
        next_kl_coef(0.001, 5.0, 100, kind="pid", target_kl=0.1, horizon=10000)

"""R^2PO's rarity reward and stage-B skip rule: pure functions on the rewards of ONE group (no torch, no Ray).

R^2PO trains its rollout head (stage A) to make *uncommon outcomes* of a group more likely: a sample whose outcome
is shared by few of the group's samples is rewarded, one whose outcome is shared by many is penalised. For a group
with outcomes ``o_1..o_G``:

- ``n_i`` = number of samples ``j`` of the group with ``o_j == o_i`` (the frequency of i's outcome);
- ``rarity_i = 1 / n_i``;
- the rarity reward is ``rarity_i`` z-scored within the group: ``(rarity_i - mean) / (std + eps)``.

What counts as the outcome (``count``):

- ``"outcome"`` (default): the discrete outcome the env grades, each sample's ``correct`` flag (every env's
  ``step`` info carries it), passed as ``outcomes``. The reference code counts reward values on a binary
  correctness reward, where the two are the same; with a shaped reward they are not: the math env's length bonus
  gives every correct answer its own value (1 + bonus), so with 6 correct and 2 wrong answers value counting gives
  the correct ones ``+1/sqrt(3)`` (each "rare") and the wrong ones ``-sqrt(3)``: the sign flips, and the head is
  pushed toward the common outcome. Counting outcomes gives the correct ones ``-1/sqrt(3)`` and the wrong ones
  ``+sqrt(3)``.
- ``"reward"``: the task reward values themselves (the reference code's rule, with ``decimals`` below): for envs
  whose reward takes a few discrete values that mean more than right/wrong (e.g. a format tier).

It is already centred and scaled per group, so it is used directly as the stage-A advantage; it is registered as the
advantage estimator ``"rarity"`` (see :mod:`r3_rllib.core.advantages`). It is meant for the rollout head: applied to
the base policy it would reward wrong answers in a mostly-right group.

Choices made here (the reference implementation's values are one argument away):

- Degenerate group: when every sample's value has the same frequency (all rewards equal, all distinct, or equal-size
  buckets such as four 0s and four 1s) every ``rarity_i`` is equal and the result is all zeros, exactly. The test is
  on the integer counts, so it does not depend on floating-point rounding of the mean.
- ``std`` is the population std (``ddof=0``), as everywhere in :mod:`r3_rllib.core.advantages`; the reference code
  uses the sample std (``ddof=1``), available through ``ddof``.
- ``eps`` (default ``1e-6``, the reference's value) only guards the division: a non-degenerate group has a positive
  std (two distinct frequencies, hence two distinct rarities), so eps changes the result by a relative ``eps / std``:
  at most 6e-5 for groups of up to 16 samples, 4e-4 at 40 (the smallest std comes from near-equal buckets).
- With ``count="reward"``, reward values are compared exactly. Rewards computed by arithmetic (e.g. a correctness reward plus a format bonus)
  can differ in the last bit for what is meant to be the same value: ``decimals`` rounds them before counting.
  Continuous rewards (R^3's ranking bonus on failures) make every value distinct and so give zeros.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from r3_rllib.core.advantages import _as_group, register_advantage

#: Stage B skips groups whose task-reward range (max - min) is below this (the reference code's value).
DEFAULT_SKIP_RANGE = 0.01

#: What the rarity reward counts (module docstring); the first is the default.
RARITY_COUNTS: tuple[str, ...] = ("outcome", "reward")


def reward_frequencies(rewards: Sequence[float] | np.ndarray, *, decimals: int | None = None) -> np.ndarray:
    """``n_i``: how many samples of the group share sample i's reward value (int64, >= 1).

    ``decimals``: round the rewards to this many decimals before comparing (None: exact comparison).
    """
    r = _as_group(rewards)
    if decimals is not None:
        if not isinstance(decimals, int) or isinstance(decimals, bool):
            raise ValueError(f"decimals must be an int or None, got {decimals!r}")
        r = np.round(r, decimals)
    # return_inverse maps every sample to its value's bucket; counts[inverse] is the size of that bucket.
    _, inverse, counts = np.unique(r, return_inverse=True, return_counts=True)
    return counts[inverse].astype(np.int64)


def outcome_frequencies(outcomes: Sequence[bool] | np.ndarray) -> np.ndarray:
    """``n_i``: how many samples of the group share sample i's discrete outcome (int64, >= 1)."""
    o = np.asarray(outcomes)
    if o.ndim != 1 or o.size == 0:
        raise ValueError(f"outcomes must be a non-empty 1-D sequence, got shape {o.shape}")
    _, inverse, counts = np.unique(o, return_inverse=True, return_counts=True)
    return counts[inverse].astype(np.int64)


@register_advantage(
    "rarity", config_params={"count": "rollout_head_rarity_count"}, sample_inputs=("outcomes",)
)
def rarity_rewards(
    rewards: Sequence[float] | np.ndarray,
    *,
    outcomes: Sequence[bool] | np.ndarray | None = None,
    count: str = "outcome",
    eps: float = 1e-6,
    ddof: int = 0,
    decimals: int | None = None,
) -> np.ndarray:
    """Rarity reward of each sample of one group: ``1 / n_i`` z-scored within the group (float64).

    ``n_i`` is the number of samples whose outcome equals sample i's: with ``count="outcome"`` (default) the
    ``outcomes`` given (one per sample, e.g. the ``correct`` flags; required), with ``count="reward"`` the reward
    values (:func:`reward_frequencies`; ``outcomes`` unused). Returns all zeros when every ``n_i`` is equal (no
    outcome is rarer than another), including a group of one. See the module docstring for ``eps`` and ``ddof``.
    """
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {ddof}")
    if count == "outcome":
        if outcomes is None:
            raise ValueError(
                "rarity with count='outcome' needs each sample's discrete outcome (outcomes=, e.g. the samples' "
                "correct flags); pass them, or count='reward' to count exact reward values"
            )
        n = _as_group(rewards).size
        if len(outcomes) != n:
            raise ValueError(f"outcomes has {len(outcomes)} entries but there are {n} rewards")
        counts = outcome_frequencies(outcomes)
    elif count == "reward":
        counts = reward_frequencies(rewards, decimals=decimals)
    else:
        raise ValueError(f"rarity count must be one of {list(RARITY_COUNTS)}, got {count!r}")
    if counts.min() == counts.max():
        return np.zeros(counts.size, dtype=np.float64)
    rarity = 1.0 / counts
    # Non-degenerate implies at least two distinct counts, hence G >= 3 and a positive std for either ddof.
    return (rarity - rarity.mean()) / (rarity.std(ddof=ddof) + eps)


def skip_flat_group(rewards: Sequence[float] | np.ndarray, *, min_range: float = DEFAULT_SKIP_RANGE) -> bool:
    """Stage B's skip rule: True when the group's task rewards span less than ``min_range`` (``max - min``).

    Such a group has (almost) no task signal for the base policy; the reference code drops it from the batch rather
    than train on advantages that are noise amplified by a tiny std. ``min_range=0`` never skips.
    """
    if not (np.isfinite(min_range) and min_range >= 0):
        raise ValueError(f"min_range must be finite and >= 0, got {min_range}")
    r = _as_group(rewards)
    return bool(r.max() - r.min() < min_range)

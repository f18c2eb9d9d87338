"""Structural-entropy ranking of responses (R^3): reward reasoning that is decisive at a few key steps and calm
elsewhere.

For a response with per-token entropies ``H_1..H_L``:

- ``E_peak`` = mean of its top ``k = max(1, floor(p * L))`` entropies (how much it explores at branching points);
- ``E_global`` = mean of all its entropies (how uncertain it is overall).

Response i *dominates* j (``i > j``) iff ``E_peak(i) > E_peak(j)`` and ``E_global(i) < E_global(j)``, both strict.
This is a partial order: most pairs are incomparable. ``S_i`` counts the responses i dominates; responses are sorted
by ``S_i`` (descending) and the response at rank ``k`` of ``N`` gets ``r_max * (1 - k / (N - 1))``; responses with
equal ``S_i`` share the mean reward of the ranks they occupy, so the order among them (arbitrary) does not matter.

Invariant used below: for every ``N >= 2`` the rewards sum to ``N * r_max / 2`` (the rank rewards are symmetric
around ``r_max / 2`` and sharing within ties keeps the sum), so the *mean* bonus never depends on N or on the order.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from r3_rllib.core.advantages import compute_group_advantages

# floor(p * L) with p = 0.29, L = 100 evaluates 28.999999999999996 in floating point: nudge before flooring.
_FLOOR_EPS = 1e-9


def _as_entropies(entropies: Sequence[float] | np.ndarray, where: str = "entropies") -> np.ndarray:
    h = np.asarray(entropies, dtype=np.float64)
    if h.ndim != 1:
        raise ValueError(f"{where} must be 1-D (one value per token), got shape {h.shape}")
    bad = np.flatnonzero(~np.isfinite(h))
    if bad.size:
        raise ValueError(f"{where}: token {int(bad[0])} has non-finite entropy {h[bad[0]]}")
    return h


def _check_p(p: float) -> None:
    if not (isinstance(p, numbers.Real) and 0.0 <= p <= 1.0):
        raise ValueError(f"p must be in [0, 1], got {p!r}")


def entropy_structure(entropies: Sequence[float] | np.ndarray, p: float) -> tuple[float, float]:
    """``(E_peak, E_global)`` of one response.

    An empty response (no tokens) has ``E_peak = E_global = 0``: it cannot dominate anything (no peak above 0 since
    entropies are >= 0) and is dominated only by responses whose peak is positive and whose mean is below 0, which
    cannot happen, so it ends up incomparable and shares the tie reward.
    """
    _check_p(p)
    h = _as_entropies(entropies)
    n = h.size
    if n == 0:
        return 0.0, 0.0
    k = max(1, math.floor(p * n + _FLOOR_EPS))
    top = np.partition(h, n - k)[n - k :]
    return float(top.mean()), float(h.mean())


def dominance_counts(
    peaks: Sequence[float] | np.ndarray, globals_: Sequence[float] | np.ndarray
) -> np.ndarray:
    """``S_i = #{j : peak_i > peak_j and global_i < global_j}`` for every response (int64 array)."""
    pk = np.asarray(peaks, dtype=np.float64)
    gl = np.asarray(globals_, dtype=np.float64)
    if pk.ndim != 1 or pk.shape != gl.shape:
        raise ValueError(f"peaks and globals must be 1-D of equal length, got {pk.shape} and {gl.shape}")
    dom = (pk[:, None] > pk[None, :]) & (gl[:, None] < gl[None, :])
    return dom.sum(axis=1).astype(np.int64)


def rank_rewards(scores: Sequence[float] | np.ndarray, r_max: float) -> np.ndarray:
    """Linear rank rewards by descending score, ties sharing the mean of their ranks' rewards.

    Rank ``k`` (0-based) of ``N`` gets ``r_max * (1 - k / (N - 1))``; a lone item gets ``r_max / 2`` (see
    :func:`structural_entropy_rewards`).
    """
    s = np.asarray(scores, dtype=np.float64)
    n = s.size
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    if n == 1:
        return np.array([r_max / 2.0])
    out = np.empty(n, dtype=np.float64)
    order = np.argsort(-s, kind="stable")
    sorted_s = s[order]
    start = 0
    while start < n:
        end = start + 1
        while end < n and sorted_s[end] == sorted_s[start]:
            end += 1
        # Ranks start..end-1 share the mean of their rewards = reward at their mean rank (linear in k).
        mean_rank = (start + end - 1) / 2.0
        out[order[start:end]] = r_max * (1.0 - mean_rank / (n - 1))
        start = end
    return out


def structural_entropy_rewards(
    entropies: Sequence[Sequence[float] | np.ndarray], *, p: float, r_max: float
) -> np.ndarray:
    """Rank-based structural-entropy reward of each response of one set (e.g. the correct responses of a group).

    ``entropies[i]`` holds response i's per-token entropies (lengths may differ). Returns ``N`` rewards in
    ``[0, r_max]``, float64.

    Edge cases (decisions):

    - ``N == 0``: empty array.
    - ``N == 1``: ``[r_max / 2]``. A lone response cannot be ranked; ``r_max / 2`` is what it would get if tied with
      any number of others, and it is exactly the mean bonus of every ``N >= 2`` set (see module docstring), so a
      set of one is neither favoured nor penalised relative to larger sets: adding the bonus to a group's rewards
      shifts group means the same way whatever the number of ranked responses. (0 would penalise queries with a
      single correct response relative to the others; ``r_max`` would favour them.)
    - empty response: ``E_peak = E_global = 0`` (see :func:`entropy_structure`).
    """
    _check_p(p)
    if not (isinstance(r_max, numbers.Real) and math.isfinite(r_max) and r_max >= 0):
        raise ValueError(f"r_max must be finite and >= 0, got {r_max!r}")
    n = len(entropies)
    peaks = np.empty(n, dtype=np.float64)
    globs = np.empty(n, dtype=np.float64)
    for i, h in enumerate(entropies):
        try:
            peaks[i], globs[i] = entropy_structure(h, p)
        except ValueError as e:
            raise ValueError(f"response {i}: {e}") from None
    return rank_rewards(dominance_counts(peaks, globs), float(r_max))


def ranked_group_scores(
    entropies: Sequence[Sequence[float] | np.ndarray],
    fresh_penalties: np.ndarray,
    replay_rewards: np.ndarray,
    *,
    p: float,
    r_max: float,
    estimator: str,
    params: dict[str, float],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One ranked group's (ranking rewards of its fresh samples, rewards of all its members, advantages).

    Members are the fresh samples (per-token ``entropies``) then the replayed ones. A fresh sample's reward is its
    ranking reward plus its ``fresh_penalties`` entry (DAPO's overlong penalty, 0 without one); a replayed one's is
    given whole in ``replay_rewards`` (shaped already). The advantages are estimator ``estimator``'s per-group pass
    (one without a batch step or per-sample inputs). The driver's batch builder and the learner (deferred ranking)
    both call this, so the two paths give the same advantages for the same entropies."""
    ranking = structural_entropy_rewards(entropies, p=p, r_max=r_max)
    rewards = np.concatenate(
        [ranking + np.asarray(fresh_penalties, np.float64), np.asarray(replay_rewards, np.float64)]
    )
    return ranking, rewards, compute_group_advantages(estimator, rewards, **params)

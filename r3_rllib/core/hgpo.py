"""HGPO: step advantages from a hierarchy of groups (Hierarchy-of-Groups Policy Optimization, arXiv 2602.22817).

In a multi-step task every step of a trajectory is a training sample whose prompt holds the task and a memory window
of the last observations and actions. Step-level group methods (GiGPO) compare the steps of one query's G
trajectories that stand at the same observation; but two steps at the same observation may have been reached by
different histories, so their prompts (and the policy's situation) differ: *context inconsistency*. HGPO puts each
step into several nested groups, one per history depth, computes a relative advantage inside each and takes a
weighted mean that favours the deeper (more consistent, smaller) groups.

Levels, for ONE query's group of step samples:

- ``k = 1 .. H+1`` (``H = history_length``): the steps whose last ``k`` observation keys (the current one and the
  ``k - 1`` before it, within their own trajectory) are identical. ``k = 1`` is GiGPO's anchor-state group. A step
  at index ``t`` has only ``t + 1`` observations behind it and joins the levels ``k <= t + 1``.
- ``k = 0`` (``base_group=True``): the episode-level GRPO group, every step of a trajectory taking its
  trajectory's advantage. ``base_stats`` says how its statistics are taken:

  - ``"step_rows"`` (default; verl-agent's HGPO and GiGPO recipes, ``compute_mean_std_cross_all_data=True``): the
    value is the undiscounted episode reward (the sum of the trajectory's step rewards, so it needs
    ``step_rewards``), and mean and std run over all step rows of the query: a trajectory of T steps counts T
    times, and the std is the sample std (``ddof=1``, ``torch.std``'s default).
  - ``"trajectories"``: one value per trajectory, the return of its first step (the discounted episode return),
    mean and population std over the G trajectories, so long episodes do not weigh more than short ones (the
    per-trajectory GRPO statistics of the other estimators of this package).

Inside a step group the returns are normalised (``"mean_std_norm"``: ``(R - mean) / (std + eps)`` with the
population std, as verl-agent's HGPO; ``"mean_norm"``: ``R - mean``). A group of one is skipped (it has no peer to
compare with; the exception is the episode group of a query with a single step row, which gets verl-agent's
mean 0 and std 1: ``reward / (1 + eps)``), and so is a zero advantage (the step's return equals its group's mean: that group has nothing to say
about it). The levels are then combined (``combine``):

- ``"weighted_mean"`` (HGPO): ``sum_k w_k A_k / sum_k w_k`` over the levels that contributed, with
  ``w_k = (k + 1) ** alpha``; a step with no contributing level gets 0. This is the reference's weight: its
  aggregator takes ``L = k + 1`` for a window of ``k`` observations and weighs by ``L ** alpha``, the base group
  (``k = 0``) getting weight 1. (It divides by ``sum w + eps``; here the division is exact.)
- ``"sum"`` (GiGPO): ``A_0 + A_1``, the episode and the step advantage added with weight 1 each (GiGPO's
  ``A = A_episode + w * A_step`` at its default ``step_advantage_w = 1``), a missing level counting 0.

Named settings (:data:`HGPO_SETTINGS`): ``"episode_grpo"`` is the base group alone (every step of a trajectory gets
the episode's GRPO advantage); ``"gigpo"`` is GiGPO: ``k = 1`` plus the base group, added (``combine="sum"``), with
the sample std (``step_std_ddof=1``) in the step group as GiGPO's ``step_norm_reward``; ``"hgpo"`` is the full
hierarchy.

:func:`hgpo_group_advantages` has the call shape of :data:`r3_rllib.core.advantages.ADVANTAGE_FNS` entries
(``fn(rewards, **params, **sample_inputs)``, the per-sample inputs named by :data:`HGPO_SAMPLE_INPUTS`);
:func:`hgpo_estimator` is that function registered as ``advantage_estimator: hgpo``, with the named setting and its
overrides read from the config's ``hgpo_*`` fields and ``gamma`` from ``step_gamma``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from r3_rllib.core.advantages import register_advantage

HGPOMode = Literal["mean_std_norm", "mean_norm"]
HGPO_MODES: tuple[str, ...] = ("mean_std_norm", "mean_norm")
HGPOBaseStats = Literal["step_rows", "trajectories"]
#: How the episode-level group (``k = 0``) takes its statistics (module docstring); the first is the default.
HGPO_BASE_STATS: tuple[str, ...] = ("step_rows", "trajectories")
HGPOCombine = Literal["weighted_mean", "sum"]
#: How a step's level advantages are combined (module docstring).
HGPO_COMBINES: tuple[str, ...] = ("weighted_mean", "sum")

#: Named settings of :func:`hgpo_advantages` (structural switches; ``mode``, ``alpha``, ``eps``, ``gamma``,
#: ``base_stats`` stay the caller's). ``hgpo_settings(name, **overrides)`` merges and checks them.
HGPO_SETTINGS: dict[str, dict[str, Any]] = {
    "episode_grpo": {"step_groups": False, "base_group": True},
    "gigpo": {
        "step_groups": True,
        "history_length": 0,
        "base_group": True,
        "combine": "sum",
        "step_std_ddof": 1,
    },
    "hgpo": {"step_groups": True, "history_length": 2, "base_group": False},
}

_SETTING_KEYS = (
    "history_length",
    "alpha",
    "mode",
    "base_group",
    "base_stats",
    "step_groups",
    "combine",
    "step_std_ddof",
    "gamma",
    "eps",
)


def hgpo_settings(name: str, **overrides: Any) -> dict[str, Any]:
    """The keyword arguments of the named setting, with ``overrides`` applied (unknown keys are errors)."""
    try:
        base = HGPO_SETTINGS[name]
    except KeyError:
        raise KeyError(f"unknown HGPO setting {name!r}; known: {sorted(HGPO_SETTINGS)}") from None
    unknown = sorted(set(overrides) - set(_SETTING_KEYS))
    if unknown:
        raise ValueError(f"unknown HGPO option(s) {unknown}; supported: {list(_SETTING_KEYS)}")
    return {**base, **overrides}


@dataclass(frozen=True)
class HGPOLevels:
    """Per-step, per-level view of the hierarchy (for tests and metrics).

    ``levels[j]`` is the level of column ``j`` (0 is the base group when it is on). ``advantages[i, j]`` is step
    ``i``'s normalised return inside its level-``levels[j]`` group, NaN where the step has no such group or the
    group has one member; ``sizes[i, j]`` is that group's size (0 where the step has none).
    """

    levels: tuple[int, ...]
    advantages: np.ndarray
    sizes: np.ndarray


def _trajectory_positions(
    traj_ids: Sequence[Hashable], step_indices: Sequence[int]
) -> dict[Hashable, list[int]]:
    """Trajectory id -> positions of its steps ordered by step index; checks indices are exactly 0 .. T-1.

    Returns and history windows both walk a trajectory in step order, so a missing or repeated step would silently
    shift them: refuse it instead.
    """
    n = len(traj_ids)
    if len(step_indices) != n:
        raise ValueError(f"step_indices has {len(step_indices)} entries but traj_ids has {n}")
    by_traj: dict[Hashable, list[tuple[int, int]]] = {}
    for pos, (tid, t) in enumerate(zip(traj_ids, step_indices, strict=True)):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
            raise ValueError(f"step index at position {pos} must be an int >= 0, got {t!r}")
        try:
            by_traj.setdefault(tid, []).append((int(t), pos))
        except TypeError:
            raise TypeError(f"trajectory id at position {pos} is not hashable: {tid!r}") from None
    out: dict[Hashable, list[int]] = {}
    for tid, steps in by_traj.items():
        steps.sort()
        got = [t for t, _ in steps]
        if got != list(range(len(steps))):
            raise ValueError(
                f"trajectory {tid!r} must have step indices 0..{len(steps) - 1} once each, got {got}"
            )
        out[tid] = [pos for _, pos in steps]
    return out


def _finite_1d(values: Sequence[float] | np.ndarray, name: str, n: int) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {v.shape}")
    if v.size != n:
        raise ValueError(f"{name} has {v.size} entries but there are {n} steps")
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:
        raise ValueError(f"{name} must be finite; index {int(bad[0])} is {v[bad[0]]}")
    return v


def _check_gamma(gamma: float) -> None:
    if not (np.isfinite(gamma) and 0.0 <= gamma <= 1.0):
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")


def discounted_returns(
    step_rewards: Sequence[float] | np.ndarray,
    traj_ids: Sequence[Hashable],
    step_indices: Sequence[int],
    gamma: float = 1.0,
) -> np.ndarray:
    """``G_t = r_t + gamma * G_{t+1}`` within each trajectory, in the input order.

    Steps of a trajectory may come in any order; their ``step_indices`` must be 0 .. T-1 once each. The last step of
    a trajectory has ``G = r`` (nothing follows a terminated or truncated episode in the data).
    """
    _check_gamma(gamma)
    r = _finite_1d(step_rewards, "step_rewards", len(traj_ids))
    out = np.empty_like(r)
    for positions in _trajectory_positions(traj_ids, step_indices).values():
        running = 0.0
        for pos in reversed(positions):
            running = r[pos] + gamma * running
            out[pos] = running
    return out


def _normalise(values: np.ndarray, mode: str, eps: float, ddof: int = 0) -> np.ndarray:
    """Relative advantage inside one group of two or more (std with ``ddof``: 0 population, 1 sample)."""
    if values.max() == values.min():
        # Exactly zero: np.mean of equal floats can be off by an ulp, and a 1e-16 residue divided by (0 + eps)
        # would count as a "non-zero" advantage in the weighted mean.
        return np.zeros_like(values)
    centered = values - values.mean()
    if mode == "mean_norm":
        return centered
    return centered / (values.std(ddof=ddof) + eps)


def _check_structure(base_stats: str, combine: str, step_std_ddof: int) -> None:
    if base_stats not in HGPO_BASE_STATS:
        raise ValueError(f"unknown HGPO base_stats {base_stats!r}; known: {list(HGPO_BASE_STATS)}")
    if combine not in HGPO_COMBINES:
        raise ValueError(f"unknown HGPO combine {combine!r}; known: {list(HGPO_COMBINES)}")
    if step_std_ddof not in (0, 1) or isinstance(step_std_ddof, bool):
        raise ValueError(f"step_std_ddof must be 0 or 1, got {step_std_ddof!r}")


def _check_options(history_length: int, alpha: float, mode: str, eps: float) -> None:
    if (
        isinstance(history_length, bool)
        or not isinstance(history_length, (int, np.integer))
        or history_length < 0
    ):
        raise ValueError(f"history_length must be an int >= 0, got {history_length!r}")
    if not (np.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
    if mode not in HGPO_MODES:
        raise ValueError(f"unknown HGPO mode {mode!r}; known: {list(HGPO_MODES)}")
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")


def _step_returns(
    n: int,
    traj_ids: Sequence[Hashable],
    step_indices: Sequence[int],
    step_returns: Sequence[float] | np.ndarray | None,
    step_rewards: Sequence[float] | np.ndarray | None,
    gamma: float,
) -> np.ndarray:
    if (step_returns is None) == (step_rewards is None):
        raise ValueError("give exactly one of step_returns and step_rewards (with gamma)")
    if step_rewards is not None:
        return discounted_returns(step_rewards, traj_ids, step_indices, gamma)
    return _finite_1d(step_returns, "step_returns", n)  # type: ignore[arg-type]


def _check_level_inputs(
    n: int,
    traj_ids: Sequence[Hashable],
    history_length: int,
    mode: HGPOMode,
    eps: float,
    base_group: bool,
    base_stats: HGPOBaseStats,
    step_groups: bool,
    step_std_ddof: int,
) -> None:
    """Refuse an empty query, mismatched lengths, bad options and a hierarchy with no group at all."""
    if n == 0:
        raise ValueError("HGPO needs at least one step")
    if len(traj_ids) != n:
        raise ValueError(f"traj_ids has {len(traj_ids)} entries but obs_keys has {n}")
    _check_options(history_length, 1.0, mode, eps)
    _check_structure(base_stats, "weighted_mean", step_std_ddof)
    if not (base_group or step_groups):
        raise ValueError("base_group and step_groups are both off: no group would give any advantage")


def _check_hashable_keys(obs_keys: Sequence[Hashable]) -> None:
    for pos, key in enumerate(obs_keys):
        try:
            hash(key)
        except TypeError:
            raise TypeError(
                f"obs key at position {pos} is not hashable ({type(key).__name__}); use str or tuple keys"
            ) from None


def _base_group_step_rows(
    rewards: np.ndarray,
    positions: dict[Hashable, list[int]],
    mode: HGPOMode,
    eps: float,
    adv: np.ndarray,
    sizes: np.ndarray,
) -> None:
    """Level 0 with verl-agent's statistics, written into the columns ``adv`` and ``sizes``: every step row carries
    its episode's undiscounted reward and counts once (sample std). A query with a single step row follows
    verl-agent's (and verl's GRPO) convention for a group of one, mean 0 and std 1: its advantage is
    ``reward / (1 + eps)`` (``reward`` with ``"mean_norm"``), not 0 (the sample std of one value is undefined)."""
    n = len(rewards)
    rows = np.empty(n)
    for steps in positions.values():
        rows[steps] = rewards[steps].sum()
    sizes[:] = n
    if n >= 2:
        adv[:] = _normalise(rows, mode, eps, ddof=1)
    else:
        adv[:] = rows if mode == "mean_norm" else rows / (1.0 + eps)


def _base_group_trajectories(
    returns: np.ndarray,
    positions: dict[Hashable, list[int]],
    mode: HGPOMode,
    eps: float,
    adv: np.ndarray,
    sizes: np.ndarray,
) -> None:
    """Level 0 over trajectories, written into ``adv`` and ``sizes``: one value per trajectory, the return of its
    first step (the discounted episode return; the plain sum of rewards when gamma = 1)."""
    tids = list(positions)
    if len(tids) < 2:
        sizes[:] = 1
        return
    episode = np.array([returns[positions[t][0]] for t in tids])
    for tid, a in zip(tids, _normalise(episode, mode, eps), strict=True):
        adv[positions[tid]] = a
        sizes[positions[tid]] = len(tids)


def _step_level(
    k: int,
    obs_keys: Sequence[Hashable],
    returns: np.ndarray,
    positions: dict[Hashable, list[int]],
    mode: HGPOMode,
    eps: float,
    ddof: int,
    adv: np.ndarray,
    sizes: np.ndarray,
) -> None:
    """Step level ``k >= 1``, written into ``adv`` and ``sizes``: steps grouped by their last ``k`` observations
    (the current one and ``k - 1`` before it in their own trajectory); a group of one gets no advantage."""
    members: dict[tuple[Hashable, ...], list[int]] = {}
    for steps in positions.values():
        for t in range(k - 1, len(steps)):
            window = tuple(obs_keys[steps[s]] for s in range(t - k + 1, t + 1))
            members.setdefault(window, []).append(steps[t])
    for idx in members.values():
        sizes[idx] = len(idx)
        if len(idx) >= 2:
            adv[idx] = _normalise(returns[idx], mode, eps, ddof=ddof)


def hgpo_levels(
    *,
    obs_keys: Sequence[Hashable],
    traj_ids: Sequence[Hashable],
    step_indices: Sequence[int],
    step_returns: Sequence[float] | np.ndarray | None = None,
    step_rewards: Sequence[float] | np.ndarray | None = None,
    gamma: float = 1.0,
    history_length: int = 2,
    mode: HGPOMode = "mean_std_norm",
    base_group: bool = False,
    base_stats: HGPOBaseStats = "step_rows",
    step_groups: bool = True,
    step_std_ddof: int = 0,
    eps: float = 1e-6,
) -> HGPOLevels:
    """Every step's normalised return in each of its groups (see the module docstring); arguments as
    :func:`hgpo_advantages`, which aggregates this."""
    n = len(obs_keys)
    _check_level_inputs(
        n, traj_ids, history_length, mode, eps, base_group, base_stats, step_groups, step_std_ddof
    )
    if base_group and base_stats == "step_rows" and step_rewards is None:
        raise ValueError(
            "base_stats='step_rows' needs step_rewards (its value is the undiscounted episode reward, their sum); "
            "with precomputed step_returns use base_stats='trajectories'"
        )
    positions = _trajectory_positions(traj_ids, step_indices)
    returns = _step_returns(n, traj_ids, step_indices, step_returns, step_rewards, gamma)
    _check_hashable_keys(obs_keys)

    levels = ([0] if base_group else []) + (list(range(1, history_length + 2)) if step_groups else [])
    adv = np.full((n, len(levels)), np.nan)
    sizes = np.zeros((n, len(levels)), dtype=np.int64)
    for j, k in enumerate(levels):
        if k == 0 and base_stats == "step_rows":
            rewards = _finite_1d(step_rewards, "step_rewards", n)  # type: ignore[arg-type]
            _base_group_step_rows(rewards, positions, mode, eps, adv[:, j], sizes[:, j])
        elif k == 0:
            _base_group_trajectories(returns, positions, mode, eps, adv[:, j], sizes[:, j])
        else:
            _step_level(k, obs_keys, returns, positions, mode, eps, step_std_ddof, adv[:, j], sizes[:, j])
    return HGPOLevels(levels=tuple(levels), advantages=adv, sizes=sizes)


def hgpo_advantages(
    *,
    obs_keys: Sequence[Hashable],
    traj_ids: Sequence[Hashable],
    step_indices: Sequence[int],
    step_returns: Sequence[float] | np.ndarray | None = None,
    step_rewards: Sequence[float] | np.ndarray | None = None,
    gamma: float = 1.0,
    history_length: int = 2,
    alpha: float = 1.0,
    mode: HGPOMode = "mean_std_norm",
    base_group: bool = False,
    base_stats: HGPOBaseStats = "step_rows",
    step_groups: bool = True,
    combine: HGPOCombine = "weighted_mean",
    step_std_ddof: int = 0,
    eps: float = 1e-6,
) -> np.ndarray:
    """HGPO advantages of ONE query's step samples (all G trajectories of that query), one per step, input order.

    Args:
        obs_keys: per step, the hashable observation the step acted on (the env's ``info["obs_key"]``); history
            windows are built from a trajectory's own keys in step order.
        traj_ids: per step, its trajectory (any hashable); step_indices: per step, 0 .. T-1 within its trajectory.
        step_returns: per step, the (discounted) return from that step on; or
        step_rewards: per step, its reward, turned into returns with ``gamma`` (:func:`discounted_returns`).
        gamma: discount in [0, 1]; used only with ``step_rewards``.
        history_length: H; step levels ``k = 1 .. H + 1`` (0: only the current observation, as GiGPO).
        alpha: level weight exponent, ``w_k = (k + 1) ** alpha`` (0: plain mean over contributing levels).
        mode: ``"mean_std_norm"`` or ``"mean_norm"`` (normalisation inside every group, the base group included).
        base_group: add the episode-level GRPO group as ``k = 0``.
        base_stats: that group's statistics: ``"step_rows"`` (verl-agent's: undiscounted episode reward, mean and
            sample std over all step rows; needs ``step_rewards``) or ``"trajectories"`` (first-step return, mean
            and population std over trajectories).
        step_groups: use the step levels ``k >= 1`` (off with ``base_group`` on: episode-level GRPO).
        combine: ``"weighted_mean"`` (HGPO, weights ``(k + 1) ** alpha``) or ``"sum"`` (GiGPO: levels added with
            weight 1; ``alpha`` unused).
        step_std_ddof: the std's ddof inside step groups: 0 (HGPO's population std) or 1 (GiGPO's sample std).
        eps: added to the std in ``"mean_std_norm"``.

    Returns:
        float64 array of advantages; 0 for a step none of whose groups gave a non-zero advantage.
    """
    _check_options(history_length, alpha, mode, eps)
    _check_structure(base_stats, combine, step_std_ddof)
    table = hgpo_levels(
        obs_keys=obs_keys,
        traj_ids=traj_ids,
        step_indices=step_indices,
        step_returns=step_returns,
        step_rewards=step_rewards,
        gamma=gamma,
        history_length=history_length,
        mode=mode,
        base_group=base_group,
        base_stats=base_stats,
        step_groups=step_groups,
        step_std_ddof=step_std_ddof,
        eps=eps,
    )
    a = table.advantages
    if combine == "sum":
        return np.where(np.isfinite(a), a, 0.0).sum(axis=1)
    weights = (np.asarray(table.levels, dtype=np.float64) + 1.0) ** alpha
    # Groups of one are NaN, zero advantages carry no information: both are left out of the weights too.
    used = np.isfinite(a) & (a != 0.0)
    w = np.where(used, weights[None, :], 0.0)
    total = w.sum(axis=1)
    num = np.where(used, a, 0.0) @ weights
    return np.divide(num, total, out=np.zeros_like(total), where=total > 0)


#: Per-step fields :func:`hgpo_group_advantages` needs besides the rewards (a registry's ``sample_inputs``).
HGPO_SAMPLE_INPUTS: tuple[str, ...] = ("obs_keys", "traj_ids", "step_indices")


def hgpo_group_advantages(
    rewards: Sequence[float] | np.ndarray,
    *,
    obs_keys: Sequence[Hashable],
    traj_ids: Sequence[Hashable],
    step_indices: Sequence[int],
    **options: Any,
) -> np.ndarray:
    """:func:`hgpo_advantages` in the advantage registry's call shape: ``rewards`` are the per-step rewards of
    one query's steps (returns follow from ``gamma`` in ``options``, default 1)."""
    return hgpo_advantages(
        obs_keys=obs_keys, traj_ids=traj_ids, step_indices=step_indices, step_rewards=rewards, **options
    )


@register_advantage(
    "hgpo",
    config_params={
        "setting": "hgpo_setting",
        "history_length": "hgpo_history_length",
        "alpha": "hgpo_alpha",
        "mode": "hgpo_mode",
        "base_group": "hgpo_base_group",
        "base_stats": "hgpo_base_stats",
        "gamma": "step_gamma",
        "eps": "adv_eps",
    },
    sample_inputs=HGPO_SAMPLE_INPUTS,
)
def hgpo_estimator(
    rewards: Sequence[float] | np.ndarray,
    *,
    obs_keys: Sequence[Hashable],
    traj_ids: Sequence[Hashable],
    step_indices: Sequence[int],
    setting: str = "hgpo",
    history_length: int | None = None,
    alpha: float = 1.0,
    mode: HGPOMode = "mean_std_norm",
    base_group: bool | None = None,
    base_stats: HGPOBaseStats = "step_rows",
    gamma: float = 1.0,
    eps: float = 1e-6,
) -> np.ndarray:
    """The ``hgpo`` advantage estimator: the named setting (:data:`HGPO_SETTINGS`: ``"hgpo"``, ``"gigpo"``,
    ``"episode_grpo"``) with ``history_length`` and ``base_group`` overriding it where not None; ``rewards`` are one
    query's per-step rewards (returns follow with ``gamma``)."""
    overrides = {"history_length": history_length, "base_group": base_group}
    options = hgpo_settings(
        setting,
        alpha=alpha,
        mode=mode,
        base_stats=base_stats,
        gamma=gamma,
        eps=eps,
        **{k: v for k, v in overrides.items() if v is not None},
    )
    return hgpo_group_advantages(
        rewards, obs_keys=obs_keys, traj_ids=traj_ids, step_indices=step_indices, **options
    )


def hgpo_advantages_by_query(
    query_ids: Sequence[Hashable], *, setting: str | None = None, **kwargs: Any
) -> np.ndarray:
    """:func:`hgpo_advantages` over a flat batch of several queries' steps (steps with the same ``query_ids`` entry
    form one HGPO group); per-step sequences in ``kwargs`` are split by query, scalar options passed through, and
    ``setting`` (a key of :data:`HGPO_SETTINGS`) supplies defaults that ``kwargs`` override."""
    per_step = ("obs_keys", "traj_ids", "step_indices", "step_returns", "step_rewards")
    options = {k: v for k, v in kwargs.items() if k not in per_step}
    if setting is not None:
        options = hgpo_settings(setting, **options)
    n = len(query_ids)
    columns: dict[str, Sequence[Any]] = {}
    for name in per_step:
        if kwargs.get(name) is not None:
            if len(kwargs[name]) != n:
                raise ValueError(f"{name} has {len(kwargs[name])} entries but query_ids has {n}")
            columns[name] = kwargs[name]
    members: dict[Hashable, list[int]] = {}
    for i, q in enumerate(query_ids):
        members.setdefault(q, []).append(i)
    out = np.zeros(n, dtype=np.float64)
    for q, idx in members.items():
        part = {
            name: (
                np.asarray(col)[idx] if name in ("step_returns", "step_rewards") else [col[i] for i in idx]
            )
            for name, col in columns.items()
        }
        try:
            out[idx] = hgpo_advantages(**part, **options)
        except (ValueError, TypeError) as e:
            raise type(e)(f"query {q!r}: {e}") from None
    return out


def hgpo_group_stats(levels: HGPOLevels) -> Mapping[str, float]:
    """Metrics of one hierarchy: per level, the fraction of steps in a group of two or more and the mean size of
    those groups (how much context consistency the data leaves each level)."""
    out: dict[str, float] = {}
    for j, k in enumerate(levels.levels):
        shared = levels.sizes[:, j] >= 2
        out[f"level{k}/shared_frac"] = float(shared.mean())
        out[f"level{k}/mean_size"] = float(levels.sizes[shared, j].mean()) if shared.any() else 0.0
    return out

"""Group-relative advantages: one function per estimator, each on the rewards of ONE group (the G responses to one
query), selectable by name.

Every estimator takes a 1-D array of rewards and returns one advantage per response (float64, same order). Batch
code loops over groups (or calls :func:`compute_advantages_by_group`); keeping the per-group functions pure makes
their formulas testable by hand and lets new estimators (HGPO, R^2PO, ...) plug in through
:func:`register_advantage` without touching the trainer. An estimator whose formula needs a statistic of the whole
batch (REINFORCE++'s whitening over the batch's tokens) declares a batch step, applied once after the per-group pass
(:func:`apply_batch_step`).

The standard deviation is the *population* std (``ddof=0``) everywhere by default. This is a choice, not a
derivation: with the small groups used in practice (G = 4..16) ``ddof=1`` inflates the std by ``sqrt(G/(G-1))``
(15 % at G = 4), which only rescales advantages (and thus the learning rate) per group size; ``ddof=0`` is also
defined for a group of one (std 0, advantage 0) where ``ddof=1`` is not. :func:`grpo_advantages` exposes ``ddof``
for users who want the sample std (the config's ``adv_std_ddof``; verl's and DeepScaleR's GRPO use ``ddof=1``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from r3_rllib.core.registry import Registry, entry_point_group

AdvantageFn = Callable[..., np.ndarray]

#: Name -> per-group advantage function ``fn(rewards, **params, **sample_inputs) -> np.ndarray``, with the config
#: fields each reads its parameters from (see :mod:`r3_rllib.core.registry`); installed packages add more through
#: the entry-point group ``r3_rllib.advantages``, and a ``"module:function"`` path names one without registering it.
ADVANTAGE_FNS = Registry("advantage estimator", entry_points=entry_point_group("r3_rllib.advantages"))


def register_advantage(
    name: str,
    *,
    config_params: Mapping[str, str] | None = None,
    sample_inputs: tuple[str, ...] = (),
    batch_fn: Callable[..., np.ndarray] | None = None,
    batch_config_params: Mapping[str, str] | None = None,
    batch_sample_inputs: tuple[str, ...] = (),
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator adding an estimator to :data:`ADVANTAGE_FNS` under ``name`` (names are unique).

    ``config_params`` maps its keyword parameters to the config fields that set them (``{"eps": "adv_eps"}``);
    ``sample_inputs`` names per-sample fields it needs besides the rewards (passed as keyword sequences).
    ``batch_fn(advantages, **batch_params) -> advantages`` is an optional batch step: applied once to the per-group
    advantages of every group of a batch, concatenated (:func:`apply_batch_step`), with its parameters read from
    ``batch_config_params`` and the per-sample sequences named by ``batch_sample_inputs`` (e.g.
    ``"token_counts"``: each sample's trained tokens, for statistics over tokens). A batch step may shift the
    advantages (verl's whitening gives an all-equal group a non-zero advantage): the batch builder judges a group's
    gradient after it.
    Step-level estimators (multi-step envs) cannot declare one: their samples are steps, so a batch statistic would
    weigh each episode by its number of steps."""
    if batch_fn is not None and STEP_SAMPLE_INPUTS & set(sample_inputs):
        raise ValueError(
            f"advantage estimator {name!r}: a batch step over step samples would weigh episodes by their length; "
            "step-level estimators cannot declare one"
        )
    return ADVANTAGE_FNS.register(
        name,
        config_params=config_params,
        sample_inputs=sample_inputs,
        batch_fn=batch_fn,
        batch_config_params=batch_config_params,
        batch_sample_inputs=batch_sample_inputs,
    )


#: The sample input of an estimator whose baseline is the reward of a greedy response to the prompt (ReMax): the
#: single-step rollout kind then decodes one greedy response per prompt and records its reward on every sample
#: of the group (``Sample.baseline_reward``).
GREEDY_BASELINE_INPUT = "baselines"


def needs_greedy_baseline(name: object) -> bool:
    """Whether the registered estimator ``name`` reads a greedy response's reward (:data:`GREEDY_BASELINE_INPUT`);
    False for a name that is not registered."""
    return isinstance(name, str) and GREEDY_BASELINE_INPUT in ADVANTAGE_FNS.sample_inputs.get(name, ())


#: Sample inputs that identify steps of a multi-step episode: an estimator declaring one of them scores step samples
#: (e.g. 'hgpo'); other sample inputs (e.g. 'outcomes', the samples' correct flags) are per-response.
STEP_SAMPLE_INPUTS: frozenset[str] = frozenset({"obs_keys", "traj_ids", "step_indices"})


def is_step_level(name: str) -> bool:
    """Whether the registered estimator ``name`` scores the steps of multi-step episodes (reads step identities);
    an entry point or a path is loaded first (one that fails to load is reported by the config's checks)."""
    try:
        ADVANTAGE_FNS.lookup(name)
    except (ImportError, TypeError, ValueError):
        pass
    return bool(STEP_SAMPLE_INPUTS & set(ADVANTAGE_FNS.sample_inputs.get(name, ())))


def _as_group(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    """Validate one group's rewards and return them as a 1-D float64 array."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"rewards of one group must be 1-D, got shape {r.shape}")
    if r.size == 0:
        raise ValueError("rewards of one group must not be empty")
    bad = np.flatnonzero(~np.isfinite(r))
    if bad.size:
        raise ValueError(f"rewards must be finite; index {int(bad[0])} is {r[bad[0]]}")
    return r


def group_is_degenerate(rewards: Sequence[float] | np.ndarray, atol: float = 0.0) -> bool:
    """True when all rewards of the group are equal within ``atol``.

    Such a group (all right or all wrong) gives every response a zero advantage and so no policy gradient: the case
    R^3's replay and reflection are built to repair.
    """
    r = _as_group(rewards)
    return bool(r.max() - r.min() <= atol)


@register_advantage("mixed", config_params={"alpha": "adv_alpha", "lam": "adv_lambda"})
def mixed_group_advantages(rewards: Sequence[float] | np.ndarray, *, alpha: float, lam: float) -> np.ndarray:
    """``A_i = (R_i - mean(R)) / (alpha * std(R) + lam)`` with the population std.

    ``alpha`` interpolates between std normalisation (GRPO: ``alpha=1``, small ``lam``) and none (Dr.GRPO-like:
    ``alpha=0``, ``lam=1``); ``lam > 0`` bounds the advantage of nearly-degenerate groups, where dividing by a tiny
    std would blow up one lucky sample. When the denominator is zero (``lam == 0`` and a degenerate group) the
    numerator is zero too and the result is all zeros.
    """
    if not (np.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
    if not (np.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be finite and >= 0, got {lam}")
    if alpha == 0 and lam == 0:
        raise ValueError("alpha and lam cannot both be 0 (the denominator would always be 0)")
    r = _as_group(rewards)
    centered = r - r.mean()
    denom = alpha * r.std(ddof=0) + lam
    if denom == 0.0:
        return np.zeros_like(r)
    return centered / denom


@register_advantage("grpo", config_params={"eps": "adv_eps", "ddof": "adv_std_ddof"})
def grpo_advantages(rewards: Sequence[float] | np.ndarray, *, eps: float = 1e-6, ddof: int = 0) -> np.ndarray:
    """GRPO: ``(R_i - mean) / (std + eps)``. With ``ddof=1`` a group of one gets zero advantage (no spread)."""
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {ddof}")
    r = _as_group(rewards)
    if r.size <= ddof:
        return np.zeros_like(r)
    centered = r - r.mean()
    denom = r.std(ddof=ddof) + eps
    if denom == 0.0:
        return np.zeros_like(r)
    return centered / denom


@register_advantage("drgrpo")
def drgrpo_advantages(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    """Dr.GRPO: ``R_i - mean`` (no std division, which would up-weight easy and hard queries)."""
    r = _as_group(rewards)
    return r - r.mean()


@register_advantage("rloo")
def rloo_advantages(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    """RLOO (Ahmadian et al. 2024, arXiv 2402.14740): ``A_i = R_i - mean_{j != i} R_j``, each response's baseline
    the mean reward of the G - 1 others (unbiased: the baseline does not depend on the response it scores). Equal
    to ``G / (G - 1) * (R_i - mean(R))``; a group of one has no other response and gets 0."""
    r = _as_group(rewards)
    g = r.size
    if g == 1:
        return np.zeros_like(r)
    return r - (r.sum() - r) / (g - 1)


@register_advantage("opo", sample_inputs=("token_counts",))
def opo_advantages(
    rewards: Sequence[float] | np.ndarray, *, token_counts: Sequence[int] | np.ndarray
) -> np.ndarray:
    """OPO (On-Policy RL with Optimal reward baseline, Hao et al. 2025, arXiv 2505.23585; verl's ``opo``):
    ``A_i = R_i - b`` with the length-weighted baseline ``b = sum_j L_j R_j / sum_j L_j`` over the group (``L_j``:
    response ``j``'s trained tokens, ``token_counts``), the baseline of least gradient variance when a response's
    gradient norm grows with its length. A group of one gets ``b = 0`` (verl: ``A = R``); a group whose responses
    have no trained token takes the plain mean (verl's would divide by zero)."""
    r = _as_group(rewards)
    lengths = np.asarray(token_counts, dtype=np.float64)
    if lengths.shape != r.shape:
        raise ValueError(f"need one token count per reward; got {lengths.shape} for rewards {r.shape}")
    if r.size == 1:
        return r.copy()
    total = lengths.sum()
    baseline = float(lengths @ r) / total if total > 0 else float(r.mean())
    return r - baseline


@register_advantage("remax", sample_inputs=(GREEDY_BASELINE_INPUT,))
def remax_advantages(
    rewards: Sequence[float] | np.ndarray, *, baselines: Sequence[float | None] | np.ndarray
) -> np.ndarray:
    """ReMax (Li et al. 2023, arXiv 2310.10505; verl's ``remax``): ``A_i = R_i - b``, ``b`` the reward of a greedy
    (temperature 0) response to the same prompt, graded like the sampled ones and never trained on. ``baselines``
    holds each member's recorded greedy reward; a member without one (None: a replayed sample, which comes from
    the replay store) takes its group's, the one its fresh members share. verl's advantage is the per-token return
    minus ``b``: with the outcome reward on the last token and gamma 1 that is ``R_i - b`` on every token; with
    ``use_kl_in_reward`` the learners take the token KL off it (``core/token_returns.py``)."""
    r = _as_group(rewards)
    if len(baselines) != r.size:
        raise ValueError(f"need one baseline entry per reward; got {len(baselines)} for {r.size} rewards")
    known = {float(b) for b in baselines if b is not None}
    if not known:
        raise ValueError(
            "remax: no member of the group has a greedy baseline reward (the single-step rollout records it on "
            "the samples it generates; a group of replayed samples alone has none)"
        )
    if len(known) > 1:
        raise ValueError(
            f"remax: the group's members carry different greedy baseline rewards {sorted(known)}"
        )
    (b,) = known
    if not np.isfinite(b):
        raise ValueError(f"remax: the greedy baseline reward must be finite, got {b}")
    return r - b


@register_advantage("grpo_passk", config_params={"eps": "adv_eps"})
def grpo_passk_advantages(rewards: Sequence[float] | np.ndarray, *, eps: float = 1e-6) -> np.ndarray:
    """Pass@k training (Chen et al. 2025, arXiv 2508.10751; verl's ``grpo_passk``): only the group's best response
    gets an advantage, ``(R_max - R_second) / (std(R) + eps)`` (the sample std, ddof 1, as verl's ``torch.std``,
    and verl's default of dividing by it), every other response 0. Ties for the best give 0 (the margin is 0), so a
    group's first best response is the one named. A group of one has no second response and gets 0 (verl refuses
    it: the config refuses group_size 1 with this estimator)."""
    r = _as_group(rewards)
    out = np.zeros_like(r)
    if r.size < 2:
        return out
    order = np.argsort(
        -r, kind="stable"
    )  # the first best response first, as verl's topk keeps the earlier index
    best, second = int(order[0]), int(order[1])
    out[best] = (r[best] - r[second]) / (r.std(ddof=1) + eps)
    return out


#: The constant verl's ``masked_whiten`` adds to the variance under the square root (``rsqrt(var + 1e-8)``).
WHITEN_EPS = 1e-8

#: Old estimator names -> the names that replaced them; naming an old one is refused with the new name.
ADVANTAGE_FNS.renamed["reinforce_pp"] = "reinforce_plus_plus_baseline"


def token_whiten(
    advantages: Sequence[float] | np.ndarray, *, token_counts: Sequence[int] | np.ndarray
) -> np.ndarray:
    """verl's ``masked_whiten`` of per-token advantages that are constant along each response: the batch step of
    REINFORCE++ and REINFORCE++-baseline.

    Response ``i``'s advantage ``a_i`` stands for its ``n_i = token_counts[i]`` trained tokens, so the statistics
    are over the batch's *tokens*: ``mu = sum_i n_i a_i / N`` and the unbiased token variance
    ``var = sum_i n_i (a_i - mu)^2 / (N - 1)`` with ``N = sum_i n_i``; each response gets
    ``(a_i - mu) / sqrt(var + 1e-8)``, which is again constant along it. A long response weighs more in both
    statistics, as in verl. The mean is subtracted (verl's ``shift_mean=True``): an all-equal group, whose
    group-centred advantages are 0, gets ``-mu / sqrt(var + 1e-8)`` and is trained on, as in verl. A response with
    no trained token counts for nothing (and keeps its shifted value, which no token carries). With fewer than two
    tokens in the batch (verl raises) there is no spread: the advantages are only centred."""
    a = np.asarray(advantages, dtype=np.float64)
    n = np.asarray(token_counts, dtype=np.float64)
    if a.ndim != 1 or n.shape != a.shape:
        raise ValueError(f"need advantages [B] and token_counts [B]; got {a.shape} and {n.shape}")
    if np.any(n < 0) or not np.all(np.isfinite(n)):
        raise ValueError("token_counts must be finite and >= 0")
    total = n.sum()
    if total == 0:
        return np.zeros_like(a)
    mu = float(n @ a) / total
    centered = a - mu
    if total < 2:
        return centered
    var = float(n @ centered**2) / (total - 1.0)
    return centered / np.sqrt(var + WHITEN_EPS)


@register_advantage(
    "reinforce_plus_plus_baseline", batch_fn=token_whiten, batch_sample_inputs=("token_counts",)
)
def reinforce_plus_plus_baseline_advantages(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    """REINFORCE++-baseline (Hu et al. 2025, arXiv 2501.03262; verl's ``reinforce_plus_plus_baseline``),
    per-group part: ``R_i - mean(R)`` (the group mean as baseline; a group of one keeps ``R``, verl's mean 0 for
    a lone response). The batch step :func:`token_whiten` then whitens over the batch's tokens: one scale for every
    group, unlike GRPO's per-group std, which up-weights groups of nearly equal rewards."""
    r = _as_group(rewards)
    if r.size == 1:
        return r.copy()
    return r - r.mean()


@register_advantage("reinforce_plus_plus", batch_fn=token_whiten, batch_sample_inputs=("token_counts",))
def reinforce_plus_plus_advantages(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    """REINFORCE++ (arXiv 2501.03262; verl's ``reinforce_plus_plus``), per-group part: the return itself, no group
    baseline; the batch step :func:`token_whiten` whitens the returns over the batch's tokens.

    verl computes token returns ``G_t = gamma^(L-1-t) R`` (the outcome reward sits on the last token) with its
    ``algorithm.gamma``, default 1.0. At gamma = 1 every token of a response has the return ``R``, which is what
    this estimator trains on. With a gamma < 1 (``gae_gamma``) or ``use_kl_in_reward`` (the token rewards carry the
    KL) the returns differ along a response: the learners compute them (``core/token_returns.py``) and this
    per-group pass only hands them the reward (no batch step: :func:`learners_compute_token_advantages`)."""
    return _as_group(rewards).copy()


#: TRL's constant under the batch std of ``scale_rewards='batch'``.
BATCH_STD_EPS = 1e-4


def batch_reward_std_scale(
    advantages: Sequence[float] | np.ndarray,
    *,
    rewards: Sequence[float] | np.ndarray,
    eps: float = BATCH_STD_EPS,
) -> np.ndarray:
    """TRL's ``scale_rewards='batch'`` batch step: every group-centred advantage divided by the sample std of all of
    the batch's rewards (the rewards the groups were centred with, replayed ones included) plus ``eps``; one scale
    for every group. With fewer than two rewards (no spread to take) the advantages are left as they are."""
    a = np.asarray(advantages, dtype=np.float64)
    r = np.asarray(rewards, dtype=np.float64)
    if a.ndim != 1 or r.shape != a.shape:
        raise ValueError(f"need advantages [B] and rewards [B]; got {a.shape} and {r.shape}")
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    if r.size < 2:
        return a.copy()
    denom = r.std(ddof=1) + eps
    return a / denom if denom > 0 else np.zeros_like(a)


@register_advantage("grpo_batch_std", batch_fn=batch_reward_std_scale, batch_sample_inputs=("rewards",))
def grpo_batch_std_advantages(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    """GRPO with the batch's reward std (TRL's ``scale_rewards='batch'``; the group-mean, batch-std advantage of
    "Tricks or Traps?", Liu et al. 2025, arXiv 2508.08221), per-group part: ``R_i - mean(R)``; the batch step
    :func:`batch_reward_std_scale` divides by the std of every reward of the batch, which keeps a group of nearly
    equal rewards from being scaled up as GRPO's own std would. Under the std, TRL's constant 1e-4
    (:data:`BATCH_STD_EPS`; ``adv_eps`` is GRPO's own)."""
    r = _as_group(rewards)
    return r - r.mean()


def nonzero_reward_scale(
    advantages: Sequence[float] | np.ndarray, *, rewards: Sequence[float] | np.ndarray
) -> np.ndarray:
    """GPG's batch step (verl's ``gpg`` estimator): every advantage times ``B / M``, ``B`` the batch's responses and
    ``M`` those with a non-zero reward (at least 1), so a batch where few responses earn a reward is not learned
    from more slowly (the paper's correction for the responses that carry no gradient)."""
    a = np.asarray(advantages, dtype=np.float64)
    r = np.asarray(rewards, dtype=np.float64)
    if a.ndim != 1 or r.shape != a.shape:
        raise ValueError(f"need advantages [B] and rewards [B]; got {a.shape} and {r.shape}")
    return a * (a.size / max(int(np.count_nonzero(r)), 1))


#: GDPO's name for the env's own reward among the objectives (the reward terms go by their names).
GDPO_ENV_OBJECTIVE = "env"


def gdpo_objectives(
    reward_models: Sequence[Mapping] | None, env_reward_weight: float
) -> list[tuple[str, float]]:
    """GDPO's objectives and their weights: the env's reward (``env_reward_weight``) and each reward term of the
    config's ``reward_models`` list (its ``weight``, 1.0 by default). Gate terms are not objectives: the config
    refuses them with GDPO."""
    terms = [(str(t["name"]), float(t.get("weight", 1.0))) for t in reward_models or ()]
    return [(GDPO_ENV_OBJECTIVE, float(env_reward_weight)), *terms]


def batch_whiten(advantages: Sequence[float] | np.ndarray) -> np.ndarray:
    """GDPO's batch step: ``(a - mean) / (std + 1e-4)`` over every response of the batch, the sample std (TRL's
    ``rewards.std()``): :func:`grpo_advantages`' normalisation with the batch as the group (a batch of one: 0)."""
    return grpo_advantages(advantages, eps=BATCH_STD_EPS, ddof=1)


@register_advantage(
    "gdpo",
    config_params={"reward_models": "reward_models", "env_reward_weight": "env_reward_weight"},
    sample_inputs=("env_rewards", "reward_parts"),
    batch_fn=batch_whiten,
)
def gdpo_advantages(
    rewards: Sequence[float] | np.ndarray,
    *,
    env_rewards: Sequence[float],
    reward_parts: Sequence[Mapping[str, float] | None],
    reward_models: Sequence[Mapping] | None = None,
    env_reward_weight: float = 1.0,
) -> np.ndarray:
    """GDPO (group reward-decoupled normalisation; TRL's ``multi_objective_aggregation='normalize_then_sum'``),
    per-group part: each objective of :func:`gdpo_objectives` normalised on its own within the group,
    ``(v_k - mean_k) / (std_k + 1e-4)`` (sample std; 0 for a group of one), then their weighted sum; the batch step
    :func:`batch_whiten` then whitens the sums over the batch. Summing first (GRPO on the composed reward) lets the
    objective with the widest spread decide every group's ranking; normalising each first gives each its weight's
    say. ``rewards`` (the composed reward) are not read: the objectives come from each sample's env reward and its
    reward parts (a term's score, 0 for a failed one)."""
    n = len(_as_group(rewards))
    total = np.zeros(n, dtype=np.float64)
    for name, weight in gdpo_objectives(reward_models, env_reward_weight):
        if name == GDPO_ENV_OBJECTIVE:
            values = np.asarray(env_rewards, dtype=np.float64)
        else:
            values = np.array(
                [float((parts or {}).get(name, 0.0)) for parts in reward_parts], dtype=np.float64
            )
        if values.shape != (n,):
            raise ValueError(f"GDPO objective {name!r}: {values.shape[0]} values for a group of {n}")
        total += weight * grpo_advantages(values, eps=BATCH_STD_EPS, ddof=1)  # the objective's own GRPO
    return total


@register_advantage("gpg", batch_fn=nonzero_reward_scale, batch_sample_inputs=("rewards",))
def gpg_advantages(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    """GPG (Group Policy Gradient, Chu et al. 2025, arXiv 2504.02546; verl's ``gpg`` estimator), per-group part:
    ``R_i - mean(R)`` (a group of one keeps ``R``: verl's mean 0 for a lone response); the batch step
    :func:`nonzero_reward_scale` multiplies by ``B / M``. verl's ``f_norm`` divisor is 1 (its default). The paper
    pairs it with ``policy_loss: gpg``."""
    r = _as_group(rewards)
    if r.size == 1:
        return r.copy()
    return r - r.mean()


#: Estimators whose advantages a critic on the learners computes per token (``algorithms/r3/learner_critic.py``):
#: their per-group pass leaves each response's reward as it is, for the critic's GAE.
CRITIC_ESTIMATORS: frozenset[str] = frozenset({"gae"})


def uses_critic(name: object) -> bool:
    """Whether estimator ``name`` is computed by the learners' critic (:data:`CRITIC_ESTIMATORS`)."""
    return isinstance(name, str) and name in CRITIC_ESTIMATORS  # a Tune search space's dict is not a name


#: Estimators whose baseline is not the group's other responses: a critic's values ('gae'), none (REINFORCE++: the
#: returns whitened over the batch) or the reward of a greedy response (ReMax). They take groups of one response
#: (verl's ``rollout.n: 1``).
GROUPLESS_ESTIMATORS: frozenset[str] = CRITIC_ESTIMATORS | {"reinforce_plus_plus", "remax"}


#: verl's estimators that train each token on its return of the token rewards: with the KL in the reward
#: (``use_kl_in_reward``) those returns differ along a response, and the learners compute them per token
#: (``core/token_returns.py``, ``algorithms/r3/learner_token_returns.py``); without it every token's return is the
#: response's reward, the per-group functions' value.
TOKEN_RETURN_ESTIMATORS: frozenset[str] = frozenset({"reinforce_plus_plus", "remax"})


def learners_compute_token_advantages(name: object, use_kl_in_reward: bool, gamma: float = 1.0) -> bool:
    """Whether the learners compute the token advantages of estimator ``name``: a critic's ('gae'), one of
    :data:`TOKEN_RETURN_ESTIMATORS` with the KL in the reward, or REINFORCE++ with a discount ``gamma`` < 1 (verl's
    ``algorithm.gamma``: the returns differ along a response). The batch then carries each response's reward (or
    ReMax's reward less its baseline) as its advantage, without the estimator's batch step."""
    if uses_critic(name) or not isinstance(name, str):
        return uses_critic(name)
    return (bool(use_kl_in_reward) and name in TOKEN_RETURN_ESTIMATORS) or (
        name == "reinforce_plus_plus" and float(gamma) < 1.0
    )


@register_advantage("gae")
def gae_outcome_rewards(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    """'gae' (verl's PPO estimator), per-group part: each response's reward unchanged (no group baseline). The
    learners' critic places it at the response's last trained token and turns it into per-token GAE advantages
    against its values (:mod:`r3_rllib.core.gae`), whitened over the batch's tokens there."""
    return _as_group(rewards).copy()


def compute_group_advantages(name: str, rewards: Sequence[float] | np.ndarray, **params: float) -> np.ndarray:
    """Advantages of one group with the estimator registered as ``name`` (its per-group pass only: see
    :func:`apply_batch_step` for an estimator that declares a batch step)."""
    return ADVANTAGE_FNS.get_fn(name)(rewards, **params)


def has_batch_step(name: str) -> bool:
    """Whether the registered estimator ``name`` declares a batch step (applied after the per-group pass)."""
    ADVANTAGE_FNS.get_fn(name)
    return name in ADVANTAGE_FNS.batch_fns


def apply_batch_step(name: str, advantages: Sequence[float] | np.ndarray, **params: object) -> np.ndarray:
    """The batch step of estimator ``name`` on the per-group advantages of a whole batch (concatenated in any order:
    a batch step sees them as one sample set; ``params``: its config parameters and batch sample inputs, aligned
    with ``advantages``); the advantages unchanged (as float64) when it declares none."""
    a = np.asarray(advantages, dtype=np.float64)
    fn = ADVANTAGE_FNS.batch_fns.get(name)
    if fn is None:
        ADVANTAGE_FNS.get_fn(name)
        return a.copy()
    out = np.asarray(fn(a, **params), dtype=np.float64)
    if out.shape != a.shape:
        raise ValueError(
            f"batch step of {name!r} returned shape {out.shape} for advantages of shape {a.shape}"
        )
    return out


def compute_advantages_by_group(
    name: str,
    rewards: Sequence[float] | np.ndarray,
    group_ids: Sequence[object] | np.ndarray,
    batch_params: Mapping[str, object] | None = None,
    **params: float,
) -> np.ndarray:
    """Advantages of a flat batch: responses with the same ``group_ids`` entry form one group; then the estimator's
    batch step, if it declares one, with ``batch_params``.

    Returns one advantage per response, in the input order.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"rewards must be 1-D, got shape {r.shape}")
    if len(group_ids) != r.size:
        raise ValueError(f"group_ids has {len(group_ids)} entries but rewards has {r.size}")
    members: dict[object, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    out = np.empty_like(r)
    for g, idx in members.items():
        try:
            out[idx] = compute_group_advantages(name, r[idx], **params)
        except ValueError as e:
            raise ValueError(f"group {g!r}: {e}") from None
    return apply_batch_step(name, out, **dict(batch_params or {}))


def expand_to_tokens(advantages: Sequence[float] | np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Broadcast per-sequence advantages ``[B]`` over a response mask ``[B, T]`` (zeros where the mask is 0)."""
    a = np.asarray(advantages, dtype=np.float64)
    m = np.asarray(mask)
    if a.ndim != 1 or m.ndim != 2 or m.shape[0] != a.shape[0]:
        raise ValueError(f"need advantages [B] and mask [B, T]; got {a.shape} and {m.shape}")
    return a[:, None] * m.astype(np.float64)

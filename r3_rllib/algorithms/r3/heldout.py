"""Held-out evaluation split over the EnvRunners: which of the first n held-out queries each runner scores, the
sampling seed of its part, and the merge of the runners' counts into one result.

Every runner builds the same held-out env, so "the first n queries" are the same list on each; runner i of k takes
the i-th contiguous part. Greedy results do not depend on the split; sampled ones depend on it only through the
seeds, which are fixed per part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def eval_shard(n: int, index: int, count: int) -> range:
    """Part `index` of `count` of ``range(n)``: contiguous, sizes differing by at most one, in order."""
    if not 0 <= index < count:
        raise ValueError(f"shard index {index} outside 0..{count - 1}")
    base, extra = divmod(n, count)
    start = index * base + min(index, extra)
    return range(start, start + base + (1 if index < extra else 0))


def eval_seed(seed: int, index: int) -> int:
    """Sampling seed of part `index` of a sampled evaluation. Fixed per run, so every evaluation draws the same
    random numbers (a before/after comparison then differs by the policy, not by the draw), and independent of the
    training sampler's seed, which evaluating leaves where it was."""
    return int(np.random.SeedSequence([int(seed), int(index), 0x5EED]).generate_state(1)[0])


def merge_eval_counts(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One result from the runners' counts.

    Each part has ``queries``, ``samples`` (responses or trajectories scored) and ``correct`` (of them correct /
    successful); multi-step parts add ``length_sum`` (steps of all trajectories) and ``goal_steps_sum`` (steps of
    the successful ones). Returns ``accuracy`` and ``num_queries``, plus ``episode_len_mean`` and ``steps_to_goal``
    for multi-step parts (``steps_to_goal`` absent when nothing succeeded: there is no length to report, and a
    result's metric that was not measured is absent, not NaN).
    """
    if not parts:
        raise ValueError("no evaluation results to merge")
    total = {k: float(sum(p[k] for p in parts)) for k in parts[0]}
    samples = total["samples"]
    out = {"accuracy": total["correct"] / max(1.0, samples), "num_queries": total["queries"]}
    if "length_sum" in total:
        out["episode_len_mean"] = total["length_sum"] / max(1.0, samples)
        if total["correct"]:
            out["steps_to_goal"] = total["goal_steps_sum"] / total["correct"]
    return out

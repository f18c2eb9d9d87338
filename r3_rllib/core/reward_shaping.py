"""Reward shaping applied on the driver before advantages, and DAPO's group filter.

- :func:`overlong_penalty`: DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13). With ``L_max`` the response
  budget and ``L_cache`` the buffer at its end, a response of ``L`` tokens gets

      0                                   if L <= L_max - L_cache
      ((L_max - L_cache) - L) / L_cache   if L_max - L_cache < L <= L_max
      -1                                  if L > L_max

  times ``penalty_factor``, added to its task reward. A response cut at the budget (``L = L_max``) gets the full
  ``-penalty_factor``; one that ends just inside the buffer a small one, so the policy learns to finish before the
  limit without the reward noise of punishing every truncated answer as wrong.
- :func:`keep_group`: DAPO's dynamic-sampling filter. DAPO drops the prompts whose responses are all correct or all
  wrong (a zero std of the "acc" metric); filtering on reward spread instead keeps all-correct groups whenever a
  length bonus or the overlong penalty makes their rewards differ.
- :func:`another_gen_batch` / :class:`DynamicSamplingShortfall`: how many generation batches dynamic sampling may
  draw before it gives up, counted as verl's DAPO trainer counts them (``max_num_gen_batches``, the first batch
  included; <= 0: no limit), and the error raised when they run out before the batch is full.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

#: What dynamic sampling's filter looks at: 'accuracy' (DAPO: drop groups whose responses are all correct or all
#: wrong) or 'reward' (drop groups whose shaped rewards are all equal, i.e. whose advantages would all be zero).
FILTER_METRICS = ("accuracy", "reward")

#: What dynamic sampling does when max_num_gen_batches run out before enough groups passed: 'raise' (verl's DAPO
#: trainer: a batch short of groups is a sign of data too hard or too easy, which a run should not hide) or
#: 'train_on_kept' (ours: train on the groups that passed, a smaller batch).
SHORTFALL_MODES = ("raise", "train_on_kept")


def overlong_penalty(
    lengths: Sequence[int] | np.ndarray, *, max_length: int, buffer_length: int, penalty_factor: float = 1.0
) -> np.ndarray:
    """DAPO's soft overlong penalty (<= 0) of responses of ``lengths`` tokens (see the module docstring)."""
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    if not 1 <= buffer_length <= max_length:
        raise ValueError(f"buffer_length must be in [1, max_length={max_length}], got {buffer_length}")
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")
    length = np.asarray(lengths, dtype=np.float64)
    expected = max_length - buffer_length
    # Linear from 0 at the buffer's start to -1 at max_length; beyond the budget (which an engine never produces)
    # the paper's -1.
    penalty = np.clip((expected - length) / buffer_length, -1.0, 0.0)
    return penalty * penalty_factor


class _MaybeTruncated(Protocol):
    truncated: bool


T = TypeVar("T", bound=_MaybeTruncated)


def without_truncated(samples: Sequence[T]) -> tuple[list[T], int]:
    """TRL's ``mask_truncated_completions``: the samples whose response did not hit the length limit (each has a
    ``truncated`` flag), and how many were left out. Applied to a batch after its advantages: the truncated
    responses counted in their groups' baselines, and leave only the update."""
    kept = [s for s in samples if not s.truncated]
    return kept, len(samples) - len(kept)


def keep_group(correct: Sequence[bool], rewards: Sequence[float], metric: str = "accuracy") -> bool:
    """Whether dynamic sampling keeps a group of responses: its ``metric`` varies within the group. A group of one
    response is kept (nothing to compare, as in verl)."""
    if metric not in FILTER_METRICS:
        raise ValueError(f"metric must be one of {FILTER_METRICS}, got {metric!r}")
    values = np.asarray(correct if metric == "accuracy" else rewards, dtype=np.float64)
    return len(values) <= 1 or bool(np.ptp(values) > 0)


@dataclass(frozen=True)
class OverlongShaping:
    """The settings of :func:`overlong_penalty` for one run (``max_length``: the response budget, max_new_tokens)."""

    max_length: int
    buffer_length: int
    penalty_factor: float = 1.0

    def penalties(self, lengths: Sequence[int] | np.ndarray) -> np.ndarray:
        return overlong_penalty(
            lengths,
            max_length=self.max_length,
            buffer_length=self.buffer_length,
            penalty_factor=self.penalty_factor,
        )


class DynamicSamplingShortfall(RuntimeError):
    """Dynamic sampling ran out of generation batches before queries_per_iteration groups passed its filter."""


def another_gen_batch(gen_batches: int, max_num_gen_batches: int) -> bool:
    """Whether dynamic sampling may draw one more generation batch after ``gen_batches`` (the first included)
    left the batch short: verl's DAPO rule, ``max_num_gen_batches <= 0`` (no limit) or fewer drawn than it."""
    return max_num_gen_batches <= 0 or gen_batches < max_num_gen_batches


def shortfall_message(*, kept: int, needed: int, gen_batches: int, max_num_gen_batches: int) -> str:
    """The error when generation batches ran out: the counts, the likely cause and the fields that change it."""
    batches = f"{gen_batches} generation batch" + ("" if gen_batches == 1 else "es")
    return (
        f"dynamic sampling kept {kept} of the {needed} groups an iteration needs (queries_per_iteration) after "
        f"{batches} (max_num_gen_batches={max_num_gen_batches}): the filter (dynamic_sampling_metric) dropped the "
        "rest, all right or all wrong, so the data may be too hard or too easy for the policy. Raise "
        "max_num_gen_batches (<= 0: no limit), or set dynamic_sampling_shortfall='train_on_kept' to train on the "
        "groups that passed"
    )

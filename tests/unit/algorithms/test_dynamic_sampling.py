"""DAPO's dynamic sampling in the coordinator, with scripted generation batches and no Ray processes: verl's count
of generation batches (the first one included; max_num_gen_batches <= 0: no limit), the error when they run out
before the batch is full (the default, as verl's DAPO trainer), the named option that trains on the groups that
passed, and the config rules of the three fields."""

from __future__ import annotations

import numpy as np
import pytest

from r3_rllib import R3Config
from r3_rllib.algorithms.r3.coordinator import RolloutCoordinator
from r3_rllib.algorithms.r3.rollout_types import Rollout
from r3_rllib.core.reward_shaping import DynamicSamplingShortfall
from r3_rllib.types.samples import Group, Sample

#: Groups the iteration needs (queries_per_iteration) and groups in each generation batch.
NEEDED = 4


class _Metrics:
    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def log_value(self, key, value, **kwargs) -> None:
        self.values[key[-1]] = value

    def delete(self, *key, key_error=True) -> None:  # metric_groups.clear_groups
        self.values.pop(key[-1], None)


def _group(qid: str, correct: list[bool]) -> Group:
    samples = [
        Sample(
            query_id=qid,
            prompt_ids=[1, 2],
            response_ids=[3],
            behavior_logprobs=np.zeros(1, np.float32),
            entropies=np.ones(1, np.float32),
            reward=float(c),
            correct=c,
            truncated=False,
            policy_version=0,
        )
        for c in correct
    ]
    return Group(qid, samples)


def _batch(index: int, informative: int) -> Rollout:
    """A generation batch of NEEDED groups: the first ``informative`` mixed (pass the accuracy filter), the rest
    all wrong (filtered)."""
    return Rollout(
        groups=tuple(
            _group(f"b{index}q{i}", [True, False] if i < informative else [False, False])
            for i in range(NEEDED)
        )
    )


def _run(informative_per_batch: list[int], **training):
    """One iteration's rollout with the generation batches scripted: (groups to train on, batches drawn, metrics).
    The first batch comes from the same ``sample`` as the refills (a synchronous run)."""
    config = R3Config.dapo_preset().training(group_size=2, queries_per_iteration=NEEDED, **training)
    config.validate()
    metrics = _Metrics()
    coordinator = RolloutCoordinator(None, config, metrics)
    drawn: list[int] = []

    def sample(num_queries, reflection):
        drawn.append(num_queries)
        return _batch(len(drawn), informative_per_batch[len(drawn) - 1])

    coordinator.sample = sample
    groups, _ = coordinator.rollout(None, lambda: None, policy_version=0)
    return groups, drawn, metrics.values


def test_the_batch_fills_within_max_num_gen_batches():
    # One informative group per batch, four needed: the fourth batch fills it, so max 4 is enough.
    groups, drawn, logged = _run([1, 1, 1, 1, 1], max_num_gen_batches=4)
    assert [g.query_id for g in groups] == ["b1q0", "b2q0", "b3q0", "b4q0"]
    assert drawn == [NEEDED] * 4  # every generation batch is queries_per_iteration queries
    assert (logged["dynamic_sampling_gen_batches"], logged["dynamic_sampling_rounds"]) == (4, 3)
    assert logged["dynamic_sampling_passed"] == 4


def test_running_out_of_generation_batches_raises_with_the_counts():
    # Same schedule, max 3: three batches keep 3 of 4 groups, and verl's rule stops the run (no fourth batch).
    with pytest.raises(DynamicSamplingShortfall) as raised:
        _run([1, 1, 1, 1, 1], max_num_gen_batches=3)
    message = str(raised.value)
    assert (
        "kept 3 of the 4 groups" in message
        and "after 3 generation batches (max_num_gen_batches=3)" in message
    )
    assert "max_num_gen_batches" in message and "dynamic_sampling_shortfall='train_on_kept'" in message
    # The first batch counts: max 1 draws no refill at all.
    with pytest.raises(
        DynamicSamplingShortfall, match=r"kept 2 of the 4 groups .* after 1 generation batch \(max"
    ):
        _run([2, 4], max_num_gen_batches=1)


def test_train_on_kept_trains_on_the_groups_that_passed():
    groups, drawn, logged = _run(
        [1, 1, 1, 1], max_num_gen_batches=3, dynamic_sampling_shortfall="train_on_kept"
    )
    assert [g.query_id for g in groups] == ["b1q0", "b2q0", "b3q0"] and len(drawn) == 3
    assert (logged["dynamic_sampling_gen_batches"], logged["dynamic_sampling_passed"]) == (3, 3)
    # Every group filtered: an empty batch (the algorithm then skips the update and warns).
    groups, drawn, _ = _run([0, 0], max_num_gen_batches=2, dynamic_sampling_shortfall="train_on_kept")
    assert groups == [] and len(drawn) == 2


@pytest.mark.parametrize("limit", [0, -1])
def test_max_num_gen_batches_at_or_below_zero_is_no_limit(limit):
    # Eleven batches with nothing informative, then one with four: past the recipe's 10, which would raise.
    schedule = [0] * 11 + [4]
    groups, drawn, logged = _run(schedule, max_num_gen_batches=limit)
    assert [g.query_id for g in groups] == [f"b12q{i}" for i in range(4)] and len(drawn) == 12
    assert logged["dynamic_sampling_gen_batches"] == 12
    with pytest.raises(
        DynamicSamplingShortfall, match=r"kept 0 of the 4 groups .* after 10 generation batches"
    ):
        _run(schedule)  # the preset's max_num_gen_batches=10


def test_the_preset_and_the_default_are_verls_dapo_recipe():
    # recipe/dapo/run_dapo_qwen2.5_32b.sh: max_num_gen_batches=10; dapo_ray_trainer.py raises when they run out.
    for config in (R3Config.dapo_preset(), R3Config()):
        assert (config.max_num_gen_batches, config.dynamic_sampling_shortfall) == (10, "raise")
        assert config.dynamic_sampling_max_rounds is None


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"max_num_gen_batches": 2.5}, "max_num_gen_batches must be an int, got 2.5"),
        ({"max_num_gen_batches": "10"}, "max_num_gen_batches must be"),
        ({"dynamic_sampling_shortfall": "skip"}, "dynamic_sampling_shortfall must be one of"),
        ({"dynamic_sampling_max_rounds": -1}, "dynamic_sampling_max_rounds must be"),
        # The old field counted refills: 3 rounds are 4 batches, not the preset's 10.
        (
            {"dynamic_sampling_max_rounds": 3},
            r"dynamic_sampling_max_rounds=3 \(4 generation batches\) contradicts max_num_gen_batches=10 "
            r"\(10 generation batches\).*set max_num_gen_batches=4",
        ),
        (
            {"dynamic_sampling_max_rounds": 3, "max_num_gen_batches": 0},
            r"contradicts max_num_gen_batches=0 \(no limit\)",
        ),
        (
            {"dynamic_sampling_shortfall": "train_on_kept", "max_num_gen_batches": 0},
            r"dynamic_sampling_shortfall='train_on_kept' with max_num_gen_batches=0 \(no limit\)",
        ),
    ],
)
def test_invalid_or_contradictory_settings_are_refused(training, message):
    with pytest.raises(ValueError, match=message):
        R3Config.dapo_preset().training(**training).validate()


def test_the_old_field_is_accepted_when_it_agrees_or_dynamic_sampling_is_off():
    R3Config.dapo_preset().training(dynamic_sampling_max_rounds=3, max_num_gen_batches=4).validate()
    R3Config.dapo_preset().training(dynamic_sampling_max_rounds=9).validate()  # 10 batches, the preset's
    R3Config.grpo_preset().training(dynamic_sampling_max_rounds=3).validate()  # neither is read

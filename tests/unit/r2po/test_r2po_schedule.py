"""R^2PO's two-stage schedule: which stage trains at each iteration."""

from __future__ import annotations

import pytest

from r3_rllib.r2po.stages import BASE_STAGE, HEAD_STAGE, StagePosition, active_stage, stage_position


def test_head_first_cycles():
    stages = [active_stage(i, head_iters=2, base_iters=3) for i in range(11)]
    assert "".join(stages) == "AABBBAABBBA"
    assert stage_position(0, head_iters=2, base_iters=3) == StagePosition("A", 0, 0)
    assert stage_position(4, head_iters=2, base_iters=3) == StagePosition("B", 0, 2)
    assert stage_position(6, head_iters=2, base_iters=3) == StagePosition("A", 1, 1)
    assert stage_position(1002, head_iters=2, base_iters=3) == StagePosition("B", 200, 0)


def test_base_first_cycles():
    stages = [active_stage(i, head_iters=2, base_iters=3, first=BASE_STAGE) for i in range(11)]
    assert "".join(stages) == "BBBAABBBAAB"
    assert stage_position(3, head_iters=2, base_iters=3, first="B") == StagePosition("A", 0, 0)


def test_one_stage_only():
    assert {active_stage(i, head_iters=0, base_iters=4) for i in range(9)} == {BASE_STAGE}
    assert {active_stage(i, head_iters=4, base_iters=0, first="B") for i in range(9)} == {HEAD_STAGE}
    assert stage_position(9, head_iters=4, base_iters=0) == StagePosition("A", 2, 1)


def test_positions_count_up_inside_each_run():
    # A run restored at any iteration sees the same stage and position as the uninterrupted run.
    prev = None
    for i in range(40):
        pos = stage_position(i, head_iters=3, base_iters=5, first="A")
        if prev is not None and pos.stage == prev.stage:
            assert pos.step_in_stage == prev.step_in_stage + 1
        elif prev is not None:
            assert pos.step_in_stage == 0
        prev = pos


@pytest.mark.parametrize(
    ("iteration", "kwargs", "match"),
    [
        (-1, {"head_iters": 1, "base_iters": 1}, "iteration"),
        (1.5, {"head_iters": 1, "base_iters": 1}, "iteration"),
        (0, {"head_iters": True, "base_iters": 1}, "head_iters"),
        (0, {"head_iters": 1, "base_iters": -2}, "base_iters"),
        (0, {"head_iters": 0, "base_iters": 0}, "both be 0"),
        (0, {"head_iters": 1, "base_iters": 1, "first": "C"}, "first"),
    ],
)
def test_bad_input_is_refused(iteration, kwargs, match):
    with pytest.raises(ValueError, match=match):
        active_stage(iteration, **kwargs)


def test_base_iterations_count_stage_b_for_the_lr_shape():
    """What lr_scheduler_type counts under R^2PO: the base's updates. Head first, 2 + 2: A A B B A A B B -> the
    iterations before each have 0 0 0 1 2 2 2 3 base updates; base first, 3 + 2: B B B A A B ...; a stage of
    length 0 never counts (or counts every iteration)."""
    from r3_rllib import R3Config
    from r3_rllib.core.method import method_for
    from r3_rllib.r2po.stages import BASE_STAGE, base_iterations

    assert [base_iterations(i, head_iters=2, base_iters=2) for i in range(9)] == [0, 0, 0, 1, 2, 2, 2, 3, 4]
    counts = [base_iterations(i, head_iters=2, base_iters=3, first=BASE_STAGE) for i in range(11)]
    assert counts == [0, 1, 2, 3, 3, 3, 4, 5, 6, 6, 6]
    assert [base_iterations(i, head_iters=0, base_iters=2) for i in range(4)] == [0, 1, 2, 3]
    assert [base_iterations(i, head_iters=2, base_iters=0) for i in range(4)] == [0, 0, 0, 0]
    config = R3Config().training(rollout_head=True, rollout_head_head_iters=1, rollout_head_base_iters=3)
    assert [method_for(config).policy_updates(config, i) for i in range(6)] == [0, 0, 1, 2, 3, 3]
    plain = R3Config()
    assert [method_for(plain).policy_updates(plain, i) for i in range(3)] == [0, 1, 2]

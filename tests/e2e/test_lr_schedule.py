"""lr_scheduler_type in a Ray run (the learner in the driver's process, one runner): each iteration's update takes
lr times verl's factor at the iterations before it (a warm-up whose first update runs at 0 and leaves the policy as
it was, then half a cosine down to min_lr_ratio), and a run restored from a checkpoint goes on where it stopped."""

from __future__ import annotations

import math

import pytest

from r3_rllib import R3, R3Config
from r3_rllib.models import default_tiny_model_path

pytestmark = pytest.mark.slow

LR, MIN = 1e-3, 0.2


def test_the_lr_warms_up_decays_and_resumes(ray_session, tmp_path):
    config = (
        R3Config.grpo_preset()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 64, "seed": 0})
        .env_runners(num_env_runners=1)
        .learners(num_learners=0)
        .debugging(seed=0)
        .training(
            model_path=default_tiny_model_path(),
            group_size=4,
            queries_per_iteration=8,
            max_new_tokens=3,
            lr=LR,
            lr_scheduler_type="cosine",
            lr_warmup_steps=2,
            lr_total_steps=4,
            min_lr_ratio=MIN,
        )
    )
    algo = config.build_algo()
    try:
        before = algo.learner_call(lambda learner: learner.parameter_checksum())[0]
        lrs = [algo.train()["learner"]["lr"]]
        after_first = algo.learner_call(lambda learner: learner.parameter_checksum())[0]
        lrs += [algo.train()["learner"]["lr"] for _ in range(2)]
        moved = algo.learner_call(lambda learner: learner.parameter_checksum())[0]
        checkpoint = algo.save(str(tmp_path / "ckpt")).checkpoint.path
    finally:
        algo.stop()
    assert after_first == before and moved != before  # the warm-up's first update ran at lr 0
    restored = R3.from_checkpoint(checkpoint)
    try:
        lrs += [restored.train()["learner"]["lr"] for _ in range(3)]
    finally:
        restored.stop()
    # Updates 0-1: the warm-up (0, 1/2); 2: the top; 3: halfway down the cosine; 4: its end (lr_total_steps); 5:
    # past it, held at the end (verl's cosine would climb again).
    middle = MIN + (1 - MIN) * (1 + math.cos(math.pi / 2)) / 2
    assert lrs == pytest.approx([0.0, LR / 2, LR, LR * middle, LR * MIN, LR * MIN], rel=1e-12, abs=1e-18)

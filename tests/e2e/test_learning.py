"""GRPO on the tiny arithmetic task raises held-out greedy accuracy of the shipped warm-started model.

The margin is asserted against the accuracy measured at the start of the same run (same 500 held-out queries),
not against a fixed number.
"""

from __future__ import annotations

import pytest
from algo_checks import arithmetic_learning_config

pytestmark = pytest.mark.slow


def test_grpo_raises_heldout_accuracy(ray_session):
    config = arithmetic_learning_config()
    algo = config.build_algo()
    try:
        before = algo.evaluate_heldout(500)["accuracy"]
        for _ in range(40):
            algo.train()
        after = algo.evaluate_heldout(500)["accuracy"]
    finally:
        algo.stop()
    print(f"held-out greedy accuracy: {before:.3f} -> {after:.3f}")
    # 500 queries: a standard error of about 0.022 at these accuracies; 0.05 is more than two of them.
    assert after >= before + 0.05, (before, after)

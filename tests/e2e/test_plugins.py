"""A new method is an entry, not a rewrite: an advantage estimator and a policy loss registered from outside the
package, named in the config, train an iteration without any edit of the algorithm, runner or learner."""

from __future__ import annotations

import os

import numpy as np
import pytest

from r3_rllib import R3Config
from r3_rllib.core.advantages import ADVANTAGE_FNS, register_advantage
from r3_rllib.core.losses import LOSS_FNS, aggregate_loss, register_loss

pytestmark = pytest.mark.slow

CALLS: dict[str, int] = {"advantage": 0, "loss": 0}


def test_outside_estimator_and_loss_train_an_iteration(ray_session):
    @register_advantage("test_sign", config_params={"eps": "adv_eps"})
    def sign_advantages(rewards, *, eps):
        CALLS["advantage"] += 1
        r = np.asarray(rewards, dtype=np.float64)
        return np.sign(r - r.mean()) * (1.0 - eps)

    @register_loss("test_reinforce", config_params={"agg_mode": "loss_agg_mode"})
    def reinforce(logprobs, old_logprobs, advantages, mask, *, agg_mode, is_weights=None):
        CALLS["loss"] += 1
        per_token = -advantages.unsqueeze(-1) * logprobs
        if is_weights is not None:
            per_token = per_token * is_weights
        return aggregate_loss(per_token, mask, agg_mode), {"reinforce_tokens": mask.sum().detach()}

    try:
        config = (
            R3Config()
            # The shipped tiny model gets about 40 % of 2-digit sums right: most groups have a contrast.
            .environment("arithmetic", env_config={"digits": 2, "num_queries": 16})
            .env_runners(num_env_runners=1)
            .learners(num_learners=0)  # the learner runs in this process, where the entries are registered
            .training(
                group_size=4,
                queries_per_iteration=8,
                max_new_tokens=5,
                advantage_estimator="test_sign",
                policy_loss="test_reinforce",
            )
            .debugging(seed=0)
        )
        algo = config.build_algo()
        try:
            before = algo.learner_call(lambda learner: learner.parameter_checksum())[0]
            result = algo.train()
            after = algo.learner_call(lambda learner: learner.parameter_checksum())[0]
        finally:
            algo.stop()
    finally:
        del ADVANTAGE_FNS["test_sign"]
        del LOSS_FNS["test_reinforce"]
    assert CALLS["advantage"] >= 8, "every group's advantages come from the registered estimator"
    assert CALLS["loss"] >= 1 and result["learner"]["reinforce_tokens"] > 0, (
        "the loss and its metric are used"
    )
    assert after != before, "the update changed the policy"


def test_path_named_estimator_and_loss_reach_remote_learners(ray_session):
    """``"module:function"`` paths need no registration anywhere: two remote learner actors (fresh processes)
    import the user's module themselves, and the loss's metrics and the estimator's advantages show it ran there."""
    module = "tests.e2e.learner_plugins"  # imported under this one name only (a second name registers twice)
    config = (
        R3Config()
        .environment("arithmetic", env_config={"digits": 2, "num_queries": 16})
        .env_runners(num_env_runners=1)
        .learners(num_learners=2, num_cpus_per_learner=1)
        .training(
            group_size=4,
            queries_per_iteration=8,
            max_new_tokens=5,
            advantage_estimator=f"{module}:marked_advantages",
            policy_loss=f"{module}:marked_reinforce",
        )
        .debugging(seed=0)
    )

    def process_and_plugin_module(learner) -> tuple[int, bool]:  # nested: shipped by value, importing nothing
        import os
        import sys

        return os.getpid(), "tests.e2e.learner_plugins" in sys.modules

    algo = config.build_algo()
    try:
        result = algo.train()
        where = algo.learner_call(process_and_plugin_module)
    finally:
        algo.stop()
    assert len(where) == 2 and os.getpid() not in {pid for pid, _ in where}, "two remote learner actors"
    assert all(imported for _, imported in where), "each learner imported the user's module itself"
    learner = result["learner"]
    assert learner["plugin_loss_ran"] == pytest.approx(1.0), "the user's loss ran in the learners"
    assert learner["plugin_adv_abs_max"] == pytest.approx(0.375), "with the user's estimator's advantages"

"""A user's estimator and loss for tests/e2e/test_plugins.py, named by ``"tests.e2e.learner_plugins:..."`` path: the
remote learner actors import this module themselves (Ray gives them the driver's current directory, the repo
root), so nothing is registered in them first. Their marks show in the learners' metrics."""

from __future__ import annotations

import numpy as np

from r3_rllib.core.losses import aggregate_loss, register_loss

#: The size of every advantage :func:`marked_advantages` gives.
MARK = 0.375


def marked_advantages(rewards, *, eps=0.0):
    """``MARK`` with the sign of the reward against the group mean (+MARK for a tie)."""
    r = np.asarray(rewards, dtype=np.float64)
    return np.where(r >= r.mean(), MARK, -MARK)


@register_loss("learner_plugins_reinforce", config_params={"agg_mode": "loss_agg_mode"})
def marked_reinforce(logprobs, old_logprobs, advantages, mask, *, agg_mode, is_weights=None):
    """REINFORCE; its metrics say it ran in the learner, and the largest advantage size it was given."""
    per_token = -advantages.unsqueeze(-1) * logprobs
    if is_weights is not None:
        per_token = per_token * is_weights
    metrics = {
        "plugin_loss_ran": logprobs.new_tensor(1.0),
        "plugin_adv_abs_max": advantages.abs().max().detach(),
    }
    return aggregate_loss(per_token, mask, agg_mode), metrics

"""An advantage estimator and a policy loss of a user's own module, named in a config by ``"module:function"`` path
(tests/unit/core/test_path_plugins.py, tests/e2e/test_plugins.py). Nothing registers them in the process that looks
them up: the lookup imports this module there. The loss declares its parameters the way a registered one does
(``register_loss(..., config_params=...)``), and a path naming it keeps them."""

from __future__ import annotations

import numpy as np

from r3_rllib.core.losses import aggregate_loss, register_loss

#: The size of every advantage :func:`marked_advantages` gives: recognisable in the loss's inputs.
MARK = 0.375


def marked_advantages(rewards, *, eps=0.0):
    """``MARK`` with the sign of the reward against the group mean (+MARK for a tie): plain, unregistered."""
    r = np.asarray(rewards, dtype=np.float64)
    return np.where(r >= r.mean(), MARK, -MARK) * (1.0 - eps)


@register_loss("path_plugins_reinforce", config_params={"agg_mode": "loss_agg_mode"})
def marked_reinforce(logprobs, old_logprobs, advantages, mask, *, agg_mode, is_weights=None):
    """REINFORCE on the given advantages; its metrics say it ran, and the largest advantage size it saw."""
    per_token = -advantages.unsqueeze(-1) * logprobs
    if is_weights is not None:
        per_token = per_token * is_weights
    metrics = {
        "path_plugin_loss_ran": logprobs.new_tensor(1.0),
        "path_plugin_adv_abs_max": advantages.abs().max().detach(),
    }
    return aggregate_loss(per_token, mask, agg_mode), metrics


#: Not a function: a path naming it is refused.
NOT_A_FUNCTION = 3

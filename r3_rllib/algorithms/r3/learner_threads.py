"""The learner's torch threads during an update (``cpu_threads``, core/threads.py).

An update starts on the cores free at its start and follows them while it runs: hooks on up to :data:`POLL_POINTS`
of the policy's modules (before their forward) and parameters (as their gradient is computed), spread over the
model, poll a :class:`FreeCoreFollower`, which moves the thread count when the cores free change for longer than a
moment. The hooks run on the thread that runs the update (autograd runs a CPU backward on the calling thread), where
``torch.set_num_threads`` applies. They are only installed when the plan exceeds the reservation (a CPU learner with
cores to gain) and removed when the update ends; the hooks change no gradient (they return None).
"""

from __future__ import annotations

from typing import Any

import torch

from r3_rllib.core.mkl_mode import warn_if_mkl_not_strict
from r3_rllib.core.threads import FreeCoreFollower, phase_start_threads

#: The most modules (forward) and parameters (backward) that poll the follower, spread evenly over the model: a
#: reading is due at most every 0.1 s, and hooks on every module and parameter (~1,800 on the shipped tiny model)
#: took 0.9 ms per update to install and remove, and a call each (32 of each: 0.4 ms; BENCHMARKS.md section 35).
POLL_POINTS = 32


def spread(items: list, most: int) -> list:
    """At most ``most`` of ``items``, evenly spaced from the first (all of them when there are no more)."""
    if len(items) <= most:
        return list(items)
    return [items[i * len(items) // most] for i in range(most)]


class UpdateThreads:
    """The threads of one learner's updates: ``start`` at its start where the cores are free, up to ``most`` while
    it runs, ``reserved`` at least."""

    def __init__(self, start: int, most: int, reserved: int) -> None:
        self.start_plan, self.most, self.reserved = start, max(start, most), reserved
        self._follower: FreeCoreFollower | None = None
        self._hooks: list[Any] = []
        if self.most > reserved:  # the thread count moves: the products must not round by it
            warn_if_mkl_not_strict("The learner")

    def start(self, policy: torch.nn.Module) -> None:
        """Set the threads for an update of `policy` starting now, and follow the free cores during it."""
        self.stop()  # an update that raised left its hooks
        threads = phase_start_threads(self.start_plan, self.reserved)
        torch.set_num_threads(threads)
        self._follower = FreeCoreFollower(self.most, self.reserved, threads, torch.set_num_threads)
        if not self._follower.follows:
            return
        poll = self._follower.poll
        modules = [m for m in policy.modules() if next(m.parameters(recurse=False), None) is not None]
        for module in spread(modules, POLL_POINTS):
            self._hooks.append(module.register_forward_pre_hook(lambda *_: poll()))
        if torch.distributed.is_initialized():
            return  # sharded (FSDP2) parameters get their gradients outside autograd: the forwards poll alone
        trainable = [p for p in policy.parameters() if p.requires_grad]
        for param in spread(trainable, POLL_POINTS):
            self._hooks.append(param.register_hook(lambda _grad: poll()))  # None: the gradient as it is

    def stop(self) -> float:
        """Remove the hooks; the threads the update ran on, averaged over its time (0 before any update)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        follower, self._follower = self._follower, None
        return follower.mean_threads() if follower is not None else 0.0

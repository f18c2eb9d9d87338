"""The learner's log-probs of the rows it trained, kept for the driver's sample records (sample_log.py).

No extra forward pass: each rank keeps the proximal ("old") log-probs its update computes anyway, those of the
policy before the update's first optimizer step (the training forward of the first minibatch, or the no-grad pass
that scores the later ones), with the mask of the tokens it trains (tool output excluded): the micro-batch's tensors
themselves, on the device (picking the tokens out there would wait for the device; that is done when the driver
asks). The driver asks for the rows it records after the update (:meth:`ProximalRowsMixin.proximal_logprobs`); each
rank answers for its own rows. Nothing is kept while the run records no samples (sample_log_fraction 0).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch


class ProximalRowsMixin:
    """Keeps the proximal log-probs of the last update's rows on an ``R3Learner`` (see the module docstring)."""

    def _reset_proximal_rows(self) -> None:
        self._proximal_rows: list[tuple[np.ndarray, torch.Tensor, torch.Tensor]] = []
        self._proximal_seen: set[int] = set()

    def _keep_proximal_rows(self, idx: np.ndarray, real: bool, old: torch.Tensor, mask: torch.Tensor) -> None:
        """Keep rows ``idx``'s proximal log-probs ``old`` and their trained positions ``mask`` the first time the
        update scores them (every epoch scores the same micro-batches)."""
        if not real or float(getattr(self.config, "sample_log_fraction", 0.0) or 0.0) <= 0:
            return
        if not hasattr(self, "_proximal_seen"):
            self._reset_proximal_rows()
        if int(idx[0]) in self._proximal_seen:
            return
        self._proximal_seen.update(int(i) for i in idx)
        self._proximal_rows.append((np.asarray(idx).copy(), old.detach(), mask))

    def proximal_logprobs(self, rows: Iterable[int]) -> dict[int, np.ndarray]:
        """Batch row -> the proximal log-probs (float32) of its trained tokens, in order, for the ``rows`` this rank
        trained in the last update."""
        wanted = {int(r) for r in rows}
        out: dict[int, np.ndarray] = {}
        for idx, old, mask in getattr(self, "_proximal_rows", []):
            if not wanted.intersection(int(i) for i in idx):
                continue
            values, trained = old.float().cpu().numpy(), mask.bool().cpu().numpy()
            for j, i in enumerate(idx):
                if int(i) in wanted:
                    out[int(i)] = values[j][trained[j]]
        return out

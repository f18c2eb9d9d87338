"""A KV cache for the HF engine's decode loop that is allocated once per batch instead of grown every step.

transformers' `DynamicCache` appends each new token's keys and values with `torch.cat`, which copies the whole
cache at every step of every layer: quadratic in the response length. Here each layer gets a buffer of
`prompt width + max_new_tokens` positions at prefill and later tokens are written in place; attention reads a view
of the filled part. Dropping finished rows (`reorder_cache`) copies the filled part once, as `DynamicCache` does.

Only for models whose layers all use full attention (sliding-window and linear-attention layers keep transformers'
own caches); `preallocated_cache` returns None otherwise.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One layer's keys and values in a fixed-capacity buffer ([batch, heads, capacity, head_dim])."""

    def __init__(self, capacity: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.capacity = capacity
        self.length = 0
        self._key_buf: torch.Tensor | None = None
        self._value_buf: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self._key_buf is None:
            shape = (*key_states.shape[:-2], max(self.capacity, n), key_states.shape[-1])
            self._key_buf = key_states.new_empty(shape)
            self._value_buf = value_states.new_empty(shape[:-1] + (value_states.shape[-1],))
        if self.length + n > self._key_buf.shape[-2]:
            raise RuntimeError(
                f"KV cache capacity {self._key_buf.shape[-2]} exceeded ({self.length} cached + {n} new positions)"
            )
        self._key_buf[:, :, self.length : self.length + n] = key_states
        self._value_buf[:, :, self.length : self.length + n] = value_states
        self.length += n
        self.keys = self._key_buf[:, :, : self.length]
        self.values = self._value_buf[:, :, : self.length]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep (or repeat) the rows `beam_idx`: the filled part is copied into a new buffer of the same capacity."""
        if self._key_buf is None:
            return
        idx = beam_idx.to(self._key_buf.device)
        for name in ("_key_buf", "_value_buf"):
            old = getattr(self, name)
            new = old.new_empty((len(idx), *old.shape[1:]))
            new[:, :, : self.length] = old[:, :, : self.length].index_select(0, idx)
            setattr(self, name, new)
        self.keys = self._key_buf[:, :, : self.length]
        self.values = self._value_buf[:, :, : self.length]

    def reset(self) -> None:
        self.length = 0
        self._key_buf = self._value_buf = None
        super().reset()


def preallocated_cache(config: Any, capacity: int) -> Cache | None:
    """A cache of `PreallocatedLayer`s for `config`'s decoder layers, or None when a layer is not full attention."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(text_config, "layer_types", None)
    num_layers = getattr(text_config, "num_hidden_layers", None)
    if num_layers is None:
        return None
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return None
    if getattr(text_config, "use_sliding_window", False) and getattr(text_config, "sliding_window", None):
        return None
    return Cache(layers=[PreallocatedLayer(capacity) for _ in range(num_layers)])

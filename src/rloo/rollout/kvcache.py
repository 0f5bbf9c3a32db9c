"""A KV cache for decoding that writes each new token in place instead of concatenating.

transformers' DynamicLayer grows by `torch.cat` every step, which copies the whole cache:
O(T * N * (P+T)) bytes per layer over a generation. With N = 32 rows and 450-token prompts that
copying costs more than the attention itself on a CPU. Here the buffer is allocated once with room
for `max_new_tokens` and each step writes one column; the layer hands attention a view of the
filled part. The numbers are the same as with DynamicLayer (same keys/values, same order).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """A DynamicLayer whose storage has spare columns; `keys`/`values` are views of the filled part."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, extra: int):
        super().__init__()
        n, h, length, d = keys.shape
        self._k = keys.new_empty(n, h, length + extra, d)
        self._v = values.new_empty(n, h, length + extra, d)
        self._k[:, :, :length] = keys
        self._v[:, :, :length] = values
        self.length, self.device, self.is_initialized = length, keys.device, True
        self._view()

    def _view(self) -> None:
        self.keys, self.values = self._k[:, :, :self.length], self._v[:, :, :self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        new = key_states.shape[-2]
        if self.length + new > self._k.shape[2]:  # out of room: fall back to growing
            return super().update(key_states, value_states)
        self._k[:, :, self.length:self.length + new] = key_states
        self._v[:, :, self.length:self.length + new] = value_states
        self.length += new
        self._view()
        return self.keys, self.values


def preallocate(cache, extra: int) -> None:
    """Give every (plain dynamic) layer of `cache` room for `extra` more tokens, in place."""
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.numel():
            cache.layers[i] = PreallocatedLayer(layer.keys, layer.values, extra)

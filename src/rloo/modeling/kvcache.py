"""A KV cache for decoding that writes each new token in place instead of concatenating.

transformers' DynamicLayer grows by `torch.cat` every step, which copies the whole cache:
O(T * N * (P+T)) bytes per layer over a generation. With N = 32 rows and 450-token prompts that
copying costs more than the attention itself on a CPU. Here the buffer is allocated once with room
for `max_new_tokens` and each step writes one column; the layer hands attention a view of the
filled part. The numbers are the same as with DynamicLayer (same keys/values, same order).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rloo.data.collate import position_ids
from rloo.modeling.dropout import has_dropout  # noqa: F401 - re-exported (the sampler's import)
from rloo.modeling.layer_checkpoint import prefix_cache


class PreallocatedLayer(DynamicLayer):
    """A DynamicLayer whose storage has spare columns; `keys`/`values` are views of the filled part."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, extra: int, dtype: torch.dtype | None = None):
        super().__init__()
        n, h, length, d = keys.shape
        self._k = keys.new_empty(n, h, length + extra, d, dtype=dtype or keys.dtype)
        self._v = values.new_empty(n, h, length + extra, d, dtype=dtype or values.dtype)
        self._k[:, :, :length] = keys
        self._v[:, :, :length] = values
        self.length, self.device, self.is_initialized = length, keys.device, True
        self._view()

    def _view(self) -> None:
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        new = key_states.shape[-2]
        if self.length + new > self._k.shape[2]:  # out of room: fall back to growing
            return super().update(key_states, value_states)
        self._k[:, :, self.length : self.length + new] = key_states
        self._v[:, :, self.length : self.length + new] = value_states
        self.length += new
        self._view()
        return self.keys, self.values


def preallocate(cache, extra: int, dtype: torch.dtype | None = None) -> None:
    """Give every (plain dynamic) layer of `cache` room for `extra` more tokens, in place. `dtype`:
    store keys and values in it (fp32 for rloo_sdpa's fp32 attention under CPU autocast, which then
    reads the cache without casting it every step; bf16 values are exact in fp32)."""
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.numel():
            cache.layers[i] = PreallocatedLayer(layer.keys, layer.values, extra, dtype)


def cache_kwarg(model) -> str:
    # transformers renamed past_key_values -> cache; accept both generations of the API.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@dataclass
class Prefill:
    """The policy's pass over the B distinct prompts (B,P): its KV cache and the logits at each
    prompt's last position (B,V). Computed with autograd on, generation uses a detached copy and
    the policy-gradient pass reuses it, so the prompt's forward pass runs once per step and its
    backward pass runs through this graph. Valid only while the weights are unchanged."""

    ids: Tensor
    mask: Tensor
    cache: DynamicCache
    last_logits: Tensor


def prefill_prompts(model, ids: Tensor, mask: Tensor) -> Prefill:
    """The model's pass over the prompts (B,P). Its cache layers are PrefixLayers (replay-safe under
    rloo.modeling.layer_checkpoint); sampling decodes into a fresh copy (`expanded`), never into this one."""
    cache = prefix_cache()
    out = model(
        input_ids=ids,
        attention_mask=mask.long(),
        position_ids=position_ids(mask),
        use_cache=True,
        logits_to_keep=1,
        **{cache_kwarg(model): cache},
    )
    return Prefill(ids, mask, cache, out.logits[:, -1])


def expanded(cache: DynamicCache, k: int) -> DynamicCache:
    """A new, detached cache holding each row of `cache` k times (rows i*k .. i*k+k-1 copy row i),
    for sampling. (The training passes index the prompt cache under autograd instead:
    rloo.modeling.forward_shared._group_rows.)"""
    pairs = [(layer.keys.detach(), layer.values.detach()) for layer in cache.layers]
    return DynamicCache(ddp_cache_data=[(kk.repeat_interleave(k, 0), vv.repeat_interleave(k, 0)) for kk, vv in pairs])

"""A static KV cache for a fixed-shape decode step (rloo.rollout.captured_step): every layer's keys
and values in one (N, Hkv, L, D) buffer allocated once, L = a prompt bucket Pb + max_new_tokens,
written at a column held in a device tensor, so the step's shapes and addresses never change and
a CUDA graph of it can be replayed.

Layout of a row: its left-padded prompt (P <= Pb columns, the prefill's keys/values), unused
columns up to Pb, then its generated tokens at Pb + t. The step attends over all L columns through
a (N, 1, 1, L) boolean mask (True = attend): the prompt's mask, then True at each column once it is
written. Column order does not matter to attention (positions come from `position_ids`, and the
keys are stored rotated), so this is the same attention as the eager loop's cache of P + t
columns, summed over more (masked, zero-weight) terms.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rloo.modeling.cache_layers import kv, set_layers

# Prompt lengths are rounded up to a multiple of this, so batches of similar prompt lengths share
# one captured step (its cache shape); the unused columns are masked.
PROMPT_BUCKET = 32


def prompt_bucket(length: int) -> int:
    """The static cache's prompt columns for a P-token (left-padded) prompt batch: P rounded up."""
    return -(-length // PROMPT_BUCKET) * PROMPT_BUCKET


def kv_dtype(cache: DynamicCache) -> torch.dtype:
    """The dtype of a (prefill) cache's keys."""
    return kv(cache.layers[0])[0].dtype


class StaticDecodeLayer(DynamicLayer):
    """One layer's (N, Hkv, L, D) keys and values; `update` writes the step's one new column at
    `col` ((1,) long, shared by every layer) and hands attention the whole buffer."""

    def __init__(self, keys: Tensor, values: Tensor, col: Tensor):
        super().__init__()
        self.keys, self.values, self.col = keys, values, col
        self.device, self.is_initialized = keys.device, True

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = kv(self)
        keys.index_copy_(2, self.col, key_states.to(keys.dtype))
        values.index_copy_(2, self.col, value_states.to(values.dtype))
        return keys, values

    def get_seq_length(self) -> int:
        # only sizes a mask transformers does not build here (the step passes a 4D mask)
        return kv(self)[0].shape[2]


class StaticCache:
    """The buffers of a static decode cache over N rows and L columns, and the DynamicCache the model
    is called with (`cache`). `mask` (N, 1, 1, L) bool and `col` (1,) long are the step's inputs."""

    def __init__(self, prefill: DynamicCache, n: int, length: int, dtype: torch.dtype | None = None):
        pairs = [kv(layer) for layer in prefill.layers]
        device = pairs[0][0].device
        self.col = torch.zeros(1, dtype=torch.long, device=device)
        self.mask = torch.zeros(n, 1, 1, length, dtype=torch.bool, device=device)
        # zeros, not empty: masked columns still enter q.k and p.v, and garbage there could be NaN
        self.kv = [
            tuple(torch.zeros(n, t.shape[1], length, t.shape[3], dtype=dtype or t.dtype, device=device) for t in pair)
            for pair in pairs
        ]
        self.cache = set_layers(DynamicCache(), [StaticDecodeLayer(k, v, self.col) for k, v in self.kv])

    def fits(self, prefill: DynamicCache) -> bool:
        """Whether `prefill`'s layers (their heads, head size and dtype) fit these buffers."""
        return len(prefill.layers) == len(self.kv) and all(
            keys.shape[1] == k.shape[1] and keys.shape[3] == k.shape[3]
            for (keys, _), (k, _) in zip(map(kv, prefill.layers), self.kv, strict=True)
        )

    def fill(self, prefill: DynamicCache, prompt_mask: Tensor, k: int, start: int) -> None:
        """Load B prompts' keys/values (B, Hkv, P, D) for N = B*k rows (rows i*k .. i*k+k-1 continue
        prompt i, as `rloo.modeling.kvcache.expanded`), their (B, P) mask, and the first generated
        column `start` (>= P), in place."""
        b, p = prompt_mask.shape
        for layer_kv, pair in zip(map(kv, prefill.layers), self.kv, strict=True):
            for src, buf in zip(layer_kv, pair, strict=True):
                n, h, length, d = buf.shape
                buf.view(b, k, h, length, d)[:, :, :, :p].copy_(src.detach().unsqueeze(1))
        self.mask.zero_()
        self.mask.view(b, k, self.mask.shape[-1])[:, :, :p].copy_(prompt_mask.bool().unsqueeze(1))
        self.col.fill_(start)

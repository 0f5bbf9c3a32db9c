"""What rloo reads of transformers' KV cache, typed.

transformers types `DynamicCache.layers` as a list of any layer kind (full attention, linear
attention, dummy) and `keys`/`values` as `Tensor | None` (None before the first update). rloo's
caches hold attention layers that have been filled (a prefill's, or its own layer classes), so the
passes read two tensors per layer: `kv` says that once, for the type checker, instead of at each use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin


class FilledLayer(Protocol):
    """An attention cache layer after its first update: keys and values (n, heads, length, head_dim)."""

    keys: Tensor
    values: Tensor


def kv(layer: object) -> tuple[Tensor, Tensor]:
    """(keys, values) of a filled attention layer of one of rloo's caches (see the module docstring)."""
    filled = cast(FilledLayer, layer)
    return filled.keys, filled.values


def set_layers(cache: DynamicCache, layers: Sequence[CacheLayerMixin]) -> DynamicCache:
    """`cache` holding `layers` (rloo's own layer classes) in place of its own, returned. Slice
    assignment, because transformers declares `layers` an (invariant) list of a union of layer kinds."""
    cache.layers[:] = layers
    return cache

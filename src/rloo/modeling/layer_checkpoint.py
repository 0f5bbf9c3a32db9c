"""Gradient checkpointing that keeps the prompt's KV cache (the shared-prompt passes).

transformers' checkpointing drops the cache inside checkpointed decoder layers (it must: a
DynamicLayer appends on every call, so the replay in backward would append the tokens twice), and
GPT-2 drops it for the whole model. The shared pass (`rloo.modeling.forward_shared`) runs completions
against their prompt's cache, so under transformers' checkpointing they would run without their
prompt: wrong log-probs and gradients, or a shape error with padded prompts.

Here, for the duration of a shared pass:
  - transformers' own checkpointing is switched off, and each decoder layer is checkpointed by us
    (non-reentrant `torch.utils.checkpoint`, which also carries gradients to tensors the layer
    reads from outside its arguments, such as the prompt's keys/values);
  - the cache's layers are `PrefixLayer`s: `update` returns cat(fixed prefix, new) and never
    appends to what an earlier call stored, so the replay of a layer in backward sees exactly the
    keys/values of the forward pass.
The result is the same computation as without checkpointing; the prompt is still computed once
per group. A model whose checkpointing does not go through transformers' GradientCheckpointingLayer
(old or remote-code models) cannot be checkpointed this way: `supports_shared_checkpointing` says
so and the caller falls back to the plain pass (rloo.modeling.forward_shared).
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer

from rloo.modeling.cache_layers import set_layers


class PrefixLayer(DynamicLayer):
    """A cache layer for ONE forward pass over new tokens after a fixed prefix (possibly empty).
    `update(k, v)` returns (cat(prefix_k, k), cat(prefix_v, v)) and stores it as `keys`/`values`
    (what a DynamicLayer would hold), but a second call recomputes from the prefix instead of
    appending: the replay of a checkpointed layer gives the forward's keys/values again.
    Not for decoding (each call replaces the previous one's tokens)."""

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None):
        super().__init__()
        self.prefix = None if keys is None or values is None else (keys, values)
        if keys is not None:
            self.keys, self.values, self.device, self.is_initialized = keys, values, keys.device, True

    def update(self, key_states, value_states, *args, **kwargs):
        if self.prefix is None:
            self.keys, self.values = key_states, value_states
        else:
            self.keys = torch.cat([self.prefix[0], key_states], dim=-2)
            self.values = torch.cat([self.prefix[1], value_states], dim=-2)
        self.device, self.is_initialized = key_states.device, True
        return self.keys, self.values


def prefix_cache(pairs: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> DynamicCache:
    """A cache of PrefixLayers: with `pairs`, layer i's prefix is pairs[i] (keys, values), each
    (n, heads, P, head_dim); without, an empty cache that creates prefix-less layers as needed."""
    cache = DynamicCache()
    if pairs is None:
        cache.layer_class_to_replicate = PrefixLayer
    else:
        cache.layer_class_to_replicate = None
        set_layers(cache, [PrefixLayer(k, v) for k, v in pairs])
    return cache


def _checkpointing(model) -> list[torch.nn.Module]:
    # getattr: third-party modules: transformers sets the flag on some of them
    return [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]


def supports_shared_checkpointing(model) -> bool:
    """False when the model has gradient checkpointing on but no transformers GradientCheckpointingLayer
    to checkpoint ourselves (then the shared pass cannot keep the prompt cache exactly)."""
    flagged = _checkpointing(model)
    return not flagged or any(isinstance(m, GradientCheckpointingLayer) for m in flagged)


def _layer_forward(layer: GradientCheckpointingLayer):
    """The layer class's own forward, under transformers' checkpointing wrapper: the replay in
    backward runs after our context has ended, when the wrapper would drop the cache again."""
    fn = type(layer).forward
    if fn.__code__.co_name == "forward_with_checkpointing":
        fn = fn.__wrapped__
    return fn


def _checkpointed_forward(layer: GradientCheckpointingLayer):
    plain = _layer_forward(layer)

    def forward(*args, **kwargs):
        # also in eval mode: the sampling prefill kept for the update is made in eval mode, with grad
        if torch.is_grad_enabled():
            # non-reentrant: gradients also reach the cache's prefix tensors, which are no arguments
            return checkpoint(partial(plain, layer, **kwargs), *args, use_reentrant=False)
        return plain(layer, *args, **kwargs)

    return forward


@contextmanager
def cache_keeping_checkpointing(model):
    """Within: every decoder layer that transformers would checkpoint is checkpointed by us with its
    cache kept (use PrefixLayer caches, `prefix_cache`); transformers' own checkpointing is off.
    A model without checkpointing is left as it is."""
    flagged = _checkpointing(model)
    layers = [m for m in flagged if isinstance(m, GradientCheckpointingLayer)]
    try:
        # (the ignores: nn.Module.__setattr__ is annotated for tensors and modules; a bool flag is fine)
        for m in flagged:
            m.gradient_checkpointing = False  # pyright: ignore[reportArgumentType]
        for m in layers:
            m.forward = _checkpointed_forward(m)
        yield
    finally:
        for m in layers:
            m.__dict__.pop("forward", None)
        for m in flagged:
            m.gradient_checkpointing = True  # pyright: ignore[reportArgumentType] - a bool flag, as above

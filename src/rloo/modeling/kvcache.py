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
from typing import Any, cast

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rloo.data.collate import position_ids
from rloo.modeling.attention import uses_rloo_attention
from rloo.modeling.cache_layers import kv, set_layers
from rloo.modeling.dropout import has_dropout  # noqa: F401 - re-exported (the sampler's import)
from rloo.modeling.forward import lm_logits
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

    def _grow(self, columns: int) -> None:
        self._k, self._v = (self._grown(old, columns) for old in (self._k, self._v))

    def _grown(self, old: Tensor, columns: int) -> Tensor:
        grown = old.new_empty(*old.shape[:2], columns, old.shape[3])
        grown[:, :, : self.length] = old[:, :, : self.length]
        return grown

    def update(self, key_states, value_states, *args, **kwargs):
        new = key_states.shape[-2]
        if self.length + new > self._k.shape[2]:  # out of room: twice the storage, copied once
            self._grow(max(2 * self._k.shape[2], self.length + new))
        self._k[:, :, self.length : self.length + new] = key_states
        self._v[:, :, self.length : self.length + new] = value_states
        self.length += new
        self._view()
        return self.keys, self.values


class GroupedLayer(DynamicLayer):
    """Decoding k continuations of each of B prompts without k copies of the prompt ("cascade"
    attention): the prompt's keys/values once, (B,Hkv,P,D), and the N = B*k rows' own generated
    keys/values in a preallocated (N,Hkv,T,D) buffer. `update` stores and returns only the rows'
    own part (`keys`/`values`); the attention function (rloo.modeling.attention.grouped_attention)
    reads the prompt part from here. Sequence length, and so the mask transformers builds, is P + t."""

    def __init__(self, keys: Tensor, values: Tensor, k: int, extra: int, dtype: torch.dtype | None = None):
        super().__init__()
        b, h, length, d = keys.shape
        dtype = dtype or keys.dtype
        # contiguous once: the prefill's keys are a transposed view of the projection's output, and a
        # matmul on that view would copy it at every decode step
        self.prefix_keys = keys.detach().to(dtype).contiguous()
        self.prefix_values = values.detach().to(dtype).contiguous()
        self.group, self.prefix_length = k, length
        self._k = keys.new_empty(b * k, h, extra, d, dtype=dtype)
        self._v = values.new_empty(b * k, h, extra, d, dtype=dtype)
        self.length, self.device, self.is_initialized = 0, keys.device, True
        self._view()

    def _view(self) -> None:
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        new = key_states.shape[-2]
        if self.length + new > self._k.shape[2]:
            raise RuntimeError(f"GroupedLayer holds {self._k.shape[2]} generated tokens; asked for more")
        self._k[:, :, self.length : self.length + new] = key_states
        self._v[:, :, self.length : self.length + new] = value_states
        self.length += new
        self._view()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.prefix_length + self.length


class GroupedPassLayer(DynamicLayer):
    """The training passes' counterpart of GroupedLayer: ONE forward pass of N = B*k rows' tokens
    after their prompts' keys/values, held once (B,Hkv,P,D) with their graph, so gradients of the k
    rows reach the single copy through the attention's matmuls (no (N,Hkv,P,D) copy is made).
    `update` returns the new tokens' keys/values and never appends, so the replay of a checkpointed
    layer (rloo.modeling.layer_checkpoint) sees the forward's again."""

    def __init__(self, keys: Tensor, values: Tensor, k: int):
        super().__init__()
        # contiguous once: matmuls on the prefill's transposed view would copy it at every call
        self.prefix_keys, self.prefix_values = keys.contiguous(), values.contiguous()
        self.group, self.prefix_length = k, keys.shape[2]
        self.keys, self.values = keys.new_empty(0), values.new_empty(0)
        self.device, self.is_initialized = keys.device, True

    def update(self, key_states, value_states, *args, **kwargs):
        self.keys, self.values = key_states, value_states
        return key_states, value_states

    def get_seq_length(self) -> int:
        return self.prefix_length


def grouped_pass_cache(prompt_cache: DynamicCache, prompts: Tensor, k: int) -> DynamicCache:
    """A cache for one pass of len(prompts)*k rows, rows i*k .. i*k+k-1 continuing prompt
    prompts[i] of `prompt_cache` (its B-row prompt pass, graph kept); see GroupedPassLayer."""
    pairs = [kv(layer) for layer in prompt_cache.layers]
    return set_layers(DynamicCache(), [GroupedPassLayer(keys[prompts], values[prompts], k) for keys, values in pairs])


def grouped_cache(prefill: DynamicCache, k: int, extra: int, dtype: torch.dtype | None = None) -> DynamicCache:
    """A decoding cache over `prefill`'s B prompts for N = B*k rows (rows i*k .. i*k+k-1 continue
    prompt i) that keeps each prompt's keys/values once: the same attention as `expanded`, reading
    the prompt k times less (rloo.modeling.attention.grouped_attention; the model must run on
    rloo_sdpa and be called with `rloo_grouped=<this cache>`)."""
    pairs = [kv(layer) for layer in prefill.layers]
    return set_layers(DynamicCache(), [GroupedLayer(keys, values, k, extra, dtype) for keys, values in pairs])


# Grouped attention pays once the expanded prompt cache would be large: measured on this project's
# CPU (docs/bench.md, "Grouped attention"; benchmarks/grouped_decoding.py), one decode step's attention
# with 32 rows, 8 heads of 64 and k = 4: N*Hkv*P*D = 1.05M elements per layer (P = 64) 1.24x the time of
# SDPA over the expanded cache, 2.1M (P = 128) 0.59x, 4.2M 0.30x, 7.5M (P = 460) 0.42x; the built-in
# tasks' small shapes (0.08-0.33M) 1.8-4.1x slower (a few more, smaller ops per call).
GROUPED_MIN_ELEMENTS = 2**21


def grouped_pays(prefill: DynamicCache, k: int) -> bool:
    """Would grouped attention beat the expanded cache: k > 1 and the expanded prompt cache would hold
    at least GROUPED_MIN_ELEMENTS per layer."""
    if k < 2 or not prefill.layers:
        return False
    keys, _ = kv(prefill.layers[0])
    return keys.dim() == 4 and keys.numel() * k >= GROUPED_MIN_ELEMENTS


def grouped_ok(model, cache: DynamicCache, k: int) -> bool:
    """Can and should the completions attend to one copy of their prompt's keys/values (grouped
    attention, rloo.modeling.attention.grouped_attention): a CPU model on rloo_sdpa and a prompt
    cache large enough for it to pay (`grouped_pays`). (A layer with attention dropout to apply
    expands the keys itself: rloo_sdpa.)"""
    layers = cache.layers
    on_cpu = bool(layers) and kv(layers[0])[0].device.type == "cpu"
    return on_cpu and uses_rloo_attention(model) and grouped_pays(cache, k)


def preallocate(cache: DynamicCache, extra: int, dtype: torch.dtype | None = None) -> None:
    """Give every (plain dynamic) layer of `cache` room for `extra` more tokens, in place. `dtype`:
    store keys and values in it (fp32 for rloo_sdpa's fp32 attention under CPU autocast, which then
    reads the cache without casting it every step; bf16 values are exact in fp32)."""
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer and layer.is_initialized and kv(layer)[0].numel():
            cache.layers[i] = PreallocatedLayer(*kv(layer), extra, dtype)


def cache_kwarg(model: Any) -> str:
    """The name the model's forward takes its KV cache by: transformers renamed past_key_values ->
    cache (the old name warns, and goes in 5.40); accept both generations of the API. Wrappers that
    pass keywords through (PEFT, DDP) are looked through to the model they wrap."""
    for _ in range(4):
        # getattr: third-party wrappers: PEFT has get_base_model, DDP/FSDP `module`
        inner = model.get_base_model() if hasattr(model, "get_base_model") else getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module) or inner is model:
            break
        model = cast(Any, inner)  # a PEFT or DDP wrapper's attributes are not nn.Module's: keep it untyped
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@dataclass
class Prefill:
    """The policy's pass over the B distinct prompts (B,P): its KV cache and the float32 logits at each
    prompt's last position (B,V) (`rloo.modeling.forward.lm_logits`: an fp32 head under autocast).
    Computed with autograd on, generation uses a detached copy and the policy-gradient pass reuses
    it, so the prompt's forward pass runs once per step and its backward pass runs through this
    graph. Valid only while the weights are unchanged."""

    ids: Tensor
    mask: Tensor
    cache: DynamicCache
    last_logits: Tensor


def prefill_prompts(model, ids: Tensor, mask: Tensor) -> Prefill:
    """The model's pass over the prompts (B,P). Its cache layers are PrefixLayers (replay-safe under
    rloo.modeling.layer_checkpoint); sampling decodes into a fresh copy (`expanded`), never into this one."""
    cache = prefix_cache()
    logits, _ = lm_logits(
        model,
        1,
        input_ids=ids,
        attention_mask=mask.long(),
        position_ids=position_ids(mask),
        use_cache=True,
        **{cache_kwarg(model): cache},
    )
    return Prefill(ids, mask, cache, logits[:, -1])


def expanded(cache: DynamicCache, k: int) -> DynamicCache:
    """A new, detached cache holding each row of `cache` k times (rows i*k .. i*k+k-1 copy row i),
    for sampling. (The training passes index the prompt cache under autograd instead:
    rloo.modeling.forward_shared._group_rows.)"""
    pairs = [(keys.detach(), values.detach()) for keys, values in map(kv, cache.layers)]
    return DynamicCache(ddp_cache_data=[(kk.repeat_interleave(k, 0), vv.repeat_interleave(k, 0)) for kk, vv in pairs])


def row_cache(cache: DynamicCache, rows: Tensor, extra: int) -> DynamicCache:
    """A new cache of `rows` of `cache` (copies of their keys/values, room for `extra` more tokens):
    a forward pass of those rows alone, whose new columns `append_columns` writes back."""
    pairs = [(keys[rows], values[rows]) for keys, values in map(kv, cache.layers)]
    out = DynamicCache(ddp_cache_data=pairs)
    preallocate(out, extra)
    return out


def append_columns(cache: DynamicCache, rows: Tensor, sub: DynamicCache, width: int) -> None:
    """Append `width` columns to every row of `cache` (PreallocatedLayers), in place: for `rows` the
    last `width` columns of `sub` (their `row_cache` after a pass of `width` tokens), zeros for the
    other rows (holes the attention mask hides)."""
    # the caller's cache was made by `preallocate` (row_cache's docstring): its layers are ours
    layers = cast("list[PreallocatedLayer]", cache.layers)
    for layer, part in zip(layers, map(kv, sub.layers), strict=True):
        end = layer.length + width
        if end > layer._k.shape[2]:
            layer._grow(max(2 * layer._k.shape[2], end))
        for store, new in zip((layer._k, layer._v), part, strict=True):
            store[:, :, layer.length : end] = 0
            store[rows, :, layer.length : end] = new[:, :, -width:].to(store.dtype)
        layer.length = end
        layer._view()

"""Attention for CPU mixed precision: transformers' SDPA attention, run in fp32 on a CPU under bf16 autocast.

torch's CPU scaled_dot_product_attention is slower in bf16 than in fp32 on both machine kinds this
project runs on (AVX-512 with AVX512_BF16, torch 2.13, 1 thread, docs/precision.md): a decode step's
attention over a 460-token cache (32 rows, 8 heads of 64) 6.8 ms fp32 vs 17.8-21.9 ms bf16; a
460-token causal forward + backward 215 vs 260 ms; an 80-token one 36 vs 93 ms. Under autocast
every attention call would run in bf16 (autocast casts SDPA's inputs to the lower precision), so
rloo's models use this function (`use_rloo_attention`): on a CPU it casts a bf16 query, key and
value to fp32 and runs SDPA with autocast off, returning the output in the dtype SDPA would have; anywhere
else (fp32, CUDA) it is transformers' own SDPA, called unchanged (the same numbers bit for bit:
tests/equivalence/test_attention.py). The matmuls around it (projections, MLP, head) stay bf16.

It also serves the sampler's grouped decoding (`grouped_attention`, rloo.modeling.kvcache.GroupedLayer):
the k samples of one prompt attend to one copy of the prompt's keys and values instead of k copies.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rloo.runtime.inputs.hf import hf_config

NAME = "rloo_sdpa"


def _cpu_low_precision(*tensors: torch.Tensor) -> bool:
    """On a CPU, would SDPA run in a 16-bit dtype: under autocast (which casts its inputs down, whatever
    their dtype: rotary embeddings hand it fp32 queries and keys), or on 16-bit inputs?"""
    if tensors[0].device.type != "cpu":
        return False
    return torch.is_autocast_enabled("cpu") or any(t.dtype in (torch.bfloat16, torch.float16) for t in tensors)


def grouped_attention(query, keys, values, prefix_keys, prefix_values, mask, scaling=None):
    """Attention of N = B*k rows over [their prompt; their own tokens], each prompt's keys read once.

    query (N,H,Q,D); keys/values (N,Hkv,t,D): each row's own (generated) tokens; prefix_keys/values
    (B,Hkv,P,D): prompt i's keys for rows i*k .. i*k+k-1; mask: None, bool (N,1|H,Q,P+t) (True =
    attend) or additive float, over the concatenated positions, as SDPA takes it; H = Hkv * rep (GQA).
    Returns (N,Q,H,D). The same numbers as softmax(q [K_prompt; K_own]^T * scaling + mask) [V_prompt;
    V_own] over the expanded cache (one softmax over both parts), in a different summation order.
    """
    n, h, q_len, d = query.shape
    b, h_kv, p_len, _ = prefix_keys.shape
    k, rep, t = n // b, h // h_kv, keys.shape[2]
    scaling = d**-0.5 if scaling is None else scaling
    # queries grouped by (prompt, kv head): (B, Hkv, k*rep*Q, D), so one matmul per prompt and head
    qg = query.reshape(b, k, h_kv, rep, q_len, d).permute(0, 2, 1, 3, 4, 5).reshape(b, h_kv, k * rep * q_len, d)
    s_prefix = (qg @ prefix_keys.transpose(-1, -2)).view(b, h_kv, k, rep, q_len, p_len)
    s_prefix = s_prefix.permute(0, 2, 1, 3, 4, 5).reshape(n, h, q_len, p_len)
    s_own = (query.reshape(n, h_kv, rep * q_len, d) @ keys.transpose(-1, -2)).view(n, h, q_len, t)
    scores = torch.cat([s_prefix, s_own], dim=-1).mul_(scaling)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    probs = scores.softmax(-1)
    p_prefix, p_own = probs.split([p_len, t], dim=-1)
    p_prefix = p_prefix.reshape(b, k, h_kv, rep, q_len, p_len).permute(0, 2, 1, 3, 4, 5)
    out_prefix = (p_prefix.reshape(b, h_kv, k * rep * q_len, p_len) @ prefix_values).view(b, h_kv, k, rep, q_len, d)
    out_prefix = out_prefix.permute(0, 2, 1, 3, 4, 5).reshape(n, h, q_len, d)
    out_own = (p_own.reshape(n, h_kv, rep * q_len, t) @ values).view(n, h, q_len, d)
    return (out_prefix + out_own).transpose(1, 2).contiguous()


def _grouped_layer(module, grouped):
    """This module's layer of a grouped cache (rloo.modeling.kvcache: GroupedLayer for decoding,
    GroupedPassLayer for a training pass), or None (an ordinary cache)."""
    if grouped is None:
        return None
    # getattr: third-party attention modules: most have layer_idx, remote-code ones may not
    idx = getattr(module, "layer_idx", None)
    if idx is None:
        raise RuntimeError(
            f"grouped attention needs the attention module's layer_idx ({type(module).__name__} has none)"
        )
    layer = grouped.layers[idx]
    return layer if hasattr(layer, "prefix_keys") else None


def rloo_sdpa(module, query, key, value, attention_mask, rloo_grouped=None, **kwargs):
    """transformers' attention-function signature: (B,H,Q,D), (B,Hkv,K,D) x2, mask -> ((B,Q,H,D), None).
    `rloo_grouped`: the sampler's grouped cache (rloo.modeling.kvcache.grouped_cache): key/value are
    then each row's own tokens and the prompt's are read from the cache (`grouped_attention`)."""
    layer = _grouped_layer(module, rloo_grouped)
    if layer is not None and kwargs.get("dropout", 0.0):
        # attention dropout (a model in train mode with a rate): SDPA over the expanded keys applies it
        key, value = (
            torch.cat([prefix.repeat_interleave(query.shape[0] // prefix.shape[0], 0).to(own.dtype), own], dim=2)
            for prefix, own in ((layer.prefix_keys, key), (layer.prefix_values, value))
        )
        layer = None
    low = _cpu_low_precision(query, key, value)
    if layer is None and not low:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # what SDPA would have returned: autocast's dtype under autocast, else the inputs' (a bf16 model)
    out_dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else value.dtype
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float() if low else attention_mask
    with torch.autocast(query.device.type, enabled=False):
        if layer is not None:
            # fp32 on a CPU under autocast, like the SDPA branch below; else the query's dtype
            dtype = torch.float32 if low else query.dtype
            q, k, v, pk, pv = (t.to(dtype) for t in (query, key, value, layer.prefix_keys, layer.prefix_values))
            out = grouped_attention(q, k, v, pk, pv, attention_mask, kwargs.get("scaling"))
            return out.to(out_dtype if low else query.dtype), None
        out, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
    return out.to(out_dtype), weights


AttentionInterface.register(NAME, rloo_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks SDPA takes, built the same way


def use_rloo_attention(model):
    """Switch a loaded model from SDPA to `rloo_sdpa` (in place; returns it). Models on another
    attention implementation (eager, flash, a remote-code model's own) are left as they are."""
    if attn_implementation(model) == "sdpa":
        try:
            model.set_attn_implementation(NAME)
        except (ValueError, NotImplementedError, AttributeError):  # a model that cannot switch keeps SDPA
            pass
    return model


def attn_implementation(model) -> str | None:
    """The attention implementation a transformers model runs ("sdpa", "eager", rloo_sdpa's NAME, ...),
    or None (no config, or a config without the key)."""
    # getattr: third-party: a private config attribute of transformers (remote-code configs may lack it)
    return getattr(hf_config(model), "_attn_implementation", None)


def uses_rloo_attention(model) -> bool:
    return attn_implementation(model) == NAME

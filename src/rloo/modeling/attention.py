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
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "rloo_sdpa"


def _cpu_low_precision(*tensors: torch.Tensor) -> bool:
    """On a CPU, would SDPA run in a 16-bit dtype: under autocast (which casts its inputs down, whatever
    their dtype: rotary embeddings hand it fp32 queries and keys), or on 16-bit inputs?"""
    if tensors[0].device.type != "cpu":
        return False
    return torch.is_autocast_enabled("cpu") or any(t.dtype in (torch.bfloat16, torch.float16) for t in tensors)


def rloo_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' attention-function signature: (B,H,Q,D), (B,Hkv,K,D) x2, mask -> ((B,Q,H,D), None)."""
    if not _cpu_low_precision(query, key, value):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # what SDPA would have returned: autocast's dtype under autocast, else the inputs' (a bf16 model)
    out_dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else value.dtype
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    with torch.autocast("cpu", enabled=False):
        out, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
    return out.to(out_dtype), weights


AttentionInterface.register(NAME, rloo_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks SDPA takes, built the same way


def use_rloo_attention(model):
    """Switch a loaded model from SDPA to `rloo_sdpa` (in place; returns it). Models on another
    attention implementation (eager, flash, a remote-code model's own) are left as they are."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        try:
            model.set_attn_implementation(NAME)
        except (ValueError, NotImplementedError, AttributeError):  # a model that cannot switch keeps SDPA
            pass
    return model


def uses_rloo_attention(model) -> bool:
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME

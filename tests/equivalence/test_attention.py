"""rloo_sdpa (rloo.modeling.attention): transformers' SDPA unchanged in fp32, SDPA in fp32 under
CPU bf16 autocast, and the fp32 KV cache the sampler keeps for it changes no sampled token."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from helpers.tiny_archs import ARCHS, PAD, V, tiny_lm
from rloo.config import Sampling
from rloo.modeling import attention
from rloo.modeling.attention import NAME, rloo_sdpa, use_rloo_attention, uses_rloo_attention
from rloo.rollout import sampler

pytestmark = pytest.mark.equivalence


def _batch(padded: bool):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, V, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    if padded:  # left padding, as prompts are batched
        mask[0, :4], mask[1, :2] = 0, 0
        ids = ids.masked_fill(mask == 0, PAD)
    return ids, mask


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("arch", ARCHS)
def test_fp32_is_transformers_sdpa_bit_for_bit(arch, padded):
    """Without autocast every model rloo loads computes exactly what it computed on SDPA: the same
    logits and parameter gradients, bitwise, on every architecture, padded or not."""
    plain = tiny_lm(arch)
    ours = use_rloo_attention(copy.deepcopy(plain))
    assert plain.config._attn_implementation == "sdpa" and uses_rloo_attention(ours)
    ids, mask = _batch(padded)
    outs = []
    for model in (plain, ours):
        logits = model(input_ids=ids, attention_mask=mask).logits
        logits.square().sum().backward()
        outs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (l0, g0), (l1, g1) = outs
    assert torch.equal(l0, l1)
    assert all(torch.equal(g0[n], g1[n]) for n in g0)


@pytest.mark.parametrize("causal", [False, True])
def test_under_bf16_autocast_attention_runs_in_fp32(causal):
    """Under CPU bf16 autocast the attention is fp32 SDPA on the same inputs (bitwise, then rounded
    once to the output dtype), where plain SDPA would round its inputs to bf16 first."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g) for _ in range(3))
    module = torch.nn.Module()
    module.is_causal, module.training = causal, False
    mask = None if causal else torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = rloo_sdpa(module, q, k, v.bfloat16(), mask, dropout=0.0, scaling=None)
        low = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    ref = F.scaled_dot_product_attention(q, k, v.bfloat16().float(), attn_mask=mask, is_causal=causal)
    assert out.dtype == torch.bfloat16 and low.dtype == torch.bfloat16
    assert torch.equal(out, ref.transpose(1, 2).to(torch.bfloat16))
    # and the difference is real: bf16 SDPA does not give these numbers
    assert not torch.equal(low.transpose(1, 2), out)


@pytest.mark.parametrize("arch", ARCHS)
def test_fp32_cache_samples_the_same_tokens(arch, monkeypatch):
    """The sampler stores a CPU rloo_sdpa model's KV cache in fp32 so the attention does not cast it
    every step; bf16 values are exact in fp32, so tokens and log-probs equal those of a bf16 cache."""
    model = use_rloo_attention(tiny_lm(arch)).eval()
    ids, mask = _batch(padded=True)
    runs = []
    for fp32_cache in (True, False):
        monkeypatch.setattr(sampler, "uses_rloo_attention", lambda m, keep=fp32_cache: keep)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            runs.append(
                sampler.sample_tokens(
                    model,
                    ids,
                    mask.bool(),
                    Sampling(6, ids.shape[1]),
                    eos_id=1,
                    pad_id=PAD,
                    k=2,
                    generator=torch.Generator().manual_seed(0),
                    grouped=False,  # the expanded cache in both runs (grouped decoding: test_grouped_decoding)
                )
            )
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_models_on_other_attention_are_left_alone():
    model = tiny_lm("llama")
    model.set_attn_implementation("eager")
    assert use_rloo_attention(model).config._attn_implementation == "eager"
    assert attention.NAME == NAME == "rloo_sdpa"

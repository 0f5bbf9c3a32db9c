"""Under bf16 autocast the LM head of every log-prob pass runs in fp32 (issue 34; rloo.core.logprobs.fp32_linear,
rloo.modeling.forward.lm_logits): the sampler's stored log-probs, the plain, shared and chunked passes all
equal a plain fp32 forward's log-probs of the same tokens within an fp32 tolerance.

The model isolates the head: every layer's output projections (attention o_proj, MLP down_proj) are
zero, so each sublayer adds exactly 0 to the residual stream under any precision, and the hidden state
entering the head is norm(embedding), computed in fp32 with or without autocast. What is left to differ
is the head's product and the log-softmax. Tolerance: a logit is a sum of H products, off by at most
H eps S in fp32 (S = max_{position, v} sum_j |h_j W_vj|, measured), and a log-prob z_y - logsumexp(z)
by twice that plus the logsumexp's own V-term sum (|logsumexp| <= S + log V <= 2 S here), so
|delta lp| <= eps S * 2 (H + V). A bf16 head rounds both operands to 8 bits: with the head's weights
N(0, 0.5) and |h_j| ~ 1, logits of ~4 move by ~1e-2, which that bound (~1e-3) does not admit; it did
not before this change (the sampler's and every pass's logits came out of a bf16 matmul).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rloo.config import Sampling
from rloo.modeling.forward import completion_logprobs
from rloo.modeling.forward_shared import completion_logprobs_shared
from rloo.rollout.sampler import sample_tokens
from tolerance import assert_close

V, H, PAD, EOS = 64, 64, 0, 1
B, K, P, T = 3, 2, 5, 6


def _model():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=2 * H,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for layer in model.model.layers:  # every sublayer adds exactly 0: the head is all that can differ
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 0.5)
    return model


def _prompts():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, V, (B, P), generator=g)
    mask = torch.ones(B, P, dtype=torch.bool)
    mask[0, :2] = False  # one left-padded prompt
    return ids.masked_fill(~mask, PAD), mask


def _head_scale(model, p_ids, p_mask, c_ids, c_mask) -> float:
    """S = max over positions and tokens of sum_j |h_j W_vj|, in fp32 (the module docstring)."""
    ids, mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1)
    with torch.no_grad():
        h = model.model(input_ids=ids, attention_mask=mask.long(), use_cache=False).last_hidden_state
        return float((h.abs() @ model.lm_head.weight.abs().t()).max())


def _assert_fp32_close(actual, expected, mask, scale):
    assert_close(actual[mask], expected[mask], 2 * (H + V), scale=scale, msg="log-probs under bf16 autocast")


def test_sampler_logprobs_under_bf16_autocast_are_the_fp32_heads():
    model, (p_ids, p_mask) = _model(), _prompts()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c_ids, c_mask, lps = sample_tokens(
            model,
            p_ids,
            p_mask,
            Sampling(T, p_ids.shape[1]),
            eos_id=EOS,
            pad_id=PAD,
            k=K,
            generator=torch.Generator().manual_seed(2),
        )
    rp_ids, rp_mask = p_ids.repeat_interleave(K, 0), p_mask.repeat_interleave(K, 0)
    with torch.no_grad():  # the plain fp32 forward: no autocast anywhere
        ref = completion_logprobs(model, rp_ids, rp_mask, c_ids, c_mask)
    _assert_fp32_close(lps, ref, c_mask, _head_scale(model, rp_ids, rp_mask, c_ids, c_mask))


@pytest.mark.parametrize("path", ["plain", "chunked", "shared"])
def test_logprob_passes_under_bf16_autocast_are_the_fp32_heads(path):
    model, (p_ids, p_mask) = _model(), _prompts()
    rp_ids, rp_mask = p_ids.repeat_interleave(K, 0), p_mask.repeat_interleave(K, 0)
    g = torch.Generator().manual_seed(3)
    c_ids = torch.randint(2, V, (B * K, T), generator=g)
    c_mask = torch.arange(T)[None] < torch.randint(1, T + 1, (B * K,), generator=g)[:, None]
    with torch.no_grad():
        ref = completion_logprobs(model, rp_ids, rp_mask, c_ids, c_mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if path == "shared":
                got = completion_logprobs_shared(model, rp_ids, rp_mask, c_ids, c_mask, K)
            else:  # "chunked": a limit below one position's logits sends the head through head_token_logprobs
                got = completion_logprobs(
                    model, rp_ids, rp_mask, c_ids, c_mask, max_logits_mb=1e-6 if path == "chunked" else 256
                )
    _assert_fp32_close(got, ref, c_mask, _head_scale(model, rp_ids, rp_mask, c_ids, c_mask))


@pytest.mark.parametrize("max_logits_mb", [256, 1e-6], ids=["plain", "chunked"])
def test_head_gradient_under_bf16_autocast_is_the_fp32_heads(max_logits_mb):
    """The head's weight gradient sum_i dz_i h_i^T, with |dz_iv| <= 2 (softmax minus one-hot) over n
    positions: each entry is a sum of n products, so off by at most n eps * 2 max_j sum_i |h_ij| in
    fp32, plus the dz's own error (2 (H + V) eps S, the log-probs' bound, times sum_i |h_ij|)."""
    model, (p_ids, p_mask) = _model(), _prompts()
    rp_ids, rp_mask = p_ids.repeat_interleave(K, 0), p_mask.repeat_interleave(K, 0)
    c_ids = torch.randint(2, V, (B * K, T), generator=torch.Generator().manual_seed(4))
    c_mask = torch.ones(B * K, T, dtype=torch.bool)

    def head_grad(autocast: bool):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            lp = completion_logprobs(model, rp_ids, rp_mask, c_ids, c_mask, max_logits_mb=max_logits_mb)
        lp[c_mask].sum().backward()
        return model.lm_head.weight.grad.clone()

    ref, got = head_grad(False), head_grad(True)
    ids, mask = torch.cat([rp_ids, c_ids], 1), torch.cat([rp_mask, c_mask], 1)
    with torch.no_grad():
        h = model.model(input_ids=ids, attention_mask=mask.long(), use_cache=False).last_hidden_state[:, -T - 1 : -1]
    h_sum = float(h.abs().sum((0, 1)).max())
    S = _head_scale(model, rp_ids, rp_mask, c_ids, c_mask)
    assert_close(got, ref, 1.0, scale=2 * h_sum * (B * K * T + (H + V) * S), msg="head gradient under autocast")

"""Grouped decoding (rloo.modeling.kvcache.grouped_cache + rloo.modeling.attention.grouped_attention):
the k samples of a prompt attend to one copy of its keys/values. It is the same attention as SDPA over
the expanded (k-copy) cache, summed in another order; these tests hold it to fp32 rounding.

Tolerance (tests/tolerance.py). Attention output o = sum_j p_j v_j, p = softmax(s), s_j = q.k_j * c.
Reordering the D-term dot products moves each score by <= D eps |q||k|c (first order); the softmax
turns a score error e into output error <= 2 max|e| max|v| (o is a convex combination of the v_j and
p moves by <= 2 max|e| in total variation); the L-term weighted sum adds <= L eps max|v|. So
    |delta o| <= eps max|v| (2 D max|q||k|c + L) <= eps max|v| (2 D S + L),  S = max|s| + 1.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.tiny_archs import ARCHS, PAD, V, seeded_sample, tiny_lm
from rloo.config import Sampling
from rloo.modeling.attention import grouped_attention, rloo_sdpa, use_rloo_attention
from rloo.modeling.kvcache import GROUPED_MIN_ELEMENTS, expanded, grouped_cache, grouped_pays, prefill_prompts
from rloo.modeling.lora import add_lora
from rloo.rollout import sampler
from tolerance import TINY_MODEL_FORWARD, assert_close

pytestmark = pytest.mark.equivalence

B, K = 3, 4


def _attention_inputs(h, h_kv, q_len, p, t, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = B * K
    # query as transformers hands it: a transposed view of the projection's (N, Q, H, D) output
    q = torch.randn(n, q_len, h, d, generator=g).transpose(1, 2)
    pk, pv = torch.randn(B, h_kv, p, d, generator=g), torch.randn(B, h_kv, p, d, generator=g)
    ok, ov = torch.randn(n, h_kv, t, d, generator=g), torch.randn(n, h_kv, t, d, generator=g)
    return q, pk, pv, ok, ov


def _bound(q, k_all, v_all, scale):
    d, length = q.shape[-1], k_all.shape[-2]
    s_max = float((q @ k_all.repeat_interleave(q.shape[1] // k_all.shape[1], 1).transpose(-1, -2)).abs().max()) * scale
    return float(v_all.abs().max()) * (2 * d * (s_max + 1) + length)


@pytest.mark.parametrize("mask_kind", ["none", "padding", "additive"])
@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_grouped_attention_is_sdpa_over_the_expanded_cache(heads, q_len, mask_kind):
    h, h_kv = heads
    p, t = 7, 5  # the own part holds the q_len newest tokens too (causal among them)
    q, pk, pv, ok, ov = _attention_inputs(h, h_kv, q_len, p, t)
    k_all = torch.cat([pk.repeat_interleave(K, 0), ok], 2)
    v_all = torch.cat([pv.repeat_interleave(K, 0), ov], 2)
    length = p + t
    mask = None
    if mask_kind != "none" or q_len > 1:
        allowed = torch.ones(B * K, 1, q_len, length, dtype=torch.bool)
        allowed[:, :, :, length - q_len :] = torch.ones(q_len, q_len, dtype=torch.bool).tril()  # causal
        if mask_kind != "none":
            allowed[0::2, :, :, :3] = False  # left padding of every other row's prompt
        mask = allowed
        if mask_kind == "additive":
            mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    scale = q.shape[-1] ** -0.5
    ref = F.scaled_dot_product_attention(
        q, k_all.repeat_interleave(h // h_kv, 1), v_all.repeat_interleave(h // h_kv, 1), attn_mask=mask
    ).transpose(1, 2)
    out = grouped_attention(q, ok, ov, pk, pv, mask)
    assert out.shape == ref.shape == (B * K, q_len, h, q.shape[-1])
    assert_close(out, ref, 1.0, scale=_bound(q, k_all, v_all, scale))


def test_grouped_attention_under_autocast_is_fp32_rounded_once():
    """Under CPU bf16 autocast rloo_sdpa computes grouped attention in fp32 and rounds the output to
    bf16 once: exactly the fp32 result rounded (the same arithmetic on the same fp32 inputs), which
    the same function run on bf16 inputs does not give."""
    q, pk, pv, ok, ov = _attention_inputs(4, 4, 1, 7, 5)

    class Layer:
        prefix_keys, prefix_values = pk, pv

    class Cache:
        layers = [Layer()]

    module = torch.nn.Module()
    module.layer_idx, module.is_causal, module.training = 0, False, False
    ref = grouped_attention(q, ok, ov, pk, pv, None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = rloo_sdpa(module, q, ok, ov, None, rloo_grouped=Cache(), scaling=None)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, ref.to(torch.bfloat16))
    low = grouped_attention(*(t.bfloat16() for t in (q, ok, ov, pk, pv)), None)
    assert not torch.equal(low, out)  # the difference is real: bf16 arithmetic gives other numbers


def _prompts(padded=True):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, V, (B, 9), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    if padded:
        mask[0, :4], mask[1, :2] = False, False
        ids = ids.masked_fill(~mask, PAD)
    return ids, mask


def _model(arch, lora):
    model = use_rloo_attention(tiny_lm(arch))
    if lora:
        from rloo.config import LoraSettings

        model = add_lora(model, LoraSettings(r=4, alpha=8))
    return model.eval()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("arch", ARCHS)
def test_teacher_forced_logits_match_the_expanded_cache(arch, lora):
    """Decoding the same tokens into a grouped and an expanded cache gives the same logits at every
    step (fp32), on every architecture (GQA on llama/qwen2, learned positions on gpt2, parallel
    residual on gpt_neox), with left-padded prompts and under a LoRA wrapper."""
    model = _model(arch, lora)
    ids, mask = _prompts()
    tokens = torch.randint(2, V, (B * K, 6), generator=torch.Generator().manual_seed(1))
    kw = sampler._cache_kwarg(model)
    with torch.no_grad():
        pre = prefill_prompts(model, ids, mask)
        runs = []
        for grouped in (False, True):
            cache = grouped_cache(pre.cache, K, 6) if grouped else expanded(pre.cache, K)
            extra = {"rloo_grouped": cache} if grouped else {}
            att = mask.long().repeat_interleave(K, 0)
            pos = sampler.position_ids(mask).repeat_interleave(K, 0)[:, -1:] + 1
            logits = []
            for step in range(tokens.shape[1]):
                att = torch.cat([att, torch.ones_like(att[:, :1])], 1)
                out = model(input_ids=tokens[:, step : step + 1], attention_mask=att, position_ids=pos + step,
                            use_cache=True, **{kw: cache}, **extra)  # fmt: skip
                logits.append(out.logits[:, -1])
            runs.append(torch.stack(logits, 1))
    assert_close(runs[1], runs[0], TINY_MODEL_FORWARD)


@pytest.mark.parametrize("arch", ARCHS)
def test_sampler_grouped_draws_the_same_tokens(arch):
    """End to end in fp32: the sampler with grouped decoding draws the same tokens and returns the
    same log-probs (to fp32 rounding) as with the expanded cache, seeded alike."""
    model = _model(arch, lora=False)
    ids, mask = _prompts()
    runs = [seeded_sample(model, ids, mask, k=K, grouped=grouped) for grouped in (False, True)]
    (ids0, m0, lp0), (ids1, m1, lp1) = runs
    assert torch.equal(ids0, ids1) and torch.equal(m0, m1)
    assert_close(lp1, lp0, TINY_MODEL_FORWARD)


def test_grouped_only_where_it_pays_and_where_it_can_run():
    """Auto picks grouped decoding for long prompts with k > 1 only; asking for it on a model that
    is not on rloo_sdpa is an error, not a silent fallback."""
    model = _model("llama", lora=False)
    ids, mask = _prompts()
    pre = prefill_prompts(model, ids, mask)
    per_row = pre.cache.layers[0].keys[0].numel()  # Hkv * P * D of one prompt
    assert not grouped_pays(pre.cache, 1)
    assert not grouped_pays(pre.cache, K)  # B*K*Hkv*P*D far below GROUPED_MIN_ELEMENTS
    assert grouped_pays(pre.cache, -(-GROUPED_MIN_ELEMENTS // (B * per_row)))
    plain = tiny_lm("llama").eval()
    with pytest.raises(ValueError, match="rloo_sdpa"):
        sampler.sample_tokens(plain, ids, mask, Sampling(2, ids.shape[1]), eos_id=1, pad_id=PAD, k=K, grouped=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_grouped_shared_passes_equal_plain(arch, monkeypatch):
    """The shared training passes with grouped attention (forced on) against the plain passes, which
    run every (prompt, completion) in full: the policy's log-probs and every parameter gradient, and
    a reward model's scores; and grouped attention did run (with grad, in the policy's pass)."""
    from transformers import AutoModelForSequenceClassification

    import rloo.modeling.attention as attention
    import rloo.modeling.kvcache as kvcache
    from helpers.tiny_archs import tiny_config
    from rloo.modeling.forward import completion_logprobs, reward_scores
    from rloo.modeling.forward_shared import completion_logprobs_shared, reward_scores_shared
    from tolerance import TINY_MODEL_BACKWARD

    calls = []
    original = attention.grouped_attention
    monkeypatch.setattr(kvcache, "GROUPED_MIN_ELEMENTS", 0)
    counted = lambda *a: calls.append(torch.is_grad_enabled()) or original(*a)  # noqa: E731
    monkeypatch.setattr(attention, "grouped_attention", counted)
    ids, mask = _prompts()
    p_ids, p_mask = ids.repeat_interleave(K, 0), mask.repeat_interleave(K, 0)
    g = torch.Generator().manual_seed(2)
    c_mask = torch.arange(5)[None] < torch.randint(1, 6, (B * K,), generator=g)[:, None]
    c_ids = torch.randint(2, V, (B * K, 5), generator=g).masked_fill(~c_mask, PAD)
    weights = torch.randn(B * K, 5, generator=g)
    results = []
    for shared in (False, True):
        model = use_rloo_attention(tiny_lm(arch))
        args = (model, p_ids, p_mask, c_ids, c_mask)
        # bucket_overhead 0: one bucket per distinct group length (whole groups: rows of length 1, fed
        # no token, ride along in their group's bucket)
        lp = completion_logprobs_shared(*args, k=K, bucket_overhead=0) if shared else completion_logprobs(*args)
        (lp * weights).masked_fill(~c_mask, 0.0).sum().backward()
        results.append((lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp0, g0), (lp1, g1) = results
    assert any(calls), "grouped attention did not run in the policy's pass"
    assert_close(lp1[c_mask], lp0[c_mask], TINY_MODEL_FORWARD)
    for name in g0:
        assert_close(g1[name], g0[name], TINY_MODEL_BACKWARD, msg=f"gradient of {name}")
    cfg = tiny_config(arch)
    cfg.num_labels = 1
    torch.manual_seed(1)
    rm = use_rloo_attention(AutoModelForSequenceClassification.from_config(cfg).float()).eval()
    calls.clear()
    c_mask[4] = False  # an empty completion in a group that runs: pooled at its prompt's last token
    with torch.no_grad():
        plain = reward_scores(rm, p_ids, p_mask, c_ids, c_mask)
        shared = reward_scores_shared(rm, p_ids, p_mask, c_ids, c_mask, k=K, bucket_overhead=0)
    assert calls, "grouped attention did not run in the reward model's pass"
    assert_close(shared, plain, TINY_MODEL_FORWARD)
    assert plain.std() > 0


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_attention_dropout_expands_the_prompt_for_sdpa(arch, monkeypatch):
    """A model in train mode with attention dropout: grouped attention cannot apply it, so rloo_sdpa
    expands the prompt's keys/values and lets SDPA do it; the same dropout draws as the expanded
    path, so the same log-probs, seeded alike."""
    import rloo.modeling.kvcache as kvcache
    from rloo.modeling.forward_shared import completion_logprobs_shared

    ids, mask = _prompts()
    p_ids, p_mask = ids.repeat_interleave(K, 0), mask.repeat_interleave(K, 0)
    c_ids = torch.randint(2, V, (B * K, 4), generator=torch.Generator().manual_seed(3))
    c_mask = torch.ones_like(c_ids, dtype=torch.bool)
    model = use_rloo_attention(tiny_lm(arch, dropout=0.5)).train()
    runs = []
    for threshold in (2**62, 0):  # expanded, then grouped
        monkeypatch.setattr(kvcache, "GROUPED_MIN_ELEMENTS", threshold)
        torch.manual_seed(7)
        runs.append(completion_logprobs_shared(model, p_ids, p_mask, c_ids, c_mask, k=K).detach())
    assert_close(runs[1], runs[0], TINY_MODEL_FORWARD)
    torch.manual_seed(8)
    other = completion_logprobs_shared(model, p_ids, p_mask, c_ids, c_mask, k=K).detach()
    assert not torch.allclose(other, runs[0])  # dropout is on: another seed gives other numbers

"""The benchmark's FLOP formulas equal torch's FlopCounterMode on real forward passes.

The linear + LM-head terms are checked against the counter's aten.mm count alone, and the attention
term against torch's own sdpa formula (flop_counter.sdpa_flop_count): what else the counter sees
depends on the versions, not on rloo. torch 2.13's CPU flash-attention kernel has no formula there,
torch 2.7-2.9 run these GQA calls in the math kernel (counted as aten.bmm), and transformers 5.17's
rotary embedding adds a small bmm of its own."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count
from transformers import LlamaConfig, LlamaForCausalLM

from rloo.experiments.bench_flops import Arch
from rloo.modeling.forward import completion_logprobs
from rloo.modeling.forward_shared import completion_logprobs_shared

B, K, P, T = 2, 3, 5, 4


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    return LlamaForCausalLM(cfg).eval()


def _counted(fn) -> int:
    """FLOPs of the matrix products (aten.mm: the linear layers and the LM head)."""
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        fn()
    return fc.get_flop_counts()["Global"].get(torch.ops.aten.mm, 0)


def _batch():
    ids = torch.randint(2, 50, (B * K, P + T))
    ones = torch.ones(B * K, P, dtype=torch.bool)
    p_ids = ids[:B, :P].repeat_interleave(K, 0)
    return p_ids, ones, ids[:, P:], torch.ones(B * K, T, dtype=torch.bool)


def test_plain_forward_flops(model):
    a, args = Arch.of(model.config), _batch()
    counted = _counted(lambda: completion_logprobs(model, *args))
    # logits_to_keep=T+1 in the plain pass
    assert counted == a.linear(B * K * (P + T)) + a.head(B * K * (T + 1))


def test_shared_forward_flops(model):
    a, args = Arch.of(model.config), _batch()
    counted = _counted(lambda: completion_logprobs_shared(*(model, *args), k=K))
    expected = a.linear(B * P + B * K * (T - 1)) + a.head(B + B * K * (T - 1))
    assert counted == expected


def test_bucketed_shared_forward_flops(model):
    """Mixed completion lengths: the shared pass runs length buckets; the count follows them."""
    from rloo.experiments.bench_flops import bucketed

    a, (p_ids, p_mask, c_ids, _) = Arch.of(model.config), _batch()
    lengths = [4, 1, 3, 4, 2, 4]
    c_mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    counted = _counted(lambda: completion_logprobs_shared(model, p_ids, p_mask, c_ids, c_mask, k=K, bucket_overhead=0))
    fed = [n - 1 for n in lengths]  # buckets of widths 3 (3 rows), 2, 1; the one-token row needs no pass
    assert counted == a.linear(B * P) + a.head(B) + a.linear(3 * 3 + 2 + 1) + a.head(3 * 3 + 2 + 1)
    # bucketed() uses the default overhead; with 6 rows that is one bucket of width 3 for the 5 non-empty rows
    assert bucketed(a, fed, P, logits=True) - a.attention(5, 3, P + 3) == a.linear(5 * 3) + a.head(5 * 3)


def test_attention_formula_matches_torch_sdpa_count(model):
    a, heads = Arch.of(model.config), model.config.num_attention_heads
    d = model.config.hidden_size // heads
    per_layer = sdpa_flop_count((B * K, heads, T, d), (B * K, heads, P + T, d), (B * K, heads, P + T, d))
    assert a.attention(B * K, T, P + T) == per_layer * model.config.num_hidden_layers

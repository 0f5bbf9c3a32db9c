"""Tests for rloo.core.logprobs: the gather-minus-logsumexp path equals log_softmax + gather."""

import math

import pytest
import torch

from rloo.core.logprobs import (
    completion_mask,
    masked_mean,
    masked_sum,
    sequence_logprobs,
    token_logprobs,
)
from tolerance import assert_close


def plain_token_logprobs(logits, tokens, temperature=1.0):
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def test_token_logprobs_worked_example():
    # logits [0, ln 2, ln 5] -> softmax = [1, 2, 5] / 8; token 2 -> log(5/8) = -0.4700036
    # at temperature 2 the logits are halved: weights [1, sqrt2, sqrt5] / (1 + 1.4142136 + 2.2360680)
    logits = torch.tensor([[[0.0, math.log(2), math.log(5)]]], dtype=torch.float64)
    tokens = torch.tensor([[2]])
    torch.testing.assert_close(token_logprobs(logits, tokens), torch.tensor([[math.log(5 / 8)]], dtype=torch.float64))
    expected = math.log(math.sqrt(5) / (1 + math.sqrt(2) + math.sqrt(5)))
    torch.testing.assert_close(
        token_logprobs(logits, tokens, temperature=2.0), torch.tensor([[expected]], dtype=torch.float64)
    )


@pytest.mark.equivalence
@pytest.mark.parametrize("chunk_size", [None, 1, 5, 12, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_token_logprobs_matches_log_softmax_values_and_gradients(chunk_size, temperature, dtype):
    g = torch.Generator().manual_seed(0)
    n, t, v = 3, 4, 11  # N*T = 12 positions, chunk 5 leaves a remainder
    base = (torch.randn(n, t, v, generator=g) * 3).to(dtype)
    tokens = torch.randint(0, v, (n, t), generator=g)
    upstream = torch.randn(n, t, generator=g).to(dtype)  # arbitrary weights so every position's gradient matters

    logits_a = base.clone().requires_grad_(True)
    fast = token_logprobs(logits_a, tokens, temperature=temperature, chunk_size=chunk_size)
    (fast * upstream).sum().backward()

    logits_b = base.clone().requires_grad_(True)
    plain = plain_token_logprobs(logits_b, tokens, temperature)
    (plain * upstream).sum().backward()

    assert fast.shape == (n, t) and fast.dtype == dtype
    # a log-sum-exp over v terms of the scaled logits: error <= v eps x their magnitude; the
    # gradients (softmax - one-hot) x upstream: v eps x max |upstream| (tests/tolerance.py)
    assert_close(fast, plain, v, dtype=dtype, scale=float((base / temperature).abs().max()))
    assert_close(logits_a.grad, logits_b.grad, v, dtype=dtype, scale=float(upstream.abs().max()))


def test_token_logprobs_half_precision_is_computed_in_float32():
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 3, 50, generator=g) * 4).to(torch.bfloat16)
    tokens = torch.randint(0, 50, (2, 3), generator=g)
    out = token_logprobs(logits, tokens, chunk_size=2)
    assert out.dtype == torch.float32
    # both in float32 from the same bfloat16 values: the log-sum-exp bound over 50 terms
    assert_close(out, plain_token_logprobs(logits.float(), tokens), 50, scale=float(logits.float().abs().max()))


def test_token_logprobs_validates_arguments():
    logits = torch.zeros(2, 3, 5)
    tokens = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, tokens, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(logits, tokens, chunk_size=0)
    with pytest.raises(ValueError, match="tokens must be"):
        token_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="logits must be"):
        token_logprobs(torch.zeros(6, 5), tokens)


def test_completion_mask_cases():
    eos, pad = 2, 0
    tokens = torch.tensor(
        [
            [5, 2, 7, 7],  # EOS at t=1: keep t <= 1
            [5, 6, 7, 8],  # no EOS (truncated): keep all
            [2, 0, 0, 0],  # empty completion: only the EOS counts
            [5, 6, 2, 2],  # second EOS is after the first: dropped
        ]
    )
    expected = torch.tensor(
        [
            [True, True, False, False],
            [True, True, True, True],
            [True, False, False, False],
            [True, True, True, False],
        ]
    )
    mask = completion_mask(tokens, eos_id=eos, pad_id=pad)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, expected)


def test_completion_mask_pad_tokens_and_pad_equal_eos():
    # Without EOS but padded (e.g. a stop string ended it): pads are not real tokens.
    tokens = torch.tensor([[5, 6, 0, 0]])
    assert completion_mask(tokens, eos_id=2, pad_id=0).tolist() == [[True, True, False, False]]
    assert completion_mask(tokens, eos_id=2).tolist() == [[True, True, True, True]]
    # GPT-2 style pad == eos: the first EOS still counts, the rest is padding.
    tokens = torch.tensor([[5, 50256, 50256, 50256]])
    assert completion_mask(tokens, eos_id=50256, pad_id=50256).tolist() == [[True, True, False, False]]


def test_masked_sum_and_mean_ignore_nonfinite_padding():
    # real values 1, 2, 4 -> sum 7, mean 7/3; per row: sums [3, 4], means [1.5, 4]
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, -float("inf"), 3.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    torch.testing.assert_close(masked_sum(x, mask), torch.tensor(7.0))
    torch.testing.assert_close(masked_mean(x, mask), torch.tensor(7.0 / 3))
    torch.testing.assert_close(masked_sum(x, mask, dim=1), torch.tensor([3.0, 4.0]))
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.5, 4.0]))
    torch.testing.assert_close(sequence_logprobs(x, mask), torch.tensor([3.0, 4.0]))


def test_masked_mean_of_empty_row_is_zero():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[True, False], [False, False]])
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.0, 0.0]))


def test_masks_must_be_bool_and_same_shape():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="bool"):
        masked_sum(x, torch.ones(2, 3))
    with pytest.raises(ValueError, match="shapes must match"):
        masked_mean(x, torch.ones(2, 2, dtype=torch.bool))

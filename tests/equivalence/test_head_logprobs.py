"""head_token_logprobs (chunked LM head + log-prob, logits recomputed in backward) equals the
plain computation, values and gradients, and keeps no (n, V) tensor for the backward pass."""

from __future__ import annotations

import pytest
import torch

from rloo.core.logprobs import head_token_logprobs, token_logprobs
from tolerance import assert_close

pytestmark = pytest.mark.equivalence


def _inputs(seed=0, n=(3, 7), H=16, V=50, bias=True):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*n, H, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    tokens = torch.randint(0, V, n, generator=g)
    upstream = torch.randn(*n, generator=g, dtype=torch.float64)
    return hidden, weight, b, tokens, upstream


@pytest.mark.parametrize("chunk,temperature,bias", [(1, 1.0, True), (4, 0.7, False), (1000, 1.3, True)])
def test_values_and_gradients_equal_plain(chunk, temperature, bias):
    results = []
    for chunked in (False, True):
        hidden, weight, b, tokens, upstream = _inputs(bias=bias)
        if chunked:
            lp = head_token_logprobs(hidden, weight, b, tokens, temperature, chunk=chunk)
        else:
            logits = torch.nn.functional.linear(hidden, weight, b)
            lp = token_logprobs(logits, tokens, temperature=temperature)
        (lp.double() * upstream).sum().backward()
        results.append([lp.detach().double(), hidden.grad, weight.grad] + ([b.grad] if bias else []))
    # the chunked path computes in float32 (as token_logprobs does for half precision inputs), the
    # plain one in float64: the float32 error of the chain head (H = 16 terms) -> log-softmax
    # (V = 50) and, for gradients, back through the softmax (V) and over the positions (21)
    H, V, n = 16, 50, 21
    for name, plain, fast in zip(["log-probs", "hidden grad", "weight grad", "bias grad"], *results, strict=False):
        assert_close(fast, plain, H + V + (0 if name == "log-probs" else V + n), msg=name)


def test_keeps_no_vocabulary_sized_tensor_for_backward():
    n, H, V = 64, 8, 1000
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    hidden = torch.randn(n, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    tokens = torch.randint(0, V, (n,))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        head_token_logprobs(hidden, weight, None, tokens, chunk=16).sum().backward()
    assert max(saved) <= V * H  # the weight itself; nothing of size n * V
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = (hidden @ weight.t()).view(1, n, V)
        token_logprobs(logits, tokens.view(1, n)).sum().backward()
    assert max(saved) >= n * V  # the plain path keeps the (n, V) logits


def test_rejects_bad_input():
    hidden, weight, b, tokens, _ = _inputs()
    with pytest.raises(ValueError, match="temperature"):
        head_token_logprobs(hidden, weight, b, tokens, temperature=0.0)
    with pytest.raises(ValueError, match="tokens must have shape"):
        head_token_logprobs(hidden, weight, b, tokens[:, :-1])

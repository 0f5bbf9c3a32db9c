"""Tolerances for comparing two floating-point computations of one quantity: derived, not fitted.

Two computations that are the same math but not the same arithmetic (a fast path and the plain
one, ATen's default / AVX2 / AVX-512 kernels, 1 or 2 threads) each round. A sum of n terms in a
dtype with machine epsilon eps is off by at most about n * eps * sum|terms| (Higham's gamma_n;
typically sqrt(n) * eps * ...), and a network chains such reductions. So the bound used is

    |actual - expected| <= eps(dtype) * scale * factor      (absolute; no relative term)

  eps    torch.finfo(dtype).eps: float32 2**-23 = 1.19e-7, float64 2**-52 = 2.2e-16.
  scale  the quantity's magnitude: max |expected| over the compared tensor unless the caller
         states a better one (e.g. sum |terms| of a mean whose terms cancel). Not elementwise:
         entries near zero come out of cancellation and carry the error of the large terms they
         came from, so an elementwise relative test would ask them for a precision no
         reordering of the arithmetic guarantees.
  factor the error growth of the computation, one of the constants below, each with its bound.

What may not be compared with a tolerance at all: parameters after an AdamW step. Its first
update is lr * g / (|g| + 1e-8) (bias-corrected m = g, v = g**2), whose slope in g is lr / 1e-8
= 1e6 at lr = 1e-2 for gradients near 0, so a float32 difference of 1e-11 in a tiny gradient
entry becomes 1e-5 in the parameter. Compare the gradients the optimizer receives instead.

Audit (issue 11): every comparison of two computations through torch kernels uses this module
(test_fastpath, test_head_logprobs, unit/test_logprobs, test_lora, test_reward_sources,
test_vllm, test_distributed, test_algorithms). Left with the defaults, on purpose: unit tests
that compare a few float64 operations with exact literals (torch's float64 defaults, rtol 1e-7,
are 10**8 times float64 rounding there), float32 unit tests of a few elementwise operations on
O(1) values (torch's float32 defaults, rtol 1.3e-6 ~ 11 eps, are the ELEMENTWISE bound), and
pytest.approx on pure-Python float arithmetic, which no ATen kernel touches. Statistical tests
(unit/test_bandit) bound by Z standard errors, not by rounding.
"""

from __future__ import annotations

import torch

# A few elementwise operations or one reduction of <= 8 terms.
ELEMENTWISE = 8
# A forward pass of the tiny test transformers (2 layers, hidden 32, MLP 64, head dim 8-16,
# <= 16 positions, vocabulary <= 100): per layer ~8 chained reductions (norm 32, q/k/v 32,
# scores 16, softmax and values <= 16, output 32, gate/up 32, down 64) sum to n ~ 250; two
# layers, the final norm, the head (32) and the log-softmax (<= 100) give sum n ~ 660 < 2**10.
TINY_MODEL_FORWARD = 2**10
# Its parameter gradients: the backward pass runs the same chain again for the activations'
# gradients and once more for the weights' (each a reduction over the batch's positions, <= 60).
TINY_MODEL_BACKWARD = 2**12


def tolerance(
    expected: torch.Tensor | float | None, factor: float, *, dtype=torch.float32, scale: float | None = None
) -> float:
    """The absolute tolerance eps(dtype) * scale * factor (scale: max |expected| unless given)."""
    if scale is None:
        scale = float(torch.as_tensor(expected).detach().double().abs().max())
    return torch.finfo(dtype).eps * scale * factor


def assert_close(
    actual, expected, factor: float, *, dtype=torch.float32, scale: float | None = None, msg: str | None = None
) -> None:
    """torch.testing.assert_close with the derived absolute tolerance above and rtol = 0."""
    actual, expected = torch.as_tensor(actual).detach(), torch.as_tensor(expected).detach()
    atol = tolerance(expected, factor, dtype=dtype, scale=scale)
    kw = {} if msg is None else {"msg": lambda default: f"{msg}: {default}"}
    torch.testing.assert_close(actual.double(), expected.double(), rtol=0, atol=atol, **kw)

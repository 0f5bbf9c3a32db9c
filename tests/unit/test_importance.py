"""Hand-derived tests for rloo.core.importance (off-policy RLOO, docs/async.md)."""

import math

import pytest
import torch

from rloo.core.importance import (
    importance_weights,
    masked_weights,
    ratio_stats,
    sequence_log_ratio,
    token_log_ratio,
    truncated_weights,
    weighted_policy_gradient_loss,
)
from rloo.core.logprobs import sequence_logprobs
from rloo.core.losses import policy_gradient_loss

F64 = torch.float64
# Two completions, T = 3; the first ends at t=1 (t=2 is padding, its behaviour value 9 is garbage).
LOGPROBS = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]], dtype=F64)
BEHAVIOUR = torch.tensor([[-1.5, -1.0, 9.0], [-0.5, -1.0, -0.2]], dtype=F64)
MASK = torch.tensor([[True, True, False], [True, True, True]])
# token log-ratios log pi - log mu: row 0: +0.5, -1.0, (pad) 0; row 1: 0, +0.5, -0.3
TOKEN_LR = torch.tensor([[0.5, -1.0, 0.0], [0.0, 0.5, -0.3]], dtype=F64)
# sequence log-ratios: 0.5 - 1.0 = -0.5; 0 + 0.5 - 0.3 = 0.2
SEQ_LR = torch.tensor([-0.5, 0.2], dtype=F64)


def test_log_ratios_by_hand():
    torch.testing.assert_close(token_log_ratio(LOGPROBS, BEHAVIOUR, MASK), TOKEN_LR)
    torch.testing.assert_close(sequence_log_ratio(LOGPROBS, BEHAVIOUR, MASK), SEQ_LR)


def test_sequence_weights_by_hand():
    rho = torch.exp(SEQ_LR)  # e^-0.5 = 0.60653, e^0.2 = 1.22140
    # C = 1.5: [1/C, C] = [0.6667, 1.5]; nothing above C; 0.60653 < 1/C is masked
    w, _ = importance_weights(LOGPROBS, BEHAVIOUR, MASK, "tis", 1.5)
    torch.testing.assert_close(w, rho)
    w, _ = importance_weights(LOGPROBS, BEHAVIOUR, MASK, "mis", 1.5)
    torch.testing.assert_close(w, torch.tensor([0.0, math.exp(0.2)], dtype=F64))
    # C = 1.2: 1.22140 > C is truncated to 1.2 (tis) or masked (mis); 0.60653 < 1/1.2 = 0.8333 masked
    w, _ = importance_weights(LOGPROBS, BEHAVIOUR, MASK, "tis", 1.2)
    torch.testing.assert_close(w, torch.tensor([math.exp(-0.5), 1.2], dtype=F64))
    w, _ = importance_weights(LOGPROBS, BEHAVIOUR, MASK, "mis", 1.2)
    torch.testing.assert_close(w, torch.zeros(2, dtype=F64))
    w, _ = importance_weights(LOGPROBS, BEHAVIOUR, MASK, "none", 1.2)
    torch.testing.assert_close(w, torch.ones(2, dtype=F64))


def test_token_weights_and_stats_by_hand():
    # C = 1.5, token ratios: row 0: e^0.5 = 1.64872 (> C), e^-1 = 0.36788 (< 1/C), pad;
    #                        row 1: 1, 1.64872 (> C), e^-0.3 = 0.74082 (inside)
    e5, em1, em3 = math.exp(0.5), math.exp(-1.0), math.exp(-0.3)
    w, stats = importance_weights(LOGPROBS, BEHAVIOUR, MASK, "tis_token", 1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, em1, 0.0], [1.0, 1.5, em3]], dtype=F64))
    w, _ = importance_weights(LOGPROBS, BEHAVIOUR, MASK, "mis_token", 1.5)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, em3]], dtype=F64))
    # over the 5 real tokens: mean (2*1.64872 + 0.36788 + 1 + 0.74082)/5 = 1.08122; 2 above C; 3 outside
    torch.testing.assert_close(stats["is/ratio_mean"], torch.tensor((2 * e5 + em1 + 1 + em3) / 5, dtype=torch.float32))
    torch.testing.assert_close(stats["is/ratio_max"], torch.tensor(e5, dtype=torch.float32))
    torch.testing.assert_close(stats["is/ratio_min"], torch.tensor(em1, dtype=torch.float32))
    assert stats["is/truncated"].item() == pytest.approx(2 / 5)
    # E_mu[rho 1{rho > C}] over the 5 tokens: the two ratios e^0.5 above C, i.e. 2 * 1.64872 / 5
    assert stats["is/truncated_pi"].item() == pytest.approx(2 * e5 / 5, rel=1e-6)
    assert stats["is/masked"].item() == pytest.approx(3 / 5)


def test_sequence_stats_by_hand():
    # C = 1.2: ratios 0.60653, 1.22140: mean 0.91397; one above C; both outside [0.8333, 1.2]
    stats = ratio_stats(SEQ_LR, 1.2)
    assert stats["is/ratio_mean"].item() == pytest.approx((math.exp(-0.5) + math.exp(0.2)) / 2, rel=1e-6)
    assert stats["is/ratio_max"].item() == pytest.approx(math.exp(0.2), rel=1e-6)
    assert stats["is/truncated"].item() == pytest.approx(0.5)
    assert stats["is/truncated_pi"].item() == pytest.approx(math.exp(0.2) / 2, rel=1e-6)  # 1.22140 / 2
    assert stats["is/masked"].item() == pytest.approx(1.0)


def test_huge_ratios_stay_finite():
    lr = torch.tensor([1000.0, -1000.0, 0.0])
    torch.testing.assert_close(truncated_weights(lr, 2.0), torch.tensor([2.0, 0.0, 1.0]))
    torch.testing.assert_close(masked_weights(lr, 2.0), torch.tensor([0.0, 0.0, 1.0]))
    # the boundary itself is inside: rho = C is kept by mis and equals C under tis
    edge = torch.tensor([math.log(2.0)], dtype=F64)
    torch.testing.assert_close(masked_weights(edge, 2.0), torch.tensor([2.0], dtype=F64))


def test_weights_are_detached_and_clip_checked():
    lp = LOGPROBS.clone().requires_grad_(True)
    w, _ = importance_weights(lp, BEHAVIOUR, MASK, "tis", 1.5)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="must be > 1"):
        truncated_weights(SEQ_LR, 1.0)
    with pytest.raises(ValueError, match="unknown importance correction"):
        importance_weights(LOGPROBS, BEHAVIOUR, MASK, "ppo", 1.5)


def test_weighted_loss_and_gradient_by_hand():
    adv = torch.tensor([2.0, -1.0], dtype=F64)
    # sequence weights w = (0.5, 3): loss = -1/2 (0.5*2*(-3.0) + 3*(-1)*(-1.5)) = -1/2 (-3 + 4.5) = -0.75
    lp = LOGPROBS.clone().requires_grad_(True)
    loss, stats = weighted_policy_gradient_loss(lp, MASK, adv, torch.tensor([0.5, 3.0], dtype=F64))
    assert loss.item() == pytest.approx(-0.75)
    loss.backward()
    # d loss / d lp_it = -w_i A_i / N on real tokens: row 0: -0.5*2/2 = -0.5; row 1: -3*(-1)/2 = 1.5
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.5, -0.5, 0.0], [1.5, 1.5, 1.5]], dtype=F64))
    assert stats["is/weight_mean"].item() == pytest.approx(1.75)
    # token weights: d loss / d lp_it = -A_i w_it / N
    w_tok = torch.tensor([[1.0, 2.0, 7.0], [0.5, 0.0, 1.0]], dtype=F64)
    lp = LOGPROBS.clone().requires_grad_(True)
    loss, _ = weighted_policy_gradient_loss(lp, MASK, adv, w_tok)
    # loss = -1/2 (2*(1*-1 + 2*-2) + (-1)*(0.5*-0.5 + 0 + 1*-0.5)) = -1/2 (-10 + 0.75) = 4.625
    assert loss.item() == pytest.approx(4.625)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.0, -2.0, 0.0], [0.25, 0.0, 0.5]], dtype=F64))


def test_unit_weights_equal_the_plain_loss_bitwise():
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(6, 5, generator=g)
    mask = torch.rand(6, 5, generator=g) > 0.3
    adv = torch.randn(6, generator=g)
    plain, _ = policy_gradient_loss(sequence_logprobs(lp, mask), adv)
    weighted, _ = weighted_policy_gradient_loss(lp, mask, adv, torch.ones(6))
    assert torch.equal(plain, weighted)  # 1 * x is exact


def test_truncated_pi_estimates_the_policy_probability_of_the_truncated_set():
    """is/truncated_pi = mean of rho 1{rho > C} over mu's samples estimates P_pi(rho > C) without bias,
    while is/truncated estimates P_mu(rho > C) (docs/async.md, tis's bias bound). Four outcomes, exact
    probabilities; the tolerance is 5 standard errors of each sample mean."""
    pi = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)
    mu = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=F64)
    rho, clip, n = pi / mu, 1.2, 200_000  # rho = 0.25, 0.667, 1.5, 4: the last two above C
    above = rho > clip
    draws = torch.multinomial(mu, n, replacement=True, generator=torch.Generator().manual_seed(0))
    stats = ratio_stats(torch.log(rho)[draws], clip)
    f = torch.where(above, rho, 0.0)  # rho 1{rho > C}, per outcome
    se_pi = math.sqrt(((mu * f**2).sum() - (mu * f).sum() ** 2).item() / n)
    p_mu = mu[above].sum().item()
    assert stats["is/truncated_pi"].item() == pytest.approx(pi[above].sum().item(), abs=5 * se_pi)  # 0.7
    assert stats["is/truncated"].item() == pytest.approx(p_mu, abs=5 * math.sqrt(p_mu * (1 - p_mu) / n))  # 0.3

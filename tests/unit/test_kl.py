"""Hand-derived and statistical tests for rloo.core.kl."""

import math

import pytest
import torch

from rloo.core.advantages import leave_one_out
from rloo.core.kl import kl_per_token, sequence_kl, shaped_reward, token_level_rewards
from rloo.core.logprobs import completion_mask, sequence_logprobs
from rloo.core.losses import policy_gradient_loss

LN2 = math.log(2.0)

# Two completions, T = 3, EOS id 2, pad id 0. The second ends at t=1, so t=2 is padding.
TOKENS = torch.tensor([[5, 6, 7], [5, 2, 0]])
LOGPROBS = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -9.0]], dtype=torch.float64)
REF_LOGPROBS = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -1.0, -0.2]], dtype=torch.float64)
SCORES = torch.tensor([2.0, 1.0], dtype=torch.float64)


def test_estimators_on_worked_numbers():
    # pi(y) = 0.5, ref(y) = 0.25: r = log(ref/pi) = -ln 2
    #   k1 = -r = ln 2 = 0.693147
    #   k2 = r^2/2 = 0.480453/2 = 0.240227
    #   k3 = (e^r - 1) - r = (0.5 - 1) + ln 2 = 0.193147
    logprobs = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    torch.testing.assert_close(kl_per_token(logprobs, ref, "k1"), torch.tensor([[LN2]], dtype=torch.float64))
    torch.testing.assert_close(kl_per_token(logprobs, ref, "k2"), torch.tensor([[LN2**2 / 2]], dtype=torch.float64))
    torch.testing.assert_close(kl_per_token(logprobs, ref, "k3"), torch.tensor([[LN2 - 0.5]], dtype=torch.float64))
    # Swapped (pi = 0.25, ref = 0.5): r = +ln 2; k1 = -ln 2 < 0, k3 = (2 - 1) - ln 2 = 0.306853
    torch.testing.assert_close(kl_per_token(ref, logprobs, "k1"), torch.tensor([[-LN2]], dtype=torch.float64))
    torch.testing.assert_close(kl_per_token(ref, logprobs, "k3"), torch.tensor([[1 - LN2]], dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_k3_is_never_negative(dtype):
    g = torch.Generator().manual_seed(0)
    logprobs = torch.randn(1000, 50, generator=g).to(dtype) * 5
    ref = torch.randn(1000, 50, generator=g).to(dtype) * 5
    grid = torch.linspace(-30, 30, 60001, dtype=dtype).unsqueeze(0)  # includes r ~ 0 where cancellation bites
    assert (kl_per_token(logprobs, ref, "k3") >= 0).all()
    assert (kl_per_token(torch.zeros_like(grid), grid, "k3") >= 0).all()
    assert (kl_per_token(logprobs, ref, "k2") >= 0).all()


def test_unknown_estimator_raises():
    with pytest.raises(ValueError, match="k4.*k1, k2, k3"):
        kl_per_token(LOGPROBS, REF_LOGPROBS, "k4")


def test_estimators_are_unbiased_or_not_as_documented():
    # pi = softmax(a), ref = softmax(b) over 6 outcomes; exact KL(pi||ref) = sum pi log(pi/ref).
    # Sample y ~ pi; the mean of k1 and of k3 must match within 5 standard errors
    # (empirical std / sqrt(M)); k2 is biased, so it is only checked to be close-ish.
    g = torch.Generator().manual_seed(3)
    log_pi = torch.log_softmax(torch.tensor([0.5, -1.0, 1.2, 0.0, -0.3, 0.8], dtype=torch.float64), 0)
    log_ref = torch.log_softmax(torch.tensor([0.0, 0.0, 0.5, 0.5, -1.0, 1.0], dtype=torch.float64), 0)
    exact = (log_pi.exp() * (log_pi - log_ref)).sum()
    m = 200_000
    y = torch.multinomial(log_pi.exp(), m, replacement=True, generator=g)
    lp, ref = log_pi[y].unsqueeze(0), log_ref[y].unsqueeze(0)
    for name in ("k1", "k3"):
        est = kl_per_token(lp, ref, name)
        se = est.std() / math.sqrt(m)
        assert abs(est.mean() - exact) < 5 * se, (name, est.mean().item(), exact.item(), se.item())
    # k3 has lower variance than k1 here (the reason to prefer it)
    assert kl_per_token(lp, ref, "k3").var() < kl_per_token(lp, ref, "k1").var()


def test_completion_mask_of_the_fixture():
    mask = completion_mask(TOKENS, eos_id=2, pad_id=0)
    assert torch.equal(mask, torch.tensor([[True, True, True], [True, True, False]]))


def test_shaped_reward_matches_eq1_on_worked_example():
    # k1 per token = logprobs - ref:
    #   seq 0: [-1.0+1.5, -2.0+1.0, -0.5+0.5] = [0.5, -1.0, 0.0] -> sum -0.5
    #   seq 1: [-0.3+0.1, -1.2+1.0, (masked)] = [-0.2, -0.2]     -> sum -0.4  (t=2 after EOS dropped)
    # eq. (1) with beta = 0.1: R = score - 0.1 * kl = [2 + 0.05, 1 + 0.04] = [2.05, 1.04]
    mask = completion_mask(TOKENS, eos_id=2, pad_id=0)
    rewards, kl = shaped_reward(SCORES, LOGPROBS, REF_LOGPROBS, mask, beta=0.1)
    torch.testing.assert_close(kl, torch.tensor([-0.5, -0.4], dtype=torch.float64))
    torch.testing.assert_close(rewards, torch.tensor([2.05, 1.04], dtype=torch.float64))
    torch.testing.assert_close(sequence_kl(LOGPROBS, REF_LOGPROBS, mask), kl)


def test_tokens_after_eos_change_nothing():
    mask = completion_mask(TOKENS, eos_id=2, pad_id=0)
    scores = SCORES
    results = []
    for garbage in (-9.0, 123.0, -float("inf")):
        logprobs = LOGPROBS.clone()
        logprobs[1, 2] = garbage  # the position after EOS
        logprobs.requires_grad_(True)
        out = {}
        for est in ("k1", "k2", "k3"):
            out[f"rewards_{est}"], out[f"kl_{est}"] = shaped_reward(scores, logprobs, REF_LOGPROBS, mask, 0.1, est)
            out[f"token_{est}"] = token_level_rewards(scores, logprobs, REF_LOGPROBS, mask, 0.1, est)
        seq = sequence_logprobs(logprobs, mask)
        adv = leave_one_out(out["rewards_k1"].view(1, 2)).view(2)
        loss, _ = policy_gradient_loss(seq, adv)
        loss.backward()
        out["seq"], out["loss"], out["grad"] = seq.detach(), loss.detach(), logprobs.grad
        results.append(out)
    for other in results[1:]:
        for key, value in results[0].items():
            torch.testing.assert_close(other[key], value, msg=key)
    assert results[0]["grad"][1, 2] == 0.0


def test_token_level_rewards_worked_example():
    # -beta * k1 with beta 0.1: seq 0 [-0.05, 0.1, 0.0], seq 1 [0.02, 0.02, 0 (masked)]
    # score added at the last real token: seq 0 at t=2 (+2), seq 1 at t=1 (+1)
    # a third sequence with no real tokens gets nothing (its score 5 is dropped)
    scores = torch.tensor([2.0, 1.0, 5.0], dtype=torch.float64)
    logprobs = torch.cat([LOGPROBS, torch.zeros(1, 3, dtype=torch.float64)])
    ref = torch.cat([REF_LOGPROBS, torch.ones(1, 3, dtype=torch.float64)])
    mask = torch.tensor([[True, True, True], [True, True, False], [False, False, False]])
    out = token_level_rewards(scores, logprobs, ref, mask, beta=0.1)
    expected = torch.tensor([[-0.05, 0.1, 2.0], [0.02, 1.02, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(out, expected)
    # each real row sums to eq. (1)'s R = [2.05, 1.04]
    torch.testing.assert_close(out[:2].sum(1), torch.tensor([2.05, 1.04], dtype=torch.float64))


def test_token_level_rewards_sum_to_shaped_reward_on_random_inputs():
    g = torch.Generator().manual_seed(4)
    logprobs = -torch.rand(5, 7, generator=g, dtype=torch.float64) * 3
    ref = -torch.rand(5, 7, generator=g, dtype=torch.float64) * 3
    scores = torch.randn(5, generator=g, dtype=torch.float64)
    mask = torch.arange(7).unsqueeze(0) < torch.tensor([[7], [1], [3], [6], [2]])
    for est in ("k1", "k2", "k3"):
        per_token = token_level_rewards(scores, logprobs, ref, mask, 0.05, est)
        rewards, _ = shaped_reward(scores, logprobs, ref, mask, 0.05, est)
        torch.testing.assert_close(per_token.sum(1), rewards)


def test_negative_beta_raises():
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="beta"):
        shaped_reward(SCORES, LOGPROBS, REF_LOGPROBS, mask, beta=-0.1)
    with pytest.raises(ValueError, match="beta"):
        token_level_rewards(SCORES, LOGPROBS, REF_LOGPROBS, mask, beta=-0.1)


def test_shaped_reward_is_detached():
    logprobs = LOGPROBS.clone().requires_grad_(True)
    rewards, kl = shaped_reward(SCORES, logprobs, REF_LOGPROBS, torch.ones(2, 3, dtype=torch.bool), 0.1)
    assert not rewards.requires_grad and not kl.requires_grad

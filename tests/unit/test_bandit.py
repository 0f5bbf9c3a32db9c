"""Statistical test: RLOO (eq. 5) is an unbiased, low-variance gradient estimator.

A categorical bandit with logits theta over V = 5 actions and a fixed reward
vector r. Exact gradient of J = E_{a~p}[r_a] with p = softmax(theta):
    dJ/dtheta_v = p_v * (r_v - p.r)
Each of M independent groups samples K actions and yields one gradient
estimate through the library path (token_logprobs -> sequence_logprobs ->
advantages -> policy_gradient_loss -> autograd). The mean of the M estimates
must match the exact gradient within 5 standard errors, where the standard
error is the empirical per-group std / sqrt(M) (no magic tolerance).
"""

import math

import torch

from rloo.core.advantages import leave_one_out
from rloo.core.logprobs import sequence_logprobs, token_logprobs
from rloo.core.losses import policy_gradient_loss

V, K, M = 5, 4, 20_000
THETA = torch.tensor([0.5, -0.3, 1.0, 0.0, -1.2], dtype=torch.float64)
REWARDS = torch.tensor([1.0, 0.0, 2.0, -1.0, 0.5], dtype=torch.float64)
Z = 5.0


def exact_gradient(rewards):
    p = torch.softmax(THETA, 0)
    return p * (rewards - (p * rewards).sum())


def no_baseline(rewards):
    return rewards  # vanilla REINFORCE, eq. (2)


def mean_including_self(rewards):
    # A tempting mistake: the baseline contains R_i itself, which scales the
    # expected gradient by (K-1)/K. Used to show the test has the power to fail.
    return rewards - rewards.mean(dim=1, keepdim=True)


def per_group_estimates(advantage_fn, rewards_vec, seed=0):
    """(M, V) gradient-ascent estimates of dJ/dtheta, one per group of K samples."""
    g = torch.Generator().manual_seed(seed)
    actions = torch.multinomial(torch.softmax(THETA, 0), M * K, replacement=True, generator=g)
    # One copy of theta per group, so autograd hands back each group's gradient separately.
    theta = THETA.repeat(M, 1).requires_grad_(True)  # (M, V)
    logits = theta.repeat_interleave(K, dim=0).unsqueeze(1)  # (N, T=1, V), N = M*K
    tok_lp = token_logprobs(logits, actions.view(-1, 1))
    seq_lp = sequence_logprobs(tok_lp, torch.ones_like(tok_lp, dtype=torch.bool))
    advantages = advantage_fn(rewards_vec[actions].view(M, K)).reshape(-1)
    loss, _ = policy_gradient_loss(seq_lp, advantages)
    loss.backward()
    # loss = -(1/N) sum_n A_n logp_n, so dloss/dtheta_m = -(1/M) * [(1/K) sum_{i in m} A_i grad logp_i]
    return -M * theta.grad


def assert_unbiased(estimates, exact):
    mean = estimates.mean(0)
    se = estimates.std(0) / math.sqrt(M)
    assert (se > 0).all()
    assert ((mean - exact).abs() <= Z * se).all(), f"mean {mean}, exact {exact}, se {se}"


def test_rloo_gradient_is_unbiased():
    assert_unbiased(per_group_estimates(leave_one_out, REWARDS), exact_gradient(REWARDS))


def test_no_baseline_reinforce_is_unbiased_too():
    assert_unbiased(per_group_estimates(no_baseline, REWARDS, seed=1), exact_gradient(REWARDS))


def test_baseline_that_includes_the_sample_is_detected_as_biased():
    estimates = per_group_estimates(mean_including_self, REWARDS, seed=2)
    exact = exact_gradient(REWARDS)
    se = estimates.std(0) / math.sqrt(M)
    # Its mean is (K-1)/K = 3/4 of the exact gradient, far outside 5 standard errors.
    assert ((estimates.mean(0) - exact).abs() > Z * se).any()
    torch.testing.assert_close(estimates.mean(0), (K - 1) / K * exact, atol=(Z * se).max().item(), rtol=0)


def test_rloo_variance_is_lower_than_no_baseline_with_reward_offset():
    # Adding 10 to every reward leaves the exact gradient unchanged (p.r shifts by 10 too)
    # and leaves RLOO untouched (leave-one-out is offset-invariant), but inflates the
    # no-baseline estimator's variance: each sample is pushed by ~10 * grad log p.
    shifted = REWARDS + 10.0
    torch.testing.assert_close(exact_gradient(shifted), exact_gradient(REWARDS))
    rloo = per_group_estimates(leave_one_out, shifted, seed=3)
    vanilla = per_group_estimates(no_baseline, shifted, seed=3)
    assert_unbiased(rloo, exact_gradient(shifted))
    assert_unbiased(vanilla, exact_gradient(shifted))
    rloo_var, vanilla_var = rloo.var(0).sum(), vanilla.var(0).sum()
    assert rloo_var < 0.1 * vanilla_var, (rloo_var.item(), vanilla_var.item())

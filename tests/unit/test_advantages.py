"""Hand-derived tests for rloo.core.advantages."""

import pytest
import torch

from rloo.core.advantages import (
    gae,
    group_normalized,
    leave_one_out,
    moving_average_advantages,
    moving_average_update,
    whiten,
)

# ----------------------------------------------------------------------------- leave-one-out


def test_leave_one_out_worked_example():
    # R = [1, 2, 3, 6]:
    #   b_0 = (2+3+6)/3 = 11/3 -> A_0 = 1 - 11/3 = -8/3
    #   b_1 = (1+3+6)/3 = 10/3 -> A_1 = 2 - 10/3 = -4/3
    #   b_2 = (1+2+6)/3 = 3    -> A_2 = 3 - 3    =  0
    #   b_3 = (1+2+3)/3 = 2    -> A_3 = 6 - 2    =  4
    # second group R = [0, 4]: A = [0-4, 4-0] = [-4, 4]
    rewards = torch.tensor([[1.0, 2.0, 3.0, 6.0]], dtype=torch.float64)
    expected = torch.tensor([[-8 / 3, -4 / 3, 0.0, 4.0]], dtype=torch.float64)
    torch.testing.assert_close(leave_one_out(rewards), expected)
    torch.testing.assert_close(leave_one_out(torch.tensor([[0.0, 4.0]])), torch.tensor([[-4.0, 4.0]]))


def test_leave_one_out_matches_literal_definition_and_scaled_centering():
    rewards = torch.randn(7, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    b, k = rewards.shape
    literal = torch.empty_like(rewards)
    for g in range(b):
        for i in range(k):
            others = [rewards[g, j] for j in range(k) if j != i]
            literal[g, i] = rewards[g, i] - sum(others) / (k - 1)
    out = leave_one_out(rewards)
    torch.testing.assert_close(out, literal)
    # eq. (5) rewritten: K/(K-1) * (R_i - mean)
    torch.testing.assert_close(out, k / (k - 1) * (rewards - rewards.mean(dim=1, keepdim=True)))
    # sum_i (R_i - b_i) = K*mean - K*mean = 0 in every group
    torch.testing.assert_close(out.sum(dim=1), torch.zeros(b, dtype=torch.float64))


def test_leave_one_out_is_invariant_to_a_reward_offset():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 6.0]], dtype=torch.float64)
    torch.testing.assert_close(leave_one_out(rewards + 10.0), leave_one_out(rewards))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("k", [2, 3, 4, 7])
def test_leave_one_out_is_eq_4_to_the_bit(dtype, k):
    """The one leave-one-out function (it also takes a valid mask) gives, with every sample scored,
    the very floats of eq. 4's direct form R_i - (sum_j R_j - R_i) / (K - 1) (the formula rloo used
    before the functions were merged): its count of neighbours, K - 1, is an exact float."""
    rewards = (10 * torch.randn(64, k, generator=torch.Generator().manual_seed(k))).to(dtype)
    direct = rewards - (rewards.sum(dim=1, keepdim=True) - rewards) / (k - 1)
    assert torch.equal(leave_one_out(rewards), direct)
    assert torch.equal(leave_one_out(rewards, torch.ones_like(rewards, dtype=torch.bool)), direct)


def test_leave_one_out_rejects_groups_of_one():
    with pytest.raises(ValueError, match=r"k >= 2.*k=1"):
        leave_one_out(torch.tensor([[1.0], [2.0]]))


def test_leave_one_out_rejects_flat_rewards():
    with pytest.raises(ValueError, match=r"\(B, K\)"):
        leave_one_out(torch.tensor([1.0, 2.0, 3.0]))


# ----------------------------------------------------------------------------- moving average


def test_moving_average_update_on_numbers():
    # 0.9 * 1.0 + 0.1 * mean([2, 4]) = 0.9 + 0.3 = 1.2
    new = moving_average_update(torch.tensor(1.0), torch.tensor([2.0, 4.0]), momentum=0.9)
    assert new.dim() == 0
    torch.testing.assert_close(new, torch.tensor(1.2))
    # momentum 0: the baseline is just this batch's mean
    torch.testing.assert_close(
        moving_average_update(torch.tensor(5.0), torch.tensor([2.0, 4.0]), momentum=0.0), torch.tensor(3.0)
    )


@pytest.mark.parametrize("momentum", [1.0, -0.1, 1.5])
def test_moving_average_update_rejects_bad_momentum(momentum):
    with pytest.raises(ValueError, match="momentum"):
        moving_average_update(torch.tensor(0.0), torch.tensor([1.0]), momentum)


def test_moving_average_update_rejects_non_scalar_baseline():
    with pytest.raises(ValueError, match="0-d"):
        moving_average_update(torch.tensor([0.0]), torch.tensor([1.0]), 0.5)


def test_moving_average_advantages_use_the_previous_baseline():
    # eq. (3): A = R - b with b from before the batch: [2 - 1.2, 4 - 1.2] = [0.8, 2.8]
    baseline = torch.tensor(1.2)
    rewards = torch.tensor([2.0, 4.0])
    torch.testing.assert_close(moving_average_advantages(rewards, baseline), torch.tensor([0.8, 2.8]))


# ----------------------------------------------------------------------------- group normalized


def test_group_normalized_worked_example_and_constant_group():
    # R = [1, 2, 3, 6]: mean 3, deviations [-2, -1, 0, 3], sum sq = 14,
    # unbiased std = sqrt(14/3) = 2.1602469 -> [-0.9258201, -0.4629100, 0, 1.3887301]
    # R = [0.1]*4: every reward equal -> exact zeros (no NaN, no rounding noise)
    rewards = torch.tensor([[1.0, 2.0, 3.0, 6.0], [0.1, 0.1, 0.1, 0.1]], dtype=torch.float64)
    out = group_normalized(rewards, eps=0.0)
    std = (14 / 3) ** 0.5
    torch.testing.assert_close(out[0], torch.tensor([-2 / std, -1 / std, 0.0, 3 / std], dtype=torch.float64))
    assert torch.equal(out[1], torch.zeros(4, dtype=torch.float64))
    assert not torch.isnan(out).any()


def test_group_normalized_k2_and_k1():
    # K = 2, R = [0, 1]: mean 0.5, unbiased std = sqrt((0.25 + 0.25) / 1) = 0.7071 -> [-0.7071, 0.7071]
    torch.testing.assert_close(
        group_normalized(torch.tensor([[0.0, 1.0]]), eps=0.0), torch.tensor([[-(0.5**0.5), 0.5**0.5]])
    )
    with pytest.raises(ValueError, match="k=1"):
        group_normalized(torch.tensor([[1.0], [2.0]]))


# ----------------------------------------------------------------------------- GAE


def gae_reference(rewards, values, mask, gamma, lam):
    """Plain per-sequence reverse loop in Python floats (the textbook recursion)."""
    n, t = rewards.shape
    adv = torch.zeros(n, t, dtype=torch.float64)
    ret = torch.zeros(n, t, dtype=torch.float64)
    for i in range(n):
        length = int(mask[i].sum())
        r = rewards[i, :length].tolist()
        v = values[i, :length].tolist()
        running = 0.0
        for s in reversed(range(length)):
            next_v = v[s + 1] if s + 1 < length else 0.0  # episode ends after the last real token
            delta = r[s] + gamma * next_v - v[s]
            running = delta + gamma * lam * running
            adv[i, s] = running
            ret[i, s] = running + v[s]
    return adv, ret


def test_gae_worked_example_gamma1_lam1():
    # rewards [0, 0, 1], values [0.5, 0.2, 0.4], 4th position is padding (garbage values).
    # gamma = lam = 1: returns = reward-to-go = [1, 1, 1]; advantages = returns - values = [0.5, 0.8, 0.6]
    rewards = torch.tensor([[0.0, 0.0, 1.0, 99.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.2, 0.4, -7.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.8, 0.6, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64))


def test_gae_worked_example_discounted():
    # rewards [1, 0, 2], values [0.5, 1.0, 1.5], gamma = lam = 0.5 (so gamma*lam = 0.25):
    #   delta_2 = 2 + 0          - 1.5 =  0.5   A_2 = 0.5
    #   delta_1 = 0 + 0.5 * 1.5  - 1.0 = -0.25  A_1 = -0.25 + 0.25 * 0.5    = -0.125
    #   delta_0 = 1 + 0.5 * 1.0  - 0.5 =  1.0   A_0 =  1.0  + 0.25 * -0.125 =  0.96875
    #   returns = A + V = [1.46875, 0.875, 2.0]
    rewards = torch.tensor([[1.0, 0.0, 2.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 1.0, 1.5]], dtype=torch.float64)
    adv, ret = gae(rewards, values, torch.ones(1, 3, dtype=torch.bool), gamma=0.5, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.96875, -0.125, 0.5]], dtype=torch.float64))
    torch.testing.assert_close(ret, torch.tensor([[1.46875, 0.875, 2.0]], dtype=torch.float64))


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 0.7)])
def test_gae_matches_reference_loop_on_ragged_masks(gamma, lam):
    g = torch.Generator().manual_seed(1)
    n, t = 6, 9
    rewards = torch.randn(n, t, generator=g, dtype=torch.float64)
    values = torch.randn(n, t, generator=g, dtype=torch.float64)
    lengths = torch.tensor([9, 1, 0, 4, 7, 3])
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    ref_adv, ref_ret = gae_reference(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(ret, ref_ret)


def test_gae_lambda1_gamma1_returns_are_reward_to_go():
    g = torch.Generator().manual_seed(2)
    rewards = torch.randn(4, 5, generator=g, dtype=torch.float64)
    values = torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = torch.arange(5).unsqueeze(0) < torch.tensor([[5], [3], [1], [4]])
    _, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    masked = torch.where(mask, rewards, 0.0)
    reward_to_go = masked.flip(1).cumsum(1).flip(1)
    torch.testing.assert_close(ret, torch.where(mask, reward_to_go, 0.0))


def test_gae_rejects_left_padded_mask():
    mask = torch.tensor([[False, True, True]])
    with pytest.raises(ValueError, match="right-padded"):
        gae(torch.zeros(1, 3), torch.zeros(1, 3), mask, 1.0, 1.0)


def test_gae_rejects_float_mask():
    with pytest.raises(ValueError, match="bool"):
        gae(torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3), 1.0, 1.0)


# ----------------------------------------------------------------------------- whiten


def test_whiten_on_numbers():
    # real tokens [1, 2, 3, 6]: mean 3, population var = 14/4 = 3.5 -> (x - 3) / sqrt(3.5)
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 6.0, -50.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, False]])
    out = whiten(x, mask, eps=0.0)
    s = 3.5**0.5
    expected = torch.tensor([[-2 / s, -1 / s, 0.0], [0.0, 3 / s, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(out, expected)

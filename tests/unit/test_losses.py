"""Hand-derived tests for rloo.core.losses."""

import math

import pytest
import torch

from rloo.core.losses import (
    bradley_terry_loss,
    dpo_loss,
    policy_gradient_loss,
    ppo_clip_loss,
    raft_select,
    sft_loss,
    value_loss,
)


def f64(*values):
    return torch.tensor(values, dtype=torch.float64)


def assert_stats_detached_scalars(stats):
    for name, value in stats.items():
        assert isinstance(value, torch.Tensor) and value.dim() == 0, name
        assert not value.requires_grad, name


# ----------------------------------------------------------------------------- policy gradient


def test_policy_gradient_loss_value_and_gradient():
    # eq. (5): loss = -mean(A * logp) = -(2*(-1) + (-1)*(-3)) / 2 = -(-2 + 3) / 2 = -0.5
    # d loss / d logp_i = -A_i / N = [-1, 0.5]; advantages get no gradient.
    logp = f64(-1.0, -3.0).requires_grad_(True)
    adv = f64(2.0, -1.0).requires_grad_(True)
    loss, stats = policy_gradient_loss(logp, adv)
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(-0.5, dtype=torch.float64))
    torch.testing.assert_close(logp.grad, f64(-1.0, 0.5))
    assert adv.grad is None
    # adv mean 0.5, population std = sqrt(((2-0.5)^2 + (-1-0.5)^2)/2) = 1.5
    torch.testing.assert_close(stats["adv/mean"], torch.tensor(0.5, dtype=torch.float64))
    torch.testing.assert_close(stats["adv/std"], torch.tensor(1.5, dtype=torch.float64))
    torch.testing.assert_close(stats["loss/policy"], torch.tensor(-0.5, dtype=torch.float64))
    assert_stats_detached_scalars(stats)


def test_policy_gradient_loss_shape_mismatch():
    with pytest.raises(ValueError, match="shapes must match"):
        policy_gradient_loss(torch.zeros(4), torch.zeros(2, 2))


# ----------------------------------------------------------------------------- PPO clip

EPS = 0.2
# (advantage, ratio, expected objective min(r*A, clip(r)*A), clipped active?, d objective / d logp)
PPO_CASES = {
    # A > 0, ratio 1.5 > 1.2: min(1.5, 1.2) = 1.2 -> clipped, flat, gradient 0
    "pos_adv_above_band": (1.0, 1.5, 1.2, True, 0.0),
    # A < 0, ratio 0.5 < 0.8: min(-0.5, -0.8) = -0.8 -> clipped, gradient 0
    "neg_adv_below_band": (-1.0, 0.5, -0.8, True, 0.0),
    # inside the band: ratio 1.1, A = 2: 2.2 both ways -> unclipped, d(r*A)/dlogp = A*r = 2.2
    "inside_band": (2.0, 1.1, 2.2, False, 2.2),
    # pessimistic side: A > 0 but ratio 0.5 below the band: min(0.5, 0.8) = 0.5 -> unclipped, grad A*r = 0.5
    "pos_adv_below_band": (1.0, 0.5, 0.5, False, 0.5),
    # A < 0, ratio 1.5 above the band: min(-1.5, -1.2) = -1.5 -> unclipped, grad A*r = -1.5
    "neg_adv_above_band": (-1.0, 1.5, -1.5, False, -1.5),
}


@pytest.mark.parametrize("case", PPO_CASES)
def test_ppo_clip_single_token(case):
    adv, ratio, objective, clipped, grad = PPO_CASES[case]
    old = f64(-1.0)
    logp = (old + math.log(ratio)).requires_grad_(True)
    loss, stats = ppo_clip_loss(logp, old, f64(adv), None, clip_eps=EPS)
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(-objective, dtype=torch.float64))
    torch.testing.assert_close(logp.grad, f64(-grad))
    assert stats["ppo/clipfrac"].item() == (1.0 if clipped else 0.0)
    torch.testing.assert_close(stats["ppo/ratio_mean"], torch.tensor(ratio, dtype=torch.float64))


def test_ppo_clip_token_level_with_mask():
    # Tokens 0..3 are cases A-D below, token 4 is padding with absurd values.
    #   objectives [1.2, -0.8, 2.2, 0.5] -> loss = -(1.2 - 0.8 + 2.2 + 0.5) / 4 = -3.1 / 4 = -0.775
    #   clipped active on tokens 0, 1 -> clipfrac 2/4 = 0.5
    #   d loss / d logp = -(1/4) * [0, 0, 2.2, 0.5] = [0, 0, -0.55, -0.125], padding 0
    #   ratio_mean = (1.5 + 0.5 + 1.1 + 0.5) / 4 = 0.9
    #   approx_kl (k3 with r = log ratio): mean of (ratio - 1) - log ratio over real tokens
    ratios = [1.5, 0.5, 1.1, 0.5]
    old = torch.full((1, 5), -2.0, dtype=torch.float64)
    logp = old.clone()
    logp[0, :4] += torch.log(f64(*ratios))
    logp[0, 4] = 50.0
    logp.requires_grad_(True)
    adv = f64(1.0, -1.0, 2.0, 1.0, 1e6).view(1, 5)
    mask = torch.tensor([[True, True, True, True, False]])
    loss, stats = ppo_clip_loss(logp, old, adv, mask, clip_eps=EPS)
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(-0.775, dtype=torch.float64))
    torch.testing.assert_close(logp.grad, f64(0.0, 0.0, -0.55, -0.125, 0.0).view(1, 5))
    torch.testing.assert_close(stats["ppo/clipfrac"], torch.tensor(0.5, dtype=torch.float64))
    torch.testing.assert_close(stats["ppo/ratio_mean"], torch.tensor(0.9, dtype=torch.float64))
    k3 = sum((r - 1) - math.log(r) for r in ratios) / 4
    torch.testing.assert_close(stats["ppo/approx_kl"], torch.tensor(k3, dtype=torch.float64))
    assert_stats_detached_scalars(stats)


def test_ppo_clip_sequence_advantages_broadcast_over_tokens():
    # GRPO style: one advantage per completion, shared by its tokens.
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 4, generator=g, dtype=torch.float64)
    old = logp + 0.3 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    adv = f64(1.0, -2.0, 0.5)
    mask = torch.ones(3, 4, dtype=torch.bool)
    broadcast, _ = ppo_clip_loss(logp, old, adv, mask, 0.2)
    explicit, _ = ppo_clip_loss(logp, old, adv.unsqueeze(1).expand(3, 4), mask, 0.2)
    torch.testing.assert_close(broadcast, explicit)
    with pytest.raises(ValueError, match="advantages"):
        ppo_clip_loss(logp, old, torch.zeros(4), mask, 0.2)


def test_ppo_clip_equals_policy_gradient_at_ratio_one_in_gradient():
    # With old == current (ratio 1, first epoch) the PPO gradient is -A * grad logp / N:
    # the same direction as the REINFORCE gradient per token.
    logp = f64(-1.0, -2.0, -0.5).requires_grad_(True)
    adv = f64(1.0, -2.0, 3.0)
    loss, stats = ppo_clip_loss(logp, logp.detach(), adv, None, 0.2)
    loss.backward()
    torch.testing.assert_close(logp.grad, -adv / 3)
    assert stats["ppo/clipfrac"].item() == 0.0


# ----------------------------------------------------------------------------- value loss


def test_value_loss_unclipped_and_clipped():
    # values [1, 2, (3 padding)], returns [1.5, 2, (0)]:
    #   squared errors [0.25, 0] -> 0.5 * mean = 0.5 * 0.125 = 0.0625
    values = f64(1.0, 2.0, 3.0).view(1, 3)
    returns = f64(1.5, 2.0, 0.0).view(1, 3)
    mask = torch.tensor([[True, True, False]])
    loss, stats = value_loss(values, returns, mask)
    torch.testing.assert_close(loss, torch.tensor(0.0625, dtype=torch.float64))
    assert "value/clipfrac" not in stats
    # clipping with old [0, 2.1], eps 0.2:
    #   token 0: V_clip = 0 + clip(1 - 0) = 0.2, (0.2 - 1.5)^2 = 1.69 > 0.25 -> 1.69 (clipped active)
    #   token 1: V_clip = 2.1 + clip(-0.1) = 2.0, error 0 both ways -> 0
    #   loss = 0.5 * (1.69 + 0) / 2 = 0.4225, clipfrac 1/2
    old = f64(0.0, 2.1, 3.0).view(1, 3)
    values.requires_grad_(True)
    loss, stats = value_loss(values, returns, mask, old_values=old, clip_eps=0.2)
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(0.4225, dtype=torch.float64))
    torch.testing.assert_close(stats["value/clipfrac"], torch.tensor(0.5, dtype=torch.float64))
    # token 0's active term is the clipped one, flat in V -> zero gradient; token 1: V - R = 0
    torch.testing.assert_close(values.grad, torch.zeros(1, 3, dtype=torch.float64))
    assert_stats_detached_scalars(stats)


def test_value_loss_clip_needs_old_values():
    with pytest.raises(ValueError, match="old_values"):
        value_loss(torch.zeros(3), torch.zeros(3), None, clip_eps=0.2)


# ----------------------------------------------------------------------------- DPO / Bradley-Terry


def test_dpo_loss_worked_example():
    # pair 0: chosen log-ratio -10 - (-12) = 2, rejected -15 - (-14) = -1 -> beta*(2 - (-1)) = 0.5*3 = 1.5
    #         -log sigmoid(1.5) = log(1 + e^-1.5) = log(1.2231302) = 0.2014133
    # pair 1: chosen -5 - (-5) = 0, rejected -4 - (-6) = 2 -> 0.5*(0 - 2) = -1.0
    #         -log sigmoid(-1) = log(1 + e) = 1.3132617
    # loss = (0.2014133 + 1.3132617) / 2 = 0.7573375; accuracy 1/2; margin (1.5 - 1)/2 = 0.25
    loss, stats = dpo_loss(f64(-10.0, -5.0), f64(-15.0, -4.0), f64(-12.0, -5.0), f64(-14.0, -6.0), beta=0.5)
    expected = (math.log(1 + math.exp(-1.5)) + math.log(1 + math.e)) / 2
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64))
    assert abs(expected - 0.7573375) < 1e-6
    torch.testing.assert_close(stats["dpo/accuracy"], torch.tensor(0.5))
    torch.testing.assert_close(stats["dpo/margin"], torch.tensor(0.25, dtype=torch.float64))
    # implicit rewards: chosen 0.5*[2, 0] -> mean 0.5; rejected 0.5*[-1, 2] -> mean 0.25
    torch.testing.assert_close(stats["dpo/chosen_reward"], torch.tensor(0.5, dtype=torch.float64))
    torch.testing.assert_close(stats["dpo/rejected_reward"], torch.tensor(0.25, dtype=torch.float64))
    assert_stats_detached_scalars(stats)


def test_dpo_gradient_pushes_chosen_up_and_rejected_down():
    pc, pr = f64(-10.0).requires_grad_(True), f64(-15.0).requires_grad_(True)
    loss, _ = dpo_loss(pc, pr, f64(-12.0), f64(-14.0), beta=0.5)
    loss.backward()
    # d/dpc = -beta * sigmoid(-1.5) = -0.5 * 0.1824255 = -0.0912128; d/dpr = +0.0912128
    s = 1 / (1 + math.exp(1.5))
    torch.testing.assert_close(pc.grad, f64(-0.5 * s))
    torch.testing.assert_close(pr.grad, f64(0.5 * s))


def test_dpo_rejects_nonpositive_beta():
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(f64(0.0), f64(0.0), f64(0.0), f64(0.0), beta=0.0)


def test_bradley_terry_worked_example():
    # margins [2 - 1, 0 - 0] = [1, 0]
    #   -log sigmoid(1) = log(1 + e^-1) = 0.3132617; -log sigmoid(0) = log 2 = 0.6931472
    #   loss = 0.5032044; accuracy 1/2 (a tie is not a win); margin 0.5
    loss, stats = bradley_terry_loss(f64(2.0, 0.0), f64(1.0, 0.0))
    torch.testing.assert_close(loss, torch.tensor((math.log(1 + math.exp(-1)) + math.log(2)) / 2, dtype=torch.float64))
    assert abs(loss.item() - 0.5032044) < 1e-6
    torch.testing.assert_close(stats["rm/accuracy"], torch.tensor(0.5))
    torch.testing.assert_close(stats["rm/margin"], torch.tensor(0.5, dtype=torch.float64))


# ----------------------------------------------------------------------------- SFT / RAFT


def test_sft_loss_is_token_averaged():
    # real tokens: -1, -2 (seq 0) and -0.5 (seq 1) -> NLL mean = 3.5 / 3 = 1.1666667
    # (a per-sequence average would give (1.5 + 0.5) / 2 = 1.0 instead)
    logprobs = f64(-1.0, -2.0, -9.0, -0.5, -7.0, -8.0).view(2, 3)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    loss, stats = sft_loss(logprobs, mask)
    torch.testing.assert_close(loss, torch.tensor(3.5 / 3, dtype=torch.float64))
    torch.testing.assert_close(stats["loss/sft"], loss)


def test_raft_select_picks_argmax_first_on_ties():
    rewards = torch.tensor([[0.1, 0.9, 0.3, 0.2], [2.0, -1.0, 2.0, 0.0], [-3.0, -2.0, -5.0, -2.5]])
    idx = raft_select(rewards)
    assert idx.dtype == torch.long
    assert idx.tolist() == [1, 0, 1]


def test_raft_select_rejects_flat_rewards():
    with pytest.raises(ValueError, match="B, K"):
        raft_select(torch.tensor([1.0, 2.0]))

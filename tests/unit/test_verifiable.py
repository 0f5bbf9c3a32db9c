"""Hand-derived tests of the RL-with-a-checker math: pass@k, Dr. GRPO, REINFORCE++, the None rule
(unscored samples) and the zero-variance filter."""

import itertools
import math
import random

import pytest
import torch

from rloo.algorithms.common import kept_rows
from rloo.core.advantages import (
    group_mean_advantages,
    group_normalized,
    group_normalized_valid,
    leave_one_out,
    reinforce_pp_advantages,
    unscored,
    zero_variance_groups,
)
from rloo.core.losses import dr_grpo_loss, grpo_loss
from rloo.eval.passk import mean_ci, paired_pass_difference, pass_at_k, summarize_counts, zero_variance_at_k

F64 = torch.float64

# ----------------------------------------------------------------------------- pass@k


def _brute_force(n: int, c: int, k: int) -> tuple[float, float]:
    """Over every k-subset of n samples of which the first c are correct: the share holding a
    correct one (pass@k), and the share that is all correct or all wrong (zero variance)."""
    hit = same = total = 0
    for subset in itertools.combinations(range(n), k):
        correct = sum(i < c for i in subset)
        hit += correct > 0
        same += correct in (0, k)
        total += 1
    return hit / total, same / total


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_and_zero_variance_equal_subset_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            p, z = _brute_force(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(p, abs=1e-12), (n, c, k)
            assert zero_variance_at_k(n, c, k) == pytest.approx(z, abs=1e-12), (n, c, k)


def test_pass_at_k_worked_numbers():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2; k=1 is c/n; k=n is 1 as soon as c >= 1
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(8, 1, 8) == 1.0 and pass_at_k(8, 0, 8) == 0.0
    # zero variance of pairs from c=2 of n=4: (C(2,2) + C(2,2)) / C(4,2) = 2/6
    assert zero_variance_at_k(4, 2, 2) == pytest.approx(1 / 3)


def test_pass_at_k_is_unbiased_for_one_minus_one_minus_p_to_the_k():
    # A problem solved with probability p: E[pass@k estimate] = 1 - (1-p)^k. 4000 draws of n=16
    # samples; the estimate is in [0, 1] so its std is <= 0.5 and 5 standard errors of the mean
    # are <= 5 * 0.5 / sqrt(4000) = 0.04 (we use the measured std, far tighter).
    rng = random.Random(0)
    n, p, draws = 16, 0.2, 4000
    for k in (1, 2, 4, 8):
        est = [pass_at_k(n, sum(rng.random() < p for _ in range(n)), k) for _ in range(draws)]
        mean = sum(est) / draws
        sd = math.sqrt(sum((e - mean) ** 2 for e in est) / (draws - 1))
        assert abs(mean - (1 - (1 - p) ** k)) < 5 * sd / math.sqrt(draws) + 1e-9, k


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_summaries_and_paired_difference():
    counts = [0, 4, 2]  # n = 4: pass@1 per problem 0, 1, 1/2
    pass_k, zero = summarize_counts(counts, 4, ks=(1, 2, 8))
    assert set(pass_k) == {1, 2} and set(zero) == {2}  # k = 8 > n is left out
    assert pass_k[1][0] == pytest.approx(0.5)
    # zero-var@2: 1, 1, (1 + 1)/6
    assert zero[2] == pytest.approx((1 + 1 + 1 / 3) / 3)
    # half-width: sd of (0, 1, 0.5) = 0.5, 1.96 * 0.5 / sqrt(3)
    assert pass_k[1][1] == pytest.approx(1.959963984540054 * 0.5 / math.sqrt(3))
    diff, half = paired_pass_difference([1, 4, 2], counts, 4, 1)
    assert diff == pytest.approx(0.25 / 3) and half == pytest.approx(mean_ci([0.25, 0.0, 0.0])[1])


# ----------------------------------------------------------------------------- Dr. GRPO


def test_group_mean_advantages_worked_example():
    # group [1, 0, 0, 1]: mean 1/2 -> [1/2, -1/2, -1/2, 1/2]; GRPO would divide by std = sqrt(1/3)
    # group [1, 0, 0, 0]: mean 1/4 -> [3/4, -1/4, -1/4, -1/4]
    r = torch.tensor([[1.0, 0, 0, 1], [1, 0, 0, 0]], dtype=F64)
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.75, -0.25, -0.25, -0.25]], dtype=F64)
    torch.testing.assert_close(group_mean_advantages(r), expected)
    # (K-1)/K times the leave-one-out advantage
    torch.testing.assert_close(group_mean_advantages(r), 3 / 4 * leave_one_out(r))
    # GRPO's std makes the rare success (second group) weigh more: 0.75 / 0.5 = 1.5 vs 0.5 / 0.577
    g = group_normalized(r)
    assert g[1, 0] / g[0, 0] > group_mean_advantages(r)[1, 0] / group_mean_advantages(r)[0, 0]


def test_dr_grpo_loss_sums_tokens_over_a_constant():
    # two completions, lengths 2 and 1 (T = 3), ratio 1 (logprobs == old), beta 0, L = 4:
    #   loss = -(A_0 * 2 tokens + A_1 * 1 token) / (N L) = -(1 * 2 + (-1) * 1) / (2 * 4) = -1/8
    # a per-sequence-length mean would give -(1 + (-1)) / 2 = 0 instead
    lp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    loss, stats = dr_grpo_loss(lp, lp.detach(), lp.detach(), adv, mask, clip_eps=0.2, beta=0.0, norm_length=4)
    assert loss.item() == pytest.approx(-1 / 8)
    # gradient wrt each real token's log-prob: -A_i / (N L) (ratio' = 1 at ratio 1); padding 0
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1 / 8, -1 / 8, 0], [1 / 8, 0, 0]], dtype=F64))
    assert stats["loss/kl"].item() == 0.0


def test_dr_grpo_loss_kl_term_is_summed_too():
    # one token with log pi = log 0.5, log ref = log 0.25: k3 = (e^r - 1) - r, r = log(ref/pi) = log 0.5
    #   k3 = (0.5 - 1) - log 0.5 = 0.19315; two such tokens in one completion, N = 1, L = 4: 2 k3 / 4
    lp = torch.log(torch.tensor([[0.5, 0.5]], dtype=F64))
    ref = torch.log(torch.tensor([[0.25, 0.25]], dtype=F64))
    mask = torch.ones(1, 2, dtype=torch.bool)
    k3 = (0.5 - 1) - math.log(0.5)
    loss, stats = dr_grpo_loss(lp, lp, ref, torch.zeros(1, dtype=F64), mask, 0.2, beta=0.1, norm_length=4)
    assert stats["loss/kl"].item() == pytest.approx(2 * k3 / 4)
    assert loss.item() == pytest.approx(0.1 * 2 * k3 / 4)
    # GRPO averages the same tokens instead: k3 per token
    _, g = grpo_loss(lp, lp, ref, torch.zeros(1, dtype=F64), mask, 0.2, beta=0.1)
    assert g["loss/kl"].item() == pytest.approx(k3)


# ----------------------------------------------------------------------------- REINFORCE++


def test_reinforce_pp_advantages_worked_example():
    # scores [1, 0], beta 0.5, per-token kl [[0.2, 0.4], [0.6, pad]]:
    #   G_0 = [1 - 0.5*0.6, 1 - 0.5*0.4] = [0.7, 0.8];  G_1 = [0 - 0.5*0.6] = [-0.3]
    #   batch tokens {0.7, 0.8, -0.3}: mean 0.4, population var ((0.3)^2 + 0.4^2 + 0.7^2)/3 = 0.74/3
    scores = torch.tensor([1.0, 0.0], dtype=F64)
    kl = torch.tensor([[0.2, 0.4], [0.6, 9.9]], dtype=F64)
    mask = torch.tensor([[True, True], [True, False]])
    sd = math.sqrt(0.74 / 3)
    expected = torch.tensor([[0.3 / sd, 0.4 / sd], [-0.7 / sd, 0.0]], dtype=F64)
    torch.testing.assert_close(reinforce_pp_advantages(scores, kl, mask, 0.5, eps=0.0), expected)


def test_reinforce_pp_baseline_is_the_batch_not_the_group():
    # beta 0, one token each: two prompts x k=2 with scores [1, 1 | 0, 1]. Batch mean 3/4,
    # population std sqrt(3)/4: A = [1/sqrt3, 1/sqrt3, -sqrt3, 1/sqrt3]. A group baseline would give
    # the all-correct first group 0; the batch baseline pushes it up.
    scores = torch.tensor([1.0, 1, 0, 1], dtype=F64)
    adv = reinforce_pp_advantages(
        scores, torch.zeros(4, 1, dtype=F64), torch.ones(4, 1, dtype=torch.bool), 0.0, eps=0.0
    )
    s3 = math.sqrt(3)
    torch.testing.assert_close(adv[:, 0], torch.tensor([1 / s3, 1 / s3, -s3, 1 / s3], dtype=F64))


# ----------------------------------------------------------------------------- the None rule


def test_unscored_splits_nan():
    filled, valid = unscored(torch.tensor([1.0, float("nan"), 0.0]))
    assert filled.tolist() == [1.0, 0.0, 0.0] and valid.tolist() == [True, False, True]


def test_leave_one_out_excludes_unscored_from_the_baseline():
    # group [1, None, 0, 1]: sample 0's baseline is mean(0, 1) = 1/2 -> A = 1/2; sample 2: mean(1, 1)
    # = 1 -> A = -1; sample 3: mean(1, 0) -> 1/2; the unscored sample gets 0.
    # group [None, 1, None, None]: the one scored sample has no neighbour: 0 (no baseline exists).
    r = torch.tensor([[1.0, float("nan"), 0, 1], [float("nan"), 1, float("nan"), float("nan")]], dtype=F64)
    filled, valid = unscored(r)
    adv = leave_one_out(filled, valid)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0, -1, 0.5], [0, 0, 0, 0]], dtype=F64))
    # NaN in the unscored places is never read
    assert torch.isfinite(leave_one_out(r, valid)).all()
    # every sample scored: the same as no mask at all
    full = torch.randn(5, 4, dtype=F64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(leave_one_out(full, torch.ones_like(full, dtype=torch.bool)), leave_one_out(full))


def test_group_baselines_with_unscored_samples():
    # group [1, None, 0, 0]: scored mean 1/3 -> Dr. GRPO [2/3, 0, -1/3, -1/3]
    r = torch.tensor([[1.0, float("nan"), 0, 0]], dtype=F64)
    filled, valid = unscored(r)
    torch.testing.assert_close(
        group_mean_advantages(filled, valid), torch.tensor([[2 / 3, 0, -1 / 3, -1 / 3]], dtype=F64)
    )
    # GRPO over the three scored: std (unbiased) of (1, 0, 0) = sqrt(1/3)
    s = math.sqrt(1 / 3)
    torch.testing.assert_close(
        group_normalized_valid(filled, valid, eps=0.0),
        torch.tensor([[2 / 3 / s, 0, -1 / 3 / s, -1 / 3 / s]], dtype=F64),
    )
    full = torch.randn(5, 4, dtype=F64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(
        group_normalized_valid(full, torch.ones_like(full, dtype=torch.bool)), group_normalized(full)
    )
    # REINFORCE++: the unscored row is out of the batch statistics and gets 0
    adv = reinforce_pp_advantages(
        filled[0], torch.zeros(4, 1, dtype=F64), torch.ones(4, 1, dtype=torch.bool), 0.0, valid=valid[0], eps=0.0
    )
    torch.testing.assert_close(
        adv[:, 0],
        torch.tensor([2 / 3 / math.sqrt(2 / 9), 0, -1 / 3 / math.sqrt(2 / 9), -1 / 3 / math.sqrt(2 / 9)], dtype=F64),
    )


# ----------------------------------------------------------------------------- zero variance


def test_zero_variance_groups():
    # all equal -> True; mixed -> False; one scored only -> True (no baseline); all equal among the
    # scored ones -> True; none scored -> True (max over nothing is -inf, min +inf: not "equal")
    nan = float("nan")
    s = torch.tensor([[1.0, 1, 1], [1, 0, 1], [nan, 1, nan], [0, nan, 0], [nan, nan, nan]])
    filled, valid = unscored(s)
    assert zero_variance_groups(filled, valid).tolist() == [True, False, True, True, True]
    assert zero_variance_groups(torch.tensor([[0.5, 0.5], [0.5, 0.25]])).tolist() == [True, False]


def test_kept_rows_leave_out_the_constant_groups():
    nan = float("nan")
    # k = 2: groups [1, 1] (constant), [0, 1], [nan, 1] (one scored: constant), [0, 0.5]
    scores = torch.tensor([1.0, 1, 0, 1, nan, 1, 0, 0.5])
    rows, dropped = kept_rows(scores, 2, drop=True)
    assert rows.tolist() == [2, 3, 6, 7] and dropped == 2
    rows, dropped = kept_rows(scores, 2, drop=False)
    assert rows.tolist() == list(range(8)) and dropped == 0

"""rloo.core.accumulation by hand: the split, the shares, and why the shares make the sum exact."""

from __future__ import annotations

import torch

from rloo.core.accumulation import micro_batches, micro_shares, weighted_stats


def test_split_sorts_keeps_the_remainder_last_and_none_is_one_part():
    rows = torch.tensor([5, 0, 3, 1, 4, 2])
    assert [p.tolist() for p in micro_batches(rows, 4)] == [[0, 1, 2, 3], [4, 5]]
    assert [p.tolist() for p in micro_batches(rows, None)] == [[5, 0, 3, 1, 4, 2]]  # untouched
    assert [p.tolist() for p in micro_batches(rows, 6)] == [[5, 0, 3, 1, 4, 2]]
    # whole groups of k = 2 (rows 2i, 2i+1), split in multiples of k: each group stays together
    assert [p.tolist() for p in micro_batches(torch.tensor([3, 2, 0, 1]), 2)] == [[0, 1], [2, 3]]


def test_shares_by_rows_and_by_tokens():
    parts = [torch.tensor([0, 1, 2]), torch.tensor([3])]
    assert micro_shares(parts) == [0.75, 0.25]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)
    # tokens: 2 + 1 + 3 = 6 in the first part, 3 in the second, of 9
    assert micro_shares(parts, mask) == [6 / 9, 3 / 9]
    assert micro_shares(parts, torch.zeros(4, 3, dtype=torch.bool)) == [0.0, 0.0]


def test_shares_turn_micro_means_into_the_batch_mean():
    # token mean over the batch: (1+2 + 3 + 4+5+6 + 7+8+9) / 9 = 5; micro-batch means 21/6 and 24/3
    x = torch.tensor([[1.0, 2, 0], [3, 0, 0], [4, 5, 6], [7, 8, 9]])  # 0: padding
    mask = x > 0
    parts = [torch.tensor([0, 1, 2]), torch.tensor([3])]
    means = [x[p][mask[p]].mean() for p in parts]  # 21/6 = 3.5 and 24/3 = 8
    shares = micro_shares(parts, mask)
    assert abs(sum(s * m for s, m in zip(shares, means, strict=True)) - x[mask].mean()) < 1e-6  # 45/9 = 5
    assert abs((means[0] + means[1]) / 2 - 5.75) < 1e-6  # equal weights would be wrong: (3.5 + 8) / 2


def test_weighted_stats_are_share_weighted_means():
    out = weighted_stats(
        [{"loss": torch.tensor(2.0), "acc": 1.0}, {"loss": torch.tensor(4.0), "acc": 0.0}], [0.25, 0.75]
    )
    assert out["loss"].item() == 3.5 and out["acc"].item() == 0.25

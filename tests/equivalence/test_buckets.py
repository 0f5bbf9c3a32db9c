"""length_buckets: a partition of the non-empty rows that minimises padded tokens + per-pass cost."""

from __future__ import annotations

import itertools

import torch

from rloo.data.buckets import length_buckets


def _cost(lengths, buckets, overhead):
    return sum(len(b) * int(lengths[b].max()) + overhead for b in buckets)


def _brute_force(lengths, overhead):
    """Best cost over every way to cut the sorted distinct lengths into contiguous runs."""
    vals = sorted(set(int(v) for v in lengths if v > 0))
    best = float("inf")
    for cuts in itertools.product([False, True], repeat=max(len(vals) - 1, 0)):
        runs, start = [], 0
        for i, cut in enumerate(cuts, start=1):
            if cut:
                runs.append(vals[start:i])
                start = i
        runs.append(vals[start:])
        cost = sum(sum(1 for v in lengths if run[0] <= v <= run[-1]) * run[-1] + overhead for run in runs)
        best = min(best, cost)
    return best


def test_buckets_partition_non_empty_rows_and_are_optimal():
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        lengths = torch.randint(0, 12, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g)
        for overhead in (0, 5, 40, 10**6):
            buckets = length_buckets(lengths, overhead)
            rows = torch.cat(buckets).sort().values if buckets else torch.empty(0, dtype=torch.long)
            assert torch.equal(rows, torch.nonzero(lengths > 0).squeeze(-1))  # each non-empty row once
            if buckets:
                assert _cost(lengths, buckets, overhead) == _brute_force(lengths.tolist(), overhead)


def test_bucket_extremes():
    lengths = torch.tensor([32, 5, 32, 0, 12, 1])
    assert len(length_buckets(lengths, 10**9)) == 1  # never worth a second pass
    assert len(length_buckets(lengths, 0)) == 4  # one pass per distinct length
    assert length_buckets(torch.zeros(3, dtype=torch.long)) == []  # nothing to run


def test_default_cost_follows_the_device():
    from rloo.data.buckets import BUCKET_OVERHEAD_TOKENS

    lengths = torch.tensor([40] * 4 + [8] * 4)  # splitting saves 4 * 32 = 128 padded tokens
    assert BUCKET_OVERHEAD_TOKENS["cpu"] < 128 < BUCKET_OVERHEAD_TOKENS["cuda"]
    assert len(length_buckets(lengths)) == 2  # CPU: worth a second pass
    assert len(length_buckets(lengths, BUCKET_OVERHEAD_TOKENS["cuda"])) == 1  # GPU cost: not worth it


def _quadratic_reference(lengths, overhead):
    """The same dynamic programme as two plain Python loops (the form length_buckets replaced
    with numpy): best cost over contiguous runs of the sorted distinct lengths."""
    vals = sorted(set(int(v) for v in lengths if v > 0))
    before = [sum(1 for v in lengths if 0 < v < x) for x in vals] + [sum(1 for v in lengths if v > 0)]
    best = [0.0] + [float("inf")] * len(vals)
    for m in range(1, len(vals) + 1):
        for j in range(m):
            best[m] = min(best[m], best[j] + (before[m] - before[j]) * vals[m - 1] + overhead)
    return best[-1]


def test_many_distinct_lengths_match_the_plain_loops():
    """1024 distinct lengths (too many for brute force): the vectorised DP's buckets cost what the
    plain O(D^2) loops find, and still partition the rows. (Speed: docs/bench.md, not timed here.)"""
    g = torch.Generator().manual_seed(1)
    lengths = torch.cat([torch.arange(1, 1025), torch.randint(1, 1025, (1024,), generator=g)])
    for overhead in (64, 1024):
        buckets = length_buckets(lengths, overhead)
        assert sum(len(b) for b in buckets) == 2048
        assert _cost(lengths, buckets, overhead) == _quadratic_reference(lengths.tolist(), overhead)

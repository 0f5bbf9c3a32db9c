"""Group rows by length so that a batched pass spends little compute on padding."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

# The fixed cost of one more pass (kernel launches, Python), in padded tokens' worth. Of
# 0/16/64/128/256 on the CPU benchmark's S shape, 64 was fastest or within 1% of it
# (docs/bench.md). On a GPU a token costs far less relative to a pass's launches; 1024 is a
# conservative guess there (not yet measured).
BUCKET_OVERHEAD_TOKENS = {"cpu": 64, "cuda": 1024}


def length_buckets(lengths: Tensor, overhead: int | None = None) -> list[Tensor]:
    """Row indices grouped into buckets of similar length. (N,) int -> list of (n_b,) int64.

    Each bucket is run as one pass padded to its longest row, so its cost is n_b * max_b
    tokens, plus `overhead` tokens of fixed cost per pass (default: BUCKET_OVERHEAD_TOKENS for
    the tensor's device). The split minimises the total over contiguous runs of the sorted
    lengths (dynamic programming over the D distinct lengths, O(D^2) arithmetic in O(D) numpy
    calls). Rows of length 0 need no pass and are left out. Buckets come longest first.
    """
    if overhead is None:
        overhead = BUCKET_OVERHEAD_TOKENS.get(lengths.device.type, BUCKET_OVERHEAD_TOKENS["cuda"])
    device, lengths = lengths.device, lengths.detach().cpu().long()
    values, counts = torch.unique(lengths[lengths > 0], return_counts=True)  # ascending
    vals, D = values.numpy().astype(np.float64), len(values)
    if D == 0:
        return []
    before = np.concatenate([[0], np.cumsum(counts.numpy())]).astype(np.float64)  # rows shorter than vals[j]
    best, cut = np.zeros(D + 1), np.zeros(D + 1, dtype=np.int64)
    for m in range(1, D + 1):  # best split of distinct values 0..m-1; the last bucket covers j..m-1
        cost = best[:m] + (before[m] - before[:m]) * vals[m - 1] + overhead
        cut[m] = int(np.argmin(cost))
        best[m] = cost[cut[m]]
    edges, m = [], D
    while m > 0:
        edges.append((int(vals[cut[m]]), int(vals[m - 1])))
        m = int(cut[m])
    return [torch.nonzero((lengths >= lo) & (lengths <= hi)).squeeze(-1).to(device) for lo, hi in edges]

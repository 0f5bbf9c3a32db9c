"""Group rows by length so that a batched pass spends little compute on padding."""

from __future__ import annotations

import torch
from torch import Tensor

# A pass over one more bucket costs about as much fixed work (kernel launches, Python) as this
# many padded tokens on the CPUs measured in docs/bench.md; larger is right for GPUs.
BUCKET_OVERHEAD_TOKENS = 64


def length_buckets(lengths: Tensor, overhead: int = BUCKET_OVERHEAD_TOKENS) -> list[Tensor]:
    """Row indices grouped into buckets of similar length. (N,) int -> list of (n_b,) int64.

    Each bucket is run as one pass padded to its longest row, so its cost is n_b * max_b
    tokens, plus `overhead` tokens of fixed cost per pass. The split minimises the total over
    contiguous runs of the sorted lengths (dynamic programming over the D distinct lengths,
    O(D^2)). Rows of length 0 need no pass and are left out. Buckets come longest first.
    """
    device, lengths = lengths.device, lengths.detach().cpu().long()
    values, counts = torch.unique(lengths[lengths > 0], return_counts=True)  # ascending
    vals, cnt = values.tolist(), counts.tolist()
    D = len(vals)
    if D == 0:
        return []
    before = [0] * (D + 1)  # rows with length < vals[j]
    for j, c in enumerate(cnt):
        before[j + 1] = before[j] + c
    best, cut = [0] + [float("inf")] * D, [0] * (D + 1)
    for m in range(1, D + 1):  # buckets covering distinct values 0..m-1; the last covers j..m-1
        for j in range(m):
            cost = best[j] + (before[m] - before[j]) * vals[m - 1] + overhead
            if cost < best[m]:
                best[m], cut[m] = cost, j
    edges, m = [], D
    while m > 0:
        edges.append((vals[cut[m]], vals[m - 1]))
        m = cut[m]
    return [torch.nonzero((lengths >= lo) & (lengths <= hi)).squeeze(-1).to(device) for lo, hi in edges]

"""Gradient accumulation: one batch's update as several smaller backward passes (micro-batches).

A batch loss that is a mean over U units (rows, pairs or real tokens),
    L = 1/U sum_u l_u,
splits over micro-batches m holding U_m of the units (sum_m U_m = U) as
    L = sum_m (U_m / U) L_m,   L_m = 1/U_m sum_{u in m} l_u,
so backward passes of each L_m scaled by its share U_m / U add up to the whole batch's gradient,
whatever the split (up to float rounding). The normaliser is the whole batch's: a micro-batch's
own mean, unscaled, would weigh a short micro-batch like a long one. Anything computed across
rows (a leave-one-out baseline, advantage whitening, a group's mean) is computed on the whole
batch before it is split, and the clipping and the non-finite check look at the summed gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor


def micro_batches(rows: Tensor, size: int | None) -> list[Tensor]:
    """`rows` (n,) in consecutive micro-batches of `size` rows, the last one holding the remainder;
    one part (`rows` itself) when size is None or >= n. The rows are sorted first (the sum over
    rows does not depend on their order), so a batch of whole groups of k rows, split in multiples
    of k, keeps each group in one micro-batch (the shared-prompt pass needs whole groups)."""
    if size is None or size >= rows.numel():
        return [rows]
    return list(rows.sort().values.split(size))


def micro_shares(parts: list[Tensor], mask: Tensor | None = None) -> list[float]:
    """Each micro-batch's share U_m / U of the batch's units: its rows (mask None), or its real
    tokens (mask (n_rows, T) bool indexed by the parts' row indices, True = a real token; for
    losses averaged over every token of the batch). An empty batch gets shares 0."""
    if mask is None:
        units = [float(p.numel()) for p in parts]
    else:
        units = [float(mask[p].sum()) for p in parts]
    whole = sum(units)
    return [u / whole if whole > 0 else 0.0 for u in units]


def weighted_stats(records: list[dict], shares: list[float]) -> dict[str, Tensor]:
    """The batch's value of per-micro-batch stats that are means over the same units as the loss
    (the loss itself, a clip fraction, an accuracy): sum_m share_m * stat_m."""
    out: dict[str, Tensor] = {}
    for rec, share in zip(records, shares, strict=True):
        for k, v in rec.items():
            out[k] = out.get(k, torch.zeros((), dtype=torch.float64)) + share * torch.as_tensor(v).double().cpu()
    return out

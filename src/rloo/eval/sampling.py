"""Sampling for evaluation: n responses per prompt, in chunks of about `batch_size` samples."""

from __future__ import annotations

from collections.abc import Iterator

from rloo.config import Sampling
from rloo.rollout import Rollout, rollout


def sampled_chunks(
    policy, tokenizer, prompts: list[str], n: int, s: Sampling, *, batch_size: int, **rollout_kw
) -> Iterator[tuple[list[str], Rollout]]:
    """(chunk of prompts, its rollout of n samples per prompt as `s` asks) for consecutive chunks of
    max(1, batch_size // n) prompts; `rollout_kw` go to `rollout` (generator, all_done).
    `rollout` samples in eval mode and restores the policy's mode."""
    per_batch = max(1, batch_size // n)
    for i in range(0, len(prompts), per_batch):
        chunk = prompts[i : i + per_batch]
        yield chunk, rollout(policy, tokenizer, chunk, n, s, **rollout_kw)

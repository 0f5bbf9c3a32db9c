"""Preference pairs (prompt, chosen, rejected): labeled by a task's simulated labeler, and
encoded for the pairwise losses (reward model's Bradley-Terry, DPO)."""

from __future__ import annotations

import random

import torch

from rloo.data.collate import Encoded, encode_completions, encode_prompts, trim_left, trim_right
from rloo.data.lengths import PROMPT_KEY, Cut, response_cut


def preference_pairs(task, n: int, seed: int, sampler=None, policy_share: float = 0.0) -> list[tuple[str, str, str]]:
    """(prompt, chosen, rejected) labeled by the task's Bradley-Terry labeler (noisy on purpose:
    the reward model is a proxy, not the judge).

    A `policy_share` of the pairs compares two samples of `sampler(prompts) -> completions` (the SFT
    policy, as the paper's preference data came from model samples); the rest compare two fresh
    mixed-quality references. Policy samples show the reward model the policy's own failure modes
    (repeats, hallucinations), which RL would otherwise be free to exploit.
    """
    rng = random.Random(f"pairs-{seed}")
    examples = task.examples("pref", n, seed=seed)
    n_policy = int(round(policy_share * n)) if sampler is not None else 0
    prompts = [ex.prompt for ex in examples[:n_policy]]
    sampled = sampler(prompts + prompts) if sampler is not None and n_policy else []
    out = []
    for i, ex in enumerate(examples):
        if i < n_policy:
            a, b = sampled[i], sampled[n_policy + i]
        else:
            a, b = task.sample_reference(ex.prompt, rng), task.sample_reference(ex.prompt, rng)
        chosen, rejected = task.label(ex.prompt, a, b, rng)
        out.append((ex.prompt, chosen, rejected))
    rng.shuffle(out)
    return out


def encode_pairs(tokenizer, pairs: list[tuple[str, str, str]], cfg):
    """Token ids of 2n rows: rows i and n+i are pair i's prompt with its chosen and its rejected
    completion (prompts left-padded, completions right-padded, cut to cfg's limits)."""
    prompts, _ = encode_prompts(tokenizer, [p for p, _, _ in pairs] * 2, cfg.max_prompt_tokens)
    comps = encode_completions(tokenizer, [c for _, c, _ in pairs] + [r for _, _, r in pairs], cfg.max_response_tokens)
    return prompts, comps


def pair_cuts(prompts: Encoded, comps: Encoded, cfg) -> list[Cut]:
    """What `encode_pairs` cut: each pair's prompt counted once (it fills two rows), its two responses."""
    n = len(prompts.ids) // 2
    return [
        Cut("prompts", prompts.cut // 2, n, prompts.longest, PROMPT_KEY, cfg.max_prompt_tokens),
        response_cut(comps, cfg.max_response_tokens),
    ]


def pair_rows(prompts, comps, idx):
    """Pairs idx of `encode_pairs`' layout as 2n rows side by side (chosen_0, rejected_0, chosen_1, ...:
    groups of k=2 rows with one prompt, for the shared pass), padding trimmed: (p_ids, p_mask, c_ids, c_mask)."""
    n = len(prompts.ids) // 2
    rows = torch.stack([idx, idx + n], 1).reshape(-1)
    return (*trim_left(prompts.ids[rows], prompts.mask[rows]), *trim_right(comps.ids[rows], comps.mask[rows]))

"""Multi-turn sampling: the policy and an environment take turns, batched over trajectories.

Token in, token out: each trajectory is ONE token sequence, the prompt's ids (from the
environment's reset) followed by the policy's turns and the environment's observations, with a
mask of the tokens the policy produced. The policy's ids are written into the trajectory as they
were sampled and handed to the environment as ids; the environment tokenizes its own text; nothing
is decoded and re-encoded, so the trained ids are the sampled ids.

Batched decoding, one block per step (rloo.rollout.episode_steps): every live row adds either a
token it samples (its turn) or its whole pending observation (fed to the model like a prompt, in
the same forward pass, its log-probs not recorded); the block is as wide as the longest
observation fed at that step, the shorter rows padded and masked. Rows are at different turns at
the same time; the KV cache is kept across turns (an observation goes into the same cache, never
a re-prefill of the whole context). An observation of m tokens costs one pass over m positions;
`prefill_observations=False` feeds it one token per step (m passes), the reference path.
Sampling noise is one uniform per row and position, so both paths draw the same tokens.

The environments are driven through rloo.envs.CheckedEnv's interface (duck-typed here: this layer
does not import `envs/`): `reset(prompt) -> ids`, `step(turn ids) -> Step`, `stop_ids`, `stats()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from rloo.config import Sampling
from rloo.data.chat_turns import ChatFrame
from rloo.data.collate import position_ids
from rloo.modeling.forward import lm_logits
from rloo.modeling.kvcache import append_columns, cache_kwarg, prefill_prompts, row_cache
from rloo.rollout.capabilities import EpisodeRollout, KeepsStats
from rloo.rollout.draw import _next_token, uniforms
from rloo.rollout.episode_steps import Episode, Limits, answer, block, compact, reset_all
from rloo.rollout.sampler import Rollout, _decoding_cache

__all__ = ["Limits", "Trajectories", "episodes", "policy_tokens"]


@dataclass
class Trajectories(Rollout):
    """Episodes in the Rollout layout: `completion_ids` is the whole trajectory after the prompt
    (policy turns and observations, right-padded), `completion_mask` its real tokens (what attention
    sees), `logprobs` the sampled log-probs at policy tokens (0 elsewhere). `policy_mask` (N,T)
    marks the policy's tokens: the only ones the loss, the KL of eq. 1 and the length statistics count."""

    policy_mask: Tensor | None = None  # (N, T) bool
    env_rewards: Tensor | None = None  # (N,) sum of the episode's step rewards (0 if none)
    turns: Tensor | None = None  # (N,) policy turns taken
    env_stats: dict[str, float] = field(default_factory=dict)


def policy_tokens(roll: Rollout) -> Tensor:
    """The tokens a step trains on (N,T): the policy's in a multi-turn rollout, else the completion's."""
    mask = roll.policy_mask if isinstance(roll, EpisodeRollout) else None
    return roll.completion_mask if mask is None else mask


def _left_pad(rows: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = True
    return ids, mask


def _prefill(model, starts: list[list[int]], k: int, pad_id: int):
    """The prompts' pass: once per group of k when the k episodes of each task start alike (their
    shared KV cache expanded k times, as rloo's sampler does), else once per row.
    -> (prompt ids (N,P), mask (N,P), Prefill, group size of the prefill)."""
    n = len(starts)
    shared = k > 1 and all(starts[i] == starts[i - i % k] for i in range(n))
    ids, mask = _left_pad(starts, pad_id)
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    src = slice(None, None, k) if shared else slice(None)
    return ids, mask, prefill_prompts(model, ids[src], mask[src]), (k if shared else 1)


@torch.no_grad()
def episodes(
    model,
    tokenizer,
    envs: list,
    prompts: list[str],
    k: int,
    lim: Limits,
    s: Sampling,
    *,
    generator: torch.Generator | None = None,
    chat: ChatFrame | None = None,
    prefill_observations: bool = True,
) -> Trajectories:
    """Run one episode per environment (N = len(envs) = len(prompts) * k; rows k*i .. k*i+k-1 play
    prompts[i]) to its end or a limit, batched; see the module docstring. -> Trajectories.
    `s`: the temperature (0 is greedy), its truncation and the prompt limit; min_new_tokens, stop strings and
    the repetition penalty are refused with env= (the config says so): a turn ends at the
    environment's stop ids; the limits of an episode are `lim`'s, not s.max_new_tokens. `chat`: the policy
    tokenizer's chat template around the turns (rloo.data.chat_turns; its end-of-turn token ends a
    turn too); None plays the environment's ids alone. `prefill_observations`: an observation goes
    into the KV cache in one forward pass (False: one token per decode step, the reference path of
    tests/equivalence/test_multiturn.py)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    eps = [Episode(env) for env in envs]
    starts = reset_all(eps, prompts, k, lim)
    starts = starts if chat is None else [chat.first(start) for start in starts]
    cut = sum(len(start) > s.max_prompt_tokens for start in starts)
    was_training = model.training
    model.eval()
    p_ids, p_mask, pre, g = _prefill(model, [start[-s.max_prompt_tokens :] for start in starts], k, pad)
    stops = [frozenset(ep.env.stop_ids) | ({chat.eot} if chat else set()) for ep in eps]
    cache, _ = _decoding_cache(model, pre, g, lim.max_total_tokens, grouped=False)
    logits = pre.last_logits.detach().float().repeat_interleave(g, dim=0)
    attn, next_pos = p_mask.long(), position_ids(p_mask)[:, -1:] + 1
    noise = _noise(len(eps), lim.max_total_tokens, s.temperature, generator, logits.device)
    blocks: list[list[Tensor]] = []
    for _ in range(lim.max_total_tokens):
        u = None if noise is None else noise[torch.arange(len(eps)), [min(e.used, noise.shape[1] - 1) for e in eps]]
        tok, lp = _next_token(logits, s, generator, u)
        *cols, ended = block(eps, tok.tolist(), lp, stops, {"eos": eos, "pad": pad}, lim, prefill_observations)
        blocks.append(cols)
        if ended:
            answer(eps, ended, lim, chat)
        if all(ep.done for ep in eps):
            break
        logits, attn, next_pos = _feed(model, cache, cols[0].to(p_ids.device), cols[1].to(p_ids.device), attn, next_pos)
    model.train(was_training)
    for ep in eps:  # a row still live when the token budget ran out (cannot happen: `used` reaches it first)
        ep.truncated |= not ep.done
    real, ids, pol, lps = compact(*(torch.cat([b[j] for b in blocks], 1) for j in (1, 0, 2, 3)))
    return _trajectories(tokenizer, eps, prompts, k, g, (p_ids, p_mask), (ids, real, pol, lps), cut)


def _noise(n: int, positions: int, temperature: float, generator, device) -> Tensor | None:
    """One uniform per row and trajectory position (N, T), drawn once: the token a row samples at
    position t is the inverse-CDF draw of noise[row, t], so it does not depend on how many decode
    steps the observations before it took (one pass each, or one step per token). None for greedy."""
    return None if temperature == 0 else uniforms((n, positions), generator, device)


def _feed(model, cache, ids: Tensor, real: Tensor, attn: Tensor, next_pos: Tensor):
    """A step's block (N,W) (rloo.rollout.episode_steps) into the KV cache. Its first W-1 columns hold
    only the longer observations' first tokens: one forward pass of those rows alone, written back
    with masked holes in the other rows (`append_columns`). The last column holds every row's one
    token (sampled, an observation's last, or padding for an ended row, attended as the one-token
    path always did; its outputs are never read): one pass of all rows, as a plain decode step.
    -> (next-token logits (N,V), attention mask, next positions (N,1))."""
    width = ids.shape[1]
    if width > 1:
        rows = real[:, :-1].any(1).nonzero().squeeze(1)
        head, head_real = ids[rows, :-1], real[rows, :-1]
        count = head_real.sum(1, keepdim=True)
        pos = next_pos[rows] + (torch.arange(width - 1, device=ids.device) - (width - 1 - count)).clamp(min=0)
        sub = row_cache(cache, rows, width - 1)
        sub_attn = torch.cat([attn[rows], head_real.long()], dim=1)
        _forward(model, sub, head, sub_attn, pos)
        append_columns(cache, rows, sub, width - 1)
        attn = torch.cat([attn, real[:, :-1].long()], dim=1)
        next_pos = next_pos + real[:, :-1].sum(1, keepdim=True)
    attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
    return _forward(model, cache, ids[:, -1:], attn, next_pos), attn, next_pos + 1


def _forward(model, cache, ids: Tensor, attn: Tensor, pos: Tensor) -> Tensor:
    """The next-token logits (N,V) after ids (N,W) at positions pos (N,W), through `cache`."""
    out = lm_logits(
        model, 1, input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, **{cache_kwarg(model): cache}
    )
    return out[0][:, -1]


def _trajectories(tokenizer, eps, prompts, k, g, prompt, cols, cut) -> Trajectories:
    (p_ids, p_mask), (ids, real, pol, lps) = prompt, cols
    device = p_ids.device
    texts = tokenizer.batch_decode(ids.masked_fill(~real, tokenizer.pad_token_id).tolist(), skip_special_tokens=True)
    stats = [ep.env.stats() if isinstance(ep.env, KeepsStats) else {} for ep in eps]
    keys = sorted(set().union(*stats))
    turns = torch.tensor([float(ep.turns) for ep in eps])
    env_stats = {f"env/{key}": sum(s.get(key, 0.0) for s in stats) / len(eps) for key in keys}
    env_stats |= {
        "env/turns": turns.mean().item(),
        "env/observation_tokens": (real & ~pol).sum(-1).float().mean().item(),
    }
    return Trajectories(
        prompts=[p for p in prompts for _ in range(k)],
        completions=[t.strip() for t in texts],
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        completion_ids=ids.to(device),
        completion_mask=real.to(device),
        logprobs=lps.to(device),
        truncated=torch.tensor([ep.truncated for ep in eps], device=device),
        prompts_truncated=cut,
        group_size=g,
        raw_completions=texts,
        policy_mask=pol.to(device),
        env_rewards=torch.tensor([ep.reward for ep in eps], dtype=torch.float32),
        turns=turns,
        env_stats=env_stats,
    )

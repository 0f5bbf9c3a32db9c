"""Multi-turn sampling: the policy and an environment take turns, batched over trajectories.

Token in, token out: each trajectory is ONE token sequence, the prompt's ids (from the
environment's reset) followed by the policy's turns and the environment's observations, with a
mask of the tokens the policy produced. The policy's ids are written into the trajectory as they
were sampled and handed to the environment as ids; the environment tokenizes its own text; nothing
is decoded and re-encoded, so the trained ids are the sampled ids.

Batched decoding, one column per step: every live row adds one token per step, either a token it
samples (its turn) or the next token of its pending observation (fed to the model like a prompt,
its log-prob not recorded). Rows are at different turns at the same time; the KV cache is kept
across turns (an observation is one more token per step into the same cache, not a new prefill).
An observation of m tokens therefore costs m decode steps rather than one prefill pass: fine for
short observations, the thing to batch first for long ones.

The environments are driven through rloo.envs.CheckedEnv's interface (duck-typed here: this layer
does not import `envs/`): `reset(prompt) -> ids`, `step(turn ids) -> Step`, `stop_ids`, `stats()`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rloo.data.chat_turns import ChatFrame
from rloo.data.collate import position_ids
from rloo.errors import EnvError
from rloo.modeling.forward import lm_logits
from rloo.modeling.kvcache import cache_kwarg, prefill_prompts
from rloo.rollout.draw import _next_token
from rloo.rollout.sampler import Rollout, _decoding_cache
from rloo.runtime.threads import call_all


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
    mask = getattr(roll, "policy_mask", None)
    return roll.completion_mask if mask is None else mask


@dataclass
class _Episode:
    env: object
    queue: deque = field(default_factory=deque)  # observation ids still to feed
    turn: list = field(default_factory=list)  # the policy's ids of its current turn
    turns: int = 0
    used: int = 0  # trajectory tokens after the prompt
    reward: float = 0.0
    done: bool = False
    truncated: bool = False


@dataclass
class Limits:
    max_turns: int
    max_turn_tokens: int
    max_total_tokens: int
    step_timeout_s: float


def _left_pad(rows: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = True
    return ids, mask


def _answer(eps: list[_Episode], rows: list[int], lim: Limits, chat: ChatFrame | None) -> None:
    """The environments' answers to the turns that just ended, called concurrently; an observation
    is queued (in the chat template's next user turn with `chat`), or the episode ends (done, or
    truncated at max_turns / max_total_tokens)."""
    results = call_all([lambda e=eps[i]: e.env.step(list(e.turn)) for i in rows], lim.step_timeout_s)
    for i, (status, value) in zip(rows, results, strict=True):
        ep = eps[i]
        if status == "timeout":
            name = type(getattr(ep.env, "env", ep.env)).__name__
            raise EnvError(f"environment {name}.step took longer than step_timeout_s={lim.step_timeout_s:g} s")
        if status == "raised":
            raise value  # type: ignore[misc] - CheckedEnv raised an EnvError (one line)
        obs = value.observation if chat is None else chat.observation(ep.turn, value.observation)  # type: ignore[union-attr]
        ep.turn, ep.turns = [], ep.turns + 1
        ep.reward += value.reward or 0.0  # type: ignore[union-attr]
        if value.done:  # type: ignore[union-attr]
            ep.done = True
        elif ep.turns >= lim.max_turns or ep.used + len(obs) >= lim.max_total_tokens:
            ep.done = ep.truncated = True  # no room for another policy turn
        else:
            ep.queue.extend(obs)


def _column(eps: list[_Episode], tok: list[int], lp: Tensor, stops: list[frozenset], eos: int, pad: int, lim: Limits):
    """One decode step's column: per row the sampled token (its turn), the next observation token, or
    padding (ended). -> ids, real, policy masks, log-probs (N,) and the rows whose turn ended."""
    n = len(eps)
    ids, real, pol, ended = [pad] * n, [False] * n, [False] * n, []
    for i, ep in enumerate(eps):
        if ep.done:
            continue
        real[i], ep.used = True, ep.used + 1
        if ep.queue:
            ids[i] = ep.queue.popleft()
        else:
            ids[i], pol[i] = tok[i], True
            ep.turn.append(tok[i])
            if tok[i] == eos or tok[i] in stops[i] or len(ep.turn) >= lim.max_turn_tokens:
                ended.append(i)
                continue
        if ep.used >= lim.max_total_tokens:  # out of room mid-turn or mid-observation
            ep.done = ep.truncated = True
    policy = torch.tensor(pol)
    return torch.tensor(ids), torch.tensor(real), policy, lp.cpu().masked_fill(~policy, 0.0), ended


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
    *,
    max_prompt_len: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
    chat: ChatFrame | None = None,
) -> Trajectories:
    """Run one episode per environment (N = len(envs) = len(prompts) * k; rows k*i .. k*i+k-1 play
    prompts[i]) to its end or a limit, batched; see the module docstring. -> Trajectories.
    temperature 0 is greedy; min_new_tokens, stop strings and the repetition penalty are refused
    with env= (the config says so): a turn ends at the environment's stop ids."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    eps = [_Episode(env) for env in envs]
    starts = [ep.env.reset(prompts[i // k]) for i, ep in enumerate(eps)]
    starts = starts if chat is None else [chat.first(s) for s in starts]
    cut = sum(len(s) > max_prompt_len for s in starts)
    was_training = model.training
    model.eval()
    p_ids, p_mask, pre, g = _prefill(model, [s[-max_prompt_len:] for s in starts], k, pad)
    stops = [frozenset(ep.env.stop_ids) | ({chat.eot} if chat else set()) for ep in eps]
    cache, _ = _decoding_cache(model, pre, g, lim.max_total_tokens, grouped=False)
    logits = pre.last_logits.detach().float().repeat_interleave(g, dim=0)
    attn, next_pos = p_mask.long(), position_ids(p_mask)[:, -1:] + 1
    cols: list[tuple] = []
    for _ in range(lim.max_total_tokens):
        tok, lp = _next_token(logits, temperature, top_p, generator, None, top_k)
        *col, ended = _column(eps, tok.tolist(), lp, stops, eos, pad, lim)
        cols.append(col)
        if ended:
            _answer(eps, ended, lim, chat)
        if all(ep.done for ep in eps):
            break
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
        logits = lm_logits(
            model,
            1,
            input_ids=col[0][:, None].to(p_ids.device),
            attention_mask=attn,
            position_ids=next_pos,
            use_cache=True,
            **{cache_kwarg(model): cache},
        )[0][:, -1]
        next_pos = next_pos + 1
    model.train(was_training)
    for ep in eps:  # a row still live when the token budget ran out (cannot happen: `used` reaches it first)
        ep.truncated |= not ep.done
    ids, real, pol, lps = (torch.stack([c[j] for c in cols], 1) for j in range(4))
    return _trajectories(tokenizer, eps, prompts, k, g, (p_ids, p_mask), (ids, real, pol, lps), cut)


def _trajectories(tokenizer, eps, prompts, k, g, prompt, cols, cut) -> Trajectories:
    (p_ids, p_mask), (ids, real, pol, lps) = prompt, cols
    device = p_ids.device
    texts = tokenizer.batch_decode(ids.masked_fill(~real, tokenizer.pad_token_id).tolist(), skip_special_tokens=True)
    stats = [ep.env.stats() if hasattr(ep.env, "stats") else {} for ep in eps]
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

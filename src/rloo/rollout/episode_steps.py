"""The bookkeeping of batched episodes (rloo.rollout.multiturn): what each row adds at a decode step,
the environments' answers, the limits, and the trajectories' layout.

A decode step adds a block of W >= 1 columns to every row, right-aligned (padding on the left):
the token a row sampled (its turn), its pending observation (all of it, one forward pass over
its m tokens, or with `whole=False` one token per step as the first version did), or nothing (an
ended row). W is the longest observation fed at that step (1 when none is). The padding columns
are masked in attention and skipped by the positions, so each row's KV cache holds its own tokens
in order, with holes; `compact` removes the holes from the trajectories handed on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rloo.data.chat_turns import ChatFrame
from rloo.errors import EnvError
from rloo.rollout.capabilities import NamesItsEnv
from rloo.runtime.threads import call_all


@dataclass
class Episode:
    env: Any  # rloo.envs.CheckedEnv's interface, duck-typed (this layer does not import envs/)
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


def reset_all(eps: list[Episode], prompts: list[str], k: int, lim: Limits) -> list[list[int]]:
    """Each environment's reset(prompt) (row i plays prompts[i // k]), one after the other as before
    (a reset may draw from shared state), each bounded by step_timeout_s as a step is: a reset that
    never returns stops the run with one line instead of hanging it."""
    starts = []
    for i, ep in enumerate(eps):
        status, value = call_all([lambda e=ep, p=prompts[i // k]: e.env.reset(p)], lim.step_timeout_s)[0]
        if status == "timeout":
            raise EnvError(f"environment {_name(ep)}.reset took longer than step_timeout_s={lim.step_timeout_s:g} s")
        if status == "raised":
            raise value  # type: ignore[misc] - CheckedEnv raised an EnvError (one line)
        starts.append(value)
    return starts


def _name(ep: Episode) -> str:
    return ep.env.env_name() if isinstance(ep.env, NamesItsEnv) else type(ep.env).__name__


def answer(eps: list[Episode], rows: list[int], lim: Limits, chat: ChatFrame | None) -> None:
    """The environments' answers to the turns that just ended, called concurrently; an observation
    is queued (in the chat template's next user turn with `chat`), or the episode ends (done, or
    truncated at max_turns / max_total_tokens)."""
    results = call_all([lambda e=eps[i]: e.env.step(list(e.turn)) for i in rows], lim.step_timeout_s)
    for i, (status, value) in zip(rows, results, strict=True):
        ep = eps[i]
        if status == "timeout":
            raise EnvError(f"environment {_name(ep)}.step took longer than step_timeout_s={lim.step_timeout_s:g} s")
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


def _take(ep: Episode, tok: int, stops: frozenset, eos: int, lim: Limits, whole: bool) -> tuple[list[int], bool, bool]:
    """What a live row adds at this step: (ids, whether they are the policy's, whether its turn ended)."""
    if ep.queue:
        ids = [ep.queue.popleft() for _ in range(len(ep.queue) if whole else 1)]
        policy, ended = False, False
    else:
        ids, policy = [tok], True
        ep.turn.append(tok)
        ended = tok == eos or tok in stops or len(ep.turn) >= lim.max_turn_tokens
    ep.used += len(ids)
    if not ended and ep.used >= lim.max_total_tokens:  # out of room mid-turn (an observation always fits)
        ep.done = ep.truncated = True
    return ids, policy, ended


def block(
    eps: list[Episode], tok: list[int], lp: Tensor, stops: list[frozenset], ids_of: dict, lim: Limits, whole: bool
):
    """One decode step's block (module docstring). tok, lp (N,): the tokens drawn and their log-probs;
    ids_of: {"eos": id, "pad": id}. -> ids (N,W), real (N,W) bool, policy (N,W) bool, log-probs (N,W)
    (the sampled token's at policy tokens, 0 elsewhere), and the rows whose turn ended."""
    rows, pol, ended = [], [], []
    for i, ep in enumerate(eps):
        if ep.done:
            rows.append([])
            pol.append(False)
            continue
        add, policy, done_turn = _take(ep, tok[i], stops[i], ids_of["eos"], lim, whole)
        rows.append(add)
        pol.append(policy)
        if done_turn:
            ended.append(i)
    n, width = len(eps), max(1, *map(len, rows))
    ids = torch.full((n, width), ids_of["pad"], dtype=torch.long)
    real = torch.zeros((n, width), dtype=torch.bool)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            real[i, width - len(r) :] = True
    policy = torch.zeros((n, width), dtype=torch.bool)
    policy[:, -1] = torch.tensor(pol)
    lps = torch.zeros((n, width))
    lps[:, -1] = lp.cpu().float().masked_fill(~policy[:, -1], 0.0)
    return ids, real, policy, lps, ended


def compact(real: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
    """Each row's real tokens moved left in order, the holes of the blocks gone: (real (N,C) bool,
    tensors (N,C)...) -> the same, width max_i (real tokens of row i). Identity without holes."""
    order = torch.argsort((~real).to(torch.uint8), dim=1, stable=True)
    width = int(real.sum(1).max())
    return tuple(t.gather(1, order)[:, :width] for t in (real, *tensors))

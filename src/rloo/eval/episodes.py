"""Evaluating a policy on multi-turn episodes: success rate (pass@1), turns and tool calls.

Each held-out prompt is played n times (temperature sampling, seeded); success is an episode reward
>= `threshold` (the task's `success_threshold`: 1 for the calculator's checker, any win in guess).
`no_tool_pass`, the success rate of the episodes that called no tool, is the no-tool baseline of a
tool task (conditional on the policy's choice not to call one). pass@1 is the mean over prompts of the share of
successful episodes; a paired difference between two policies on the same prompts, with its 95%
normal interval, is `rloo.eval.passk.paired_pass_difference(counts_a, counts_b, n, 1)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rloo.algorithms.agents import limits
from rloo.config import Sampling
from rloo.envs import EnvSpec, make_env
from rloo.rollout.multiturn import episodes


@dataclass
class EpisodeEval:
    n: int  # episodes per prompt
    counts: list[int]  # successful episodes per prompt
    pass_at_1: float
    turns: float  # policy turns per episode
    tool_calls: float  # per episode (environments that count them; else 0)
    reward: float  # mean episode reward
    no_tool_share: float  # share of episodes that called no tool
    no_tool_pass: float | None  # success rate of those episodes (answers from memory); None if there are none
    truncated: float  # share of episodes cut by a limit
    policy_tokens: float  # per episode
    examples: list[str] = field(default_factory=list)  # a few trajectories as text, the environment's marked
    episodes: list[dict] = field(default_factory=list, repr=False)  # every episode (`episode_record`), prompt order

    def summary(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("counts", "examples", "episodes")}


# How the environment's text (observations) is shown inside a printed or saved episode
ENV_MARK = "[env: {}]"


def marked_text(tokenizer, ids: list[int], policy: list[bool]) -> str:
    """An episode's text after the prompt with each run of observation tokens (policy False) shown as
    `[env: ...]`, the policy's own text as it is; special tokens dropped, as in `Rollout.completions`.
    ids, policy: the episode's real tokens only, in order."""
    parts, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or policy[i] != policy[start]:
            text = tokenizer.decode(ids[start:i], skip_special_tokens=True).strip()
            if text or not policy[start]:
                parts.append(text if policy[start] else ENV_MARK.format(text))
            start = i
    return " ".join(parts)


def episode_record(tokenizer, roll, row: int, success: bool) -> dict:
    """One episode of a multi-turn rollout as a JSON-friendly dict: prompt, the marked text
    (`marked_text`), reward, success, turns, truncated."""
    real = roll.completion_mask[row].tolist()
    ids = [t for t, r in zip(roll.completion_ids[row].tolist(), real, strict=True) if r]
    pol = [p for p, r in zip(roll.policy_mask[row].tolist(), real, strict=True) if r]
    return {
        "prompt": roll.prompts[row],
        "episode": marked_text(tokenizer, ids, pol),
        "reward": float(roll.env_rewards[row]),
        "success": success,
        "turns": int(roll.turns[row]),
        "truncated": bool(roll.truncated[row]),
    }


@torch.no_grad()
def evaluate_episodes(
    policy,
    tokenizer,
    spec: EnvSpec,
    prompts: list[str],
    s: Sampling,
    *,
    n: int,
    seed: int = 0,
    batch_size: int = 128,
    threshold: float = 1.0,
) -> EpisodeEval:
    """Play each prompt n times (batches of about batch_size episodes), sampled as `s` asks -> EpisodeEval."""
    gen = torch.Generator().manual_seed(seed)
    vocab = policy.get_input_embeddings().weight.shape[0]
    per = max(1, batch_size // n)
    counts, turns, calls, cut, toks, records = [], 0.0, 0.0, 0.0, 0.0, []
    reward, plain, plain_ok = 0.0, 0, 0  # summed reward; episodes without a tool call, and those won
    for i in range(0, len(prompts), per):
        chunk = prompts[i : i + per]
        envs = [make_env(spec.factory, vocab) for _ in range(len(chunk) * n)]
        roll = episodes(
            policy,
            tokenizer,
            envs,
            chunk,
            n,
            limits(spec),
            s,
            generator=gen,
            chat=spec.chat,
            prefill_observations=spec.prefill_observations,
        )
        assert roll.env_rewards is not None and roll.turns is not None and roll.policy_mask is not None
        ok = (roll.env_rewards >= threshold).view(-1, n)
        counts += ok.sum(1).tolist()
        turns += float(roll.turns.sum())
        calls += roll.env_stats.get("env/tool_calls", 0.0) * len(envs)
        reward += float(roll.env_rewards.sum())
        no_tool = [not env.stats().get("tool_calls", 0.0) for env in envs]
        plain += sum(no_tool)
        plain_ok += sum(t and bool(w) for t, w in zip(no_tool, ok.view(-1).tolist(), strict=True))
        cut += float(roll.truncated.float().sum())
        toks += float(roll.policy_mask.sum())
        records += [episode_record(tokenizer, roll, j, w) for j, w in enumerate(ok.view(-1).tolist())]
    total = len(prompts) * n
    return EpisodeEval(
        n=n,
        counts=counts,
        pass_at_1=sum(counts) / total,
        turns=turns / total,
        tool_calls=calls / total,
        reward=reward / total,
        no_tool_share=plain / total,
        no_tool_pass=plain_ok / plain if plain else None,
        truncated=cut / total,
        policy_tokens=toks / total,
        examples=[f"{r['prompt']} -> {r['episode']}" for r in records[::n][:4]],
        episodes=records,
    )

"""How `rloo compare` judges a policy on a text task: one sample per prompt with fixed sampling noise
per seed, scored by the task's gold judge (and pass@k on a task scored by a checker). A task played
as episodes is judged by rloo.experiments.compare.episodes instead (the same CellJudge).

The cell's evaluation prompts are counted as `rloo eval` counts them: a line says those cut to
max_prompt_tokens, more than max_cut_share of them is refused before any policy is judged, and the
cell's cuts.json records the counts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rloo.config import CompareConfig, Sampling
from rloo.core.kl import sequence_kl
from rloo.data.lengths import report_prompt_cuts, save_cuts
from rloo.eval.judge import win_rate
from rloo.eval.passk import evaluate_pass_at_k
from rloo.modeling.forward import completion_logprobs
from rloo.modeling.loading import frozen, load_policy, load_reward_model
from rloo.rewards import RewardModelScorer
from rloo.rollout import rollout
from rloo.rollout.decoding import logprob_temperature
from rloo.tasks import has_checker
from rloo.tasks.base import ParsesAnswers


@dataclass
class CellJudge:
    """How one (task, seed) cell of `rloo compare` judges its policies, all on the same prompts with the
    same sampling noise: `evaluate(policy, the SFT model's result or None) -> result dict` (the SFT
    model itself first, with None), and `line(result)`, its one-line summary."""

    sft: Any  # the cell's SFT model (frozen): judged first, and the KL reference
    tokenizer: Any
    evaluate: Callable[[Any, dict | None], dict]
    line: Callable[[dict], str]


def text_judge(cfg: CompareConfig, task, examples, root: Path, seed: int) -> CellJudge:
    """The gold judge's win rates (against the references and head to head against the SFT model), the
    reward model's score and the KL to the SFT model; pass@k on a checker task. `root`: the cell's
    folder, where its cuts.json goes."""
    ref, tok = load_policy(str(root / "sft" / "model"), device=cfg.device, dtype=cfg.dtype)
    ref, scorer = frozen(ref), None
    prompts = [e.prompt for e in examples]
    save_cuts(root, report_prompt_cuts("eval", tok, cfg, prompts, [], ref))  # every policy sees these prompts
    if not has_checker(task):
        rm, rm_tok = load_reward_model(str(root / "reward" / "model"), device=cfg.device, dtype=cfg.dtype)
        scorer = RewardModelScorer(frozen(rm), rm_tok, policy_tokenizer=tok)

    def evaluate(policy, sft: dict | None) -> dict:
        res = judge(policy, tok, task, examples, cfg, scorer, ref, seed)
        res |= pass_at_k(policy, tok, task, examples, cfg, seed) if has_checker(task) else {}
        return res | ({"win_rate_vs_sft": win_rate(res["gold_per_prompt"], sft["gold_per_prompt"])} if sft else {})

    def line(res: dict) -> str:
        return f"win rate vs refs {res['win_rate']:.3f}, vs SFT {res['win_rate_vs_sft']:.3f}, KL {res['kl']:.2f}"

    return CellJudge(ref, tok, evaluate, line)


def _sampling(cfg: CompareConfig) -> Sampling:
    """How a study evaluates every policy: its eval section with the RL stage's completion limit."""
    return cfg.eval.sampling(cfg.rl.max_new_tokens, cfg.max_prompt_tokens)


@torch.no_grad()
def judge(policy, tokenizer, task, examples, cfg: CompareConfig, scorer=None, ref=None, seed: int = 0) -> dict:
    """One sample per held-out prompt (fixed sampling noise per seed): per-prompt gold scores and the
    means of gold, reward-model score, KL to the SFT model and length."""
    policy.eval()
    gen = torch.Generator().manual_seed(10_000 + seed)
    gold, rm, kl, length = [], [], [], []
    for i in range(0, len(examples), cfg.eval.batch_size):
        chunk = examples[i : i + cfg.eval.batch_size]
        roll = rollout(
            policy,
            tokenizer,
            [e.prompt for e in chunk],
            1,
            _sampling(cfg),
            generator=gen,
        )
        gold += [task.gold_score(e.prompt, c) for e, c in zip(chunk, roll.completions, strict=False)]
        length += roll.completion_mask.sum(-1).tolist()
        if scorer is not None:
            rm += scorer(roll).tolist()
        if ref is not None:
            ref_lp = completion_logprobs(
                ref,
                roll.prompt_ids,
                roll.prompt_mask,
                roll.completion_ids,
                roll.completion_mask,
                temperature=logprob_temperature(cfg.eval.temperature),
            )
            kl += sequence_kl(roll.logprobs, ref_lp, roll.completion_mask).tolist()
    refs = [task.gold_score(e.prompt, e.reference) for e in examples]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {
        "gold_per_prompt": gold,
        "win_rate": win_rate(gold, refs),
        "gold": mean(gold),
        "reward": mean(rm),
        "kl": mean(kl),
        "length": mean(length),
    }


def pass_at_k(policy, tok, task, examples, cfg: CompareConfig, seed: int) -> dict:
    """pass@k of a policy on a checker task (the same sampling noise for every method of a seed)."""
    r = evaluate_pass_at_k(
        policy,
        tok,
        [e.prompt for e in examples],
        task.gold_score,
        _sampling(cfg),
        n=cfg.eval.pass_samples,
        parse=task.parse_answer if isinstance(task, ParsesAnswers) else None,
        batch_size=max(cfg.eval.batch_size, cfg.eval.pass_samples),
        generator=torch.Generator().manual_seed(20_000 + seed),
    )
    return {"pass": r.summary(), "pass_counts": r.counts}

"""The held-out prompts a training run is evaluated on, and the periodic evaluation itself
(shared by the online loop and DPO, so both report the same metrics the same way). With env= the
evaluation plays episodes of the held-out prompts instead of sampling single responses (docs/agents.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

import torch

from rloo.algorithms.base import Models
from rloo.config import RLConfig
from rloo.data.lengths import report_prompt_cuts
from rloo.data.prompts import PromptStream
from rloo.data.split import text_field, train_eval_records
from rloo.eval.episodes import EpisodeEval, evaluate_episodes
from rloo.eval.judge import evaluate_policy
from rloo.rewards.base import HoldsRewardModel
from rloo.rewards.judges import Judge, make_judge, task_judge
from rloo.runtime.checkpoint.rng import global_streams_kept
from rloo.runtime.distributed import unwrap
from rloo.runtime.tracking.log import say
from rloo.training.agents import success_threshold

# The built-in task's training prompts are drawn up front, steps x batch_size of them, at most this
# many: beyond it the stream (rloo.data.prompts.PromptStream) starts a reshuffled epoch of the same
# prompts. A run of fewer draws exactly as before; steps=1000000000 drew prompts for minutes with no
# output while memory grew (2^17 prompts: seconds, tens of MB).
MAX_DRAWN_PROMPTS = 2**17


@dataclass
class EvalSet:
    prompts: list[str]
    references: list[str] | None
    judge: Judge | None  # judge(prompt, response) -> float; None: no win rate
    threshold: float | None = None  # episodes (env=): the episode reward that counts as a success

    @classmethod
    def of_task(cls, task, examples) -> EvalSet:
        """A built-in task's held-out examples, judged by its gold judge."""
        return cls([e.prompt for e in examples], [e.reference for e in examples], task_judge(task))


def eval_metrics(models: Models, ev: EvalSet, cfg: RLConfig, step: int, all_done=None) -> dict[str, float]:
    """Periodic evaluation of the policy on `ev` (episodes with env=); one printed line per eval (rank 0).
    `all_done`: under FSDP every process must stop decoding at the same step (its forward passes are
    collectives: a process that stopped first would leave the others waiting forever); `Dist.eval_kwargs`.
    The global random streams are restored afterwards: a user's environment or judge may draw from them,
    and the training steps after an eval must draw what they would have drawn without it."""
    with global_streams_kept():
        if models.env is not None:
            return _episode_metrics(models, ev, cfg, step)
        return _response_metrics(models, ev, cfg, step, all_done)


def _response_metrics(models: Models, ev: EvalSet, cfg: RLConfig, step: int, all_done) -> dict[str, float]:
    # A fixed generator per eval: every eval sees the same sampling noise, so curves are smoother.
    policy = unwrap(models.policy)
    res = evaluate_policy(
        policy,
        models.tokenizer,
        ev.prompts,
        cfg.eval_sampling,
        references=ev.references,
        judge=ev.judge,
        reward_scorer=models.scorer,
        ref_model=models.ref,
        batch_size=cfg.eval.batch_size,
        generator=torch.Generator().manual_seed(cfg.seed + 1),
        all_done=all_done,
    )
    policy.train()
    # without a judge the line would say only "no judge scores": printed for periodic evals (their
    # KL), not for the final eval of a run that asked for none (eval_every=null); its metrics are kept
    if res.win_rate is not None or res.gold is not None or cfg.eval_every:
        say(eval_line(step, cfg.steps, res, len(ev.prompts)))
    return res.as_metrics()


def _episode_metrics(models: Models, ev: EvalSet, cfg: RLConfig, step: int) -> dict[str, float]:
    """One episode of each held-out prompt (sampled as cfg.eval_sampling; the same seed at every
    eval, as for single responses): eval/success (the share of successful episodes, `ev.threshold`),
    eval/tool_calls, eval/turns, eval/reward and eval/truncated per episode (rloo.eval.episodes)."""
    assert models.env is not None and ev.threshold is not None
    policy = unwrap(models.policy)
    try:
        res = evaluate_episodes(
            policy,
            models.tokenizer,
            models.env,
            ev.prompts,
            cfg.eval_sampling,
            n=1,
            seed=cfg.seed + 1,
            batch_size=cfg.eval.batch_size,
            threshold=ev.threshold,
        )
    finally:
        policy.train()  # the sampler put it in eval mode
    say(_episode_line(step, cfg.steps, res, len(ev.prompts)))
    return _episode_record(res)


def _episode_record(res: EpisodeEval) -> dict[str, float]:
    """The metrics.jsonl record of an episode evaluation."""
    d = {
        "success": res.pass_at_1,
        "tool_calls": res.tool_calls,
        "turns": res.turns,
        "reward": res.reward,
        "truncated": res.truncated,
    }
    return {f"eval/{k}": v for k, v in d.items()}


def _episode_line(step: int, steps: int, res: EpisodeEval, n: int) -> str:
    """`eval at step 20/100 (64 prompts, one episode each): success rate 0.250, tool calls 0.94, turns 2.06,
    reward 0.250, truncated 0.016 per episode`."""
    return (
        f"eval at step {step}/{steps} ({n} prompts, one episode each): success rate {res.pass_at_1:.3f}, "
        f"tool calls {res.tool_calls:.2f}, turns {res.turns:.2f}, reward {res.reward:.3f}, "
        f"truncated {res.truncated:.3f} per episode"
    )


def episode_eval_set(cfg: RLConfig, ev: EvalSet | None) -> EvalSet | None:
    """The periodic evaluation of an env= run: `ev`'s held-out prompts played as episodes, every
    cfg.eval_every steps and at the end; None when eval_every is null, or when there are no held-out
    prompts (prompts given to rloo.train: said in one line)."""
    assert cfg.env is not None
    if not cfg.eval_every:
        return None
    if ev is None:
        say(
            f"note: no periodic evaluation of episodes (eval_every={cfg.eval_every}): the prompts given to "
            f"rloo.train have no held-out part; evaluate the saved policy with rloo eval env=..."
        )
        return None
    return EvalSet(ev.prompts, None, None, threshold=success_threshold(cfg.env))


def eval_line(step: int, steps: int, res, n: int) -> str:
    """`eval at step 20/100 (64 prompts): win rate 0.160 vs references, score -1.234 (judge: ...), KL 0.5`."""
    parts = []
    if res.win_rate is not None:
        parts.append(f"win rate {res.win_rate:.3f} vs references")
    if res.gold is not None:
        parts.append(f"score {res.gold:.3f}")
    judged = f" (judge: {res.judge})" if res.judge else " (no judge)"
    kl = f", KL {res.kl:.3f}" if res.kl is not None else ""
    return f"eval at step {step}/{steps} ({n} prompts): {', '.join(parts) or 'no judge scores'}{judged}{kl}"


@overload
def train_and_eval_prompts(
    cfg: RLConfig, task, prompts: None, models: Models, steps: int | None = None
) -> tuple[list[str], EvalSet]: ...
@overload
def train_and_eval_prompts(
    cfg: RLConfig, task, prompts: list[str] | None, models: Models, steps: int | None = None
) -> tuple[list[str], EvalSet | None]: ...
def train_and_eval_prompts(
    cfg: RLConfig, task, prompts, models: Models, steps: int | None = None
) -> tuple[list[str], EvalSet | None]:
    """Training prompts and the held-out eval set: the API's prompts (no eval), the config's
    dataset (judged by eval.judge, by default the reward model), or the built-in task (steps x
    batch_size prompts, at most MAX_DRAWN_PROMPTS; `steps` of the run's start: a resume that extends
    `steps` keeps the list)."""
    if prompts is not None:
        return prompts, None
    rm = models.scorer.reward_model if isinstance(models.scorer, HoldsRewardModel) else None
    rm_name = f"reward model ({cfg.reward_model})"
    if cfg.dataset is not None:
        train_recs, eval_recs = train_eval_records(
            cfg.dataset, ("prompt",), cfg.eval_prompts, models.tokenizer, optional=("completion",)
        )
        refs = [text_field(r.completion) for r in eval_recs] if eval_recs[0].completion is not None else None
        judge = make_judge(cfg.eval.judge, task=task, reward_scorer=rm, use_task=False, reward_name=rm_name)
        return [r.prompt for r in train_recs], EvalSet([r.prompt for r in eval_recs], refs, judge)
    examples = task.examples(cfg.eval_split, cfg.eval_prompts, seed=cfg.seed)
    judge = make_judge(cfg.eval.judge, task=task, reward_scorer=rm, reward_name=rm_name)
    drawn = min((steps or cfg.steps) * cfg.batch_size, MAX_DRAWN_PROMPTS)
    train_prompts = [e.prompt for e in task.examples("train", drawn, seed=cfg.seed)]
    return train_prompts, EvalSet([e.prompt for e in examples], [e.reference for e in examples], judge)


def rl_prompts(cfg, task, prompts, models, started_steps: int):
    """The RL stage's prompt stream, its held-out set (episodes with env=: at eval_every only, no final
    eval without it) and what the length limits cut of both (said; too many refused)."""
    train_prompts, eval_set = train_and_eval_prompts(cfg, task, prompts, models, started_steps)
    if models.env is not None:
        eval_set = episode_eval_set(cfg, eval_set)
    stream = PromptStream(train_prompts, cfg.batch_size, cfg.seed)  # checks every prompt is text
    held_out = eval_set.prompts if eval_set is not None else []
    frame = models.env.prompt_frame if models.env is not None else 0  # an episode's start: its prompt in the frame
    cuts = report_prompt_cuts("rl", models.tokenizer, cfg, stream.prompts, held_out, models.policy, frame)
    return stream, eval_set, cuts

"""The online training loop shared by every on-policy method: data, eval, logging, checkpoints.

The algorithm itself is one step function (see `rloo.recipes.rl.rloo_step`); this file only
feeds it prompts and records what it did.
"""

from __future__ import annotations

import random
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from rloo.checkpoint import latest_checkpoint, load_state, rng_state, save_checkpoint, set_rng_state
from rloo.config import RLConfig
from rloo.errors import RlooError
from rloo.eval.judge import evaluate_policy
from rloo.models import frozen, load_policy, load_reward_model, save_pretrained_atomic
from rloo.recipes.common import adamw, check_device, prepare_output_dir, seed_everything, warmup_constant
from rloo.algorithms import make_algorithm
from rloo.recipes.rl import Models
from rloo.rewards import FunctionReward, RewardModelScorer
from rloo.rollout import rollout
from rloo.tasks import get_task
from rloo.tracking import MetricsLogger, progress, say


class Interrupted(RlooError):
    """SIGINT/SIGTERM arrived; a checkpoint was written at a safe point."""


@dataclass
class RLResult:
    model_path: Path
    history: list[dict] = field(default_factory=list)   # the logged metrics, one dict per record
    final_eval: dict = field(default_factory=dict)


class PromptStream:
    """Prompts in reshuffled epochs; its position is part of the checkpoint for exact resume."""

    def __init__(self, prompts: list[str], batch_size: int, seed: int):
        if not prompts:
            raise RlooError("no training prompts: the prompt list is empty")
        self.prompts, self.batch_size, self.seed = prompts, batch_size, seed
        self.epoch, self.pos = 0, 0

    def _order(self) -> list[int]:
        order = list(range(len(self.prompts)))
        random.Random(f"{self.seed}-{self.epoch}").shuffle(order)
        return order

    def next(self) -> list[str]:
        out: list[str] = []
        while len(out) < self.batch_size:
            order = self._order()
            take = order[self.pos: self.pos + self.batch_size - len(out)]
            out += [self.prompts[i] for i in take]
            self.pos += len(take)
            if self.pos >= len(order):
                self.epoch, self.pos = self.epoch + 1, 0
        return out


class _StopFlag:
    """Turns SIGINT/SIGTERM into a flag the loop checks between steps."""

    def __init__(self):
        self.signum = None

    def __enter__(self):
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:  # a second signal: the user means it
            raise KeyboardInterrupt
        self.signum = signum
        say(f"\nreceived {signal.Signals(signum).name}: stopping after this step and writing a checkpoint")

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


def load_models(cfg: RLConfig, reward_fn=None, policy_path: str | None = None) -> Models:
    """Policy (trainable), frozen reference (the starting policy) and the reward source."""
    policy, tokenizer = load_policy(policy_path or cfg.policy, device=cfg.device)
    ref = frozen(load_policy(cfg.policy, device=cfg.device)[0])
    if reward_fn is None and cfg.reward_fn is not None:
        from rloo.rewards import load_function
        reward_fn = load_function(cfg.reward_fn)
    if reward_fn is not None:
        scorer = FunctionReward(reward_fn)
    elif cfg.reward_model is not None:
        rm, rm_tok = load_reward_model(cfg.reward_model, device=cfg.device)
        scorer = RewardModelScorer(frozen(rm), rm_tok, policy_tokenizer=tokenizer, max_len=cfg.max_prompt_tokens + cfg.max_new_tokens)
    else:
        raise RlooError("no reward source: set reward_model=PATH or reward_fn=module:function")
    policy.train()
    return Models(policy, ref, tokenizer, scorer)


def _preflight(models: Models, prompt: str, cfg: RLConfig) -> None:
    """Score one prompt's k samples before anything is written, so a reward source that is
    broken from the start fails with its error and leaves no half-made run folder behind."""
    roll = rollout(models.policy, models.tokenizer, [prompt], cfg.k, max_prompt_len=cfg.max_prompt_tokens,
                   max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                   generator=torch.Generator().manual_seed(cfg.seed))
    models.scorer(roll)


def _eval(models: Models, task, examples, cfg: RLConfig) -> dict[str, float]:
    # A fixed generator per eval: every eval sees the same sampling noise, so curves are smoother.
    ev = evaluate_policy(models.policy, models.tokenizer, [e.prompt for e in examples],
                         references=[e.reference for e in examples], judge=task.gold_score,
                         reward_scorer=models.scorer, ref_model=models.ref, temperature=cfg.eval.temperature,
                         max_prompt_len=cfg.max_prompt_tokens, max_new_tokens=cfg.max_new_tokens,
                         batch_size=cfg.eval.batch_size, generator=torch.Generator().manual_seed(cfg.seed + 1))
    models.policy.train()
    return ev.as_metrics()


def _print_samples(step: int, roll, rewards, n: int = 2) -> None:
    for i in range(0, min(len(roll.prompts), n * roll.prompt_ids.shape[0]), max(1, len(roll.prompts) // n))[:n]:
        say(f"  [step {step}] {roll.prompts[i]!r} -> {roll.completions[i]!r} (R={rewards[i].item():.3f})")


def _train_state(opt, sched, gen, stream: PromptStream, skipped: int, algo) -> dict:
    return {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "rng": rng_state(gen),
            "stream": [stream.epoch, stream.pos], "skipped_in_row": skipped, "algorithm": algo.state_dict()}


def train(cfg: RLConfig, *, prompts: list[str] | None = None, reward_fn: Callable | None = None,
          resume: bool = False, overwrite: bool = False) -> RLResult:
    """RL fine-tuning of `cfg.policy`. `prompts` and `reward_fn(prompts, completions) -> floats`
    replace the built-in task's prompts and the reward model; without them the task provides both
    prompts and a gold judge for periodic evaluation."""
    if cfg.algorithm == "dpo":  # offline: trains on preference pairs, not on samples
        from rloo.recipes.dpo import train_dpo
        return train_dpo(cfg, resume=resume, overwrite=overwrite)
    check_device(cfg.device)
    gen = seed_everything(cfg.seed)
    task = get_task(cfg.task)
    ckpt = latest_checkpoint(cfg.output_dir) if resume else None
    models = load_models(cfg, reward_fn, policy_path=str(ckpt / "model") if ckpt else None)
    train_prompts = prompts if prompts is not None else [e.prompt for e in task.examples("train", cfg.steps * cfg.batch_size, seed=cfg.seed)]
    eval_examples = task.examples("eval", cfg.eval_prompts, seed=cfg.seed) if prompts is None else None
    stream = PromptStream(train_prompts, cfg.batch_size, cfg.seed)
    _preflight(models, train_prompts[0], cfg)
    out = prepare_output_dir(cfg, resume=resume, overwrite=overwrite)
    opt = adamw(models.policy.parameters(), cfg.lr)
    sched = warmup_constant(opt, cfg.warmup_steps)
    algo = make_algorithm(cfg, models)   # the method's step, and its state (value model, baseline)
    start, skipped = 0, 0
    if ckpt is not None:
        st = load_state(ckpt)
        opt.load_state_dict(st["optimizer"]), sched.load_state_dict(st["scheduler"]), set_rng_state(st["rng"], gen)
        stream.epoch, stream.pos = st["stream"]
        algo.load_state_dict(st.get("algorithm", {}))
        start, skipped = st["step"], st["skipped_in_row"]
        say(f"resuming from {ckpt} at step {start}")
    return _loop(cfg, models, opt, sched, stream, gen, task, eval_examples, out, start, skipped, algo)


def _loop(cfg, models, opt, sched, stream, gen, task, eval_examples, out, start, skipped, algo) -> RLResult:
    log, history = MetricsLogger(out), []
    bar = progress(cfg.steps, f"{cfg.algorithm}", initial=start)

    def record(step, metrics):
        log.log(step, metrics)
        history.append({"step": step, **metrics})

    def checkpoint(step):
        return save_checkpoint(out, step, models.policy, models.tokenizer,
                               _train_state(opt, sched, gen, stream, skipped, algo), keep=cfg.keep_checkpoints)

    try:
        with _StopFlag() as stop:
            for step in range(start, cfg.steps):
                if eval_examples is not None and cfg.eval_every and step % cfg.eval_every == 0:
                    record(step, _eval(models, task, eval_examples, cfg))
                stats, roll, rewards = algo.step(models, opt, stream.next(), cfg, gen)
                sched.step()
                skipped = skipped + 1 if stats["guard/skipped"] else 0
                if skipped >= cfg.max_skipped_steps:
                    raise RlooError(f"{skipped} steps in a row had a non-finite loss or gradient; stopping. "
                                    f"Last good checkpoint: {latest_or_none(out)}. Lower lr or check the reward.")
                if (step + 1) % cfg.log_every == 0:
                    record(step + 1, stats | {"lr": sched.get_last_lr()[0]})
                bar.set_postfix(score=f"{stats['reward/score']:.3f}", kl=f"{stats['reward/kl']:.3f}")
                bar.update()
                if bar.disable and (step + 1) % max(1, cfg.steps // 10) == 0:
                    say(f"{cfg.algorithm} step {step + 1}/{cfg.steps}: score {stats['reward/score']:.3f} kl {stats['reward/kl']:.3f}")
                if (step + 1) % cfg.sample_every == 0:
                    _print_samples(step + 1, roll, rewards)
                if stop.signum is not None:
                    path = checkpoint(step + 1)
                    raise Interrupted(f"interrupted at step {step + 1}; checkpoint {path}; "
                                      f"continue with the same command plus --resume")
                if cfg.save_every and (step + 1) % cfg.save_every == 0:
                    checkpoint(step + 1)
        final = _eval(models, task, eval_examples, cfg) if eval_examples is not None else {}
        if final:
            record(cfg.steps, final)
        save_pretrained_atomic(models.policy, models.tokenizer, out / "model")
    finally:
        bar.close()
        log.close()
    say(f"{cfg.algorithm}: saved {out / 'model'}" + (f" (win rate {final['eval/win_rate']:.3f})" if final else ""))
    return RLResult(out / "model", history, final)


def latest_or_none(out: Path) -> str:
    ckpt = latest_checkpoint(out)
    return str(ckpt) if ckpt else "none yet"

"""The online training loop shared by every on-policy method: data, eval, logging, checkpoints.

The algorithm itself is one step function (see `rloo.recipes.rl.rloo_step`); this file only
feeds it prompts and records what it did.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from rloo.checkpoint import Checkpointer, check_resume_config, latest_checkpoint, load_state, truncate_metrics
from rloo.config import RLConfig
from rloo.preflight import check_config
from rloo.errors import Interrupted, NonFiniteError, RlooError
from rloo.eval.judge import evaluate_policy
from rloo.eval.plots import plot_training
from rloo import distributed
from rloo.data.datasets import train_eval_records
from rloo.distributed import unwrap
from rloo.lora import AdapterDisabled, add_lora, for_saving
from rloo.models import (enable_gradient_checkpointing, frozen, load_policy, load_reward_model, model_options,
                         save_pretrained_atomic)
from rloo.recipes.common import adamw, check_device, prepare_output_dir, seed_everything, warmup_constant
from rloo.algorithms import make_algorithm
from rloo.recipes.rl import Models
from rloo.rewards import build_reward
from rloo.rewards.judges import make_judge, task_judge
from rloo.rollout import rollout
from rloo.tasks import get_task
from rloo.progress_text import progress_suffix
from rloo.trackers import sample_rows
from rloo.tracking import MetricsLogger, progress, say


@dataclass
class RLResult:
    model_path: Path
    history: list[dict] = field(default_factory=list)   # the logged metrics, one dict per record
    final_eval: dict = field(default_factory=dict)
    plots: list[Path] = field(default_factory=list)     # reward.png, kl.png, win_rate.png under output_dir/plots


class PromptStream:
    """Prompts in reshuffled epochs; its position is part of the checkpoint for exact resume."""

    def __init__(self, prompts: list[str], batch_size: int, seed: int):
        self.prompts, self.batch_size, self.seed = check_prompts(prompts), batch_size, seed
        self.epoch, self.pos = 0, 0

    def position(self) -> tuple[int, int]:
        return self.epoch, self.pos

    def seek(self, epoch: int, pos: int) -> None:
        self.epoch, self.pos = epoch, pos

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


def check_prompts(prompts) -> list[str]:
    """The training prompts, or a clear error naming the first bad one."""
    prompts = list(prompts)
    if not prompts:
        raise RlooError("no training prompts: the prompt list is empty; pass at least one prompt")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise RlooError(f"prompt {i} is a {type(p).__name__}, expected a string")
        if not p.strip():
            raise RlooError(f"prompt {i} is empty; remove empty prompts from the data")
    return prompts


class _StopFlag:
    """Turns SIGINT/SIGTERM into a flag the loop checks between steps."""

    def __init__(self):
        self.signum = None
        self._old = {}

    def __enter__(self):
        # Signal handlers can only be set from the main thread; elsewhere the default applies.
        if threading.current_thread() is threading.main_thread():
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
    """Policy (trainable), frozen reference (the starting policy) and the reward source. With LoRA
    the reference is the policy with its adapters disabled; `policy_path` (a checkpoint) holds
    full weights, or only adapters under LoRA."""
    opts = model_options(cfg)
    if cfg.lora is not None:
        base, tokenizer = load_policy(cfg.policy, **opts)
        policy = add_lora(base, cfg.lora, adapter_path=policy_path)
        ref = AdapterDisabled(policy)
    else:
        policy, tokenizer = load_policy(policy_path or cfg.policy, **opts)
        ref = frozen(load_policy(cfg.policy, **opts)[0])
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(policy)
    scorer = build_reward(cfg, tokenizer, reward_fn, load_rm=lambda p: _frozen_rm(p, opts))
    policy.train()
    return Models(policy, ref, tokenizer, scorer, sampler=_vllm_sampler(cfg, tokenizer, policy_path))


def _frozen_rm(path: str, opts: dict):
    rm, tok = load_reward_model(path, **opts)
    return frozen(rm), tok


def _vllm_sampler(cfg: RLConfig, tokenizer, policy_path: str | None):
    if cfg.generation != "vllm":
        return None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or cfg.lora is not None:
        raise RlooError("generation=vllm runs in a single process without lora; use generation=sampler")
    from rloo.rollout.vllm import VLLMSampler
    return VLLMSampler(policy_path or cfg.policy, tokenizer, k=cfg.k, max_prompt_len=cfg.max_prompt_tokens,
                       max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                       seed=cfg.seed, gpu_memory_utilization=cfg.vllm_gpu_memory_utilization)


def _preflight(models: Models, prompt: str, cfg: RLConfig) -> None:
    """Score one prompt's k samples before anything is written, so a reward source that is
    broken from the start fails with its error and leaves no half-made run folder behind."""
    roll = rollout(models.policy, models.tokenizer, [prompt], cfg.k, max_prompt_len=cfg.max_prompt_tokens,
                   max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                   generator=torch.Generator().manual_seed(cfg.seed))
    models.scorer(roll)


@dataclass
class EvalSet:
    prompts: list[str]
    references: list[str] | None
    judge: Callable | None       # judge(prompt, response) -> float; None: no win rate

    @classmethod
    def of_task(cls, task, examples) -> "EvalSet":
        """A built-in task's held-out examples, judged by its gold judge."""
        return cls([e.prompt for e in examples], [e.reference for e in examples], task_judge(task))


def _eval(models: Models, ev: EvalSet, cfg: RLConfig, step: int) -> dict[str, float]:
    """Periodic evaluation of the policy on `ev`; one printed line per eval (rank 0)."""
    # A fixed generator per eval: every eval sees the same sampling noise, so curves are smoother.
    policy = unwrap(models.policy)
    res = evaluate_policy(policy, models.tokenizer, ev.prompts, references=ev.references, judge=ev.judge,
                          reward_scorer=models.scorer, ref_model=models.ref, temperature=cfg.eval.temperature,
                          max_prompt_len=cfg.max_prompt_tokens, max_new_tokens=cfg.max_new_tokens,
                          batch_size=cfg.eval.batch_size, generator=torch.Generator().manual_seed(cfg.seed + 1))
    policy.train()
    say(eval_line(step, cfg.steps, res, len(ev.prompts)))
    return res.as_metrics()


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


def _data(cfg: RLConfig, task, prompts, models: Models) -> tuple[list[str], EvalSet | None]:
    """Training prompts and the held-out eval set: the API's prompts (no eval), the config's
    dataset (judged by eval.judge, by default the reward model), or the built-in task."""
    if prompts is not None:
        return prompts, None
    rm = getattr(models.scorer, "reward_model", None)
    if cfg.dataset is not None:
        train_recs, eval_recs = train_eval_records(cfg.dataset, ("prompt",), cfg.eval_prompts, models.tokenizer,
                                                   optional=("completion",))
        refs = [r.completion for r in eval_recs] if eval_recs[0].completion is not None else None
        judge = make_judge(cfg.eval.judge, task=task, reward_scorer=rm, use_task=False,
                           reward_name=f"reward model ({cfg.reward_model})")
        return [r.prompt for r in train_recs], EvalSet([r.prompt for r in eval_recs], refs, judge)
    examples = task.examples("eval", cfg.eval_prompts, seed=cfg.seed)
    judge = make_judge(cfg.eval.judge, task=task, reward_scorer=rm, reward_name=f"reward model ({cfg.reward_model})")
    train_prompts = [e.prompt for e in task.examples("train", cfg.steps * cfg.batch_size, seed=cfg.seed)]
    return train_prompts, EvalSet([e.prompt for e in examples], [e.reference for e in examples], judge)


def _print_samples(step: int, roll, rewards, n: int = 2) -> None:
    for i in range(0, min(len(roll.prompts), n * roll.prompt_ids.shape[0]), max(1, len(roll.prompts) // n))[:n]:
        say(f"  [step {step}] {roll.prompts[i]!r} -> {roll.completions[i]!r} (R={rewards[i].item():.3f})")


def train(cfg: RLConfig, *, prompts: list[str] | None = None, reward_fn: Callable | None = None,
          resume: bool = False, overwrite: bool = False) -> RLResult:
    """RL fine-tuning of `cfg.policy`. `prompts` and `reward_fn(prompts, completions) -> floats`
    replace the built-in task's prompts and the reward model; without them the task provides both
    prompts and a gold judge for periodic evaluation. `resume` continues from the newest whole
    checkpoint in `cfg.output_dir` (exactly: same parameters as a run that never stopped)."""
    check_config(cfg, reward_fn=reward_fn)  # before any model loads
    if cfg.algorithm == "dpo":  # offline: trains on preference pairs, not on samples
        from rloo.recipes.dpo import train_dpo
        return train_dpo(cfg, resume=resume, overwrite=overwrite)
    # under torchrun every process runs this same function (see rloo.distributed)
    dist = distributed.init(cfg.device, cfg.parallel, cfg.batch_size)
    try:
        if dist.enabled:
            distributed.check_supported(cfg, resume)
            cfg = cfg.model_copy(update={"device": dist.device(cfg.device)})
        return _train(cfg, dist, prompts, reward_fn, resume, overwrite)
    finally:
        dist.close()


def _train(cfg, dist, prompts, reward_fn, resume, overwrite) -> RLResult:
    check_device(cfg.device)
    gen = seed_everything(cfg.seed)
    task = get_task(cfg.task)
    ckpt, state = _resume_point(cfg) if resume else (None, None)
    models = load_models(cfg, reward_fn, policy_path=str(ckpt / "model") if ckpt else None)
    train_prompts, eval_set = _data(cfg, task, prompts, models)
    stream = PromptStream(train_prompts, cfg.batch_size, cfg.seed)
    _preflight(models, stream.prompts[0], cfg)
    out = prepare_output_dir(cfg, resume=resume, overwrite=overwrite, can_resume=True) if dist.is_main else Path(cfg.output_dir)
    dist.barrier()
    models.policy = dist.wrap(models.policy)
    opt = adamw(models.policy.parameters(), cfg.lr)
    sched = warmup_constant(opt, cfg.warmup_steps)
    algo = make_algorithm(cfg, models)   # the method's step, and its state (value model, baseline)
    ck = Checkpointer(out, cfg, unwrap(models.policy), models.tokenizer, opt, sched, gen, stream, stream.prompts, algo=algo)
    dist.restrict_checkpoints(ck)
    start = 0
    if state is not None:
        start = ck.restore(state)
        say(f"resuming from {ckpt} at step {start}")
    elif resume:
        truncate_metrics(out, 0)  # records of a run killed before its first checkpoint
    return _loop(cfg, dist, models, ck, eval_set, start)


def _resume_point(cfg: RLConfig):
    ckpt = latest_checkpoint(cfg.output_dir)
    if ckpt is None:
        say(f"--resume: no whole checkpoint in {Path(cfg.output_dir) / 'checkpoints'}; starting from step 0")
        return None, None
    state = load_state(ckpt)
    changed = check_resume_config(json.loads(state["config"]), cfg.model_dump(mode="json"))
    if changed:
        say("resuming with changed settings (not an exact continuation): " + "; ".join(changed))
    return ckpt, state


def _loop(cfg, dist, models, ck: Checkpointer, eval_set, start: int) -> RLResult:
    out, opt, sched, stream = ck.out, ck.opt, ck.sched, ck.stream
    log = MetricsLogger(out, purge_step=start + 1 if start else None, report_to=cfg.report_to,
                        config=cfg.model_dump(mode="json")) if dist.is_main else None
    # no plain lines from the bar: _show prints its own, with the scores
    bar = progress(cfg.steps, f"{cfg.algorithm}", initial=start, disable=not dist.is_main, plain_lines=False)
    history = []

    def record(step, metrics):
        if log is not None:
            log.log(step, metrics)
        history.append({"step": step, **metrics})

    clock = (time.perf_counter(), start)  # for the ETA of plain-text progress lines
    try:
        with _StopFlag() as stop:
            for step in range(start, cfg.steps):
                pre = ck.snapshot(step)  # the state before this step, for a checkpoint if it fails
                if eval_set is not None and cfg.eval_every and step % cfg.eval_every == 0:
                    record(step, _eval(models, eval_set, cfg, step))
                # this process's prompts of the global batch, and its rows of the B*K completions
                prompts, rows = dist.shard(stream.next(), cfg.k)
                try:
                    stats, roll, rewards = ck.algo.step(models, opt, prompts, cfg, ck.gen,
                                                        **dist.step_kwargs(ck.algo, rows))
                except RlooError as e:  # raised before the update, so `pre` still matches the weights
                    path = ck.save(pre)
                    raise type(e)(f"{e} (at step {step + 1}; checkpoint from before it: {path}; "
                                  f"fix the cause and rerun with --resume)") from e
                stats = dist.mean_metrics(stats | getattr(models.scorer, "part_metrics", dict)())
                if models.sampler is not None:  # keep vLLM's copy of the weights on-policy
                    models.sampler.sync(unwrap(models.policy))
                sched.step()
                stats |= _count(ck, stats, pre, step, cfg)
                if (step + 1) % cfg.log_every == 0:
                    record(step + 1, stats | {"lr": sched.get_last_lr()[0]})
                _show(bar, cfg, step, stats, roll, rewards, clock)
                if log is not None and (step + 1) % cfg.sample_every == 0:
                    log.log_samples(step + 1, sample_rows(roll))
                if stop.signum is not None:
                    path = ck.save(ck.snapshot(step + 1))
                    name = signal.Signals(stop.signum).name
                    raise Interrupted(f"{name} received; stopped at step {step + 1}/{cfg.steps} and saved {path}; "
                                      f"continue with the same command plus --resume", stop.signum)
                if cfg.save_every and (step + 1) % cfg.save_every == 0:
                    _periodic_checkpoint(ck, step + 1)
            # past the last step a signal no longer interrupts: finishing is quicker than resuming
            final = _eval(models, eval_set, cfg, cfg.steps) if eval_set is not None else {}
            if final:
                record(cfg.steps, final)
            _save_final(cfg, dist, models, out / "model")
    finally:
        bar.close()
        if log is not None:
            log.close()
    plots = []
    if dist.is_main:
        judge = getattr(eval_set.judge, "name", "judge") if eval_set is not None and eval_set.judge else "judge"
        plots = plot_training(out / "metrics.jsonl", out / "plots", title=f"{cfg.algorithm} on {cfg.dataset.path if cfg.dataset else cfg.task}",
                              judge=judge)
        win = f" (win rate {final['eval/win_rate']:.3f})" if "eval/win_rate" in final else ""
        say(f"{cfg.algorithm}: saved {out / 'model'}{win}; plots in {out / 'plots'}")
    return RLResult(out / "model", history, final, plots)


def _save_final(cfg, dist, models, path: Path) -> None:
    """Full weights, the LoRA adapters alone, or the weights with adapters merged (lora.save);
    under torchrun gathered from every process and written by rank 0."""
    model = dist.saveable(models.policy)
    if dist.is_main:
        save_pretrained_atomic(for_saving(model, cfg.lora), models.tokenizer, path)
    dist.barrier()


def _count(ck: Checkpointer, stats: dict, pre: dict, step: int, cfg: RLConfig) -> dict:
    """Update the running counters; stop with a checkpoint from before the problem when
    `max_skipped_steps` steps in a row had a non-finite loss or gradient (their updates were skipped)."""
    c = ck.counters
    cut = int(stats.get("data/prompts_truncated", 0))
    if cut and c["prompts_truncated"] == 0:
        say(f"note: prompts longer than max_prompt_tokens={cfg.max_prompt_tokens} keep their last tokens "
            f"(counted as data/prompts_truncated)")
    c["prompts_truncated"] += cut
    if not stats["guard/skipped"]:
        c["updates"] += 1
        c["skipped_in_row"], ck.streak_start = 0, None
        return {"guard/skipped_total": float(c["skipped_total"])}
    if c["skipped_in_row"] == 0:
        ck.streak_start = {k: v for k, v in pre.items() if k != "streak_start"}
    c["skipped_in_row"] += 1
    c["skipped_total"] += 1
    say(f"step {step + 1}: non-finite loss or gradient, update skipped ({c['skipped_in_row']} in a row, "
        f"{c['skipped_total']} in all)")
    if c["skipped_in_row"] >= cfg.max_skipped_steps:
        first = ck.streak_start
        ck.drop_newer_than(first["step"])  # written mid-streak; resuming there would repeat the problem
        path = ck.save(first)
        raise NonFiniteError(f"{c['skipped_in_row']} steps in a row (steps {first['step'] + 1}-{step + 1}) had a "
                             f"non-finite loss or gradient; stopped. Checkpoint from before the problem: {path}. "
                             f"Lower lr or max_grad_norm, or check the reward, then rerun with --resume")
    return {"guard/skipped_total": float(c["skipped_total"])}


def _periodic_checkpoint(ck: Checkpointer, step: int) -> None:
    if ck.counters["skipped_in_row"]:
        say(f"checkpoint at step {step} postponed: the last {ck.counters['skipped_in_row']} steps were skipped")
        return
    ck.save(ck.snapshot(step))


def _show(bar, cfg, step, stats, roll, rewards, clock) -> None:
    bar.set_postfix(score=f"{stats['reward/score']:.3f}", kl=f"{stats['reward/kl']:.3f}")
    bar.update()
    if bar.disable and (step + 1) % max(1, cfg.steps // 10) == 0:  # no terminal: a line with an ETA
        t0, start = clock
        eta = progress_suffix(step + 1 - start, cfg.steps - start, time.perf_counter() - t0)
        say(f"{cfg.algorithm} step {step + 1}/{cfg.steps}: score {stats['reward/score']:.3f} "
            f"kl {stats['reward/kl']:.3f} ({eta})")
    if (step + 1) % cfg.sample_every == 0:
        _print_samples(step + 1, roll, rewards)

"""The online training loop shared by every on-policy method: eval, logging, checkpoints, signals.

The algorithm itself is one step (see `rloo.algorithms`); this file only feeds it prompts and
records what it did.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rloo.algorithms.base import Algorithm, StepResult
from rloo.data.prompts import PromptStream
from rloo.errors import (
    Interrupted,
    NonFiniteError,
    RewardError,
    RlooError,
    StoppedByCallback,
    how_to_continue,
    option,
    rerun_hint,
)
from rloo.eval.plots import plot_training
from rloo.modeling.loading import save_pretrained_atomic
from rloo.modeling.lora import for_saving
from rloo.rollout.capabilities import part_metrics
from rloo.runtime.checkpoint.save import Checkpointer
from rloo.runtime.distributed import unwrap
from rloo.runtime.paramguard import ParamGuard
from rloo.runtime.signals import StopFlag
from rloo.runtime.tracking.log import MetricsLogger, progress, say
from rloo.runtime.tracking.progress_text import progress_suffix
from rloo.runtime.tracking.trackers import sample_rows
from rloo.training.callbacks import Callbacks, asked_anywhere, stop_line
from rloo.training.evalset import EvalSet, eval_metrics
from rloo.training.guard import NonFiniteGuard, VanishingWeights, check_update


@dataclass
class LoopState:
    """What the loop runs with: the method (its step and state), the optimizer and its schedule,
    the generator, the prompt stream, the checkpointer that saves all of them, and the weight guard
    (rloo.runtime.paramguard) that undoes an update leaving bad weights."""

    algo: Algorithm
    opt: torch.optim.Optimizer
    sched: Any
    gen: torch.Generator
    stream: PromptStream
    ck: Checkpointer
    param_guard: ParamGuard
    callbacks: Callbacks = field(default_factory=lambda: Callbacks([], None, 0))  # the API's (training/callbacks.py)


@dataclass
class RLResult:
    model_path: Path
    history: list[dict] = field(default_factory=list)  # the logged metrics, one dict per record
    final_eval: dict = field(default_factory=dict)
    plots: list[Path] = field(default_factory=list)  # reward.png, kl.png, win_rate.png under output_dir/plots


def loop(cfg, dist, models, state: LoopState, eval_set: EvalSet | None, start: int) -> RLResult:
    """Steps start..cfg.steps of state.algo, with periodic evals, metrics, checkpoints; stops cleanly
    (with a checkpoint) on SIGINT/SIGTERM; the final eval and the final model."""
    ck, opt, sched, stream, algo = state.ck, state.opt, state.sched, state.stream, state.algo
    out, scorer = ck.out, models.scorer
    assert scorer is not None, "an online method needs a reward source"
    guard, weights_watch = NonFiniteGuard(ck, cfg.max_skipped_steps, state.param_guard), VanishingWeights()
    step_kwargs = dist.step_kwargs if algo.distributed else lambda rows: {}
    log = _metrics_logger(cfg, out, start) if dist.is_main else None
    # no plain lines from the bar: _show prints its own, with the scores
    bar = progress(cfg.steps, f"{cfg.algorithm}", initial=start, disable=not dist.is_main, plain_lines=False)
    history = []

    cbs = state.callbacks

    def record(step, metrics):
        if log is not None:
            log.log(step, metrics)
            cbs.log(step, metrics)
        history.append({"step": step, **metrics})

    clock = (time.perf_counter(), start)  # for the ETA of plain-text progress lines
    try:
        with StopFlag(quiet=dist.peer_gone) as stop:  # torchrun's SIGTERM after a lost process: no note
            for step in range(start, cfg.steps):
                pre = ck.snapshot(step)  # the state before this step, for a checkpoint if it fails
                if eval_set is not None and cfg.eval_every and step % cfg.eval_every == 0:
                    record(step, eval_metrics(models, eval_set, cfg, step, **dist.eval_kwargs()))
                # this process's prompts of the global batch, and its rows of the B*K completions
                prompts, rows = dist.shard(stream.next(), cfg.k)
                lr = opt.param_groups[0]["lr"]  # the rate this step's update uses (sched.step() sets the next)
                state.param_guard.before_step()
                try:
                    result = algo.step(models, opt, prompts, cfg, state.gen, **step_kwargs(rows))
                except RlooError as e:  # raised before the update, so `pre` still matches the weights
                    raise _failed_step(ck, pre, step + 1, e) from e
                checked = check_update(state.param_guard, dist, result.skipped)
                parts = scorer.part_metrics() | part_metrics(models.sampler)
                result.stats = dist.mean_metrics(result.stats | checked | parts)
                if models.sampler is not None:  # keep vLLM's copy of the weights on-policy
                    models.sampler.sync(unwrap(models.policy))
                sched.step()
                _count_truncated_prompts(ck.counters, result.stats, cfg)
                _count_scored(ck.counters, result.stats, step + 1, len(result.rollout.prompts))
                undone = bool(result.stats.get("guard/params_undone"))
                result.stats |= guard.after_step(result.skipped, pre, step, undone)
                weights_watch.after_step(result.stats, step + 1)
                if (step + 1) % cfg.log_every == 0:
                    record(step + 1, result.stats | {"lr": lr})
                _show(bar, cfg, step, result, clock)
                if log is not None and (step + 1) % cfg.sample_every == 0:
                    log.log_samples(step + 1, sample_rows(result.rollout))
                cbs.fire("on_step_end", step + 1, metrics=dict(result.stats))
                asked = asked_anywhere(cbs, dist)
                if stop.signum is not None:
                    raise _interrupted(ck, stop.signum, step + 1, cfg.steps)
                if asked:
                    raise _stopped(ck, cbs, step + 1, cfg.steps)
                if cfg.save_every and (step + 1) % cfg.save_every == 0:
                    cbs.saved(step + 1, _periodic_checkpoint(ck, guard, step + 1))
            _check_trained(ck.counters, cfg.steps)
            # past the last step a signal no longer interrupts: finishing is quicker than resuming
            final = eval_metrics(models, eval_set, cfg, cfg.steps, **dist.eval_kwargs()) if eval_set is not None else {}
            if final:
                record(cfg.steps, final)
            _save_final(cfg, dist, models, out / "model")
    finally:
        bar.close()
        if log is not None:
            log.close()
    plots = []
    if dist.is_main:
        judge = eval_set.judge.name if eval_set is not None and eval_set.judge else "judge"
        data = cfg.dataset.path if cfg.dataset else cfg.task
        plots = plot_training(out / "metrics.jsonl", out / "plots", title=f"{cfg.algorithm} on {data}", judge=judge)
        say(f"{cfg.algorithm}: saved {out / 'model'}{_headline(final)}; plots in {out / 'plots'}")
    return RLResult(out / "model", history, final, plots)


def _headline(final: dict) -> str:
    """The final evaluation's headline for the run's last line: the win rate, or episodes' success rate."""
    if "eval/win_rate" in final:
        return f" (win rate {final['eval/win_rate']:.3f})"
    return f" (success rate {final['eval/success']:.3f})" if "eval/success" in final else ""


def _saved(ck: Checkpointer, path: Path | None) -> str | None:
    """Where the checkpoint just saved is, for a message; None when no process writes one (under
    parallel=fsdp: `ck.skip_note`), where --resume would have nothing to continue from."""
    if path is not None:
        return str(path)
    return None if ck.skip_note else "written by rank 0"


def _failed_step(ck: Checkpointer, pre: dict, step: int, e: RlooError) -> RlooError:
    """Save the state from before step `step` (1-based), which failed, and say how to continue
    (under `rloo compare`/`pipeline`, which rerun the run from its start: their way, nothing saved)."""
    if rerun_hint() is not None:
        return type(e)(f"{e} (at step {step}; fix the cause and {rerun_hint()})")
    where = _saved(ck, ck.save(pre))
    if where is None:
        return type(e)(f"{e} (at step {step}; no checkpoint: {ck.skip_note}; fix the cause and rerun from the start)")
    return type(e)(
        f"{e} (at step {step}; checkpoint from before it: {where}; fix the cause and rerun with {option('resume')})"
    )


def _interrupted(ck: Checkpointer, signum: int, step: int, steps: int) -> Interrupted:
    """Save the state after step `step` (1-based) and say how to continue; under a caller that
    reruns the run from its start (`rloo compare`, `rloo pipeline`: rloo.errors.rerun_continues)
    nothing is saved, and the line says the caller's way."""
    stopped = f"{signal.Signals(signum).name} received; stopped at step {step}/{steps}"
    if rerun_hint() is not None:
        return Interrupted(f"{stopped}; {how_to_continue(True)}", signum)
    where = _saved(ck, ck.save(ck.snapshot(step)))
    if where is None:
        return Interrupted(f"{stopped}; nothing saved ({ck.skip_note}): rerun from the start", signum)
    return Interrupted(f"{stopped} and saved {where}; {how_to_continue(True)}", signum)


def _stopped(ck: Checkpointer, cbs: Callbacks, step: int, steps: int) -> StoppedByCallback:
    """A callback's stop after step `step`: saved as an interrupt is (`_interrupted`), the hook named."""
    what = cbs.asked or "a callback on rank 0"
    if rerun_hint() is not None:
        return StoppedByCallback(f"{what} asked to stop; stopped at step {step}/{steps}; {how_to_continue(True)}")
    path = ck.save(ck.snapshot(step))
    cbs.saved(step, path)
    where = _saved(ck, path)
    saved = f"and saved {where}" if where else f"(nothing saved: {ck.skip_note})"
    return StoppedByCallback(f"{stop_line(what, step, steps, saved)}; {how_to_continue(where is not None)}")


def _save_final(cfg, dist, models, path: Path) -> None:
    """Full weights, the LoRA adapters alone, or the weights with adapters merged (lora.save);
    under torchrun gathered from every process and written by rank 0."""
    model = dist.saveable(models.policy)
    if dist.is_main:
        save_pretrained_atomic(for_saving(model, cfg.lora), models.tokenizer, path)
    dist.barrier()


def _metrics_logger(cfg, out: Path, start: int) -> MetricsLogger:
    """metrics.jsonl (and the trackers) of rank 0; a resumed run drops records past its step."""
    return MetricsLogger(
        out, purge_step=start + 1 if start else None, report_to=cfg.report_to, config=cfg.model_dump(mode="json")
    )


def _check_trained(counters: dict, steps: int) -> None:
    """After the last step: a run none of whose steps updated, or none of whose steps had a scored
    completion, has no model worth saving."""
    if counters["updates"] == 0:
        raise NonFiniteError(
            f"every step was skipped ({counters['skipped_total']} of {steps}: "
            f"non-finite loss, gradient or parameters); no model was saved. Lower lr or "
            f"max_grad_norm, or check the reward"
        )
    if counters["scored_steps"] == 0:
        raise RewardError(
            f"none of the {steps} steps had a scored completion (the reward returned None for every "
            f"completion), so no update had a gradient; no model was saved. Check the reward"
        )


def _count_truncated_prompts(counters: dict, stats: dict, cfg) -> None:
    cut = int(stats.get("data/prompts_truncated", 0))
    if cut and counters["prompts_truncated"] == 0:
        say(
            f"note: prompts longer than max_prompt_tokens={cfg.max_prompt_tokens} keep their last tokens "
            f"(counted as data/prompts_truncated)"
        )
    counters["prompts_truncated"] += cut


def _count_scored(counters: dict, stats: dict, step: int, n: int) -> None:
    """Say each step whose every completion the reward left unscored (None): it has no gradient."""
    if stats.get("reward/unscored", 0.0) < 1.0:
        counters["scored_steps"] += 1
        return
    say(f"step {step}: the reward scored none of the {n} completions (every score None); no gradient from this step")


def _periodic_checkpoint(ck: Checkpointer, guard: NonFiniteGuard, step: int) -> Path | None:
    if guard.in_streak:
        say(f"checkpoint at step {step} postponed: the last {guard.in_streak} steps were skipped")
        return None
    return ck.save(ck.snapshot(step))


def _show(bar, cfg, step, result: StepResult, clock) -> None:
    bar.set_postfix(score=f"{result.score:.3f}", kl=f"{result.kl:.3f}")
    bar.update()
    if bar.disable and (step + 1) % max(1, cfg.steps // 10) == 0:  # no terminal: a line with an ETA
        t0, start = clock
        eta = progress_suffix(step + 1 - start, cfg.steps - start, time.perf_counter() - t0)
        say(f"{cfg.algorithm} step {step + 1}/{cfg.steps}: score {result.score:.3f} kl {result.kl:.3f} ({eta})")
    if (step + 1) % cfg.sample_every == 0:
        _print_samples(step + 1, result.rollout, result.rewards)


def _print_samples(step: int, roll, rewards, n: int = 2) -> None:
    for i in range(0, min(len(roll.prompts), n * roll.prompt_ids.shape[0]), max(1, len(roll.prompts) // n))[:n]:
        say(f"  [step {step}] {roll.prompts[i]!r} -> {roll.completions[i]!r} (R={rewards[i].item():.3f})")

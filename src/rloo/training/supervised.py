"""The checkpoints of a stage that passes over its data in epochs (SFT, the reward model, DPO), with the
RL stage's promises: written atomically in the same layout (rloo.runtime.checkpoint.save), every
`save_every` steps and when SIGINT or SIGTERM stops the stage after its step, and read back by
`resume` so that the stage continues bit for bit (one thread, as RL; rloo.runtime.cpukind says what
another count promises).

A checkpoint after step s holds the weights (model/), the optimizer, the schedule, every random
stream (rloo.runtime.checkpoint.rng), the position in the data (epoch e, b batches of it trained, and epoch e's
permutation, drawn from the stage's generator when the epoch started, as rloo.data.collate.batches
draws it), the guard's counters, the stage's own running values (`extra`: SFT's smoothed loss, the
reward model's sampled preference pairs; DPO has none), the metrics file's length, a digest of the
training data, the inputs' fingerprints and the config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from rloo.config import upgrade_saved_config
from rloo.errors import Interrupted, RlooError, StoppedByCallback, how_to_continue, option, rerun_hint
from rloo.modeling.lora import load_saved_weights
from rloo.runtime.checkpoint.resumecheck import check_optimizer_matches, check_resume_config, describe_changes
from rloo.runtime.checkpoint.rng import rng_state, set_rng_state
from rloo.runtime.checkpoint.save import restore_optimizer, save_checkpoint, truncate_metrics
from rloo.runtime.checkpoint.verify import STAGE_KEYS, checked_state, latest_checkpoint, load_state
from rloo.runtime.cpukind import resume_threads
from rloo.runtime.inputs.fingerprint import check_inputs_unchanged
from rloo.runtime.runfolder.layout import run_kind
from rloo.runtime.signals import StopFlag, stage_interrupted
from rloo.runtime.tracking.log import MetricsLogger, say
from rloo.training.callbacks import Callbacks
from rloo.training.resumable import check_something_to_resume, refuse_finished


def resume_point(cfg) -> tuple[Path | None, dict | None]:
    """The newest whole checkpoint of the stage in `cfg.output_dir` and its state; (None, None),
    said in one line, when there is none (the stage then starts from step 0); RlooError when there is
    nothing of a run to resume, or the run is finished (rloo.training.resumable)."""
    check_something_to_resume(cfg.output_dir, run_kind(cfg))
    ckpt = latest_checkpoint(cfg.output_dir)
    if ckpt is None:
        refuse_finished(cfg)
        say(f"{option('resume')}: no whole checkpoint in {Path(cfg.output_dir) / 'checkpoints'}; starting from step 0")
        return None, None
    return ckpt, checked_state(ckpt, load_state(ckpt), needs=STAGE_KEYS)  # whole, its JSON decodes: one line


def check_stage_resume(
    cfg, ckpt: Path, state: dict, total: int, data_sha: str, inputs: dict, params, how: str | None = None
) -> None:
    """Refuse, in one line and before the run folder is touched, a resume whose checkpoint is not this
    stage's: other fixed settings, other training data, other inputs, an optimizer state that does not
    fit the model; then say the settings that changed (rloo.runtime.checkpoint.resumecheck). `total`: the stage's
    steps now; `params`: its trainable parameters in the optimizer's order; `how`: what the refusal of other
    training data asks (by default: the same dataset or task settings)."""
    saved = upgrade_saved_config(json.loads(state["config"]))
    changed = check_resume_config(saved, cfg.model_dump(mode="json"))
    lines = describe_changes(changed, state["step"], total)
    if state.get("data_sha") != data_sha:
        how = how or ("use the same dataset settings" if cfg.dataset is not None else "use the same task settings")
        raise RlooError(
            f"cannot resume: the training data differ from those this run was started with; {how}, "
            f"or {option('overwrite')} to start a new run"
        )
    check_inputs_unchanged(state.get("inputs"), inputs)
    check_optimizer_matches(state["optimizer"], list(params), ckpt)
    for line in lines:
        say(line)


@dataclass(frozen=True)
class Plan:
    """How a stage passes over its rows: `epochs` passes in batches of `batch_size`, at the schedule's
    base learning rate `lr`. SFT and the reward model read theirs from their config (`Plan.of`); DPO
    from its method's settings (dpo_epochs, dpo_batch_size, dpo_lr: rloo.training.dpo)."""

    epochs: int
    batch_size: int
    lr: float

    @classmethod
    def of(cls, cfg) -> Plan:
        return cls(cfg.epochs, cfg.batch_size, cfg.lr)


def steps_of(plan, n: int) -> int:
    """Steps of a whole stage on `n` rows: epochs x ceil(n / batch_size). `plan`: a Plan, or a config
    with those two fields (SFT's, the reward model's)."""
    return plan.epochs * -(-n // plan.batch_size)


def trainable(model) -> list[torch.nn.Parameter]:
    """The parameters the stage's optimizer holds, in its order (rloo.training.common.adamw)."""
    return [p for p in model.parameters() if p.requires_grad]


class StageRun:
    """A stage's loop state: its step, its position in the data (`plan`: its epochs and batch size;
    by default its config's), its checkpoints.

    The stage iterates `batches()`, makes its update and logs it, then calls `end_step`, which
    counts the step and writes the periodic checkpoint, or the one of a SIGINT/SIGTERM that
    arrived meanwhile (`stop`, entered by the stage) before raising Interrupted."""

    def __init__(
        self,
        name: str,
        cfg,
        out: Path,
        model,
        tokenizer,
        opt,
        sched,
        gen,
        guard,
        n: int,
        data_sha: str,
        plan: Plan | None = None,
    ):
        self.name, self.cfg, self.out, self.model, self.tokenizer = name, cfg, Path(out), model, tokenizer
        self.opt, self.sched, self.gen, self.guard, self.n, self.data_sha = opt, sched, gen, guard, n, data_sha
        self.plan: Plan = plan or Plan.of(cfg)
        self.inputs: dict = {}  # rloo.runtime.inputs.fingerprint of cfg's inputs, set by the stage
        self.extra: dict = {}  # the stage's own values saved with each checkpoint (plain types)
        self.step, self.epoch, self.done = 0, 0, 0
        self.order: torch.Tensor | None = None
        self.saved: tuple[int, Path] | None = None
        self.metrics_bytes = 0
        self.stop = StopFlag(f"stopping {name} after this step" + ("" if rerun_hint() else " and writing a checkpoint"))
        self.callbacks = Callbacks([], cfg, 0)  # the Python API's hooks (rloo.training.callbacks), set by the stage
        self.last: dict = {}  # the metrics logged at the current step, for on_step_end

    @property
    def total(self) -> int:
        return steps_of(self.plan, self.n)

    def start(self, ckpt: Path | None, state: dict | None, resume: bool) -> None:
        """Continue from checkpoint `ckpt` (`state`), or start at step 0, after the records of a
        stage killed before its first checkpoint when resuming."""
        if state is not None:
            self.restore(ckpt, state)
        elif resume:
            truncate_metrics(self.out, 0)

    def batches(self):
        """Row-index batches from the current position to the end of the last epoch; each epoch's
        order is torch.randperm(n) from the stage's generator, drawn when the epoch starts."""
        size = self.plan.batch_size
        while self.epoch < self.plan.epochs:
            if self.order is None:
                self.order = torch.randperm(self.n, generator=self.gen)
            while self.done * size < self.n:
                yield self.order[self.done * size : (self.done + 1) * size]
            self.epoch, self.done, self.order = self.epoch + 1, 0, None

    def end_step(self) -> None:
        """Count the step just made (its metrics logged); checkpoint it when a signal came or it is
        a `save_every` step."""
        self.done, self.step = self.done + 1, self.step + 1
        metrics = self.out / "metrics.jsonl"  # its length at this step boundary: a resume cuts it back to it
        self.metrics_bytes = metrics.stat().st_size if metrics.exists() else 0
        self.callbacks.fire("on_step_end", self.step, metrics=dict(self.last))
        if self.stop.signum is not None:
            raise self.interrupted()
        if self.callbacks.asked is not None:
            raise self.stopped()
        if self.cfg.save_every and self.step % self.cfg.save_every == 0:
            self.save()

    def stopped(self) -> StoppedByCallback:
        """The stop a callback asked for after step `self.step`: saved as an interrupt's (`interrupted`)."""
        asked = f"{self.callbacks.asked} asked to stop; {self.name} stopped at step {self.step}/{self.total}"
        if rerun_hint() is not None:
            return StoppedByCallback(f"{asked}; {how_to_continue(True)}")
        return StoppedByCallback(f"{asked} and saved {self.save()}; {how_to_continue(True)}")

    def interrupted(self) -> Interrupted:
        """The Interrupted of a signal after step `self.step`, its checkpoint written (none under a
        caller that reruns the stage from its start: rloo.errors.rerun_hint)."""
        assert self.stop.signum is not None
        saved = None if rerun_hint() is not None else self.save()
        return stage_interrupted(self.name, self.stop.signum, self.step, self.total, saved)

    def save(self) -> Path:
        """Write the checkpoint of the current step boundary (once per step)."""
        if self.saved is not None and self.saved[0] == self.step:
            return self.saved[1]
        state = {
            "epoch": self.epoch,
            "done": self.done,
            "order": self.order if self.order is not None else torch.zeros(0, dtype=torch.long),
            "rng": rng_state(self.gen),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "guard": self.guard.state_dict(),
            "extra": json.dumps(self.extra),
            "metrics_bytes": self.metrics_bytes,
            "data_sha": self.data_sha,
            "inputs": self.inputs,
            "config": json.dumps(self.cfg.model_dump(mode="json")),
            "threads": torch.get_num_threads(),  # a resume with another count is not bit for bit
        }
        path = save_checkpoint(self.out, self.step, self.model, self.tokenizer, state, keep=self.cfg.keep_checkpoints)
        self.saved = (self.step, path)
        self.callbacks.saved(self.step, path)
        return path

    def restore(self, ckpt, state: dict) -> None:
        """Load checkpoint `ckpt` (its `state` checked by check_stage_resume) into the live objects."""
        load_saved_weights(self.model, ckpt / "model")
        restore_optimizer(self.opt, self.sched, state, self.plan.lr)
        set_rng_state(state["rng"], self.gen)
        self.guard.load_state_dict(state["guard"])
        self.step, self.epoch, self.done = state["step"], state["epoch"], state["done"]
        self.order = state["order"] if len(state["order"]) else None
        self.extra = json.loads(state["extra"])
        self.metrics_bytes = state["metrics_bytes"]
        truncate_metrics(self.out, self.metrics_bytes)
        self.saved = (self.step, ckpt)
        say(f"resuming {self.name} from {ckpt} at step {self.step}")
        note = resume_threads(state.get("threads"))
        if note:
            say(note)

    def logger(self) -> MetricsLogger | LoggedWith:
        """metrics.jsonl (and the trackers); a resumed stage's trackers drop records past its step."""
        cfg = self.cfg
        purge = self.step + 1 if self.step else None
        log = MetricsLogger(self.out, purge_step=purge, report_to=cfg.report_to, config=cfg.model_dump(mode="json"))
        return LoggedWith(log, self) if self.callbacks else log


class LoggedWith:
    """A stage's metrics logger that also hands each record to the run's callbacks (on_log)."""

    def __init__(self, log: MetricsLogger, run: StageRun):
        self.inner, self.run = log, run

    def log(self, step: int, metrics: dict) -> None:
        self.inner.log(step, metrics)
        self.run.last = dict(metrics)
        self.run.callbacks.log(step, metrics)

    def close(self) -> None:
        self.inner.close()

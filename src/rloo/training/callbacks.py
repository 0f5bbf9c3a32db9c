"""`callbacks=[...]` of the Python API: the user's hooks into a stage's loop, duck-typed on
transformers' `TrainerCallback` so that a subclass of it works where the names match.

Each hook an object has is called as transformers calls it, `hook(args, state, control, **kwargs)`:

    on_log(args, state, control, logs=metrics)           each record written to metrics.jsonl
    on_evaluate(args, state, control, metrics=metrics)    each evaluation's record (RL)
    on_step_end(args, state, control, metrics=metrics)    after every optimizer step
    on_save(args, state, control, checkpoint=path)        after each checkpoint is written

`args` is the stage's rloo config; `state` a transformers `TrainerState` (global_step, max_steps,
log_history); `control` a `TrainerControl`; every call also passes `model=` and `processing_class=`
(the tokenizer). Hooks an object lacks are not called. A hook that sets
`control.should_training_stop` (or returns True, or returns a control that has it set) stops the
stage as Ctrl-C does: after the step, with a checkpoint, and one line (rloo.errors.StoppedByCallback).
Hooks run in the process that writes metrics (rank 0 under torchrun; its stop reaches every rank).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

HOOKS = ("on_log", "on_evaluate", "on_step_end", "on_save")


class Callbacks:
    """The hooks of `objs`, fired with a shared TrainerState / TrainerControl. `asked`: the first
    hook that asked to stop (`Class.hook`), or None."""

    def __init__(self, objs, cfg, max_steps: int, model=None, tokenizer=None, enabled: bool = True):
        self.given = bool(objs)  # on every rank: whether a stop must be agreed on (`asked_anywhere`)
        self.objs = list(objs or []) if enabled else []
        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer
        self.asked: str | None = None
        self.state = self.control = None
        if self.objs:
            from transformers.trainer_callback import TrainerControl, TrainerState  # lazily: heavy

            self.state, self.control = TrainerState(max_steps=max_steps), TrainerControl()

    def __bool__(self) -> bool:
        return bool(self.objs)

    def fire(self, hook: str, step: int, **kwargs: Any) -> None:
        """Call `hook` of every object that has it, at global step `step`."""
        if not self.objs:
            return
        assert self.state is not None and self.control is not None
        self.state.global_step = step
        if hook == "on_log":
            self.state.log_history.append({**kwargs["logs"], "step": step})
        for obj in self.objs:
            # getattr: a user's callback object: each TrainerCallback hook is optional
            fn = getattr(obj, hook, None)
            if not callable(fn):
                continue
            got = fn(self.cfg, self.state, self.control, model=self.model, processing_class=self.tokenizer, **kwargs)
            # getattr: what a user's hook returns: None, True, or a TrainerControl (transformers) or anything
            if self.asked is None and (got is True or getattr(got, "should_training_stop", False)):
                self.control.should_training_stop = True
            if self.asked is None and self.control.should_training_stop:
                self.asked = f"{type(obj).__name__}.{hook}"

    def log(self, step: int, metrics: dict) -> None:
        """A metrics record: on_log, and on_evaluate too when it holds evaluation results."""
        self.fire("on_log", step, logs=dict(metrics))
        if any(k.startswith("eval/") for k in metrics):
            self.fire("on_evaluate", step, metrics=dict(metrics))

    def saved(self, step: int, path: Path | None) -> None:
        if path is not None:
            self.fire("on_save", step, checkpoint=str(path))


def asked_anywhere(cbs: Callbacks, dist) -> bool:
    """Whether a hook asked to stop, on any rank: under torchrun rank 0's answer reaches every rank
    (an all-reduce each step, only when callbacks were given), so that all stop at the same step."""
    if not cbs.given:
        return False
    local = float(cbs.asked is not None)
    return (dist.mean_metrics({"callbacks/stop": local})["callbacks/stop"] if dist.enabled else local) > 0


def stop_line(asked: str, step: int, steps: int, saved: str) -> str:
    """`EarlyStop.on_step_end asked to stop; stopped at step 3/8 and saved runs/x/checkpoints/step-3; ...`."""
    return f"{asked} asked to stop; stopped at step {step}/{steps} {saved}"

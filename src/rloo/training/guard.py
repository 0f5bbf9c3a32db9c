"""The non-finite guard: a step whose loss or gradient is not finite is skipped by the algorithm
(`rloo.algorithms.guarded_step`, logged as guard/skipped), and an update that left bad weights is
undone (`check_update`, rloo.runtime.paramguard); here the skips are counted, and a streak of
`max_skipped_steps` stops the run with a checkpoint from before the streak."""

from __future__ import annotations

from rloo.algorithms.base import SKIPPED, guarded_step
from rloo.errors import NonFiniteError, option, rerun_hint
from rloo.runtime.checkpoint.save import Checkpointer
from rloo.runtime.paramguard import ParamGuard
from rloo.runtime.tracking.log import say


class NonFiniteGuard:
    """Keeps the skip counters in the checkpointer (`ck.counters`, `ck.streak_start`), so they
    are saved with every checkpoint and a resumed run continues a streak it was in."""

    def __init__(self, ck: Checkpointer, max_skipped_steps: int, param_guard: ParamGuard | None = None):
        self.ck, self.max_skipped_steps, self.param_guard = ck, max_skipped_steps, param_guard

    @property
    def in_streak(self) -> int:
        """Steps skipped in a row up to now (0: the last step updated)."""
        return self.ck.counters["skipped_in_row"]

    def after_step(self, skipped: bool, pre: dict, step: int, undone: bool = False) -> dict[str, float]:
        """Count step `step` (0-based; `pre`: the snapshot from before it). Raises NonFiniteError,
        after writing the checkpoint from before the streak, when the streak reaches the limit."""
        ck, c = self.ck, self.ck.counters
        if not skipped:
            c["updates"] += 1
            c["skipped_in_row"], ck.streak_start = 0, None
            return {"guard/skipped_total": float(c["skipped_total"])}
        if c["skipped_in_row"] == 0:
            ck.streak_start = {k: v for k, v in pre.items() if k != "streak_start"}
        c["skipped_in_row"] += 1
        c["skipped_total"] += 1
        why = (self.param_guard.reason if self.param_guard is not None else None) or "non-finite loss or gradient"
        say(
            f"step {step + 1}: {why}, update {'undone' if undone else 'skipped'} "
            f"({c['skipped_in_row']} in a row, {c['skipped_total']} in all)"
        )
        if c["skipped_in_row"] >= self.max_skipped_steps:
            first = ck.streak_start
            assert first is not None
            ck.drop_newer_than(first["step"])  # written mid-streak; resuming there would repeat the problem
            path = ck.save(first)
            what = (
                "a non-finite loss or gradient"
                if why == "non-finite loss or gradient"
                else f"a non-finite loss or gradient or bad parameters (last: {why})"
            )
            raise NonFiniteError(
                f"{c['skipped_in_row']} steps in a row (steps {first['step'] + 1}-{step + 1}) had "
                f"{what}; stopped. Checkpoint from before the problem: "
                f"{path}. Lower lr or max_grad_norm, or check the reward, then {_rerun()}"
            )
        return {"guard/skipped_total": float(c["skipped_total"])}


def _rerun() -> str:
    """How to continue after the fix: --resume, or the way of a caller that reruns the run from its
    start (`rloo compare`/`pipeline`: rloo.errors.rerun_continues)."""
    return rerun_hint() or f"rerun with {option('resume')}"


def check_update(guard: ParamGuard, dist, skipped: bool) -> dict:
    """Undo an update that left bad weights (rloo.runtime.paramguard); it then counts as a skipped
    step. `skipped`: the step made no update (nothing to check). Returns the metrics to log."""
    problem = None if skipped else guard.problem()
    bad = problem is not None
    if dist.enabled:  # every process takes part, and all undo together (FSDP checks its own shard)
        bad = dist.mean_metrics({"bad": float(bad)})["bad"] > 0
    guard.reason = "non-finite loss or gradient" if skipped else None
    if skipped:  # a method with several updates per step (ppo's minibatches, its value model) may have
        guard.undo()  # made some before the one skipped: taken back, so a skipped step changes nothing
        return {"guard/params_undone": 0.0}
    if not bad:
        return {"guard/params_undone": 0.0}
    guard.undo()
    guard.reason = problem or "bad parameters on another process"
    return {SKIPPED: 1.0, "guard/params_undone": 1.0}


class StageGuard:
    """The same guard for a supervised stage (SFT, reward model, DPO): `guarded_step` skips an
    update whose loss or gradient is not finite, `ParamGuard` undoes one that left non-finite or
    exploding weights or optimizer state. `max_skipped_steps` in a row stop the stage (no checkpoint
    of the streak is written: the stage's newest periodic one is from before it, or it is rerun); a
    stage in which no step updated saves no model (`finish`). Its counters and starting norm go into
    the stage's checkpoints (`state_dict`). Costs what RL's guard costs: 3x the trainable parameters' bytes."""

    def __init__(self, stage: str, params, opt, max_skipped_steps: int = 5, growth: float = 10.0):
        self.stage, self.max_skipped_steps, self.growth = stage, max_skipped_steps, growth
        self.params = [p for p in params if p.requires_grad]
        self.opt, self.params_guard = opt, ParamGuard(self.params, opt, growth)
        self.updates = self.in_row = self.total = 0

    def state_dict(self) -> dict:
        return {"updates": self.updates, "in_row": self.in_row, "total": self.total, "norm0": self.params_guard.norm0}

    def load_state_dict(self, state: dict) -> None:
        """Continue a resumed stage's counts, and its growth limit from the norm at its start."""
        self.updates, self.in_row, self.total = state["updates"], state["in_row"], state["total"]
        self.params_guard = ParamGuard(self.params, self.opt, self.growth, norm0=state["norm0"])

    def step(self, loss, step: int, max_grad_norm: float = 1.0) -> tuple[float, bool]:
        """One guarded update for step `step` (1-based): (gradient norm, updated)."""
        self.params_guard.before_step()
        norm, stepped = guarded_step(loss, self.params, self.opt, max_grad_norm)
        problem = None if stepped else "non-finite loss or gradient"
        if stepped and (problem := self.params_guard.problem()) is not None:
            self.params_guard.undo()
        if problem is None:
            self.updates, self.in_row = self.updates + 1, 0
            return norm, True
        self.in_row, self.total = self.in_row + 1, self.total + 1
        say(f"{self.stage} step {step}: {problem}, update skipped ({self.in_row} in a row, {self.total} in all)")
        if self.in_row >= self.max_skipped_steps:
            raise NonFiniteError(
                f"{self.stage}: {self.in_row} steps in a row (steps {step - self.in_row + 1}-{step}) had {problem}; "
                f"stopped, no model was saved. Lower lr or weight_decay, or check the data"
            )
        return norm, False

    def finish(self) -> None:
        """Refuse to save a model no step updated."""
        if self.updates == 0:
            raise NonFiniteError(
                f"{self.stage}: every step was skipped ({self.total}: non-finite loss, gradient or "
                f"parameters); no model was saved. Lower lr or weight_decay, or check the data"
            )


class VanishingWeights:
    """Says once, in one line, when an importance-weighted update has had almost no weight for
    `patience` steps in a row (is/weight_mean < `floor`): the policy has moved so far from the
    weights that sampled that every sample's weight is ~0, and with them the whole update, eq. A1's KL
    penalty included, so nothing pulls the policy back (measured at lr 1e-3, N = 16: every corrected
    run collapsed; docs/async.md). The run goes on: the weights may recover as the sampler catches up."""

    def __init__(self, floor: float = 0.05, patience: int = 5):
        self.floor, self.patience, self.in_row, self.said = floor, patience, 0, False

    def after_step(self, stats: dict, step: int) -> None:
        w = stats.get("is/weight_mean")
        if w is None:
            return
        self.in_row = self.in_row + 1 if float(w) < self.floor else 0
        if self.in_row >= self.patience and not self.said:
            self.said = True
            say(
                f"warning: step {step}: the importance weights have been ~0 for {self.in_row} steps "
                f"(is/weight_mean {float(w):.3g} < {self.floor}): the policy has moved away from the weights that "
                "sample, so its update and the KL penalty are ~0 and it can drift (docs/async.md); lower lr or "
                "max_staleness, or use is_correction=tis_token or none"
            )

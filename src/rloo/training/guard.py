"""The non-finite guard: a step whose loss or gradient is not finite is skipped by the algorithm
(`rloo.algorithms.guarded_step`, logged as guard/skipped), and an update that left bad weights is
undone (`check_update`, rloo.runtime.paramguard); here the skips are counted, and a streak of
`max_skipped_steps` stops the run with a checkpoint from before the streak."""

from __future__ import annotations

from rloo.algorithms.base import SKIPPED
from rloo.errors import NonFiniteError, option
from rloo.runtime.checkpoint import Checkpointer
from rloo.runtime.paramguard import ParamGuard
from rloo.runtime.tracking import say


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
        why = getattr(self.param_guard, "reason", None) or "non-finite loss or gradient"
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
                f"{path}. Lower lr or max_grad_norm, or check the reward, then rerun with {option('resume')}"
            )
        return {"guard/skipped_total": float(c["skipped_total"])}


def check_update(guard: ParamGuard, dist, skipped: bool) -> dict:
    """Undo an update that left bad weights (rloo.runtime.paramguard); it then counts as a skipped
    step. `skipped`: the step made no update (nothing to check). Returns the metrics to log."""
    problem = None if skipped else guard.problem()
    bad = problem is not None
    if dist.enabled:  # every process takes part, and all undo together (FSDP checks its own shard)
        bad = dist.mean_metrics({"bad": float(bad)})["bad"] > 0
    guard.reason = "non-finite loss or gradient" if skipped else None
    if not bad or skipped:
        return {"guard/params_undone": 0.0}
    guard.undo()
    guard.reason = problem or "bad parameters on another process"
    return {SKIPPED: 1.0, "guard/params_undone": 1.0}

"""What a resume may change, and how it is told: the prompt list must be the same; `steps` may grow."""

from __future__ import annotations

from rloo.checkpoint import prompts_digest
from rloo.errors import RlooError

# Changing these on resume leaves the continuation exact: they decide how long the run goes and
# what it writes on the side, not what a step computes.
EXACT_KEYS = ("steps", "save_every", "keep_checkpoints", "log_every", "sample_every", "eval_every",
              "eval_prompts", "max_skipped_steps", "max_param_growth", "device")


def check_prompts_unchanged(state: dict, prompts: list[str], from_api: bool) -> None:
    if state.get("prompts_sha") in (None, prompts_digest(prompts)):
        return
    how = "pass the same prompts" if from_api else "use the same dataset settings"
    raise RlooError(f"cannot resume: the training prompts differ from the ones this run was started with "
                    f"({len(prompts)} prompts now); {how}, or --overwrite to start a new run")


def describe_changes(changed: list[str], at_step: int, steps: int) -> list[str]:
    """Lines telling the user what a resume with changed settings does; refuses `steps` below the
    checkpoint's step. `changed`: 'key: old -> new' from rloo.checkpoint.check_resume_config."""
    if steps < at_step:
        raise RlooError(f"cannot resume: the newest checkpoint is at step {at_step}, past steps={steps}; "
                        f"pass steps >= {at_step}")
    exact = [c for c in changed if c.split(":")[0] in EXACT_KEYS]
    other = [c for c in changed if c not in exact]
    lines = []
    if exact:
        lines.append("resuming with changed settings (still an exact continuation): " + "; ".join(exact))
    if other:
        lines.append("resuming with changed settings (not an exact continuation): " + "; ".join(other))
    return lines

"""What a resume may change, and how it is told: the prompt list must be the same; `steps` may grow."""

from __future__ import annotations

import hashlib

from rloo.errors import RlooError, option

# Settings a resumed run must share with the run it continues: changing them would make the
# checkpoint's weights, optimizer state or data position mean something else.
RESUME_FIXED = (
    "policy",
    "task",
    "seed",
    "algorithm",
    "k",
    "batch_size",
    "reward_model",
    "reward_fn",
    "algorithm_settings.dpo_batch_size",  # DPO's batch size: its data position counts batches of it
)

# Changing these on resume leaves the continuation exact: they decide how long the run goes and
# what it writes on the side, not what a step computes.
EXACT_KEYS = (
    "steps",
    "save_every",
    "keep_checkpoints",
    "log_every",
    "sample_every",
    "eval_every",
    "eval_prompts",
    "max_skipped_steps",
    "max_param_growth",
    "device",
    "producer_connect_timeout_s",
    "max_cut_share",  # read before the first step, to refuse or not; absent from older checkpoints' configs
)


def check_prompts_unchanged(state: dict, prompts: list[str], from_api: bool) -> None:
    if state.get("prompts_sha") in (None, prompts_digest(prompts)):
        return
    how = "pass the same prompts" if from_api else "use the same dataset settings"
    raise RlooError(
        f"cannot resume: the training prompts differ from the ones this run was started with "
        f"({len(prompts)} prompts now); {how}, or {option('overwrite')} to start a new run"
    )


def describe_changes(changed: list[str], at_step: int, steps: int, exact: bool = True) -> list[str]:
    """Lines telling the user what a resume with changed settings does; refuses `steps` below the
    checkpoint's step. `changed`: 'key: old -> new' from check_resume_config; `exact=False`: the
    continuation is not exact whatever changed (an asynchronous checkpoint without its older versions)."""
    if steps < at_step:
        raise RlooError(
            f"cannot resume: the newest checkpoint is at step {at_step}, past steps={steps}; pass steps >= {at_step}"
        )
    same = [c for c in changed if c.split(":")[0] in EXACT_KEYS and exact]
    other = [c for c in changed if c not in same]
    lines = []
    if same:
        lines.append("resuming with changed settings (still an exact continuation): " + "; ".join(same))
    if other:
        lines.append("resuming with changed settings (not an exact continuation): " + "; ".join(other))
    return lines


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_resume_config(saved: dict, current: dict) -> list[str]:
    """Refuse to continue a run under settings that change what its state means; return the
    other changed settings (e.g. a lower lr after the non-finite guard stopped the run)."""
    a, b = _flat(saved), _flat(current)
    fixed = [k for k in RESUME_FIXED if k in a and a.get(k) != b.get(k)]
    if fixed:
        diff = ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in fixed)
        raise RlooError(
            f"cannot resume with different {', '.join(fixed)} ({diff}); use the run's original "
            f"settings, or pass {option('overwrite')} to start a new run"
        )
    return [
        f"{k}: {a.get(k)!r} -> {b.get(k)!r}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k) and k != "output_dir"
    ]


def prompts_digest(prompts: list[str]) -> str:
    h = hashlib.sha256()
    for p in prompts:
        h.update(p.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


def check_optimizer_matches(optimizer_state: dict, params, ckpt) -> None:
    """The checkpoint's AdamW moments fit the model it holds, parameter by parameter: a model
    swapped for another architecture (with a rewritten manifest) is refused here, in one line,
    rather than inside AdamW's first step. `params`: the trainable parameters, in the optimizer's order."""
    shapes = [tuple(p.shape) for p in params]
    saved = optimizer_state.get("state", {})
    order = [i for g in optimizer_state.get("param_groups", []) for i in g.get("params", [])]
    if len(order) != len(shapes):
        raise RlooError(
            f"cannot resume from {ckpt}: its model has {len(shapes)} trainable tensors but its optimizer state "
            f"was saved for {len(order)}; the checkpoint's model is not the one it was trained with"
        )
    for n, (i, shape) in enumerate(zip(order, shapes, strict=True)):
        moment = saved.get(i, {}).get("exp_avg")
        if moment is not None and tuple(moment.shape) != shape:
            raise RlooError(
                f"cannot resume from {ckpt}: trainable tensor {n} of its model has shape {list(shape)} but "
                f"its optimizer state has {list(moment.shape)}; the checkpoint's model is not the one it was "
                "trained with"
            )

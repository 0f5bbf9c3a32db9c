"""Pieces every stage shares: seeding, the output folder, the optimizer."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import yaml

from rloo.algorithms.base import Accumulated
from rloo.config import EvalConfig, RLConfig, upgrade_saved_config
from rloo.core.accumulation import micro_batches, micro_shares
from rloo.data.chat_turns import chat_frame, end_ids
from rloo.envs import EnvSpec
from rloo.envs.factory import env_factory
from rloo.errors import RlooError, option
from rloo.runtime.checkpoint.resumecheck import check_resume_config
from rloo.runtime.inputs.fingerprint import refuse_inputs_inside
from rloo.runtime.precision import recorded_precision, refresh_casts_after_step
from rloo.runtime.runfolder.atomic import atomic_write_text
from rloo.runtime.runfolder.confine import make_folder
from rloo.runtime.runfolder.layout import (
    empty_run_folder,
    is_bookkeeping_only,
    kind_of,
    refuse_linked_folders,
    run_kind,
    write_marker,
)
from rloo.runtime.runfolder.lock import LOCK_NAME, lock_now
from rloo.runtime.runfolder.reading import read_text
from rloo.runtime.tracking.log import say


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a torch generator for sampling."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def prepare_output_dir(cfg, resume: bool = False, overwrite: bool = False, can_resume: bool = False) -> Path:
    """Create the run folder and record the config in it (atomically).

    A folder that already holds a run is refused unless `overwrite` (start over: the old run is
    deleted) or `resume` (continue it) is given, so one run never silently overwrites or mixes
    into another. `overwrite` deletes only through rloo.runtime.runfolder.layout.empty_run_folder: a
    folder that is not an rloo run of this kind, or that holds anything rloo did not write, is
    never deleted.
    """
    out = Path(cfg.output_dir)
    kind = run_kind(cfg)
    current = cfg.model_dump(mode="json")
    refuse_a_file(out)
    # A folder another run is writing is reported as busy (by the lock), not judged by its
    # half-written contents; the contents are judged again once this process holds the lock.
    if not (out / LOCK_NAME).exists():
        _refuse_foreign(out, _held_run(out, current, kind), kind)
    make_folder(out)
    lock_now(out)
    held = _held_run(out, current, kind)
    _refuse_foreign(out, held, kind)
    if isinstance(held, dict) and resume:  # a held run of this kind ("foreign" was refused above)
        check_resume_config(held, current)
    elif held is not None and overwrite:
        refuse_inputs_inside(cfg, out)
        empty_run_folder(out, kind)
    elif isinstance(held, dict):
        same = {k: v for k, v in held.items() if k != "output_dir"} == {
            k: v for k, v in current.items() if k != "output_dir"
        }
        what = "this run" if same else "a different run"
        # named as the caller spells them: --resume on the command line, resume=True in Python
        how = (
            f"pass {option('resume')} to continue it or {option('overwrite')} to replace it"
            if can_resume
            else f"pass {option('overwrite')} to replace it"
        )
        raise RlooError(f"{out} already holds {what}; {how}, or choose another output_dir")
    refuse_linked_folders(out, kind)  # after an overwrite: none are left (it unlinks them)
    write_marker(out, kind)
    atomic_write_text(out / "config.yaml", precision_comment() + yaml.safe_dump(current, sort_keys=False))
    return out


def precision_comment() -> str:
    """The first line of a stage's config.yaml: what its `dtype` computed in on this machine, and why
    (rloo.runtime.precision.recorded_precision); a comment, so the file still loads as the settings."""
    chosen = recorded_precision()
    if chosen is None:
        return ""
    return f"# precision: {chosen['dtype']} ({chosen['reason']}); how dtype ran on this machine, not a setting\n"


def prepare_plain_folder(out: Path, kind: str, overwrite: bool) -> Path:
    """The output folder of a command without a config.yaml of its own (`rloo bench`): created and
    locked; emptied with `overwrite` (rloo.runtime.runfolder.layout), refused when it holds anything else."""
    refuse_a_file(out)
    make_folder(out)
    lock_now(out)
    if overwrite:
        empty_run_folder(out, kind)
    elif kind_of(out) != kind and not is_bookkeeping_only(out):
        _refuse_foreign(out, "foreign", kind)
    refuse_linked_folders(out, kind)
    write_marker(out, kind)
    return out


def refuse_a_file(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise RlooError(f"output_dir {out} is a file, not a folder; choose another output_dir (nothing was changed)")


def _refuse_foreign(out: Path, held, kind: str) -> None:
    if held == "foreign":
        raise RlooError(
            f"{out} is not empty and does not hold an rloo {kind} run; choose another output_dir (nothing was deleted)"
        )


def _held_run(out: Path, current: dict, kind: str) -> dict | Literal["foreign"] | None:
    """None (missing folder, or only a lock and marker), the saved config of an rloo run of this
    kind ({} when a run of it was killed before writing its config), or "foreign"."""
    if not out.is_dir() or is_bookkeeping_only(out):
        return None
    if kind_of(out) != kind:
        return "foreign"
    try:
        held = yaml.safe_load(read_text(out / "config.yaml"))  # a FIFO there: refused, not waited on
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        held = None
    # a run written before a section was renamed is still ours
    return upgrade_saved_config(held) if isinstance(held, dict) else {}


def adamw(params, lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters; its state has their (fp32 master) dtype. Each step
    drops autocast's bf16 copies of the weights, which the step makes stale."""
    return refresh_casts_after_step(
        torch.optim.AdamW([p for p in params if p.requires_grad], lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95))
    )


def supervised_step(guard, opt, sched, loss, step: int, max_grad_norm: float = 1.0) -> float:
    """One update of a supervised stage (SFT, reward model) through its StageGuard (training/guard.py):
    backward, clip, step unless non-finite (or undone), schedule. Returns the learning rate this
    update used (after it, `sched` holds the next step's)."""
    lr = opt.param_groups[0]["lr"]
    guard.step(loss, step, max_grad_norm)
    sched.step()
    return lr


def batch_loss(idx: torch.Tensor, size: int | None, loss_of, mask: torch.Tensor | None = None):
    """The loss of batch `idx` (row indices) for a guarded step, with its stats: loss_of(idx) ->
    (loss, stats) in one pass, or (micro_batch_size `size` splitting it) an `Accumulated` of
    micro-batches weighted by their rows, or by their real tokens in `mask` (indexed by row; for
    token-mean losses), whose stats the step fills (`after_step`)."""
    parts = micro_batches(idx, size)
    if len(parts) == 1:
        return loss_of(idx)
    return Accumulated(parts, micro_shares(parts, mask), loss_of), {}


def after_step(loss, stats: dict) -> tuple[float, dict[str, float]]:
    """(the batch's loss, its stats as floats) once the step ran: an Accumulated's own."""
    if isinstance(loss, Accumulated):
        loss, stats = loss.loss, loss.stats
    return float(loss.detach()), {k: float(v) for k, v in stats.items()}


def warmup_cosine(opt, total: int, warmup: int, floor: float = 0.1):
    """Linear warm-up then cosine decay to `floor` x the peak learning rate."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, total - warmup)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    return torch.optim.lr_scheduler.LambdaLR(opt, f)


def warmup_constant(opt, warmup: int):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, warmup)))


def check_device(device: str) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RlooError(f"device {device!r} asked for but CUDA is not available; use device=cpu")
    return dev


def note_builtin_task(cfg, tokenizer, task, model: str) -> None:
    """One line when a model of one's own trains on the built-in task's data because no dataset.path
    was given: its tokenizer lacks the task's words (the task's own word tokenizer has all of them)."""
    vocab = tokenizer.get_vocab()
    if cfg.dataset is None and not all(w in vocab for w in task.words()):
        say(
            f"note: no dataset.path, so {model} trains on the built-in task {cfg.task!r}'s synthetic "
            f"prompts (words its tokenizer does not have); set dataset.path=FILE for your own data"
        )


def env_spec(cfg: RLConfig | EvalConfig, tokenizer) -> EnvSpec:
    """The episodes `cfg.env` asks for (training's or `rloo eval`'s): its environment factory,
    cfg.env_settings' limits and the tokenizer's chat template around the turns (when it has one and
    env_settings.chat_template)."""
    assert cfg.env is not None
    s = cfg.env_settings
    chat = chat_frame(tokenizer, s.observation_role) if s.chat_template else None
    factory = env_factory(cfg.env, tokenizer, s.tool_timeout_s, end_ids(tokenizer, chat))
    limits = (s.max_turns, s.max_turn_tokens, s.max_total_tokens, s.step_timeout_s)
    return EnvSpec(factory, *limits, chat=chat, prefill_observations=s.prefill_observations)

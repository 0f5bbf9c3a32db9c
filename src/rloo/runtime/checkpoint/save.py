"""Checkpoints that hold everything a run needs to continue exactly where it stopped.

Layout: `<run>/checkpoints/step-000120/` with
  model/      weights (safetensors), model config and tokenizer
  state.pt    optimizer, scheduler, RNG states (Python, NumPy, torch, the sampler's generator),
              data-stream position, running counters, metrics-file offset, step and config;
              loaded with torch.load(weights_only=True), so no arbitrary pickle is ever executed
  ring/       rl.max_staleness = N > 0 only: version-000117.safetensors .. the older policy versions
              the next N batches are sampled with (rloo.runtime.link.weights.WeightRing.older_versions)
  COMPLETE    written last: JSON {"step", "files": {path: [size, sha256]}}
A checkpoint is written into `.tmp-step-*` and renamed into place, so a crash or `kill -9` while
writing leaves the previous checkpoints untouched. On resume a folder without COMPLETE, or whose
files do not match its manifest (truncated, corrupted), is reported and skipped: that check, and
the listing, loading and pruning of checkpoints, are in rloo.runtime.checkpoint.verify.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from rloo.errors import RlooError, option
from rloo.runtime.checkpoint.resumecheck import prompts_digest
from rloo.runtime.checkpoint.ringcheck import ring_metadata
from rloo.runtime.checkpoint.rng import rng_state, set_rng_state
from rloo.runtime.checkpoint.verify import (
    MARKER,
    RING,
    list_checkpoints,
    mark_verified,
    prune_checkpoints,
    ring_file,
    step_of,
)
from rloo.runtime.link.weights import WeightRing
from rloo.runtime.runfolder.atomic import (
    WriteError,
    describe_write_failure,
    fsync_dir,
    modes_as_umask_allows,
    remove_tree,
    sync_and_hash,
    truncate_file,
)
from rloo.runtime.runfolder.confine import make_folder
from rloo.runtime.tracking.log import say_once

# ---- writing ---------------------------------------------------------------------------------


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict, keep: int = 2, ring=None) -> Path:
    """Write checkpoint `step` atomically and keep only the newest `keep` (never the one just written).
    `ring`: {version: tensors} of an asynchronous run's older weight versions, written under ring/."""
    root = make_folder(Path(run_dir) / "checkpoints")  # never a link out of the run (confine)
    for stale in root.glob(".tmp-step-*"):  # left by a run killed while writing
        remove_tree(stale)
    final, tmp = root / f"step-{step:06d}", root / f".tmp-step-{step:06d}"
    try:
        tmp.mkdir()
        write_model(model, tokenizer, tmp / "model")
        write_state({**state, "step": step}, tmp / "state.pt")
        write_ring(ring or {}, tmp / RING, ring_metadata(model))
        modes_as_umask_allows(tmp)  # safetensors writes 0o600
        manifest = sync_and_hash(tmp)
        with open(tmp / MARKER, "x") as fh:  # "x": a fresh file, never through a link
            fh.write(json.dumps({"step": step, "files": manifest}))
            fh.flush()
            os.fsync(fh.fileno())
    except Exception as e:  # noqa: BLE001 - whatever failed, the half-written folder must go
        why = describe_write_failure(e, root)
        remove_tree(tmp)
        prev = list_checkpoints(run_dir)
        raise WriteError(
            f"could not write checkpoint {final}: {why}. Nothing was overwritten: "
            f"{'the previous checkpoint ' + str(prev[-1]) + ' is intact' if prev else 'there is no earlier checkpoint'}"
        ) from e
    _replace_dir(tmp, final)
    fsync_dir(root)
    mark_verified(final)
    prune_checkpoints(run_dir, keep, final)
    return final


def write_model(model, tokenizer, path: Path) -> None:
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def write_state(state: dict, path: Path) -> None:
    torch.save(state, path)


def write_ring(versions: dict[int, dict[str, torch.Tensor]], folder: Path, metadata: dict | None = None) -> None:
    """One safetensors file per weight version (`ring_file`) with `metadata` (the policy's
    configuration, rloo.runtime.checkpoint.ringcheck); nothing for a synchronous run."""
    for v, tensors in versions.items():
        folder.mkdir(exist_ok=True)
        save_file({n: t.contiguous() for n, t in tensors.items()}, str(ring_file(folder, v)), metadata=metadata)


def _replace_dir(src: Path, dst: Path) -> None:
    # os.replace cannot swap a folder over a non-empty one; move the old one aside first, so at
    # every moment either the old or the new complete folder is in place.
    trash = dst.with_name(f".old-{dst.name}")
    if dst.exists():
        remove_tree(trash)
        os.replace(dst, trash)
    os.replace(src, dst)
    remove_tree(trash)


def restore_optimizer(opt, sched, state: dict, lr: float) -> None:
    """Load a checkpoint's optimizer and LambdaLR schedule into `opt` and `sched`. lr may have been
    changed on resume (e.g. lowered after the non-finite guard): the schedule's base comes from the
    config (`lr`), its progress from the checkpoint."""
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    sched.base_lrs = [lr for _ in sched.base_lrs]
    for group, base, f in zip(opt.param_groups, sched.base_lrs, sched.lr_lambdas, strict=False):
        group["lr"] = base * f(sched.last_epoch)
    sched._last_lr = [g["lr"] for g in opt.param_groups]


# ---- the online loop's state -----------------------------------------------------------------


def truncate_metrics(run_dir: Path, nbytes: int) -> None:
    """Drop metric records written after the checkpoint, so a resumed run does not log a step twice."""
    truncate_file(Path(run_dir) / "metrics.jsonl", nbytes)


def snapshot(step: int, counters: dict, gen: torch.Generator, sched, stream, metrics_path: Path) -> dict:
    """The loop's small state at a step boundary (everything except weights and optimizer)."""
    return {
        "step": step,
        "counters": dict(counters),
        "rng": copy.deepcopy(rng_state(gen)),
        "scheduler": copy.deepcopy(sched.state_dict()),
        "stream": list(stream.position()),
        "metrics_bytes": metrics_path.stat().st_size if metrics_path.exists() else 0,
    }


class Checkpointer:
    """Saves and restores the online loop's whole state: weights, optimizer, scheduler, RNG,
    data position, counters, metrics offset.

    `snapshot(step)` captures the small parts at a step boundary; `save(snap)` writes them with
    the current weights and optimizer state. Weights and optimizer only change in a step that
    updates, so a snapshot taken before a failed or skipped step still describes them exactly:
    this is how a checkpoint "from before the problem" is written after the problem.
    """

    def __init__(
        self,
        out: Path,
        cfg,
        policy,
        tokenizer,
        opt,
        sched,
        gen,
        stream,
        prompts: list[str],
        algo=None,
        writes: bool = True,
        skip_note: str | None = None,
        guard=None,
        inputs: dict | None = None,
        prompt_steps: int | None = None,
    ):
        self.out, self.cfg, self.policy, self.tokenizer = Path(out), cfg, policy, tokenizer
        # who writes is decided by the caller (under torchrun: rank 0 only; none under FSDP, with
        # `skip_note` said once); a process that does not write returns None from save()
        self.writes, self.skip_note = writes, skip_note
        # the algorithm's own state (moving-average baseline, value model + optimizer); it is taken
        # at save time: it changes only inside a step, together with the policy's weights
        self.algo = algo
        self.opt, self.sched, self.gen, self.stream = opt, sched, gen, stream
        self.prompts_sha = prompts_digest(prompts)
        self.counters = {
            "updates": 0,
            "skipped_in_row": 0,
            "skipped_total": 0,
            "prompts_truncated": 0,
            "scored_steps": 0,
        }
        self.streak_start: dict | None = None  # snapshot before the first step of a non-finite streak
        self.inputs: dict = inputs or {}  # content fingerprints of the run's inputs (rloo.runtime.inputs.fingerprint)
        self.prompt_steps = prompt_steps  # `steps` the built-in task's prompt list was made for
        self.guard = guard  # rloo.runtime.paramguard.ParamGuard: its starting norm is saved
        self.ring: WeightRing | None = None  # an asynchronous run's ring: its older versions are saved

    def snapshot(self, step: int) -> dict:
        snap = snapshot(step, self.counters, self.gen, self.sched, self.stream, self.out / "metrics.jsonl")
        return snap | {"streak_start": self.streak_start}

    def save(self, snap: dict) -> Path | None:
        if not self.writes:
            if self.skip_note:
                say_once(self.skip_note)
            return None
        if snap["counters"]["updates"] != self.counters["updates"]:
            raise AssertionError("the weights changed since this snapshot; it cannot be saved with them")
        older = self.ring.older_versions(snap["step"], self.policy) if self.ring is not None else None
        state = snap | {
            "ring_versions": sorted(older) if older is not None else None,  # what ring/ holds (ringcheck)
            "optimizer": self.opt.state_dict(),
            "prompts_sha": self.prompts_sha,
            "inputs": self.inputs,
            "prompt_steps": self.prompt_steps,
            "guard": self.guard.state_dict() if self.guard is not None else {},
            "algorithm": self.algo.state_dict() if self.algo is not None else {},
            "config": json.dumps(self.cfg.model_dump(mode="json")),
            "threads": torch.get_num_threads(),  # a resume with another count is not bit for bit
        }
        return save_checkpoint(
            self.out, snap["step"], self.policy, self.tokenizer, state, keep=self.cfg.keep_checkpoints, ring=older
        )

    def drop_newer_than(self, step: int) -> None:
        for ckpt in list_checkpoints(self.out):
            if step_of(ckpt) > step:
                remove_tree(ckpt)

    def restore(self, state: dict) -> int:
        """Load `state` into the live objects; returns the step to continue from."""
        if state.get("prompts_sha") != self.prompts_sha:
            raise RlooError(
                "cannot resume: the training prompts differ from the ones this run was started "
                f"with; pass the same prompts, or {option('overwrite')} to start a new run"
            )
        restore_optimizer(self.opt, self.sched, state, self.cfg.lr)
        set_rng_state(state["rng"], self.gen)
        if self.algo is not None:
            self.algo.load_state_dict(state.get("algorithm", {}))
        self.stream.seek(*state["stream"])
        # scored_steps (steps with a scored completion) is newer than some checkpoints: their updates had scores
        self.counters = {"scored_steps": state["counters"]["updates"]} | dict(state["counters"])
        self.streak_start = state.get("streak_start")
        truncate_metrics(self.out, state["metrics_bytes"])
        return state["step"]

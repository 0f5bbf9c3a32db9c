"""Checkpoints that hold everything a run needs to continue exactly where it stopped.

Layout: `<run>/checkpoints/step-000120/` with
  model/      weights (safetensors), model config and tokenizer
  state.pt    optimizer, scheduler, RNG states (Python, NumPy, torch, the sampler's generator),
              data-stream position, running counters, metrics-file offset, step and config;
              loaded with torch.load(weights_only=True), so no arbitrary pickle is ever executed
  COMPLETE    written last: JSON {"step", "files": {path: [size, sha256]}}
A checkpoint is written into `.tmp-step-*` and renamed into place, so a crash or `kill -9` while
writing leaves the previous checkpoints untouched. On resume a folder without COMPLETE, or whose
files do not match its manifest (truncated, corrupted), is reported and skipped.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np
import torch

from rloo.errors import RlooError, option
from rloo.runtime.atomic import (
    WriteError,
    check_manifest,
    describe_write_failure,
    fsync_dir,
    remove_tree,
    sync_and_hash,
)
from rloo.runtime.tracking import say, say_once

MARKER = "COMPLETE"

# Settings a resumed run must share with the run it continues: changing them would make the
# checkpoint's weights, optimizer state or data position mean something else.
RESUME_FIXED = ("policy", "task", "seed", "algorithm", "k", "batch_size", "reward_model", "reward_fn")


# ---- RNG state -------------------------------------------------------------------------------


def rng_state(generator: torch.Generator) -> dict:
    """Every random stream the loop draws from, as tensors and plain numbers (weights_only-safe)."""
    np_state = np.random.get_state()
    return {
        "python": list(_tuple_to_list(random.getstate())),
        "numpy": {
            "key": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
        "sampler": generator.get_state(),
    }


def _tuple_to_list(x):
    return [_tuple_to_list(v) for v in x] if isinstance(x, (tuple, list)) else x


def _list_to_tuple(x):
    return tuple(_list_to_tuple(v) for v in x) if isinstance(x, list) else x


def set_rng_state(state: dict, generator: torch.Generator) -> None:
    random.setstate(_list_to_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    generator.set_state(state["sampler"])


# ---- writing ---------------------------------------------------------------------------------


def step_of(ckpt: Path) -> int:
    return int(Path(ckpt).name.split("-")[-1])


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict, keep: int = 2) -> Path:
    """Write checkpoint `step` atomically and keep only the newest `keep` (never the one just written)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-step-*"):  # left by a run killed while writing
        remove_tree(stale)
    final, tmp = root / f"step-{step:06d}", root / f".tmp-step-{step:06d}"
    try:
        tmp.mkdir()
        write_model(model, tokenizer, tmp / "model")
        write_state({**state, "step": step}, tmp / "state.pt")
        manifest = sync_and_hash(tmp)
        with open(tmp / MARKER, "w") as fh:
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
    for old in list_checkpoints(run_dir)[:-keep]:
        if old != final:
            remove_tree(old)
    return final


def write_model(model, tokenizer, path: Path) -> None:
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def write_state(state: dict, path: Path) -> None:
    torch.save(state, path)


def _replace_dir(src: Path, dst: Path) -> None:
    # os.replace cannot swap a folder over a non-empty one; move the old one aside first, so at
    # every moment either the old or the new complete folder is in place.
    trash = dst.with_name(f".old-{dst.name}")
    if dst.exists():
        remove_tree(trash)
        os.replace(dst, trash)
    os.replace(src, dst)
    remove_tree(trash)


# ---- reading ---------------------------------------------------------------------------------


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint folders that were finished (COMPLETE written), oldest first; not yet verified."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    return sorted(p for p in root.glob("step-*") if (p / MARKER).exists())


def verify_checkpoint(ckpt: Path) -> str | None:
    """None when `ckpt` is whole, else why it is not."""
    try:
        marker = json.loads((Path(ckpt) / MARKER).read_text())
        files = marker["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its {MARKER} marker is unreadable ({type(e).__name__})"
    if "state.pt" not in files or not any(f.endswith(".safetensors") for f in files):
        return "its manifest lists no state.pt or no safetensors weights"
    return check_manifest(ckpt, files)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint that is whole and whose state loads; broken ones are reported and skipped."""
    root = Path(run_dir) / "checkpoints"
    if root.exists():
        for partial in sorted(p for p in root.iterdir() if p.name.startswith(".tmp-step-")):
            say(f"skipping unfinished checkpoint {partial} (the run stopped while writing it)")
    for ckpt in reversed(list_checkpoints(run_dir)):
        problem = verify_checkpoint(ckpt)
        if problem is None:
            try:
                load_state(ckpt)
                return ckpt
            except Exception as e:  # noqa: BLE001 - a state file that does not load means: skip it
                problem = f"state.pt does not load ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        say(f"skipping broken checkpoint {ckpt}: {problem}")
    return None


def load_state(ckpt: Path) -> dict:
    # weights_only: tensors, numbers, strings and containers only; a pickled object is refused.
    return torch.load(Path(ckpt) / "state.pt", weights_only=True)


# ---- resume checks ---------------------------------------------------------------------------


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


def truncate_metrics(run_dir: Path, nbytes: int) -> None:
    """Drop metric records written after the checkpoint, so a resumed run does not log a step twice."""
    path = Path(run_dir) / "metrics.jsonl"
    if path.exists() and path.stat().st_size > nbytes:
        os.truncate(path, nbytes)


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


# ---- the online loop's state -----------------------------------------------------------------


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
        self.counters = {"updates": 0, "skipped_in_row": 0, "skipped_total": 0, "prompts_truncated": 0}
        self.streak_start: dict | None = None  # snapshot before the first step of a non-finite streak

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
        state = snap | {
            "optimizer": self.opt.state_dict(),
            "prompts_sha": self.prompts_sha,
            "algorithm": self.algo.state_dict() if self.algo is not None else {},
            "config": json.dumps(self.cfg.model_dump(mode="json")),
        }
        return save_checkpoint(
            self.out, snap["step"], self.policy, self.tokenizer, state, keep=self.cfg.keep_checkpoints
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
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        # lr may have been changed on resume (e.g. lowered after the non-finite guard): the
        # scheduler's base comes from the config, its progress from the checkpoint.
        self.sched.base_lrs = [self.cfg.lr for _ in self.sched.base_lrs]
        for group, base, f in zip(self.opt.param_groups, self.sched.base_lrs, self.sched.lr_lambdas, strict=False):
            group["lr"] = base * f(self.sched.last_epoch)
        self.sched._last_lr = [g["lr"] for g in self.opt.param_groups]
        set_rng_state(state["rng"], self.gen)
        if self.algo is not None:
            self.algo.load_state_dict(state.get("algorithm", {}))
        self.stream.seek(*state["stream"])
        self.counters = dict(state["counters"])
        self.streak_start = state.get("streak_start")
        truncate_metrics(self.out, state["metrics_bytes"])
        return state["step"]

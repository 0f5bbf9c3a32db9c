"""Checkpoints that hold everything a run needs to continue exactly.

Layout: `<run>/checkpoints/step-000120/` with the model (safetensors + config), the tokenizer,
`state.pt` (optimizer, scheduler, RNG states, data position, running statistics, step; loaded
with weights_only=True, so no arbitrary pickle is executed) and `COMPLETE`, written last. A
checkpoint is written into a temp folder and renamed into place, so a crash mid-write leaves
the previous checkpoints untouched; a folder without `COMPLETE` is skipped on resume.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from rloo.tracking import say

MARKER = "COMPLETE"


def rng_state(generator: torch.Generator) -> dict:
    np_state = np.random.get_state()
    return {
        "python": list(_tuple_to_list(random.getstate())),
        "numpy": {"key": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached": float(np_state[4])},
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


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict, keep: int = 2) -> Path:
    """Write checkpoint `step` atomically and keep only the newest `keep`."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    model.save_pretrained(tmp / "model", safe_serialization=True)
    tokenizer.save_pretrained(tmp / "model")
    torch.save({**state, "step": step}, tmp / "state.pt")
    (tmp / MARKER).write_text(str(step))
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _fsync_dir(path: Path) -> None:
    for f in path.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    return sorted(p for p in root.glob("step-*") if (p / MARKER).exists())


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint whose state loads; broken ones are reported and skipped."""
    for ckpt in reversed(list_checkpoints(run_dir)):
        try:
            torch.load(ckpt / "state.pt", weights_only=True)
            return ckpt
        except Exception as e:  # noqa: BLE001 - a corrupt file of any kind means: skip it
            say(f"skipping unreadable checkpoint {ckpt}: {type(e).__name__}: {e}")
    return None


def load_state(ckpt: Path) -> dict:
    return torch.load(Path(ckpt) / "state.pt", weights_only=True)

"""Pieces every stage shares: seeding, the output folder, the optimizer."""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import yaml

from rloo.config import save_config
from rloo.errors import RlooError


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a torch generator for sampling."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def prepare_output_dir(cfg, resume: bool = False, overwrite: bool = False) -> Path:
    """Create the run folder and record the config in it.

    A folder that already holds a run with a different config is refused unless `overwrite`
    (start over) or `resume` (continue it) is given: one run never silently mixes into another.
    """
    out = Path(cfg.output_dir)
    saved = out / "config.yaml"
    if saved.exists() and not resume:
        same = yaml.safe_load(saved.read_text()) == cfg.model_dump(mode="json")
        if not overwrite and not same:
            raise RlooError(f"{out} already holds a different run; pass --resume to continue it or --overwrite to replace it")
        if overwrite:
            shutil.rmtree(out)
    elif out.exists() and any(out.iterdir()) and not saved.exists() and not (resume or overwrite):
        raise RlooError(f"{out} exists and is not empty; choose another output_dir or pass --overwrite")
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, saved)
    return out


def adamw(params, lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=lr, weight_decay=weight_decay,
                             betas=(0.9, 0.95))


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

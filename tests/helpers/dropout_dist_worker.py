"""Like dist_worker, but ONE step, float32 weights and optional gradient checkpointing: run by
tests/equivalence/test_dropout.py under torchrun (2 processes: a job of dist_worker.torchrun's launch)
and in-process (the one-process reference).
Modes: ddp, fsdp, ddp-gc, fsdp-gc (gc: gradient_checkpointing=true)."""

from __future__ import annotations

from pathlib import Path

import dist_worker


def run(model_dir: str, out_root: str, modes: list[str]) -> None:
    from rloo import train

    for mode in modes:
        parallel, _, gc = mode.partition("-")
        cfg = dist_worker.config(model_dir, Path(out_root) / mode, parallel).model_copy(
            update={"dtype": "float32", "gradient_checkpointing": gc == "gc", "steps": 1}
        )
        train(cfg, prompts=dist_worker.PROMPTS, reward_fn=dist_worker.reward_short)

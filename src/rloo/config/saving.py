"""Checkpoint settings of a supervised stage (SFT, reward model): the same keys, and the same
meaning, as the RL stage's `save_every` and `keep_checkpoints` (rloo.config.sections.RLSettings)."""

from __future__ import annotations

from pydantic import Field

from rloo.config.base import Strict


class SupervisedSaving(Strict):
    """When a supervised stage writes a checkpoint (rloo.training.supervised): every `save_every`
    steps, on SIGINT/SIGTERM, and never more than `keep_checkpoints` on disk."""

    save_every: int | None = Field(
        default=100,
        ge=1,
        description="Steps between checkpoints, read by --resume (null: none but on SIGINT/SIGTERM).",
    )
    keep_checkpoints: int = Field(default=2, ge=1, description="Newest checkpoints kept on disk.")

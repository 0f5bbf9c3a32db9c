"""The base of every config section: unknown keys are errors, assignments are validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator

from rloo.config.confcheck import reject_coercions

# Bounds beyond which a setting is a typo, not an experiment (an AdamW step moves each weight by
# about lr, so lr > 1 no longer fine-tunes; `lr=1e308` or `beta=inf` used to start a run that
# saved a non-finite model). Every float must also be finite (`allow_inf_nan=False`: `.inf`, nan).
MAX_LR = 1.0
MAX_BETA = 1e3
MAX_GRAD_NORM = 1e6


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_coercion(cls, data):
        # YAML `seed: true` or `steps: "5"` are mistakes, not numbers: no silent bool/str -> number
        return reject_coercions(cls, data)

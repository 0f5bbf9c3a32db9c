"""The precision every sampler computes in, in one place: the training step, the lagged sampler and
the asynchronous producer must draw in the same precision (`sampling_precision`, which a vLLM engine's
dtype follows too). What they draw is one `Sampling` object (rloo.config.generation: `cfg.sampling`,
an eval section's `sampling`)."""

from __future__ import annotations

import torch

from rloo.config import RLConfig
from rloo.runtime.precision import (
    MIN_BF16_WIDTH_SAMPLING,
    Precision,
    model_width,
    resolve_precision,
    running_precision,
)


def sampling_precision(cfg: RLConfig, model: torch.nn.Module) -> Precision:
    """The precision the trainer samples in: its running stage's (rloo.training.rl), or outside a stage
    what that stage would resolve cfg.dtype to for `model`'s device. Every sampler computes in it: at
    N = 0 and with the in-process lag inside the stage's autocast, the producer (in its process or on
    another machine, outside that context) in the one the trainer hands it (rloo.rollout.producer), and
    a vLLM engine in its dtype (rloo.rollout.vllm.vllm_dtype)."""
    running = running_precision()
    if running is not None:
        return running
    device = next(model.parameters()).device
    return resolve_precision(cfg.dtype, device, model_width(cfg), MIN_BF16_WIDTH_SAMPLING)

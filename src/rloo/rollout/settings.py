"""`rollout`'s sampling keywords from a config, in one place: the training step, the lagged
sampler and the asynchronous producer must draw with the same settings (`sampling_settings`) and in
the same precision (`sampling_precision`, which a vLLM engine's dtype follows too), and every
evaluation with its eval section's (`decoding`)."""

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


def decoding(section) -> dict:
    """The generation keywords of `rloo.rollout.sampler.rollout` (rloo.rollout.decoding) that an RL
    config or an eval section (`cfg.eval`, `EvalConfig`) sets; eval's temperature may be 0 (greedy)."""
    return dict(
        temperature=section.temperature,
        top_p=section.top_p,
        top_k=section.top_k,
        min_new_tokens=section.min_new_tokens,
        repetition_penalty=section.repetition_penalty,
        stop=tuple(section.stop),
    )


def sampling_settings(cfg: RLConfig) -> dict:
    """The keywords of `rloo.rollout.sampler.rollout` that come from `cfg`."""
    lengths = dict(max_prompt_len=cfg.max_prompt_tokens, max_new_tokens=cfg.max_new_tokens)
    own = dict(share_prompt=cfg.share_prompt, truncated_logprobs=cfg.truncated_logprobs, captured=cfg.captured_decode)
    return lengths | decoding(cfg) | own


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

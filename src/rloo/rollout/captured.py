"""Which decode loop `rloo.rollout.sampler.sample` runs (rl.captured_decode): the eager loop
(rloo.rollout.decode_steps), or one fixed-shape step over a static KV cache, captured once as a
CUDA graph and replayed per token. What the captured step cannot serve falls back to the eager loop
with one line saying why, never silently."""

from __future__ import annotations

import torch

from rloo.runtime.tracking.log import say_once


def captured_refusal(mode: str, device: torch.device) -> str | None:
    """Why `mode` (auto/on/off) does not decode captured on `device` (None: it does). auto is eager
    off CUDA without a word (the default there); off is eager."""
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return ""
    return "the captured step is not built yet"


def decodes_captured(mode: str, device: torch.device) -> bool:
    """Whether `sample` decodes with the captured step; a fallback that was asked for (on, or auto on
    CUDA) says so once per reason."""
    why = captured_refusal(mode, device)
    if why:
        say_once(f"captured_decode={mode}: the eager decode loop serves this rollout ({why})")
    return why is None

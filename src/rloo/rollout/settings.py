"""`rollout`'s sampling keywords from an RL config, in one place: the training step, the lagged
sampler and the asynchronous producer must draw with the same settings."""

from __future__ import annotations

from rloo.config import RLConfig


def sampling_settings(cfg: RLConfig) -> dict:
    """The keywords of `rloo.rollout.sampler.rollout` that come from `cfg`."""
    return dict(
        max_prompt_len=cfg.max_prompt_tokens,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        share_prompt=cfg.share_prompt,
    )

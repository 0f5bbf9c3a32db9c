"""`rollout`'s sampling keywords from a config, in one place: the training step, the lagged
sampler and the asynchronous producer must draw with the same settings (`sampling_settings`), and
every evaluation with its eval section's (`decoding`)."""

from __future__ import annotations

from rloo.config import RLConfig


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
    return lengths | decoding(cfg) | dict(share_prompt=cfg.share_prompt, truncated_logprobs=cfg.truncated_logprobs)

"""The uninterrupted reference run that the fault-injection tests compare against."""

from __future__ import annotations

import pytest

from rloo import RLConfig, train

from ._helpers import PROMPTS, reward_short


def rl_config(tiny_model_dir, out, **kw) -> RLConfig:
    """6 deterministic CPU steps on the tiny model; checkpoints at 2, 4, 6 (the last 2 kept)."""
    base = dict(
        policy=str(tiny_model_dir),
        output_dir=out,
        steps=6,
        batch_size=2,
        k=2,
        max_new_tokens=5,
        lr=3e-3,
        warmup_steps=2,
        save_every=2,
        keep_checkpoints=2,
        eval_every=None,
        log_every=1,
    )
    return RLConfig(**(base | kw))


@pytest.fixture(scope="session")
def reference(tiny_model_dir, tmp_path_factory):
    """A run that was never stopped (read-only for the tests: copy it before changing it)."""
    out = tmp_path_factory.mktemp("ref") / "run"
    train(rl_config(tiny_model_dir, out), prompts=PROMPTS, reward_fn=reward_short)
    return out

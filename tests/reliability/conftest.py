"""The uninterrupted reference run that the fault-injection tests compare against."""

from __future__ import annotations

import pytest

from helpers.tiny import TINY_STUDY as TINY
from rloo import RLConfig, train
from rloo.cli import main
from rloo.config import CompareConfig
from rloo.experiments.compare import compare

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


def tiny_study_config(out, **kw) -> CompareConfig:
    """`rloo compare` at the suite's tiny study settings (tests/helpers/tiny.py): one method, one
    task, one seed, the gradient variance (so a weak SFT model) included."""
    return CompareConfig(**({"methods": ["rloo"], "tasks": ["summarize"], "seeds": [0], "output_dir": out} | TINY | kw))


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory):
    """A finished tiny comparison (read-only for the tests: copy it before changing it)."""
    out = tmp_path_factory.mktemp("study") / "cmp"
    compare(tiny_study_config(out))
    return out


TRAIN = [
    "reward_fn=reliability._helpers:reward_short",
    "steps=2",
    "batch_size=2",
    "k=2",
    "max_new_tokens=4",
    "eval_every=null",
    "save_every=1",
]


@pytest.fixture(scope="session")
def train_run(tiny_model_dir, tmp_path_factory):
    """A finished 2-step `rloo train` run with its checkpoints (read-only: copy it first)."""
    out = tmp_path_factory.mktemp("train") / "run"
    assert main(["train", f"policy={tiny_model_dir}", f"output_dir={out}", *TRAIN]) == 0
    return out


@pytest.fixture(scope="session")
def async_run(tiny_model_dir, tmp_path_factory):
    """A finished 2-step `rloo train` run at max_staleness=1, its checkpoints holding ring/
    (read-only: copy it first). Sampled in this process with one thread (LaggedSampler: no producer
    process to start), as the tests that resume it do."""
    import torch

    out = tmp_path_factory.mktemp("async") / "run"
    torch.set_num_threads(1)  # the next test's own fixture sets the suite's count again
    assert main(["train", f"policy={tiny_model_dir}", f"output_dir={out}", *TRAIN, "max_staleness=1"]) == 0
    assert (out / "checkpoints" / "step-000002" / "ring" / "version-000001.safetensors").exists()
    return out

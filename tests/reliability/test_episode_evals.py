"""The periodic evaluation of an `env=` run (episodes of the held-out prompts, rloo.training.evalset)
leaves training as it would be without it, even when the user's environment draws from Python's,
NumPy's and torch's global random streams; and such a run stopped by SIGTERM and resumed ends with the
same parameters, bit for bit, as one never stopped, each evaluation logged once."""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import TINY
from rloo import RLConfig, train
from rloo.errors import Interrupted
from rloo.modeling.loading import build_llama
from rloo.tasks import get_task
from rloo.tasks.tokenizer import build_tokenizer

from ._helpers import assert_params_moved, assert_same_params, metric_steps
from .test_resume import _signal_after

NOISY_ENV = """
import random

import numpy as np
import torch

from rloo.envs import Step


class NoisyEnv:
    '''One turn; its reward adds draws from the three global random streams made at reset (resets run
    one after the other, so the draws keep their order): an evaluation that consumed draws between
    training steps would change every later training reward.'''
    stop_ids = ()

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def reset(self, prompt):
        self.noise = random.random() + float(np.random.rand()) + float(torch.rand(()))
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def step(self, turn):
        return Step([], float(sum(turn) % 2 == 0) + self.noise, True)
"""


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    """(a fresh tiny Llama with the calculator task's word tokenizer, the env= of NoisyEnv's file)."""
    root = tmp_path_factory.mktemp("noisy")
    tok = build_tokenizer(get_task("calculator"))
    build_llama(TINY, tok, seed=0).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    (root / "noisyenv.py").write_text(textwrap.dedent(NOISY_ENV))
    return root / "model", f"{root / 'noisyenv.py'}:NoisyEnv"


def _cfg(noisy, out, **kw) -> RLConfig:
    model, env = noisy
    base = dict(
        policy=str(model),
        output_dir=out,
        task="calculator",
        env=env,
        env_settings={"max_turns": 1, "max_turn_tokens": 6, "max_total_tokens": 6},
        steps=4,
        batch_size=2,
        k=2,
        lr=3e-3,
        warmup_steps=0,
        save_every=2,
        eval_every=1,
        eval_prompts=3,
        eval={"batch_size": 2},
        log_every=1,
        report_to="none",
    )
    return RLConfig(**(base | kw))


def test_episode_eval_does_not_perturb_training(noisy, tmp_path):
    """The same run with and without an evaluation before every step ends with the same parameters."""
    runs = {every: tmp_path / f"eval-{every}" for every in (None, 1)}
    for every, out in runs.items():
        train(_cfg(noisy, out, steps=3, eval_every=every, save_every=None))
    assert metric_steps(runs[1], "eval/success") == [0, 1, 2, 3]
    assert metric_steps(runs[None], "eval/success") == []
    assert_params_moved(noisy[0], runs[None] / "model")
    assert_same_params(runs[None] / "model", runs[1] / "model")


def test_sigterm_then_resume_with_episode_evals_is_bitwise_exact(noisy, tmp_path, monkeypatch):
    """Stopped in step 3 (checkpoint at 3), resumed: the parameters of a run never stopped; the
    evaluations at steps 0..4 (their numbers those of the run never stopped) and the training steps
    1..4 each logged once."""
    reference = tmp_path / "reference"
    train(_cfg(noisy, reference))
    out = tmp_path / "run"
    _signal_after(monkeypatch, 3)
    with pytest.raises(Interrupted, match="SIGTERM received; stopped at step 3/4"):
        train(_cfg(noisy, out))
    monkeypatch.undo()
    train(_cfg(noisy, out), resume=True)
    assert_same_params(reference / "model", out / "model")
    assert metric_steps(out, "eval/success") == [0, 1, 2, 3, 4]
    assert metric_steps(out) == [1, 2, 3, 4]
    assert _evals(out) == _evals(reference)


def _evals(run) -> list[dict]:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if "eval/success" in r]

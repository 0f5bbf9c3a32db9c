"""The asynchronous rollout producer scores its batches (docs/async.md): the scores and reference
log-probs it hands over are those the trainer's own step 2 (rloo.algorithms.base.Scoring) gives for
the same rollout, and the step uses them instead of scoring again."""

from __future__ import annotations

import copy
from dataclasses import fields

import pytest
import torch

from rloo.algorithms.base import Scoring, score_rollout
from rloo.config import LoraSettings, RLConfig
from rloo.data.prompts import PromptStream
from rloo.rollout import Rollout
from rloo.rollout.producer import ProducerSampler, ScoredRollout
from rloo.training.rl import load_models, producer_scoring

PROMPTS = ["post : job rent tl;dr :", "post : exam tl;dr :", "post : loan sister car mom tl;dr :"]


def reward_fn(prompts, completions):  # module level: the producer process imports it by name
    return [len(c.split()) / 4 + 0.1 * len(p.split()) for p, c in zip(prompts, completions, strict=True)]


def _cfg(path, out, **kw) -> RLConfig:
    base = dict(policy=str(path), output_dir=out, k=4, batch_size=2, max_new_tokens=6, seed=0, max_staleness=1)
    return RLConfig(**(base | kw))


# reward_fn alone in the slow tier (each case starts a producer process, 3-5 s of CPU importing torch
# and rloo): lora scores with the reward_fn, reward_model takes its reference from a separate model
@pytest.mark.parametrize("source", ["reward_model", pytest.param("reward_fn", marks=pytest.mark.slow), "lora"])
def test_the_producer_scores_as_the_trainer_does(tiny_model_dir, tmp_path, source):
    """lora: the reference is the policy with its adapters off; the producer takes its own copy's,
    and the adapters are moved away from 0 first, so that adapters left on would show."""
    # truncation_penalty: step 2 also replaces the score of a completion cut at max_new_tokens
    extra = {"reward_model": str(tiny_model_dir)} if source == "reward_model" else {}
    extra |= {"lora": LoraSettings(r=4, alpha=8)} if source == "lora" else {}
    cfg = _cfg(tiny_model_dir, tmp_path, truncation_penalty=-3.0, **extra)
    models = load_models(cfg, reward_fn=None if source == "reward_model" else reward_fn)
    if source == "lora":
        with torch.no_grad():
            for p in models.policy.parameters():
                if p.requires_grad:
                    p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    scoring = producer_scoring(models, cfg)
    assert scoring is not None
    stream = PromptStream(PROMPTS, 2, seed=0)
    sampler = ProducerSampler(models.policy, models.tokenizer, cfg, copy.deepcopy(stream), score=scoring)
    try:
        for _ in range(3):
            roll = sampler(models.policy, stream.next())
            assert isinstance(roll, ScoredRollout) and roll.scored is not None
            plain = Rollout(**{f.name: getattr(roll, f.name) for f in fields(Rollout)})
            scores, ref_lp = Scoring(models.scorer, models.ref, cfg)(plain)  # the trainer's step 2
            # the same code on the same tensors with the same thread count (the producer and the
            # trainer each take 1 of the test's 2 threads): the same floats, not merely close ones
            assert torch.equal(roll.scored[0], scores) and torch.equal(roll.scored[1], ref_lp)
            assert roll.truncated.any() and (scores[roll.truncated] == -3.0).all()
            # and the step takes them as they are
            assert score_rollout(models, roll, cfg) is roll.scored
            sampler.sync(models.policy)
    finally:
        sampler.close()


def test_a_reward_the_producer_cannot_import_is_scored_by_the_trainer(tiny_model_dir, tmp_path):
    """A lambda does not pickle; a function loaded from path/to/file.py pickles under a module name
    made up in this process, which the producer could not import (its start would fail)."""
    (tmp_path / "my_reward.py").write_text("def fn(prompts, completions):\n    return [0.0] * len(completions)\n")
    for fn in (lambda prompts, completions: [0.0] * len(completions), f"{tmp_path / 'my_reward.py'}:fn"):
        cfg = _cfg(tiny_model_dir, tmp_path, reward_fn=fn) if isinstance(fn, str) else _cfg(tiny_model_dir, tmp_path)
        models = load_models(cfg, reward_fn=None if isinstance(fn, str) else fn)
        assert models.scorer is not None and producer_scoring(models, cfg) is None

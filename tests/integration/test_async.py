"""rl.max_staleness end to end through the API (docs/async.md): the lag of every batch and the
importance ratio's stats are logged, and the run trains."""

from __future__ import annotations

import math

import pytest
import torch

from rloo import RLConfig, train

PROMPTS = ["post : job rent tl;dr :", "post : exam car tl;dr :", "post : loan sister tl;dr :"]


def _reward_short(prompts, completions):
    return [-len(c.split()) / 10 for c in completions]


@pytest.mark.parametrize("threads", [1, 2])  # 1: the lag simulated in process; 2: the producer process
def test_lagged_run_logs_lag_and_ratios(tiny_model_dir, tmp_path, monkeypatch, threads):
    import rloo.rollout.producer as producer

    made = []
    monkeypatch.setattr(producer.torch, "get_num_threads", lambda: threads)
    for cls in (producer.ProducerSampler, producer.LaggedSampler):
        monkeypatch.setattr(cls, "sync", lambda self, policy, f=cls.sync: made.append(type(self)) or f(self, policy))
    cfg = RLConfig(
        policy=str(tiny_model_dir),
        output_dir=tmp_path / "run",
        steps=4,
        batch_size=2,
        k=2,
        max_new_tokens=6,
        lr=1e-2,
        warmup_steps=0,
        eval_every=None,
        save_every=None,
        max_staleness=2,
        is_correction="mis",
    )
    history = [h for h in train(cfg, prompts=PROMPTS, reward_fn=_reward_short).history if "loss/policy" in h]
    assert set(made) == {producer.ProducerSampler if threads > 1 else producer.LaggedSampler}
    assert all(("time/trainer_wait" in h) == (threads > 1) for h in history)
    # the producer scored its batches (a module-level reward function can be sent to it)
    assert all(("time/producer_score" in h) == (threads > 1) for h in history)
    # batch t was sampled with the weights of update max(0, t - 2)
    assert [h["is/lag"] for h in history] == [0.0, 1.0, 2.0, 2.0]
    assert all(math.isfinite(h["is/ratio_mean"]) and 0.0 <= h["is/masked"] <= 1.0 for h in history)
    # at lag 0 the ratio is 1 up to the float difference of the sampling pass and the training pass:
    # per token about 2^8 eps (1 + |log p|) (tests/equivalence/test_gradient_matrix.py), |log p| <= 10
    # for these models' small vocabulary, summed over <= 6 tokens
    bound = 6 * 2**8 * torch.finfo(torch.float32).eps * 11
    assert abs(history[0]["is/ratio_max"] - 1.0) < bound and history[0]["is/masked"] == 0.0
    # lr=1e-2 moves a tiny model: a lagged batch's ratios are no longer all 1
    assert max(abs(h["is/ratio_max"] - 1.0) for h in history[2:]) > bound


def test_a_run_whose_importance_weights_vanish_says_so_once(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A lagged run whose every importance weight is 0 (mis drops each sample) logs is/weight_mean 0 at
    every step and, after `VanishingWeights.patience` steps, says so in one line, once (docs/async.md:
    the failure measured at lr 1e-3, N = 16). The weights vanish by construction, not by rounding: the
    behaviour log-probs the update sees are the trained policy's plus 1 nat per token (a sampler that
    gave each sampled token e times the probability), so rho_i = e^-|y_i| <= 1/e < 1/C for C = 2 on
    every sequence (each has >= 1 real token: its EOS at least). The ratios and weights are still the
    real `importance_weights` of the real update; only its behaviour input is moved."""
    import rloo.algorithms.offpolicy as offpolicy
    import rloo.rollout.producer as producer

    real = offpolicy.importance_weights

    def far_behaviour(logprobs, behaviour_logprobs, mask, correction, clip):
        return real(logprobs, logprobs.detach() + 1.0, mask, correction, clip)

    monkeypatch.setattr(offpolicy, "importance_weights", far_behaviour)
    monkeypatch.setattr(producer.torch, "get_num_threads", lambda: 1)  # the in-process lag: no producer
    cfg = RLConfig(
        policy=str(tiny_model_dir),
        output_dir=tmp_path / "run",
        steps=7,
        batch_size=2,
        k=2,
        max_new_tokens=6,
        lr=1e-2,
        warmup_steps=0,
        eval_every=None,
        save_every=None,
        max_staleness=1,
        is_correction="mis",
        is_clip=2.0,
    )
    history = [h for h in train(cfg, prompts=PROMPTS, reward_fn=_reward_short).history if "loss/policy" in h]
    assert [h["is/lag"] for h in history] == [0.0] + [1.0] * 6
    assert all(h["is/masked"] == 1.0 and h["is/ratio_max"] < 1 / cfg.is_clip for h in history), history
    assert [h["is/weight_mean"] for h in history] == [0.0] * 7
    lines = [line for line in capsys.readouterr().err.splitlines() if "importance weights have been ~0" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: step 5:"), lines  # patience 5 from step 1


def test_the_vanishing_weights_warning_waits_for_a_streak_and_speaks_once(monkeypatch):
    import rloo.training.guard as guard

    said = []
    monkeypatch.setattr(guard, "say", said.append)
    watch = guard.VanishingWeights(floor=0.05, patience=3)
    for step, w in enumerate([0.01, 0.01, 0.5, 0.01, 0.01, 0.01, 0.0, 0.0], start=1):
        watch.after_step({"is/weight_mean": w}, step)
    watch.after_step({}, 9)  # an on-policy step logs no weights: nothing happens
    assert said and said[0].startswith("warning: step 6:")  # the streak restarted at step 4
    assert len(said) == 1  # once per run

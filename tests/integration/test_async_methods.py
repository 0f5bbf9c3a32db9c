"""rl.max_staleness=1 end to end for every online method besides rloo (docs/async.md, "Which methods"):
a few steps of `rloo.train` (what `rloo train` runs) on a tiny model finish, and every step logs the
lag and the importance ratio's stats (raft: its weight is 1, the ratio a diagnostic)."""

from __future__ import annotations

import math

import pytest

from rloo import RLConfig, train
from rloo.config.methods import capable, names

PROMPTS = ["post : job rent tl;dr :", "post : exam car tl;dr :", "post : loan sister tl;dr :"]
SMALL = {"ppo_epochs": 1, "num_minibatches": 1}
SETTINGS = {"ppo": SMALL, "grpo": SMALL, "dr_grpo": SMALL, "reinforce_pp": SMALL}


def _reward_short(prompts, completions):
    return [-len(c.split()) / 10 for c in completions]


METHODS = ["reinforce", "vanilla_pg", "ppo", "grpo", "dr_grpo", "reinforce_pp", "raft"]


def test_every_online_method_takes_max_staleness():
    assert capable("off_policy") == list(names(online=True)) == ["rloo", *METHODS[:4], "raft", *METHODS[4:6]]


# 1 thread: the lag simulated in process (no spawn); 2: the producer process (and its scoring), once
@pytest.mark.parametrize("method,threads", [(m, 1) for m in METHODS] + [("ppo", 2)])
def test_lagged_run_of_each_method_logs_lag_and_ratios(tiny_model_dir, tmp_path, monkeypatch, method, threads):
    import rloo.rollout.producer as producer

    monkeypatch.setattr(producer.torch, "get_num_threads", lambda: threads)
    cfg = RLConfig(
        policy=str(tiny_model_dir),
        output_dir=tmp_path / "run",
        algorithm=method,
        algorithm_settings=SETTINGS.get(method, {}),
        steps=3,
        batch_size=2,
        k=2,
        max_new_tokens=5,
        lr=1e-2,
        warmup_steps=0,
        eval_every=None,
        save_every=None,
        max_staleness=1,
    )
    history = [h for h in train(cfg, prompts=PROMPTS, reward_fn=_reward_short).history if "is/lag" in h]
    assert [h["is/lag"] for h in history] == [0.0, 1.0, 1.0]
    assert all(("time/producer_score" in h) == (threads > 1) for h in history)
    for h in history:
        assert all(math.isfinite(h[k]) for k in ("is/ratio_mean", "is/ratio_max", "is/weight_mean")), h
        assert 0.0 <= h["is/truncated"] <= 1.0 and 0.0 <= h["is/masked"] <= 1.0
    if method == "raft":  # trained on as sampled
        assert all(h["is/weight_mean"] == 1.0 for h in history)

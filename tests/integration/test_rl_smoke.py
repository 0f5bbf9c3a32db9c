"""Smoke tests: a few RLOO steps on a tiny model loaded by path, through the API and the CLI."""

from __future__ import annotations

import json
import math

import torch
from transformers import AutoModelForCausalLM

from rloo import RLConfig, train
from rloo.cli import main


def _reward_short(prompts, completions):
    # prefers short completions: a signal the policy can move on in a few steps
    return [-len(c.split()) / 10 for c in completions]


def test_api_trains_on_own_prompts_and_reward(tiny_model_dir, tmp_path):
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    cfg = RLConfig(
        policy=str(tiny_model_dir),
        output_dir=tmp_path / "run",
        steps=3,
        batch_size=4,
        k=3,
        max_new_tokens=6,
        lr=1e-3,
        warmup_steps=0,
        eval_every=None,
        save_every=None,
    )
    prompts = ["post : job rent tl;dr :", "post : exam car tl;dr :", "post : loan sister tl;dr :"]
    result = train(cfg, prompts=prompts, reward_fn=_reward_short)
    assert len([h for h in result.history if "loss/policy" in h]) == 3
    assert all(math.isfinite(h["loss/policy"]) for h in result.history if "loss/policy" in h)
    after = AutoModelForCausalLM.from_pretrained(result.model_path).state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "no parameter changed after 3 RLOO steps"
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert {"reward/score", "reward/kl", "loss/policy"} <= set(json.loads(lines[0]))


def test_cli_train_with_reward_model(tiny_model_dir, tmp_path, capsys):
    # the tiny causal LM doubles as a (random) reward model: a one-output head is added on load
    rc = main(
        [
            "train",
            f"policy={tiny_model_dir}",
            f"reward_model={tiny_model_dir}",
            f"output_dir={tmp_path / 'r'}",
            "steps=2",
            "batch_size=2",
            "k=2",
            "max_new_tokens=5",
            "eval_every=1",
            "eval_prompts=4",
            "eval.batch_size=4",
            "save_every=1",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / "r" / "model" / "model.safetensors").exists()
    assert (tmp_path / "r" / "checkpoints").exists()
    recs = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/win_rate" in r for r in recs)

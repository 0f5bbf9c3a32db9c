"""The evaluation's judge by default: on a dataset with a Python reward and no reward model, the
reward judges, in `rloo train` as in `rloo pipeline` (one rule, RLConfig's)."""

from __future__ import annotations

import pytest

from rloo.config import PipelineConfig, RLConfig, load_config

DATA = ["dataset.path=d.jsonl"]


@pytest.mark.parametrize(
    "extra, judge",
    [
        (["reward_fn=f.py:f"], "f.py:f"),
        (["reward_fn=[f.py:f,g.py:g]"], "f.py:f"),  # summed in training; the first judges
        (["reward_fn=f.py:f", "eval.judge=j.py:j"], "j.py:j"),  # the user's choice wins
        (["reward_fn=f.py:f", "reward_model=rm"], None),  # the reward model is the default judge
    ],
)
def test_train_on_a_dataset_is_judged_by_its_python_reward(extra, judge):
    # fails on main: `rloo train` left eval.judge None (no judge scores) where the pipeline used the reward
    assert load_config(RLConfig, None, ["policy=p", *DATA, *extra]).eval.judge == judge


def test_the_built_in_task_keeps_its_gold_judge():
    assert load_config(RLConfig, None, ["policy=p", "reward_fn=f.py:f"]).eval.judge is None


@pytest.mark.parametrize("fns", ["f.py:f", "[f.py:f,g.py:g]"])
def test_the_pipelines_rl_and_eval_stages_take_the_same_default(fns):
    cfg = load_config(PipelineConfig, None, ["model=m", *DATA, f"rl.reward_fn={fns}", "eval.num_prompts=3"])
    _, _, rl, ev = cfg.stage_configs()
    assert rl.eval.judge == ev.judge == "f.py:f" and ev.num_prompts == 3
    _, _, rl, ev = load_config(PipelineConfig, None, ["model=m", *DATA]).stage_configs()
    assert rl.eval.judge is None and ev.judge is None  # the reward model the pipeline trains judges

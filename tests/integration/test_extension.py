"""Adding a method or a reward source touches one place: a module of its own, written against the
public extension points only (`rloo.algorithms.add_method`: one table entry and one step; a
`RewardSource` named by reward_fn=module:name), runs through `rloo train` and `rloo compare`."""

from __future__ import annotations

import importlib
import json
import sys

import pytest
import torch
import yaml

from rloo.algorithms import REGISTRY
from rloo.cli import main
from rloo.config import METHOD_SPECS

TOY_METHOD = '''
"""REINFORCE with the batch's mean shaped reward as its baseline, and a k3-KL comparison variant."""
from rloo.algorithms import add_method
from rloo.algorithms.base import StepResult, guarded_step
from rloo.algorithms.common import Timer, require_scored, rollout_stats, sample_and_score, sequence_rewards
from rloo.algorithms.common import update_logprobs
from rloo.config import MethodSpec
from rloo.config.method_settings import KLEstimatorSettings
from rloo.core.logprobs import sequence_logprobs
from rloo.core.losses import policy_gradient_loss


def toy_step(models, opt, prompts, cfg, gen):
    timer = Timer()
    roll, scores, ref_lp = sample_and_score(models, prompts, cfg, gen, timer)
    require_scored(scores, cfg.algorithm)
    rewards, kl = sequence_rewards(scores, roll, ref_lp, cfg)
    advantages = rewards - rewards.mean()
    roll.record(advantage=advantages)
    logprobs = update_logprobs(models, roll, cfg)
    loss, stats = policy_gradient_loss(sequence_logprobs(logprobs, roll.completion_mask), advantages)
    norm, stepped = guarded_step(loss, list(models.policy.parameters()), opt, cfg.max_grad_norm)
    timer.lap("update")
    stats = {k: float(v) for k, v in stats.items()} | {"toy/baseline": rewards.mean().item()}
    return StepResult(stats | rollout_stats(roll, scores, kl, rewards, norm, not stepped, timer), roll, rewards)


def short(prompts, completions):
    return [-len(c.split()) / 10 for c in completions]


add_method(
    MethodSpec(
        "toy_pg",
        "batch-mean baseline",
        KLEstimatorSettings,
        variants={"toy_pg_k3": {"algorithm_settings": {"kl_estimator": "k3"}}},
    ),
    toy_step,
)
'''

TOY_REWARD = '''
"""A reward source that reads the rollout's token ids (a function of text could not), and logs a metric."""
import torch


class ShortCompletions:
    def __init__(self):
        self.calls = 0

    def __call__(self, batch):
        self.calls += 1
        return -batch.completion_mask.sum(-1).float() / 10

    def score_texts(self, prompts, completions):
        return torch.tensor([-len(c.split()) / 10 for c in completions])

    def part_metrics(self):
        return {"toy/calls": float(self.calls)}


source = ShortCompletions()
'''

TRAIN = ["steps=2", "batch_size=2", "k=2", "max_new_tokens=4", "eval_every=null", "eval_prompts=4"]
TRAIN += ["eval.batch_size=4", "save_every=null"]


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """Writes a module into a folder on sys.path and imports it; the method table and the registry
    are restored afterwards, so no other test sees what it added."""
    specs, registry, added = dict(METHOD_SPECS), dict(REGISTRY), []
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, text: str):
        (tmp_path / f"{name}.py").write_text(text)
        added.append(name)
        return importlib.import_module(name)

    yield write
    METHOD_SPECS.clear()
    METHOD_SPECS.update(specs)
    REGISTRY.clear()
    REGISTRY.update(registry)
    for name in added:
        sys.modules.pop(name, None)


def _records(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_method_from_its_own_module_trains_and_compares(plugin, tiny_model_dir, tmp_path, capsys):
    assert main(["train", "algorithm=toy_pg", f"policy={tiny_model_dir}"]) == 2  # unknown before it is added
    assert "algorithm: Input should be" in capsys.readouterr().err
    plugin("toy_method", TOY_METHOD)
    run = tmp_path / "train"
    args = ["train", "algorithm=toy_pg", f"policy={tiny_model_dir}", "reward_fn=toy_method:short", f"output_dir={run}"]
    assert main(args + TRAIN) == 0, capsys.readouterr().err
    steps = [r for r in _records(run) if "toy/baseline" in r]
    assert len(steps) == 2 and all(r["reward/score"] <= 0 for r in steps)
    # its settings are its own: another method's is refused in one line
    assert main(args + TRAIN + ["algorithm_settings.gae_lambda=0.5"]) == 2
    assert "algorithm_settings.gae_lambda is a setting of ppo, not of algorithm=toy_pg" in capsys.readouterr().err
    out = tmp_path / "compare"
    rc = main(
        [
            "compare",
            "methods=[toy_pg,toy_pg_k3]",
            "tasks=[summarize]",
            "seeds=[0]",
            f"output_dir={out}",
            "sft.num_examples=64",
            "sft.epochs=1",
            "sft.arch.hidden_size=32",
            "sft.arch.num_layers=1",
            "sft.arch.num_heads=2",
            "sft.arch.intermediate_size=64",
            "reward.num_pairs=64",
            "reward.eval_pairs=16",
            "reward.epochs=1",
            "rl.steps=2",
            "rl.batch_size=2",
            "rl.max_new_tokens=5",
            "rl.eval_every=null",
            "rl.eval_prompts=8",
            "rl.save_every=null",
            "eval.num_prompts=8",
            "eval.batch_size=8",
            "variance_batches=0",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    results = json.loads((out / "report" / "results.json").read_text())["summarize"]
    assert {"toy_pg", "toy_pg_k3"} <= set(results)
    k3 = yaml.safe_load((out / "runs" / "summarize" / "seed-0" / "toy_pg_k3" / "config.yaml").read_text())
    assert k3["algorithm"] == "toy_pg" and k3["algorithm_settings"]["kl_estimator"] == "k3"


def test_a_reward_source_from_its_own_module_is_used_as_it_is(plugin, tiny_model_dir, tmp_path, capsys):
    toy = plugin("toy_reward", TOY_REWARD)
    run = tmp_path / "r"
    args = ["train", f"policy={tiny_model_dir}", "reward_fn=toy_reward:source", f"output_dir={run}"]
    assert main(args + TRAIN) == 0, capsys.readouterr().err
    steps = [r for r in _records(run) if "reward/score" in r]
    # one call before training (the preflight check), one per step, one in the final evaluation
    assert [r["toy/calls"] for r in steps] == [2.0, 3.0] and toy.source.calls == 4
    # at most max_new_tokens=4 tokens: -0.4 <= score <= 0, up to the rounding of 4/10 in float32
    lowest = -0.4 * (1 + torch.finfo(torch.float32).eps)
    assert all(lowest <= r["reward/score"] <= 0 for r in steps)

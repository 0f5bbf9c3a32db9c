"""Adding a method or a reward source touches one place: a module of its own, written against the
public extension points only (`rloo.algorithms.add_method`: one table entry with its own settings,
and one step; a `RewardSource` named by reward_fn=module:name), runs through `rloo train` and
`rloo compare`, imported in the test or by the CLI (`--plugin`)."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from helpers.child_env import child_env
from helpers.tiny import TINY_STUDY, as_overrides, no_plots
from rloo.algorithms import STEPS
from rloo.cli import main
from rloo.config import METHOD_SPECS
from rloo.experiments.compare import report as compare_report

TOY_METHOD = '''
"""REINFORCE with a share of the batch's mean shaped reward as its baseline (a setting of its own), and
a k3-KL comparison variant."""
from pydantic import Field

from rloo.algorithms import add_method
from rloo.algorithms.base import StepResult, guarded_step, update_logprobs
from rloo.algorithms.common import Timer, require_scored, rollout_stats, sample_and_score, sequence_rewards
from rloo.config import MethodSpec
from rloo.config.method_settings import KLEstimatorSettings
from rloo.core.logprobs import sequence_logprobs
from rloo.core.losses import policy_gradient_loss


def toy_step(models, opt, prompts, cfg, gen):
    timer = Timer()
    roll, scores, ref_lp = sample_and_score(models, prompts, cfg, gen, timer)
    require_scored(scores, cfg.algorithm)
    rewards, kl = sequence_rewards(scores, roll, ref_lp, cfg)
    baseline = cfg.algorithm_settings.baseline_share * rewards.mean()
    advantages = rewards - baseline
    roll.record(advantage=advantages)
    logprobs = update_logprobs(models, roll, cfg)
    loss, stats = policy_gradient_loss(sequence_logprobs(logprobs, roll.completion_mask), advantages)
    norm, stepped = guarded_step(loss, list(models.policy.parameters()), opt, cfg.max_grad_norm)
    timer.lap("update")
    stats = {k: float(v) for k, v in stats.items()} | {"toy/baseline": baseline.item()}
    stats["toy/mean"] = rewards.mean().item()
    return StepResult(stats | rollout_stats(roll, scores, kl, rewards, norm, not stepped, timer), roll, rewards)


def short(prompts, completions):
    return [-len(c.split()) / 10 for c in completions]


class ToySettings(KLEstimatorSettings):  # the shared rollout's KL estimator, and a key of its own
    baseline_share: float = Field(default=1.0, ge=0, le=1, description="toy_pg: share of the batch mean subtracted.")


add_method(
    MethodSpec(
        "toy_pg",
        "batch-mean baseline",
        ToySettings,
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
    specs, steps, added = dict(METHOD_SPECS), dict(STEPS), []
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, text: str):
        (tmp_path / f"{name}.py").write_text(text)
        added.append(name)
        return importlib.import_module(name)

    yield write
    METHOD_SPECS.clear()
    METHOD_SPECS.update(specs)
    STEPS.clear()
    STEPS.update(steps)
    for name in added:
        sys.modules.pop(name, None)


def _records(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_method_from_its_own_module_trains_with_its_own_settings(plugin, tiny_model_dir, tmp_path, capsys):
    assert main(["train", "algorithm=toy_pg", f"policy={tiny_model_dir}"]) == 2  # unknown before it is added
    assert "algorithm: Input should be" in capsys.readouterr().err
    plugin("toy_method", TOY_METHOD)
    run = tmp_path / "train"
    args = ["train", "algorithm=toy_pg", f"policy={tiny_model_dir}", "reward_fn=toy_method:short", f"output_dir={run}"]
    assert main(args + TRAIN) == 0, capsys.readouterr().err
    steps = [r for r in _records(run) if "toy/baseline" in r]
    assert len(steps) == 2 and all(r["reward/score"] <= 0 for r in steps)
    assert all(r["toy/baseline"] == r["toy/mean"] for r in steps)  # baseline_share's default, 1
    # its settings are its own: another method's is refused in one line, and its own for another method
    assert main(args + TRAIN + ["algorithm_settings.gae_lambda=0.95"]) == 2
    assert "algorithm_settings.gae_lambda is a setting of ppo, not of algorithm=toy_pg" in capsys.readouterr().err
    assert main(args[:1] + args[2:] + TRAIN + ["algorithm_settings.baseline_share=0.5"]) == 2
    assert "algorithm_settings.baseline_share is a setting of toy_pg, not of algorithm=rloo" in capsys.readouterr().err


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


def _rloo(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The `rloo` command in a process of its own (the source this test imports), as a user runs it."""
    env = child_env()
    return subprocess.run(
        [sys.executable, "-m", "rloo.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def _methods_page_example() -> tuple[str, list[str]]:
    """docs/methods.md's plugin module and its `rloo train` arguments, read from the page itself."""
    page = (Path(__file__).parents[2] / "docs" / "methods.md").read_text()
    module = re.search(r"```python\n(# my_methods\.py.*?)```", page, re.S).group(1)
    line = re.search(r"rloo train +(--plugin .*?)\nrloo compare", page.replace("\\\n", " "), re.S).group(1)
    return module, line.split()


def test_the_plugin_example_of_the_methods_page_trains_as_written(tiny_model_dir, tmp_path):
    # fails on main: the page's step body was `...` (a module that returned no StepResult)
    module, args = _methods_page_example()
    (tmp_path / "my_methods.py").write_text(module)
    args = [f"policy={tiny_model_dir}" if a.startswith("policy=") else a for a in args]
    train = _rloo(["train", *args, "output_dir=run", *TRAIN], tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    steps = [r for r in _records(tmp_path / "run") if "loss/policy" in r]
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["algorithm"] == "my_pg" and saved["algorithm_settings"]["baseline_share"] == 0.5
    # shortness in [-0.4, 0] for at most max_new_tokens=4 words, up to float32 rounding of 4/10
    lowest = -0.4 * (1 + torch.finfo(torch.float32).eps)
    assert len(steps) == 2 and all(lowest <= r["reward/score"] <= 0 for r in steps)


def test_the_cli_loads_a_method_with_plugin_for_train_and_compare_quick(plugin, tiny_model_dir, tmp_path, monkeypatch):
    # fails on main: the CLI had no way to import the module that calls add_method (no --plugin)
    (tmp_path / "toy_method.py").write_text(TOY_METHOD)
    args = ["--plugin", "toy_method.py", "algorithm=toy_pg", f"policy={tiny_model_dir}"]
    args += ["reward_fn=toy_method.py:short"]  # the same file: loaded once
    train = _rloo(["train", *args, "algorithm_settings.baseline_share=0.5", "output_dir=run", *TRAIN], tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    steps = [r for r in _records(tmp_path / "run") if "toy/baseline" in r]
    assert len(steps) == 2 and all(r["toy/baseline"] == 0.5 * r["toy/mean"] for r in steps)
    # `rloo compare --quick` on the plugin's method and its variant, one task, no variance study, at the
    # suite's tiny study sizes (explicit settings win over --quick's; --quick's own run took 2 minutes
    # and is `make test-all`'s test_compare_quick_finishes_within_ten_minutes); the shared section holds
    # the plugin's own setting. In this process (the `plugin` fixture restores the method table after
    # it; the process of its own above showed --plugin as a user runs it), with the plots stubbed
    # (tests/integration/test_compare.py checks them)
    tiny = {k: v for k, v in TINY_STUDY.items() if not k.startswith("variance")}
    tiny["rl"] = {k: v for k, v in tiny["rl"].items() if k != "algorithm_settings"}
    quick = ["--quick", "--plugin", "toy_method", "methods=[toy_pg,toy_pg_k3]", "tasks=[summarize]"]
    quick += ["variance_batches=0", "rl.algorithm_settings.baseline_share=0.25", "output_dir=cmp"]
    assert "toy_pg" not in METHOD_SPECS and "toy_method" not in sys.modules  # --plugin must load it
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m rloo.cli` has the working folder first
    monkeypatch.setattr(compare_report, "plot_all", no_plots)
    try:
        assert main(["compare", *quick, *as_overrides(tiny)]) == 0
    finally:
        sys.modules.pop("toy_method", None)
    results = json.loads((tmp_path / "cmp" / "report" / "results.json").read_text())["summarize"]
    assert {"toy_pg", "toy_pg_k3"} <= set(results)
    for run, kl in (("toy_pg", "k1"), ("toy_pg_k3", "k3")):
        saved = yaml.safe_load((tmp_path / "cmp" / "runs" / "summarize" / "seed-0" / run / "config.yaml").read_text())
        assert saved["steps"] == TINY_STUDY["rl"]["steps"] and saved["algorithm"] == "toy_pg"
        assert saved["algorithm_settings"] == {"kl_estimator": kl, "baseline_share": 0.25}


@pytest.mark.parametrize(
    ("plugin", "says"),
    [
        ("missing.py", "plugin file 'missing.py' does not exist"),
        ("missing_module", "plugin 'missing_module': cannot import 'missing_module'"),
        ("raises.py", "plugin 'raises.py': running raises.py raised ValueError: no GPU here"),
        ("raises", "plugin 'raises': importing raises raised ValueError: no GPU here"),
        ("needs_dep", "plugin 'needs_dep': importing needs_dep raised ModuleNotFoundError: No module named 'nope_dep'"),
    ],
)
def test_a_plugin_that_is_missing_or_raises_is_one_line(plugin, says, tmp_path, monkeypatch, capsys):
    (tmp_path / "raises.py").write_text('raise ValueError("no GPU here")\n')
    (tmp_path / "needs_dep.py").write_text("import nope_dep\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for command in ("train", "compare", "pipeline"):
        assert (
            main([command, "--plugin", plugin, "policy=p"] if command == "train" else [command, "--plugin", plugin])
            == 2
        )
        err = capsys.readouterr().err
        assert err.startswith(f"rloo {command}: error: {says}") and err.count("\n") == 1, err
        sys.modules.pop(plugin, None)

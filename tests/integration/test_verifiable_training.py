"""RL with a checker through the shared loop: the new methods, a reward function's None, the
zero-variance filter, and `rloo pipeline` / `rloo compare` on the arithmetic task (tiny settings)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rloo import RLConfig, train
from rloo.cli import main
from rloo.config import METHOD_SPECS, CompareConfig
from rloo.errors import RlooError
from rloo.experiments.compare import compare

PROMPTS = ["post : job rent tl;dr :", "post : exam car tl;dr :", "post : loan sister tl;dr :"]


def _cfg(tiny_model_dir, out, **kw):
    base = dict(
        policy=str(tiny_model_dir),
        output_dir=out,
        steps=2,
        batch_size=2,
        k=4,
        max_new_tokens=5,
        lr=1e-3,
        warmup_steps=0,
        eval_every=None,
        save_every=None,
    )
    return RLConfig(**(base | kw))


def _half_unscored(prompts, completions):
    """Scores only completions of an even number of words; None ("could not score") otherwise."""
    return [float(len(c.split())) if len(c.split()) % 2 == 0 else None for c in completions]


def _constant_first_prompt(prompts, completions):
    """Every completion of the first prompt scores 1 (a zero-variance group); the others by length."""
    return [1.0 if p == PROMPTS[0] else float(len(c.split())) for p, c in zip(prompts, completions, strict=False)]


@pytest.mark.parametrize("algorithm", ["rloo", "grpo", "dr_grpo", "reinforce_pp"])
def test_group_methods_train_with_unscored_samples(algorithm, tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path / algorithm, algorithm=algorithm)
    hist = [h for h in train(cfg, prompts=PROMPTS, reward_fn=_half_unscored).history if "reward/score" in h]
    assert len(hist) == 2
    # NaN marks the unscored samples, yet every logged number is finite and some were unscored
    assert all(math.isfinite(v) for h in hist for v in h.values())
    assert 0.0 < sum(h["reward/unscored"] for h in hist) / 2 < 1.0


@pytest.mark.parametrize("algorithm", ["reinforce", "ppo", "raft"])
def test_methods_without_a_group_baseline_refuse_unscored_samples(algorithm, tiny_model_dir, tmp_path):
    head = {"value_model": "head"} if "value_model" in METHOD_SPECS[algorithm].settings.model_fields else {}
    cfg = _cfg(tiny_model_dir, tmp_path / algorithm, algorithm=algorithm, algo=head)
    with pytest.raises(RlooError, match="could not score .* no rule for that"):
        train(cfg, prompts=PROMPTS, reward_fn=lambda p, c: [None] * len(c))


@pytest.mark.parametrize("algorithm", ["rloo", "grpo", "dr_grpo", "reinforce_pp"])
def test_zero_variance_groups_are_dropped_and_counted(algorithm, tiny_model_dir, tmp_path):
    # batch_size = 3 covers the three prompts once per step; the first prompt's group is constant
    cfg = _cfg(
        tiny_model_dir, tmp_path / algorithm, algorithm=algorithm, batch_size=3, algo={"drop_zero_variance": True}
    )
    hist = [h for h in train(cfg, prompts=PROMPTS, reward_fn=_constant_first_prompt).history if "reward/score" in h]
    assert all(h["groups/dropped"] >= 1.0 for h in hist)
    assert all(h["groups/zero_variance"] >= 1 / 3 for h in hist)
    off = _cfg(tiny_model_dir, tmp_path / f"{algorithm}-off", algorithm=algorithm, batch_size=3)
    hist = [h for h in train(off, prompts=PROMPTS, reward_fn=_constant_first_prompt).history if "reward/score" in h]
    assert all(h.get("groups/dropped", 0.0) == 0.0 for h in hist)


def test_dropping_every_group_changes_nothing(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = _cfg(tiny_model_dir, tmp_path / "all", algorithm="dr_grpo", algo={"drop_zero_variance": True})
    result = train(cfg, prompts=PROMPTS, reward_fn=lambda p, c: [1.0] * len(c))
    a = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    b = AutoModelForCausalLM.from_pretrained(result.model_path).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(h["guard/skipped"] == 0.0 for h in result.history if "guard/skipped" in h)


TINY = dict(
    sft={
        "num_examples": 64,
        "epochs": 1,
        "batch_size": 32,
        "arch": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
    },
    rl={
        "steps": 2,
        "batch_size": 2,
        "k": 4,
        "max_new_tokens": 6,
        "eval_every": 1,
        "eval_prompts": 8,
        "save_every": None,
    },
    eval={"num_prompts": 8, "batch_size": 8, "pass_samples": 8},
)


def test_pipeline_on_arithmetic_skips_the_reward_model_and_reports_pass_at_k(tmp_path, capsys):
    out = tmp_path / "p"
    args = [
        "pipeline",
        "task=arithmetic",
        f"output_dir={out}",
        "sft.num_examples=64",
        "sft.epochs=1",
        "sft.arch.hidden_size=32",
        "sft.arch.num_layers=1",
        "sft.arch.num_heads=2",
        "sft.arch.intermediate_size=64",
        "rl.steps=2",
        "rl.batch_size=2",
        "rl.eval_every=1",
        "rl.eval_prompts=8",
        "eval.num_prompts=8",
        "eval.pass_samples=8",
    ]
    assert main(args) == 0
    assert not (out / "reward").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reward_model"] is None
    pol = summary["eval"]["policy"]["pass"]
    assert set(pol["pass_at_k"]) == {"1", "2", "4", "8"} and pol["problems"] == 8 and pol["n"] == 8
    assert all(0.0 <= v["mean"] <= 1.0 for v in pol["pass_at_k"].values())
    assert "pass@1" in summary["difference"] and "ci95" in summary["difference"]["pass@1"]
    assert "pass@1: SFT" in capsys.readouterr().err  # `say` writes to stderr
    # the arithmetic defaults (no reward model, the checker) reached the RL stage
    rl = (out / "rl" / "config.yaml").read_text()
    assert "rloo.tasks.arithmetic:reward" in rl and "reward_model: null" in rl


def test_compare_on_arithmetic_reports_pass_at_k(tmp_path):
    cfg = CompareConfig(
        methods=["rloo", "dr_grpo", "reinforce_pp"],
        tasks=["arithmetic"],
        seeds=[0],
        output_dir=tmp_path / "c",
        variance_batches=0,
        **TINY,
    )
    report = compare(cfg)
    text = (report / "report.md").read_text()
    assert "## pass@k on the tasks scored by a checker" in text
    for row in ("| sft |", "| rloo |", "| dr_grpo |", "| reinforce_pp |"):
        assert text.count(row) >= 2, row
    results = json.loads((report / "results.json").read_text())["arithmetic"]
    assert set(results["dr_grpo"][0]["pass"]["pass_at_k"]) == {"1", "2", "4", "8"}
    assert not (tmp_path / "c" / "runs" / "arithmetic" / "seed-0" / "reward").exists()


def test_compare_refuses_dpo_on_a_checker_task(capsys):
    assert main(["compare", "tasks=[arithmetic]", "methods=[rloo,dpo]"]) == 2
    err = capsys.readouterr().err
    assert "dpo" in err and len(err.strip().splitlines()) == 1

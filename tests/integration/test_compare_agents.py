"""`rloo compare` on the tasks played as episodes (calculator, guess; docs/compare.md): the cells judge
by the episode evaluation (success rate, turns, tool calls, reward per episode), the report's tables
show those and the differences from rloo paired by seed, and the studies it cannot run are refused
in one line before anything is written."""

from __future__ import annotations

import json

import pytest

from rloo.cli import main

TINY_ARGS = [
    "sft.num_examples=128",
    "sft.epochs=2",
    "sft.batch_size=32",
    "sft.arch.hidden_size=32",
    "sft.arch.num_layers=1",
    "sft.arch.num_heads=2",
    "sft.arch.intermediate_size=64",
    "rl.steps=3",
    "rl.batch_size=2",
    "rl.k=4",
    "rl.lr=3e-4",
    "rl.warmup_steps=0",
    "rl.eval_every=null",
    "eval.num_prompts=8",
    "eval.pass_samples=8",
]


def test_compare_quick_on_calculator_reports_success_rates_paired_by_seed(tmp_path):
    out = tmp_path / "c"
    args = ["compare", "--quick", "tasks=[calculator]", "methods=[rloo,grpo]", f"output_dir={out}", *TINY_ARGS]
    assert main(args) == 0
    cell = out / "runs" / "calculator" / "seed-0"
    assert (cell / "sft" / "model").is_dir() and not (cell / "reward").exists()  # the environment is the reward
    assert not (cell / "gradient_variance.json").exists()
    results = json.loads((out / "report" / "results.json").read_text())["calculator"]
    for name in ("sft", "rloo", "grpo"):
        r = results[name][0]
        assert 0 <= r["success_rate"] <= 1 and r["n"] == 8, r
        assert 1 <= r["turns"] <= 3 and 0 <= r["tool_calls"] <= r["turns"] and 0 <= r["reward"] <= 1, r
        assert "win_rate" not in r
    text = (out / "report" / "report.md").read_text()
    head = "| method | success rate | turns | tool calls | reward / episode | truncated |"
    assert head in text and "win vs refs" not in text, text
    assert "| method | success rate − rloo | turns − rloo | tool calls − rloo | reward / episode − rloo |" in text
    # one seed: the success rate's difference is paired over the prompts (marked *); the turns' over seeds
    diff = results["grpo"][0]["success_rate"] - results["rloo"][0]["success_rate"]
    turns = results["grpo"][0]["turns"] - results["rloo"][0]["turns"]
    assert f"| grpo | {diff:+.3f} ± " in text and f"* | {turns:+.3f} |" in text, text
    assert (out / "report" / "training_curves.png").exists()


@pytest.mark.parametrize(
    "tasks, methods, says",
    [
        ("[calculator]", "[rloo,ppo,dpo]", ["ppo, dpo do not train on episodes", "ppo: its value model and GAE"]),
        ("[guess,summarize]", "[rloo]", ["summarize (judged by win rate) and guess", "two `rloo compare` studies"]),
    ],
)
def test_compare_refuses_what_episodes_cannot_run_in_one_line(tmp_path, capsys, tasks, methods, says):
    out = tmp_path / "c"
    rc = main(["compare", "--quick", f"tasks={tasks}", f"methods={methods}", f"output_dir={out}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert all(s in err for s in says), err
    assert not out.exists()


def test_episode_differences_pair_by_seed():
    """Over several seeds the differences are paired by seed (not by position) with the t-interval;
    grpo's success rate is rloo's + 0.1 on every seed, its turns rloo's - 1."""
    from rloo.config import CompareConfig
    from rloo.experiments.compare.episodes import paired_table

    cfg = CompareConfig(methods=["rloo", "grpo"], tasks=["guess"], seeds=[0, 1, 2])

    def run(seed: int, success: float, turns: float) -> dict:
        return {"seed": seed, "success_rate": success, "turns": turns, "tool_calls": 0.0, "reward": success}

    rloo = [run(0, 0.2, 6), run(1, 0.5, 5), run(2, 0.8, 4)]
    grpo = [run(2, 0.9, 3), run(0, 0.3, 5), run(1, 0.6, 4)]
    text = paired_table(cfg, {"guess": {"rloo": rloo, "grpo": grpo}}, "guess")
    assert "| grpo | +0.100 ± 0.000 | -1.000 ± 0.000 | +0.000 ± 0.000 | +0.100 ± 0.000 | 3/3 |" in text, text

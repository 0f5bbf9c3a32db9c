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
    assert json.loads((cell / "cuts.json").read_text())["prompts"]["of"] == 8  # the evaluation's prompts, counted
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


def test_a_cells_episode_evaluation_counts_says_and_records_the_prompts_it_cuts(tmp_path, capsys):
    """A cell's episode judge counts its prompts as `rloo eval env=` does (in the chat template's
    frame): max_prompt_tokens below every prompt is refused in one line before any policy is judged,
    with nothing recorded; with max_cut_share=1 it is said and recorded in the cell's cuts.json,
    which the study folder's layout names (fails on the code before it: compare cut them without a
    word, no cuts.json, no refusal)."""
    from conftest import TINY
    from rloo.config import CompareConfig, PipelineConfig
    from rloo.errors import RlooError
    from rloo.experiments.compare.episodes import episode_judge
    from rloo.modeling.loading import build_llama
    from rloo.runtime.runfolder.layout import FILE, LAYOUTS, _match
    from rloo.tasks import get_task
    from rloo.tasks.tokenizer import build_tokenizer
    from rloo.training.common import env_spec

    task = get_task("calculator")
    tok, cell = build_tokenizer(task), tmp_path / "runs" / "calculator" / "seed-0"
    build_llama(TINY, tok, seed=0).save_pretrained(cell / "sft" / "model")
    tok.save_pretrained(cell / "sft" / "model")
    examples = task.examples("eval", 3, seed=0)

    def judge(limit: int, share: float):
        cfg = CompareConfig(tasks=["calculator"], methods=["rloo"], max_prompt_tokens=limit, max_cut_share=share)
        pipe = PipelineConfig(task="calculator", output_dir=cell, max_prompt_tokens=limit, max_cut_share=share)
        rl = pipe.stage_configs()[2]
        frame = env_spec(rl, tok).prompt_frame  # the tokens an episode's start writes around its prompt
        starts = [len(tok(e.prompt, add_special_tokens=False)["input_ids"]) + frame for e in examples]
        return lambda: episode_judge(cfg, rl, task, examples, cell, 0), starts

    _, starts = judge(64, 0.25)
    limit = min(starts) - 1
    refused, _ = judge(limit, 0.25)
    with pytest.raises(RlooError, match=rf"^eval: 3 of 3 prompts \(100%\) are longer than max_prompt_tokens={limit} "):
        refused()
    assert not (cell / "cuts.json").exists()
    capsys.readouterr()
    allowed, _ = judge(limit, 1.0)
    allowed()
    said = f"eval: cut to the length limits: 3 of 3 prompts (100%, longest {max(starts)} tokens) keep their last "
    assert said + f"max_prompt_tokens={limit} tokens" in capsys.readouterr().err
    record = {"cut": 3, "of": 3, "longest": max(starts), "max_prompt_tokens": limit}
    assert json.loads((cell / "cuts.json").read_text()) == {"prompts": record}
    assert _match("cuts.json", LAYOUTS["compare"]["runs"]["*"]["seed-*"]) == FILE  # --overwrite may delete it


def test_a_cells_text_evaluation_counts_says_and_records_the_prompts_it_cuts(tmp_path, capsys):
    """The text tasks' judge (rloo.experiments.compare.eval.text_judge) counts its prompts as the episode
    judge above does: refused in one line past max_cut_share, else said and recorded in cuts.json
    (fails on the code before it: it cut them to max_prompt_tokens without a word)."""
    from conftest import TINY
    from rloo.config import CompareConfig
    from rloo.errors import RlooError
    from rloo.experiments.compare.eval import text_judge
    from rloo.modeling.loading import build_llama
    from rloo.tasks import get_task
    from rloo.tasks.tokenizer import build_tokenizer

    task = get_task("arithmetic")  # a checker task: no reward model to build
    tok, cell = build_tokenizer(task), tmp_path / "runs" / "arithmetic" / "seed-0"
    build_llama(TINY, tok, seed=0).save_pretrained(cell / "sft" / "model")
    tok.save_pretrained(cell / "sft" / "model")
    examples = task.examples("eval", 3, seed=0)
    starts = [len(tok(e.prompt)["input_ids"]) for e in examples]
    limit = min(starts) - 1

    def judge(share: float):
        cfg = CompareConfig(tasks=["arithmetic"], methods=["rloo"], max_prompt_tokens=limit, max_cut_share=share)
        return text_judge(cfg, task, examples, cell, 0)

    with pytest.raises(RlooError, match=rf"^eval: 3 of 3 prompts \(100%\) are longer than max_prompt_tokens={limit} "):
        judge(0.25)
    assert not (cell / "cuts.json").exists()
    capsys.readouterr()
    judge(1.0)
    said = f"eval: cut to the length limits: 3 of 3 prompts (100%, longest {max(starts)} tokens) keep their last "
    assert said + f"max_prompt_tokens={limit} tokens" in capsys.readouterr().err
    record = {"cut": 3, "of": 3, "longest": max(starts), "max_prompt_tokens": limit}
    assert json.loads((cell / "cuts.json").read_text()) == {"prompts": record}

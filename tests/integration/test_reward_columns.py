"""A GSM8K-shaped JSONL (question, answer) with a checker that reads `answer`, as a TRL user writes
it (`def accuracy(prompts, completions, answer, **kwargs)`): the answer column reaches rl.reward_fn,
eval.judge and the API's reward_fn, one value per completion in the rollout's order, through
`rloo train`, `rloo eval`, `rloo pipeline` and `rloo.train`. Tiny model, few steps."""

from __future__ import annotations

import json
import random
import textwrap

import pytest

from rloo import RLConfig, train
from rloo.cli import main
from rloo.config import DatasetSettings

WORDS = ["job", "rent", "exam", "car", "loan", "sister", "dog", "boss"]

CHECKER = textwrap.dedent("""
    import json, os

    def _log(who, prompts, answer):
        with open(os.environ["COLUMNS_LOG"], "a") as f:
            f.write(json.dumps({"who": who, "prompts": prompts, "answer": answer}) + "\\n")

    def accuracy(prompts, completions, answer, **kwargs):
        _log("reward", prompts, answer)
        return [float(a in c.split()) for c, a in zip(completions, answer)]

    def judge(prompts, completions, answer):
        _log("judge", prompts, answer)
        return [float(a in c.split()) for c, a in zip(completions, answer)]
""")


@pytest.fixture
def gsm(tmp_path, monkeypatch):
    """data.jsonl with GSM8K's columns (question, answer), checker.py, and COLUMNS_LOG set."""
    rng = random.Random(0)
    rows = []
    for i in range(40):
        a, b = rng.sample(WORDS, 2)
        rows.append({"question": f"post : {a} {b} {WORDS[i % 8]} tl;dr :", "answer": rng.choice(WORDS)})
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "checker.py").write_text(CHECKER)
    monkeypatch.setenv("COLUMNS_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.chdir(tmp_path)
    return tmp_path, {r["question"]: r["answer"] for r in rows}


def _calls(root, who: str) -> list[dict]:
    lines = (root / "calls.jsonl").read_text().splitlines() if (root / "calls.jsonl").exists() else []
    return [c for c in map(json.loads, lines) if c["who"] == who]


def _check_calls(calls: list[dict], answers: dict[str, str], steps: int = 0) -> None:
    """Every call saw each prompt's own row's answer, one per completion; the `steps` training calls
    (batch_size x k = 2 x 3 completions, the rollout's order: each prompt k times in a row) among them."""
    assert calls
    for c in calls:
        assert [answers[p] for p in c["prompts"]] == c["answer"]
    rollouts = [c["prompts"] for c in calls if len(c["prompts"]) == 6]
    assert sum(p[0] == p[1] == p[2] != p[3] and p[3] == p[4] == p[5] for p in rollouts) >= steps, rollouts


DATA = ["dataset.path=data.jsonl", "dataset.columns.prompt=question", "dataset.columns.completion=answer"]
RL = ["steps=2", "batch_size=2", "k=3", "max_new_tokens=4", "eval_every=1", "eval_prompts=4", "save_every=null"]


@pytest.mark.slow  # ~35 s on 2 shared cores
def test_rloo_train_and_eval_pass_the_answer_column(gsm, tiny_model_dir, capsys):
    root, answers = gsm
    args = ["train", f"policy={tiny_model_dir}", "reward_fn=checker.py:accuracy", "eval.judge=checker.py:judge"]
    rc = main([*args, *DATA, *RL, "output_dir=rl"])
    assert rc == 0, capsys.readouterr().err
    _check_calls(_calls(root, "reward"), answers, steps=2)  # the steps, and eval/reward's scores
    _check_calls(_calls(root, "judge"), answers)  # periodic evals: samples and references
    (root / "calls.jsonl").unlink()
    rc = main(["eval", "policy=rl/model", "judge=checker.py:judge", *DATA, "num_prompts=4", "output_dir=ev"])
    assert rc == 0, capsys.readouterr().err
    _check_calls(_calls(root, "judge"), answers)


@pytest.mark.slow  # ~20 s
def test_rloo_pipeline_passes_the_answer_column(gsm, tiny_model_dir, capsys):
    root, answers = gsm
    rc = main(
        [
            "pipeline",
            f"model={tiny_model_dir}",
            *DATA,
            "rl.reward_fn=checker.py:accuracy",
            "eval.judge=checker.py:judge",
            "sft.epochs=1",
            "sft.batch_size=8",
            *[f"rl.{a}" for a in RL],
            "eval.num_prompts=4",
            "output_dir=p",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    _check_calls(_calls(root, "reward"), answers, steps=2)
    _check_calls(_calls(root, "judge"), answers)
    assert json.loads((root / "p" / "summary.json").read_text())["judge"] == "checker.py:judge"


def test_the_api_reward_fn_gets_the_answer_column_from_a_dataset_and_from_rows(gsm, tiny_model_dir):
    root, answers = gsm
    seen: list[tuple[list[str], list[str]]] = []

    def accuracy(prompts, completions, answer):
        seen.append((list(prompts), list(answer)))
        return [float(a in c.split()) for c, a in zip(completions, answer, strict=True)]

    base = dict(policy=str(tiny_model_dir), steps=2, batch_size=2, k=3, max_new_tokens=4, save_every=None)
    dataset = DatasetSettings(path="data.jsonl", columns={"prompt": "question"})
    train(RLConfig(**base, eval_every=None, output_dir="api", dataset=dataset), reward_fn=accuracy)
    rows = [{"prompt": q, "answer": a} for q, a in list(answers.items())[:6]]
    train(RLConfig(**base, eval_every=None, output_dir="api-rows"), prompts=rows, reward_fn=accuracy)
    # the two runs' steps (and the first run's final evaluation, which reports eval/reward)
    assert sum(len(prompts) == 6 for prompts, _ in seen) >= 4
    for prompts, got in seen:
        assert got == [answers[p] for p in prompts]


@pytest.mark.slow  # a producer process: ~15 s
def test_the_columns_cross_to_the_rollout_producer_and_back(gsm, tiny_model_dir):
    """rl.max_staleness=1: the prompt stream is copied into the producer process and its rollouts
    come back pickled; the trainer scores them (a local function cannot be sent), with the columns."""
    root, answers = gsm
    seen: list[tuple[list[str], list[str]]] = []

    def accuracy(prompts, completions, answer):
        seen.append((list(prompts), list(answer)))
        return [float(a in c.split()) for c, a in zip(completions, answer, strict=True)]

    rows = [{"prompt": q, "answer": a} for q, a in list(answers.items())[:6]]
    cfg = RLConfig(
        policy=str(tiny_model_dir), steps=3, batch_size=2, k=3, max_new_tokens=4, save_every=None,
        eval_every=None, output_dir="async", max_staleness=1,
    )  # fmt: skip
    train(cfg, prompts=rows, reward_fn=accuracy)
    assert sum(len(prompts) == 6 for prompts, _ in seen) == 3  # the 3 steps (and the preflight's call)
    for prompts, got in seen:
        assert got == [answers[p] for p in prompts]

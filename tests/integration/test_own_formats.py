"""Your own data in the formats people have, through `rloo pipeline` in one command each: a
verifiable-reward run (SFT -> RL with a checker from a file -> pass@k), and TRL's conversational
formats (message lists, a `messages` column, chosen/rejected dialogues) rendered by a chat template.
Tiny locally built models and BPE tokenizers, a few steps."""

from __future__ import annotations

import json
import random

import pytest
from tests.integration.test_own_data import _bpe_tokenizer

from rloo.cli import main

CHECKER = """
import re

def correct(prompts, completions):
    # 1 when the first number of the response is the sum of the prompt's two numbers; None: no number
    with open("calls.txt", "a") as f:
        f.write(f"{len(completions)}\\n")
    out = []
    for p, c in zip(prompts, completions):
        a, b = map(int, re.findall(r"\\d+", p)[-2:])
        m = re.match(r"\\s*(\\d+)", c)
        out.append(None if m is None else float(int(m.group(1)) == a + b))
    return out
"""


def _sums(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append((f"what is {a} plus {b}? answer:", f" {a + b}"))
    return rows


def _neox(tok, path):
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(
        GPTNeoXConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=len(tok),
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.eos_token_id,
            max_position_embeddings=256,
        )
    )
    model.save_pretrained(path)
    tok.save_pretrained(path)


@pytest.fixture(scope="module")
def sums(tmp_path_factory):
    """models/policy (GPT-NeoX, BPE), data/sums.jsonl (prompt, completion), check.py:correct."""
    root = tmp_path_factory.mktemp("sums")
    rows = _sums(24)
    _neox(_bpe_tokenizer([p + c for p, c in rows]), root / "models" / "policy")
    (root / "data").mkdir()
    with open(root / "data" / "sums.jsonl", "w") as f:
        for p, c in rows:
            f.write(json.dumps({"prompt": p, "completion": c}) + "\n")
    (root / "check.py").write_text(CHECKER)
    return root


RL_TINY = [
    "sft.epochs=1",
    "sft.batch_size=8",
    "rl.steps=2",
    "rl.batch_size=2",
    "rl.k=2",
    "rl.max_new_tokens=4",
    "rl.eval_every=null",
    "rl.save_every=null",
    "eval.num_prompts=4",
    "max_prompt_tokens=32",
    "max_response_tokens=4",
]


def test_pipeline_with_a_checker_reward_from_a_file(sums, monkeypatch, capsys):
    """rl.reward_fn from a file is the reward (no reward-model stage), the judge, and with
    eval.checker the evaluation reports pass@k of the SFT and RL policies on held-out prompts."""
    monkeypatch.chdir(sums)
    rc = main(
        [
            "pipeline",
            "model=models/policy",
            "dataset.path=data/sums.jsonl",
            "rl.reward_fn=check.py:correct",
            "eval.checker=check.py:correct",
            "eval.pass_samples=8",
            "output_dir=runs/check",
            *RL_TINY,
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    out = sums / "runs" / "check"
    assert "[2/4] no reward model: rl.reward_fn is the reward (check.py:correct)" in err
    assert not (out / "reward").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["judge"] == "check.py:correct" and summary["reward_model"] is None
    for name in ("policy", "baseline"):
        passes = summary["eval"][name]["pass"]
        assert passes["n"] == 8 and passes["problems"] == 4 and set(passes["pass_at_k"]) == {"1", "2", "4", "8"}
    assert set(summary["difference"]) >= {"pass@1", "pass@8"}
    assert "pass@k on 4 held-out problems" in (out / "eval" / "report.md").read_text()
    calls = [int(n) for n in (sums / "calls.txt").read_text().split()]
    assert calls.count(2 * 2) >= 2, calls  # each RL step scored its batch (2 prompts x k=2) with the checker


def test_pipeline_refuses_a_missing_reward_file_before_training(sums, monkeypatch, capsys):
    monkeypatch.chdir(sums)
    rc = main(["pipeline", "model=models/policy", "dataset.path=data/sums.jsonl", "rl.reward_fn=nope.py:correct"])
    err = capsys.readouterr().err
    assert rc == 2 and "nope.py" in err and "Traceback" not in err, err
    assert not (sums / "runs" / "pipeline").exists()

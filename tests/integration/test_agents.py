"""`env=`: training on multi-turn episodes from the command line, built-in and a user's class from a
file, and the one-line errors of a broken environment (docs/agents.md)."""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import TINY
from rloo.cli import main
from rloo.config.methods import capable
from rloo.modeling.loading import build_llama
from rloo.tasks import get_task
from rloo.tasks.tokenizer import build_tokenizer

TINY_ARGS = [
    "steps=2",
    "batch_size=2",
    "k=2",
    "warmup_steps=0",
    "eval_every=null",
    "save_every=null",
    "env_settings.max_turns=2",
    "env_settings.max_turn_tokens=10",
    "env_settings.max_total_tokens=20",
    "seed=0",
]


@pytest.fixture(scope="module")
def calculator_model(tmp_path_factory):
    """A fresh tiny Llama with the calculator task's word tokenizer."""
    path = tmp_path_factory.mktemp("calc") / "model"
    tok = build_tokenizer(get_task("calculator"))
    build_llama(TINY, tok, seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _train(model, tmp_path, *extra):
    return main(["train", f"policy={model}", f"output_dir={tmp_path / 'run'}", "task=calculator", *TINY_ARGS, *extra])


def test_builtin_calculator_env_trains(calculator_model, tmp_path, capsys):
    rc = _train(calculator_model, tmp_path, "env=calculator")
    assert rc == 0, capsys.readouterr().err
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "env/turns" in r]
    assert len(steps) == 2 and all(1 <= r["env/turns"] <= 2 for r in steps)
    assert all("env/tool_calls" in r and "env/observation_tokens" in r for r in steps)


MYENV = """
from rloo.envs import Step

class MyEnv:
    '''Ends after the first turn; reward 1 when the turn says "ans".'''
    stop_ids = ()

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def reset(self, prompt):
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def step(self, turn):
        words = self.tokenizer.decode(turn, skip_special_tokens=True).split()
        return Step([], float("ans" in words), True)

class Broken(MyEnv):
    def step(self, turn):
        raise ValueError("the board is on fire")

class WrongType(MyEnv):
    def step(self, turn):
        return {"observation": [], "reward": 1.0, "done": True}
"""


def test_user_env_from_a_file(calculator_model, tmp_path, capsys):
    (tmp_path / "myenv.py").write_text(textwrap.dedent(MYENV))
    rc = _train(calculator_model, tmp_path, f"env={tmp_path / 'myenv.py'}:MyEnv")
    assert rc == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        ("Broken", "rloo train: error: environment Broken.step raised ValueError: the board is on fire"),
        ("WrongType", "rloo train: error: environment WrongType.step returned dict, expected rloo.envs.Step"),
        ("Missing", "has no callable 'Missing'"),
    ],
)
def test_broken_user_env_is_one_line_and_writes_nothing(calculator_model, tmp_path, capsys, cls, message):
    (tmp_path / "myenv.py").write_text(textwrap.dedent(MYENV))
    rc = _train(calculator_model, tmp_path, f"env={tmp_path / 'myenv.py'}:{cls}")
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "run").exists()  # found before the run folder is made: nothing to lose


def test_env_with_a_value_model_method_is_one_line(calculator_model, tmp_path, capsys):
    rc = _train(calculator_model, tmp_path, "env=calculator", "algorithm=ppo")
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "raft only" in err and "value model" in err, err


@pytest.mark.parametrize("algorithm", capable("multi_turn"))
def test_pipeline_on_the_guess_game_plays_episodes_before_and_after(tmp_path, capsys, algorithm):
    """`rloo pipeline task=guess`, tiny: SFT on the game's traces, RL (each method that trains on
    episodes) on games, both policies play the same held-out games; the summary has success rate,
    turns and reward per episode."""
    out = tmp_path / "p"
    arch = ["sft.arch.hidden_size=32", "sft.arch.num_layers=1", "sft.arch.num_heads=2", "sft.arch.intermediate_size=64"]
    rl = ["rl.steps=2", "rl.batch_size=2", "rl.k=2", "rl.warmup_steps=0", "rl.save_every=null"]
    rl.append(f"rl.algorithm={algorithm}")
    args = ["pipeline", "task=guess", f"output_dir={out}", "sft.num_examples=64", "sft.epochs=1", *arch, *rl]
    assert main([*args, "eval.num_prompts=4", "eval.pass_samples=8", "report_to=none"]) == 0
    assert not (out / "reward").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env"] == "guess" and summary["algorithm"] == algorithm
    for name in ("baseline", "policy"):
        ev = summary["eval"][name]
        assert 0 <= ev["pass_at_1"] <= 1 and 1 <= ev["turns"] <= 8 and 0 <= ev["reward"] <= 1
        assert ev["tool_calls"] == 0 and ev["no_tool_share"] == 1
    assert "success rate (pass@1): SFT" in capsys.readouterr().err

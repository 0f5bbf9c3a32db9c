"""`env=`: training on multi-turn episodes from the command line, built-in and a user's class from a
file, their periodic evaluation on held-out episodes, and the one-line errors of a broken environment
(docs/agents.md)."""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import TINY
from rloo import RLConfig, train
from rloo.cli import main
from rloo.config.methods import capable
from rloo.eval.episodes import evaluate_episodes
from rloo.modeling.loading import build_llama, load_policy
from rloo.tasks import get_task
from rloo.tasks.tokenizer import build_tokenizer
from rloo.training.agents import success_threshold
from rloo.training.common import env_spec

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


VARY_ENV = """
from rloo.envs import Step

class VaryEnv:
    '''Episodes whose turns, tool calls and reward follow the sampled ids: a first turn whose ids sum
    to a multiple of 3 ends the episode, any other is a tool call answered with "out 3"; the reward is 1
    when the last turn's ids sum to an even number.'''
    stop_ids = ()

    def __init__(self, tokenizer):
        self.tokenizer, self.tool_calls = tokenizer, 0

    def reset(self, prompt):
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def step(self, turn):
        if self.tool_calls == 0 and sum(turn) % 3:
            self.tool_calls = 1
            return Step(self.tokenizer("out 3", add_special_tokens=False)["input_ids"], 0.0, False)
        return Step([], float(sum(turn) % 2 == 0), True)
"""
EVAL_ARGS = [a for a in TINY_ARGS if not a.startswith("eval_every=")]


@pytest.mark.parametrize("env", ["calculator", "VaryEnv"])
def test_train_env_evaluates_episodes_every_eval_every_steps(calculator_model, tmp_path, capsys, env):
    """`rloo train env=... eval_every=1 steps=2`: eval/success, eval/tool_calls, eval/turns, eval/reward and
    eval/truncated at steps 0 and 1 (periodic) and 2 (final), one printed line each; at step 0 (the
    starting policy) and step 2 (the saved model) they are `evaluate_episodes`' numbers for that policy
    on the task's held-out prompts, one episode each, seed + 1, eval's temperature."""
    if env == "VaryEnv":
        (tmp_path / "myenv.py").write_text(textwrap.dedent(VARY_ENV))
        env = f"{tmp_path / 'myenv.py'}:VaryEnv"
    out = tmp_path / "run"
    argv = ["train", f"policy={calculator_model}", f"output_dir={out}", "task=calculator", *EVAL_ARGS, f"env={env}"]
    argv += ["eval_every=1", "eval_prompts=6", "eval.batch_size=4", "dtype=float32", "report_to=none"]
    rc = main([*argv, "lr=0.05"])  # moves the tiny policy: the check at step 2 reads trained weights
    err = capsys.readouterr().err
    assert rc == 0, err
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r for r in recs if "eval/success" in r}
    assert sorted(evals) == [0, 1, 2], recs
    assert len([x for x in err.splitlines() if x.startswith("eval at step")]) == 3, err
    for r in evals.values():
        assert 0 <= r["eval/success"] <= 1 and 1 <= r["eval/turns"] <= 2 and 0 <= r["eval/tool_calls"] <= 1
        assert 0 <= r["eval/reward"] <= 1 and 0 <= r["eval/truncated"] <= 1
    cfg = RLConfig(policy=str(calculator_model), env=env, env_settings=_limits(EVAL_ARGS))
    prompts = [e.prompt for e in get_task("calculator").examples("eval", 6, seed=0)]
    for step, model in ((0, calculator_model), (2, out / "model")):
        policy, tok = load_policy(str(model))
        res = evaluate_episodes(
            policy,
            tok,
            env_spec(cfg, tok),
            prompts,
            cfg.eval_sampling,
            n=1,
            seed=1,
            batch_size=4,
            threshold=success_threshold(env),
        )
        want = (res.pass_at_1, res.tool_calls, res.turns, res.reward, res.truncated)
        keys = ("eval/success", "eval/tool_calls", "eval/turns", "eval/reward", "eval/truncated")
        assert tuple(evals[step][k] for k in keys) == want, (step, evals[step], want)


def _limits(args: list[str]) -> dict:
    return {a.split("=")[0].split(".")[1]: int(a.split("=")[1]) for a in args if a.startswith("env_settings.")}


def test_train_env_with_prompts_of_its_own_says_the_periodic_eval_is_off(calculator_model, tmp_path, capsys):
    """rloo.train(cfg, prompts=...) with env= has no held-out prompts: one line says so, no eval/ rows."""
    (tmp_path / "myenv.py").write_text(textwrap.dedent(VARY_ENV))
    cfg = RLConfig(
        policy=str(calculator_model),
        output_dir=tmp_path / "run",
        env=f"{tmp_path / 'myenv.py'}:VaryEnv",
        env_settings=_limits(EVAL_ARGS),
        steps=1,
        batch_size=2,
        k=2,
        eval_every=1,
        save_every=None,
        report_to="none",
    )
    train(cfg, prompts=["q : 1 + 2 =", "q : 3 * 4 ="])
    err = capsys.readouterr().err
    assert len([x for x in err.splitlines() if "no periodic evaluation of episodes" in x]) == 1, err
    assert "eval at step" not in err
    assert not any("eval/" in x for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())

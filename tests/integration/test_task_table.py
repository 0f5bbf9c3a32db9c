"""The task table (rloo.config.tasks) is the one place a task is declared: a toy task added with one
`add_task` entry is built by get_task, chosen by every config that takes a task, played as episodes
through env_factory when it has an environment, and trained end to end by `rloo pipeline`."""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

import pytest

import rloo
from rloo.cli import main
from rloo.config import TASK_SPECS, CompareConfig, PipelineConfig, RLConfig, SFTConfig, TaskSpec, add_task
from rloo.config.tasks import checker_tasks, episode_tasks
from rloo.envs import Step, env_factory
from rloo.errors import ConfigError
from rloo.tasks import get_task, has_checker, plays_episodes, tasks
from rloo.tasks.base import SyntheticTask

SRC = Path(rloo.__file__).parent
WORDS = ("a", "b", "c", "ans")


class ToyTask(SyntheticTask):
    """Repeat the prompt's letter: `q b` -> `ans b` (1 solved, 0 not)."""

    name = "toy"
    max_prompt_words = 2
    max_response_words = 2

    def sample_prompt(self, rng: random.Random, held_out: bool) -> str:
        return "q " + ("c" if held_out else rng.choice("ab"))

    def sample_reference(self, prompt: str, rng: random.Random) -> str:
        return f"ans {prompt.split()[-1] if rng.random() < 0.5 else 'a'}"

    def gold_score(self, prompt: str, response: str) -> float:
        return float(response.split() == ["ans", prompt.split()[-1]])

    def ideal_response(self, prompt: str) -> str:
        return f"ans {prompt.split()[-1]}"

    def words(self) -> list[str]:
        return ["q", *WORDS]


def toy_reward(prompts: list[str], completions: list[str]) -> list[float]:
    """The toy task's checker as a reward_fn (named by its TaskSpec)."""
    return [ToyTask().gold_score(p, c) for p, c in zip(prompts, completions, strict=True)]


class ToyEnv:
    """One turn: the checker's score of it, done."""

    def __init__(self, tokenizer, timeout_s: float = 1.0, end_ids: frozenset[int] | None = None):
        self.tokenizer, self.prompt = tokenizer, ""

    def reset(self, prompt: str) -> list[int]:
        self.prompt = prompt
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def step(self, turn: list[int]) -> Step:
        text = self.tokenizer.decode(turn, skip_special_tokens=True)
        return Step(observation=[], reward=ToyTask().gold_score(self.prompt, text), done=True)


TOY = TaskSpec(
    "toy",
    "repeat a letter",
    ToyTask,
    judge="checker",
    checker=f"{__name__}:toy_reward",
    pipeline={"max_response_tokens": 4, "rl": {"k": 2, "beta": 0.0}},
)


@pytest.fixture
def toy():
    """The toy task in the table (one entry), and the table as it was afterwards."""
    before = dict(TASK_SPECS)
    add_task(TOY)
    yield TOY
    TASK_SPECS.clear()
    TASK_SPECS.update(before)


def test_a_task_added_in_one_place_is_built_and_chosen_by_every_config(toy):
    assert isinstance(get_task("toy"), ToyTask) and "toy" in tasks()
    assert has_checker(get_task("toy")) and not plays_episodes(get_task("toy"))
    assert checker_tasks()["toy"] == toy.checker and "toy" not in episode_tasks()
    pipe = PipelineConfig(task="toy")
    assert pipe.rl.k == 2 and pipe.max_response_tokens == 4  # its pipeline defaults, laid under
    assert PipelineConfig(task="toy", rl={"k": 4}).rl.k == 4  # ... the user's settings
    assert not pipe.trains_reward_model() and pipe.stage_configs()[2].reward_fn == toy.checker
    assert SFTConfig(task="toy").task == RLConfig(task="toy", policy="p").task == "toy"
    with pytest.raises(ConfigError, match="dpo"):  # a checker task has no preference pairs
        CompareConfig(tasks=["toy"], methods=["dpo"])


def test_a_task_not_in_the_table_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="unknown task 'toy'; available: summarize, dialogue"):
        PipelineConfig(task="toy")
    with pytest.raises(ConfigError, match="unknown task 'toy'"):
        CompareConfig(tasks=["toy"])
    with pytest.raises(ValueError, match="unknown task 'toy'"):
        get_task("toy")


def test_a_task_added_twice_is_refused(toy):
    with pytest.raises(ValueError, match="already exists"):
        add_task(TOY)


def test_a_task_with_an_environment_is_played_through_env_factory(toy):
    from rloo.tasks.tokenizer import build_tokenizer

    add_task(TaskSpec("toy_env", "repeat a letter in an episode", ToyTask, judge="checker", env=ToyEnv))
    assert "toy_env" in episode_tasks() and plays_episodes(type("T", (ToyTask,), {"name": "toy_env"})())
    tok = build_tokenizer(get_task("toy"))
    env = env_factory("toy_env", tok)()
    assert isinstance(env, ToyEnv)
    env.reset("q b")
    assert env.step(tok("ans b", add_special_tokens=False)["input_ids"]).reward == 1.0
    cfg = RLConfig(policy="p", env="toy_env", task="toy")
    assert cfg.env == "toy_env"


def test_no_task_name_is_written_by_hand_in_the_config_layer():
    # the config's lists of tasks are derived from the table: no other config module writes a name
    names = set(TASK_SPECS)
    found = []
    for path in sorted((SRC / "config").glob("*.py")):
        if path.name == "tasks.py":
            continue
        tree = ast.parse(path.read_text())
        found += [
            f"{path.name}:{n.lineno}: {n.value!r}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and n.value in names
        ]
    assert not found, "derive these from rloo.config.TASK_SPECS: " + ", ".join(found)


def test_the_table_names_each_built_in_task_by_its_class_name():
    for name in tasks():
        assert get_task(name).name == name  # a task's class seeds its data by this name


def test_a_toy_task_trains_through_the_pipeline(toy, tmp_path):
    """SFT, RL with the checker as the reward (no reward model), pass@k evaluation: one entry is all."""
    out = tmp_path / "p"
    arch = ["sft.arch.hidden_size=16", "sft.arch.num_layers=1", "sft.arch.num_heads=2", "sft.arch.intermediate_size=32"]
    small = ["sft.num_examples=16", "sft.epochs=1", "rl.steps=1", "rl.batch_size=2", "rl.warmup_steps=0"]
    small += ["rl.save_every=null", "rl.eval_every=null", "eval.num_prompts=2", "eval.pass_samples=8", "report_to=none"]
    assert main(["pipeline", "task=toy", f"output_dir={out}", *arch, *small]) == 0
    assert not (out / "reward").exists() and (out / "rl" / "model" / "model.safetensors").exists()
    pass_at = json.loads((out / "summary.json").read_text())["eval"]["policy"]["pass"]["pass_at_k"]
    assert 0 <= pass_at["1"]["mean"] <= pass_at["8"]["mean"] <= 1

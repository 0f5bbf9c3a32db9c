"""The task table: one `TaskSpec` per built-in task, the one place a task's name is written. Every
list of tasks (the `task` and `tasks` choices, the tasks scored by a checker, the tasks played as
episodes and their built-in environments, the pipeline's defaults) is derived from `TASK_SPECS`;
`add_task` extends it at run time.

The config layer may not import the task classes (rloo.tasks) nor the environments (rloo.envs), so a
built-in entry names its code as `module:Name` strings; rloo.tasks.get_task and
rloo.envs.env_factory load them. A task added from outside rloo may give the classes themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# ---- the table -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSpec:
    """What the rest of rloo needs to know about a task (docs/architecture.md, "A new task")."""

    name: str
    summary: str  # a few words, shown in the `task` setting's description
    task: str | type  # the task class (rloo.tasks.base.Task), or `module:Class`; built with no arguments
    # how its gold judge (`Task.gold_score`) scores: "gold" a graded judge (evaluation: win rate
    # against the references), "checker" 1 solved / 0 not (evaluation: pass@k)
    judge: Literal["gold", "checker"] = "gold"
    # `module:function`, a reward_fn(prompts, completions): the pipeline's reward in place of a reward
    # model (and no preference pairs, so no dpo); None: a reward model is trained, or env gives it
    checker: str | None = None
    # its environment class (`module:Class`, or the class): the task is played as multi-turn
    # episodes (`env=<name>`), the environment gives the reward and evaluation reports success rates
    env: str | type | None = None
    # `rloo pipeline task=<name>` defaults, laid under the user's settings (nested sections merged)
    pipeline: dict = field(default_factory=dict)


TASK_SPECS: dict[str, TaskSpec] = {
    s.name: s
    for s in (
        TaskSpec(
            "summarize",
            "Reddit TL;DR stand-in: summarize a post by its key words; default",
            "rloo.tasks.summarize:SummarizeTask",
        ),
        TaskSpec(
            "dialogue",
            "Anthropic HH stand-in: help with benign requests, refuse harmful ones",
            "rloo.tasks.dialogue:DialogueTask",
        ),
        TaskSpec(
            "arithmetic",
            "small integer problems scored by a checker",
            "rloo.tasks.arithmetic:ArithmeticTask",
            judge="checker",
            checker="rloo.tasks.arithmetic:reward",
            # longer SFT (the model has to learn to add, not only a format), no reward model, responses
            # up to 24 tokens (a worked chain is 17), beta = 0 (the checker cannot be over-optimized;
            # the KL is logged), k = 8 so that fewer groups are all right or all wrong, pass@k on 200
            # distinct held-out problems
            pipeline={
                "max_response_tokens": 24,
                "sft": {"epochs": 12},
                "rl": {
                    "k": 8,
                    "batch_size": 16,
                    "beta": 0.0,
                    "lr": 1e-4,
                    "steps": 250,
                    "max_new_tokens": 24,
                    "eval_every": 50,
                    "eval_prompts": 64,
                },
                "eval": {"num_prompts": 200, "pass_samples": 16},
            },
        ),
        TaskSpec(
            "calculator",
            "arithmetic in episodes with a calculator tool",
            "rloo.tasks.calculator:CalculatorTask",
            judge="checker",
            env="rloo.envs.calculator:CalculatorEnv",
            # SFT teaches the format on the share of traces that use the tool (half of them), and to
            # copy the tool's output into the answer, which forms late in the schedule: a seed whose SFT
            # ends without it is right on 3-26% of its tool calls, and RLOO at beta 0, given almost no
            # success to learn from, drifts and gains little (6 epochs, 30% tool traces, observations in
            # the loss: 4 of 10 seeds on one CPU kind; 12 epochs: 1 of 10 on the AMX kind). With half the
            # traces calling the tool and the observations out of SFT's loss (observation_loss: its tool
            # output is arithmetic the policy need not predict), the seeds that failed copy at 98-99%
            # after 6 epochs; 12 leave the margin (docs/results/agents-calculator/README.md).
            # RLOO on whole episodes, beta = 0 (the checker is the reward, as for arithmetic); the
            # evaluation plays episodes (rloo.eval.episodes)
            pipeline={
                "max_response_tokens": 20,
                "sft": {"num_examples": 3000, "epochs": 12, "observation_loss": False},
                "rl": {
                    "k": 4,
                    "batch_size": 16,
                    "beta": 0.0,
                    "lr": 3e-4,
                    "steps": 60,
                    "warmup_steps": 5,
                    "eval_every": None,
                },
                "eval": {"num_prompts": 100, "pass_samples": 8},
                "env_settings": {"max_turns": 3, "max_turn_tokens": 12, "max_total_tokens": 24},
            },
        ),
        TaskSpec(
            "guess",
            "guess a number in 1..16 from higher/lower feedback, in episodes",
            "rloo.tasks.guess:GuessTask",
            env="rloo.envs.guess:GuessEnv",
            # SFT on a mediocre player's games (feedback used half the time), RLOO on whole games; k = 8 x
            # 80 steps: the best of four settings tried on seed 0 (docs/results/agents-game/README.md);
            # 8 turns of `guess <n>` and one feedback word each
            pipeline={
                "max_response_tokens": 24,
                "sft": {"num_examples": 3000, "epochs": 6},
                "rl": {
                    "k": 8,
                    "batch_size": 16,
                    "beta": 0.0,
                    "lr": 3e-4,
                    "steps": 80,
                    "warmup_steps": 5,
                    "eval_every": None,
                },
                "eval": {"num_prompts": 100, "pass_samples": 8},
                "env_settings": {"max_turns": 8, "max_turn_tokens": 3, "max_total_tokens": 24},
            },
        ),
    )
}
DEFAULT_TASK = next(iter(TASK_SPECS))  # summarize: the paper's TL;DR experiment


def add_task(spec: TaskSpec) -> None:
    """Add a task to the table: `task=<spec.name>` is then a choice of every stage and of `rloo compare`,
    get_task builds it, and with `env` `env=<spec.name>` plays its episodes."""
    if spec.name in TASK_SPECS:
        raise ValueError(f"a task named {spec.name!r} already exists")
    TASK_SPECS[spec.name] = spec


def task_names() -> tuple[str, ...]:
    """The tasks' names in table order."""
    return tuple(TASK_SPECS)


def checker_tasks() -> dict[str, str]:
    """Tasks whose checker is the pipeline's reward: name -> the checker as a reward_fn."""
    return {n: s.checker for n, s in TASK_SPECS.items() if s.checker is not None}


def episode_tasks() -> tuple[str, ...]:
    """Tasks played as episodes; each one's name is also a built-in `env=` name."""
    return tuple(n for n, s in TASK_SPECS.items() if s.env is not None)


def check_task(name: str) -> str:
    """`name` if it is in the table (read now: a task added by add_task is known too), else ValueError."""
    if name not in TASK_SPECS:
        raise ValueError(f"unknown task {name!r}; available: {', '.join(TASK_SPECS)}")
    return name


def described_tasks() -> str:
    """'summarize (...), dialogue (...), ...' for a setting's description."""
    return ", ".join(f"{s.name} ({s.summary})" for s in TASK_SPECS.values())

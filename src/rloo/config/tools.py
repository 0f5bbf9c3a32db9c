"""Configs of the tools around training: `rloo bench` and `rloo compare`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rloo.config.base import MAX_BETA, MAX_LR, Strict
from rloo.config.sections import EvalSettings, RewardSettings, RLSettings, SFTSettings
from rloo.config.stages import CHECKER_TASKS


class BenchConfig(Strict):
    """`rloo bench`: rloo's RL step against TRL's RLOOTrainer, side by side (needs the `bench` extra)."""

    shapes: list[Literal["S", "M", "L", "1B"]] = Field(
        default=["S", "M", "L"],
        description="Benchmark shapes (see rloo.experiments.bench_assets; 1B: Pythia-1B-sized).",
    )
    device: str = Field(default="cpu", description="cpu or cuda: both trainers run there.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="float32",
        description="Both trainers: float32, or bf16 mixed precision (TRL's bf16=True); auto as in "
        "the stages (rloo.runtime.precision).",
    )
    warmup: int = Field(default=2, ge=0, description="Untimed steps per trainer before measuring.")
    steps: int | None = Field(default=None, ge=1, description="Timed steps per trainer (null: 10, or 5 for L).")
    k: int = Field(default=4, ge=2, description="Completions per prompt.")
    batch_size: int = Field(default=8, ge=1, description="Prompts per step.")
    beta: float = Field(default=0.05, ge=0, le=MAX_BETA, description="KL coefficient (both trainers).")
    lr: float = Field(default=1e-6, gt=0, le=MAX_LR, description="AdamW learning rate (both trainers).")
    seed: int = Field(default=0)
    threads: int = Field(default=2, ge=1, description="torch threads per trainer process.")
    trl: bool = Field(default=True, description="Run TRL's RLOOTrainer alongside (false: rloo only).")
    share_prompt: bool = Field(default=True, description="rloo's prompt-once-per-group fast path.")
    output_dir: Path = Field(default=Path("runs/bench"), description="Built models (assets/) and bench.json.")


COMPARE_METHODS = (
    "rloo",
    "rloo_k2",
    "reinforce",
    "vanilla_pg",
    "ppo",
    "ppo_lambda1",
    "grpo",
    "raft",
    "dpo",
    "rloo_token_kl",
    "rloo_k3_kl",
    "rloo_clip",
    "dr_grpo",
    "reinforce_pp",
)
"""Methods `rloo compare` knows: an algorithm plus overrides (rloo.experiments.compare.METHODS)."""


class CompareConfig(Strict):
    """`rloo compare`: methods x tasks x seeds under the same sample budget, one report folder."""

    methods: list[str] = Field(
        default=list(COMPARE_METHODS), description="Methods to compare: " + ", ".join(COMPARE_METHODS)
    )
    tasks: list[Literal["summarize", "dialogue", "arithmetic"]] = Field(
        default=["summarize", "dialogue"], description="Built-in tasks."
    )
    seeds: list[int] = Field(
        default=[0, 1, 2], description="One SFT model, reward model and run of each method per seed."
    )
    quick: bool = Field(default=False, description="Tiny settings (smoke run, minutes): overrides the sections below.")
    output_dir: Path = Field(default=Path("runs/compare"), description="Runs in runs/, the report in report/.")
    device: str = Field(default="cpu", description="torch device.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="As in every stage: auto is bf16 on GPU; on CPU bf16 autocast where bf16 matmul is fast.",
    )
    max_prompt_tokens: int = Field(default=64, ge=1)
    max_response_tokens: int = Field(default=32, ge=1)
    sft: SFTSettings = Field(default_factory=SFTSettings)
    reward: RewardSettings = Field(default_factory=RewardSettings)
    rl: RLSettings = Field(
        default_factory=RLSettings,
        description="Shared by every method; steps x batch_size x k is the sample budget of each.",
    )
    eval: EvalSettings = Field(default_factory=EvalSettings)
    variance_batches: int = Field(
        default=24, ge=0, description="Independent batches per gradient-variance estimate (< 2: skip)."
    )
    variance_samples: int = Field(
        default=32, ge=4, description="Completions per batch in the gradient-variance measurement."
    )
    weak_sft_fraction: float = Field(
        default=0.05, gt=0, le=1, description="Weak starting model: SFT on this share of the SFT data, one epoch."
    )

    @field_validator("methods")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        bad = [m for m in v if m not in COMPARE_METHODS]
        if bad or not v:
            raise ValueError(f"unknown method(s) {bad}; choose from {', '.join(COMPARE_METHODS)}")
        return v

    @model_validator(mode="after")
    def _dpo_needs_pairs(self):
        checked = [t for t in self.tasks if t in CHECKER_TASKS]
        if "dpo" in self.methods and checked:
            raise ValueError(
                f"dpo trains on a reward model's preference pairs, which {', '.join(checked)} (scored by a "
                f"checker) does not have; drop dpo from methods"
            )
        return self

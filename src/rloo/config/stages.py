"""The stage configs (`rloo sft|reward|train|eval|pipeline`): run-wide keys plus a stage's section."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rloo.config.base import Strict, normalize_report_to
from rloo.config.dataset import DatasetSettings
from rloo.config.methods import METHOD_SPECS
from rloo.config.sections import EvalSettings, RewardSettings, RLSettings, SFTSettings

CHECKER_TASKS: dict[str, str] = {"arithmetic": "rloo.tasks.arithmetic:reward"}
"""Tasks scored by a checker, and the checker as a reward_fn: no reward model, the checker is the
reward and the gold judge, and evaluation reports pass@k (rloo.tasks.arithmetic)."""

# `rloo pipeline task=arithmetic` defaults, laid under the user's settings (PipelineConfig):
# longer SFT (the model has to learn to add, not only a format), no reward model, responses up to 24
# tokens (a worked chain is 17), beta = 0 (the checker cannot be over-optimized; the KL is logged),
# k = 8 so that fewer groups are all right or all wrong, pass@k on 200 distinct held-out problems.
TASK_PIPELINE_DEFAULTS: dict[str, dict] = {
    "arithmetic": {
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
}


def _under(base: dict, extra: dict) -> dict:
    """`extra` laid over `base`, nested sections merged key by key."""
    merged = dict(base)
    for k, v in extra.items():
        merged[k] = _under(merged[k], v) if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    return merged


class _Run(Strict):
    task: Literal["summarize", "dialogue", "arithmetic"] = Field(default="summarize", description="Built-in task.")
    seed: int = Field(default=0, description="Seeds data, initialization and sampling.")
    output_dir: Path = Field(default=Path("runs/default"), description="Where everything of this run is written.")
    device: str = Field(default="cpu", description="torch device: cpu, cuda, cuda:1, ...")
    max_prompt_tokens: int = Field(default=64, ge=1, description="Longer prompts keep their last tokens (counted).")
    max_response_tokens: int = Field(default=32, ge=1, description="Reference/preference responses are cut here.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="Compute precision (rloo.runtime.precision): auto is bfloat16 on GPU; on CPU bf16 autocast "
        "with fp32 master weights when a probe finds bf16 matmul >= 1.5x fp32, else float32.",
    )
    gradient_checkpointing: bool = Field(default=False, description="Recompute activations in backward to save memory.")
    trust_remote_code: bool = Field(
        default=False, description="Run model code shipped with a Hub checkpoint (off unless asked)."
    )
    dataset: DatasetSettings | None = Field(default=None, description="Your own data instead of the built-in task's.")
    report_to: str | list[str] = Field(
        default="tensorboard",
        description="Trackers of the metrics and sample tables: tensorboard, wandb (optional extra; "
        "WANDB_MODE=offline works without network), none, or a list of them.",
    )

    @field_validator("report_to")
    @classmethod
    def _trackers(cls, v):
        normalize_report_to(v)
        return v


class SFTConfig(_Run, SFTSettings):
    """`rloo sft`: fine-tune a causal LM on the task's reference responses."""

    model: str | None = Field(default=None, description="Causal LM path; null builds a small Llama from `arch`.")
    tokenizer: str | None = Field(default=None, description="Tokenizer path; null builds the task's word tokenizer.")


class RewardConfig(_Run, RewardSettings):
    """`rloo reward`: train a reward model (one-output classification head) from the SFT model."""

    sft_model: str = Field(default=..., description="Path of the SFT model the reward model starts from.")


class RLConfig(_Run, RLSettings):
    """`rloo train`: RL fine-tuning of the SFT policy against a reward."""

    policy: str = Field(default=..., description="Path of the starting (SFT) policy; also the frozen reference.")
    reward_model: str | None = Field(default=None, description="Path of the reward model.")
    reward_fn: str | list[str] | None = Field(
        default=None,
        description="Python reward(s) `module:function` (found from the current folder) or "
        "`path/to/file.py:function`; with reward_model too, the sources are summed with reward_weights.",
    )
    eval: EvalSettings = Field(default_factory=EvalSettings)


class EvalConfig(_Run, EvalSettings):
    """`rloo eval`: win rate against the references, judged by the task's gold judge."""

    policy: str = Field(default=..., description="Path of the policy to evaluate.")
    baseline: str | None = Field(default=None, description="Second policy shown side by side (the SFT model).")
    reference_model: str | None = Field(default=None, description="Model KL is measured against (default: baseline).")
    reward_model: str | None = Field(default=None, description="Reward model whose mean score is reported.")
    max_new_tokens: int = Field(
        default=16, ge=1, description="Response length limit (the pipeline uses rl.max_new_tokens)."
    )


class PipelineRewardSettings(RewardSettings):
    """The reward stage of the pipeline: its hyperparameters, its base model and its data."""

    dataset: DatasetSettings | None = Field(
        default=None,
        description="Preference data (prompt, chosen, rejected) for the reward stage; null: the pipeline's dataset.",
    )


class PipelineConfig(_Run):
    """`rloo pipeline`: SFT -> reward model -> RL -> evaluation into one output folder."""

    output_dir: Path = Field(default=Path("runs/pipeline"), description="Holds sft/, reward/, rl/, eval/.")
    model: str | None = Field(
        default=None,
        description="Causal LM the SFT stage starts from (path or Hub name); null builds a small Llama "
        "from sft.arch (built-in tasks only).",
    )
    tokenizer: str | None = Field(
        default=None, description="Tokenizer path; null: the model's (or the task's word tokenizer)."
    )
    sft: SFTSettings = Field(default_factory=SFTSettings)
    reward: PipelineRewardSettings = Field(default_factory=PipelineRewardSettings)
    rl: RLSettings = Field(default_factory=RLSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)

    @field_validator("reward", mode="before")
    @classmethod
    def _plain_reward_settings(cls, v):
        # a RewardSettings (as `rloo compare` holds) is a pipeline reward section without its own data
        return v.model_dump() if isinstance(v, RewardSettings) and not isinstance(v, PipelineRewardSettings) else v

    @field_validator("output_dir")
    @classmethod
    def _not_root(cls, v: Path) -> Path:
        if str(v).strip() in ("", "/"):
            raise ValueError("output_dir must be a folder, not the file-system root")
        return v

    @model_validator(mode="before")
    @classmethod
    def _task_defaults(cls, data: Any) -> Any:
        """A task's own defaults (TASK_PIPELINE_DEFAULTS, e.g. arithmetic's) under the given values."""
        if not isinstance(data, dict) or data.get("task") not in TASK_PIPELINE_DEFAULTS:
            return data
        return _under(TASK_PIPELINE_DEFAULTS[data["task"]], data)

    def stage_configs(self) -> tuple[SFTConfig, RewardConfig, RLConfig, EvalConfig]:
        """The four stage configs this pipeline runs, with their paths derived from output_dir."""
        out = self.output_dir
        run: dict[str, Any] = dict(
            task=self.task,
            seed=self.seed,
            device=self.device,
            dtype=self.dtype,
            dataset=self.dataset,
            report_to=self.report_to,
            gradient_checkpointing=self.gradient_checkpointing,
            trust_remote_code=self.trust_remote_code,
            max_prompt_tokens=self.max_prompt_tokens,
            max_response_tokens=self.max_response_tokens,
        )
        sft = SFTConfig(
            **self.sft.model_dump(), **run, output_dir=out / "sft", model=self.model, tokenizer=self.tokenizer
        )
        rm = RewardConfig(
            **self.reward.model_dump(exclude={"dataset"}),
            **{**run, "dataset": self.reward.dataset or self.dataset},
            output_dir=out / "reward",
            sft_model=str(out / "sft" / "model"),
        )
        # a task with a checker has no reward model: the checker is the reward
        reward: dict[str, Any] = (
            {"reward_fn": CHECKER_TASKS[self.task]}
            if self.task in CHECKER_TASKS
            else {"reward_model": str(out / "reward" / "model")}
        )
        rl_settings = self.rl.model_dump()
        if not self.rl.checks_own_settings:  # a section shared by several methods: this one's settings
            own = METHOD_SPECS[self.rl.algorithm].settings.model_fields
            rl_settings["algorithm_settings"] = {k: v for k, v in self.rl.algorithm_settings if k in own}
        rl = RLConfig(
            **rl_settings,
            **run,
            output_dir=out / "rl",
            eval=self.eval,
            policy=str(out / "sft" / "model"),
            **reward,
        )
        ev = EvalConfig(
            **self.eval.model_dump(),
            **run,
            output_dir=out / "eval",
            policy=str(out / "rl" / "model"),
            baseline=str(out / "sft" / "model"),
            reward_model=reward.get("reward_model"),
            max_new_tokens=self.rl.max_new_tokens,
        )
        return sft, rm, rl, ev

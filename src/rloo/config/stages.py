"""The stage configs (`rloo sft|reward|train|eval|pipeline`): run-wide keys plus a stage's section."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rloo.config.agents import EnvSettings, eval_env_refusal, pipeline_env_refusal, rl_env_refusal
from rloo.config.base import Seed, Strict, check_device_name, normalize_report_to, refuse_float16
from rloo.config.dataset import DatasetSettings
from rloo.config.evaluation import reward_fn_as_judge
from rloo.config.generation import check_rl_generation, rl_eval_sampling, rl_sampling
from rloo.config.method_choice import shared_settings
from rloo.config.sections import EvalSettings, RewardSettings, RLSettings, SFTSettings
from rloo.config.tasks import DEFAULT_TASK, TASK_SPECS, check_task, described_tasks, episode_tasks


def _under(base: dict, extra: dict) -> dict:
    """`extra` laid over `base`, nested sections merged key by key."""
    merged = dict(base)
    for k, v in extra.items():
        merged[k] = _under(merged[k], v) if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    return merged


class _Run(Strict):
    task: str = Field(
        default=DEFAULT_TASK, description="Built-in task (rloo.config.TASK_SPECS): " + described_tasks() + "."
    )
    seed: Seed = Field(default=0, description="Seeds data, initialization and sampling.")
    output_dir: Path = Field(default=Path("runs/default"), description="Where everything of this run is written.")
    device: str = Field(default="cpu", description="torch device: cpu, cuda, cuda:1, ...")
    max_prompt_tokens: int = Field(
        default=64, ge=1, description="Longer prompts keep their last tokens (counted and said: docs/configs.md)."
    )
    max_response_tokens: int = Field(
        default=32, ge=1, description="SFT targets and preference responses are cut here, EOS included (counted)."
    )
    max_cut_share: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="Largest share of a stage's prompts, SFT targets (losing their EOS) or preference responses "
        "cut at the limits above; more is refused (1: never). Any cut is reported.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="Compute precision (rloo.runtime.precision), fp32 master weights always: auto is bf16 autocast "
        "on GPU; on CPU bf16 autocast where the CPU has AMX-BF16 or AVX512_BF16 (its flags decide), else float32. "
        "float16: refused.",
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

    _trackers = field_validator("report_to")(classmethod(lambda cls, v: (normalize_report_to(v), v)[1]))
    _device = field_validator("device")(classmethod(lambda cls, v: check_device_name(v)))
    _task = field_validator("task")(classmethod(lambda cls, v: check_task(v)))
    _dtype = field_validator("dtype")(classmethod(lambda cls, v: refuse_float16(v)))


class SFTConfig(_Run, SFTSettings):
    """`rloo sft`: fine-tune a causal LM on the task's reference responses."""

    model: str | None = Field(default=None, description="Causal LM path; null builds a small Llama from `arch`.")
    tokenizer: str | None = Field(default=None, description="Tokenizer path; null builds the task's word tokenizer.")


class RewardConfig(_Run, RewardSettings):
    """`rloo reward`: train a reward model (one-output classification head) from the SFT model."""

    sft_model: str = Field(default="", description="Path of the SFT model the reward model starts from (required).")


class RLConfig(_Run, RLSettings):
    """`rloo train`: RL fine-tuning of the SFT policy against a reward."""

    policy: str = Field(default="", description="Path of the starting policy, also the reference (required).")
    reward_model: str | None = Field(default=None, description="Path of the reward model.")
    reward_fn: str | list[str] | None = Field(
        default=None,
        description="Python reward(s) `module:function` (found from the current folder) or "
        "`path/to/file.py:function`; with reward_model too, the sources are summed with reward_weights.",
    )
    eval: EvalSettings = Field(default_factory=EvalSettings)
    env: str | None = Field(
        default=None,
        description="Train on multi-turn episodes of an environment (docs/agents.md): a built-in one "
        "("
        + ", ".join(episode_tasks())
        + ") or your class `path/to/file.py:Class` / `module:Class`, called with the tokenizer; "
        "the environment gives the reward (the methods whose MethodSpec sets multi_turn, docs/agents.md).",
    )
    env_settings: EnvSettings = Field(default_factory=EnvSettings, description="Limits of one episode (with env).")

    @model_validator(mode="before")
    @classmethod
    def _reward_fn_judges(cls, data: Any) -> Any:
        return reward_fn_as_judge(data)  # the one place of this default (rloo.config.evaluation)

    @model_validator(mode="after")
    def _env_alone(self):
        if self.env is not None and (why := rl_env_refusal(self)):
            raise ValueError(why)
        check_rl_generation(self)
        return self

    sampling = property(rl_sampling)  # how training samples: the own sampler, vLLM, episodes, the producer
    eval_sampling = property(rl_eval_sampling)  # how its evaluations sample: eval.*, rl.max_new_tokens


class EvalConfig(_Run, EvalSettings):
    """`rloo eval`: win rate against the references, judged by the task's gold judge (with env=: episodes)."""

    policy: str = Field(default=..., description="Path of the policy to evaluate.")
    baseline: str | None = Field(default=None, description="Second policy shown side by side (the SFT model).")
    reference_model: str | None = Field(default=None, description="Model KL is measured against (default: baseline).")
    reward_model: str | None = Field(default=None, description="Reward model whose mean score is reported.")
    max_new_tokens: int = Field(
        default=16, ge=1, description="Response length limit (the pipeline uses rl.max_new_tokens)."
    )
    env: str | None = Field(
        default=None,
        description=f"Play episodes instead (docs/agents.md): {', '.join(episode_tasks())} or your `file.py:Class` / "
        "`module:Class`; success rate, turns, tool calls over pass_samples episodes per held-out prompt.",
    )
    env_settings: EnvSettings = Field(default_factory=EnvSettings, description="Limits of one episode (with env).")

    @model_validator(mode="after")
    def _env_alone(self):
        if self.env is not None and (why := eval_env_refusal(self)):
            raise ValueError(why)
        return self


class PipelineRewardSettings(RewardSettings):
    """The reward stage of the pipeline: its hyperparameters, its base model and its data."""

    dataset: DatasetSettings | None = Field(
        default=None,
        description="Preference data (prompt, chosen, rejected) for the reward stage; null: the pipeline's dataset.",
    )


class PipelineRLSettings(RLSettings):
    """The RL stage of the pipeline: its hyperparameters and, optionally, a Python reward."""

    reward_fn: str | list[str] | None = Field(
        default=None,
        description="Python reward(s) `module:function` or `path/to/file.py:function`, batched (prompts, "
        "completions) -> floats. Alone (no reward.dataset, no 'reward_model' in reward_weights) there is no "
        "reward-model stage and it is also the default eval.judge; otherwise summed with the reward model.",
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
    rl: PipelineRLSettings = Field(default_factory=PipelineRLSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    env: str | None = Field(
        default=None,
        description="RL on episodes of your `path/to/file.py:Class` / `module:Class` (docs/agents.md): the environment "
        f"gives the reward (no reward-model stage); the evaluation plays episodes. {', '.join(episode_tasks())}: own.",
    )
    env_settings: EnvSettings = Field(
        default_factory=EnvSettings,
        description="Limits of one episode (env=, and tasks played as episodes: " + ", ".join(episode_tasks()) + ").",
    )

    @field_validator("rl", mode="before")
    @classmethod
    def _plain_rl_settings(cls, v):
        # an RLSettings (as `rloo compare` holds) is a pipeline RL section without a Python reward
        if not isinstance(v, RLSettings) or isinstance(v, PipelineRLSettings):
            return v
        data = v.model_dump()
        if not v.checks_own_settings:  # a section shared by several methods: the chosen one's settings
            data["algorithm_settings"] = shared_settings(v.algorithm, v.algorithm_settings)
        return data

    @model_validator(mode="after")
    def _env_gives_the_reward(self):
        if self.env is not None and (why := pipeline_env_refusal(self.rl, self.eval, self.reward.dataset)):
            raise ValueError(why)
        return self

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
        """A task's own defaults (TaskSpec.pipeline, e.g. arithmetic's) under the given values."""
        if not isinstance(data, dict) or data.get("task") not in TASK_SPECS:
            return data
        return _under(TASK_SPECS[data["task"]].pipeline, data)

    def trains_reward_model(self) -> bool:
        """Whether the pipeline has a reward-model stage: not for a checker task, nor when rl.reward_fn
        is the only reward (no reward.dataset and no 'reward_model' weight asking for one)."""
        spec = TASK_SPECS[self.task]
        if spec.checker is not None or self.episode_env() is not None:
            return False
        return self.rl.reward_fn is None or self.reward.dataset is not None or "reward_model" in self.rl.reward_weights

    def episode_env(self) -> str | None:
        """The `env=` the RL stage plays episodes of: env=, or a task played as episodes (its name: calculator)."""
        return self.env or (self.task if TASK_SPECS[self.task].env is not None else None)

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
            max_cut_share=self.max_cut_share,
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
        reward = self._rewards()
        rl = RLConfig(
            **self.rl.model_dump(exclude={"reward_fn"}),
            **run,
            output_dir=out / "rl",
            eval=self.eval,
            policy=str(out / "sft" / "model"),
            **reward,
        )
        ev = EvalConfig(  # judged as RL's periodic evaluation (RLConfig: the Python reward on a dataset)
            **rl.eval.model_dump(),
            **run,
            output_dir=out / "eval",
            policy=str(out / "rl" / "model"),
            baseline=str(out / "sft" / "model"),
            reward_model=reward.get("reward_model"),
            max_new_tokens=self.rl.max_new_tokens,
            **({"env": reward["env"], "env_settings": self.env_settings} if "env" in reward else {}),
        )
        return sft, rm, rl, ev

    def _rewards(self) -> dict[str, Any]:
        """The RL stage's reward sources: a checker task's checker, rl.reward_fn, the reward model."""
        spec = TASK_SPECS[self.task]
        if (env := self.episode_env()) is not None:  # the environment gives the reward
            return {"env": env, "env_settings": self.env_settings, "reward_fn": None, "reward_model": None}
        reward: dict[str, Any] = {"reward_fn": self.rl.reward_fn, "reward_model": None}
        if spec.checker is not None and self.rl.reward_fn is None:
            reward["reward_fn"] = spec.checker  # the checker is the reward
        if self.trains_reward_model():
            reward["reward_model"] = str(self.output_dir / "reward" / "model")
        return reward

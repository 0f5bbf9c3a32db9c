"""Typed, validated configs: one per stage, composed for the pipeline.

Every field's description is its documentation (`rloo <stage> --help-config` prints them).
Unknown keys are errors. A config comes from defaults, then an optional YAML file, then
`key=value` overrides from the command line (dotted keys reach nested sections:
`rl.k=8`). Values are parsed as YAML scalars, so `beta=0.1`, `eval_every=null` work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rloo.errors import ConfigError
from rloo.settings import DatasetSettings, LoraSettings
from rloo.tasks import get_task, has_checker

TASK_NAMES = ("summarize", "dialogue", "arithmetic")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


class ArchConfig(_Strict):
    """Shape of the small Llama built from scratch when no model path is given."""

    hidden_size: int = Field(128, gt=0, description="Model width.")
    num_layers: int = Field(3, gt=0, description="Transformer blocks.")
    num_heads: int = Field(4, gt=0, description="Attention heads (hidden_size must divide by it).")
    intermediate_size: int = Field(384, gt=0, description="MLP width.")
    max_position_embeddings: int = Field(128, gt=0, description="Longest prompt + response.")


class SFTSettings(_Strict):
    """Hyperparameters of supervised fine-tuning on the task's reference responses."""

    num_examples: int = Field(6000, ge=1, description="Prompt/reference pairs generated for SFT.")
    epochs: int = Field(6, ge=1, description="Passes over the SFT data.")
    batch_size: int = Field(64, ge=1, description="Sequences per optimizer step.")
    lr: float = Field(3e-3, gt=0, description="Peak AdamW learning rate (cosine decay to 10%).")
    weight_decay: float = Field(0.0, ge=0)
    arch: ArchConfig = Field(default_factory=ArchConfig, description="Used only when `model` is null.")


class RewardSettings(_Strict):
    """Hyperparameters of reward-model training with the Bradley-Terry loss."""

    num_pairs: int = Field(6000, ge=1, description="Preference pairs labeled by the simulated labeler.")
    eval_pairs: int = Field(500, ge=1, description="Held-out pairs for pairwise accuracy.")
    policy_pairs: float = Field(0.5, ge=0, le=1, description="Share of pairs comparing two SFT-policy samples "
                                "(the rest compare two references).")
    epochs: int = Field(2, ge=1)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0)


ALGORITHMS = ("rloo", "reinforce", "vanilla_pg", "ppo", "grpo", "raft", "dpo", "dr_grpo", "reinforce_pp")
GROUP_ALGORITHMS = ("rloo", "grpo", "dr_grpo")  # their baselines come from the other samples of the same prompt


class AlgoSettings(_Strict):
    """Knobs of the methods compared with RLOO, and RLOO's ablations. Plain RLOO ignores them
    unless an ablation is switched on (kl_level, kl_estimator, rloo_clip)."""

    kl_estimator: Literal["k1", "k3"] = Field("k1", description="KL estimator in the shaped reward (k3: "
                                              "lower-variance, Schulman 2020). RLOO ablation when k3.")
    kl_level: Literal["sequence", "token"] = Field("sequence", description="RLOO ablation: 'token' gives each "
                                                   "token only the KL penalty of itself and later tokens.")
    rloo_clip: bool = Field(False, description="RLOO ablation: PPO ratio + clipping on top of RLOO "
                                               "(ppo_epochs x num_minibatches updates per batch).")
    baseline_momentum: float = Field(0.9, ge=0, lt=1, description="reinforce: moving-average baseline momentum (eq. 3).")
    gamma: float = Field(1.0, gt=0, le=1, description="ppo/vanilla_pg: discount of GAE.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="ppo: GAE lambda (vanilla_pg always uses 1).")
    clip_eps: float = Field(0.2, gt=0, description="ppo/grpo/rloo_clip: ratio clip range.")
    ppo_epochs: int = Field(2, ge=1, description="ppo/grpo/rloo_clip: passes over each batch of samples.")
    num_minibatches: int = Field(2, ge=1, description="ppo/grpo/rloo_clip: minibatches per pass.")
    value_model: Literal["separate", "head"] = Field("separate", description="ppo/vanilla_pg: a separate value "
                                                     "model (from the reward model) or a head on the policy.")
    value_lr: float = Field(1e-4, gt=0, description="ppo/vanilla_pg: learning rate of the value model/head.")
    vf_coef: float = Field(0.5, ge=0, description="ppo/vanilla_pg with value_model=head: weight of the value loss.")
    value_clip_eps: float | None = Field(0.2, description="ppo: value clipping range (null: off).")
    whiten_advantages: bool = Field(True, description="ppo/vanilla_pg: normalise GAE advantages per batch.")
    drop_zero_variance: bool = Field(False, description="rloo/grpo/dr_grpo/reinforce_pp: leave groups whose k "
                                     "scores are all equal out of the update (logged as groups/dropped).")
    norm_length: int | None = Field(None, ge=1, description="dr_grpo: the constant a completion's token sum is "
                                    "divided by (null: max_new_tokens).")
    dpo_beta: float = Field(0.1, gt=0, description="dpo: beta of the DPO loss.")
    dpo_pairs: int = Field(6000, ge=1, description="dpo: preference pairs (the reward model's first pairs).")
    dpo_epochs: int = Field(1, ge=1, description="dpo: passes over the pairs.")
    dpo_batch_size: int = Field(64, ge=1, description="dpo: pairs per optimizer step.")
    dpo_lr: float = Field(1e-4, gt=0, description="dpo: learning rate.")


class RLSettings(_Strict):
    """Hyperparameters of the RL stage (RLOO by default, eq. 1, 4, 5)."""

    algorithm: Literal["rloo", "reinforce", "vanilla_pg", "ppo", "grpo", "raft", "dpo", "dr_grpo", "reinforce_pp"] = Field(
        "rloo", description="The method: rloo (the paper's, default), reinforce (moving-average baseline), "
                            "vanilla_pg, ppo, grpo, raft, dpo (offline, on the reward model's pairs), dr_grpo "
                            "(group mean, no std, constant length norm), reinforce_pp (batch-level baseline).")
    algo: AlgoSettings = Field(default_factory=AlgoSettings, description="Settings of the other methods.")
    steps: int = Field(100, ge=1, description="Optimizer steps (one fresh batch of samples each).")
    batch_size: int = Field(16, ge=1, description="Prompts per step (B); N = B*k completions.")
    k: int = Field(4, ge=1, description="Samples per prompt for the leave-one-out baseline (eq. 4), >= 2.")
    beta: float = Field(0.25, ge=0, description="KL coefficient in the shaped reward (eq. 1).")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate (constant after warm-up).")
    warmup_steps: int = Field(10, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    temperature: float = Field(1.0, gt=0, description="Sampling temperature; log-probs use it too.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(16, ge=1, description="Completion length limit (T).")
    truncation_penalty: float | None = Field(
        None, description="If set, the score of a completion that hits max_new_tokens without EOS."
    )
    log_every: int = Field(1, ge=1, description="Steps between metric records.")
    share_prompt: bool = Field(
        True, description="Compute each prompt once per group of k (generation, reference, reward model, "
                          "policy forward and backward); the same math as k copies, less compute.")
    max_logits_mb: float = Field(
        256, gt=0, description="Largest float32 (positions x vocabulary) logits tensor a log-prob pass may hold; "
                               "above it the LM head runs in chunks of this size and recomputes its logits in "
                               "backward (Llama/Mistral/Qwen2/Qwen3 heads), so a 150k vocabulary does not cost GBs.")

    @model_validator(mode="after")
    def _k_at_least_two(self):
        if self.k < 2 and self.algorithm in GROUP_ALGORITHMS:
            raise ValueError(f"leave-one-out needs k >= 2 samples per prompt (the baseline of one sample "
                             f"is the mean of the other k-1), got k={self.k}")
        return self
    sample_every: int = Field(50, ge=1, description="Steps between printed sample completions.")
    eval_every: int | None = Field(20, ge=1, description="Steps between gold-judge evals (null: off).")
    eval_prompts: int = Field(128, ge=1, description="Held-out prompts used by the periodic eval.")
    save_every: int | None = Field(100, ge=1, description="Steps between checkpoints (null: only at the end).")
    keep_checkpoints: int = Field(2, ge=1, description="Newest checkpoints kept on disk.")
    max_skipped_steps: int = Field(5, ge=1, description="Non-finite steps in a row before the run stops.")
    # -- scaling out (rloo.distributed, rloo.models, rloo.rollout.vllm) --
    lora: LoraSettings | None = Field(None, description="Train LoRA adapters instead of all weights (needs peft).")
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp", description="Under torchrun: ddp replicates the policy, fsdp shards it (FSDP2, fully_shard).")
    generation: Literal["sampler", "vllm"] = Field("sampler", description="Rollout backend: rloo's sampler or vLLM (GPU).")
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, lt=1, description="GPU memory share vLLM may take.")
    reward_weights: dict[str, float] = Field(
        default_factory=dict, description="Weights when several reward sources are given: keys "
                                          "'reward_model' or a reward_fn spec; default 1 each.")


class EvalSettings(_Strict):
    """How policies are compared on held-out prompts."""

    num_prompts: int = Field(400, ge=1, description="Held-out prompts, each judged against its reference.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the evaluated policies.")
    batch_size: int = Field(128, ge=1)
    judge: str | None = Field(
        None, description="Who judges responses against references: null (the task's gold judge; the reward "
                          "model when a dataset replaces the task), 'reward_model', or a module:function.")
    pass_samples: int = Field(16, ge=8, description="Tasks with a checker (arithmetic): samples per held-out "
                                                    "problem for pass@k, k = 1, 2, 4, 8.")


class _Run(_Strict):
    task: Literal["summarize", "dialogue", "arithmetic"] = Field("summarize", description="Built-in task.")
    seed: int = Field(0, description="Seeds data, initialization and sampling.")
    output_dir: Path = Field(Path("runs/default"), description="Where everything of this run is written.")
    device: str = Field("cpu", description="torch device: cpu, cuda, cuda:1, ...")
    max_prompt_tokens: int = Field(64, ge=1, description="Longer prompts keep their last tokens (counted).")
    max_response_tokens: int = Field(32, ge=1, description="Reference/preference responses are cut here.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Model weights: auto is bfloat16 on GPU, float32 on CPU.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    trust_remote_code: bool = Field(False, description="Run model code shipped with a Hub checkpoint (off unless asked).")
    dataset: DatasetSettings | None = Field(None, description="Your own data instead of the built-in task's.")


class SFTConfig(_Run, SFTSettings):
    """`rloo sft`: fine-tune a causal LM on the task's reference responses."""

    model: str | None = Field(None, description="Causal LM path; null builds a small Llama from `arch`.")
    tokenizer: str | None = Field(None, description="Tokenizer path; null builds the task's word tokenizer.")


class RewardConfig(_Run, RewardSettings):
    """`rloo reward`: train a reward model (one-output classification head) from the SFT model."""

    sft_model: str = Field(..., description="Path of the SFT model the reward model starts from.")


class RLConfig(_Run, RLSettings):
    """`rloo train`: RL fine-tuning of the SFT policy against a reward."""

    policy: str = Field(..., description="Path of the starting (SFT) policy; also the frozen reference.")
    reward_model: str | None = Field(None, description="Path of the reward model.")
    reward_fn: str | list[str] | None = Field(
        None, description="Python reward(s) `module:function`; with reward_model too, the sources are summed "
                          "with reward_weights.")
    eval: EvalSettings = Field(default_factory=EvalSettings)


class EvalConfig(_Run, EvalSettings):
    """`rloo eval`: win rate against the references, judged by the task's gold judge."""

    policy: str = Field(..., description="Path of the policy to evaluate.")
    baseline: str | None = Field(None, description="Second policy shown side by side (the SFT model).")
    reference_model: str | None = Field(None, description="Model KL is measured against (default: baseline).")
    reward_model: str | None = Field(None, description="Reward model whose mean score is reported.")
    max_new_tokens: int = Field(16, ge=1, description="Response length limit (the pipeline uses rl.max_new_tokens).")


class PipelineConfig(_Run):
    """`rloo pipeline`: SFT -> reward model -> RL -> evaluation into one output folder."""

    output_dir: Path = Field(Path("runs/pipeline"), description="Holds sft/, reward/, rl/, eval/.")
    sft: SFTSettings = Field(default_factory=SFTSettings)
    reward: RewardSettings = Field(default_factory=RewardSettings)
    rl: RLSettings = Field(default_factory=RLSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)

    @field_validator("output_dir")
    @classmethod
    def _not_root(cls, v: Path) -> Path:
        if str(v).strip() in ("", "/"):
            raise ValueError("output_dir must be a folder, not the file-system root")
        return v

    @model_validator(mode="before")
    @classmethod
    def _task_defaults(cls, data: Any) -> Any:
        """A task's own defaults (``pipeline_defaults``, e.g. arithmetic's) under the given values."""
        if not isinstance(data, dict) or data.get("task") not in TASK_NAMES:
            return data
        return _merge(getattr(get_task(data["task"]), "pipeline_defaults", {}), data)

    def stage_configs(self) -> tuple[SFTConfig, RewardConfig, RLConfig, EvalConfig]:
        """The four stage configs this pipeline runs, with their paths derived from output_dir."""
        out = self.output_dir
        run = dict(task=self.task, seed=self.seed, device=self.device, dtype=self.dtype, dataset=self.dataset,
                   gradient_checkpointing=self.gradient_checkpointing, trust_remote_code=self.trust_remote_code,
                   max_prompt_tokens=self.max_prompt_tokens, max_response_tokens=self.max_response_tokens)
        sft = SFTConfig(**self.sft.model_dump(), **run, output_dir=out / "sft")
        rm = RewardConfig(**self.reward.model_dump(), **run, output_dir=out / "reward",
                          sft_model=str(out / "sft" / "model"))
        # a task with a checker has no reward model: the checker is the reward
        task = get_task(self.task)
        reward = {"reward_fn": task.reward_fn} if has_checker(task) else {"reward_model": str(out / "reward" / "model")}
        rl = RLConfig(**self.rl.model_dump(), **run, output_dir=out / "rl", eval=self.eval,
                      policy=str(out / "sft" / "model"), **reward)
        ev = EvalConfig(**self.eval.model_dump(), **run, output_dir=out / "eval",
                        policy=str(out / "rl" / "model"), baseline=str(out / "sft" / "model"),
                        reward_model=reward.get("reward_model"), max_new_tokens=self.rl.max_new_tokens)
        return sft, rm, rl, ev


class BenchConfig(_Strict):
    """`rloo bench`: rloo's RL step against TRL's RLOOTrainer, side by side (needs the `bench` extra)."""

    shapes: list[Literal["S", "M", "L"]] = Field(["S", "M", "L"], description="Benchmark shapes (see rloo.bench_assets).")
    warmup: int = Field(2, ge=0, description="Untimed steps per trainer before measuring.")
    steps: int | None = Field(None, ge=1, description="Timed steps per trainer (null: 10, or 5 for L).")
    k: int = Field(4, ge=2, description="Completions per prompt.")
    batch_size: int = Field(8, ge=1, description="Prompts per step.")
    beta: float = Field(0.05, ge=0, description="KL coefficient (both trainers).")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate (both trainers).")
    seed: int = Field(0)
    threads: int = Field(2, ge=1, description="torch threads per trainer process.")
    trl: bool = Field(True, description="Run TRL's RLOOTrainer alongside (false: rloo only).")
    share_prompt: bool = Field(True, description="rloo's prompt-once-per-group fast path.")
    output_dir: Path = Field(Path("runs/bench"), description="Built models (assets/) and bench.json.")


COMPARE_METHODS = ("rloo", "rloo_k2", "reinforce", "vanilla_pg", "ppo", "ppo_lambda1", "grpo", "raft", "dpo",
                   "rloo_token_kl", "rloo_k3_kl", "rloo_clip", "dr_grpo", "reinforce_pp")
"""Methods `rloo compare` knows: an algorithm plus overrides (rloo.recipes.compare.METHODS)."""


class CompareConfig(_Strict):
    """`rloo compare`: methods x tasks x seeds under the same sample budget, one report folder."""

    methods: list[str] = Field(list(COMPARE_METHODS), description="Methods to compare: " + ", ".join(COMPARE_METHODS))
    tasks: list[Literal["summarize", "dialogue", "arithmetic"]] = Field(["summarize", "dialogue"], description="Built-in tasks.")
    seeds: list[int] = Field([0, 1, 2], description="One SFT model, reward model and run of each method per seed.")
    quick: bool = Field(False, description="Tiny settings (smoke run, minutes): overrides the sections below.")
    output_dir: Path = Field(Path("runs/compare"), description="Runs in runs/, the report in report/.")
    device: str = Field("cpu", description="torch device.")
    max_prompt_tokens: int = Field(64, ge=1)
    max_response_tokens: int = Field(32, ge=1)
    sft: SFTSettings = Field(default_factory=SFTSettings)
    reward: RewardSettings = Field(default_factory=RewardSettings)
    rl: RLSettings = Field(default_factory=RLSettings, description="Shared by every method; steps x batch_size x k "
                                                                  "is the sample budget of each.")
    eval: EvalSettings = Field(default_factory=EvalSettings)
    variance_batches: int = Field(24, ge=0, description="Independent batches per gradient-variance estimate (< 2: skip).")
    variance_samples: int = Field(32, ge=4, description="Completions per batch in the gradient-variance measurement.")
    weak_sft_fraction: float = Field(0.05, gt=0, le=1, description="Weak starting model: SFT on this share of the "
                                                                  "SFT data, one epoch.")

    @field_validator("methods")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        bad = [m for m in v if m not in COMPARE_METHODS]
        if bad or not v:
            raise ValueError(f"unknown method(s) {bad}; choose from {', '.join(COMPARE_METHODS)}")
        return v

    @model_validator(mode="after")
    def _dpo_needs_pairs(self):
        checked = [t for t in self.tasks if has_checker(get_task(t))]
        if "dpo" in self.methods and checked:
            raise ValueError(f"dpo trains on a reward model's preference pairs, which {', '.join(checked)} (scored "
                             f"by a checker) does not have; drop dpo from methods")
        return self


C = TypeVar("C", bound=BaseModel)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`["rl.k=8", "beta=0.1"]` -> nested dict. Values are YAML scalars."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (example: rl.k=8)")
        key, raw = item.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with another override of {p!r}")
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None
    return out


def _merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for k, v in extra.items():
        merged[k] = _merge(merged[k], v) if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    return merged


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | None = None,
                **values: Any) -> C:
    """Build `cls` from a YAML file, `key=value` overrides and keyword values (highest wins)."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {str(e).splitlines()[0]}") from e
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping of keys to values")
        data = loaded
    data = _merge(data, parse_overrides(overrides or []))
    data = _merge(data, values)
    try:
        return cls(**data)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(e, cls)) from e


def describe_validation_error(e: ValidationError, cls: type) -> str:
    """One line per problem, naming the key and what is wrong."""
    msgs = []
    for err in e.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(config)"
        if err["type"] == "extra_forbidden":
            msgs.append(f"unknown key {key!r} for {cls.__name__}")
        elif err["type"] == "missing":
            msgs.append(f"missing required key {key!r}")
        else:
            msgs.append(f"{key}: {err['msg']} (got {err.get('input')!r})")
    return "invalid config: " + "; ".join(msgs)


def describe_fields(cls: type[BaseModel], prefix: str = "") -> list[str]:
    """Lines `key (default): description` for every field, nested sections expanded."""
    lines = []
    for name, f in cls.model_fields.items():
        ann = f.annotation
        # optional sections (`dataset: DatasetSettings | None`) are listed key by key too
        ann = next((a for a in get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)), ann)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            if not f.is_required() and f.get_default(call_default_factory=True) is None:
                lines.append(f"{prefix}{name} = None: {f.description or ''} Set any {name}.* key to enable it.")
            lines += describe_fields(ann, prefix + name + ".")
            continue
        default = "required" if f.is_required() else repr(f.get_default(call_default_factory=True))
        lines.append(f"{prefix}{name} = {default}: {f.description or ''}".rstrip(": "))
    return lines


def save_config(cfg: BaseModel, path: Path) -> None:
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))

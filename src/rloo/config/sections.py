"""The sections of the stage configs: RL (with the methods' settings and LoRA), and, from their own
modules, model shape, SFT and reward model (config/supervised.py) and evaluation (config/evaluation.py).
The stage configs (config/stages.py) combine them with the run-wide keys; every field's description is
its documentation (`rloo <stage> --help-config`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from rloo.config.base import (
    MAX_BETA,
    MAX_CONNECT_S,
    MAX_GRAD_NORM,
    MAX_LR,
    MAX_SAMPLES,
    MAX_SCORE,
    MAX_STALENESS,
    MAX_STEPS,
    check_address,
    check_float32,
)
from rloo.config.evaluation import EvalSettings  # noqa: F401 (the sections are imported from here)
from rloo.config.generation import (
    MinNewTokens,
    RepetitionPenalty,
    Stop,
    TopK,
    TopP,
    check_min_new_tokens,
    check_temperature,
)
from rloo.config.memory import (
    RL_MICRO_UNIT,
    LoraSettings,
    check_micro_batch,
    micro_batch_field,
)
from rloo.config.method_choice import MethodChoice
from rloo.config.methods import METHOD_SPECS, names
from rloo.config.offpolicy import (
    IsBaselineShift,
    IsClipLow,
    IsCorrection,
    IsKL,
    IsToprSplit,
    LogprobsUnder,
    check_off_policy,
    truncates_logprobs,
)
from rloo.config.supervised import ArchConfig, RewardSettings, SFTSettings  # noqa: F401 (re-exported, as EvalSettings)

# The methods are written once, in rloo.config.methods' table; these are derived from it.
ALGORITHMS: tuple[str, ...] = names()
OFFLINE_ALGORITHMS = names(online=False)  # trained on preference pairs, not on samples (rloo.training.dpo)
ONLINE_ALGORITHMS = names(online=True)
GROUP_ALGORITHMS = tuple(n for n, s in METHOD_SPECS.items() if s.groups)  # baselines from the same prompt's samples
if TYPE_CHECKING:
    Algorithm = str
else:
    Algorithm = Literal[ALGORITHMS]
    """The built-in methods' names as a type (`RLSettings.algorithm` also takes ones added by add_method)."""


class RLSettings(MethodChoice):
    """Hyperparameters of the RL stage (RLOO by default, eq. 1, 4, 5)."""

    steps: int = Field(
        default=100, ge=1, le=MAX_STEPS, description="Optimizer steps (one fresh batch of samples each)."
    )
    batch_size: int = Field(default=16, ge=1, description="Prompts per step (B); N = B*k completions.")
    micro_batch_size: int | None = micro_batch_field(RL_MICRO_UNIT)
    k: int = Field(
        default=4,
        ge=1,
        le=MAX_SAMPLES,
        description="Samples per prompt for the leave-one-out baseline (eq. 4), >= 2 (at most 4096).",
    )
    beta: float = Field(default=0.25, ge=0, le=MAX_BETA, description="KL coefficient in the shaped reward (eq. 1).")
    lr: float = Field(default=1e-4, gt=0, le=MAX_LR, description="AdamW learning rate (constant after warm-up).")
    warmup_steps: int = Field(default=10, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0, le=MAX_GRAD_NORM)
    temperature: float = Field(
        default=1.0, ge=0, description="Sampling temperature; log-probs use it too (>= 0.01; 0 only in eval)."
    )
    top_p: TopP = 1.0
    top_k: TopK = 0
    min_new_tokens: MinNewTokens = 0
    stop: Stop = Field(default_factory=list)
    repetition_penalty: RepetitionPenalty = 1.0
    logprobs_under: LogprobsUnder = None
    max_new_tokens: int = Field(default=16, ge=1, description="Completion length limit (T).")
    truncation_penalty: float | None = Field(
        default=None,
        ge=-MAX_SCORE,
        le=MAX_SCORE,
        description="If set, the score of a completion that hits max_new_tokens without EOS (|value| <= 1e6).",
    )
    log_every: int = Field(default=1, ge=1, description="Steps between metric records.")
    disable_dropout: bool = Field(
        default=True,
        description="Dropout off in the policy, reference, reward and value models (and DPO's policy): "
        "sampling and the update see the same function, so ratios start at 1 and DDP "
        "processes agree. false keeps each model's configured dropout in the update.",
    )
    share_prompt: bool = Field(
        default=True,
        description="Compute each prompt once per group of k (generation, reference, reward model, "
        "policy forward and backward; every method's update, a minibatch of random rows computing "
        "each of its distinct prompts once, and DPO's chosen/rejected pairs); the same math as k "
        "copies, less compute.",
    )
    max_logits_mb: float = Field(
        default=256,
        gt=0,
        description="Largest float32 (positions x vocabulary) logits tensor a log-prob pass may hold; "
        "above it the LM head runs in chunks of this size and recomputes its logits in "
        "backward (Llama/Mistral/Qwen2/Qwen3 heads), so a 150k vocabulary does not cost GBs.",
    )

    @model_validator(mode="after")
    def _micro_batches(self):
        check_micro_batch(self.micro_batch_size, self.batch_size, "batch_size", self.off_policy_correction)
        return self

    @field_validator("temperature")
    @classmethod
    def _not_greedy(cls, v: float) -> float:
        return check_temperature(v, greedy=False)

    @model_validator(mode="after")
    def _captured_needs_sampler(self):
        if self.captured_decode == "on" and self.generation != "sampler":
            raise ValueError("captured_decode=on is rloo's own sampler's; generation=vllm decodes in vLLM (unset it)")
        return self

    @model_validator(mode="after")
    def _min_within_max(self):
        check_min_new_tokens(self.min_new_tokens, self.max_new_tokens)
        return self

    @model_validator(mode="after")
    def _k_at_least_two(self):
        why = METHOD_SPECS[self.algorithm].groups
        if self.k < 2 and why:
            raise ValueError(f"{why}, got k={self.k}")
        return self

    @model_validator(mode="after")
    def _off_policy_methods_only(self):
        check_off_policy(self)  # rloo.config.offpolicy: which methods and settings combine with the lag
        truncates_logprobs(self)  # refuses logprobs_under=truncated where it cannot hold
        return self

    truncated_logprobs = property(truncates_logprobs)  # rl.logprobs_under resolved (rloo.config.offpolicy)

    @property
    def off_policy_correction(self) -> str | None:
        """The importance correction the update applies; None: the paper's on-policy update (today's path)."""
        if self.max_staleness == 0 and self.is_correction in (None, "none"):
            return None
        return self.is_correction or ("tis" if METHOD_SPECS[self.algorithm].importance else "none")

    @property
    def ring_lag(self) -> int:
        """The weight ring keeps ring_lag + 1 versions (rloo.runtime.link.weights): min(N, steps), since batch
        t < steps needs versions max(0, t - N) .. t, at most min(N, steps) + 1 of them (N = 30000 on a
        2-step run allocated 30001 copies)."""
        return min(self.max_staleness, self.steps)

    sample_every: int = Field(
        default=50,
        ge=1,
        description="Steps between sample tables (prompt, completion, score, KL, advantage) in the trackers "
        "and printed samples.",
    )
    eval_every: int | None = Field(
        default=20, ge=1, description="Steps between evals by eval.judge, one line each (null: off; env=: episodes)."
    )
    eval_prompts: int = Field(default=128, ge=1, description="Held-out prompts used by the periodic eval.")
    eval_split: Literal["eval", "valid"] = Field(
        default="eval",
        description="Built-in task: the split the periodic and final evals draw from (valid: the validation "
        "prompts `rloo compare` tunes on, disjoint from eval's).",
    )
    save_every: int | None = Field(default=100, ge=1, description="Steps between checkpoints (null: only at the end).")
    keep_checkpoints: int = Field(default=2, ge=1, description="Newest checkpoints kept on disk.")
    max_skipped_steps: int = Field(default=5, ge=1, description="Non-finite steps in a row before the run stops.")
    max_param_growth: float = Field(
        default=10.0,
        gt=1,
        description="Guard: an update that leaves the trainable parameters' norm above this many "
        "times its value at the start (or any weight or optimizer value non-finite) is "
        "undone and counted as a skipped step.",
    )
    # -- scaling out (rloo.runtime.distributed, rloo.modeling.loading, rloo.rollout.vllm) --
    lora: LoraSettings | None = Field(
        default=None, description="Train LoRA adapters instead of all weights (needs peft)."
    )
    parallel: Literal["ddp", "fsdp"] = Field(
        default="ddp", description="Under torchrun: ddp replicates the policy, fsdp shards it (FSDP2, fully_shard)."
    )
    generation: Literal["sampler", "vllm"] = Field(
        default="sampler", description="Rollout backend: rloo's sampler or vLLM (on the trainer's device, CPU or GPU)."
    )
    captured_decode: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="rloo's sampler: decode with one fixed-shape step over a static KV cache, captured once as a "
        "CUDA graph and replayed per token (rloo.rollout.captured). auto: captured on CUDA where supported, "
        "the eager loop elsewhere; on: captured (on CPU the same static step without a graph); off: the eager "
        "loop. Settings it cannot serve fall back to the eager loop with one line saying why.",
    )
    vllm_gpu_memory_utilization: float = Field(
        default=0.3,
        gt=0,
        lt=1,
        description="GPU memory share vLLM may take (its KV cache is sized for one step's rows).",
    )
    # -- asynchronous / off-policy RL (docs/async.md; rloo.core.importance) --
    max_staleness: int = Field(
        default=0,
        ge=0,
        le=MAX_STALENESS,
        description="Updates a batch's sampling weights may lag the trained ones (N); 0: synchronous, as "
        "in the paper. Online methods (dpo is offline); N > 0 corrects with importance weights (is_correction; "
        "raft trains on the lagged samples as they are). The run keeps min(N, steps) + 1 copies of the policy.",
    )
    is_correction: IsCorrection = None
    is_clip: float = Field(default=2.0, gt=1, description="C of is_correction: truncation / mask bound (a float32).")
    _is_clip = field_validator("is_clip")(classmethod(lambda cls, v: check_float32(v)))
    is_baseline_shift: IsBaselineShift = 0.1
    is_clip_low: IsClipLow = 0.0
    is_topr_split: IsToprSplit = "advantage"
    is_kl: IsKL = "weighted"
    producer_address: str | None = Field(
        default=None,
        description="max_staleness > 0: HOST:PORT this trainer hosts for a rollout producer on another "
        "machine (`rloo produce address=HOST:PORT` there; docs/async.md); null: a producer process here.",
    )
    _address = field_validator("producer_address")(classmethod(lambda cls, v: check_address(v)))
    producer_connect_timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=MAX_CONNECT_S,
        description="producer_address: seconds the trainer waits for `rloo produce` to join (then one line, exit 2).",
    )
    reward_weights: dict[str, float] = Field(
        default_factory=dict,
        description="Weights when several reward sources are given: keys "
        "'reward_model' or a reward_fn spec; default 1 each.",
    )


class SharedRLSettings(RLSettings):
    """`rloo compare`'s rl section: shared by every method, so it may hold any method's settings
    (each method's run takes the given ones it has: rloo.experiments.compare.method_config)."""

    checks_own_settings: ClassVar[bool] = False

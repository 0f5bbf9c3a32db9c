"""The sections of the supervised stages: SFT (with the shape of a model built from scratch) and the
reward model. Imported from rloo.config.sections with the other sections."""

from __future__ import annotations

from pydantic import Field, model_validator

from rloo.config.base import MAX_LR, MAX_WEIGHT_DECAY, Strict
from rloo.config.memory import SupervisedMemory
from rloo.config.saving import SupervisedSaving


class ArchConfig(Strict):
    """Shape of the small Llama built from scratch when no model path is given."""

    hidden_size: int = Field(default=128, gt=0, description="Model width.")
    num_layers: int = Field(default=3, gt=0, description="Transformer blocks.")
    num_heads: int = Field(default=4, gt=0, description="Attention heads (hidden_size must divide by it).")
    intermediate_size: int = Field(default=384, gt=0, description="MLP width.")
    max_position_embeddings: int = Field(default=128, gt=0, description="Longest prompt + response.")


class SFTSettings(SupervisedMemory, SupervisedSaving):
    """Hyperparameters of supervised fine-tuning on the task's reference responses."""

    num_examples: int = Field(default=6000, ge=1, description="Prompt/reference pairs generated for SFT.")
    epochs: int = Field(default=6, ge=1, description="Passes over the SFT data.")
    batch_size: int = Field(default=64, ge=1, description="Sequences per optimizer step.")
    lr: float = Field(default=3e-3, gt=0, le=MAX_LR, description="Peak AdamW learning rate (cosine decay to 10%).")
    weight_decay: float = Field(
        default=0.0, ge=0, le=MAX_WEIGHT_DECAY, description="AdamW decoupled weight decay (lr x weight_decay < 1)."
    )
    arch: ArchConfig = Field(default_factory=ArchConfig, description="Used only when `model` is null.")
    observation_loss: bool = Field(
        default=True,
        description="A built-in task's episode traces (calculator, guess): train on the environment's "
        "words too, its observations, which RL never trains on (predicting higher/lower is the game's "
        "rule: the guess game keeps them). false: the policy's words only, what `rloo pipeline "
        "task=calculator` sets (its tool output is arithmetic the policy need not predict; `rloo sft "
        "task=calculator` alone keeps the stage default, true).",
    )

    @model_validator(mode="after")
    def _decay_below_one(self):
        if self.lr * self.weight_decay >= 1:
            raise ValueError(
                f"weight_decay: lr x weight_decay must be below 1 (each step multiplies the weights by "
                f"1 - lr x weight_decay), got {self.lr:g} x {self.weight_decay:g}"
            )
        return self


class RewardSettings(SupervisedMemory, SupervisedSaving):
    """Hyperparameters of reward-model training with the Bradley-Terry loss."""

    num_pairs: int = Field(default=6000, ge=1, description="Preference pairs labeled by the simulated labeler.")
    eval_pairs: int = Field(default=500, ge=1, description="Held-out pairs for pairwise accuracy.")
    policy_pairs: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Share of pairs comparing two SFT-policy samples (the rest compare two references).",
    )
    epochs: int = Field(default=2, ge=1)
    batch_size: int = Field(default=64, ge=1)
    lr: float = Field(default=1e-3, gt=0, le=MAX_LR)
    model: str | None = Field(
        default=None,
        description="Model the reward model starts from (any architecture and tokenizer; a one-output "
        "head is added); null: the SFT model.",
    )
    disable_dropout: bool = Field(
        default=True,
        description="Dropout off in the reward model while it trains (chosen and rejected are scored "
        "by one function); false keeps the model's dropout.",
    )

"""Settings that trade memory for compute or for trained weights, shared by every training stage
(SFT, reward model, RL, DPO): micro-batches (gradient accumulation, rloo.core.accumulation) and
LoRA adapters (rloo.modeling.lora). Written once here; the stage sections inherit them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from rloo.config.base import Strict


class LoraSettings(Strict):
    """LoRA adapters through peft. The reference policy is the same model with adapters off."""

    r: int = Field(default=16, ge=1, description="Adapter rank.")
    alpha: float = Field(default=32, gt=0, description="Scaling numerator (scale = alpha / r).")
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] | str = Field(default="all-linear", description="Module names to adapt, or 'all-linear'.")
    save: Literal["merged", "adapter"] = Field(
        default="merged",
        description="merged: a plain model (loads without peft); adapter: adapter weights only (rloo's "
        "stages load them merged into their base).",
    )

    @field_validator("target_modules")
    @classmethod
    def _some_modules(cls, v: list[str] | str) -> list[str] | str:
        # PEFT would wrap no module (or fail deep inside) for an empty list or name
        if not v or any(not str(name).strip() for name in ([v] if isinstance(v, str) else v)):
            raise ValueError("name at least one module to adapt (e.g. [q_proj,v_proj]), or 'all-linear'")
        return v


MICRO_BATCH_RULE = (
    "the batch's update is split in micro-batches of this many {unit}, one forward and backward "
    "each, whose gradients are summed before the one clipped optimizer step: the same gradient as "
    "the whole batch at once (each micro-batch's loss weighted by its share of the batch's rows or "
    "tokens), less activation memory, more passes. The last micro-batch holds the remainder, and "
    "it may not exceed the batch; null: the whole batch in one pass"
)


def micro_batch_field(unit: str):
    """The `micro_batch_size` key of a section whose batch counts `unit` (its description says so)."""
    return Field(default=None, ge=1, description="Gradient accumulation: " + MICRO_BATCH_RULE.format(unit=unit) + ".")


class SupervisedMemory(Strict):
    """`micro_batch_size` and `lora` of a supervised stage (SFT, reward model)."""

    micro_batch_size: int | None = micro_batch_field("sequences (SFT) or preference pairs (reward model)")
    lora: LoraSettings | None = Field(
        default=None,
        description="Train LoRA adapters instead of all weights (needs peft); the reward model's score "
        "head is trained in full. lora.save=merged writes a plain model the next stage loads.",
    )

    @model_validator(mode="after")
    def _micro_within_batch(self):
        # a mixin of configs with and without a batch_size: the fields this one has
        check_micro_batch(self.micro_batch_size, dict(self).get("batch_size"), "batch_size")
        return self


RL_MICRO_UNIT = (
    "prompts, each with its k samples (a group is never split; the leave-one-out baseline, advantages "
    "and KL are computed on the whole batch first). Methods with minibatches split each minibatch's rows "
    "in parts of micro_batch_size x k; DPO: pairs per pass. Not with max_staleness > 0 or is_correction"
)


def check_micro_batch(micro: int | None, batch: int | None, name: str, off_policy: str | None = None) -> None:
    """A micro-batch larger than the batch is a mistake (it would be one pass), and the off-policy
    update needs the whole batch's current log-probs in one pass: one line each."""
    if micro is not None and batch is not None and micro > batch:
        raise ValueError(f"micro_batch_size: {micro} is larger than {name}={batch}; use at most {batch} (or null)")
    if micro is not None and off_policy is not None:
        raise ValueError(
            "micro_batch_size: the off-policy update (max_staleness > 0 or is_correction) needs the whole "
            "batch's current log-probs in one pass; leave micro_batch_size null"
        )

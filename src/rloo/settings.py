"""Config sections for bringing your own models and data, and for scaling out.

Kept apart from `rloo.config` so the per-stage configs stay readable; each section here is a
field of those configs (`dataset:`, `lora:`, `model:` options and the RL `distributed` keys).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rloo.strict import StrictModel


_Strict = StrictModel  # unknown keys and invalid values raise ConfigError (rloo.strict)


FIELDS = ("prompt", "completion", "chosen", "rejected")


class DatasetSettings(_Strict):
    """A dataset that replaces the built-in task's data (`dataset.path=...`).

    Each stage takes the fields it needs: SFT `prompt` + `completion`; reward `prompt` + `chosen`
    + `rejected`; RL `prompt`; eval `prompt` + `completion` (the reference it is judged against).
    """

    path: str = Field(..., description="Hub name, local .jsonl/.json/.parquet file, or a save_to_disk folder.")
    name: str | None = Field(None, description="Hub configuration name (the second argument of load_dataset).")
    split: str = Field("train", description="Split used for training.")
    eval_split: str | None = Field(None, description="Split for held-out evaluation (null: the training split's tail).")
    format: Literal["plain", "tldr", "hh"] = Field(
        "plain", description="plain: columns are the fields; tldr: post/title/subreddit -> prompt, summary "
                             "or chosen/rejected; hh: chosen/rejected dialogues split into prompt + responses.")
    columns: dict[str, str] = Field(default_factory=dict,
                                    description="Our field -> the dataset's column, e.g. {prompt: question}.")
    chat_template: bool = Field(True, description="Wrap prompts in the tokenizer's chat template when it has one.")
    limit: int | None = Field(None, ge=1, description="Use at most this many rows of each split.")

    @model_validator(mode="after")
    def _known_columns(self):
        bad = sorted(set(self.columns) - set(FIELDS) - {"post", "title", "subreddit", "summary"})
        if bad:
            raise ValueError(f"dataset.columns keys must be among {', '.join(FIELDS)} (or post/title/"
                             f"subreddit/summary for format=tldr); got {', '.join(bad)}")
        return self


class LoraSettings(_Strict):
    """LoRA adapters through peft. The reference policy is the same model with adapters off."""

    r: int = Field(16, ge=1, description="Adapter rank.")
    alpha: float = Field(32, gt=0, description="Scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | str = Field("all-linear", description="Module names to adapt, or 'all-linear'.")
    save: Literal["merged", "adapter"] = Field(
        "merged", description="merged: a plain model (loads without peft); adapter: adapter weights only.")

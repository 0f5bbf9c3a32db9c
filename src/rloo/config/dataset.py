"""The `dataset:` section: your own data instead of a built-in task's (a field of every stage config)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rloo.config.base import Strict

FIELDS = ("prompt", "completion", "chosen", "rejected")


class DatasetSettings(Strict):
    """A dataset that replaces the built-in task's data (`dataset.path=...`).

    Each stage takes the fields it needs: SFT `prompt` + `completion`; reward `prompt` + `chosen`
    + `rejected`; RL `prompt`; eval `prompt` + `completion` (the reference it is judged against).
    """

    path: str = Field(
        default="",
        description="Hub name, local .jsonl/.json/.parquet file, or a save_to_disk folder (required; in "
        "Python, dataset= can hand in a datasets.Dataset instead).",
    )
    name: str | None = Field(default=None, description="Hub configuration name (the second argument of load_dataset).")
    split: str = Field(default="train", description="Split used for training.")
    eval_split: str | None = Field(
        default=None,
        description="Split (or file) for held-out evaluation; null: rows held out of the training split "
        "by eval_fraction, which no stage trains on.",
    )
    eval_fraction: float = Field(
        default=0.1,
        gt=0,
        lt=1,
        description="Without eval_split: the share of distinct prompts held out for evaluation, chosen "
        "by a hash of the prompt (the same rows in every stage; rloo.data.split).",
    )
    format: Literal["plain", "tldr", "hh"] = Field(
        default="plain",
        description="plain: columns are the fields (TRL's conversational message lists and `messages` "
        "column too, rendered by the chat template); tldr: post/title/subreddit -> prompt, summary "
        "or chosen/rejected; hh: chosen/rejected dialogues split into prompt + responses.",
    )
    columns: dict[str, str] = Field(
        default_factory=dict, description="Our field -> the dataset's column, e.g. {prompt: question}."
    )
    chat_template: bool = Field(
        default=True, description="Wrap prompts in the tokenizer's chat template when it has one."
    )
    limit: int | None = Field(default=None, ge=1, description="Use at most this many rows of each split.")

    @model_validator(mode="after")
    def _known_columns(self):
        bad = sorted(set(self.columns) - set(FIELDS) - {"messages", "post", "title", "subreddit", "summary"})
        if bad:
            raise ValueError(
                f"dataset.columns keys must be among {', '.join(FIELDS)}, messages (or post/title/"
                f"subreddit/summary for format=tldr); got {', '.join(bad)}"
            )
        return self

"""What a stage cuts to fit its length limits: counted, said, and refused above a share.

A prompt longer than `max_prompt_tokens` keeps its LAST tokens (the response cue sits at the end),
so a chat template's system message is lost with its start. An SFT target longer than
`max_response_tokens` (its EOS counted) keeps its first tokens and loses its end and the EOS after
it: a model that never sees the EOS never learns to stop. A preference response loses its end.
Every stage counts its cuts (`rloo.data.collate.Encoded`, or `count` here for text it has not
encoded yet), says them in one line with the numbers, and refuses, before it writes anything, when
more than `max_cut_share` of one kind are cut (docs/configs.md#length-limits). A stage that runs
records its counts, zeros too, in its folder's `cuts.json`, which the pipeline's summary gathers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rloo.errors import RlooError
from rloo.runtime.inputs.hf import hf_config
from rloo.runtime.runfolder.atomic import atomic_write_text
from rloo.runtime.runfolder.reading import read_text
from rloo.runtime.tracking.log import say

if TYPE_CHECKING:  # the preflight imports this module and stays free of torch (collate's)
    from rloo.data.collate import Encoded

PROMPT_KEY, RESPONSE_KEY = "max_prompt_tokens", "max_response_tokens"
LOSES = {  # what each kind loses, for the printed line; keyed by its last word ("eval prompts": as prompts)
    "prompts": "keep their last {limit} tokens (a chat template's system message goes with their start)",
    "targets": "lose their end and their EOS at {limit} tokens (the model would not learn to stop)",
    "responses": "lose their end at {limit} tokens",
}
LOST = {"prompts": "start", "targets": "EOS", "responses": "end"}  # the same, in a word, for the pipeline's summary
CUTS_FILE = "cuts.json"  # a stage's record of its cuts, in its folder


@dataclass(frozen=True)
class Cut:
    """`n` of `total` texts of one kind (LOSES' keys) were longer than `limit` (the config's `key`);
    the longest held `longest` tokens (an SFT target's EOS counted)."""

    what: str
    n: int
    total: int
    longest: int
    key: str
    limit: int

    @property
    def share(self) -> float:
        return self.n / max(1, self.total)


def prompt_cut(enc: Encoded, limit: int) -> Cut:
    return Cut("prompts", enc.cut, len(enc.ids), enc.longest, PROMPT_KEY, limit)


def target_cut(enc: Encoded, limit: int) -> Cut:
    """SFT targets: a target counts as cut when it loses its EOS (its text may fit)."""
    return Cut("targets", enc.eos_cut, len(enc.ids), enc.longest, RESPONSE_KEY, limit)


def response_cut(enc: Encoded, limit: int) -> Cut:
    """Preference responses: cut when they lose text (a sampled response that filled the limit has no EOS to lose)."""
    return Cut("responses", enc.cut, len(enc.ids), enc.longest, RESPONSE_KEY, limit)


def context_of(model) -> int | None:
    """A model's context in tokens (config.max_position_embeddings; GPT-2's n_positions maps to it), or None."""
    # getattr: third-party: a transformers config without the key (remote code); None: no config
    n = getattr(hf_config(model), "max_position_embeddings", None)
    return n if isinstance(n, int) else None


def count(tokenizer, texts: list[str], what: str, limit: int, frame: int = 0) -> Cut:
    """The cut of `texts` without encoding a batch: their token lengths (an SFT target's with its EOS;
    `frame`: tokens written around each, an episode's chat template around its prompt)."""
    lengths = [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]] if texts else []
    lengths = [n + frame + (what == "targets") for n in lengths]
    key = PROMPT_KEY if what.endswith("prompts") else RESPONSE_KEY
    return Cut(what, sum(n > limit for n in lengths), len(lengths), max(lengths, default=0), key, limit)


def cut_line(stage: str, cuts: list[Cut]) -> str | None:
    """`sft: cut to the length limits: 12 of 200 prompts (6%, longest 88 tokens) keep their last 64
    tokens (...); ...`, or None when nothing was cut."""
    parts = [
        f"{c.n} of {c.total} {c.what} ({c.share:.0%}, longest {c.longest} tokens) "
        + LOSES[c.what.split()[-1]].format(limit=f"{c.key}={c.limit}")
        for c in cuts
        if c.n
    ]
    return f"{stage}: cut to the length limits: {'; '.join(parts)}" if parts else None


def cut_metrics(cuts: list[Cut]) -> dict[str, float]:
    """`data/prompts_cut`, `data/targets_cut`, ...: how many of each kind were cut (logged when any was)."""
    return {f"data/{c.what.replace(' ', '_')}_cut": float(c.n) for c in cuts} if any(c.n for c in cuts) else {}


def check_cuts(stage: str, cuts: list[Cut], max_share: float, context: int | None = None) -> None:
    """One RlooError line for the first kind cut in more than `max_share` of its texts, saying the
    limit that would keep them whole (or that the model's `context` cannot) and the key to allow it."""
    for c in cuts:
        if c.n and c.share > max_share:
            fix = (
                f"set {c.key}={c.longest} to keep them whole"
                if context is None or c.longest <= context
                else f"the model's context holds {context} tokens: shorten those examples"
            )
            raise RlooError(
                f"{stage}: {c.n} of {c.total} {c.what} ({c.share:.0%}) are longer than {c.key}={c.limit} "
                f"(longest {c.longest} tokens{' with its EOS' if c.what == 'targets' else ''}), more than "
                f"max_cut_share={max_share:g}: {fix}, or set max_cut_share=1 to use them cut"
            )


def report_cuts(stage: str, cuts: list[Cut], max_share: float, context: int | None = None) -> list[Cut]:
    """Refuse above `max_share` (check_cuts), else say what was cut; returns `cuts`, for the stage
    to log (cut_metrics) and record (save_cuts) once its folder exists."""
    check_cuts(stage, cuts, max_share, context)
    if line := cut_line(stage, cuts):
        say(line)
    return cuts


def report_prompt_cuts(
    stage: str, tokenizer, cfg, prompts: list[str], held_out: list[str], model, frame: int = 0
) -> list[Cut]:
    """A sampling stage's prompts (training and held-out), surveyed before they are encoded batch by
    batch; `frame`: the tokens an episode's chat template writes around each (rloo.data.chat_turns)."""
    cuts = [count(tokenizer, prompts, "prompts", cfg.max_prompt_tokens, frame)]
    cuts += [count(tokenizer, held_out, "eval prompts", cfg.max_prompt_tokens, frame)] if held_out else []
    return report_cuts(stage, cuts, cfg.max_cut_share, context_of(model))


def save_cuts(folder: Path, cuts: list[Cut]) -> None:
    """`cuts.json` in a stage's folder: `{kind: {"cut": n, "of": total, "longest": tokens, key: limit}}`
    for every kind counted, zeros too (nothing cut is said there, not left out)."""
    record = {c.what: {"cut": c.n, "of": c.total, "longest": c.longest, c.key: c.limit} for c in cuts}
    atomic_write_text(Path(folder) / CUTS_FILE, json.dumps(record, indent=2) + "\n")


def read_cuts(folder: Path) -> dict | None:
    """A stage folder's `cuts.json`, or None where there is none (a stage that never surveyed its data)."""
    try:
        held = json.loads(read_text(Path(folder) / CUTS_FILE))
    except (OSError, ValueError):
        return None
    return held if isinstance(held, dict) else None


def cuts_summary(stages: dict[str, dict]) -> str:
    """One line of every stage's record (read_cuts), as `sft 20/20 prompts (start lost), 0/20
    targets; reward ...`: cut of counted, and what the cut ones lost (LOST)."""

    def kind(what: str, c: dict) -> str:
        lost = f" ({LOST[what.split()[-1]]} lost)" if c["cut"] else ""
        return f"{c['cut']}/{c['of']} {what}{lost}"

    parts = [f"{stage} " + ", ".join(kind(w, c) for w, c in rec.items()) for stage, rec in stages.items() if rec]
    return "cut to the length limits: " + ("; ".join(parts) if parts else "nothing counted")

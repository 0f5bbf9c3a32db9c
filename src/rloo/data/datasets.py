"""Your own data for every stage: a Hub dataset, a local JSONL / JSON / CSV / Parquet file, or a
`save_to_disk` folder, turned into records with the fields each stage needs.

    SFT     prompt, completion          reward  prompt, chosen, rejected
    RL      prompt                      eval    prompt, completion (the reference)

Formats (`dataset.format`):
- plain: the fields are columns (renamed with `dataset.columns`, e.g. {prompt: question}).
- tldr: Reddit TL;DR-style. The prompt is built from `post` (and `title`, `subreddit` when
  present, also inside an `info` dict as in openai/summarize_from_feedback) as
  "SUBREDDIT: r/...\\nTITLE: ...\\nPOST: ...\\nTL;DR:"; the completion is `summary`; preference pairs
  are `chosen`/`rejected` columns or `summaries` + `choice` (the index of the preferred one).
  A `prompt` column, when there is one, is used as is.
- hh: Anthropic HH-style. `chosen` and `rejected` hold whole dialogues ("\\n\\nHuman: ...
  \\n\\nAssistant: ...", or lists of {role, content} messages); the prompt is everything up to the
  final assistant turn, the responses are that turn of each dialogue.
Prompts are wrapped in the tokenizer's chat template when it has one (and `chat_template` is on).
With format plain, rows in TRL's conversational formats (message lists, a `messages` column) are
read by rloo.data.conversational.
A row's other columns (all but those its prompt is read from, and `prompt`, `completion`,
`messages`) are kept in `Record.columns`; the stages' prompts carry them to the reward functions
and judges as keyword arguments, as TRL's do (rloo.data.columns).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rloo.config import DatasetSettings
from rloo.data import conversational
from rloo.data.chat_turns import has_chat_template
from rloo.data.columns import extra_columns, with_columns
from rloo.data.tables import load_table
from rloo.data.textcheck import rows
from rloo.errors import RlooError

HUMAN, ASSISTANT = "\n\nHuman:", "\n\nAssistant:"


@dataclass
class Record:
    prompt: str
    completion: str | None = None
    chosen: str | None = None
    rejected: str | None = None
    # a conversational row's messages (prompt turns, {field: reply turns}), for the chat template
    turns: tuple | None = field(default=None, repr=False, compare=False)
    # the row's other columns (name -> value), for the reward functions and judges (rloo.data.columns)
    columns: dict = field(default_factory=dict, repr=False, compare=False)


def load_records(
    settings: DatasetSettings,
    fields: tuple[str, ...],
    split: str | None = None,
    tokenizer=None,
    optional: tuple[str, ...] = (),
) -> list[Record]:
    """Every record of `split` (default: the training split) with `fields` filled, in dataset order;
    `optional` fields are filled too when the dataset has them. The stages read their rows through
    rloo.data.split instead, which keeps the held-out rows out of training."""
    return with_chat_template(read_records(settings, fields, split, optional), settings, tokenizer)


def read_records(
    settings: DatasetSettings, fields: tuple[str, ...], split: str | None = None, optional: tuple[str, ...] = ()
) -> list[Record]:
    """`load_records` before the chat template: prompts as the data has them."""
    split = split or settings.split
    path = split if split != settings.split and _is_file(split) else settings.path
    table = load_table(path, settings.name, split)
    if settings.limit is not None:
        table = table.select(range(min(settings.limit, len(table))))
    if len(table) == 0:
        raise RlooError(f"dataset {path!r} split {split!r} is empty")
    convert = {"plain": _plain, "tldr": _tldr, "hh": _hh}[settings.format]
    cols = set(table.column_names)
    fields = tuple(fields) + tuple(f for f in optional if _present(settings, f, cols))
    used = _prompt_columns(settings)
    if settings.format == "plain" and conversational.is_conversational(next(rows(table, path)), settings.columns):
        # TRL's message lists: plain text here (what the split's hash reads), the turns kept for the
        # chat template (with_chat_template)
        return [
            Record(
                **conversational.convert(row, fields, _reader(row, settings.columns, cols, path), settings.columns),
                columns=extra_columns(row, used),
            )
            for row in rows(table, path)
        ]
    return [_with_extra(convert(row, settings.columns, fields, cols, path), row, used) for row in rows(table, path)]


# per format, the fields a row's prompt (and a tldr/hh row's response) is read from
PROMPT_SOURCES = {
    "plain": ("prompt", "messages"),
    "tldr": ("prompt", "post", "title", "subreddit", "summary", "info"),
    "hh": ("chosen", "rejected"),
}


def _prompt_columns(settings: DatasetSettings) -> set[str]:
    """The columns a row's prompt is read from, which no reward function is given as a column."""
    return {settings.columns.get(n) or n for n in PROMPT_SOURCES[settings.format]}


def _with_extra(rec: Record, row: dict, used: set[str]) -> Record:
    rec.columns = extra_columns(row, used)
    return rec


def with_chat_template(records: list[Record], settings: DatasetSettings, tokenizer) -> list[Record]:
    """The records in the tokenizer's chat template, when it has one and it is on: the prompt, or a
    conversational row's every field, rendered from its turns. Each prompt then holds its row's
    other columns (a rloo.data.columns.Prompt), the final text a stage samples from."""
    templated = tokenizer is not None and settings.chat_template and has_chat_template(tokenizer)
    for r in records:
        if templated and r.turns is not None:
            for name, text in conversational.render(r.turns, tokenizer).items():
                setattr(r, name, text)
        elif templated:
            r.prompt = apply_chat_template(tokenizer, r.prompt)
        r.prompt = with_columns(r.prompt, r.columns)
    return records


def _present(settings: DatasetSettings, field: str, cols: set) -> bool:
    if settings.format == "hh" or field in settings.columns:
        return True
    if field == "completion" and settings.columns.get("messages", "messages") in cols:
        return True  # a conversation's last assistant message
    alt = {"completion": "summary"} if settings.format == "tldr" else {}
    return field in cols or alt.get(field) in cols


def _is_file(s: str) -> bool:
    return Path(s).is_file() or Path(s).is_dir()


def _column(row: dict, field: str, columns: dict, cols: set, path: str, default: str | None = None, fmt: str = ""):
    col = columns.get(field, default or field)
    if col not in cols:
        hint = _tldr_hint(cols) if fmt != "tldr" else ""  # format=tldr is what the user set already
        raise RlooError(
            f"dataset {path!r} has no column {col!r} for {field!r} (columns: {', '.join(sorted(cols))}); "
            f"map one with dataset.columns.{field}=COLUMN{hint}"
        )
    return row[col]


def _tldr_hint(cols: set) -> str:
    """TL;DR-shaped columns (openai/summarize_from_feedback's comparisons, or posts) read as format=tldr."""
    return " or set dataset.format=tldr" if {"summaries", "choice"} <= cols or "post" in cols else ""


def _reader(row: dict, columns: dict, cols: set, path: str):
    return lambda field: _column(row, field, columns, cols, path)


def _plain(row, columns, fields, cols, path) -> Record:
    values: dict[str, Any] = {f: _text(_column(row, f, columns, cols, path)) for f in fields}  # Record's text fields
    return Record(**values)


def _text(v) -> str:
    if not isinstance(v, str):
        raise RlooError(f"expected text in the dataset, got {type(v).__name__}: {str(v)[:60]!r}")
    return v


def tldr_prompt(post: str, title: str | None = None, subreddit: str | None = None) -> str:
    """The TL;DR prompt layout of Stiennon et al. (2020), also used by the RLOO paper's TL;DR runs."""
    head = (f"SUBREDDIT: r/{subreddit}\n" if subreddit else "") + (f"TITLE: {title}\n" if title else "")
    return f"{head}POST: {post.strip()}\nTL;DR:"


def _tldr(row, columns, fields, cols, path) -> Record:
    if "prompt" in columns or "prompt" in cols:
        prompt = _text(_column(row, "prompt", columns, cols, path, fmt="tldr"))
    else:
        src = row["info"] if "info" in cols and isinstance(row["info"], dict) else row
        keys = set(src) if src is not row else cols
        get = lambda f: src.get(columns.get(f, f)) if columns.get(f, f) in keys else None  # noqa: E731
        post = get("post")
        if post is None:
            raise RlooError(
                f"dataset {path!r} (format tldr) has no 'post' or 'prompt' column (columns: "
                f"{', '.join(sorted(cols))}); map one with dataset.columns.post=COLUMN"
            )
        prompt = tldr_prompt(post, get("title"), get("subreddit"))
    rec = Record(prompt)
    if "completion" in fields:
        name = "completion" if ("completion" in columns or "completion" in cols) else "summary"
        rec.completion = " " + _text(_column(row, "completion", columns, cols, path, default=name, fmt="tldr")).strip()
    if "chosen" in fields:
        if "summaries" in cols and "chosen" not in columns:
            texts = [s["text"] if isinstance(s, dict) else s for s in row["summaries"]]
            choice = int(_column(row, "choice", {}, cols, path, fmt="tldr"))
            chosen, rejected = texts[choice], texts[1 - choice]
        else:
            chosen = _text(_column(row, "chosen", columns, cols, path, fmt="tldr"))
            rejected = _text(_column(row, "rejected", columns, cols, path, fmt="tldr"))
        rec.chosen, rec.rejected = " " + chosen.strip(), " " + rejected.strip()
    return rec


def split_dialogue(dialogue) -> tuple[str, str]:
    """(prompt up to and including the final assistant cue, the final assistant response).
    Text in the HH layout, or a list of {role, content} messages (the prompt is then rendered in
    the same HH layout; a chat template, when used, re-renders it from the turns)."""
    if isinstance(dialogue, list):
        if not dialogue or dialogue[-1].get("role") != "assistant":
            raise RlooError("an hh dialogue given as messages must end with an assistant message")
        turns = "".join(f"{HUMAN if m['role'] == 'user' else ASSISTANT} {m['content']}" for m in dialogue[:-1])
        return turns + ASSISTANT, " " + dialogue[-1]["content"].strip()
    i = dialogue.rfind(ASSISTANT)
    if i < 0:
        raise RlooError(f"an hh dialogue has no {ASSISTANT.strip()!r} turn: {dialogue[:60]!r}")
    return dialogue[: i + len(ASSISTANT)], " " + dialogue[i + len(ASSISTANT) :].strip()


def _hh(row, columns, fields, cols, path) -> Record:
    prompt, chosen = split_dialogue(_column(row, "chosen", columns, cols, path))
    rec = Record(prompt, completion=chosen)
    if "rejected" in fields:
        r_prompt, rejected = split_dialogue(_column(row, "rejected", columns, cols, path))
        if r_prompt != prompt:  # HH pairs share the context; a pair that does not is not a pair
            raise RlooError(f"dataset {path!r}: chosen and rejected dialogues differ before the last assistant turn")
        rec.chosen, rec.rejected = chosen, rejected
    return rec


def dialogue_messages(prompt: str) -> list[dict]:
    """HH-layout prompt text -> chat messages (the final empty assistant cue dropped)."""
    if HUMAN not in prompt:
        return [{"role": "user", "content": prompt.strip()}]
    msgs = []
    for part in prompt.split(HUMAN)[1:]:
        human, *rest = part.split(ASSISTANT)
        msgs.append({"role": "user", "content": human.strip()})
        msgs += [{"role": "assistant", "content": r.strip()} for r in rest if r.strip()]
    return msgs


def apply_chat_template(tokenizer, prompt: str) -> str:
    """The prompt as the tokenizer's chat template renders it, ending with the assistant cue."""
    return tokenizer.apply_chat_template(dialogue_messages(prompt), tokenize=False, add_generation_prompt=True)

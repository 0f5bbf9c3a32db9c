"""TRL's conversational dataset formats: rows whose fields are lists of {role, content} messages.

    SFT / eval      prompt + completion as message lists, or one `messages` column: the last
                    assistant message is the completion, the messages before it the prompt
    prompt-only     prompt as a message list (or `messages` without a final assistant turn)
    preference      prompt + chosen + rejected (the responses as assistant message lists), or
                    chosen + rejected as whole conversations with the prompt implicit: the turns
                    before the last, which must be the same in both

The prompt is rendered by the tokenizer's chat template with `add_generation_prompt=True` (it ends
with the assistant cue, where sampling starts); a response is what the template adds for it after
that prompt, less a trailing EOS token (the stages append EOS themselves). So the SFT loss, which
covers the completion only, falls on the final assistant turn's tokens (and its end-of-turn).
Without a chat template (or with `dataset.chat_template=false`) the turns are laid out as
"\\n\\nHuman: ...\\n\\nAssistant:" text, the layout of format=hh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

from rloo.data.chat_turns import has_chat_template
from rloo.errors import RlooError

ROLES = {"system": "\n\nSystem:", "user": "\n\nHuman:", "assistant": "\n\nAssistant:"}


def is_messages(value) -> TypeGuard[list[dict]]:
    """Whether `value` is a non-empty list of {role, content} messages."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)
    )


def is_conversational(row: dict, columns: dict[str, str]) -> bool:
    """Whether a row is in a conversational format: a `messages` column (and no `prompt` one), or
    any of the fields (after `dataset.columns` renaming) holding a message list."""
    if columns.get("messages", "messages") in row and columns.get("prompt", "prompt") not in row:
        return True
    return any(is_messages(row.get(columns.get(f, f))) for f in ("prompt", "completion", "chosen", "rejected"))


def convert(row: dict, fields: tuple[str, ...], column: Callable[[str], object], columns: dict) -> dict[str, Any]:
    """One conversational row -> the plain text of `fields` (prompt, completion, chosen, rejected) and
    its `turns`, from which `render` writes them in a chat template. `column(field)` reads a field's
    column (one error line when it is missing)."""
    turns = _turns(row, fields, column, columns)
    return render(turns) | {"turns": turns}


def render(turns: tuple[list[dict], dict[str, list[dict]]], tokenizer=None) -> dict[str, str]:
    """The text of a row's fields from its (prompt turns, {field: reply turns}): the tokenizer's chat
    template when it has one, else the plain layout."""
    prompt, replies = turns
    fmt = _renderer(tokenizer)
    return {"prompt": fmt(prompt, None)} | {f: fmt(prompt, reply) for f, reply in replies.items()}


def _turns(row, fields, column, columns) -> tuple[list[dict], dict[str, list[dict]]]:
    """(prompt messages, {field: reply messages}) of one row, in whichever layout it has."""
    key, prompt_col = columns.get("messages", "messages"), columns.get("prompt", "prompt")
    if key in row and row[key] is not None and prompt_col not in row:
        prompt, last = _split_last_reply(_messages(row[key], "messages"), "messages", need="completion" in fields)
        # a conversation is one response, not a pair: chosen/rejected come from their own columns
        return prompt, {f: last if f == "completion" else _messages(column(f), f) for f in fields if f != "prompt"}
    if prompt_col in row and row[prompt_col] is not None:
        prompt = _messages(row[prompt_col], "prompt")
        return prompt, {f: _messages(column(f), f) for f in fields if f != "prompt"}
    # implicit prompt: chosen and rejected are whole conversations sharing every turn but the last
    chosen, last = _split_last_reply(_messages(column("chosen"), "chosen"), "chosen", need=True)
    replies = {f: last for f in fields if f in ("chosen", "completion")}
    if "rejected" in fields:
        r_prompt, replies["rejected"] = _split_last_reply(_messages(column("rejected"), "rejected"), "rejected", True)
        if r_prompt != chosen:
            raise RlooError("a conversational pair's chosen and rejected differ before their last assistant message")
    return chosen, replies


# the roles chat templates know; another (ShareGPT's "human"/"gpt") would be rendered as a user turn
KNOWN_ROLES = ("system", "user", "assistant", "tool")


def _messages(value, field: str) -> list[dict]:
    if isinstance(value, str) and field != "messages":  # text next to message lists: a user turn or the reply
        return [{"role": "user" if field == "prompt" else "assistant", "content": value}]
    if not is_messages(value):
        raise RlooError(
            f"conversational field {field!r} must be a list of {{role, content}} messages, got {value!r:.80}"
        )
    for i, m in enumerate(value):
        if m["role"] not in KNOWN_ROLES:
            raise RlooError(
                f"conversational field {field!r}: message {i} has role {m['role']!r:.40}; expected one of "
                f"{', '.join(KNOWN_ROLES)}"
            )
        if not isinstance(m["content"], str):  # None would be rendered as the text "None"
            raise RlooError(
                f"conversational field {field!r}: message {i} has content {m['content']!r:.40}, expected text"
            )
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _split_last_reply(msgs: list[dict], field: str, need: bool) -> tuple[list[dict], list[dict]]:
    """(the messages before the final assistant message, [that message]); without a final
    assistant message the whole list is a prompt, which only prompt-only use accepts."""
    if msgs[-1]["role"] == "assistant":
        if len(msgs) == 1:
            raise RlooError(f"conversational field {field!r} has an assistant message and no prompt before it")
        return msgs[:-1], msgs[-1:]
    if need:
        raise RlooError(f"conversational field {field!r} must end with an assistant message (the response)")
    return msgs, []


def _renderer(tokenizer) -> Callable[[list[dict], list[dict] | None], str]:
    """render(prompt, None) -> prompt text ending with the assistant cue; render(prompt, reply) ->
    the reply's text as it follows that prompt."""
    if not has_chat_template(tokenizer):
        return _plain_render
    return lambda prompt, reply: chat_render(tokenizer, prompt, reply)


def _plain_render(prompt: list[dict], reply: list[dict] | None) -> str:
    if reply is None:
        return "".join(f"{ROLES.get(m['role'], ROLES['user'])} {m['content']}" for m in prompt) + ROLES["assistant"]
    return " " + " ".join(m["content"].strip() for m in reply)


def chat_render(tokenizer, prompt: list[dict], reply: list[dict] | None) -> str:
    """The chat template's text of `prompt` (add_generation_prompt=True), or of `reply` after it."""
    head = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    if reply is None:
        return head
    full = tokenizer.apply_chat_template(prompt + reply, tokenize=False)
    if not full.startswith(head):
        raise RlooError(
            "the tokenizer's chat template renders a conversation with another beginning than its prompt "
            "with add_generation_prompt=True, so the response cannot be cut out; set dataset.chat_template=false"
        )
    text, eos = full[len(head) :], tokenizer.eos_token
    if eos and text.rstrip().endswith(eos):  # the stages append EOS to every response themselves
        text = text.rstrip()[: -len(eos)]
    return text

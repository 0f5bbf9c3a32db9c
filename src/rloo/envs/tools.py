"""Tools as plain Python callables, a tool-call format read from the policy's tokens, and an
environment built on them.

Format (words of the policy's turn): ``call <tool> <argument words> end``; the turn stops at
``end`` (the environment's stop token), the tool runs on the argument text and its result comes
back as the observation ``out <result>``. A tool that raises, returns a non-string or runs past
its timeout gives a one-line error record as the result (``error <tool> <what happened>``): the
policy reads it, the run goes on.

The policy's ids are decoded here only to *parse* the call; the trajectory keeps the sampled ids
(rloo.rollout.multiturn), and the observation is tokenized once, by this environment.
"""

from __future__ import annotations

from collections.abc import Callable

from rloo.envs.base import Step, turn_text
from rloo.runtime.threads import call_all

CALL, END, OUT, ERROR = "call", "end", "out", "error"
WORDS: tuple[str, ...] = (CALL, END, OUT, ERROR)  # the words a task's vocabulary needs for this format
Tool = Callable[[str], str]  # argument text -> result text


def parse_call(words: list[str]) -> tuple[str, str] | None:
    """(tool name, argument text) when the turn's words end with ``end`` after a ``call <tool>``
    (the last ``call`` counts); None for a turn that is not a tool call."""
    if not words or words[-1] != END or CALL not in words[:-1]:
        return None
    start = len(words) - 1 - words[::-1].index(CALL)
    body = words[start + 1 : -1]
    return (body[0], " ".join(body[1:])) if body else None


def _one_line(text: str, limit: int = 120) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def call_tool(tools: dict[str, Tool], name: str, args: str, timeout_s: float) -> tuple[str, bool]:
    """Run tool `name` on `args` with a timeout: (result text, ok). A failure is a one-line record,
    never an exception. The call runs in a daemon thread (rloo.runtime.threads): a tool that hangs
    keeps its thread until it returns, but the episode goes on without it."""
    fn = tools.get(name)
    if fn is None:
        return _one_line(f"{ERROR} {name} unknown tool; tools: {' '.join(sorted(tools))}"), False
    status, value = call_all([lambda: fn(args)], timeout_s)[0]
    if status == "timeout":
        return f"{ERROR} {name} timed out after {timeout_s:g} s", False
    if status == "raised":
        return _one_line(f"{ERROR} {name} raised {type(value).__name__}: {value}"), False
    if not isinstance(value, str):
        return f"{ERROR} {name} returned {type(value).__name__}, expected str", False
    return _one_line(value), True


class ToolEnv:
    """An episode in which the policy may call tools before it answers.

    A turn ``call <tool> <args> end`` is answered with ``out <result>``; any other turn is the
    answer: the episode ends with reward ``score(prompt, answer text)``. `tool_calls` and
    `tool_errors` count this episode's calls (logged as env/tool_calls, env/tool_errors). `end_ids`:
    the tokens that close a turn (default EOS; rloo.data.chat_turns.end_ids), dropped before parsing."""

    def __init__(
        self,
        tokenizer,
        tools: dict[str, Tool],
        score: Callable[[str, str], float],
        timeout_s: float = 1.0,
        end_ids: frozenset[int] | None = None,
    ):
        self.tokenizer, self.tools, self.score, self.timeout_s = tokenizer, tools, score, timeout_s
        self.end_ids = frozenset({tokenizer.eos_token_id}) if end_ids is None else end_ids
        self.stop_ids = tokenizer.convert_tokens_to_ids([END])
        self.prompt, self.tool_calls, self.tool_errors = "", 0, 0

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def reset(self, prompt: str) -> list[int]:
        self.prompt, self.tool_calls, self.tool_errors = prompt, 0, 0
        return self.encode(prompt)

    def step(self, turn: list[int]) -> Step:
        text = turn_text(self.tokenizer, turn, self.end_ids)  # to parse only; the ids stay as sampled
        call = parse_call(text.split())
        if call is None:
            return Step([], float(self.score(self.prompt, text)), True)
        result, ok = call_tool(self.tools, *call, self.timeout_s)
        self.tool_calls += 1
        self.tool_errors += not ok
        return Step(self.encode(f"{OUT} {result}"), None, False)

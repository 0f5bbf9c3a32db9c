"""A dataset row's other columns, carried beside its prompt to the reward functions and judges.

TRL passes every column of a row other than the prompt and completion to each reward function as a
keyword argument holding one value per completion (`def accuracy(prompts, completions, answer,
**kwargs)`); rloo does the same. A prompt read from a dataset is a `Prompt`: the prompt text (a
`str`, so the sampler, the tokenizer, the checkpoint and every comparison see plain text) that
also holds its row's other columns. The rollout repeats each prompt object k times in its order, so
`columns_of(roll.prompts)` gives each column as one value per completion, with no copy of the
columns in the sampler. A function is given only the names its signature takes (all of them when it
has **kwargs): a `(prompts, completions)` function is called as before.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# the names TRL gives no reward function either: the prompt and the completion are its arguments
RESERVED = frozenset({"prompt", "completion", "messages"})


class Prompt(str):
    """Prompt text with its dataset row's other columns (`.columns`, name -> value)."""

    columns: Mapping[str, Any]

    def __new__(cls, text: str, columns: Mapping[str, Any]):
        obj = super().__new__(cls, text)
        obj.columns = dict(columns)
        return obj

    def __reduce__(self):  # to the rollout producer's process and back (pickle), columns kept
        return (Prompt, (str(self), self.columns))


def with_columns(text: str, columns: Mapping[str, Any]) -> str:
    """`text` as a Prompt holding `columns`, or the plain text when there are none."""
    return Prompt(text, columns) if columns else text


def extra_columns(row: Mapping[str, Any], used: set[str]) -> dict[str, Any]:
    """The row's columns other than those it was read from (`used`) and TRL's reserved names."""
    return {k: v for k, v in row.items() if k not in used and k not in RESERVED}


def columns_of(prompts: Sequence[str]) -> dict[str, list]:
    """{column: [value of prompts[i]'s row for each i]}: every column that any prompt holds, None
    where a prompt's row lacks it (a plain string holds none)."""
    names: dict[str, None] = {}
    for p in prompts:
        names |= dict.fromkeys(row_columns(p))
    return {n: [row_columns(p).get(n) for p in prompts] for n in names}


def row_columns(prompt: str) -> Mapping[str, Any]:
    """The other columns of a prompt's dataset row (a `Prompt`'s), none for a plain string."""
    return prompt.columns if isinstance(prompt, Prompt) else {}


def takes(fn: Callable, skip: int = 2) -> tuple[bool, frozenset[str], frozenset[str], frozenset[str]]:
    """(has **kwargs, the keyword names it accepts, those it requires, the names of its first `skip`
    positional parameters: prompts, completions), the keyword names counted past those. A callable
    whose signature cannot be read takes none."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False, frozenset(), frozenset(), frozenset()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    first = params[:skip] if sum(p.kind in positional for p in params[:skip]) == skip else []
    rest = params[len(first) :]
    named = [p for p in rest if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    required = frozenset(p.name for p in named if p.default is inspect.Parameter.empty)
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    return var_kw, frozenset(p.name for p in named), required, frozenset(p.name for p in first)


def keywords_for(fn: Callable, columns: Mapping[str, Any], skip: int = 2) -> dict[str, Any]:
    """The subset of `columns` that `fn` accepts as keyword arguments (all of them with **kwargs),
    never one named like its positional prompts/completions parameters (it would get two values)."""
    if not columns:
        return {}
    var_kw, names, _, first = takes(fn, skip)
    return {k: v for k, v in columns.items() if (var_kw or k in names) and k not in first}


def missing_columns(fn: Callable, columns: Mapping[str, Any], skip: int = 2) -> list[str]:
    """The keyword parameters `fn` requires that are not among `columns` (sorted)."""
    return sorted(takes(fn, skip)[2] - set(columns))

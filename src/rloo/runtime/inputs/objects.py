"""Inputs handed to the Python API as objects (a loaded model, a tokenizer, a `datasets.Dataset`)
instead of paths: while the stage runs each one is held here under a name, `memory:KIND:SHA12`,
which stands in the config where a path would (`policy`, `model`, `tokenizer`, `dataset.path`).

The loaders (rloo.modeling.loading, rloo.data.datasets) look a held name up instead of opening a
path, so a handed object goes through the same checks and code as a loaded one. The name carries
the first 12 hex digits of the object's content sha256 (the model's initial weights, the
tokenizer's vocabulary and template, the dataset's rows): config.yaml records it, and a resume
that is handed another object (or the same model after it was trained) differs in the name and is
refused as a changed path is (rloo.runtime.checkpoint.resumecheck, rloo.runtime.inputs.fingerprint).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rloo.errors import RlooError
from rloo.runtime.inputs.hf import chat_template

PREFIX = "memory:"


@dataclass
class Held:
    """One handed object, its content sha256, and (a model's) the tokenizer that goes with it."""

    obj: Any
    sha: str
    tokenizer: Any = None


_HELD: dict[str, Held] = {}


def is_held(name: object) -> bool:
    """True for a held object's name (`memory:...`), whether or not it is held now."""
    return isinstance(name, str) and name.startswith(PREFIX)


def held(name: str) -> Held:
    """The object held under `name`. A config naming one outside the call that handed it in (a
    config.yaml of an in-memory run given to the CLI) is one line, not a KeyError."""
    if name not in _HELD:
        raise RlooError(
            f"{name} names an object handed to the Python API (model=, tokenizer=, dataset=), which only "
            f"that call holds; pass the object again (rloo.train(cfg, model=..., resume=True))"
        )
    return _HELD[name]


def held_table(name: str, split: str):
    """Split `split` of the dataset held under `name`: a DatasetDict's split, or a single table as
    the training split ("train"; any other split of it is refused)."""
    ds = held(name).obj
    if isinstance(ds, dict):  # a DatasetDict
        if split not in ds:
            raise RlooError(f"dataset= has no split {split!r} (splits: {', '.join(ds)})")
        return ds[split]
    if split != "train":
        raise RlooError(
            f"dataset= is one table, without a split {split!r}: hand in a DatasetDict, or set "
            f"dataset.eval_split to null (held-out rows by eval_fraction) or to a file"
        )
    return ds


def name_of(kind: str, sha: str) -> str:
    """`memory:KIND:SHA12`: what the config records for a handed object."""
    return f"{PREFIX}{kind}:{sha[:12]}"


@contextmanager
def holding(entries: dict[str, Held]) -> Iterator[None]:
    """Hold `entries` (name -> Held) for the duration of a stage; names already held (a stage
    inside another, the same object) are left as they were."""
    added = [n for n in entries if n not in _HELD]
    _HELD.update({n: entries[n] for n in added})
    try:
        yield
    finally:
        for n in added:
            _HELD.pop(n, None)


def tokenizer_sha(tok) -> str:
    """sha256 of what a tokenizer maps text to: its vocabulary, special tokens and chat template."""
    special = {k: str(v) for k, v in tok.special_tokens_map.items()}
    if "eos_token" in special:  # the loaders give a tokenizer without a pad token its EOS: the same one
        special.setdefault("pad_token", special["eos_token"])
    state = {
        "vocab": sorted(tok.get_vocab().items()),
        "special": special,
        "template": chat_template(tok),
        "class": type(tok).__name__,
    }
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()


def rows_sha(rows) -> str:
    """sha256 of a table's rows (each as JSON with sorted keys), in order."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, default=str).encode() + b"\n")
    return h.hexdigest()

"""What rloo reads of a Hugging Face object it loads or is handed (a transformers model, a tokenizer)
where the attribute may be missing: each is written once here, with its one commented getattr, and the
callers (runtime/, data/, modeling/, rollout/, training/) read a typed answer; and a local model
folder's config.json, read before anything is loaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def config_json(model: str | None) -> dict | None:
    """A local model folder's config.json as a dict, or None: a Hub name, a folder without one (or
    with a FIFO or device there: never blocked on; links are followed), or not a JSON object of
    UTF-8 text (the loader then says what is wrong)."""
    return folder_json(model, "config.json")


def folder_json(model: str | None, name: str) -> dict | None:
    """A local model folder's JSON file `name` as a dict, or None (as `config_json`)."""
    path = Path(model) / name if model else None
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def tokenizer_model_kind(tok: object) -> str | None:
    """The `tokenizers` model a fast tokenizer runs (BPE, WordLevel, Unigram, WordPiece), or None."""
    # getattr: third-party: only a tokenizers-backed (fast) tokenizer has backend_tokenizer
    backend = getattr(tok, "backend_tokenizer", None)
    return None if backend is None else type(backend.model).__name__


def hf_config(model: object) -> Any | None:
    """A model's transformers config (a PEFT or LoRA wrapper forwards its network's), or None for an
    object without one (a plain torch module, a wrapper that does not forward it)."""
    # getattr: third-party: only a Hugging Face model has a config
    return getattr(model, "config", None)


def chat_template(tok: object) -> Any | None:
    """A tokenizer's chat template as it holds it, or None: rloo's built-in word tokenizer and None
    have no `chat_template`, a Hugging Face one without a template may hold None."""
    # getattr: third-party: a tokenizer without a chat template may lack the attribute
    return getattr(tok, "chat_template", None)


def has_vocab(tok: object) -> bool:
    """Whether `tok` has what rloo reads first of a tokenizer, a callable `get_vocab` (a loaded or
    handed-in object checked before it is used as a transformers tokenizer)."""
    # getattr: third-party: whatever AutoTokenizer or an API caller gave, checked for what a tokenizer has
    return callable(getattr(tok, "get_vocab", None))

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


def auto_tokenizer(path: str, trust_remote_code: bool = False) -> Any:
    """AutoTokenizer's tokenizer of `path`, unless it cannot read the folder's own tokenizer.json.

    transformers (5.x) loads a few model types' tokenizers with their registered class whatever
    tokenizer_config.json names (qwen2, phi3, ...: Hub folders that name the wrong class). For a
    folder whose tokenizer.json is another kind of model (a word-level vocabulary saved beside a
    Qwen2 network, as rloo's own small models are), that class reads the vocabulary as byte-level
    BPE and every text becomes a few unknown tokens, without a word. Then the folder's tokenizer.json
    is loaded as saved (said once); a class that reads it is kept."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    declared = (folder_json(path, "tokenizer_config.json") or {}).get("tokenizer_class")
    if not isinstance(declared, str) or declared.removesuffix("Fast") == type(tok).__name__.removesuffix("Fast"):
        return tok  # the class the folder names (the usual case: tokenizer.json is not read again)
    saved = (folder_json(path, "tokenizer.json") or {}).get("model")
    kind = saved.get("type") if isinstance(saved, dict) else None
    loaded = tokenizer_model_kind(tok)
    if kind is None or loaded is None or kind == loaded:
        return tok
    from rloo.runtime.tracking.log import say_once

    say_once(
        f"{path}: transformers would load its tokenizer as {type(tok).__name__}, which reads its "
        f"tokenizer.json ({kind}) as {loaded}; rloo loads the tokenizer.json as saved ({declared})"
    )
    return PreTrainedTokenizerFast.from_pretrained(path)


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

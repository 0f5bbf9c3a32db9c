"""A model folder's tokenizer, read as its files say (`auto_tokenizer`): transformers' AutoTokenizer,
except where the class it picks for the folder's model type would read the folder's tokenizer.json as
another kind of tokenizer. Imports transformers: the CLI's preflight imports it only with a dataset."""

from __future__ import annotations

from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from rloo.runtime.inputs.hf import folder_json, tokenizer_model_kind
from rloo.runtime.tracking.log import say_once


def auto_tokenizer(path: str, trust_remote_code: bool = False) -> Any:
    """AutoTokenizer's tokenizer of `path`, unless it cannot read the folder's own tokenizer.json.

    transformers (5.x) loads a few model types' tokenizers with their registered class whatever
    tokenizer_config.json names (qwen2, phi3, ...: Hub folders that name the wrong class). For a
    folder whose tokenizer.json is another kind of model (a word-level vocabulary saved beside a
    Qwen2 network, as rloo's own small models are), that class reads the vocabulary as byte-level
    BPE and every text becomes a few unknown tokens, without a word. Then the folder's tokenizer.json
    is loaded as saved (said once); a class that reads it is kept."""
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if type(tok) is PreTrainedTokenizerFast:  # the generic backend (TokenizersBackend) reads it as saved
        return tok
    declared = (folder_json(path, "tokenizer_config.json") or {}).get("tokenizer_class")
    if not isinstance(declared, str) or declared.removesuffix("Fast") == type(tok).__name__.removesuffix("Fast"):
        return tok  # the class the folder names: tokenizer.json (megabytes for a large vocabulary) is not parsed
    saved = (folder_json(path, "tokenizer.json") or {}).get("model")
    kind = saved.get("type") if isinstance(saved, dict) else None
    loaded = tokenizer_model_kind(tok)
    if kind is None or loaded is None or kind == loaded:
        return tok
    say_once(
        f"{path}: transformers would load its tokenizer as {type(tok).__name__}, which reads its "
        f"tokenizer.json ({kind}) as {loaded}; rloo loads the tokenizer.json as saved ({declared})"
    )
    return PreTrainedTokenizerFast.from_pretrained(path)

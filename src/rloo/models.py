"""Loading and saving the policy, reference and reward models (Hugging Face format)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
)

from rloo.atomic import WriteError, describe_write_failure, fsync_dir, sync_and_hash
from rloo.config import ArchConfig
from rloo.errors import RlooError

# Our own progress bars cover the long work; per-file load/save bars of tiny models are noise.
hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()


def build_llama(arch: ArchConfig, tokenizer, seed: int) -> LlamaForCausalLM:
    """A small Llama-architecture causal LM initialised from scratch for `tokenizer`."""
    if arch.hidden_size % arch.num_heads:
        raise RlooError(f"arch.hidden_size={arch.hidden_size} must be divisible by arch.num_heads={arch.num_heads}")
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_heads,
        max_position_embeddings=arch.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def _check_dir(path: str, what: str) -> None:
    if not Path(path).exists():
        raise RlooError(f"{what} path {path!r} does not exist (expected a Hugging Face model folder)")


def load_tokenizer(path: str):
    _check_dir(path, "tokenizer")
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise RlooError(f"could not load a tokenizer from {path!r}: {str(e).splitlines()[0]}") from e
    if tok.pad_token is None:
        # Padding is always masked out, so any token will do; EOS is the usual choice.
        tok.pad_token = tok.eos_token
    if tok.eos_token_id is None:
        raise RlooError(f"tokenizer at {path!r} has no EOS token; set eos_token in its tokenizer_config.json")
    return tok


def load_policy(path: str, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """A causal LM and its tokenizer from a local folder or Hub name."""
    _check_dir(path, "model")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError) as e:
        raise RlooError(f"could not load a causal LM from {path!r}: {str(e).splitlines()[0]}") from e
    return model.to(device), load_tokenizer(path)


def load_reward_model(path: str, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """A sequence-classification model with one output (the reward)."""
    _check_dir(path, "reward model")
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=dtype)
    except (OSError, ValueError) as e:
        raise RlooError(f"could not load a reward model from {path!r}: {str(e).splitlines()[0]}") from e
    return model.to(device), load_tokenizer(path)


def frozen(model):
    """Eval mode, no gradients: for the reference policy and the reward model."""
    model.eval()
    model.requires_grad_(False)
    return model


def save_pretrained_atomic(model, tokenizer, path: Path) -> None:
    """Write model + tokenizer to a sibling temp folder, then rename over `path`, so a crash or a
    full disk mid-write never leaves a half-written model where a reader expects a whole one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        sync_and_hash(tmp)
    except Exception as e:  # noqa: BLE001 - whatever failed, the half-written folder must go
        why = describe_write_failure(e, path.parent)
        shutil.rmtree(tmp, ignore_errors=True)
        kept = f"the previous model at {path} is untouched" if path.exists() else "no model was written"
        raise WriteError(f"could not save the model to {path}: {why}; {kept}") from e
    old = path.with_name(path.name + ".old")
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)

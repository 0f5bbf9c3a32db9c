"""Loading and saving the policy, reference and reward models (Hugging Face format)."""

from __future__ import annotations

import os
import shutil
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
)
from transformers.utils import logging as hf_logging

from rloo.config import ArchConfig
from rloo.errors import RlooError
from rloo.modeling.attention import use_rloo_attention
from rloo.modeling.fp32_head import use_fp32_heads
from rloo.modeling.handed import handed_model
from rloo.modeling.lora import is_adapter_folder, load_merged
from rloo.runtime.inputs.hf import has_vocab
from rloo.runtime.inputs.names import check_name
from rloo.runtime.inputs.objects import held, is_held
from rloo.runtime.inputs.saved_tokenizer import auto_tokenizer
from rloo.runtime.precision import weights_dtype
from rloo.runtime.runfolder.atomic import (
    WriteError,
    describe_write_failure,
    fsync_dir,
    modes_as_umask_allows,
    sync_and_hash,
)
from rloo.runtime.runfolder.confine import confine

# Our own progress bars cover the long work; per-file load/save bars of tiny models are noise.
hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()


def build_llama(arch: ArchConfig, tokenizer, seed: int) -> LlamaForCausalLM:
    """A small Llama-architecture causal LM initialised from scratch for `tokenizer` (its head in fp32
    under autocast, as every loaded model's: rloo.modeling.fp32_head)."""
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
    return use_fp32_heads(use_rloo_attention(LlamaForCausalLM(cfg)))


def _check_dir(path: str, what: str) -> None:
    """A missing local path fails at once; a Hub name is looked up once, without retries (rloo.runtime.inputs.names)."""
    check_name(str(path), what)


def resolve_dtype(name: str | torch.dtype, device: str) -> torch.dtype:
    """The dtype weights are stored in under `dtype=name` (rloo.runtime.precision): float32 on every
    device, where bf16 is mixed precision (fp32 master weights, bf16 autocast: pure bf16 weights lose
    most AdamW updates at fine-tuning learning rates). No probe: the autocast decision is the
    stage's (rloo.runtime.precision.weights_dtype)."""
    return weights_dtype(name, device)


def model_options(cfg) -> dict:
    """Keyword arguments for the loaders below from a stage config's dtype/device/remote-code keys."""
    return {
        "device": cfg.device,
        "dtype": resolve_dtype(cfg.dtype, cfg.device),
        "trust_remote_code": cfg.trust_remote_code,
    }


def load_tokenizer(path: str, trust_remote_code: bool = False):
    """The tokenizer at `path`, or the one handed to the Python API under that name
    (rloo.runtime.inputs.objects), with a pad token (EOS when it has none) and an EOS token."""
    _check_dir(path, "tokenizer")
    if is_held(path):
        return checked_tokenizer(held(path).obj, path)
    try:
        tok = auto_tokenizer(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise RlooError(f"could not load a tokenizer from {path!r}: {str(e).splitlines()[0]}") from e
    return checked_tokenizer(tok, path)


def checked_tokenizer(tok: Any, path: str) -> Any:
    """`tok` with a pad token (EOS when it has none); refused without an EOS token."""
    if not has_vocab(tok) or not callable(tok):
        raise RlooError(f"{path}: expected a transformers tokenizer, got a {type(tok).__name__}")
    if tok.pad_token is None:
        # Padding is always masked out, so any token will do; EOS is the usual choice.
        tok.pad_token = tok.eos_token
    if tok.eos_token_id is None:
        raise RlooError(f"tokenizer at {path!r} has no EOS token; set eos_token in its tokenizer_config.json")
    return tok


PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def _check_safetensors(path: str, what: str) -> None:
    """rloo loads weights from safetensors only: a folder whose weights exist only as pickle files
    (pytorch_model.bin, ...) is refused before anything opens them (unpickling can run code)."""
    p = Path(path)
    if not p.is_dir() or any(p.glob("*.safetensors")):
        return
    pickles = sorted(f.name for pat in PICKLE_WEIGHTS for f in p.glob(pat))
    if pickles:
        raise RlooError(
            f"{what} folder {path!r} has weights only in pickle format ({', '.join(pickles[:3])}); rloo "
            f"loads safetensors only: convert it (model.save_pretrained(dir, safe_serialization=True) "
            f"where you trust the file) and pass the converted folder"
        )


def _load(cls, path: str, what: str, device: str, dtype, trust_remote_code: bool, **kw) -> tuple[Any, Any]:
    """(model, tokenizer) from `path`: rloo's attention (rloo.modeling.attention), and its output heads
    in fp32 under autocast (rloo.modeling.fp32_head), set before any wrapper (DDP, FSDP2, PEFT) sees it.
    A model handed to the Python API under `path` (rloo.runtime.inputs.objects) is that object, moved."""
    _check_dir(path, what)
    if is_held(path):
        model, tok = handed_model(path, what)
        model = model.to(device=device, dtype=resolve_dtype(dtype, device))
        return use_fp32_heads(use_rloo_attention(model)), load_tokenizer(tok)
    _check_safetensors(path, what)
    load = partial(load_merged, cls) if is_adapter_folder(path) else cls.from_pretrained
    try:
        model = load(path, dtype=resolve_dtype(dtype, device), trust_remote_code=trust_remote_code, **kw)
    except (OSError, ValueError, ImportError) as e:
        raise RlooError(f"could not load a {what} from {path!r}: {str(e).splitlines()[0]}") from e
    return use_fp32_heads(use_rloo_attention(model.to(device))), load_tokenizer(path, trust_remote_code)


def load_policy(
    path: str, device: str = "cpu", dtype: torch.dtype | str = torch.float32, trust_remote_code: bool = False
):
    """A causal LM and its tokenizer from a local folder or Hub name."""
    return _load(AutoModelForCausalLM, path, "causal LM", device, dtype, trust_remote_code)


def load_reward_model(
    path: str, device: str = "cpu", dtype: torch.dtype | str = torch.float32, trust_remote_code: bool = False
):
    """A sequence-classification model with one output (the reward)."""
    return _load(
        AutoModelForSequenceClassification, path, "reward model", device, dtype, trust_remote_code, num_labels=1
    )


def load_value_model(
    path: str, device: str = "cpu", dtype: torch.dtype | str = torch.float32, trust_remote_code: bool = False
):
    """A separate value model V(x, y<=t): a one-output head on any checkpoint (methods with a critic;
    RLOO itself needs none)."""
    model, tok = _load(
        AutoModelForSequenceClassification, path, "value model", device, dtype, trust_remote_code, num_labels=1
    )
    model.config.pad_token_id = tok.pad_token_id
    return model, tok


def enable_gradient_checkpointing(model) -> None:
    """Trade compute for memory: activations are recomputed in backward. transformers drops the KV
    cache inside checkpointed layers; the passes that need one (the shared-prompt passes of
    rloo.modeling.forward_shared) checkpoint the layers themselves with the cache kept
    (rloo.modeling.layer_checkpoint)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()  # frozen embeddings (LoRA) would otherwise cut the graph


def frozen(model):
    """Eval mode, no gradients: for the reference policy and the reward model."""
    model.eval()
    model.requires_grad_(False)
    return model


def save_pretrained_atomic(model, tokenizer, path: Path) -> None:
    """Write model + tokenizer to a sibling temp folder, then rename over `path`, so a crash or a
    full disk mid-write never leaves a half-written model where a reader expects a whole one.
    None of the three folders may be a link out of a run folder (rloo.runtime.runfolder.confine)."""
    path = confine(path, folder=True)
    tmp = confine(path.with_name(path.name + ".tmp"), folder=True)
    confine(path.with_name(path.name + ".old"), folder=True)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        modes_as_umask_allows(tmp)  # safetensors writes 0o600
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

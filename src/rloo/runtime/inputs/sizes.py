"""Sizes checked before a model loads: a completion longer than the model's context, and a batch
whose memory is beyond the machine's, are one line naming the key (`max_new_tokens=100000000`
tried to allocate 25.6 GB deep inside the sampler).

The memory figure is a lower bound, so only settings that surely cannot run are refused:
    bytes >= rows x (P + T) x layers x (2 kv + 10 hidden) x 2 bytes
rows: sequences sampled (and trained on) at once, P + T: prompt + completion tokens; per token and
layer the sampler's KV cache (2 x kv width) and, when training, at least 10 hidden-size vectors kept
for backward (a Llama block keeps its norms' inputs, q, k, v, attention output and the 3x-wide MLP);
2 bytes each (bf16; float32 doubles it). Compared with the memory free now: MemAvailable on Linux
for cpu, the free memory of the GPU for cuda (elsewhere nothing is refused)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rloo.errors import ConfigError
from rloo.runtime.inputs.hf import config_json

ACTIVATION_VECTORS = 10  # hidden-size vectors per token and layer kept for backward (lower bound)


@dataclass
class Shape:
    layers: int
    hidden: int
    kv_width: int  # num_key_value_heads x head_dim
    context: int | None  # max_position_embeddings


def shape_of(model: str | None, arch=None) -> Shape | None:
    """The shape of a local model folder (its config.json), or of the built-in `arch`; None if unknown."""
    if model is None:
        if arch is None:
            return None
        return Shape(arch.num_layers, arch.hidden_size, arch.hidden_size, arch.max_position_embeddings)
    c = config_json(model)
    if c is None:
        return None  # a Hub name, or no config: the loader reports what is wrong
    c = c.get("text_config", c)
    layers, hidden = c.get("num_hidden_layers") or c.get("n_layer"), c.get("hidden_size") or c.get("n_embd")
    if not isinstance(layers, int) or not isinstance(hidden, int):
        return None
    heads = c.get("num_attention_heads") or c.get("n_head") or 1
    kv = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads
    context = c.get("max_position_embeddings") or c.get("n_positions")
    return Shape(layers, hidden, kv * head_dim, context if isinstance(context, int) else None)


def batch_bytes(shape: Shape, rows: int, tokens: int, train: bool) -> int:
    """Lower bound of the memory of `rows` sequences of `tokens` tokens (see the module's formula)."""
    per_token = shape.layers * (2 * shape.kv_width + (ACTIVATION_VECTORS * shape.hidden if train else 0))
    return rows * tokens * per_token * 2


def free_memory(device: str) -> int | None:
    """Bytes free now on `device` (cpu: MemAvailable; cuda: the GPU's free memory), None if unknown."""
    if device.startswith("cuda"):
        import torch  # only for GPU runs: the check otherwise stays light

        if not torch.cuda.is_available():
            return None
        return torch.cuda.mem_get_info(torch.device(device))[0]
    if device != "cpu":
        return None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_generation(shape: Shape | None, what: str, new_tokens_key: str, new_tokens: int) -> None:
    """A completion may not be longer than the model's context."""
    if shape is not None and shape.context is not None and new_tokens > shape.context:
        raise ConfigError(
            f"{new_tokens_key}={new_tokens} is longer than the context of {what} "
            f"(max_position_embeddings={shape.context}); lower {new_tokens_key}"
        )


def check_memory(shape: Shape | None, device: str, keys: str, rows: int, tokens: int, train: bool) -> None:
    """Refuse a batch whose lower-bound memory exceeds what `device` has free; `keys` names the settings."""
    free = free_memory(device) if shape is not None else None
    if free is None:
        return
    need = batch_bytes(shape, rows, tokens, train)
    if need > free:
        raise ConfigError(
            f"{keys}: {rows} sequences of {tokens} tokens at once need at least {need / 2**30:.1f} GiB "
            f"({'sampling and training' if train else 'sampling'}), more than the {free / 2**30:.1f} GiB free on "
            f"{device}; lower them"
        )


def weights_bytes(model: str | None) -> int | None:
    """Bytes of a local model folder's safetensors files: one copy of its weights at their saved
    dtype (a lower bound of its state in memory); None for a Hub name or another format."""
    files = list(Path(model).glob("*.safetensors")) if model is not None else []
    try:
        return sum(f.stat().st_size for f in files) or None
    except OSError:
        return None


# The weight ring may take at most this share of the memory free now: the models, optimizer and
# batches need the rest.
RING_SHARE = 0.5


def check_ring_memory(model: str | None, device: str, key: str, copies: int) -> None:
    """rl.max_staleness > 0 keeps `copies` copies of the policy's weights (the ring's versions and the
    sampler's own); refuse when they exceed RING_SHARE of what `device` has free."""
    size = weights_bytes(model)
    free = free_memory(device) if size is not None else None
    if free is None or size is None or copies * size <= RING_SHARE * free:
        return
    raise ConfigError(
        f"{key}: the asynchronous run keeps {copies} copies of the policy's weights ({size / 2**20:.1f} MiB "
        f"each), {copies * size / 2**30:.1f} GiB, more than half the {free / 2**30:.1f} GiB free on {device}; "
        "lower it"
    )

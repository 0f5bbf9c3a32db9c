"""Every random stream the loop draws from, saved in and restored from checkpoints."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def rng_state(generator: torch.Generator) -> dict:
    """Every random stream the loop draws from, as tensors and plain numbers (weights_only-safe)."""
    np_state = np.random.get_state()
    return {
        "python": list(_tuple_to_list(random.getstate())),
        "numpy": {
            "key": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
        "sampler": generator.get_state(),
    } | _cuda_state()


def _cuda_state() -> dict:
    """This process's GPU's random state (dropout on a GPU draws from it), where CUDA is in use."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return {"cuda": torch.cuda.get_rng_state()}
    return {}


def _tuple_to_list(x):
    return [_tuple_to_list(v) for v in x] if isinstance(x, (tuple, list)) else x


def _list_to_tuple(x):
    return tuple(_list_to_tuple(v) for v in x) if isinstance(x, list) else x


def set_rng_state(state: dict, generator: torch.Generator) -> None:
    random.setstate(_list_to_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    generator.set_state(state["sampler"])
    if "cuda" in state and torch.cuda.is_available():  # a checkpoint from a CPU run has none
        torch.cuda.set_rng_state(state["cuda"])


@contextmanager
def global_streams_kept() -> Iterator[None]:
    """Python's, NumPy's and torch's global random streams (and the GPU's, where CUDA is in use) as
    they were before the block, whatever it drew: an evaluation between training steps whose user
    code (an environment's reset, a judge) draws from them leaves the training's draws as they would
    have been without it."""
    py, np_state, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = _cuda_state().get("cuda")
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(np_state)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)


def batch_generator(seed: int, batch: int) -> torch.Generator:
    """The sampling generator of batch `batch` of an asynchronous run (rl.max_staleness > 0): a
    function of (seed, batch) alone, so a resumed run samples its batches again bit for bit without
    a generator state in the checkpoint, in the producer process as in the trainer's (docs/async.md)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + batch) % 2**63)

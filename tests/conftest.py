"""Shared fixtures: a tiny Llama and word tokenizer saved in Hugging Face format to a temp folder."""

from __future__ import annotations

import os

import pytest
import torch

from rloo.config import ArchConfig
from rloo.models import build_llama
from rloo.tasks import get_task
from rloo.tasks.tokenizer import build_tokenizer

# dtype=auto would pick bf16 autocast on a CPU with fast bf16 matmuls (rloo.precision); the tests
# compare fast paths with plain ones in fp32 and must mean the same on every CPU, so auto is pinned to
# float32 here (the environment is inherited by the CLI subprocesses the tests start). The bf16 paths
# are tested with an explicit dtype (tests/test_precision.py). Set RLOO_AUTO_DTYPE to override.
os.environ.setdefault("RLOO_AUTO_DTYPE", "float32")

TINY = ArchConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=64)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A freshly initialised tiny Llama + the summarize task's tokenizer, saved with save_pretrained."""
    path = tmp_path_factory.mktemp("tiny") / "model"
    tok = build_tokenizer(get_task("summarize"))
    model = build_llama(TINY, tok, seed=0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(2)
    yield

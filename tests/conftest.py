"""Shared fixtures: a tiny Llama and word tokenizer saved in Hugging Face format to a temp folder."""

from __future__ import annotations

import os

import pytest
import torch

from rloo.config import ArchConfig
from rloo.models import build_llama
from rloo.tasks import get_task
from rloo.tasks.tokenizer import build_tokenizer

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


# Intra-op threads for every test: 2 unless RLOO_TEST_THREADS says otherwise. The suite must pass
# with 1 and 2 threads (and any ATEN_CPU_CAPABILITY): reductions split over threads round
# differently, which the tolerances (tests/tolerance.py) allow for.
THREADS = int(os.environ.get("RLOO_TEST_THREADS", "2"))


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(THREADS)
    yield

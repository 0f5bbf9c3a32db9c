"""Shared fixtures: a tiny Llama and word tokenizer saved in Hugging Face format to a temp folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rloo.config import ArchConfig
from rloo.modeling.loading import build_llama
from rloo.tasks import get_task
from rloo.tasks.tokenizer import build_tokenizer

# The test tiers are folders; each test gets its folder's marker (`pytest -m unit`, `-m "not integration"`).
TIERS = ("unit", "equivalence", "integration", "reliability")


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


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

"""The names the Python API gives objects it is handed (rloo.training.handed): by content, so that a
resume compares what it is handed with what the run started from."""

from __future__ import annotations

import pytest
import torch

import rloo
from rloo.config import ArchConfig
from rloo.errors import RlooError
from rloo.modeling.loading import build_llama, checked_tokenizer
from rloo.runtime.inputs.objects import held_table, holding, tokenizer_sha
from rloo.tasks import get_task
from rloo.tasks.tokenizer import build_tokenizer
from rloo.training.handed import hand_in

datasets = pytest.importorskip("datasets")
ARCH = ArchConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def _tok(task: str = "summarize"):
    return build_tokenizer(get_task(task))


def _name(model, tok=None) -> str:
    cfg, _ = hand_in(rloo.RLConfig(output_dir="x"), "policy", model, tok)
    return cfg.policy


def test_a_policy_name_follows_its_weights_and_its_tokenizer():
    tok = _tok()
    model = build_llama(ARCH, tok, seed=0)
    name = _name(model, tok)
    assert name.startswith("memory:LlamaForCausalLM:") and name == _name(build_llama(ARCH, tok, seed=0), tok)
    assert _name(build_llama(ARCH, tok, seed=1), tok) != name  # other initial weights
    assert _name(model, _tok("dialogue")) != name  # another tokenizer: another policy
    with torch.no_grad():
        model.model.norm.weight.add_(1e-3)  # trained: no longer the model the run started from
    assert _name(model, tok) != name


def test_the_pad_token_the_loader_sets_does_not_change_a_tokenizers_name():
    tok = _tok()
    tok.pad_token = None
    before = tokenizer_sha(tok)
    assert checked_tokenizer(tok, "tokenizer=").pad_token == tok.eos_token
    assert tokenizer_sha(tok) == before


def test_a_dataset_name_follows_its_rows_and_a_single_table_has_one_split():
    rows = [{"prompt": "a", "x": 1}, {"prompt": "b", "x": 2}]
    cfg, objs = hand_in(rloo.RLConfig(output_dir="x"), "policy", dataset=rows)
    assert cfg.dataset is not None and cfg.dataset.path.startswith("memory:dataset:")
    other, _ = hand_in(rloo.RLConfig(output_dir="x"), "policy", dataset=[rows[0], {"prompt": "b", "x": 3}])
    assert other.dataset is not None and other.dataset.path != cfg.dataset.path
    with holding(objs):
        assert held_table(cfg.dataset.path, "train")["x"] == [1, 2]
        with pytest.raises(RlooError, match="dataset= is one table, without a split 'test'"):
            held_table(cfg.dataset.path, "test")
    with pytest.raises(RlooError, match="only that call holds"):  # a name outside the call that handed it
        held_table(cfg.dataset.path, "train")

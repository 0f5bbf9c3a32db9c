"""A model folder's tokenizer is read as saved (rloo.runtime.inputs.saved_tokenizer.auto_tokenizer).

transformers 5.x loads the tokenizer of a few model types (qwen2, phi3, ...) with their registered
class whatever tokenizer_config.json names. A word-level tokenizer saved beside a Qwen2 network (as
rloo's tests and small models do) was then read as byte-level BPE: every prompt of the gradient
matrix became the same two tokens, without a word. These tests failed before the fix ([4, 4])."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rloo.data.survey import _tokenizer as survey_tokenizer
from rloo.modeling.loading import load_tokenizer
from rloo.tasks import get_task
from rloo.tasks.tokenizer import build_tokenizer

TEXT = "post : job rent tl;dr :"


def _folder(tmp_path, model_type: str, tok) -> str:
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return str(tmp_path)


def _as_saved(path: str) -> list[int]:
    return PreTrainedTokenizerFast.from_pretrained(path)(TEXT)["input_ids"]


@pytest.mark.parametrize("load", [load_tokenizer, lambda p: survey_tokenizer(p, False)], ids=["stages", "survey"])
def test_word_tokenizer_in_a_qwen2_folder_reads_as_saved(load, tmp_path, capsys):
    path = _folder(tmp_path, "qwen2", build_tokenizer(get_task("summarize")))
    ids = load(path)(TEXT)["input_ids"]
    assert ids == _as_saved(path) and len(set(ids)) > 2  # not every word one unknown token
    assert "rloo loads the tokenizer.json as saved" in capsys.readouterr().err


def test_the_class_a_folder_names_is_kept_without_a_word(tmp_path, capsys):
    path = _folder(tmp_path, "llama", build_tokenizer(get_task("summarize")))
    tok = load_tokenizer(path)
    assert tok(TEXT)["input_ids"] == _as_saved(path)
    assert "as saved" not in capsys.readouterr().err


def test_transformers_choice_is_kept_where_it_reads_the_same_kind(tmp_path, capsys):
    """A byte-level BPE tokenizer.json in a qwen2 folder that names another class (as Hub folders
    with the wrong class do): transformers' Qwen2Tokenizer reads BPE, so rloo keeps it."""
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>", "<pad>"])
    bpe.train_from_iterator([TEXT, "post : exam car tl;dr :"] * 20, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>", pad_token="<pad>")
    path = _folder(tmp_path, "qwen2", tok)
    loaded = load_tokenizer(path)
    assert type(loaded).__name__ == "Qwen2Tokenizer"
    assert "as saved" not in capsys.readouterr().err


def test_a_generic_backend_is_kept_without_parsing_tokenizer_json(tmp_path, monkeypatch):
    """A folder naming PreTrainedTokenizerFast (as Llama 3's do) loads as the generic backend, which
    reads tokenizer.json as saved: rloo does not parse that file again (megabytes for a large vocabulary)."""
    import rloo.runtime.inputs.saved_tokenizer as saved

    path = _folder(tmp_path, "llama", build_tokenizer(get_task("summarize")))
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config | {"tokenizer_class": "PreTrainedTokenizerFast"}))
    read, real = [], saved.folder_json
    monkeypatch.setattr(saved, "folder_json", lambda p, name: read.append(name) or real(p, name))
    assert load_tokenizer(path)(TEXT)["input_ids"] == _as_saved(path)
    assert "tokenizer.json" not in read

"""The benchmark's shapes S, M, L: tokenizers, policy, reward model and prompts, all built locally.

Nothing is downloaded. Text is made of pseudo-words (random syllable strings with a Zipf-like
frequency), enough distinct words for a BPE tokenizer trained with the `tokenizers` library to
reach 8192 tokens. S uses a character-level tokenizer (a BPE trained with no room for merges).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, PreTrainedTokenizerFast

from rloo.runtime.runfolder.atomic import atomic_write_text
from rloo.runtime.runfolder.confine import confine

SPECIALS = ["<pad>", "<eos>", "<unk>"]
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "sh", "ch", "qu", "x", "y"]


@dataclass(frozen=True)
class Shape:
    name: str
    tokenizer: str  # "char" or "bpe"
    vocab_size: int  # target vocabulary (bpe); char: whatever the alphabet gives
    hidden: int
    layers: int
    heads: int
    intermediate: int
    prompt_tokens: tuple[int, int]  # prompt length range in tokens (uniform)
    max_new_tokens: int

    @property
    def max_prompt_tokens(self) -> int:
        return self.prompt_tokens[1] + 16


SHAPES = {
    "S": Shape("S", "char", 0, 256, 4, 4, 688, (16, 48), 32),
    "M": Shape("M", "bpe", 8192, 512, 6, 8, 1376, (16, 48), 64),
    "L": Shape("L", "bpe", 8192, 512, 6, 8, 1376, (400, 460), 32),
    # Pythia-1B's width, depth and heads (hidden 2048, 16 layers, 8 heads) as a Llama with M's tokenizer;
    # Pythia's two-matrix 4h MLP becomes a three-matrix one of the same FLOPs (3 * 5472 ~ 2 * 8192).
    "1B": Shape("1B", "bpe", 8192, 2048, 16, 8, 5472, (16, 48), 64),
}


def _words(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))))
    return sorted(out)


def _text(words: list[str], n_words: int, rng: random.Random) -> str:
    # Zipf-like: word i drawn with weight 1/(i+10), so frequent words become single BPE tokens
    return " ".join(rng.choices(words, weights=[1 / (i + 10) for i in range(len(words))], k=n_words))


def build_tokenizer(shape: Shape, words: list[str], seed: int) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    rng = random.Random(seed)
    corpus = [_text(words, 200, rng) for _ in range(2000)] + [" ".join(words)] * 3
    alphabet = sorted({ch for w in words for ch in w} | {"\u2581", ":", ";", "."})
    # char-level: a vocabulary no larger than the alphabet leaves no room for merges
    size = len(alphabet) + len(SPECIALS) if shape.tokenizer == "char" else shape.vocab_size
    trainer = trainers.BpeTrainer(
        vocab_size=size, special_tokens=SPECIALS, initial_alphabet=alphabet, show_progress=False
    )
    backend.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def llama_config(shape: Shape, vocab_size: int, pad_id: int = 0, eos_id: int = 1, tied: bool = True) -> LlamaConfig:
    """A Llama of `shape`'s width, depth, heads and MLP (the bench's models: tied embeddings; the
    one-off scripts in benchmarks/ that time sampling alone measured an untied head: tied=False)."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=1024,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
        tie_word_embeddings=tied,
    )


def _llama_config(shape: Shape, tok) -> LlamaConfig:
    return llama_config(shape, len(tok), tok.pad_token_id, tok.eos_token_id)


def make_prompts(tok, words: list[str], shape: Shape, n: int, seed: int) -> list[str]:
    """n prompts ending in a TL;DR-style cue, lengths uniform in shape.prompt_tokens (tokens)."""
    rng = random.Random(seed)
    count = lambda text: len(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    fixed = count("post: tl;dr:")
    out = []
    for _ in range(n):
        target, body = rng.randint(*shape.prompt_tokens), []
        # pre-tokenization splits on spaces, so a word's tokens do not depend on its neighbours
        budget = target - fixed
        while budget > 0:
            w = _text(words, 1, rng)
            body.append(w)
            budget -= count(w)
        out.append("post: " + " ".join(body) + " tl;dr:")
    return out


def build_assets(shape: Shape, root: Path, seed: int = 0) -> Path:
    """policy/ and reward/ (HF format, tokenizer saved alongside) under root/shape.name; built once.
    Inside `rloo bench`'s run folder: none of these folders may be a link (rloo.runtime.runfolder.confine)."""
    folder = Path(root) / shape.name
    if (folder / "reward" / "config.json").exists():
        return folder
    for sub in ("policy", "reward"):
        confine(folder / sub, folder=True)
    words = _words(6000, seed)
    tok = build_tokenizer(shape, words, seed)
    cfg = _llama_config(shape, tok)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(folder / "policy")
    cfg.num_labels = 1
    torch.manual_seed(seed + 1)
    LlamaForSequenceClassification(cfg).save_pretrained(folder / "reward")
    for sub in ("policy", "reward"):
        tok.save_pretrained(folder / sub)
    atomic_write_text(folder / "words.txt", "\n".join(words))
    return folder


def load_words(folder: Path) -> list[str]:
    return (Path(folder) / "words.txt").read_text().split("\n")

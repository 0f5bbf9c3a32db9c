"""Tiny causal LMs of the four architectures the gradient matrix covers, built from configs.

Each is 2 layers, width 32, vocabulary 40: small enough for CPU tests in milliseconds, with
every architectural difference that changes a computation path (learned vs rotary positions,
parallel residual, GQA, tied/untied head, dropout in the config)."""

from __future__ import annotations

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

V, PAD, EOS = 40, 0, 1
ARCHS = ("llama", "gpt2", "gpt_neox", "qwen2")
COMMON = dict(vocab_size=V, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None)


def tiny_config(arch: str, *, tied: bool = False, dropout: float = 0.0, tokenizer=None):
    """A 2-layer, width-32 config of `arch`; `dropout` goes into every dropout key the config has.
    With `tokenizer`: its vocabulary size and pad/eos ids instead of V, PAD, EOS."""
    common = (
        COMMON
        if tokenizer is None
        else dict(
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
        )
    )
    if arch == "llama":
        return LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            tie_word_embeddings=tied,
            attention_dropout=dropout,
            **common,
        )
    if arch == "qwen2":
        return Qwen2Config(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            tie_word_embeddings=tied,
            attention_dropout=dropout,
            **common,
        )
    if arch == "gpt2":
        return GPT2Config(
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            tie_word_embeddings=tied,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
            **common,
        )
    if arch == "gpt_neox":
        return GPTNeoXConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            rotary_pct=0.5,
            tie_word_embeddings=tied,
            hidden_dropout=dropout,
            attention_dropout=dropout,
            **common,
        )
    raise ValueError(arch)


CLASSES = {
    "llama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "gpt2": GPT2LMHeadModel,
    "gpt_neox": GPTNeoXForCausalLM,
}


def perturb_vectors(model: torch.nn.Module, std: float = 0.05) -> torch.nn.Module:
    """Every bias drawn from N(0, std^2) and every norm gain from 1 + N(0, std^2), in place (seeded by
    the caller). Transformers initialises biases to 0 and norm gains to 1, where a path that drops a
    bias, or adds it twice, or skips a gain, computes the same numbers: seen when a fast path that
    dropped its bias passed every tiny-model test but the one on the product alone."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, std)
            elif p.ndim == 1:  # RMSNorm / LayerNorm gains
                p.add_(torch.randn_like(p) * std)
    return model


def tiny_lm(arch: str, *, tied: bool = False, dropout: float = 0.0, seed: int = 0, tokenizer=None):
    """A float32 tiny causal LM of `arch`, initialised from `seed`, its biases and norm gains perturbed
    (`perturb_vectors`)."""
    torch.manual_seed(seed)
    model = CLASSES[arch](tiny_config(arch, tied=tied, dropout=dropout, tokenizer=tokenizer)).float()
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied, arch
    return perturb_vectors(model)


def save_tiny_lm(path, arch: str, *, tied: bool = False, dropout: float = 0.0, seed: int = 0):
    """tiny_lm of `arch` with the summarize task's word tokenizer, saved as a Hugging Face folder."""
    from rloo.tasks import get_task
    from rloo.tasks.tokenizer import build_tokenizer

    tok = build_tokenizer(get_task("summarize"))
    tiny_lm(arch, tied=tied, dropout=dropout, seed=seed, tokenizer=tok).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def seeded_sample(model, ids, mask, *, k: int = 4, max_new_tokens: int = 8, **kw):
    """rloo's sampler on a tiny model: EOS/PAD ids of these models, the generator seeded 0; kw: the path
    options to compare (grouped=, few_rows=, rows=). -> (ids, mask, logprobs)."""
    from rloo.config import Sampling
    from rloo.rollout import sampler

    gen = torch.Generator().manual_seed(0)
    s = Sampling(max_new_tokens, ids.shape[1])
    return sampler.sample_tokens(model, ids, mask, s, eos_id=EOS, pad_id=PAD, k=k, generator=gen, **kw)


def arch_per_row(rows: list[tuple]) -> list[tuple]:
    """Each row of a method-level product with an architecture appended, cycling through ARCHS: every
    row's maths runs once, every architecture at least once (len(rows) >= len(ARCHS)). Only modeling/
    depends on the architecture, and its paths are crossed with every other factor in
    tests/equivalence/test_gradient_matrix.py; a full product with ARCHS ran each method's maths 4 times."""
    assert len(rows) >= len(ARCHS), "fewer rows than architectures: some would go untested"
    return [(*row, ARCHS[i % len(ARCHS)]) for i, row in enumerate(rows)]

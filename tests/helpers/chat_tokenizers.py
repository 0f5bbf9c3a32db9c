"""Tiny byte-level BPE tokenizers with and without chat templates, for the episode tests.

Ids 0 and 1 are <pad> and <eos> (tiny_archs' PAD and EOS), then the role tokens, then bytes and
merges: vocabulary 320, so a tiny model built with `tiny_lm(arch, tokenizer=...)` can play them.
Templates in the layouts of real model families (the content placeholders are what matters)."""

from __future__ import annotations

SPECIALS = ["<pad>", "<eos>", "<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

TEMPLATES = {
    # Qwen2 / ChatML: end of turn <|im_end|>, a newline after it
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    # Llama 3: BOS text first, contents trimmed, end of turn <|eot_id|>
    "llama3": (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    # end of turn is EOS itself (tests/integration/test_own_formats.py's layout)
    "eos_turns": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}{{ m['content'] }}<eos>{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}"
    ),
    # Llama 2: a space before the reply that the generation prompt does not write -> refused
    "llama2": (
        "{% for m in messages %}{% if m['role'] == 'user' %}{{ '<|im_start|>[INST] ' + m['content'] + ' [/INST]' }}"
        "{% else %}{{ ' ' + m['content'] + ' ' + eos_token }}{% endif %}{% endfor %}"
    ),
    # drops every assistant message but the last (a "thinking" template's history) -> refused
    "drops_history": (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}<|im_start|>{{ m['content'] }}"
        "<|im_end|>{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>{% endif %}"
    ),
}


def chat_tokenizer(template: str | None = "chatml"):
    """The byte-level BPE with TEMPLATES[template] (None: no chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = "user assistant tool system guess higher lower call calc end out ans 0 1 2 3 4 5 6 7 8 9 + * ="
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, initial_alphabet=alphabet)
    tok.train_from_iterator([text] * 20, trainer)
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", bos_token="<eos>")
    if template is not None:
        out.chat_template = TEMPLATES[template]
    return out

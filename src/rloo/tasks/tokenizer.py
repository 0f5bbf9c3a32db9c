"""A word-level tokenizer for a synthetic task: one token per word, nothing downloaded.

Vocabulary: ``<pad>`` (id 0), ``<eos>`` (id 1), ``<unk>`` (id 2), then ``task.words()`` in order.
Text is split on whitespace, so ``decode(encode(text)) == " ".join(text.split())`` for any text of
task words. Encoding adds no special tokens: callers append ``eos_token_id`` to a response
themselves (a response ends with ``<eos>``).
"""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rloo.tasks.base import Task

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, EOS, UNK)


def build_tokenizer(task: Task) -> PreTrainedTokenizerFast:
    """The word-level tokenizer of ``task`` (see the module docstring for the vocabulary)."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for word in task.words():
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Registered as special so that decode(..., skip_special_tokens=True) drops them.
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        # The default clean-up would glue " ," and " 's" to the previous word.
        clean_up_tokenization_spaces=False,
        model_max_length=task.max_prompt_words + task.max_response_words + 1,
    )

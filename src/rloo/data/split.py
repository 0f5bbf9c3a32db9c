"""Which rows of your own data are held out for evaluation, and the rows each stage reads.

One rule for every stage when `dataset.eval_split` is not given: a row is held out when
`held_out(prompt, dataset.eval_fraction)`. SFT, the reward model, the RL prompts (and so DPO's
pairs, the reward model's pairs.jsonl) read only the other rows; evaluation (`rloo eval`, the RL
run's periodic evaluation, the reward model's held-out accuracy) reads only these.

The rule looks at the prompt's text alone, as the data has it (before any chat template), so it
gives the same answer in every stage, in every file that shares prompts (a TL;DR SFT set and
preference pairs over the same posts), whatever the row order or `dataset.limit`; rows that repeat
a prompt fall on the same side. The built-in tasks split their own data the same way (a hash of
the post or problem, rloo.tasks) and never come here.

With `dataset.eval_split`, training reads the whole training split and evaluation the eval split.
"""

from __future__ import annotations

import hashlib

from rloo.config import DatasetSettings
from rloo.data.datasets import Record, read_records, with_chat_template
from rloo.errors import RlooError


def held_out(prompt: str, fraction: float) -> bool:
    """Is a row with this prompt held out: u = (first 8 bytes of SHA-256(prompt, UTF-8)) / 2^64,
    uniform on [0, 1) over prompts; held out iff u < fraction (a share `fraction` of the distinct
    prompts, in expectation). SHA-256 rather than hash(): the same in every process."""
    u = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big") / 2**64
    return u < fraction


def split_records(records: list[Record], fraction: float) -> tuple[list[Record], list[Record]]:
    """(training rows, held-out rows), each in dataset order."""
    parts: tuple[list[Record], list[Record]] = ([], [])
    for r in records:
        parts[held_out(r.prompt, fraction)].append(r)
    return parts


def train_records(
    settings: DatasetSettings, fields: tuple[str, ...], tokenizer=None, optional: tuple[str, ...] = ()
) -> list[Record]:
    """The rows a training stage may read: the training split without its held-out rows."""
    records = read_records(settings, fields, optional=optional)
    if settings.eval_split is None:
        records = check_sides(settings, split_records(records, settings.eval_fraction), len(records), held=False)[0]
    return with_chat_template(records, settings, tokenizer)


def eval_records(
    settings: DatasetSettings, fields: tuple[str, ...], n_eval: int, tokenizer=None, optional: tuple[str, ...] = ()
) -> list[Record]:
    """The first `n_eval` held-out rows: of the eval split when one is named, else of the
    training split's held-out rows."""
    if settings.eval_split is not None:
        records = read_records(settings, fields, split=settings.eval_split, optional=optional)
    else:
        records = read_records(settings, fields, optional=optional)
        records = check_sides(settings, split_records(records, settings.eval_fraction), len(records), train=False)[1]
    return with_chat_template(records[:n_eval], settings, tokenizer)


def train_eval_records(
    settings: DatasetSettings, fields: tuple[str, ...], n_eval: int, tokenizer=None, optional: tuple[str, ...] = ()
) -> tuple[list[Record], list[Record]]:
    """`train_records` and `eval_records` together, reading the training split once."""
    if settings.eval_split is not None:
        return (
            train_records(settings, fields, tokenizer, optional),
            eval_records(settings, fields, n_eval, tokenizer, optional),
        )
    records = read_records(settings, fields, optional=optional)
    train, held = check_sides(settings, split_records(records, settings.eval_fraction), len(records))
    return with_chat_template(train, settings, tokenizer), with_chat_template(held[:n_eval], settings, tokenizer)


def check_sides(settings: DatasetSettings, parts, n: int, train: bool = True, held: bool = True):
    """`parts` (training rows, held-out rows) of `n` rows, or one line if a side that is needed is
    empty."""
    for rows, needed, what in ((parts[0], train, "left for training"), (parts[1], held, "held out for evaluation")):
        if needed and not rows:
            raise RlooError(
                f"dataset {settings.path!r}: none of its {n} rows is {what} (dataset.eval_fraction="
                f"{settings.eval_fraction} of the distinct prompts, chosen by a hash of the prompt); "
                f"set another dataset.eval_fraction, or name held-out data with dataset.eval_split"
            )
    return parts


def text_field(value: str | None) -> str:
    """A field of a Record a stage read with `fields` (or an `optional` one the data has): the reader
    checked that every row's is text (rloo.data.datasets), so it is never None here."""
    assert value is not None, "a Record field the records were not read with"
    return value

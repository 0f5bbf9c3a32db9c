"""Objects handed to the Python API (`model=`, `tokenizer=`, `dataset=`) in place of paths.

Each becomes a name, `memory:KIND:SHA12` (rloo.runtime.inputs.objects), written into the config key
its path would fill (RL's `policy`, SFT's `model` / `tokenizer`, the reward model's `model`,
`dataset.path`), and is held under it while the stage runs; the loaders look it up there. So the
config stays typed and saved (config.yaml names the objects by content), the checks of a path apply
(LM head or one-output head, pad and EOS token, the dataset's columns, the chat template), and a
resume compares the names: it must be handed the same initial weights, tokenizer and rows.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping

import torch

from rloo.config import DatasetSettings
from rloo.errors import ConfigError, RlooError
from rloo.modeling.loading import frozen, load_policy
from rloo.modeling.lora import AdapterDisabled, add_lora, is_lora, load_saved_weights
from rloo.runtime.inputs.hf import has_vocab
from rloo.runtime.inputs.objects import Held, is_held, name_of, rows_sha, tokenizer_sha


def hand_in(cfg, key: str, model=None, tokenizer=None, dataset=None, tokenizer_key: str | None = None):
    """(cfg with the handed objects' names in `key` (the model), `tokenizer_key` (a stage with its
    own tokenizer key: SFT) and dataset.path, the objects to hold under them). Without a tokenizer
    key, the model's name covers its tokenizer too (a resume handed another one is refused as another
    model). A key already set and an object for it too is refused: one or the other."""
    held: dict[str, Held] = {}
    update: dict = {}
    tok_name = None
    if tokenizer is not None:
        if model is None and tokenizer_key is None:
            raise ConfigError(f"tokenizer= goes with model= here (the tokenizer of {key}={_field(cfg, key)})")
        tok_name = name_of("tokenizer", sha := tokenizer_sha(_tokenizer(tokenizer)))
        held[tok_name] = Held(tokenizer, sha)
        if tokenizer_key is not None:
            update[tokenizer_key] = _free(cfg, tokenizer_key, tok_name, "tokenizer=")
    if model is not None:
        sha = tensors_sha(_module(model).state_dict().items())
        if tok_name is not None and tokenizer_key is None:  # no key of its own: the tokenizer is the model's
            sha = hashlib.sha256(f"{sha}\0{held[tok_name].sha}".encode()).hexdigest()
        name = name_of(type(model).__name__, sha)
        held[name] = Held(model, sha, tokenizer=tok_name)
        update[key] = _free(cfg, key, name, "model=")
    if dataset is not None:
        table = as_dataset(dataset)
        name = name_of("dataset", sha := rows_sha(_rows(table)))
        held[name] = Held(table, sha)
        settings = cfg.dataset or DatasetSettings()
        if settings.path:
            raise ConfigError(f"pass dataset.path={settings.path} or dataset=, not both")
        update["dataset"] = settings.model_copy(update={"path": name})
    return (cfg.model_copy(update=update) if update else cfg), held


def _field(cfg, key: str):
    """The stage config's (rloo's pydantic model) field `key`, named by the caller; None where this
    stage's config has no such field."""
    return cfg.model_dump(include={key}).get(key)


def _free(cfg, key: str, name: str, arg: str) -> str:
    current = _field(cfg, key)
    if current and not is_held(current):
        raise ConfigError(f"pass {key}={current} or {arg}, not both")
    return name


def tensors_sha(named) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor in `named` (a state_dict's items), in
    order: the weights as handed in, on whatever device they are."""
    h = hashlib.sha256()
    for name, t in named:
        t = t.detach()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\n".encode())
        h.update(t.cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _module(model):
    if not isinstance(model, torch.nn.Module):
        raise RlooError(
            f"model= must be a transformers PreTrainedModel or a peft PeftModel; got a {type(model).__name__}"
        )
    return model


def _tokenizer(tok):
    if not has_vocab(tok):
        raise RlooError(f"tokenizer= must be a transformers tokenizer; got a {type(tok).__name__}")
    return tok


def as_dataset(data):
    """A `datasets.Dataset` or `DatasetDict` as it is; an iterable of row dicts (a list, a generator,
    a pandas-free list of JSON rows) as a Dataset of those rows."""
    import datasets  # lazily: a 1-3 s import

    if isinstance(data, (datasets.Dataset, datasets.DatasetDict)):
        return data
    if isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Iterable):
        raise RlooError(
            f"dataset= must be a datasets.Dataset, a DatasetDict or an iterable of row dicts; "
            f"got a {type(data).__name__}"
        )
    rows = list(data)
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, Mapping)), None)
    if bad is not None:
        raise RlooError(f"dataset= row {bad} is a {type(rows[bad]).__name__}, expected a dict of columns")
    if not rows:
        raise RlooError("dataset= has no rows")
    return datasets.Dataset.from_list([dict(r) for r in rows])


def _rows(table):
    """Every row of a Dataset, or of every split of a DatasetDict (by split name)."""
    if isinstance(table, dict):
        return ({"split": k, **row} for k in sorted(table) for row in table[k])
    return iter(table)


def handed_policy(name: str, lora, policy_path: str | None, opts: dict):
    """(policy, frozen reference, tokenizer) of a handed model: the object itself is trained (as TRL's
    trainers train the model they are given); the reference is a frozen copy of its weights as handed
    in, or, for a PeftModel or with `lora`, the same model with its adapters off. `policy_path`: a
    checkpoint's model/ whose weights (adapters under LoRA) are loaded into it (resume)."""
    model, tokenizer = load_policy(name, **opts)
    if lora is not None and is_lora(model):
        raise ConfigError("model= is a PeftModel already: drop the lora section (its adapters are trained)")
    if lora is not None:
        model = add_lora(model, lora)
    ref = AdapterDisabled(model) if is_lora(model) else frozen(copy.deepcopy(model))
    if policy_path is not None:
        load_saved_weights(model, policy_path)
    return model, ref, tokenizer

"""A model handed to the Python API as an object (rloo.runtime.inputs.objects): checked as a
loaded one is, for the part it plays. The loaders (rloo.modeling.loading) call this in place of
`from_pretrained`, so a handed model then gets the same attention, heads, device and dtype."""

from __future__ import annotations

from typing import Any

import torch

from rloo.errors import RlooError
from rloo.runtime.inputs.objects import held


def handed_model(name: str, what: str):
    """(the model held under `name`, the name or path of its tokenizer). `what`: "causal LM" (a
    policy: it has an LM head) or a one-output scorer ("reward model", "value model": a sequence
    classifier with num_labels=1). The tokenizer is the one handed in with it, else the one its
    config names (`name_or_path`, as TRL's trainers default to); refused without either."""
    h = held(name)
    model = h.obj
    kind = type(model).__name__
    # getattr: an object handed in by an API caller (third-party model classes), checked for what rloo uses
    if not isinstance(model, torch.nn.Module) or getattr(model, "config", None) is None:
        raise RlooError(f"model= must be a transformers PreTrainedModel or a peft PeftModel; got a {kind}")
    head: Any = getattr(model, "get_output_embeddings", None)  # PeftModel forwards it to its base
    has_lm_head = callable(head) and head() is not None
    if what == "causal LM" and not has_lm_head:
        raise RlooError(f"model= must be a causal LM (a ...ForCausalLM with an LM head); the {kind} handed in has none")
    if what != "causal LM" and (has_lm_head or getattr(model.config, "num_labels", None) != 1):
        raise RlooError(
            f"model= must be a {what}: a sequence classifier with one output "
            f"(AutoModelForSequenceClassification.from_pretrained(..., num_labels=1)); got a {kind}"
        )
    tokenizer = h.tokenizer or getattr(model.config, "_name_or_path", None) or None
    if tokenizer is None:
        raise RlooError(f"model= ({kind}) names no tokenizer (its config has no name_or_path): pass tokenizer= too")
    return model, tokenizer
